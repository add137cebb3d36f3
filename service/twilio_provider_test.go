package service_test

// The Twilio adapter (service/twilio) under the real protocol: routes built from a channels file of
// kind twilio, the Twilio fake, a real database, and Twilio's signed status callback through notifier
// receipts settling what a lost answer parked.

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/receipts"
)

const (
	twilioTestAccount = "AC00112233445566778899aabbccddeeff"
	twilioTestToken   = "tw-service-test-6a5b4c"
	twilioTestNumber  = "+15005550006"
	twilioCallback    = "https://notifier.example.com/receipts/twilio"
)

// twilioDispatcher serves channel "sms" as a channels file of kind twilio declares it.
func (e *env) twilioDispatcher(f *fakes.Twilio) *dispatcher {
	e.t.Helper()
	file := "[channels.sms]\nkind = \"twilio\"\naccount_sid = \"" + twilioTestAccount + "\"\nauth_token_env = \"T\"\n" +
		"from = \"+15017122661\"\nstatus_callback_url = \"" + twilioCallback + "\"\nbase_url = \"" + f.URL() + "\"\n"
	return e.channelsFileDispatcher("w-twilio", file, func(string) string { return twilioTestToken })
}

func startTwilio(t *testing.T) *fakes.Twilio {
	f := fakes.StartTwilio(twilioTestAccount, twilioTestToken)
	t.Cleanup(f.Close)
	return f
}

// twilioTask creates one SMS task for a user whose number is twilioTestNumber.
func (e *env) twilioTask(maxAttempts int) (int64, string) {
	e.t.Helper()
	if _, err := e.n.SetPreference(e.ctx, "u1", "sms", twilioTestNumber, true); err != nil {
		e.t.Fatal(err)
	}
	id := e.create("u1", "e1", time.Hour, maxAttempts)[0].TaskID
	return id, e.ref(id)
}

// signedTwilioCallback is the status callback the fake posts for a message it queued, signed as Twilio signs.
func signedTwilioCallback(t *testing.T, f *fakes.Twilio, sid, status string) *http.Request {
	t.Helper()
	req, err := f.Callback(sid, status, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestTwilioProviderAccepted(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startTwilio(t)
	id, ref := e.twilioTask(3)
	is.Equal(runOnce(t, e.twilioDispatcher(f)).Outcome, delivery.OutcomeAccepted)
	task := e.task(id)
	is.Equal(task.State, delivery.StateSent)                                // SENT
	is.Equal(task.ProviderMsgID, f.Messages(ref)[0].ID)                     // with Twilio's SM sid
	is.Equal(f.Messages(ref)[0].StatusCallback, twilioCallback+"?ref="+ref) // the callback names the task
	is.Equal(f.Requests(), len(e.attempts(id)))                             // requests received == attempt rows
}

// Accepted, then the answer is lost (a timeout, a dropped connection): mode none parks the task, never
// resends it, and Twilio's status callback (to the URL the message carried) settles it as SENT.
func TestTwilioProviderLostAnswerParksAndCallbackSettles(t *testing.T) {
	for name, step := range map[string]fakes.Step{"timeout": {Delay: 3 * time.Second}, "drop": {Drop: true}} {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			f := startTwilio(t)
			id, ref := e.twilioTask(3)
			f.ScriptSend(ref, step)
			res := runOnce(t, e.twilioDispatcher(f))
			is.True(res.Outcome == delivery.OutcomeTimeout || res.Outcome == delivery.OutcomeIOError) // no answer
			is.Equal(res.Kind, service.ResultParked)                                                  // parked, not resent
			is.Equal(e.task(id).State, delivery.StateUnknown)
			is.Equal(f.Outbound(ref), 1)                // one SMS
			is.Equal(f.Requests(), len(e.attempts(id))) // requests received == attempt rows

			msg := f.Messages(ref)[0]
			h := receipts.NewHandler(e.n, receipts.Config{TwilioAuthToken: twilioTestToken,
				PublicURL: &url.URL{Scheme: "https", Host: "notifier.example.com"}})
			w := httptest.NewRecorder()
			h.ServeHTTP(w, signedTwilioCallback(t, f, msg.ID, "sent"))
			is.Equal(w.Code, http.StatusOK) // verified and recorded
			task := e.task(id)
			is.Equal(task.State, delivery.StateSent) // settled by the receipt
			is.Equal(f.Outbound(ref), 1)             // still one SMS

			forged := signedTwilioCallback(t, f, msg.ID, "delivered")
			forged.Header.Set("X-Twilio-Signature", "AAAA")
			w = httptest.NewRecorder()
			h.ServeHTTP(w, forged)
			is.Equal(w.Code, http.StatusUnauthorized) // an unsigned callback is refused
		})
	}
}

