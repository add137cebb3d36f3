package service_test

// The Postmark adapter (service/postmark) under the real protocol: routes built from a channels file
// of kind postmark, the Postmark fake, a real database.

import (
	"slices"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

const postmarkTestToken = "pm-service-test-4e3d2c"

// postmarkDispatcher serves channel "email" as a channels file of kind postmark declares it, with a
// short query_settle so the test need not wait Postmark's default.
func (e *env) postmarkDispatcher(f *fakes.Postmark, configure ...func(*service.DispatcherConfig)) *dispatcher {
	e.t.Helper()
	file := "[channels.email]\nkind = \"postmark\"\nserver_token_env = \"T\"\nfrom = \"noreply@example.com\"\nquery_settle = \"500ms\"\nbase_url = \"" + f.URL() + "\"\n"
	return e.channelsFileDispatcher("w-postmark", file, func(string) string { return postmarkTestToken }, configure...)
}

// postmarkDispatcherWith serves channel "email" of kind postmark with the kind's defaults and extra keys.
func (e *env) postmarkDispatcherWith(f *fakes.Postmark, extra string) *dispatcher {
	e.t.Helper()
	file := "[channels.email]\nkind = \"postmark\"\nserver_token_env = \"T\"\nfrom = \"noreply@example.com\"\nbase_url = \"" + f.URL() + "\"\n" + extra
	return e.channelsFileDispatcher("w-postmark", file, func(string) string { return postmarkTestToken })
}

func startPostmark(t *testing.T) *fakes.Postmark {
	f := fakes.StartPostmark(postmarkTestToken)
	t.Cleanup(f.Close)
	return f
}

func TestPostmarkProviderAccepted(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startPostmark(t)
	e.w.User("u1", "email")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	ref := e.ref(id)
	is.Equal(runOnce(t, e.postmarkDispatcher(f)).Outcome, delivery.OutcomeAccepted)
	task := e.task(id)
	is.Equal(task.State, delivery.StateSent)            // SENT
	is.Equal(task.ProviderMsgID, f.Messages(ref)[0].ID) // with Postmark's MessageID
	is.Equal(f.Requests(), len(e.attempts(id)))         // requests received == attempt rows
}

// Accepted, then the answer is lost (a timeout, a dropped connection): the next attempt queries, finds
// the email, and the task is SENT without a second email.
func TestPostmarkProviderLostAnswerIsQueried(t *testing.T) {
	for name, step := range map[string]fakes.Step{"timeout": {Delay: 3 * time.Second}, "drop": {Drop: true}} {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			f := startPostmark(t)
			e.w.User("u1", "email")
			id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
			ref := e.ref(id)
			f.ScriptSend(ref, step)
			d := e.postmarkDispatcher(f)
			first := runOnce(t, d)
			is.True(first.Outcome == delivery.OutcomeTimeout || first.Outcome == delivery.OutcomeIOError) // no answer
			second := runNext(t, d)
			is.Equal(second.Action, delivery.ActionQuery)        // asked, not resent
			is.Equal(second.Outcome, delivery.OutcomeQueryFound) // found by metadata
			is.Equal(e.task(id).State, delivery.StateSent)
			is.Equal(e.task(id).ProviderMsgID, f.Messages(ref)[0].ID)
			is.Equal(f.Outbound(ref), 1)                // one email
			is.Equal(f.Requests(), len(e.attempts(id))) // requests received == attempt rows
		})
	}
}

// A 500 may come after acceptance: the task is queried; once the search has had query_settle to see
// an email and still finds none, it is resent.
func TestPostmarkProviderServerErrorQueriesThenResends(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startPostmark(t)
	e.w.User("u1", "email")
	id := e.create("u1", "e1", time.Hour, 6)[0].TaskID
	ref := e.ref(id)
	f.ScriptSend(ref, fakes.Step{Status: 500})
	d := e.postmarkDispatcher(f)
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeHTTP5xx)
	var last service.Result
	for last.Outcome != delivery.OutcomeAccepted {
		last = runNext(t, d)
		is.True(last.Kind != service.ResultParked) // never parked: the query settles it
	}
	got := e.outcomes(id)
	is.True(slices.Contains(got, delivery.OutcomeQueryNotFound)) // asked first
	is.Equal(f.Outbound(ref), 1)                                 // one email
	is.Equal(f.Requests(), len(got))                             // requests received == attempt rows
	task := e.task(id)
	is.Equal(task.State, delivery.StateSent)
}

