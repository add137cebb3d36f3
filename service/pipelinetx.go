package service

// A transaction for the claim that spends no round trip on BEGIN or COMMIT alone: the generated
// queries run on it unchanged (it implements dbgen.DBTX), BEGIN travels with the first statement and
// COMMIT, when asked for, with the last.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/notifierhq/notifier/dbgen"
)

// pipelineTx is a transaction on one connection that spends no round trip on BEGIN or COMMIT alone: BEGIN
// (dbgen.TxBegin) is pipelined with the first statement, and COMMIT (dbgen.TxCommit) with the statement
// that follows commitWithNext. A claim is then two round trips instead of four. It implements dbgen.DBTX
// so the generated queries run on it unchanged.
//
// In a pipeline the server skips every message after a failed one, so a COMMIT behind a failed
// statement never runs; inPipelineTx then rolls the transaction back.
type pipelineTx struct {
	conn       *pgx.Conn
	begun      bool // TxBegin was sent
	commitNext bool // the next statement carries TxCommit
	committed  bool // TxCommit succeeded
}

// inPipelineTx runs fn in a pipelineTx on a connection of pool. If fn returns nil and did not commit with its
// last statement, the transaction is committed on its own; if anything fails it is rolled back.
func inPipelineTx(ctx context.Context, pool *pgxpool.Pool, fn func(q *dbgen.Queries, tx *pipelineTx) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release() // the pool destroys a connection left inside a transaction
	tx := &pipelineTx{conn: conn.Conn()}
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
func (tx *pipelineTx) commitWithNext() { tx.commitNext = true }

// rollback ends a failed transaction if the connection is still inside one. Failing that, the pool
// destroys the connection on release, which ends the transaction too.
func (tx *pipelineTx) rollback(ctx context.Context) {
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
func (tx *pipelineTx) pipelined() bool { return !tx.begun || tx.commitNext }

// send sends [TxBegin] sql [TxCommit] in one round trip (one pgx batch) and reads TxBegin's result.
func (tx *pipelineTx) send(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
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

// closeBatch reads the COMMIT's result if the round trip carries one, and closes it.
func (tx *pipelineTx) closeBatch(br pgx.BatchResults, err error) error {
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
func (tx *pipelineTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if !tx.pipelined() {
		return tx.conn.Exec(ctx, sql, args...)
	}
	br, err := tx.send(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	return tag, tx.closeBatch(br, err)
}

// Query implements dbgen.DBTX. With a COMMIT behind the statement, the rows report the COMMIT's
// failure from Err once Next has returned false, as the generated code checks.
func (tx *pipelineTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if !tx.pipelined() {
		return tx.conn.Query(ctx, sql, args...)
	}
	br, err := tx.send(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, tx.closeBatch(br, err)
	}
	return &batchRows{Rows: rows, tx: tx, br: br}, nil
}

// QueryRow implements dbgen.DBTX.
func (tx *pipelineTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if !tx.pipelined() {
		return tx.conn.QueryRow(ctx, sql, args...)
	}
	rows, err := tx.Query(ctx, sql, args...)
	return firstRow{rows: rows, err: err}
}

// batchRows are a statement's rows inside a batch: done reads what was queued behind them.
type batchRows struct {
	pgx.Rows
	tx   *pipelineTx
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
	r.err = r.tx.closeBatch(r.br, r.Rows.Err())
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
