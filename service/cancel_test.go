package service_test

// Cancel (notifier_cancel, schema/005), through the real database and the strict fakes: a task certainly
// never accepted ends SUPPRESSED with a CANCELLED attempt, due or not; an uncertain one is parked, never
// written off and never called again; a task being called finishes as usual and, left waiting, is
// settled by its next claim without a call.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// cancel cancels (user, key) and fails the test on error.
func (e *env) cancel(user, key, note string) service.Cancellation {
	e.t.Helper()
	c, err := e.n.Cancel(e.ctx, user, key, note)
	if err != nil {
		e.t.Fatalf("cancel %s/%s: %v", user, key, err)
	}
	return c
}

// TestCancelWaitingTasksAreSuppressed: a task due now and one waiting for a retry after a certain
// refusal (not due for an hour) both end SUPPRESSED with a SKIP attempt CANCELLED and the note, nothing
// is called afterwards, a second cancel changes nothing, and a later create answers created=false.
func TestCancelWaitingTasksAreSuppressed(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	tasks := e.create("u1", "order-1-shipped", time.Hour, 3)
	byChannel := map[string]int64{}
	for _, task := range tasks {
		byChannel[task.Channel] = task.TaskID
	}
	push, sms := byChannel["push"], byChannel["sms"]
	e.sms.ScriptSend(e.ref(sms), fakes.Step{Status: 503})
	d := e.dispatcher(dcfg{backoff: time.Hour, configure: func(c *service.DispatcherConfig) {
		delete(c.Routes, "push") // this worker serves sms only: push stays due, untouched
	}})
	is.Equal(runOnce(t, d).Kind, service.ResultPending) // sms refused for certain: waits an hour for its retry
	is.True(e.task(sms).NextAttemptAt.After(time.Now().Add(30 * time.Minute)))

	c := e.cancel("u1", "order-1-shipped", "order cancelled")
	is.True(c.Changed)
	is.True(c.NotificationID != nil)
	is.Equal(len(c.Tasks), 2)
	for _, task := range c.Tasks {
		is.Equal(task.Effect, service.CancelSuppressed) // waiting and certain: suppressed now
		is.Equal(task.StateBefore, delivery.StatePending)
		is.Equal(task.StateAfter, delivery.StateSuppressed)
		is.True(task.Changed)
	}
	is.Equal(e.outcomes(push), outcomes(delivery.OutcomeCancelled))                         // due now: its only attempt is the cancel
	is.Equal(e.outcomes(sms), outcomes(delivery.OutcomeHTTP5xx, delivery.OutcomeCancelled)) // not due: settled all the same
	last := e.attempts(sms)[1]
	is.Equal(last.Action, delivery.ActionSkip)
	is.Equal(last.Note, "order cancelled") // the note is kept on the attempt
	for _, id := range []int64{push, sms} {
		task := e.task(id)
		is.Equal(task.State, delivery.StateSuppressed)
		is.True(task.NextAttemptAt == nil)
	}

	all := e.dispatcher(dcfg{})
	is.Equal(runOnce(t, all).Kind, service.ResultNothing) // nothing left to claim
	is.Equal(e.push.TotalSends(), 0)                      // push was never called
	is.Equal(e.sms.TotalSends(), 1)                       // sms only by its refused call

	again := e.cancel("u1", "order-1-shipped", "")
	is.True(!again.Changed) // a second cancel changes nothing
	for _, task := range again.Tasks {
		is.Equal(task.Effect, service.CancelFinal)
	}
	id, created, _, err := e.n.Create(e.ctx, service.CreateRequest{UserID: "u1", EventKey: "order-1-shipped", Body: "again",
		TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)
	is.True(!created)               // the notification stays: the event is not created again
	is.Equal(id, *c.NotificationID) // the same notification
	is.Equal(e.scalar(`SELECT count(*) FROM notification`), int64(1))
	var note string
	is.NoErr(e.pool.QueryRow(e.ctx, `SELECT cancel_note FROM notification`).Scan(&note))
	is.Equal(note, "order cancelled") // the first cancel's note stays
}

// TestCancelUnknownEventChangesNothing: no such event, nothing written.
func TestCancelUnknownEventChangesNothing(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	e.create("u1", "k1", time.Hour, 3)
	c := e.cancel("u1", "no-such-event", "")
	is.True(!c.Changed)
	is.True(c.NotificationID == nil)
	is.Equal(len(c.Tasks), 0)
	is.Equal(e.scalar(`SELECT count(*) FROM notification WHERE cancelled_at IS NOT NULL`), int64(0))
	_, err := e.n.Cancel(e.ctx, "u1", "", "")
	is.True(errors.Is(err, delivery.ErrInvalidInput)) // an empty event key is refused before the database
}

// TestCancelUncertainTaskParks: a call that timed out leaves the task UNKNOWN, waiting for a resend
// (idempotent push) or a query (queryable sms). The cancel parks it with CANCELLED_UNCERTAIN: never
// written off, and the worker makes no further call. On a NONE channel the timeout parked it already:
// the cancel leaves it as it is.
func TestCancelUncertainTaskParks(t *testing.T) {
	for _, c := range []struct {
		channel string
		fake    func(*env) *fakes.Channel
		effect  service.CancelEffect
	}{
		{"push", func(e *env) *fakes.Channel { return e.push }, service.CancelParked},
		{"sms", func(e *env) *fakes.Channel { return e.sms }, service.CancelParked},
		{"none", func(e *env) *fakes.Channel { return e.none }, service.CancelAlreadyParked},
	} {
		t.Run(c.channel, func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			e.w.User("u1", c.channel)
			id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
			fake := c.fake(e)
			fake.ScriptSend(e.ref(id), fakes.Step{Delay: fakeDelay})
			d := e.dispatcher(dcfg{timeout: clientTimeout})
			is.Equal(runOnce(t, d).Outcome, delivery.OutcomeTimeout) // accepted, then timed out: unknown
			calls := fake.Sends(e.ref(id)) + fake.Queries(e.ref(id))

			got := e.cancel("u1", "e1", "")
			is.Equal(len(got.Tasks), 1)
			is.Equal(got.Tasks[0].Effect, c.effect)
			is.Equal(got.Changed, c.effect == service.CancelParked)
			task := e.task(id)
			is.Equal(task.State, delivery.StateUnknown) // never written off
			is.True(task.NeedsReview)                   // parked for a human
			is.True(task.OutcomeUncertain)
			if c.effect == service.CancelParked {
				is.Equal(e.outcomes(id), outcomes(delivery.OutcomeTimeout, delivery.OutcomeCancelledUncertain))
			}

			// The worker runs on: the task is never claimed again, and the channel is never called again.
			e.waitDB(`now() > (SELECT updated_at FROM delivery_task WHERE id = $1) + interval '200 milliseconds'`, id)
			is.Equal(runOnce(t, d).Kind, service.ResultNothing)
			is.Equal(fake.Sends(e.ref(id))+fake.Queries(e.ref(id)), calls) // 0 further calls
			is.Equal(fake.Outbound(e.ref(id)), 1)                          // the one message the timed-out call sent
		})
	}
}

