package webpush_test

import (
	"context"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
	"github.com/notifierhq/notifier/service/webpush"
)

func vapidKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newClient(t *testing.T, p *pushService, key *ecdsa.PrivateKey, now func() time.Time) *webpush.Client {
	t.Helper()
	c, err := webpush.New(webpush.Options{VAPIDKey: key, Subject: "mailto:ops@example.com", CAFile: p.caFile, AllowedNetworks: httpkit.Loopback, Now: now})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return c
}

func message(to string, ttl time.Duration) delivery.Message {
	return delivery.Message{Ref: "task-7", IdempotencyKey: "ntf-task-7", To: to, Body: "Your order has shipped",
		ExpiresAt: time.Now().Add(ttl), Action: delivery.ActionSend}
}

func send(c *webpush.Client, msg delivery.Message, timeout time.Duration) delivery.Observation {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Send(ctx, msg)
}

func TestChannelWebPushAccept(t *testing.T) {
	is := is.New(t)
	key := vapidKey(t)
	p := newPushService(t, &key.PublicKey)
	c := newClient(t, p, key, nil)
	sub := p.subscribe(t, "phone")

	obs := send(c, message(sub, time.Hour), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccepted)                // 201 is an acceptance
	is.True(strings.HasPrefix(obs.ProviderMsgID, p.srv.URL+"/m/")) // the provider id is the Location
	h := p.header()
	is.Equal(h.Get("Content-Encoding"), "aes128gcm")                                                    // RFC 8291 coding
	is.Equal(h.Get("Urgency"), "normal")                                                                // default urgency
	is.Equal(h.Get("Topic"), webpush.Topic("task-7"))                                                   // the task's topic
	is.True(strings.HasPrefix(h.Get("Authorization"), "vapid t="))                                      // RFC 8292 scheme
	is.True(strings.Contains(h.Get("Authorization"), ", k="+c.PublicKey()))                             // with the public key
	is.Equal(p.deliver("phone"), 1)                                                                     // one message stored
	is.Equal(p.inbox("phone"), []webpush.Notification{{Ref: "task-7", Body: "Your order has shipped"}}) // decrypted by the device

	high, err := webpush.New(webpush.Options{VAPIDKey: key, Subject: "https://example.com/contact", Urgency: webpush.UrgencyHigh, CAFile: p.caFile, AllowedNetworks: httpkit.Loopback})
	is.NoErr(err)                                                                                  // client with high urgency
	is.Equal(send(high, message(sub, time.Hour), 5*time.Second).Outcome, delivery.OutcomeAccepted) // accepted
	is.Equal(p.header().Get("Urgency"), "high")                                                    // urgency configured
}