// An inactive recipient (ErrorCode 406) fails the task at once and, with work
// --disable-on-unregistered, switches the preference off: the next notification makes no task.
func TestPostmarkProviderInactiveRecipient(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startPostmark(t)
	e.w.User("u1", "email") // address u1@email
	f.SetInactive("u1@email")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	d := e.postmarkDispatcher(f, func(c *service.DispatcherConfig) { c.DisableUnregistered = true })
	res := runOnce(t, d)
	is.Equal(res.Outcome, delivery.OutcomeRejected)
	is.True(res.PrefDisabled)                        // the address is gone: the preference goes off
	is.Equal(e.task(id).State, delivery.StateFailed) // not retried
	is.Equal(f.Requests(), 1)
	_, created, tasks, err := e.n.Create(e.ctx, service.CreateRequest{UserID: "u1", EventKey: "e2", Body: "body", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)
	is.True(created)
	is.Equal(len(tasks), 0) // nothing more to a dead address
}

// makeDue makes a waiting task due now, as if its wait had passed: test-only history, outside the
// state machine.
func (e *env) makeDue(id int64) {
	e.t.Helper()
	e.withoutStateMachine(func() {
		if _, err := e.pool.Exec(e.ctx, `UPDATE delivery_task SET next_attempt_at = now() WHERE id = $1 AND next_attempt_at IS NOT NULL`, id); err != nil {
			e.t.Fatal(err)
		}
	})
}

// postmarkLostAnswer times out one Postmark attempt after the fake accepted the email, at the fake's
// clock's start, and returns the task and its ref.
func postmarkLostAnswer(t *testing.T, e *env, f *fakes.Postmark, d *dispatcher) (int64, string) {
	is := is.New(t)
	e.w.User("u1", "email")
	id := e.create("u1", "e1", 30*24*time.Hour, 6)[0].TaskID
	ref := e.ref(id)
	f.ScriptSend(ref, fakes.Step{Delay: time.Second}) // accepted, answered after the 300 ms client timeout
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeTimeout)
	return id, ref
}

// Postmark's search lags by an amount it does not bound. A "not found" younger than the default
// query_settle leads to no resend: the task stays uncertain and is queried again, and then found.
func TestPostmarkProviderNotFoundInsideTheLagIsNotTrusted(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startPostmark(t)
	clock := newTestClock()
	f.SetClock(clock.Now)
	start := clock.Now()
	f.SetSearchLag(10 * time.Minute) // longer than any settle time of a few minutes
	d := e.postmarkDispatcherWith(f, "")
	id, ref := postmarkLostAnswer(t, e, f, d)
	e.ageUncertainty(id, 6*time.Minute)
	clock.Set(start.Add(6 * time.Minute))
	first := runNext(t, d)
	is.Equal(first.Action, delivery.ActionQuery)
	is.Equal(first.Outcome, delivery.OutcomeQueryNotFound) // inside the lag
	e.ageUncertainty(id, 10*time.Minute)                   // ten minutes later
	clock.Set(start.Add(16 * time.Minute))
	e.makeDue(id)
	second := runNext(t, d)
	is.Equal(f.Outbound(ref), 1)                         // no second email
	is.Equal(second.Action, delivery.ActionQuery)        // asked again, not resent
	is.Equal(second.Outcome, delivery.OutcomeQueryFound) // now the search sees it
	is.Equal(e.task(id).State, delivery.StateSent)       //
	is.Equal(f.Requests(), len(e.attempts(id)))          // requests received == attempt rows
}

// An account keeps messages 7 days (the shortest retention Postmark offers, the channel's default
// assumption): a task uncertain for 8 days is parked, never queried into a "not found" the search can
// no longer contradict, and never resent.
func TestPostmarkProviderNoQueryPastRetention(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startPostmark(t)
	clock := newTestClock()
	f.SetClock(clock.Now)
	start := clock.Now()
	f.SetRetention(7 * 24 * time.Hour)
	d := e.postmarkDispatcherWith(f, "")
	id, ref := postmarkLostAnswer(t, e, f, d)
	e.ageUncertainty(id, 8*24*time.Hour)
	clock.Set(start.Add(8 * 24 * time.Hour))
	res := runNext(t, d)
	if res.Kind != service.ResultParked {
		runNext(t, d) // the old contract's resend after the "not found"
	}
	is.Equal(f.Outbound(ref), 1)             // no second email
	is.Equal(res.Kind, service.ResultParked) // parked for a human
	is.True(e.task(id).NeedsReview)
}

// With retention = "45d" (an account on Postmark's default) the same task is still queried, and found.
func TestPostmarkProviderRetentionKeyAllowsLongerQueries(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startPostmark(t)
	clock := newTestClock()
	f.SetClock(clock.Now)
	start := clock.Now()
	d := e.postmarkDispatcherWith(f, "retention = \"45d\"\n")
	id, ref := postmarkLostAnswer(t, e, f, d)
	e.ageUncertainty(id, 8*24*time.Hour)
	clock.Set(start.Add(8 * 24 * time.Hour))
	res := runNext(t, d)
	is.Equal(res.Outcome, delivery.OutcomeQueryFound)
	is.Equal(e.task(id).State, delivery.StateSent)
	is.Equal(f.Outbound(ref), 1)
}
