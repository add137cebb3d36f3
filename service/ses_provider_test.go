package service_test

// The Amazon SES adapter (service/ses) under the real protocol: routes built from a channels file of
// kind ses, the SES fake (SigV4 checked), a real database, and SES's events through a (fake) SNS topic
// and notifier receipts settling what a lost answer parked.

import (
	"bytes"
	"net/http"
	"net/http/httptest"
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
	sesTestRegion = "eu-west-1"
	sesTestKeyID  = "AKIAFAKESESSERVICE01"
	sesTestSecret = "ses-service-test-secret-7c6b5a"
	sesTestFrom   = "noreply@example.com"
	sesTestTopic  = "arn:aws:sns:eu-west-1:123456789012:notifier-ses-events"
)

// sesDispatcher serves channel "email" as a channels file of kind ses declares it.
func (e *env) sesDispatcher(f *fakes.SES) *dispatcher {
	e.t.Helper()
	file := "[channels.email]\nkind = \"ses\"\nregion = \"" + sesTestRegion + "\"\nfrom = \"" + sesTestFrom + "\"\n" +
		"configuration_set = \"notifier-events\"\naccess_key_id_env = \"K\"\nsecret_access_key_env = \"S\"\nendpoint = \"" + f.URL() + "\"\n"
	return e.channelsFileDispatcher("w-ses", file, func(name string) string {
		return map[string]string{"K": sesTestKeyID, "S": sesTestSecret}[name]
	})
}

func startSES(t *testing.T) *fakes.SES {
	f := fakes.StartSES(sesTestRegion, sesTestKeyID, sesTestSecret, sesTestFrom, "notifier-events")
	t.Cleanup(f.Close)
	return f
}

// sesTask creates one email task for a user with an email preference.
func (e *env) sesTask(user, key string, maxAttempts int) (int64, string) {
	e.t.Helper()
	e.w.User(user, "email")
	id := e.create(user, key, time.Hour, maxAttempts)[0].TaskID
	return id, e.ref(id)
}

func TestSESProviderAccepted(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startSES(t)
	id, ref := e.sesTask("u1", "e1", 3)
	is.Equal(runOnce(t, e.sesDispatcher(f)).Outcome, delivery.OutcomeAccepted)
	task := e.task(id)
	is.Equal(task.State, delivery.StateSent)               // SENT
	is.Equal(task.ProviderMsgID, f.Emails(ref)[0].ID)      // with SES's MessageId
	is.Equal(f.Emails(ref)[0].Tags[fakes.SESRefTag], ref)  // the message tag names the task
	is.Equal(f.Requests(), len(e.attempts(id)))            // requests received == attempt rows
	is.Equal(f.Emails(ref)[0].From, sesTestFrom)           // from the verified identity
	is.True(strings.HasPrefix(f.Emails(ref)[0].To, "u1@")) // to the preference's address
}

// Accepted, then the answer is lost (a timeout, a dropped connection): mode none parks the task, never
// resends it, and SES's Delivery event, published through SNS to notifier receipts, settles it as SENT.
func TestSESProviderLostAnswerParksAndEventSettles(t *testing.T) {
	for name, step := range map[string]fakes.Step{"timeout": {Delay: 3 * time.Second}, "drop": {Drop: true}} {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			f := startSES(t)
			id, ref := e.sesTask("u1", "e1", 3)
			f.ScriptSend(ref, step)
			res := runOnce(t, e.sesDispatcher(f))
			is.True(res.Outcome == delivery.OutcomeTimeout || res.Outcome == delivery.OutcomeIOError) // no answer
			is.Equal(res.Kind, service.ResultParked)                                                  // parked, not resent
			is.Equal(e.task(id).State, delivery.StateUnknown)
			is.Equal(f.Outbound(ref), 1)                // one email
			is.Equal(f.Requests(), len(e.attempts(id))) // requests received == attempt rows

			sns := fakes.StartSNS(sesTestRegion)
			t.Cleanup(sns.Close)
			h := receipts.NewHandler(e.n, receipts.Config{SES: receipts.SESConfig{TopicARNs: []string{sesTestTopic}, Fetch: sns.Fetch}})
			post := func(m fakes.SNSMessage) int {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/receipts/ses", bytes.NewReader(m.JSON())))
				return w.Code
			}
			event := fakes.SESEvent{EventType: "Delivery", MessageID: f.Emails(ref)[0].ID, Ref: f.Emails(ref)[0].Tags[fakes.SESRefTag]}.JSON()
			forged := sns.Notification(sesTestTopic, event, 2)
			forged["Message"] = strings.Replace(forged["Message"], "Delivery", "Send", 1)
			is.Equal(post(forged), http.StatusUnauthorized) // a message SNS did not sign is refused
			is.Equal(e.task(id).State, delivery.StateUnknown)
			is.Equal(post(sns.Notification(sesTestTopic, event, 2)), http.StatusOK) // verified and recorded
			is.Equal(e.task(id).State, delivery.StateSent)                          // settled by the event
			is.Equal(f.Outbound(ref), 1)                                            // still one email
		})
	}
}

