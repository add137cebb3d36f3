package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
	"github.com/notifierhq/notifier/service/webhook"
)

// tolerance is the receiver's allowed clock difference, the Standard Webhooks default of 5 minutes.
const tolerance = 5 * time.Minute

// verify checks a webhook the way the Standard Webhooks specification tells receivers to: the three
// headers present, the timestamp within tolerance of now, and one of the space-separated "v1,"
// signatures equal (in constant time) to HMAC-SHA256(key, "<id>.<timestamp>.<body>").
func verify(key []byte, h http.Header, body []byte, now time.Time) error {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("missing webhook headers")
	}
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("bad webhook-timestamp")
	}
	if d := now.Sub(time.Unix(secs, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("timestamp outside tolerance (%s)", d)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "." + string(body)))
	want := mac.Sum(nil)
	for _, s := range strings.Fields(sigs) {
		version, b64, ok := strings.Cut(s, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no matching signature")
}

// receiver is a Standard Webhooks consumer: it verifies every request, deduplicates on webhook-id
// (recording a delivery before answering), and answers as scripted.
type receiver struct {
	key []byte
	srv *httptest.Server

	mu         sync.Mutex
	requests   int
	seen       map[string]bool
	deliveries []webhook.Payload
	status     int           // answered after recording; 0: 204
	delay      time.Duration // after recording, before answering
	rejectWith int           // answered before recording (e.g. 400, 503); 0: none
	drop       bool          // after recording: close the connection without an answer
	lastHeader http.Header
	conns      fakes.ConnCounter // TCP connections accepted
}

func newReceiver(t *testing.T, key []byte) *receiver {
	r := &receiver{key: key, seen: map[string]bool{}}
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(r.serve))
	r.srv.Config.ConnState = r.conns.ConnState
	r.srv.Start()
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	r.mu.Lock()
	r.requests++
	r.lastHeader = req.Header.Clone()
	if err := verify(r.key, req.Header, body, time.Now()); err != nil {
		r.mu.Unlock()
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	if r.rejectWith != 0 {
		code := r.rejectWith
		r.mu.Unlock()
		if code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "7")
		}
		http.Error(w, "refused", code)
		return
	}
	id := req.Header.Get("webhook-id")
	if !r.seen[id] {
		var p webhook.Payload
		if err := json.Unmarshal(body, &p); err != nil {
			r.mu.Unlock()
			http.Error(w, "bad json", http.StatusBadRequest)
			return
		}
		r.seen[id] = true
		r.deliveries = append(r.deliveries, p)
	}
	status, delay, drop := r.status, r.delay, r.drop
	r.mu.Unlock()
	if drop {
		fakes.Drop(w, req)
		return
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-req.Context().Done():
			panic(http.ErrAbortHandler) // the client gave up: no answer, not net/http's implicit 200
		}
	}
	if status == 0 {
		status = http.StatusNoContent
	}
	w.WriteHeader(status)
}

func (r *receiver) counts() (requests, deliveries int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests, len(r.deliveries)
}

func (r *receiver) set(f func(*receiver)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r)
}

func newSecret(t *testing.T) (string, []byte) {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return webhook.SecretPrefix + base64.StdEncoding.EncodeToString(key), key
}

func message(to string) delivery.Message {
	return delivery.Message{Ref: "task-7", IdempotencyKey: "ntf-task-7", To: to, Body: "Your order has shipped",
		ExpiresAt: time.Now().Add(time.Hour), Action: delivery.ActionSend}
}

func send(t *testing.T, c *webhook.Client, msg delivery.Message, timeout time.Duration) delivery.Observation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Send(ctx, msg)
}

func TestChannelWebhookAccept(t *testing.T) {
	is := is.New(t)
	secret, key := newSecret(t)
	r := newReceiver(t, key)
	c, err := webhook.New(secret, webhook.Options{AllowedNetworks: httpkit.Loopback})
	is.NoErr(err) // client

	obs := send(t, c, message(r.srv.URL+"/hooks/u1"), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccepted) // 2xx is an acceptance
	is.Equal(obs.ProviderMsgID, "ntf-task-7")       // the provider id is the webhook-id
	_, n := r.counts()
	is.Equal(n, 1) // delivered once
	r.mu.Lock()
	p, h := r.deliveries[0], r.lastHeader
	r.mu.Unlock()
	is.Equal(p.Type, "notification")                                              // payload type
	is.Equal(p.Data, webhook.Data{Ref: "task-7", Body: "Your order has shipped"}) // payload data
	_, err = time.Parse(time.RFC3339, p.Timestamp)
	is.NoErr(err)                                                 // payload timestamp is RFC 3339
	is.Equal(h.Get("webhook-id"), "ntf-task-7")                   // webhook-id is the idempotency key
	is.True(strings.HasPrefix(h.Get("webhook-signature"), "v1,")) // signature version 1
	is.Equal(h.Get("Content-Type"), "application/json")           // JSON body
}

