package service

// The claim, the first correctness check, in one place: ClaimBatch locks due tasks with FOR UPDATE SKIP
// LOCKED, settles those that need no call (suppressed, expired, parked) and hands out the rest with a
// lease and a fresh attempt token (claimOnce, on claimTx: a transaction with no round trip of its own
// for BEGIN or COMMIT, two pgx batches); a claim whose commit's answer was lost is recovered by its tokens
// (recoverClaim); a claim the server refused for one row's sake is retried task by task (claimEach),
// so one bad row costs only itself.

import (
	"context"
	cryptorand "crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/service/delivery"
)

// ClaimBatch is the first correctness check. In one transaction it locks up to max due tasks (SENDING
// tasks whose lease expired first, then the longest-waiting PENDING or UNKNOWN ones) with SKIP LOCKED,
// closes the open attempts of expired leases as LEASE_EXPIRED, decides per task (Decide), and for the
// tasks to call sets a fresh token and lease and opens their attempt rows. After the commit the caller
// holds each returned Attempt's only valid token until its lease ends. Tasks settled without a call
// come back as Results. Two round trips when tasks are started: BEGIN with TaskClaim, then
// TaskStartAttempts with COMMIT (claimTx).
//
// When the server refuses the claim for what one locked task's rows hold, nothing of it was written; the
// tasks are then claimed one at a time so that only the one at fault is set aside (claimEach).
func (d *Dispatcher) ClaimBatch(ctx context.Context, limit int) ([]*Attempt, []Result, error) {
	limit = min(MaxBatch, max(1, limit))
	attempts, settled, locked, err := d.claimOnce(ctx, limit)
	if err != nil && refusedForRow(err) && len(locked) > 0 {
		return d.claimEach(ctx, limit, locked, err)
	}
	if err != nil {
		return nil, nil, d.failed("claim", err)
	}
	return attempts, settled, nil
}

// failed wraps a claim's error. A server that refused to write (SQLSTATE 25006) is a standby now, or
// was never the primary: the pool's connections to it are discarded, so that the next statement
// connects anew and, with target_session_attrs=read-write, finds the current primary. An error that a
// connection pooler's configuration caused says so, with the fix (ExplainPooler).
func (d *Dispatcher) failed(op string, err error) error {
	if sqlState(err) == sqlStateReadOnly {
		d.pool.Reset()
		return refuseReadOnly(op, err)
	}
	return ExplainPooler(fmt.Errorf("%s: %w", op, err), d.pool.Config().ConnConfig.User)
}