// A 500 may come after SES accepted the email: the task is parked, not resent.
func TestSESProviderServerErrorParks(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startSES(t)
	id, ref := e.sesTask("u1", "e1", 3)
	f.ScriptSend(ref, fakes.Step{Status: 500})
	res := runOnce(t, e.sesDispatcher(f))
	is.Equal(res.Outcome, delivery.OutcomeHTTP5xx)
	is.Equal(res.Kind, service.ResultParked) // 5xx uncertain at SES
	is.Equal(f.Requests(), len(e.attempts(id)))
}

// SES's throttling errors are refusals it documents (the email is dropped; retry later): the task waits
// for Retry-After and is sent once, never parked as a 5xx parks it. 429 TooManyRequestsException and 400
// LimitExceededException alike.
func TestSESProviderThrottledRetries(t *testing.T) {
	for name, named := range map[string]string{"429": "", "limit exceeded": "LimitExceededException"} {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			f := startSES(t)
			id, ref := e.sesTask("u1", "e1", 3)
			status := http.StatusTooManyRequests
			if named != "" {
				status = http.StatusBadRequest
				f.NameError(status, named, "Limit exceeded.")
			}
			f.ScriptSend(ref, fakes.Step{Status: status, RetryAfter: "1"})
			d := e.sesDispatcher(f)
			res := runOnce(t, d)
			is.Equal(res.Outcome, delivery.OutcomeThrottled)
			is.Equal(res.Kind, service.ResultPending) // certainly not accepted: retried
			is.True(!e.task(id).OutcomeUncertain)
			is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE id = $1 AND next_attempt_at >= updated_at + interval '1 second'`, id), int64(1)) // after Retry-After
			is.Equal(runNext(t, d).Outcome, delivery.OutcomeAccepted)
			is.Equal(e.task(id).State, delivery.StateSent)
			is.Equal(f.Outbound(ref), 1)                // once
			is.Equal(f.Requests(), len(e.attempts(id))) // requests received == attempt rows
		})
	}
}

// SES's documented refusals fail the task at once (nothing was sent, nothing is retried): MessageRejected.
// (AccessDenied and the other account states are ACCOUNT_REFUSED, unit-tested in service/ses until the
// channel pause that consumes them lands.)
func TestSESProviderRejections(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startSES(t)
	d := e.sesDispatcher(f)
	for i, c := range []struct {
		status int
		detail string
	}{{http.StatusBadRequest, "MessageRejected"}} {
		id, ref := e.sesTask("u"+string(rune('1'+i)), "e1", 3)
		f.ScriptSend(ref, fakes.Step{Status: c.status})
		is.Equal(runOnce(t, d).Outcome, delivery.OutcomeRejected)
		task := e.task(id)
		is.Equal(task.State, delivery.StateFailed) // not retried
		is.True(strings.Contains(task.LastError, c.detail))
		is.True(!strings.Contains(task.LastError, sesTestSecret))
		is.Equal(f.Outbound(ref), 0)
		is.Equal(len(e.attempts(id)), 1)
	}
	is.Equal(f.Requests(), 1) // requests received == attempt rows
}

// A 200 whose body is lost: SES accepted the email, so the task is SENT (not parked), without a MessageId.
func TestSESProviderOKWithUnreadableBodyIsSent(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startSES(t)
	id, ref := e.sesTask("u1", "e1", 3)
	f.ScriptSend(ref, fakes.Step{Malformed: true})
	is.Equal(runOnce(t, e.sesDispatcher(f)).Outcome, delivery.OutcomeAccepted)
	task := e.task(id)
	is.Equal(task.State, delivery.StateSent) // not parked for a human
	is.Equal(task.ProviderMsgID, "")
	is.Equal(f.Outbound(ref), 1)
	is.Equal(f.Emails(ref)[0].ConfigurationSet, "notifier-events") // whose events carry the ref tag
	is.Equal(f.Requests(), len(e.attempts(id)))
}

// A drop on a kept-alive connection (SES took the email; the answer never came): one request on the
// wire for the attempt, on the same connection, and the task parked, not resent behind the protocol's back.
func TestSESProviderDropOnReusedConnection(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startSES(t)
	d := e.sesDispatcher(f)
	first, _ := e.sesTask("u1", "e1", 3)
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeAccepted) // the connection stays open
	second, ref := e.sesTask("u2", "e2", 3)
	f.ScriptSend(ref, fakes.Step{Drop: true})
	res := runOnce(t, d)
	is.Equal(res.Outcome, delivery.OutcomeIOError)
	is.Equal(res.Kind, service.ResultParked)
	is.Equal(f.Conns(), 1)                                                 // on the kept-alive connection
	is.Equal(f.Outbound(ref), 1)                                           // one email
	is.Equal(f.Requests(), len(e.attempts(first))+len(e.attempts(second))) // requests received == attempt rows
}
