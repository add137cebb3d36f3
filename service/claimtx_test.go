package service

import (
	"context"
	"fmt"
	"github.com/notifierhq/notifier/service/delivery"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/internal/pgtest"
)

// The COMMIT that travels with a claim's last statement must not make anything of a failed claim
// durable: here the statement before it fails (an action the attempt table refuses) after the claim
// has already written (TaskPark of the other task it locked). Nothing may remain, and both tasks must be
// claimable again.
func TestClaimTxWritesNothingWhenTheStatementBeforeCommitFails(t *testing.T) {
	is := is.New(t)
	ctx, n, pool, tasks := twoTasks(t)

	err := inPipelineTx(ctx, pool, func(q *dbgen.Queries, tx *pipelineTx) error {
		rows, err := claimChannels(ctx, q, 2, "push", "sms")
		is.NoErr(err)          // claim
		is.Equal(len(rows), 2) // both tasks are locked
		parked, err := q.TaskPark(ctx, dbgen.TaskParkParams{ID: rows[1].ID, LastError: "written inside the failing claim"})
		is.NoErr(err)              // a write the rollback must undo
		is.Equal(parked, int64(1)) // of the locked task
		tx.commitWithNext()
		_, err = q.TaskStartAttempts(ctx, dbgen.TaskStartAttemptsParams{
			IDs: []int64{rows[0].ID}, AttemptTokens: []string{newToken()}, OutcomeUncertain: []bool{false}, Actions: []string{"NOT-AN-ACTION"},
			Worker: "w-test", LeaseSeconds: 30,
		})
		return err
	})
	is.True(err != nil)                                        // the failed statement is reported
	is.True(strings.Contains(err.Error(), "delivery_attempt")) // by the constraint that refused it

	for _, id := range tasks {
		task, err := n.Task(ctx, id)
		is.NoErr(err)
		is.Equal(task.State, delivery.StatePending) // neither started nor parked: all rolled back with the failed statement
		is.True(!task.NeedsReview)                  // the park was undone
		is.Equal(task.AttemptCount, 0)              // no attempt counted
		attempts, err := n.Attempts(ctx, id)
		is.NoErr(err)
		is.Equal(len(attempts), 0) // no attempt row
	}

	// The locks went with the transaction: the next claim (on whatever connection) takes the task.
	err = inPipelineTx(ctx, pool, func(q *dbgen.Queries, tx *pipelineTx) error {
		rows, err := claimChannels(ctx, q, 2, "push", "sms")
		is.NoErr(err)          // claim again
		is.Equal(len(rows), 2) // both tasks are free
		return nil
	})
	is.NoErr(err) // the second claim commits
}

// claimChannels runs TaskClaim for each channel in turn, as Dispatcher.lockDue does, up to limit rows.
func claimChannels(ctx context.Context, q *dbgen.Queries, limit int, channels ...string) ([]dbgen.TaskClaimRow, error) {
	var rows []dbgen.TaskClaimRow
	for _, ch := range channels {
		got, err := q.TaskClaim(ctx, dbgen.TaskClaimParams{Channel: ch, MaxTasks: int32(limit - len(rows))})
		if err != nil {
			return rows, err
		}
		rows = append(rows, got...)
	}
	return rows, nil
}

// twoTasks creates one notification for u1 with a push and an sms task and returns their ids.
func twoTasks(t *testing.T) (context.Context, *Notifier, *pgxpool.Pool, []int64) {
	is := is.New(t)
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	n := NewNotifier(pool)
	for _, ch := range []string{"push", "sms"} {
		_, err := n.SetPreference(ctx, "u1", ch, "u1@"+ch, true)
		is.NoErr(err) // preference set
	}
	_, _, tasks, err := n.Create(ctx, CreateRequest{UserID: "u1", EventKey: "e1", Body: "body", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)           // notification created
	is.Equal(len(tasks), 2) // a push and an sms task
	return ctx, n, pool, []int64{tasks[0].TaskID, tasks[1].TaskID}
}

// TaskPark and TaskSettleWithoutCall guard on the row's state, not on the caller's care: a task this
// claim may not settle (here one held under a live lease) matches 0 rows, and settle reports that as an
// error naming the task instead of writing it.
func TestSettleGuardsOnTheRowsState(t *testing.T) {
	is := is.New(t)
	ctx, n, pool, _ := twoTasks(t)
	d, err := NewDispatcher(t.Context(), pool, DispatcherConfig{Worker: "w-test", Routes: map[string]delivery.Route{"push": {Mode: delivery.ModeIdempotent, Client: nilChannel{}}}})
	is.NoErr(err)
	claimed, _, err := d.ClaimBatch(ctx, 1)
	is.NoErr(err)
	is.Equal(len(claimed), 1) // the push task is held under a live lease
	held := claimed[0]
	for _, dec := range []delivery.ClaimDecision{
		{Kind: delivery.ClaimPark, Uncertain: true, Reason: "parked by mistake"},
		{Kind: delivery.ClaimSettle, State: delivery.StateSuppressed, Outcome: delivery.OutcomePrefDisabled, Reason: "suppressed by mistake"},
	} {
		err = inPipelineTx(ctx, pool, func(q *dbgen.Queries, tx *pipelineTx) error {
			_, err := d.settle(ctx, q, dbgen.TaskClaimRow{ID: held.TaskID, Channel: "push"}, dec)
			return err
		})
		is.True(err != nil)                                                                 // refused
		is.True(strings.Contains(err.Error(), fmt.Sprintf("task %d: 0 rows", held.TaskID))) // naming the task
		task, err := n.Task(ctx, held.TaskID)
		is.NoErr(err)
		is.Equal(task.State, delivery.StateSending) // still held
		is.Equal(task.AttemptCount, 1)              // nothing counted
		is.True(!task.NeedsReview)                  // nor parked
	}
}

// nilChannel is never called: the test only claims.
type nilChannel struct{}

func (nilChannel) Send(context.Context, delivery.Message) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeTimeout}
}
func (nilChannel) Query(context.Context, string) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeQueryFailed}
}