// claimOnce runs one claim transaction for up to limit tasks. locked lists the rows TaskClaim locked,
// also when a later statement of the transaction failed.
func (d *Dispatcher) claimOnce(ctx context.Context, limit int) (attempts []*Attempt, settled []Result, locked []dbgen.TaskClaimRow, err error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.DBTimeout)
	defer cancel()
	var committing *claimRecovery // set once the COMMIT is on its way
	defer func() {
		if err != nil && committing != nil && transient(err) {
			attempts, settled, err = d.recoverClaim(ctx, committing, err)
		}
	}()
	err = inClaimTx(ctx, d.pool, func(q *dbgen.Queries, tx *claimTx) error {
		allowance, err := d.peekTokens(ctx, q)
		if err != nil {
			return err
		}
		var throttled map[string]bool // made by the first rateLimited
		rows, err := d.lockDue(ctx, q, limit, allowance, &throttled)
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			return nil
		}
		locked = rows // takeTokens returns a new slice and leaves these rows as they are
		claimed := time.Now()
		var (
			expiredTokens []string
			start         = dbgen.TaskStartAttemptsParams{Worker: d.cfg.Worker, LeaseSeconds: d.cfg.Lease.Seconds()}
			decisions     = make(map[int64]delivery.ClaimDecision, len(rows))
			byID          = make(map[int64]dbgen.TaskClaimRow, len(rows))
		)
		for _, row := range rows {
			decisions[row.ID] = delivery.Decide(delivery.ClaimFacts{
				Uncertain: row.OutcomeUncertain, LeaseExpired: row.LeaseExpired,
				PrefEnabled: row.PrefEnabled, Expired: row.Expired, Cancelled: row.Cancelled,
				AttemptCount: int(row.AttemptCount), AccountRefusals: int(row.AccountRefusals), MaxAttempts: int(row.MaxAttempts),
				Mode: d.cfg.Routes[row.Channel].Mode, Contract: d.cfg.Routes[row.Channel].Contract,
				UncertainAge: seconds(row.UncertainAgeSeconds), ReceiptNoted: row.ReceiptNoted,
			})
		}
		// Calls on a limited channel need a token each; the tasks left without one stay as they are.
		if rows, err = d.takeTokens(ctx, q, rows, decisions, allowance, &throttled); err != nil {
			return err
		}
		for _, row := range rows {
			if row.LeaseExpired && row.HeldToken != nil {
				expiredTokens = append(expiredTokens, *row.HeldToken)
			}
			dec := decisions[row.ID]
			byID[row.ID] = row
			if dec.Kind == delivery.ClaimCall {
				start.IDs = append(start.IDs, row.ID)
				start.AttemptTokens = append(start.AttemptTokens, newToken())
				start.OutcomeUncertain = append(start.OutcomeUncertain, dec.Uncertain)
				start.Actions = append(start.Actions, string(dec.Action))
			}
		}
		if len(expiredTokens) > 0 {
			if _, err := q.AttemptMarkLeaseExpired(ctx, expiredTokens); err != nil {
				return fmt.Errorf("close expired attempts: %w", err)
			}
		}
		for _, row := range rows {
			if dec := decisions[row.ID]; dec.Kind != delivery.ClaimCall {
				res, err := d.settle(ctx, q, row, dec)
				if err != nil {
					return err
				}
				settled = append(settled, res)
			}
		}
		if len(start.IDs) == 0 {
			return d.releaseUnusedProbe(ctx, q, rows)
		}
		// The COMMIT travels with this statement and runs as soon as it succeeds. When the answer is lost
		// (the connection broke), the claim may have committed: recoverClaim asks by the tokens chosen here.
		tx.commitWithNext()
		attemptOf := func(s dbgen.TaskHeldByTokensRow) *Attempt {
			row, dec := byID[s.ID], decisions[s.ID]
			route := d.cfg.Routes[row.Channel]
			return &Attempt{
				TaskID: s.ID, Channel: row.Channel, Mode: route.Mode, Contract: route.Contract, No: int(s.AttemptCount),
				MaxAttempts: int(row.MaxAttempts), Token: s.AttemptToken, Action: dec.Action,
				PriorUncertain: dec.Uncertain, AccountRefusals: int(row.AccountRefusals), Probe: row.Probe,
				UncertainAge: seconds(row.UncertainAgeSeconds), claimed: claimed,
				LeaseUntil: s.LeaseUntil,
				Message: delivery.Message{Ref: row.Ref, IdempotencyKey: delivery.IdempotencyKey(row.Ref), To: row.Address, Body: row.Body,
					ExpiresAt: row.ExpiresAt, Action: dec.Action},
			}
		}
		committing = &claimRecovery{tokens: start.AttemptTokens, attemptOf: attemptOf}
		started, err := q.TaskStartAttempts(ctx, start)
		if err != nil {
			return fmt.Errorf("start attempts: %w", err)
		}
		if len(started) != len(start.IDs) {
			return fmt.Errorf("start attempts: %d of %d locked tasks started", len(started), len(start.IDs))
		}
		for _, s := range started {
			attempts = append(attempts, attemptOf(dbgen.TaskHeldByTokensRow{ID: s.ID, AttemptCount: s.AttemptCount,
				LeaseUntil: s.LeaseUntil, AttemptToken: s.AttemptToken}))
		}
		return nil
	})
	if err != nil {
		return nil, nil, locked, err
	}
	return attempts, settled, locked, nil
}

// claimRecovery is what recoverClaim needs of a claim whose COMMIT was sent: the attempt tokens it
// chose, and how to make an Attempt of a task found holding one.
type claimRecovery struct {
	tokens    []string
	attemptOf func(dbgen.TaskHeldByTokensRow) *Attempt
}

// recoverClaim finds out whether a claim whose commit's answer was lost (claimErr, transient)
// committed: the tasks that hold the tokens it chose are its own, under a live lease, and no call was
// made for them yet, so they are handed back to be called. The claim's tasks settled without a call are
// then written too; their results are not reported. When the claim did not commit, or the question
// cannot be asked, the claim fails with claimErr as before, and a claim that committed unseen is
// recovered after its lease, like a crash.
func (d *Dispatcher) recoverClaim(ctx context.Context, c *claimRecovery, claimErr error) ([]*Attempt, []Result, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.DBTimeout)
	defer cancel()
	// The pool's other connections may have broken with the claim's (a failover, a restart): the
	// question is asked again on a new one, a few times.
	held, err := dbgen.New(d.pool).TaskHeldByTokens(ctx, c.tokens)
	for try := 0; transient(err) && try < 3 && ctx.Err() == nil; try++ {
		time.Sleep(finishRetryDelay(try))
		held, err = dbgen.New(d.pool).TaskHeldByTokens(ctx, c.tokens)
	}
	if err != nil || len(held) == 0 {
		return nil, nil, claimErr
	}
	attempts := make([]*Attempt, len(held))
	for i, h := range held {
		attempts[i] = c.attemptOf(h)
	}
	d.cfg.Observer.ClaimRecovered(len(attempts), claimErr)
	return attempts, nil, nil
}

