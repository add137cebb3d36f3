package service_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// TestWebhookEgressPolicy: webhook preferences pointing at this machine's own addresses reach
// nothing: each task is FAILED after exactly one attempt naming the refused network, and no request
// reaches a receiver listening there. With allowed_networks opting loopback in, the same channel
// delivers to every one of them but 0.0.0.0, which 127.0.0.0/8 does not cover.
func TestWebhookEgressPolicy(t *testing.T) {
	e := newEnv(t)
	var requests atomic.Int64
	receiver := func(addr string) string {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			requests.Add(1)
			w.WriteHeader(http.StatusNoContent)
		}))
		srv.Listener.Close()
		srv.Listener = ln
		srv.Start()
		t.Cleanup(srv.Close)
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		return port
	}
	p1, p2, p6 := receiver("127.0.0.1:0"), receiver("127.0.0.2:0"), receiver("[::1]:0")
	destinations := map[string]struct{ url, refused string }{
		"u-127":    {"http://127.0.0.1:" + p1 + "/hook", "destination 127.0.0.1 is in a refused network (loopback)"},
		"u-local":  {"http://localhost:" + p1 + "/hook", "destination 127.0.0.1 is in a refused network (loopback)"},
		"u-v6":     {"http://[::1]:" + p6 + "/hook", "destination ::1 is in a refused network (loopback)"},
		"u-any":    {"http://0.0.0.0:" + p1 + "/hook", "destination 0.0.0.0 is in a refused network (unspecified)"},
		"u-mapped": {"http://[::ffff:127.0.0.1]:" + p1 + "/hook", "destination 127.0.0.1 is in a refused network (loopback)"},
		"u-127-2":  {"http://127.0.0.2:" + p2 + "/hook", "destination 127.0.0.2 is in a refused network (loopback)"},
	}
	getenv := func(string) string { return "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" }
	const channel = `
[channels.hooks]
kind = "webhook"
secret_env = "HOOK_SECRET"
`
	run := func(file, event string) map[string]service.Task {
		t.Helper()
		tasks := map[string]int64{}
		for user, d := range destinations {
			_, err := e.n.SetPreference(e.ctx, user, "hooks", d.url, true)
			if err != nil {
				t.Fatal(err)
			}
			tasks[user] = e.create(user, event, time.Hour, 3)[0].TaskID
		}
		d := e.channelsFileDispatcher("w-egress", file, getenv)
		for range destinations {
			runOnce(t, d)
		}
		out := map[string]service.Task{}
		for user, id := range tasks {
			out[user] = e.task(id)
		}
		return out
	}

	got := run(channel, "refused")
	for user, task := range got {
		is := is.New(t)
		attempts := e.attempts(task.ID)
		t.Logf("%s: %s, %q", user, task.State, task.LastError)
		is.Equal(task.State, delivery.StateFailed) // written off at once: certainly not sent
		is.Equal(len(attempts), 1)                 // after exactly one attempt
		is.Equal(attempts[0].Outcome, delivery.OutcomeRejected)
		is.True(strings.Contains(attempts[0].Error, destinations[user].refused)) // naming the refusal
		is.True(strings.Contains(task.LastError, "allowed_networks opts a network in"))
	}
	is := is.New(t)
	is.Equal(requests.Load(), int64(0)) // nothing reached a receiver

	got = run(channel+`allowed_networks = ["127.0.0.0/8", "::1/128"]`+"\n", "allowed")
	for user, task := range got {
		if user == "u-any" {
			is.Equal(task.State, delivery.StateFailed) // 0.0.0.0 is not in 127.0.0.0/8
			continue
		}
		is.Equal(task.State, delivery.StateSent) // opted in: delivered
	}
	is.Equal(requests.Load(), int64(len(destinations)-1)) // one request per delivered task
}
