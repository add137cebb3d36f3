package service

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/service/delivery"
)

// The checks of schema/003, counted: a claim and a finish of many tasks, the two moves every delivery
// makes, call no PL/pgSQL trigger function per row (the state machine's and append-only's WHENs pass
// them; the claim's evidence and its calls' fit with their tasks are one statement-level call per
// statement), while a move the WHENs do not recognise still calls the state machine. Counted by the
// server itself (pg_stat_get_xact_function_calls under track_functions = 'pl', which only a superuser
// may set: the test skips otherwise).
func TestClaimAndFinishCallNoTriggerFunctionPerRow(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	n := NewNotifier(pool)
	_, err := n.SetPreference(ctx, "u1", "push", "u1@push", true)
	is.NoErr(err) // preference set
	const tasks = 10
	for i := range tasks + 1 {
		_, _, _, err := n.Create(ctx, CreateRequest{UserID: "u1", EventKey: fmt.Sprintf("e%d", i), Body: "body", TTL: time.Hour, MaxAttempts: 3})
		is.NoErr(err) // notification created
	}

	tx, err := pool.Begin(ctx)
	is.NoErr(err)
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SET LOCAL track_functions = 'pl'"); err != nil {
		t.Skipf("function statistics need a superuser: %v", err)
	}
	q := dbgen.New(tx)
	rows, err := q.TaskClaim(ctx, dbgen.TaskClaimParams{Channel: "push", MaxTasks: tasks})
	is.NoErr(err)              // claim
	is.Equal(len(rows), tasks) // the first ten tasks locked
	start := dbgen.TaskStartAttemptsParams{Worker: "w-test", LeaseSeconds: 30}
	finish := dbgen.TaskFinishParams{}
	for _, r := range rows {
		token := newToken()
		start.IDs, start.AttemptTokens = append(start.IDs, r.ID), append(start.AttemptTokens, token)
		start.OutcomeUncertain, start.Actions = append(start.OutcomeUncertain, false), append(start.Actions, string(delivery.ActionSend))
		finish.IDs, finish.AttemptTokens = append(finish.IDs, r.ID), append(finish.AttemptTokens, token)
		finish.States, finish.Outcomes = append(finish.States, string(delivery.StateSent)), append(finish.Outcomes, string(delivery.OutcomeAccepted))
		finish.OutcomeUncertain, finish.NeedsReview = append(finish.OutcomeUncertain, false), append(finish.NeedsReview, false)
		finish.ProviderMsgIDs = append(finish.ProviderMsgIDs, fmt.Sprintf("msg-%d", r.ID))
		finish.LastErrors, finish.Errors = append(finish.LastErrors, ""), append(finish.Errors, "")
		finish.RetryAfterSeconds = append(finish.RetryAfterSeconds, -1)
	}
	started, err := q.TaskStartAttempts(ctx, start)
	is.NoErr(err)                 // the claim's statement: ten tasks SENDING, ten attempts opened
	is.Equal(len(started), tasks) // every locked task started
	finished, err := q.TaskFinish(ctx, finish)
	is.NoErr(err) // the finish's statement: ten tasks SENT, ten attempts ACCEPTED
	for _, f := range finished {
		is.True(f.Current) // each recorded as the task's outcome
	}
	_, err = tx.Exec(ctx, "SET CONSTRAINTS ALL IMMEDIATE")
	is.NoErr(err) // deferred checks queued so far run now, to be counted

	calls := func(fn string) int64 {
		t.Helper()
		var n *int64
		is.NoErr(tx.QueryRow(ctx, "SELECT pg_stat_get_xact_function_calls($1::regproc::oid)", fn).Scan(&n)) // read the count
		if n == nil {
			return 0
		}
		return *n
	}
	for _, fn := range []string{"delivery_task_state_machine", "delivery_task_evidence", "delivery_attempt_fits", "delivery_attempt_append_only"} {
		is.Equal(calls(fn), int64(0)) // no row function for a claim or a finish
	}
	is.Equal(calls("delivery_task_holders_have_attempts"), int64(2)) // once per statement that updated tasks
	is.Equal(calls("delivery_attempt_calls_follow_tasks"), int64(1)) // once per statement that opened attempts

	// The control: parking a due task is neither a claim nor a finish; the state machine checks it.
	rows, err = q.TaskClaim(ctx, dbgen.TaskClaimParams{Channel: "push", MaxTasks: 1})
	is.NoErr(err)          // the eleventh task
	is.Equal(len(rows), 1) // locked
	parked, err := q.TaskPark(ctx, dbgen.TaskParkParams{ID: rows[0].ID, LastError: "parked by the test"})
	is.NoErr(err)
	is.Equal(parked, int64(1))
	is.Equal(calls("delivery_task_state_machine"), int64(1)) // the function ran for the park
}

// A claim's attempt row must be written by the claim's own statement (schema/003), as
// TaskStartAttempts does: a claim alone is refused at the end of its statement, not only at commit, so a
// second statement cannot bring the attempt.
func TestClaimWithoutItsAttemptIsRefusedAtOnce(t *testing.T) {
	is := is.New(t)
	ctx, _, pool, tasks := twoTasks(t)
	tx, err := pool.Begin(ctx)
	is.NoErr(err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `UPDATE delivery_task SET state = 'SENDING', attempt_token = gen_random_uuid(), lease_owner = 'w-test',
		lease_until = now() + interval '30 seconds', next_attempt_at = NULL, attempt_count = attempt_count + 1 WHERE id = $1`, tasks[0])
	var pgErr *pgconn.PgError
	is.True(errors.As(err, &pgErr))                          // the claim's own statement fails
	is.Equal(pgErr.ConstraintName, "delivery_task_evidence") // for want of its attempt
	is.Equal(pgErr.ColumnName, "attempt_count")
	_, err = tx.Exec(ctx, `SELECT 1`)
	is.True(errors.As(err, &pgErr))
	is.Equal(pgErr.Code, "25P02") // the transaction is aborted: no later statement can bring the attempt
}
