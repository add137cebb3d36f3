package service

// The pipelined handoff: FinishBatchThenClaim carries a finish ahead of the next claim in one round
// trip (prelude). Measured on 2026-12-03 (docs/benchmarks/2026-12-03-production-shape.md) it does not
// pay: at work's defaults few claims ride behind a finish, and per task two round trips were faster.
// It is kept behind this one seam (DispatcherConfig.FinishApart turns it off) until it is removed.

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/service/delivery"
)

// prelude is an autocommit statement that travels in the same round trip as a claim's BEGIN and first
// statement, ahead of them and separated by a Sync: it runs in its own implicit transaction, which
// commits (or fails and rolls back) before the claim's BEGIN is read. A failed prelude does not stop
// the claim, and a failed claim does not undo the prelude. FinishBatchThenClaim sends a finish this way.
type prelude struct {
	ctx  context.Context // bounds the round trip that carries the prelude, and the connection's acquisition
	sql  string
	args []any
	read func(pgx.Rows) error // consumes the prelude's rows

	sent bool  // the round trip was attempted: the statement may have run
	err  error // the statement's failure, or the round trip's
}

// recorder is a dbgen.DBTX that captures the statement a generated query would run instead of running
// it: how a dbgen query is queued in a round trip built here (prelude).
type recorder struct {
	sql  string
	args []any
}

var errRecorded = errors.New("statement recorded, not run")

func (r *recorder) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.sql, r.args = sql, args
	return pgconn.CommandTag{}, errRecorded
}

func (r *recorder) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.sql, r.args = sql, args
	return nil, errRecorded
}

func (r *recorder) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	r.sql, r.args = sql, args
	return firstRow{err: errRecorded}
}

// replayed is a dbgen.DBTX that answers a generated query with the rows of the statement recorded for
// it, already in flight: the generated code scans them as usual.
type replayed struct {
	sql  string
	rows pgx.Rows
}

func (r replayed) check(sql string) error {
	if sql != r.sql {
		r.rows.Close()
		return errors.New("replayed rows belong to another statement")
	}
	return nil
}

func (r replayed) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	if err := r.check(sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	r.rows.Close()
	return r.rows.CommandTag(), r.rows.Err()
}

func (r replayed) Query(_ context.Context, sql string, _ ...any) (pgx.Rows, error) {
	if err := r.check(sql); err != nil {
		return nil, err
	}
	return r.rows, nil
}

func (r replayed) QueryRow(_ context.Context, sql string, _ ...any) pgx.Row {
	return firstRow{rows: r.rows, err: r.check(sql)}
}

// pipelines reports whether the pool's connections can carry a prelude: the statements of a round trip
// built here are prepared by name, as pgx's default mode does anyway; other modes (chosen for poolers
// that refuse prepared statements) send the prelude as a round trip of its own.
func pipelines(cfg *pgx.ConnConfig) bool {
	return cfg.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement
}

// queued is one statement of a round trip built here; sync ends an implicit transaction after it.
type queued struct {
	sql  string
	args []any
	sync bool
}

// sendAfter sends pre, Sync, [TxBegin] sql [TxCommit], Sync in one round trip under the prelude's
// context, reads the prelude's result into pre and TxBegin's, and returns the rest of the round trip.
func (tx *claimTx) sendAfter(pre *prelude, sql string, args []any, begin, commit string) (roundTrip, error) {
	list := []queued{{sql: pre.sql, args: pre.args, sync: true}}
	if begin != "" {
		list = append(list, queued{sql: begin})
	}
	list = append(list, queued{sql: sql, args: args})
	if commit != "" {
		list = append(list, queued{sql: commit})
	}
	list[len(list)-1].sync = true
	rt, err := sendPipeline(pre.ctx, tx.conn, list, func() { pre.sent = true })
	if err != nil {
		pre.err = err
		return nil, err
	}
	pre.err = rt.readInto(pre.read)
	if err := rt.sync(); err != nil { // the round trip broke: the claim did not begin either
		_ = rt.Close()
		if pre.err == nil {
			pre.err = err
		}
		return nil, err
	}
	if begin != "" {
		if _, err := rt.Exec(); err != nil {
			_ = rt.Close()
			return nil, fmt.Errorf("begin: %w", err)
		}
	}
	return rt, nil
}

// sendPipeline writes list in one round trip (calling writing just before the write) and returns its
// results to be read in order.
//
// Only the last statement before each Sync may fail without harm: pgx v5.12 keeps the description of
// a statement the server skipped after an earlier failure in the same implicit transaction, so the
// results of the next one would be misread. A prelude is one statement, and the claim's part is last.
func sendPipeline(ctx context.Context, conn *pgx.Conn, list []queued, writing func()) (*pipelineResults, error) {
	descriptions := make([]*pgconn.StatementDescription, len(list))
	for i, q := range list {
		// Named by its text, as the rest of pgx then finds it: a lookup once this connection has it.
		sd, err := conn.Prepare(ctx, q.sql, q.sql)
		if err != nil {
			return nil, fmt.Errorf("prepare: %w", err)
		}
		descriptions[i] = sd
	}
	p := conn.PgConn().StartPipeline(ctx)
	var eqb pgx.ExtendedQueryBuilder
	for i, q := range list {
		if err := eqb.Build(conn.TypeMap(), descriptions[i], q.args); err != nil {
			_ = p.Close() // with requests queued and unsent, this closes the connection: nothing ran
			return nil, fmt.Errorf("encode arguments: %w", err)
		}
		// SendQueryStatement encodes the parameters at once but keeps the result formats until read.
		p.SendQueryStatement(descriptions[i], eqb.ParamValues, eqb.ParamFormats, slices.Clone(eqb.ResultFormats))
		if q.sync {
			p.SendPipelineSync()
		}
	}
	writing()
	if err := p.Flush(); err != nil {
		_ = p.Close()
		return nil, err
	}
	return &pipelineResults{p: p, typeMap: conn.TypeMap()}, nil
}