// TestCancelWhileSending: a task being called cannot be recalled. The cancel records itself
// (AT_NEXT_CLAIM), the holder's call and finish proceed; a finish that leaves the task waiting (a
// certain refusal; an unknown outcome) is followed by a claim that settles it as cancelled, with 0
// further calls; an accepted call stays SENT.
func TestCancelWhileSending(t *testing.T) {
	for _, c := range []struct {
		name     string
		step     fakes.Step
		finished service.ResultKind
		settled  service.ResultKind // the next claim's
		outcomes []delivery.Outcome
		state    delivery.State
	}{
		{"refused for certain", fakes.Step{Status: 503}, service.ResultPending, service.ResultSuppressed,
			outcomes(delivery.OutcomeHTTP5xx, delivery.OutcomeCancelled), delivery.StateSuppressed},
		{"timed out", fakes.Step{Delay: fakeDelay}, service.ResultUnknown, service.ResultParked,
			outcomes(delivery.OutcomeTimeout, delivery.OutcomeCancelledUncertain), delivery.StateUnknown},
		{"accepted", fakes.Step{}, service.ResultSent, service.ResultNothing,
			outcomes(delivery.OutcomeAccepted), delivery.StateSent},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			e.w.User("u1", "push")
			id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
			e.push.ScriptSend(e.ref(id), c.step)
			d := e.dispatcher(dcfg{timeout: clientTimeout})
			a, _, err := claimOne(e.ctx, d)
			is.NoErr(err)
			is.True(a != nil) // held: SENDING under a live lease

			got := e.cancel("u1", "e1", "too late?")
			is.True(got.Changed) // the cancel is recorded
			is.Equal(got.Tasks[0].Effect, service.CancelAtNextClaim)
			is.Equal(got.Tasks[0].StateAfter, delivery.StateSending) // the holder keeps it
			is.True(!e.cancel("u1", "e1", "").Changed)               // recorded once

			obs := d.Call(e.ctx, a) // the call was already on its way
			res, err := finishOne(e.ctx, d, a, obs)
			is.NoErr(err)
			is.Equal(res.Kind, c.finished) // the finish proceeds as without a cancel
			calls := e.push.Sends(e.ref(id))
			is.Equal(calls, 1)

			if c.settled != service.ResultNothing { // left waiting: its next claim settles it
				next := runNext(t, d)
				is.Equal(next.Kind, c.settled)
				is.Equal(next.Action, delivery.ActionSkip) // no call
			}
			is.Equal(runOnce(t, d).Kind, service.ResultNothing)
			is.Equal(e.push.Sends(e.ref(id)), calls) // 0 further calls
			is.Equal(e.outcomes(id), c.outcomes)
			is.Equal(e.task(id).State, c.state)
		})
	}
}

