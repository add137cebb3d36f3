package service

import (
	"context"
	"strings"
	"testing"
	"time"

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
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	n := NewNotifier(pool)
	for _, ch := range []string{"push", "sms"} {
		_, err := n.SetPreference(ctx, "u1", ch, "u1@"+ch, true)
		is.NoErr(err) // preference set
	}
	_, _, tasks, err := n.Create(ctx, "u1", "e1", "body", time.Hour, 3)
	is.NoErr(err)           // notification created
	is.Equal(len(tasks), 2) // a push and an sms task
	channels := []string{"push", "sms"}

	err = inClaimTx(ctx, pool, func(q *dbgen.Queries, tx *claimTx) error {
		rows, err := q.TaskClaim(ctx, dbgen.TaskClaimParams{Channels: channels, MaxTasks: 2})
		is.NoErr(err)                                                                                                  // claim
		is.Equal(len(rows), 2)                                                                                         // both tasks are locked
		is.NoErr(q.TaskPark(ctx, dbgen.TaskParkParams{ID: rows[1].ID, LastError: "written inside the failing claim"})) // a write the rollback must undo
		tx.commitWithNext()
		_, err = q.TaskStartAttempts(ctx, dbgen.TaskStartAttemptsParams{
			Ids: []int64{rows[0].ID}, OutcomeUncertain: []bool{false}, Actions: []string{"NOT-AN-ACTION"},
			Worker: "w-test", LeaseSeconds: 30,
		})
		return err
	})
	is.True(err != nil)                                        // the failed statement is reported
	is.True(strings.Contains(err.Error(), "delivery_attempt")) // by the constraint that refused it

	for _, ref := range tasks {
		task, err := n.Task(ctx, ref.TaskID)
		is.NoErr(err)
		is.Equal(task.State, StatePending) // neither started nor parked: all rolled back with the failed statement
		is.True(!task.NeedsReview)         // the park was undone
		is.Equal(task.AttemptCount, 0)     // no attempt counted
		attempts, err := n.Attempts(ctx, ref.TaskID)
		is.NoErr(err)
		is.Equal(len(attempts), 0) // no attempt row
	}

	// The locks went with the transaction: the next claim (on whatever connection) takes the task.
	err = inClaimTx(ctx, pool, func(q *dbgen.Queries, tx *claimTx) error {
		rows, err := q.TaskClaim(ctx, dbgen.TaskClaimParams{Channels: channels, MaxTasks: 2})
		is.NoErr(err)          // claim again
		is.Equal(len(rows), 2) // both tasks are free
		return nil
	})
	is.NoErr(err) // the second claim commits
}
