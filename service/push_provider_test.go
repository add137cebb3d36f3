package service_test

// The push providers' adapters (service/fcm, service/apns) against their fakes and a real database:
// what the dispatcher makes of an accepted message, of an answer lost after acceptance (parked, or
// resent with the same collapse key when the channel opts in), and of a token gone for good; and that
// every request a fake received is an attempt row.

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/apns"
	"github.com/notifierhq/notifier/service/channelconfig"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/fcm"
)

// providerDispatcher is a dispatcher with one NONE route, name, served by client.
// configure, when given, adjusts the configuration last.
func (e *env) providerDispatcher(name string, client delivery.Channel, contract delivery.Contract, configure ...func(*service.DispatcherConfig)) *dispatcher {
	e.t.Helper()
	cfg := service.DispatcherConfig{
		Worker: "w-test", Lease: 10 * time.Second, CallTimeout: clientTimeout,
		Routes:  map[string]delivery.Route{name: {Mode: delivery.ModeNone, Contract: contract, Client: client}},
		Backoff: delivery.Backoff{Base: 50 * time.Millisecond, Max: 500 * time.Millisecond},
	}
	for _, f := range configure {
		f(&cfg)
	}
	d, err := service.NewDispatcher(e.ctx, e.workerPool, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return &dispatcher{Dispatcher: d}
}

func writeCA(t *testing.T, pem []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, pem, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func startFCM(t *testing.T) (*fakes.FCM, *fcm.Client) {
	t.Helper()
	f := fakes.StartFCM("demo-project")
	t.Cleanup(f.Close)
	sa, err := fcm.ParseServiceAccount(f.ServiceAccountJSON())
	if err != nil {
		t.Fatal(err)
	}
	c, err := fcm.New(fcm.Options{Account: sa, Endpoint: f.URL(), CAFile: writeCA(t, f.CertPEM())})
	if err != nil {
		t.Fatal(err)
	}
	return f, c
}

// configRoute loads a channels file with one [channels.NAME] table and returns its route: the client
// and the contract as a worker builds them (collapse keys, the kind's contract defaults).
func configRoute(t *testing.T, name, table string, files, environ map[string]string) delivery.Route {
	t.Helper()
	dir := t.TempDir()
	for f, content := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "channels.toml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf("[channels.%s]\n%s", name, table)), 0o600); err != nil {
		t.Fatal(err)
	}
	routes, err := channelconfig.Load(path, func(k string) string { return environ[k] })
	if err != nil {
		t.Fatal(err)
	}
	return routes[name]
}

// fcmRoute is the route of a channels-file table of kind fcm served by f; extra adds keys.
func fcmRoute(t *testing.T, f *fakes.FCM, extra string) delivery.Route {
	t.Helper()
	table := fmt.Sprintf("kind = \"fcm\"\nservice_account_env = \"SA\"\nendpoint = %q\ntoken_url = %q\nca_file = \"ca.pem\"\n%s",
		f.URL(), f.TokenURL(), extra)
	return configRoute(t, "fcm", table, map[string]string{"ca.pem": string(f.CertPEM())},
		map[string]string{"SA": string(f.ServiceAccountJSON())})
}

// apnsRoute is the route of a channels-file table of kind apns served by a; extra adds keys.
func apnsRoute(t *testing.T, a *fakes.APNs, extra string) delivery.Route {
	t.Helper()
	table := fmt.Sprintf("kind = \"apns\"\nauth_key_env = \"K\"\nkey_id = %q\nteam_id = %q\ntopic = %q\nendpoint = %q\nca_file = \"ca.pem\"\n%s",
		a.KeyID, a.Team, a.Topic, a.URL(), extra)
	return configRoute(t, "apns", table, map[string]string{"ca.pem": string(a.CertPEM())}, map[string]string{"K": string(a.KeyP8())})
}

// Six tasks to one offline device on a channel without resend_with_collapse: FCM stores all six
// (no collapse key, so not FCM's four collapse keys), and the device receives them once online.
func TestFCMProviderOfflineDeviceGetsEveryTask(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := fakes.StartFCM("demo-project")
	t.Cleanup(f.Close)
	r := fcmRoute(t, f, "")
	e.w.User("u1", "fcm")
	for i := range 6 {
		e.create("u1", fmt.Sprintf("e%d", i), time.Hour, 3)
	}
	d := e.providerDispatcher("fcm", r.Client, r.Contract)
	for range 6 {
		is.Equal(runOnce(t, d).Kind, service.ResultSent)
	}
	is.Equal(len(f.Stored("u1@fcm")), 6) // all six kept for the offline device
	f.Online("u1@fcm")
	is.Equal(len(f.Received("u1@fcm")), 6)
}

// FCM does not say that a 500 or 503 comes before acceptance: on a NONE channel the task is parked
// (UNKNOWN, needs_review) after one call, never resent.
func TestPushProviderServerErrorParks(t *testing.T) {
	for _, status := range []int{500, 503} {
		t.Run(fmt.Sprintf("fcm %d", status), func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			f := fakes.StartFCM("demo-project")
			t.Cleanup(f.Close)
			r := fcmRoute(t, f, "")
			e.w.User("u1", "fcm")
			id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
			f.ScriptSend(e.ref(id), fakes.Step{Status: status})
			d := e.providerDispatcher("fcm", r.Client, r.Contract)
			is.Equal(runOnce(t, d).Kind, service.ResultParked)
			task := e.task(id)
			is.True(task.NeedsReview && task.State == delivery.StateUnknown)
			is.Equal(runOnce(t, d).Kind, service.ResultNothing)
			is.Equal(f.Sends(task.Ref), 1) // one call, not resent
			is.Equal(e.outcomes(id), outcomes(delivery.OutcomeHTTP5xx))
		})
		t.Run(fmt.Sprintf("apns %d", status), func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			a := fakes.StartAPNs()
			t.Cleanup(a.Close)
			r := apnsRoute(t, a, "")
			e.apnsUser("u1")
			id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
			a.ScriptSend(e.ref(id), fakes.Step{Status: status})
			d := e.providerDispatcher("apns", r.Client, r.Contract)
			is.Equal(runOnce(t, d).Kind, service.ResultParked)
			task := e.task(id)
			is.True(task.NeedsReview && task.State == delivery.StateUnknown)
			is.Equal(runOnce(t, d).Kind, service.ResultNothing)
			is.Equal(a.Sends(task.Ref), 1)
		})
	}
}