func TestChannelWebhookReject(t *testing.T) {
	is := is.New(t)
	secret, key := newSecret(t)
	r := newReceiver(t, key)
	c, err := webhook.New(secret, webhook.Options{AllowedNetworks: httpkit.Loopback})
	is.NoErr(err) // client

	r.set(func(r *receiver) { r.rejectWith = http.StatusBadRequest })
	obs := send(t, c, message(r.srv.URL), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // 400 is a rejection
	is.True(strings.Contains(obs.Detail, "400"))    // and says so

	r.set(func(r *receiver) { r.rejectWith = http.StatusServiceUnavailable })
	obs = send(t, c, message(r.srv.URL), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeHTTP5xx) // 503 refused

	r.set(func(r *receiver) { r.rejectWith = http.StatusTooManyRequests })
	obs = send(t, c, message(r.srv.URL), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeThrottled) // 429 throttled
	is.Equal(obs.RetryAfter, 7*time.Second)          // with the receiver's Retry-After

	r.set(func(r *receiver) { r.rejectWith = 0; r.status = http.StatusFound })
	obs = send(t, c, message(r.srv.URL), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected)       // a redirect is not followed
	is.True(strings.Contains(obs.Detail, "not followed")) // and says so
}

// TestChannelWebhookTimeoutThenResendDeduped: the receiver records the webhook and answers only after
// the client timed out; the resend carries the same webhook-id and the receiver drops it. The user
// got one delivery.
func TestChannelWebhookTimeoutThenResendDeduped(t *testing.T) {
	is := is.New(t)
	secret, key := newSecret(t)
	r := newReceiver(t, key)
	c, err := webhook.New(secret, webhook.Options{AllowedNetworks: httpkit.Loopback})
	is.NoErr(err) // client
	msg := message(r.srv.URL + "/hooks/u1")

	r.set(func(r *receiver) { r.delay = 3 * time.Second })
	first := send(t, c, msg, 300*time.Millisecond)
	is.Equal(first.Outcome, delivery.OutcomeTimeout) // accepted, but the answer came too late

	r.set(func(r *receiver) { r.delay = 0 })
	second := send(t, c, msg, 5*time.Second)
	is.Equal(second.Outcome, delivery.OutcomeAccepted) // the resend is answered
	is.Equal(second.ProviderMsgID, "ntf-task-7")       // same webhook-id
	requests, deliveries := r.counts()
	is.Equal(requests, 2)   // two requests reached the receiver
	is.Equal(deliveries, 1) // one delivery: the receiver deduplicated on webhook-id
}

// TestChannelWebhookDropOnKeptAliveConnection: the receiver records a webhook and drops the kept-alive
// connection without answering. The attempt is uncertain (IO_ERROR) and put one request on the wire;
// the resend with the same webhook-id is deduplicated.
func TestChannelWebhookDropOnKeptAliveConnection(t *testing.T) {
	is := is.New(t)
	secret, key := newSecret(t)
	r := newReceiver(t, key)
	c, err := webhook.New(secret, webhook.Options{AllowedNetworks: httpkit.Loopback})
	is.NoErr(err) // client
	warm := message(r.srv.URL + "/hooks/u1")
	warm.IdempotencyKey = "ntf-task-6"
	is.Equal(send(t, c, warm, 5*time.Second).Outcome, delivery.OutcomeAccepted) // the connection stays open

	r.set(func(r *receiver) { r.drop = true })
	obs := send(t, c, message(r.srv.URL+"/hooks/u1"), 5*time.Second)
	requests, deliveries := r.counts()
	is.Equal(requests, 2)                          // one request for this attempt, not a resend behind our back
	is.Equal(r.conns.Count(), 1)                   // on the kept-alive connection
	is.Equal(obs.Outcome, delivery.OutcomeIOError) // uncertain: the receiver has it
	is.Equal(deliveries, 2)                        // recorded

	r.set(func(r *receiver) { r.drop = false })
	is.Equal(send(t, c, message(r.srv.URL+"/hooks/u1"), 5*time.Second).Outcome, delivery.OutcomeAccepted) // the resend
	requests, deliveries = r.counts()
	is.Equal(requests, 3)   // one more request
	is.Equal(deliveries, 2) // deduplicated on webhook-id
}

// TestChannelWebhookGateway: a 502 or 504, from the receiver's own gateway, may come after the webhook
// was passed on: GATEWAY_ERROR, uncertain; a 503 is the receiver's refusal.
func TestChannelWebhookGateway(t *testing.T) {
	is := is.New(t)
	is.Equal(webhook.Classify(502, nil, nil, "id").Outcome, delivery.OutcomeGatewayError)
	is.Equal(webhook.Classify(504, nil, nil, "id").Outcome, delivery.OutcomeGatewayError)
	is.Equal(webhook.Classify(503, nil, nil, "id").Outcome, delivery.OutcomeHTTP5xx)
	is.Equal(webhook.Classify(429, http.Header{"Retry-After": {"3"}}, nil, "id").RetryAfter, 3*time.Second)
}

// TestChannelWebhookBadSignature is the negative control of the receiver's check: a client signing
// with another secret, or a timestamp outside the tolerance, is refused and nothing is delivered.
func TestChannelWebhookBadSignature(t *testing.T) {
	is := is.New(t)
	_, key := newSecret(t)
	r := newReceiver(t, key)
	otherSecret, _ := newSecret(t)
	wrong, err := webhook.New(otherSecret, webhook.Options{AllowedNetworks: httpkit.Loopback})
	is.NoErr(err) // client with the wrong secret

	obs := send(t, wrong, message(r.srv.URL), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // 401 from the receiver
	is.True(strings.Contains(obs.Detail, "401"))    // says so
	_, n := r.counts()
	is.Equal(n, 0) // nothing delivered

	rightSecret := webhook.SecretPrefix + base64.StdEncoding.EncodeToString(key)
	stale, err := webhook.New(rightSecret, webhook.Options{AllowedNetworks: httpkit.Loopback, Now: func() time.Time { return time.Now().Add(-10 * time.Minute) }})
	is.NoErr(err) // client with a slow clock
	obs = send(t, stale, message(r.srv.URL), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // timestamp outside the tolerance
	_, n = r.counts()
	is.Equal(n, 0) // still nothing delivered

	// The verification itself: a valid signature passes; a changed body, id or timestamp does not;
	// a list with one valid signature among others (key rotation) passes.
	body := []byte(`{"type":"notification"}`)
	now := time.Now()
	h := http.Header{}
	h.Set("webhook-id", "ntf-task-1")
	h.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	h.Set("webhook-signature", webhook.Sign(key, "ntf-task-1", now.Unix(), body))
	is.NoErr(verify(key, h, body, now))                             // valid
	is.True(verify(key, h, []byte(`{"type":"other"}`), now) != nil) // tampered body
	is.True(verify(key, h, body, now.Add(6*time.Minute)) != nil)    // too old
	h2 := h.Clone()
	h2.Set("webhook-id", "ntf-task-2")
	is.True(verify(key, h2, body, now) != nil) // another id
	h3 := h.Clone()
	h3.Set("webhook-signature", "v1,AAAA "+h.Get("webhook-signature"))
	is.NoErr(verify(key, h3, body, now)) // one of several signatures matches
}

func TestChannelWebhookTransport(t *testing.T) {
	is := is.New(t)
	secret, _ := newSecret(t)
	c, err := webhook.New(secret, webhook.Options{AllowedNetworks: httpkit.Loopback})
	is.NoErr(err) // client

	l, err := net.Listen("tcp", "127.0.0.1:0")
	is.NoErr(err) // a port
	addr := l.Addr().String()
	is.NoErr(l.Close())
	obs := send(t, c, message("http://"+addr+"/hook"), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeConnectFailed) // nothing listens: certainly not sent

	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(tlsSrv.Close)
	obs = send(t, c, message(tlsSrv.URL+"/hook"), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeConnectFailed) // untrusted certificate: the request never left
	is.True(strings.HasPrefix(obs.Detail, "TLS"))        // says so

	obs = send(t, c, message("ftp://example.com/x"), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // not an http(s) URL
	obs = send(t, c, message("https://user:hunter2@example.com/x?token=s3cret#frag"), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected)                                              // a fragment is refused
	is.True(!strings.Contains(obs.Detail, "hunter2") && !strings.Contains(obs.Detail, "s3cret")) // no credentials shown

	q := c.Query(context.Background(), "task-7")
	is.Equal(q.Outcome, delivery.OutcomeQueryFailed) // no query
	is.Equal(q.Detail, "not supported")              // says so
}

func TestChannelWebhookSecret(t *testing.T) {
	is := is.New(t)
	for _, bad := range []string{
		"",
		"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0", // no prefix
		"whsec_not base64!",                // not base64
		"whsec_" + base64.StdEncoding.EncodeToString([]byte("short")), // too short
	} {
		_, err := webhook.New(bad, webhook.Options{AllowedNetworks: httpkit.Loopback})
		is.True(errors.Is(err, delivery.ErrInvalidInput))             // refused
		is.True(bad == "" || !strings.Contains(err.Error(), bad[6:])) // without echoing the secret
	}
	secret, _ := newSecret(t)
	_, err := webhook.New(secret, webhook.Options{AllowedNetworks: httpkit.Loopback})
	is.NoErr(err) // a 32-byte secret is fine
}

// TestChannelWebhookRefusesInternalAddress: by default the webhook's client refuses a receiver on
// this machine (the egress policy): REJECTED naming the network, and the receiver sees no connection.
func TestChannelWebhookRefusesInternalAddress(t *testing.T) {
	is := is.New(t)
	secret, key := newSecret(t)
	r := newReceiver(t, key)
	c, err := webhook.New(secret, webhook.Options{})
	is.NoErr(err) // client with the default policy

	obs := send(t, c, message(r.srv.URL+"/hooks/u1"), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // a certain refusal
	is.Equal(obs.Detail, "destination 127.0.0.1 is in a refused network (loopback); allowed_networks opts a network in")
	requests, _ := r.counts()
	is.Equal(requests, 0)        // nothing reached the receiver
	is.Equal(r.conns.Count(), 0) // not even a connection
}