func TestChannelWebPushReject(t *testing.T) {
	is := is.New(t)
	key := vapidKey(t)
	p := newPushService(t, &key.PublicKey)
	c := newClient(t, p, key, nil)
	sub := p.subscribe(t, "phone")

	p.mu.Lock()
	p.devices["phone"].gone = true
	p.mu.Unlock()
	obs := send(c, message(sub, time.Hour), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected)            // 410: the subscription is gone
	is.True(strings.Contains(obs.Detail, "subscription gone")) // says so

	missing := strings.Replace(sub, "/push/phone", "/push/laptop", 1)
	obs = send(c, message(missing, time.Hour), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // 404: unknown subscription
	is.True(strings.Contains(obs.Detail, "404"))    // says so

	sub2 := p.subscribe(t, "tablet")
	for _, tc := range []struct {
		status int
		want   delivery.Outcome
	}{
		{http.StatusRequestEntityTooLarge, delivery.OutcomeRejected},
		{http.StatusTooManyRequests, delivery.OutcomeThrottled},
		{http.StatusServiceUnavailable, delivery.OutcomeHTTP5xx},
		{http.StatusBadRequest, delivery.OutcomeRejected},
		{http.StatusMovedPermanently, delivery.OutcomeRejected},
	} {
		p.setScript(step{status: tc.status})
		obs := send(c, message(sub2, time.Hour), 5*time.Second)
		is.Equal(obs.Outcome, tc.want) // scripted status maps as documented
		if tc.status == http.StatusTooManyRequests {
			is.Equal(obs.RetryAfter, 9*time.Second) // Retry-After honoured
		}
	}

	untrusting, err := webpush.New(webpush.Options{VAPIDKey: key, Subject: "mailto:ops@example.com", AllowedNetworks: httpkit.Loopback})
	is.NoErr(err) // a client without the test CA
	obs = send(untrusting, message(sub2, time.Hour), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeConnectFailed) // certificate not verified: nothing was sent
	is.True(strings.HasPrefix(obs.Detail, "TLS"))        // says so

	other := newClient(t, p, vapidKey(t), nil)
	obs = send(other, message(sub2, time.Hour), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // 403: not the subscription's application server key
	is.True(strings.Contains(obs.Detail, "403"))    // says so
	is.Equal(p.deliver("tablet"), 0)                // nothing was stored by any of these

	before := p.requestCount()
	for _, bad := range []string{
		"device-token-1",
		`{"endpoint":"http://push.example/x","keys":{"p256dh":"` + base64.RawURLEncoding.EncodeToString(make([]byte, 65)) + `","auth":"AAAAAAAAAAAAAAAAAAAAAA"}}`,
		strings.Replace(sub, `"auth":"`, `"auth":"AA`, 1),
		`{"endpoint":"https://push.example/x","keys":{"p256dh":"BAAA","auth":"AAAAAAAAAAAAAAAAAAAAAA"}}`,
	} {
		obs := send(c, message(bad, time.Hour), 5*time.Second)
		is.Equal(obs.Outcome, delivery.OutcomeRejected) // an invalid subscription is refused locally
	}
	obs = send(c, message(sub2, -time.Second), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // expired
	is.Equal(obs.Detail, "expired")                 // says so
	is.Equal(p.requestCount(), before)              // none of these reached the push service

	q := c.Query(context.Background(), "task-7")
	is.Equal(q.Outcome, delivery.OutcomeQueryFailed) // no query in Web Push
	is.Equal(q.Detail, "not supported")              // says so
}

// TestChannelWebPushTTL: the TTL header is the notification's remaining lifetime in whole seconds,
// so the push service drops the message when the notification expires.
func TestChannelWebPushTTL(t *testing.T) {
	is := is.New(t)
	key := vapidKey(t)
	p := newPushService(t, &key.PublicKey)
	now := time.Now()
	c := newClient(t, p, key, func() time.Time { return now })
	sub := p.subscribe(t, "phone")

	msg := message(sub, 0)
	msg.ExpiresAt = now.Add(90*time.Second + 700*time.Millisecond)
	is.Equal(send(c, msg, 5*time.Second).Outcome, delivery.OutcomeAccepted) // accepted
	is.Equal(p.header().Get("TTL"), "90")                                   // remaining lifetime, rounded down

	msg.ExpiresAt = now.Add(365 * 24 * time.Hour)
	is.Equal(send(c, msg, 5*time.Second).Outcome, delivery.OutcomeAccepted) // accepted
	is.Equal(p.header().Get("TTL"), "2419200")                              // capped at four weeks

	msg.ExpiresAt = now.Add(999 * time.Millisecond)
	obs := send(c, msg, 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // less than a second left: not sent
	is.Equal(obs.Detail, "expired")                 // says so

	msg.ExpiresAt = time.Time{}
	is.Equal(send(c, msg, 5*time.Second).Outcome, delivery.OutcomeRejected) // no expiry known: not sent

	// The push service honours it: a message whose TTL ran out is never delivered.
	short := webpush.TTL(time.Now().Add(1500*time.Millisecond), time.Now())
	is.Equal(short, int64(1)) // 1.5 s left -> TTL 1
	live := newClient(t, p, key, nil)
	p.deliver("phone")
	is.Equal(send(live, message(sub, 1500*time.Millisecond), 5*time.Second).Outcome, delivery.OutcomeAccepted) // accepted with TTL 1
	p.wait(500 * time.Millisecond)
	is.Equal(p.deliver("phone"), 1)                                                                            // half its TTL on: delivered
	is.Equal(send(live, message(sub, 1500*time.Millisecond), 5*time.Second).Outcome, delivery.OutcomeAccepted) // again
	p.wait(1001 * time.Millisecond)
	is.Equal(p.deliver("phone"), 0) // past its TTL in the push service: not delivered
}

// TestChannelWebPushTopicResendReplacesUndelivered: the push service stores the first message and
// answers after the client timed out; the TOPIC_RESEND replaces the stored copy, which the device
// had not fetched yet. The device gets one message.
func TestChannelWebPushTopicResendReplacesUndelivered(t *testing.T) {
	is := is.New(t)
	key := vapidKey(t)
	p := newPushService(t, &key.PublicKey)
	c := newClient(t, p, key, nil)
	sub := p.subscribe(t, "phone")
	msg := message(sub, time.Hour)

	p.setScript(step{delay: 3 * time.Second})
	first := send(c, msg, 300*time.Millisecond)
	is.Equal(first.Outcome, delivery.OutcomeTimeout) // stored, but the 201 came too late
	topic := p.header().Get("Topic")

	msg.Action = delivery.ActionTopicResend
	second := send(c, msg, 5*time.Second)
	is.Equal(second.Outcome, delivery.OutcomeAccepted) // the resend is accepted
	is.Equal(p.header().Get("Topic"), topic)           // with the same topic
	is.Equal(p.requestCount(), 2)                      // two requests reached the push service
	is.Equal(p.deliver("phone"), 1)                    // the second replaced the first
	is.Equal(len(p.inbox("phone")), 1)                 // the device got one message
}

// TestChannelWebPushTopicResendAfterDelivery: the same, but the device fetched the first copy before
// the resend: replacement only applies to undelivered messages, so the device gets two (with the
// same ref, for the service worker to drop one).
func TestChannelWebPushTopicResendAfterDelivery(t *testing.T) {
	is := is.New(t)
	key := vapidKey(t)
	p := newPushService(t, &key.PublicKey)
	c := newClient(t, p, key, nil)
	sub := p.subscribe(t, "phone")
	msg := message(sub, time.Hour)

	p.setScript(step{delay: 3 * time.Second})
	is.Equal(send(c, msg, 300*time.Millisecond).Outcome, delivery.OutcomeTimeout) // stored, answer too late
	is.Equal(p.deliver("phone"), 1)                                               // the device fetched it

	msg.Action = delivery.ActionTopicResend
	is.Equal(send(c, msg, 5*time.Second).Outcome, delivery.OutcomeAccepted) // the resend is accepted
	is.Equal(p.deliver("phone"), 1)                                         // and delivered too
	inbox := p.inbox("phone")
	is.Equal(len(inbox), 2)              // two copies reached the device
	is.Equal(inbox[0].Ref, inbox[1].Ref) // with the same ref
}

func TestChannelWebPushTopic(t *testing.T) {
	is := is.New(t)
	alphabet := regexp.MustCompile(`^[A-Za-z0-9_-]{32}$`)
	a, b := webpush.Topic("task-1"), webpush.Topic("task-2")
	is.True(alphabet.MatchString(a))      // 32 characters of base64url
	is.Equal(a, webpush.Topic("task-1"))  // stable
	is.True(a != b)                       // different per task
	is.True(!strings.Contains(a, "task")) // derived, not the raw ref
}

// TestChannelWebPushVAPIDVerification is the negative control of the test push service's VAPID
// check: a tampered token, a wrong audience or an expired token is refused.
func TestChannelWebPushVAPIDVerification(t *testing.T) {
	is := is.New(t)
	key := vapidKey(t)
	p := newPushService(t, &key.PublicKey)
	c := newClient(t, p, key, nil)
	sub := p.subscribe(t, "phone")
	is.Equal(send(c, message(sub, time.Hour), 5*time.Second).Outcome, delivery.OutcomeAccepted) // a good token
	auth := p.header().Get("Authorization")
	now := time.Now()
	is.NoErr(verifyVAPID(auth, &key.PublicKey, p.audience, now)) // verifies

	tok := strings.TrimPrefix(strings.Split(auth, ",")[0], "vapid t=")
	parts := strings.Split(tok, ".")
	claims, _ := base64.RawURLEncoding.DecodeString(parts[1])
	forged := strings.Replace(string(claims), "ops@example.com", "evil@example.com", 1)
	tampered := strings.Replace(auth, parts[1], base64.RawURLEncoding.EncodeToString([]byte(forged)), 1)
	is.True(verifyVAPID(tampered, &key.PublicKey, p.audience, now) != nil)               // changed claims
	is.True(verifyVAPID(auth, &key.PublicKey, "https://other.example", now) != nil)      // other audience
	is.True(verifyVAPID(auth, &key.PublicKey, p.audience, now.Add(13*time.Hour)) != nil) // expired
	other := vapidKey(t)
	is.True(errors.Is(verifyVAPID(auth, &other.PublicKey, p.audience, now), errWrongKey)) // not the subscription's key
}

func TestChannelWebPushVAPIDKey(t *testing.T) {
	is := is.New(t)
	key := vapidKey(t)
	sec1, err := x509.MarshalECPrivateKey(key)
	is.NoErr(err) // SEC 1
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	is.NoErr(err) // PKCS #8
	raw, err := key.Bytes()
	is.NoErr(err) // raw scalar
	for _, in := range [][]byte{
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}),
		[]byte(base64.RawURLEncoding.EncodeToString(raw) + "\n"),
	} {
		got, err := webpush.ParseVAPIDKey(in)
		is.NoErr(err)           // parsed
		is.True(got.Equal(key)) // the same key
	}
	x, _ := ecdh.X25519().GenerateKey(rand.Reader)
	xder, _ := x509.MarshalPKCS8PrivateKey(x)
	for _, bad := range [][]byte{
		[]byte("not a key"),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: xder}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("x")}),
	} {
		_, err := webpush.ParseVAPIDKey(bad)
		is.True(errors.Is(err, delivery.ErrInvalidInput)) // refused
	}
	_, err = webpush.New(webpush.Options{VAPIDKey: key, Subject: "ops@example.com"})
	is.True(errors.Is(err, delivery.ErrInvalidInput)) // subject must be mailto: or https:
	_, err = webpush.New(webpush.Options{VAPIDKey: key, Subject: "mailto:ops@example.com", Urgency: "urgent"})
	is.True(errors.Is(err, delivery.ErrInvalidInput)) // unknown urgency
}