// FCM documents its 429 as rejected (retried later); Apple does not, so an APNs 429 parks on NONE.
func TestPushProviderThrottled(t *testing.T) {
	t.Run("fcm", func(t *testing.T) {
		is := is.New(t)
		e := newEnv(t)
		f := fakes.StartFCM("demo-project")
		t.Cleanup(f.Close)
		r := fcmRoute(t, f, "")
		e.w.User("u1", "fcm")
		id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
		f.ScriptSend(e.ref(id), fakes.Step{Status: 429})
		d := e.providerDispatcher("fcm", r.Client, r.Contract)
		is.Equal(runOnce(t, d).Outcome, delivery.OutcomeThrottled)
		is.Equal(runNext(t, d).Kind, service.ResultSent) // retried
		is.Equal(f.Sends(e.ref(id)), 2)
	})
	t.Run("apns", func(t *testing.T) {
		is := is.New(t)
		e := newEnv(t)
		a := fakes.StartAPNs()
		t.Cleanup(a.Close)
		r := apnsRoute(t, a, "")
		e.apnsUser("u1")
		id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
		a.ScriptSend(e.ref(id), fakes.Step{Status: 429})
		d := e.providerDispatcher("apns", r.Client, r.Contract)
		is.Equal(runOnce(t, d).Kind, service.ResultParked)
		is.True(e.task(id).NeedsReview)
		is.Equal(a.Sends(e.ref(id)), 1)
	})
}

func TestFCMProviderAccepted(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f, c := startFCM(t)
	e.w.User("u1", "fcm")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	d := e.providerDispatcher("fcm", c, delivery.Contract{})
	is.Equal(runOnce(t, d).Kind, service.ResultSent)
	task := e.task(id)
	is.Equal(task.State, delivery.StateSent)
	is.True(task.ProviderMsgID != "") // FCM's message name
	is.Equal(f.Sends(task.Ref), len(e.attempts(id)))
	is.Equal(f.TokenRequests(), 1) // the token fetch is no attempt and no second send
}

// The answer is lost after FCM took the message: without resend_with_collapse the task is parked.
func TestFCMProviderLostAnswerParks(t *testing.T) {
	for name, step := range map[string]fakes.Step{"timeout": {Delay: fakeDelay}, "dropped": {Drop: true}} {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			f, c := startFCM(t)
			e.w.User("u1", "fcm")
			id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
			f.ScriptSend(e.ref(id), step)
			d := e.providerDispatcher("fcm", c, delivery.Contract{})
			is.Equal(runOnce(t, d).Kind, service.ResultParked)
			task := e.task(id)
			is.True(task.NeedsReview && task.State == delivery.StateUnknown)
			is.Equal(runOnce(t, d).Kind, service.ResultNothing)
			is.Equal(f.Sends(task.Ref), 1) // one request, one attempt row
			is.Equal(len(e.attempts(id)), 1)
			is.Equal(f.Outbound(task.Ref), 1) // the device gets it: parking is right to not resend blindly
		})
	}
}

// With resend_with_collapse the task is resent as TOPIC_RESEND under the same collapse key, which
// replaces the undelivered first copy: the device gets one.
func TestFCMProviderCollapseResend(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f := fakes.StartFCM("demo-project")
	t.Cleanup(f.Close)
	r := fcmRoute(t, f, "resend_with_collapse = true\n")
	e.w.User("u1", "fcm")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	ref := e.ref(id)
	f.ScriptSend(ref, fakes.Step{Delay: fakeDelay})
	d := e.providerDispatcher("fcm", r.Client, r.Contract)
	is.Equal(runOnce(t, d).Kind, service.ResultUnknown)
	res := runNext(t, d)
	is.Equal(res.Action, delivery.ActionTopicResend)
	is.Equal(res.Kind, service.ResultSent)
	is.Equal(f.Outbound(ref), 1) // collapsed
	is.Equal(f.Sends(ref), 2)
	is.Equal(len(e.attempts(id)), 2)
}