// A 201 Created whose body is lost proves Twilio created the message: the task is SENT (not parked),
// without a message sid, and Twilio's callback still finds it by the ref in its StatusCallback.
func TestTwilioProviderCreatedWithUnreadableBodyIsSent(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startTwilio(t)
	id, ref := e.twilioTask(3)
	f.ScriptSend(ref, fakes.Step{Malformed: true})
	res := runOnce(t, e.twilioDispatcher(f))
	is.Equal(res.Outcome, delivery.OutcomeAccepted)
	task := e.task(id)
	is.Equal(task.State, delivery.StateSent) // not parked for a human
	is.Equal(task.ProviderMsgID, "")         // no sid was read
	is.Equal(f.Outbound(ref), 1)
	is.Equal(f.Requests(), len(e.attempts(id))) // requests received == attempt rows

	msg := f.Messages(ref)[0]
	h := receipts.NewHandler(e.n, receipts.Config{TwilioAuthToken: twilioTestToken,
		PublicURL: &url.URL{Scheme: "https", Host: "notifier.example.com"}})
	for _, status := range []string{"partially_delivered", "delivered"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, signedTwilioCallback(t, f, msg.ID, status))
		is.Equal(w.Code, http.StatusOK) // matched by ref, recorded
	}
	is.Equal(e.task(id).State, delivery.StateSent)
}

// A 500 may come after Twilio queued the message: the task is parked, not resent.
func TestTwilioProviderServerErrorParks(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startTwilio(t)
	id, ref := e.twilioTask(3)
	f.ScriptSend(ref, fakes.Step{Status: 500})
	res := runOnce(t, e.twilioDispatcher(f))
	is.Equal(res.Outcome, delivery.OutcomeHTTP5xx)
	is.Equal(res.Kind, service.ResultParked) // 5xx uncertain at Twilio
	is.Equal(f.Requests(), len(e.attempts(id)))
}

// A 429 (error 20429) is not uncertain: Twilio documents that a throttled request was not processed
// (https://www.twilio.com/docs/api/errors/20429), so the kind sets ThrottleRefuses and the task waits
// for Retry-After, then is sent, once, instead of being parked as its 5xx would be.
func TestTwilioProviderThrottledRetriesAfterRetryAfter(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startTwilio(t)
	id, ref := e.twilioTask(3)
	f.ScriptSend(ref, fakes.Step{Status: 429, RetryAfter: "1"})
	d := e.twilioDispatcher(f)
	res := runOnce(t, d)
	is.Equal(res.Outcome, delivery.OutcomeThrottled)
	is.Equal(res.Kind, service.ResultPending) // certainly not accepted: retried, not parked
	task := e.task(id)
	is.Equal(task.State, delivery.StatePending)
	is.True(!task.OutcomeUncertain)
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE id = $1 AND next_attempt_at >= updated_at + interval '1 second'`, id), int64(1)) // after Retry-After
	res = runNext(t, d)
	is.Equal(res.Outcome, delivery.OutcomeAccepted) // then sent
	is.Equal(e.task(id).State, delivery.StateSent)
	is.Equal(f.Outbound(ref), 1)                // once
	is.Equal(f.Requests(), len(e.attempts(id))) // requests received == attempt rows
}

// The recipient's STOP (21610) fails the task at once, and an invalid number (21211) too.
func TestTwilioProviderUnsubscribedAndInvalidNumber(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startTwilio(t)
	id, ref := e.twilioTask(3)
	f.SetUnsubscribed(twilioTestNumber)
	d := e.twilioDispatcher(f)
	res := runOnce(t, d)
	is.Equal(res.Outcome, delivery.OutcomeRejected)
	is.Equal(e.task(id).State, delivery.StateFailed) // not retried
	is.Equal(f.Outbound(ref), 0)
	is.Equal(f.Requests(), len(e.attempts(id))) // requests received == attempt rows
	if _, err := e.n.SetPreference(e.ctx, "u2", "sms", "555-0100", true); err != nil {
		t.Fatal(err)
	}
	id2 := e.create("u2", "e2", time.Hour, 3)[0].TaskID
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeRejected)
	is.Equal(e.task(id2).State, delivery.StateFailed)
	is.True(strings.Contains(e.task(id2).LastError, "21211")) // Twilio's code
}