// TestChannelWebPushDropOnKeptAliveConnection: the push service stores the message and drops the
// kept-alive connection without answering: one request for the attempt, uncertain (IO_ERROR).
func TestChannelWebPushDropOnKeptAliveConnection(t *testing.T) {
	is := is.New(t)
	key := vapidKey(t)
	p := newPushService(t, &key.PublicKey)
	c := newClient(t, p, key, nil)
	sub := p.subscribe(t, "phone")
	is.Equal(send(c, message(sub, time.Hour), 5*time.Second).Outcome, delivery.OutcomeAccepted) // the connection stays open
	is.Equal(p.deliver("phone"), 1)                                                             // delivered

	p.setScript(step{drop: true})
	obs := send(c, message(sub, time.Hour), 5*time.Second)
	is.Equal(p.requestCount(), 2)                  // one request for this attempt, not a resend behind our back
	is.Equal(p.connCount(), 1)                     // on the kept-alive connection
	is.Equal(obs.Outcome, delivery.OutcomeIOError) // uncertain
	is.Equal(p.deliver("phone"), 1)                // and indeed the push service had stored it
}

// TestChannelWebPushGateway: 502 and 504 may come after the push service's gateway passed the message
// on: GATEWAY_ERROR, uncertain; a 503 is the push service's refusal.
func TestChannelWebPushGateway(t *testing.T) {
	is := is.New(t)
	is.Equal(webpush.Classify(502, http.Header{}, nil).Outcome, delivery.OutcomeGatewayError)
	is.Equal(webpush.Classify(504, http.Header{}, nil).Outcome, delivery.OutcomeGatewayError)
	is.Equal(webpush.Classify(503, http.Header{}, nil).Outcome, delivery.OutcomeHTTP5xx)
}

// TestChannelWebPushRefusesInternalEndpoint: by default a subscription whose endpoint is on this
// machine is refused (the egress policy): REJECTED naming the network, no connection to the service.
func TestChannelWebPushRefusesInternalEndpoint(t *testing.T) {
	is := is.New(t)
	key := vapidKey(t)
	p := newPushService(t, &key.PublicKey)
	c, err := webpush.New(webpush.Options{VAPIDKey: key, Subject: "mailto:ops@example.com", CAFile: p.caFile})
	is.NoErr(err) // client with the default policy

	obs := send(c, message(p.subscribe(t, "phone"), time.Hour), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // a certain refusal
	is.True(strings.Contains(obs.Detail, "is in a refused network (loopback)"))
	is.Equal(p.requestCount(), 0) // nothing reached the push service
	is.Equal(p.connCount(), 0)    // not even a connection
}