// UNREGISTERED is a certain refusal: FAILED at once, budget left or not; with
// DisableUnregistered (work --disable-on-unregistered) the preference goes off too.
func TestFCMProviderUnregistered(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	f, c := startFCM(t)
	e.w.User("u1", "fcm")
	f.Unregister("u1@fcm")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	d := e.providerDispatcher("fcm", c, delivery.Contract{}, func(cfg *service.DispatcherConfig) { cfg.DisableUnregistered = true })
	is.True(runOnce(t, d).PrefDisabled)
	task := e.task(id)
	is.Equal(task.State, delivery.StateFailed)
	is.Equal(e.outcomes(id), outcomes(delivery.OutcomeRejected))
	is.Equal(f.Sends(task.Ref), 1)
	is.Equal(e.scalar("SELECT count(*) FROM channel_pref WHERE user_id = 'u1' AND channel = 'fcm' AND enabled"), int64(0))
}

func startAPNs(t *testing.T) (*fakes.APNs, *apns.Client) {
	t.Helper()
	a := fakes.StartAPNs()
	t.Cleanup(a.Close)
	key, err := apns.ParseKey(a.KeyP8())
	if err != nil {
		t.Fatal(err)
	}
	c, err := apns.New(apns.Options{Key: key, KeyID: a.KeyID, TeamID: a.Team, Topic: a.Topic, Endpoint: a.URL(),
		CAFile: writeCA(t, a.CertPEM())})
	if err != nil {
		t.Fatal(err)
	}
	return a, c
}

// apnsDevice is a device token for user (APNs addresses are hex).
const apnsDevice = "6c1f4e5a9b0d2c3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f80912"

func (e *env) apnsUser(user string) {
	e.t.Helper()
	if _, err := e.n.SetPreference(e.ctx, user, "apns", apnsDevice, true); err != nil {
		e.t.Fatal(err)
	}
}

func TestAPNsProviderAccepted(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	a, c := startAPNs(t)
	e.apnsUser("u1")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	d := e.providerDispatcher("apns", c, delivery.Contract{})
	is.Equal(runOnce(t, d).Kind, service.ResultSent)
	task := e.task(id)
	is.Equal(task.State, delivery.StateSent)
	is.Equal(task.ProviderMsgID, task.Ref) // apns-id is the task's ref
	is.Equal(a.Sends(task.Ref), len(e.attempts(id)))
}

func TestAPNsProviderLostAnswerParks(t *testing.T) {
	for name, step := range map[string]fakes.Step{"timeout": {Delay: fakeDelay}, "dropped": {Drop: true}} {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			a, c := startAPNs(t)
			e.apnsUser("u1")
			id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
			a.ScriptSend(e.ref(id), step)
			d := e.providerDispatcher("apns", c, delivery.Contract{})
			is.Equal(runOnce(t, d).Kind, service.ResultParked)
			task := e.task(id)
			is.True(task.NeedsReview && task.State == delivery.StateUnknown)
			is.Equal(runOnce(t, d).Kind, service.ResultNothing)
			is.Equal(a.Sends(task.Ref), 1)
			is.Equal(len(e.attempts(id)), 1)
		})
	}
}

func TestAPNsProviderCollapseResend(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	a := fakes.StartAPNs()
	t.Cleanup(a.Close)
	r := apnsRoute(t, a, "resend_with_collapse = true\n")
	e.apnsUser("u1")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	ref := e.ref(id)
	a.ScriptSend(ref, fakes.Step{Delay: fakeDelay})
	d := e.providerDispatcher("apns", r.Client, r.Contract)
	is.Equal(runOnce(t, d).Kind, service.ResultUnknown)
	res := runNext(t, d)
	is.Equal(res.Action, delivery.ActionTopicResend)
	is.Equal(res.Kind, service.ResultSent)
	is.Equal(a.Outbound(ref), 1) // the resend replaced the undelivered copy
	is.Equal(a.Sends(ref), 2)
	is.Equal(len(e.attempts(id)), 2)
}

// With a contract that reads 429 as a refusal (not APNs's: see TestPushProviderThrottled) it is
// retried; 410 Unregistered fails the task at once and, with DisableUnregistered, switches the
// preference off.
func TestAPNsProviderAnswers(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	a, c := startAPNs(t)
	e.apnsUser("u1")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	ref := e.ref(id)
	a.ScriptSend(ref, fakes.Step{Status: 429})
	d := e.providerDispatcher("apns", c, delivery.Contract{}, func(cfg *service.DispatcherConfig) { cfg.DisableUnregistered = true })
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeThrottled)
	a.Unregister(apnsDevice)
	is.True(runNext(t, d).PrefDisabled) // --disable-on-unregistered: the preference goes off
	is.Equal(e.task(id).State, delivery.StateFailed)
	is.Equal(e.outcomes(id), outcomes(delivery.OutcomeThrottled, delivery.OutcomeRejected))
	is.Equal(a.Sends(ref), 2)
}
