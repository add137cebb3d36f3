package service_test

// Channel contract settings (service.Contract) against the fakes and a real database.

import (
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// An idempotent channel forgets keys after its window: a resend later than that would be a new message,
// so the task is parked instead of resent.
func TestContractIdempotencyWindowParks(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	ref := e.ref(id)
	e.push.ScriptSend(ref, fakes.Step{Delay: fakeDelay})
	d := e.dispatcher(dcfg{timeout: clientTimeout, backoff: time.Second,
		contracts: map[string]delivery.Contract{"push": {IdempotencyWindow: 500 * time.Millisecond}}})
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeTimeout) // accepted, then timed out
	res := runNext(t, d)                                     // after the 1 s backoff the 500 ms window has passed
	is.Equal(res.Kind, service.ResultParked)                 // parked, not resent
	is.True(e.task(id).NeedsReview)
	is.Equal(e.push.Sends(ref), 1)    // no resend outside the window
	is.Equal(e.push.Outbound(ref), 1) // the first one went out
	is.Equal(e.outcomes(id), outcomes(delivery.OutcomeTimeout))
}

// Inside the window the same channel resends as usual (the control for the test above).
func TestContractIdempotencyWindowResendsInside(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	e.push.ScriptSend(e.ref(id), fakes.Step{Delay: fakeDelay})
	d := e.dispatcher(dcfg{timeout: clientTimeout,
		contracts: map[string]delivery.Contract{"push": {IdempotencyWindow: time.Hour}}})
	runOnce(t, d)
	is.Equal(runNext(t, d).Outcome, delivery.OutcomeAcceptedReplay) // resent with the same key, deduplicated
}

// The settle time is measured to the query's answer, not to its claim: a query claimed about 0.1 s
// after the uncertain attempt began, inside a settle time of 600 ms, that answers "not found" 800 ms
// later is past it, so the answer is trusted (the finish adds the call's time to the age the claim saw):
// the task is certain again and due for a send, not queried once more.
func TestContractQuerySettleCountsTheQueryAtFinish(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "sms")
	id := e.create("u1", "e1", time.Hour, 4)[0].TaskID
	ref := e.ref(id)
	e.sms.ScriptSend(ref, fakes.Step{Status: 409}) // outcome unknown, nothing accepted
	e.sms.ScriptQuery(ref, fakes.Step{Delay: 800 * time.Millisecond})
	d := e.dispatcher(dcfg{timeout: 2 * time.Second, backoff: 50 * time.Millisecond,
		contracts: map[string]delivery.Contract{"sms": {QuerySettle: 600 * time.Millisecond}}})
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeInFlight)
	second := runNext(t, d)
	is.Equal(second.Action, delivery.ActionQuery)
	is.Equal(second.Outcome, delivery.OutcomeQueryNotFound)
	is.True(second.Kind != service.ResultUnknown) // trusted: answered past the settle time
	task := e.task(id)
	is.Equal(task.State, delivery.StatePending) // due for a send
	is.True(!task.OutcomeUncertain)
}

