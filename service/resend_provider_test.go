package service_test

// The Resend adapter (service/resend) under the real protocol: routes built from a channels file of
// kind resend, the Resend fake, a real database.

import (
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/resend"
)

const resendTestKey = "re_service_test_5d4c3b2a"

// resendDispatcher serves channel "email" as a channels file of kind resend declares it, against f.
func (e *env) resendDispatcher(f *fakes.Resend, key string) *dispatcher {
	e.t.Helper()
	file := "[channels.email]\nkind = \"resend\"\napi_key_env = \"RESEND_API_KEY\"\nfrom = \"noreply@example.com\"\nbase_url = \"" + f.URL() + "\"\n"
	return e.channelsFileDispatcher("w-resend", file, func(string) string { return key })
}

func startResend(t *testing.T) *fakes.Resend {
	f := fakes.StartResend(resendTestKey)
	t.Cleanup(f.Close)
	return f
}

func TestResendProviderAccepted(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startResend(t)
	e.w.User("u1", "email")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	ref := e.ref(id)
	res := runOnce(t, e.resendDispatcher(f, resendTestKey))
	is.Equal(res.Outcome, delivery.OutcomeAccepted) // accepted
	task := e.task(id)
	is.Equal(task.State, delivery.StateSent)                       // SENT
	is.Equal(task.ProviderMsgID, f.Messages(ref)[0].ID)            // with Resend's email id
	is.Equal(f.Requests(), len(e.attempts(id)))                    // requests received == attempt rows
	is.Equal(f.Messages(ref)[0].Key, delivery.IdempotencyKey(ref)) // under the task's key
}

// Accepted, then the answer is lost: a timeout, then a dropped connection. Each time the task stays
// uncertain and is resent with the same key; Resend sends one email.
func TestResendProviderLostAnswersResendWithTheKey(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startResend(t)
	e.w.User("u1", "email")
	id := e.create("u1", "e1", time.Hour, 5)[0].TaskID
	ref := e.ref(id)
	f.ScriptSend(ref, fakes.Step{Delay: 3 * time.Second}, fakes.Step{Drop: true})
	d := e.resendDispatcher(f, resendTestKey)
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeTimeout) // accepted, answered too late
	is.True(e.task(id).OutcomeUncertain)
	testworld.Eventually(t, 10*time.Second, "Resend done with the first request", func() bool { return !f.Busy() }) // Resend finished the first request (else: 409 in progress)
	second := runNext(t, d)
	is.Equal(second.Action, delivery.ActionSend)      // resent, not parked
	is.Equal(second.Outcome, delivery.OutcomeIOError) // the replay's connection dropped
	third := runNext(t, d)
	is.Equal(third.Outcome, delivery.OutcomeAccepted) // the original answer
	is.Equal(e.task(id).State, delivery.StateSent)
	is.Equal(f.Outbound(ref), 1)                // one email reached the user
	is.Equal(f.Requests(), len(e.attempts(id))) // requests received == attempt rows
	is.Equal(e.outcomes(id), outcomes(delivery.OutcomeTimeout, delivery.OutcomeIOError, delivery.OutcomeAccepted))
}

// Resend does not promise a 5xx comes before acceptance: with the budget used up on 500s the task is
// parked for a human, never FAILED.
func TestResendProviderServerErrorsPark(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startResend(t)
	e.w.User("u1", "email")
	id := e.create("u1", "e1", time.Hour, 2)[0].TaskID
	ref := e.ref(id)
	f.ScriptSend(ref, fakes.Step{Status: 500}, fakes.Step{Status: 500})
	d := e.resendDispatcher(f, resendTestKey)
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeHTTP5xx)
	is.Equal(runNext(t, d).Outcome, delivery.OutcomeHTTP5xx)
	task := e.task(id)
	is.Equal(task.State, delivery.StateUnknown) // not FAILED
	is.True(task.NeedsReview)                   // parked
	is.Equal(f.Requests(), len(e.attempts(id)))
}

// testClock is a provider fake's clock that a test moves by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock { return &testClock{now: time.Now()} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// ageUncertainty moves a task's uncertainty age back by age, as if its first uncertain attempt had been
// claimed that long ago: a rewrite of history no protocol move makes, so outside the state machine.
func (e *env) ageUncertainty(id int64, age time.Duration) {
	e.t.Helper()
	e.withoutStateMachine(func() {
		if _, err := e.pool.Exec(e.ctx, `UPDATE delivery_task SET uncertain_since = uncertain_since - make_interval(secs => $2)
			WHERE id = $1 AND outcome_uncertain`, id, age.Seconds()); err != nil {
			e.t.Fatal(err)
		}
	})
}

// resendUncertainAged times out one Resend attempt after the fake accepted it (its key first used at
// the fake's clock's now), then ages the task's uncertainty by age and moves the fake's clock to the
// moment a resend claimed now would reach Resend at the latest: age later, plus the call's reach and
// the clocks' skew. It returns the task and its ref.
func resendUncertainAged(t *testing.T, e *env, f *fakes.Resend, d *dispatcher, age time.Duration) (int64, string) {
	is := is.New(t)
	clock := newTestClock()
	f.SetClock(clock.Now)
	first := clock.Now()
	e.w.User("u1", "email")
	id := e.create("u1", "e1", 48*time.Hour, 5)[0].TaskID
	ref := e.ref(id)
	f.ScriptSend(ref, fakes.Step{Delay: time.Second}) // accepted, answered after the 300 ms client timeout
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeTimeout)
	testworld.Eventually(t, 10*time.Second, "Resend done with its requests", func() bool { return !f.Busy() })
	e.ageUncertainty(id, age)
	clock.Set(first.Add(age + resend.CallReachAllowance + resend.ClockSkewAllowance))
	return id, ref
}

// Resend keeps a key 24 hours from its first request. A resend claimed at the window's last moment
// reaches Resend before that, even at the end of its reach: the original answer, one email.
func TestResendProviderResendAtTheWindowsEndIsDeduplicated(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startResend(t)
	d := e.resendDispatcher(f, resendTestKey)
	id, ref := resendUncertainAged(t, e, f, d, resend.IdempotencyWindow-time.Second)
	res := runNext(t, d)
	is.Equal(res.Action, delivery.ActionSend)       // resent with the key
	is.Equal(res.Outcome, delivery.OutcomeAccepted) // Resend's original answer
	is.Equal(e.task(id).State, delivery.StateSent)  //
	is.Equal(f.Outbound(ref), 1)                    // one email
	is.Equal(f.Requests(), len(e.attempts(id)))     // requests received == attempt rows
}

// A task uncertain for a minute less than 24 hours: a resend claimed now could reach Resend after the
// key expired, and Resend would send a second email. It is parked instead.
func TestResendProviderNoResendThatCouldOutliveTheKey(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startResend(t)
	d := e.resendDispatcher(f, resendTestKey)
	id, ref := resendUncertainAged(t, e, f, d, resend.KeyLifetime-time.Minute)
	res := runNext(t, d)
	is.Equal(f.Outbound(ref), 1)             // no second email
	is.Equal(res.Kind, service.ResultParked) // parked, not resent
	task := e.task(id)
	is.Equal(task.State, delivery.StateUnknown)
	is.True(task.NeedsReview)
	is.Equal(f.Sends(ref), 1)
}
