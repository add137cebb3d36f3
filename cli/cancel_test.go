package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// TestCancelCommand: the creator cancels an event (exit 0, its task SUPPRESSED); the same cancel again,
// and an event that does not exist, change nothing (exit 3, the JSON of what happened on stdout, why
// on stderr); a later create of the event answers created=false; the worker role may not cancel (exit
// 1 naming the creator role) and changes nothing.
func TestCancelCommand(t *testing.T) {
	t.Parallel()
	c, pool := newCLI(t)
	ctx := context.Background()
	n := service.NewNotifier(pool)
	_, err := n.SetPreference(ctx, "u1", "push", "device-1", true)
	is.New(t).NoErr(err)
	_, _, tasks, err := n.Create(ctx, service.CreateRequest{UserID: "u1", EventKey: "order-1-shipped", Body: "Shipped", TTL: time.Hour, MaxAttempts: 3})
	is.New(t).NoErr(err)
	cancel := []string{"cancel", "--user", "u1", "--event-key", "order-1-shipped", "--note", "order cancelled"}

	t.Run("worker", func(t *testing.T) {
		is := is.New(t)
		before := rowCounts(t, pool)
		r := c.in(t).loginAs(pool, service.RoleWorker).run("", cancel...)
		is.Equal(r.code, 1) // a runtime error, not "nothing changed"
		oneErrorLine(t, r)
		is.True(strings.Contains(r.stderr, "cancel needs the notifier_creator role: permission denied for function notifier_cancel"))
		is.Equal(r.stdout, "")
		is.Equal(rowCounts(t, pool), before) // nothing written
	})

	is := is.New(t)
	creator := c.loginAs(pool, service.RoleCreator)
	var out service.Cancellation
	decode(t, creator.ok(cancel...).stdout, &out)
	is.True(out.Changed)
	is.Equal(len(out.Tasks), 1)
	is.Equal(out.Tasks[0], service.CancelledTask{TaskID: tasks[0].TaskID, Channel: "push", StateBefore: delivery.StatePending,
		StateAfter: delivery.StateSuppressed, Effect: service.CancelSuppressed, Changed: true})
	task, err := n.Task(ctx, tasks[0].TaskID)
	is.NoErr(err)
	is.Equal(task.State, delivery.StateSuppressed)

	r := creator.run("", cancel...)
	is.Equal(r.code, 3) // every task already final: nothing changed
	oneErrorLine(t, r)
	is.True(strings.Contains(r.stderr, "nothing changed: every task is already final"))
	decode(t, r.stdout, &out)
	is.True(!out.Changed)
	is.Equal(out.Tasks[0].Effect, service.CancelFinal)

	r = creator.run("", "cancel", "--user", "u1", "--event-key", "no-such-event")
	is.Equal(r.code, 3) // no such event
	oneErrorLine(t, r)
	is.True(strings.Contains(r.stderr, "nothing changed: no such event"))
	decode(t, r.stdout, &out)
	is.True(out.NotificationID == nil)
	is.Equal(len(out.Tasks), 0)

	r = creator.ok("create", "--user", "u1", "--event-key", "order-1-shipped", "--body", "Shipped again")
	is.True(strings.Contains(r.stdout, `"created":false`)) // the cancelled notification stays

	shown := c.show("--user", "u1", "--event-key", "order-1-shipped") // an operator follows it
	is.True(shown.CancelledAt != nil)                                 // show says it was cancelled
	is.Equal(*shown.CancelNote, "order cancelled")                    // and why
	is.Equal(shown.Tasks[0].State, delivery.StateSuppressed)
	is.Equal(shown.Tasks[0].Attempts[0].Outcome, delivery.OutcomeCancelled) // with the cancel's attempt
}

// TestCancelHelp: cancel --help says what happens to each task and what the exit codes mean.
func TestCancelHelp(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	r := notifierCLI{t: t}.ok("cancel", "--help")
	for _, want := range []string{"notifier cancel --user U --event-key K [--note TEXT]", "CANCELLED", "PARKED", "AT_NEXT_CLAIM",
		"cannot be recalled", "created=false", "Exit code 0 when something changed; 3 when nothing did"} {
		is.True(strings.Contains(r.stdout, want)) // the help explains it
	}
}