// lockDue locks up to limit due tasks of this worker's channels, one channel at a time (TaskClaim walks
// one channel's part of the claim indexes), starting with the channel after the one the previous claim
// started with, so that a busy channel does not starve the others. A channel in allowance (it has a
// rate-limit bucket) gets no more tasks locked than its whole tokens, and none looked at without one.
func (d *Dispatcher) lockDue(ctx context.Context, q *dbgen.Queries, limit int, allowance map[string]int, throttled *map[string]bool) ([]dbgen.TaskClaimRow, error) {
	var rows []dbgen.TaskClaimRow
	start := int(d.turn.Add(1))
	for i := range d.channels {
		ch := d.channels[(start+i)%len(d.channels)]
		want := limit - len(rows)
		tokens, limited := allowance[ch]
		if limited && tokens < 1 {
			d.rateLimited(ch, throttled)
			continue
		}
		if limited {
			want = min(want, tokens)
		}
		got, err := q.TaskClaim(ctx, dbgen.TaskClaimParams{Channel: ch, MaxTasks: int32(want)})
		if err != nil {
			return rows, fmt.Errorf("lock due tasks of %s: %w", ch, err)
		}
		if limited && want < limit-len(rows) && len(got) == want {
			d.rateLimited(ch, throttled) // as many tasks as tokens: more may be waiting
		}
		if rows = append(rows, got...); len(rows) == limit {
			break
		}
	}
	return rows, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// MaxBatch bounds how many tasks one claim locks.
const MaxBatch = 1000

// settle applies a claim-time decision not to call: park, or a state written with its SKIP attempt.
func (d *Dispatcher) settle(ctx context.Context, q *dbgen.Queries, row dbgen.TaskClaimRow, dec delivery.ClaimDecision) (Result, error) {
	result := Result{TaskID: row.ID, Channel: row.Channel, Detail: dec.Reason}
	if dec.Kind == delivery.ClaimReceipt {
		applied, err := q.ReceiptApply(ctx, dbgen.ReceiptApplyParams{TaskID: row.ID,
			Note: "settled at claim by a receipt noted while the task was held"})
		if err == nil && delivery.ReceiptEffect(applied.Effect) != delivery.ReceiptSettled {
			err = fmt.Errorf("%w: the receipt's effect was %s", errNotSettleable, applied.Effect)
		}
		if err != nil {
			return result, fmt.Errorf("settle task %d by its receipt: %w", row.ID, err)
		}
		result.Kind, result.Action, result.Outcome = ResultSent, delivery.ActionReceipt, delivery.OutcomeReceiptAccepted
		return result, nil
	}
	if dec.Kind == delivery.ClaimPark {
		result.Kind = ResultParked
		parked, err := q.TaskPark(ctx, dbgen.TaskParkParams{ID: row.ID, LastError: dec.Reason})
		if err == nil && parked != 1 {
			err = errNotSettleable
		}
		if err != nil {
			return result, fmt.Errorf("park task %d: %w", row.ID, err)
		}
		return result, nil
	}
	no, err := q.TaskSettleWithoutCall(ctx, dbgen.TaskSettleWithoutCallParams{
		ID: row.ID, State: string(dec.State), NeedsReview: dec.State == delivery.StateUnknown,
		OutcomeUncertain: dec.Uncertain, LastError: dec.Reason,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		err = errNotSettleable
	}
	if err != nil {
		return result, fmt.Errorf("settle task %d: %w", row.ID, err)
	}
	result.Kind, result.Attempt, result.Action, result.Outcome = settledKind(dec.State), int(no), delivery.ActionSkip, dec.Outcome
	return result, q.AttemptRecordSkip(ctx, dbgen.AttemptRecordSkipParams{
		TaskID: row.ID, AttemptNo: no, Worker: d.cfg.Worker, Outcome: string(dec.Outcome), Error: dec.Reason,
	})
}

// errNotSettleable: the settle's or park's own guard matched nothing. The claim locked the row, so it can
// only be a task this claim may not settle (neither due nor held under an expired lease).
var errNotSettleable = errors.New("0 rows: the task is neither due nor held under an expired lease")

func settledKind(s delivery.State) ResultKind {
	if s == delivery.StateUnknown {
		return ResultParked
	}
	return ResultKind(s)
}

// newToken is a random attempt token (a version 4 UUID), chosen by the claimer: TaskStartAttempts sets
// it, and TaskHeldByTokens finds the claim by it when the answer to its commit was lost.
func newToken() string {
	var b [16]byte
	if _, err := cryptorand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux; a token must never repeat
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// claimTx is a transaction on one connection that spends no round trip on BEGIN or COMMIT alone: BEGIN
// (dbgen.TxBegin) is pipelined with the first statement, and COMMIT (dbgen.TxCommit) with the statement
// that follows commitWithNext. A claim is then two round trips instead of four. It implements dbgen.DBTX
// so the generated queries run on it unchanged.
//
// In a pipeline the server skips every message after a failed one, so a COMMIT behind a failed
// statement never runs; inClaimTx then rolls the transaction back.
type claimTx struct {
	conn       *pgx.Conn
	begun      bool // TxBegin was sent
	commitNext bool // the next statement carries TxCommit
	committed  bool // TxCommit succeeded
}

// inClaimTx runs fn in a claimTx on a connection of pool. If fn returns nil and did not commit with its
// last statement, the transaction is committed on its own; if anything fails it is rolled back.
func inClaimTx(ctx context.Context, pool *pgxpool.Pool, fn func(q *dbgen.Queries, tx *claimTx) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release() // the pool destroys a connection left inside a transaction
	tx := &claimTx{conn: conn.Conn()}
	q := dbgen.New(tx)
	err = fn(q, tx)
	if err == nil && !tx.committed && tx.begun {
		tx.commitNext = false
		if err = q.TxCommit(ctx); err == nil {
			tx.committed = true
		}
	}
	if err != nil {
		tx.rollback(ctx)
	}
	return err
}

// commitWithNext makes the next statement carry the COMMIT: its result reports the COMMIT's failure.
func (tx *claimTx) commitWithNext() { tx.commitNext = true }

// rollback ends a failed transaction if the connection is still inside one. Failing that, the pool
// destroys the connection on release, which ends the transaction too.
func (tx *claimTx) rollback(ctx context.Context) {
	if tx.conn.IsClosed() || tx.conn.PgConn().TxStatus() == 'I' {
		return
	}
	// Not cancelled with ctx (which may be what failed), but bounded: a hung connection is dropped instead.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_, _ = tx.conn.Exec(ctx, dbgen.TxRollback)
}

// rollbackTimeout bounds the ROLLBACK of a failed claim.
const rollbackTimeout = 5 * time.Second

// pipelined reports whether the next statement needs a batch: a BEGIN before it or a COMMIT after it.
func (tx *claimTx) pipelined() bool { return !tx.begun || tx.commitNext }

// send sends [TxBegin] sql [TxCommit] in one round trip (one pgx batch) and reads TxBegin's result.
func (tx *claimTx) send(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	if tx.committed {
		return nil, errors.New("claim transaction: statement after COMMIT")
	}
	b := &pgx.Batch{}
	begin := !tx.begun
	if begin {
		b.Queue(dbgen.TxBegin)
	}
	b.Queue(sql, args...)
	if tx.commitNext {
		b.Queue(dbgen.TxCommit)
	}
	br := tx.conn.SendBatch(ctx, b)
	if begin {
		tx.begun = true
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, fmt.Errorf("begin: %w", err)
		}
	}
	return br, nil
}

// finish reads the COMMIT's result if the round trip carries one, and closes it.
func (tx *claimTx) finish(br pgx.BatchResults, err error) error {
	if err == nil && tx.commitNext {
		tx.commitNext = false
		if _, err = br.Exec(); err != nil {
			err = fmt.Errorf("commit: %w", err)
		} else {
			tx.committed = true
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// Exec implements dbgen.DBTX.
func (tx *claimTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if !tx.pipelined() {
		return tx.conn.Exec(ctx, sql, args...)
	}
	br, err := tx.send(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	return tag, tx.finish(br, err)
}

// Query implements dbgen.DBTX. With a COMMIT behind the statement, the rows report the COMMIT's
// failure from Err once Next has returned false, as the generated code checks.
func (tx *claimTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if !tx.pipelined() {
		return tx.conn.Query(ctx, sql, args...)
	}
	br, err := tx.send(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, tx.finish(br, err)
	}
	return &batchRows{Rows: rows, tx: tx, br: br}, nil
}

// QueryRow implements dbgen.DBTX.
func (tx *claimTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if !tx.pipelined() {
		return tx.conn.QueryRow(ctx, sql, args...)
	}
	rows, err := tx.Query(ctx, sql, args...)
	return firstRow{rows: rows, err: err}
}

// batchRows are a statement's rows inside a batch: done reads what was queued behind them.
type batchRows struct {
	pgx.Rows
	tx   *claimTx
	br   pgx.BatchResults
	done bool
	err  error
}

func (r *batchRows) Next() bool {
	if r.done {
		return false
	}
	if r.Rows.Next() {
		return true
	}
	r.end()
	return false
}

func (r *batchRows) end() {
	if r.done {
		return
	}
	r.done = true
	r.Rows.Close()
	r.err = r.tx.finish(r.br, r.Rows.Err())
}

func (r *batchRows) Close() { r.end() }

func (r *batchRows) Err() error {
	if r.done {
		return r.err
	}
	return r.Rows.Err()
}

// firstRow is pgx.Row over rows: the first row, or pgx.ErrNoRows.
type firstRow struct {
	rows pgx.Rows
	err  error
}

func (r firstRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// claimEach claims again, one task per transaction, after a claim of the tasks in locked was refused
// for what one of their rows holds (refused). Nothing of the refused claim was written, so the tasks
// are still due: each one-task claim either succeeds or names the task at fault, which is set aside
// (TaskSetAside) so that it no longer stands first in line. One bad row costs only itself: the rest of
// the queue flows, up to limit tasks in this call.
//
// A claim failing for any other reason ends the loop: with what was claimed so far when there is
// something (an Attempt returned with an error would be held but never called), else with the error.
func (d *Dispatcher) claimEach(ctx context.Context, limit int, locked []dbgen.TaskClaimRow, refused error) ([]*Attempt, []Result, error) {
	var (
		attempts []*Attempt
		settled  []Result
	)
	if len(locked) == 1 { // the one task of this claim is at fault
		res, err := d.setAside(ctx, locked[0], refused)
		if err != nil {
			return nil, nil, err
		}
		settled = append(settled, res)
	}
	// Every task of the refused claim, and limit tasks besides, may need its own claim.
	for tries := 0; len(attempts)+len(settled) < limit && tries < limit+len(locked); tries++ {
		a, s, one, err := d.claimOnce(ctx, 1)
		switch {
		case err == nil && len(a)+len(s) == 0:
			return attempts, settled, nil // nothing due any more
		case err == nil:
			attempts, settled = append(attempts, a...), append(settled, s...)
		case refusedForRow(err) && len(one) == 1:
			res, aerr := d.setAside(ctx, one[0], err)
			if aerr != nil {
				return d.partial(attempts, settled, aerr)
			}
			settled = append(settled, res)
		default:
			return d.partial(attempts, settled, fmt.Errorf("claim: %w", err))
		}
	}
	return attempts, settled, nil
}

// partial returns what a claim loop got before err, or err when it got nothing.
func (d *Dispatcher) partial(attempts []*Attempt, settled []Result, err error) ([]*Attempt, []Result, error) {
	if len(attempts)+len(settled) > 0 {
		return attempts, settled, nil // err recurs on the next claim, which reports it
	}
	return nil, nil, err
}

// setAside moves a task the server refused to claim out of the claim's way for the longest backoff,
// in its own statement, and reports it as a SET_ASIDE result (logged as an error by the worker). When
// that statement fails, its error is the claim's: the refusal, and the failure to set the task aside.
func (d *Dispatcher) setAside(ctx context.Context, t dbgen.TaskClaimRow, refused error) (Result, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.DBTimeout)
	defer cancel()
	delay := d.cfg.Backoff.Max
	why := delivery.Truncate(fmt.Sprintf("SET_ASIDE: the database refused to claim this task: %v; tried again after %s",
		refused, delay.Round(time.Second)), MaxNoteLength)
	if _, err := dbgen.New(d.pool).TaskSetAside(ctx, dbgen.TaskSetAsideParams{
		ID: t.ID, DelaySeconds: delay.Seconds(), LastError: why,
	}); err != nil {
		return Result{}, fmt.Errorf("claim: %w (and setting task %d aside failed: %w)", refused, t.ID, err)
	}
	return Result{Kind: ResultSetAside, TaskID: t.ID, Channel: t.Channel, Detail: why, Err: refused}, nil
}