// pipelineResults reads a round trip built by sendPipeline, like pgx.BatchResults.
type pipelineResults struct {
	p       *pgconn.Pipeline
	typeMap *pgtype.Map
}

func (r *pipelineResults) next() (*pgconn.ResultReader, error) {
	res, err := r.p.GetResults()
	if err != nil {
		return nil, err
	}
	rr, ok := res.(*pgconn.ResultReader)
	if !ok {
		return nil, fmt.Errorf("pipeline: expected a statement's result, got %T", res)
	}
	return rr, nil
}

// Exec reads the next statement's result.
func (r *pipelineResults) Exec() (pgconn.CommandTag, error) {
	rr, err := r.next()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return rr.Close()
}

// Query returns the next statement's rows; they must be closed before anything else is read.
func (r *pipelineResults) Query() (pgx.Rows, error) {
	rr, err := r.next()
	if err != nil {
		return nil, err
	}
	return pgx.RowsFromResultReader(r.typeMap, rr), nil
}

// readInto passes the next statement's rows to read, which closes them.
func (r *pipelineResults) readInto(read func(pgx.Rows) error) error {
	rows, err := r.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	return read(rows)
}

// sync reads the end of an implicit transaction.
func (r *pipelineResults) sync() error {
	res, err := r.p.GetResults()
	if err != nil {
		return err
	}
	if _, ok := res.(*pgconn.PipelineSync); !ok {
		return fmt.Errorf("pipeline: expected the end of a transaction, got %T", res)
	}
	return nil
}

// Close reads what is left of the round trip and returns the connection to normal use.
func (r *pipelineResults) Close() error { return r.p.Close() }

// Handoff is what FinishBatchThenClaim did: one batch finished, the next one claimed.
type Handoff struct {
	Finished  []Result   // the finished batch's results, in the order of its attempts (UNRECORDED: see FinishBatch)
	FinishErr error      // the finish failed: its tasks stay SENDING, recovered after their lease
	Next      []*Attempt // the next batch: call, then finish
	Settled   []Result   // tasks of the next claim decided without a call
	ClaimErr  error
}

// FinishBatchThenClaim is FinishBatch followed by ClaimBatch with one round trip fewer: TaskFinish
// travels in the same write as the claim's BEGIN and first statement, in its own implicit transaction
// ahead of them (prelude). The finish commits before the claim begins; a failed claim does not undo it
// and a failed finish does not stop the claim. A worker that is stopping calls FinishBatch alone
// instead. On connections that do not prepare statements (pipelines) it is FinishBatch then
// ClaimBatch. As in FinishBatch, a 429 on a rate-limited channel first pauses that channel.
func (d *Dispatcher) FinishBatchThenClaim(ctx context.Context, attempts []*Attempt, obs []delivery.Observation, limit int) Handoff {
	h := d.finishBatchThenClaim(ctx, attempts, obs, limit)
	d.disableUnregistered(ctx, h.Finished, obs)
	return h
}

func (d *Dispatcher) finishBatchThenClaim(ctx context.Context, attempts []*Attempt, obs []delivery.Observation, limit int) Handoff {
	d.pauseThrottled(ctx, attempts, obs) // before the claim, so that the claim sees the pause
	var h Handoff
	apart := func() Handoff {
		h.Finished, h.FinishErr = d.finishBatch(ctx, attempts, obs)
		h.Next, h.Settled, h.ClaimErr = d.ClaimBatch(ctx, limit)
		return h
	}
	if !d.pipelines {
		return apart()
	}
	params, results, err := d.finishParams(attempts, obs)
	if err != nil {
		return apart() // FinishBatch reports the same error; the claim goes on
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.DBTimeout)
	defer cancel()
	var (
		statement recorder
		rows      []dbgen.TaskFinishRow
	)
	_, _ = dbgen.New(&statement).TaskFinish(fctx, params)
	pre := &prelude{ctx: fctx, sql: statement.sql, args: statement.args, read: func(r pgx.Rows) (err error) {
		rows, err = dbgen.New(replayed{sql: statement.sql, rows: r}).TaskFinish(fctx, params)
		return err
	}}
	h.Next, h.Settled, h.ClaimErr = d.claimBatch(ctx, limit, pre)
	if !pre.sent { // the claim failed before its first round trip: the finish goes alone
		h.Finished, h.FinishErr = d.finishBatch(ctx, attempts, obs)
		return h
	}
	err = pre.err
	if transient(err) { // it may have committed: send it again (TaskFinish is idempotent)
		rows, err = d.finish(ctx, attempts, params, err)
	}
	if rowFault(err) {
		h.Finished = d.finishEach(ctx, attempts, params, results)
		return h
	}
	h.Finished, h.FinishErr = finishResults(attempts, results, rows, err)
	return h
}