// TestCancelNeedsTheCreatorRole: the creator cancels; the worker, operator and receiver may not, get a
// *PermissionError naming the creator role, and nothing changes.
func TestCancelNeedsTheCreatorRole(t *testing.T) {
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	for _, role := range []string{service.RoleWorker, service.RoleOperator, service.RoleReceiver} {
		t.Run(role, func(t *testing.T) {
			is := is.New(t)
			_, err := service.NewNotifier(secRolePool(t, e, role)).Cancel(context.Background(), "u1", "e1", "")
			is.True(errors.Is(err, service.ErrPermission)) // refused
			var perm *service.PermissionError
			is.True(errors.As(err, &perm))
			is.Equal(perm.Role, service.RoleCreator) // naming the role to grant
			is.Equal(e.task(id).State, delivery.StatePending)
		})
	}
	is := is.New(t)
	c, err := service.NewNotifier(secRolePool(t, e, service.RoleCreator)).Cancel(context.Background(), "u1", "e1", "by the creator")
	is.NoErr(err)
	is.True(c.Changed)
	is.Equal(e.task(id).State, delivery.StateSuppressed)
	is.Equal(e.outcomes(id), outcomes(delivery.OutcomeCancelled))
}

// TestCancelOfAHolderThatDied: the holder of a cancelled task vanished (its lease ran out, its call may
// have gone out). The next claim neither calls nor writes it off: it parks it with CANCELLED_UNCERTAIN.
func TestCancelOfAHolderThatDied(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	d := e.dispatcher(dcfg{lease: 300 * time.Millisecond, timeout: 200 * time.Millisecond})
	a, _, err := claimOne(e.ctx, d)
	is.NoErr(err)
	is.True(a != nil) // held, and never called nor finished: the holder is gone
	is.Equal(e.cancel("u1", "e1", "").Tasks[0].Effect, service.CancelAtNextClaim)

	e.waitDB(`(SELECT lease_until < now() FROM delivery_task WHERE id = $1)`, id)
	res := runOnce(t, d)
	is.Equal(res.Kind, service.ResultParked) // taken over as uncertain: parked, not SUPPRESSED
	is.Equal(res.Outcome, delivery.OutcomeCancelledUncertain)
	is.Equal(e.outcomes(id), outcomes(delivery.OutcomeLeaseExpired, delivery.OutcomeCancelledUncertain))
	is.Equal(runOnce(t, d).Kind, service.ResultNothing)
	is.Equal(e.push.TotalSends(), 0) // no call from the claim
}
