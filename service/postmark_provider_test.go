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

func startPostmark(t *testing.T) *fakes.Postmark {
	f := fakes.StartPostmark(postmarkTestToken)
	t.Cleanup(f.Close)
	return f
}

func TestPostmarkProviderAccepted(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := startPostmark(t)
	e.user("u1", "email")
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
			e.user("u1", "email")
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
	e.user("u1", "email")
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
	e.user("u1", "email") // address u1@email
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