// A lagging query may miss a message accepted moments ago: QUERY_NOT_FOUND inside query_settle keeps
// the task uncertain and asks again once the settle time has passed.
func TestContractQuerySettleKeepsUncertainty(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "sms")
	id := e.create("u1", "e1", time.Hour, 4)[0].TaskID
	ref := e.ref(id)
	// A 409 leaves the outcome unknown without an acceptance, so the fake's query answers found=0: the
	// answer a lagging query gives for a message it has not seen yet.
	e.sms.ScriptSend(ref, fakes.Step{Status: 409})
	settle := 1500 * time.Millisecond
	d := e.dispatcher(dcfg{timeout: clientTimeout, backoff: 50 * time.Millisecond,
		contracts: map[string]delivery.Contract{"sms": {QuerySettle: settle}}})
	first := runOnce(t, d)
	is.Equal(first.Outcome, delivery.OutcomeInFlight) // 409: outcome unknown
	second := runNext(t, d)
	is.Equal(second.Action, delivery.ActionQuery)           // queried
	is.Equal(second.Outcome, delivery.OutcomeQueryNotFound) // nothing found yet...
	is.Equal(second.Kind, service.ResultUnknown)            // ...which proves nothing inside the settle time
	task := e.task(id)
	is.True(task.OutcomeUncertain) // still uncertain
	is.True(task.NextAttemptAt != nil)
	var waits float64
	is.NoErr(e.pool.QueryRow(e.ctx, `SELECT extract(epoch FROM t.next_attempt_at - t.uncertain_since)::float8
		FROM delivery_task t WHERE id = $1`, id).Scan(&waits))
	is.True(waits >= settle.Seconds()-0.05) // the next query waits for the settle time, not just the backoff
	third := runNext(t, d)
	is.Equal(third.Action, delivery.ActionQuery)           // asked again
	is.Equal(third.Outcome, delivery.OutcomeQueryNotFound) // still nothing, now past the settle time
	is.Equal(third.Kind, service.ResultPending)            // now it is proof: certainly not accepted
	is.True(!e.task(id).OutcomeUncertain)
	is.Equal(runNext(t, d).Kind, service.ResultSent) // and the send is retried
	is.Equal(e.sms.Outbound(ref), 1)                 // once
}

// A provider that may fail after accepting: its 5xx is outcome unknown, never a retry from scratch
// and never FAILED.
func TestContractServerErrorsUncertain(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "sms")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	e.sms.ScriptSend(e.ref(id), fakes.Step{Status: 503})
	d := e.dispatcher(dcfg{contracts: map[string]delivery.Contract{"sms": {ServerErrorsUncertain: true}}})
	is.Equal(runOnce(t, d).Kind, service.ResultUnknown) // uncertain
	res := runNext(t, d)
	is.Equal(res.Action, delivery.ActionQuery) // so the next attempt asks first
	is.Equal(res.Outcome, delivery.OutcomeQueryNotFound)
	is.Equal(runNext(t, d).Kind, service.ResultSent)
}

// Past max_in_flight_age the service stops guessing, whatever budget is left.
func TestContractMaxInFlightAgeParks(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 10)[0].TaskID
	ref := e.ref(id)
	e.push.ScriptSend(ref, fakes.Step{Status: 409}, fakes.Step{Status: 409}, fakes.Step{Status: 409}, fakes.Step{Status: 409})
	d := e.dispatcher(dcfg{backoff: 400 * time.Millisecond,
		contracts: map[string]delivery.Contract{"push": {MaxInFlightAge: time.Second}}})
	var last service.Result
	for last.Kind != service.ResultParked {
		last = runNext(t, d)
		is.True(len(e.outcomes(id)) <= 4) // parks within a few attempts, not after the budget of 10
	}
	is.True(e.task(id).NeedsReview) // parked
}

// A NONE channel with Topic replacement (Web Push) may resend after an uncertain attempt, as
// TOPIC_RESEND; without the opt-in it parks (TestNoneChannelTimeoutParksAtOnce).
func TestContractTopicResend(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "none")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	e.none.ScriptSend(e.ref(id), fakes.Step{Delay: fakeDelay})
	d := e.dispatcher(dcfg{timeout: clientTimeout,
		contracts: map[string]delivery.Contract{"none": {ResendWithTopic: true}}})
	is.Equal(runOnce(t, d).Kind, service.ResultUnknown) // not parked: a Topic resend is allowed
	res := runNext(t, d)
	is.Equal(res.Action, delivery.ActionTopicResend) // the attempt row says what it was
	is.Equal(res.Kind, service.ResultSent)
	history := e.attempts(id)
	is.Equal(history[1].Action, delivery.ActionTopicResend) // recorded as TOPIC_RESEND
	is.Equal(e.none.Outbound(e.ref(id)), 2)                 // the fake has no Topic: both copies went out
}
