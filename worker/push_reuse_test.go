package worker_test

// The push providers' adapters (FCM, APNs) on a long-lived worker's kept-alive HTTP/2 connection: the
// provider accepts a notification and resets the stream without an answer. Requests on the wire ==
// attempt rows that call, and the task is parked or resent under its collapse key.

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/apns"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/fcm"
)

// pushProvider is one provider's fake as the test drives it.
type pushProvider struct {
	client   delivery.Channel
	address  string
	next     func(...fakes.Step)
	sends    func(ref string) int
	outbound func(ref string) int
	conns    func() int
}

func caFile(t *testing.T, pem []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, pem, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func fcmProvider(t *testing.T, collapse bool) pushProvider {
	f := fakes.StartFCM("demo-project")
	t.Cleanup(f.Close)
	sa, err := fcm.ParseServiceAccount(f.ServiceAccountJSON())
	if err != nil {
		t.Fatal(err)
	}
	c, err := fcm.New(fcm.Options{Account: sa, Endpoint: f.URL(), CAFile: caFile(t, f.CertPEM()), Collapse: collapse})
	if err != nil {
		t.Fatal(err)
	}
	return pushProvider{client: c, address: "registration-token-1", next: f.ScriptNext, sends: f.Sends, outbound: f.Outbound, conns: f.Conns}
}

func apnsProvider(t *testing.T, collapse bool) pushProvider {
	a := fakes.StartAPNs()
	t.Cleanup(a.Close)
	key, err := apns.ParseKey(a.KeyP8())
	if err != nil {
		t.Fatal(err)
	}
	c, err := apns.New(apns.Options{Key: key, KeyID: a.KeyID, TeamID: a.Team, Topic: a.Topic, Endpoint: a.URL(), CAFile: caFile(t, a.CertPEM()), Collapse: collapse})
	if err != nil {
		t.Fatal(err)
	}
	return pushProvider{client: c, address: "6c1f4e5a9b0d2c3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f80912",
		next: a.ScriptNext, sends: a.Sends, outbound: a.Outbound, conns: a.Conns}
}

func TestWorkerPushProvidersDropOnReusedConnection(t *testing.T) {
	for name, start := range map[string]func(*testing.T, bool) pushProvider{"fcm": fcmProvider, "apns": apnsProvider} {
		for _, tc := range []struct {
			name     string
			contract delivery.Contract
			attempts []attempt
			state    string
			outbound int
		}{
			{"parked", delivery.Contract{}, []attempt{{"SEND", "IO_ERROR"}}, "UNKNOWN", 1},
			{"collapse resend", delivery.Contract{ResendWithTopic: true}, []attempt{{"SEND", "IO_ERROR"}, {"TOPIC_RESEND", "ACCEPTED"}}, "SENT", 1},
		} {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				is := is.New(t)
				pool := pgtest.NewDB(t)
				n := service.NewNotifier(pool)
				p := start(t, tc.contract.ResendWithTopic) // resend_with_collapse: collapse keys on every send
				_, err := n.SetPreference(context.Background(), "u1", name, p.address, true)
				is.NoErr(err)
				startWorker(t, pool, name, delivery.Route{Mode: delivery.ModeNone, Contract: tc.contract, Client: p.client})

				first := createTask(t, n, name, "ev-1")
				is.Equal(settle(t, pool, first).State, "SENT") // delivered; the connection stays open
				conns := p.conns()                             // FCM: one for the sends, one for the token request
				p.next(fakes.Step{Drop: true})
				second := createTask(t, n, name, "ev-2")
				got := settle(t, pool, second)
				ref := refOf(t, pool, second)
				t.Logf("%s: %+v; %d requests, %d connections", name, got, p.sends(ref), p.conns())

				is.Equal(p.sends(ref), got.Calls)      // one request per attempt row
				is.Equal(got.Attempts, tc.attempts)    // what each attempt observed
				is.Equal(got.State, tc.state)          // parked, or resent under the collapse key
				is.Equal(p.outbound(ref), tc.outbound) // the resend replaced the undelivered copy
				is.Equal(p.conns(), conns)             // the drop reset a stream on the kept-alive HTTP/2 connection
			})
		}
	}
}
