package worker_test

// A long-lived worker on a kept-alive connection, for every channel mode and every HTTP adapter: the
// channel accepts a request and drops the connection without an answer. Issue 15: net/http's
// Transport used to send such a request again by itself (Idempotency-Key made a POST "replayable"),
// so the channel got two requests for one attempt row (R3) and a NONE channel two messages (R4).
// Here: requests on the wire == attempt rows that call, and the task ends as its mode says.

import (
	"context"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
	"github.com/notifierhq/notifier/service/httpkit"
	"github.com/notifierhq/notifier/service/webhook"
	"github.com/notifierhq/notifier/service/webpush"
	"github.com/notifierhq/notifier/worker"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// startWorker runs worker.Run with one call in flight at a time (so consecutive calls share a kept-alive
// connection) until the test ends.
func startWorker(t *testing.T, pool *pgxpool.Pool, channel string, route delivery.Route) {
	t.Helper()
	d, err := service.NewDispatcher(t.Context(), pool, service.DispatcherConfig{
		Worker: "w-reuse", Routes: map[string]delivery.Route{channel: route},
		Lease: 20 * time.Second, CallTimeout: 3 * time.Second,
		Backoff: delivery.Backoff{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		worker.Run(ctx, d, worker.Config{MaxInFlight: 1, Batch: 1, Poll: 20 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	t.Cleanup(func() { cancel(); <-done })
}

type attempt struct{ Action, Outcome string }

type taskState struct {
	State    string
	Parked   bool
	Attempts []attempt
	Calls    int // attempt rows whose action calls the channel
}

func readTask(t *testing.T, pool *pgxpool.Pool, id int64) taskState {
	t.Helper()
	ctx := context.Background()
	var s taskState
	if err := pool.QueryRow(ctx, `SELECT state, needs_review FROM delivery_task WHERE id = $1`, id).Scan(&s.State, &s.Parked); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT action, coalesce(outcome, '') FROM delivery_attempt WHERE task_id = $1 ORDER BY attempt_no`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var a attempt
		if err := rows.Scan(&a.Action, &a.Outcome); err != nil {
			t.Fatal(err)
		}
		s.Attempts = append(s.Attempts, a)
		if a.Action == "SEND" || a.Action == "QUERY" || a.Action == "TOPIC_RESEND" {
			s.Calls++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return s
}

// settle waits until the task is SENT, FAILED, SUPPRESSED or parked, with every attempt finished.
func settle(t *testing.T, pool *pgxpool.Pool, id int64) taskState {
	t.Helper()
	var s taskState
	testworld.Eventually(t, 30*time.Second, fmt.Sprintf("task %d settled", id), func() bool {
		s = readTask(t, pool, id)
		open := false
		for _, a := range s.Attempts {
			open = open || a.Outcome == ""
		}
		return !open && (s.State == "SENT" || s.State == "FAILED" || s.State == "SUPPRESSED" || s.State == "UNKNOWN" && s.Parked)
	})
	return s
}

// createTask submits one event for user u1 on channel and returns its task.
func createTask(t *testing.T, n *service.Notifier, channel, event string) int64 {
	t.Helper()
	_, _, tasks, err := n.Create(context.Background(), service.CreateRequest{UserID: "u1", EventKey: event, Body: "order shipped", TTL: time.Hour, MaxAttempts: 3})
	if err != nil || len(tasks) != 1 || tasks[0].Channel != channel {
		t.Fatalf("create %s: %v %+v", event, err, tasks)
	}
	return tasks[0].TaskID
}

// TestWorkerDropOnReusedConnection: the fakes, through the generic HTTP adapter, in every mode.
func TestWorkerDropOnReusedConnection(t *testing.T) {
	cases := []struct {
		kind     fakes.Kind
		mode     delivery.Mode
		attempts []attempt
		state    string
		parked   bool
	}{
		// NONE: the dropped send may have been accepted and nothing can tell: parked, never resent.
		{fakes.None, delivery.ModeNone, []attempt{{"SEND", "IO_ERROR"}}, "UNKNOWN", true},
		// QUERYABLE: asked first, found, SENT.
		{fakes.SMS, delivery.ModeQueryable, []attempt{{"SEND", "IO_ERROR"}, {"QUERY", "QUERY_FOUND"}}, "SENT", false},
		// IDEMPOTENT: resent with the same key, recognised, SENT.
		{fakes.Push, delivery.ModeIdempotent, []attempt{{"SEND", "IO_ERROR"}, {"SEND", "ACCEPTED_REPLAY"}}, "SENT", false},
	}
	for _, tc := range cases {
		t.Run(string(tc.kind), func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			pool := pgtest.NewDB(t)
			n := service.NewNotifier(pool)
			fake := fakes.Start(tc.kind)
			t.Cleanup(fake.Close)
			client, err := httpchannel.New(fake.URL(), httpchannel.Options{})
			is.NoErr(err) // the adapter
			_, err = n.SetPreference(context.Background(), "u1", string(tc.kind), "+15550100", true)
			is.NoErr(err) // the user's address on the channel
			startWorker(t, pool, string(tc.kind), delivery.Route{Mode: tc.mode, Client: client})

			first := createTask(t, n, string(tc.kind), "ev-1")
			is.Equal(settle(t, pool, first).State, "SENT") // delivered normally: the connection stays open
			is.Equal(fake.Conns(), 1)                      // one connection so far

			fake.ScriptAll(fakes.Step{Drop: true}) // the next send is accepted, then its connection dropped
			second := createTask(t, n, string(tc.kind), "ev-2")
			got := settle(t, pool, second)
			ref := refOf(t, pool, second)
			t.Logf("%s: %+v; fake: %d sends, %d queries, %d outbound, %d connections",
				tc.kind, got, fake.Sends(ref), fake.Queries(ref), fake.Outbound(ref), fake.Conns())

			is.Equal(fake.Sends(ref)+fake.Queries(ref), got.Calls) // R3: one request on the wire per attempt row
			is.Equal(got.Attempts, tc.attempts)                    // what each attempt observed
			is.Equal(got.State, tc.state)                          // the mode's way out
			is.Equal(got.Parked, tc.parked)                        // parked only where nothing can tell
			is.Equal(fake.Outbound(ref), 1)                        // R4: one message reached the user
			is.Equal(fake.Sends(refOf(t, pool, first)), 1)         // the first task was sent once
		})
	}
}

// hookReceiver is a Standard Webhooks receiver reduced to what this test needs: it dedupes on
// webhook-id, records a delivery before answering, and drops the connection when told to.
type hookReceiver struct {
	srv        *httptest.Server
	mu         sync.Mutex
	requests   map[string]int // by webhook-id
	deliveries map[string]int
	conns      fakes.ConnCounter
	dropNext   bool
}

func newHookReceiver(t *testing.T) *hookReceiver {
	r := &hookReceiver{requests: map[string]int{}, deliveries: map[string]int{}}
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(r.serve))
	r.srv.Config.ConnState = r.conns.ConnState
	r.srv.Start()
	t.Cleanup(r.srv.Close)
	return r
}

func (r *hookReceiver) serve(w http.ResponseWriter, req *http.Request) {
	_, _ = io.Copy(io.Discard, req.Body)
	id := req.Header.Get("webhook-id")
	r.mu.Lock()
	r.requests[id]++
	if r.deliveries[id] == 0 {
		r.deliveries[id]++
	}
	drop := r.dropNext
	r.dropNext = false
	r.mu.Unlock()
	if drop {
		fakes.Drop(w, req)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (r *hookReceiver) counts(id string) (requests, deliveries, conns int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests[id], r.deliveries[id], r.conns.Count()
}

// TestWorkerWebhookDropOnReusedConnection: the webhook adapter (IDEMPOTENT via webhook-id).
func TestWorkerWebhookDropOnReusedConnection(t *testing.T) {
	t.Parallel()
	is := is.New(t)
	pool := pgtest.NewDB(t)
	n := service.NewNotifier(pool)
	recv := newHookReceiver(t)
	client, err := webhook.New("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", webhook.Options{AllowedNetworks: httpkit.Loopback})
	is.NoErr(err) // the adapter
	_, err = n.SetPreference(context.Background(), "u1", "hooks", recv.srv.URL+"/hook", true)
	is.NoErr(err) // the subscriber's URL
	startWorker(t, pool, "hooks", delivery.Route{Mode: delivery.ModeIdempotent, Client: client})

	first := createTask(t, n, "hooks", "ev-1")
	is.Equal(settle(t, pool, first).State, "SENT") // delivered; the connection stays open
	recv.mu.Lock()
	recv.dropNext = true
	recv.mu.Unlock()
	second := createTask(t, n, "hooks", "ev-2")
	got := settle(t, pool, second)
	requests, deliveries, conns := recv.counts(delivery.IdempotencyKey(refOf(t, pool, second)))
	t.Logf("webhook: %+v; receiver: %d requests, %d deliveries, %d connections", got, requests, deliveries, conns)

	is.Equal(requests, got.Calls)                                                 // one request per attempt row
	is.Equal(got.Attempts, []attempt{{"SEND", "IO_ERROR"}, {"SEND", "ACCEPTED"}}) // resent with the same webhook-id
	is.Equal(got.State, "SENT")                                                   // and recognised by the receiver
	is.Equal(deliveries, 1)                                                       // one delivery
	is.Equal(conns, 2)                                                            // the drop came on the kept-alive connection
}

// pushReceiver is a Web Push service reduced to what this test needs: 201 with a Location, counts
// per endpoint, and a dropped connection when told to. (Payload decryption and VAPID checks are
// service/webpush's tests.)
type pushReceiver struct {
	srv      *httptest.Server
	caFile   string
	mu       sync.Mutex
	requests int
	conns    fakes.ConnCounter
	dropNext bool
}

func newPushReceiver(t *testing.T) *pushReceiver {
	p := &pushReceiver{}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		p.mu.Lock()
		p.requests++
		n, drop := p.requests, p.dropNext
		p.dropNext = false
		p.mu.Unlock()
		if drop {
			fakes.Drop(w, r)
			return
		}
		w.Header().Set("Location", fmt.Sprintf("%s/msg/%d", p.srv.URL, n))
		w.WriteHeader(http.StatusCreated)
	}))
	p.srv.Config.ConnState = p.conns.ConnState
	p.srv.StartTLS()
	t.Cleanup(p.srv.Close)
	p.caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// subscription is a browser's PushSubscription for the receiver's endpoint.
func (p *pushReceiver) subscription(t *testing.T) string {
	t.Helper()
	ua, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var sub webpush.Subscription
	sub.Endpoint = p.srv.URL + "/push/device-1"
	sub.Keys.P256dh = base64.RawURLEncoding.EncodeToString(ua.PublicKey().Bytes())
	sub.Keys.Auth = base64.RawURLEncoding.EncodeToString(make([]byte, 16))
	b, _ := json.Marshal(sub)
	return string(b)
}

func (p *pushReceiver) counts() (requests, conns int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests, p.conns.Count()
}

// TestWorkerWebPushDropOnReusedConnection: the Web Push adapter (NONE), parked, and with
// resend_with_topic a TOPIC_RESEND: one request per attempt row either way.
func TestWorkerWebPushDropOnReusedConnection(t *testing.T) {
	cases := []struct {
		name     string
		contract delivery.Contract
		attempts []attempt
		state    string
	}{
		{"parked", delivery.Contract{}, []attempt{{"SEND", "IO_ERROR"}}, "UNKNOWN"},
		{"topic resend", delivery.Contract{ResendWithTopic: true}, []attempt{{"SEND", "IO_ERROR"}, {"TOPIC_RESEND", "ACCEPTED"}}, "SENT"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			pool := pgtest.NewDB(t)
			n := service.NewNotifier(pool)
			recv := newPushReceiver(t)
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			is.NoErr(err) // the VAPID key
			client, err := webpush.New(webpush.Options{VAPIDKey: key, Subject: "mailto:ops@example.com", CAFile: recv.caFile, AllowedNetworks: httpkit.Loopback})
			is.NoErr(err) // the adapter
			_, err = n.SetPreference(context.Background(), "u1", "browser", recv.subscription(t), true)
			is.NoErr(err) // the browser's subscription
			startWorker(t, pool, "browser", delivery.Route{Mode: delivery.ModeNone, Contract: tc.contract, Client: client})

			first := createTask(t, n, "browser", "ev-1")
			is.Equal(settle(t, pool, first).State, "SENT") // delivered; the connection stays open
			before, _ := recv.counts()
			recv.mu.Lock()
			recv.dropNext = true
			recv.mu.Unlock()
			second := createTask(t, n, "browser", "ev-2")
			got := settle(t, pool, second)
			requests, conns := recv.counts()
			t.Logf("webpush: %+v; receiver: %d requests, %d connections", got, requests-before, conns)

			is.Equal(requests-before, got.Calls) // one request per attempt row
			is.Equal(got.Attempts, tc.attempts)  // what each attempt observed
			is.Equal(got.State, tc.state)        // parked, or resent with the Topic
			is.Equal(conns, len(tc.attempts))    // the drop came on the kept-alive connection
		})
	}
}

// refOf is a task's channel reference (random, stored with the task: schema/001), what the fakes and
// receivers file its requests under.
func refOf(t *testing.T, pool *pgxpool.Pool, taskID int64) string {
	t.Helper()
	task, err := service.NewNotifier(pool).Task(context.Background(), taskID)
	if err != nil {
		t.Fatal(err)
	}
	return task.Ref
}
