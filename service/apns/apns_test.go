package apns_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service/apns"
	"github.com/notifierhq/notifier/service/delivery"
)

const (
	ref    = "0b6a4e4e-8c47-4f43-9d1c-1f2e3d4c5b6a"
	device = "6c1f4e5a9b0d2c3e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f80912"
)

// clock is a settable time shared by the adapter and the fake.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time            { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration)       { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }
func newClock() *clock                     { return &clock{t: time.Now()} }
func (c *clock) message() delivery.Message { return msg(c.now().Add(time.Hour)) }

func start(t *testing.T, clk *clock) (*fakes.APNs, *apns.Client) {
	t.Helper()
	return startWith(t, clk, false)
}

// startWith starts a fake and a client; collapse is the channel's resend_with_collapse.
func startWith(t *testing.T, clk *clock, collapse bool) (*fakes.APNs, *apns.Client) {
	t.Helper()
	a := fakes.StartAPNs()
	t.Cleanup(a.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, a.CertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	key, err := apns.ParseKey(a.KeyP8())
	if err != nil {
		t.Fatal(err)
	}
	opt := apns.Options{Key: key, KeyID: a.KeyID, TeamID: a.Team, Topic: a.Topic, Endpoint: a.URL(), CAFile: ca, Collapse: collapse}
	if clk != nil {
		a.SetClock(clk.now)
		opt.Now = clk.now
	}
	c, err := apns.New(opt)
	if err != nil {
		t.Fatal(err)
	}
	return a, c
}

func msg(expires time.Time) delivery.Message {
	return delivery.Message{Ref: ref, IdempotencyKey: delivery.IdempotencyKey(ref), To: device, Body: "Your order has shipped",
		ExpiresAt: expires, Action: delivery.ActionSend}
}

func send(c *apns.Client, m delivery.Message, timeout time.Duration) delivery.Observation {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Send(ctx, m)
}

func TestAPNsAccept(t *testing.T) {
	is := is.New(t)
	a, c := start(t, nil)
	m := msg(time.Now().Add(time.Hour))
	obs := send(c, m, 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccepted)
	is.Equal(obs.ProviderMsgID, ref) // apns-id is our ref
	h, body := a.Last()
	is.Equal(h.Get("apns-push-type"), "alert")
	is.Equal(h.Get("apns-topic"), "com.example.app")
	is.Equal(h.Get("apns-expiration"), strconv.FormatInt(m.ExpiresAt.Unix(), 10)) // the notification's TTL
	is.Equal(h.Get("apns-collapse-id"), "")                                       // none without resend_with_collapse
	is.Equal(h.Get("apns-priority"), "10")
	var p struct {
		APS struct {
			Alert struct{ Body string } `json:"alert"`
		} `json:"aps"`
		Ref string `json:"ref"`
	}
	is.NoErr(json.Unmarshal(body, &p))
	is.Equal(p.APS.Alert.Body, "Your order has shipped")
	is.Equal(p.Ref, ref)
	is.Equal(a.Protos(), map[string]int{"HTTP/2.0": 1}) // HTTP/2, as APNs requires
}

// The provider token lives 40 minutes: never replaced within Apple's 20-minute minimum, never used
// past its one-hour limit.
func TestAPNsProviderTokenRefresh(t *testing.T) {
	is := is.New(t)
	clk := newClock()
	a, c := start(t, clk)
	for _, step := range []time.Duration{0, 10 * time.Minute, 19 * time.Minute, 10 * time.Minute} { // to 39 min
		clk.add(step)
		is.Equal(send(c, clk.message(), 5*time.Second).Outcome, delivery.OutcomeAccepted)
	}
	is.Equal(a.TokenChanges(), 1) // one token for 39 minutes
	clk.add(2 * time.Minute)      // 41 min
	is.Equal(send(c, clk.message(), 5*time.Second).Outcome, delivery.OutcomeAccepted)
	is.Equal(a.TokenChanges(), 2) // replaced, before APNs would call it expired
	for range 5 {
		clk.add(15 * time.Minute)
		is.Equal(send(c, clk.message(), 5*time.Second).Outcome, delivery.OutcomeAccepted) // neither expired nor TooManyProviderTokenUpdates
	}
	is.Equal(a.Sends(ref), 10)
}

func TestAPNsUnregistered(t *testing.T) {
	is := is.New(t)
	a, c := start(t, nil)
	a.Unregister(device)
	obs := send(c, msg(time.Now().Add(time.Hour)), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected)
	is.True(obs.Unregistered)
	is.True(strings.Contains(obs.Detail, "410 Unregistered"))
}

func TestAPNsErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		status     int
		outcome    delivery.Outcome
		retryAfter time.Duration
		detail     string
	}{
		{400, delivery.OutcomeRejected, 0, "BadDeviceToken"},
		{403, delivery.OutcomeAccountRefused, 0, "credential"},
		{413, delivery.OutcomeRejected, 0, "PayloadTooLarge"},
		{429, delivery.OutcomeThrottled, 7 * time.Second, "TooManyRequests"}, // uncertain by the kind's contract
		{500, delivery.OutcomeHTTP5xx, 7 * time.Second, "may be on its way"}, // uncertain by the kind's contract
		{503, delivery.OutcomeHTTP5xx, 7 * time.Second, "ServiceUnavailable"},
	} {
		t.Run(http.StatusText(tc.status), func(t *testing.T) {
			is := is.New(t)
			a, c := start(t, nil)
			a.ScriptSend(ref, fakes.Step{Status: tc.status, RetryAfter: "7"})
			obs := send(c, msg(time.Now().Add(time.Hour)), 5*time.Second)
			is.Equal(obs.Outcome, tc.outcome)
			is.Equal(obs.RetryAfter, tc.retryAfter)
			is.True(strings.Contains(obs.Detail, tc.detail))
			is.True(!obs.Unregistered)
			is.Equal(a.Sends(ref), 1)
		})
	}
}

// Accepted, then the answer is lost on a kept-alive HTTP/2 connection: uncertain, and nothing is
// sent again behind the caller's back.
func TestAPNsLostAnswer(t *testing.T) {
	is := is.New(t)
	a, c := start(t, nil)
	is.Equal(send(c, msg(time.Now().Add(time.Hour)), 5*time.Second).Outcome, delivery.OutcomeAccepted)
	conns := a.Conns()
	a.ScriptSend(ref, fakes.Step{Drop: true})
	is.Equal(send(c, msg(time.Now().Add(time.Hour)), 5*time.Second).Outcome, delivery.OutcomeIOError)
	is.Equal(a.Sends(ref), 2)
	is.Equal(a.Conns(), conns) // the same connection: a reset stream, not retried
	a.ScriptSend(ref, fakes.Step{Delay: 2 * time.Second})
	is.Equal(send(c, msg(time.Now().Add(time.Hour)), 300*time.Millisecond).Outcome, delivery.OutcomeTimeout)
	is.Equal(a.Sends(ref), 3)
}

func TestAPNsCollapseResend(t *testing.T) {
	is := is.New(t)
	a, c := startWith(t, nil, true)
	a.ScriptSend(ref, fakes.Step{Delay: 2 * time.Second})
	is.Equal(send(c, msg(time.Now().Add(time.Hour)), 300*time.Millisecond).Outcome, delivery.OutcomeTimeout)
	m := msg(time.Now().Add(time.Hour))
	m.Action = delivery.ActionTopicResend
	is.Equal(send(c, m, 5*time.Second).Outcome, delivery.OutcomeAccepted)
	is.Equal(a.Outbound(ref), 1) // replaced the undelivered copy
	a.Online(device)
	is.Equal(send(c, m, 5*time.Second).Outcome, delivery.OutcomeAccepted)
	is.Equal(a.Outbound(ref), 2)      // a second copy reached the device
	is.Equal(len(a.Shown(device)), 1) // shown as one: the same apns-collapse-id
	h, _ := a.Last()
	is.Equal(h.Get("apns-collapse-id"), "ntf-"+ref)
}

// APNs stores one notification per app for an offline device: whatever our collapse ids, a device
// offline for several tasks gets the newest only (what docs/channels.md#apns states).
func TestAPNsOfflineDeviceKeepsTheNewest(t *testing.T) {
	is := is.New(t)
	a, c := start(t, nil)
	var last string
	for i := range 3 {
		m := msg(time.Now().Add(time.Hour))
		m.Ref = strings.Replace(ref, "1f2e3d4c5b6a", "00000000000"+strconv.Itoa(i), 1)
		last = m.Ref
		is.Equal(send(c, m, 5*time.Second).Outcome, delivery.OutcomeAccepted)
	}
	stored, ok := a.Stored(device)
	is.True(ok)
	is.Equal(stored.Ref, last) // the newest only
	a.Online(device)
	is.Equal(len(a.Received(device)), 1)
}

// The fake checks device tokens and headers as Apple documents them; the adapter's requests pass.
func TestAPNsFakeValidates(t *testing.T) {
	is := is.New(t)
	a, c := start(t, nil)
	m := msg(time.Now().Add(time.Hour))
	m.To = device[:40] // hexadecimal, but not a device token's 64 digits
	obs := send(c, m, 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected)
	is.True(strings.Contains(obs.Detail, "BadDeviceToken"))
	is.True(!obs.Unregistered) // the task's address, not a token APNs retired
	is.Equal(a.Sends(ref), 1)
}

// ExpiredProviderToken drops the provider token however young it is: the next request (the paused
// channel's probe) carries a newly signed one.
func TestAPNsExpiredProviderTokenRefresh(t *testing.T) {
	is := is.New(t)
	clk := newClock()
	a, c := start(t, clk)
	is.Equal(send(c, clk.message(), 5*time.Second).Outcome, delivery.OutcomeAccepted)
	h, _ := a.Last()
	first := h.Get("Authorization")
	a.SetClock(func() time.Time { return clk.now().Add(61 * time.Minute) }) // Apple's clock: the token is past its hour
	clk.add(5 * time.Minute)                                                // ours: 5 minutes old
	obs := send(c, clk.message(), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccountRefused)
	is.True(strings.Contains(obs.Detail, "ExpiredProviderToken"))
	a.SetClock(clk.now)
	clk.add(time.Second)
	send(c, clk.message(), 5*time.Second)
	h, _ = a.Last()
	is.True(h.Get("Authorization") != first) // a new provider token
}

// The mapping of Apple's reasons (https://developer.apple.com/documentation/usernotifications/handling-error-responses-from-apns).
func TestAPNsClassify(t *testing.T) {
	for _, tc := range []struct {
		status       int
		reason       string
		outcome      delivery.Outcome
		unregistered bool
	}{
		{403, "ExpiredProviderToken", delivery.OutcomeAccountRefused, false},
		{403, "InvalidProviderToken", delivery.OutcomeAccountRefused, false},
		{403, "MissingProviderToken", delivery.OutcomeAccountRefused, false},
		{403, "BadCertificate", delivery.OutcomeAccountRefused, false},
		{403, "BadCertificateEnvironment", delivery.OutcomeAccountRefused, false},
		{403, "Forbidden", delivery.OutcomeAccountRefused, false},
		{400, "TopicDisallowed", delivery.OutcomeAccountRefused, false},
		{400, "BadTopic", delivery.OutcomeAccountRefused, false},
		{400, "MissingTopic", delivery.OutcomeAccountRefused, false},
		{429, "TooManyProviderTokenUpdates", delivery.OutcomeAccountRefused, false},
		{400, "BadDeviceToken", delivery.OutcomeRejected, false},
		{400, "DeviceTokenNotForTopic", delivery.OutcomeRejected, false},
		{400, "BadCollapseId", delivery.OutcomeRejected, false},
		{410, "Unregistered", delivery.OutcomeRejected, true},
		{410, "ExpiredToken", delivery.OutcomeRejected, true},
		{413, "PayloadTooLarge", delivery.OutcomeRejected, false},
		{429, "TooManyRequests", delivery.OutcomeThrottled, false},
		{500, "InternalServerError", delivery.OutcomeHTTP5xx, false},
		{503, "ServiceUnavailable", delivery.OutcomeHTTP5xx, false},
		{503, "Shutdown", delivery.OutcomeHTTP5xx, false},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			is := is.New(t)
			obs := apns.Classify(tc.status, http.Header{}, []byte(`{"reason":"`+tc.reason+`"}`))
			is.Equal(obs.Outcome, tc.outcome)
			is.Equal(obs.Unregistered, tc.unregistered)
			is.True(strings.Contains(obs.Detail, tc.reason)) // names the cause
		})
	}
}

func TestAPNsRefusedLocally(t *testing.T) {
	is := is.New(t)
	a, c := start(t, nil)
	m := msg(time.Now().Add(-time.Second))
	is.Equal(send(c, m, time.Second).Detail, "expired")
	m = msg(time.Now().Add(time.Hour))
	m.To = "not-hex"
	is.Equal(send(c, m, time.Second).Outcome, delivery.OutcomeRejected)
	is.Equal(a.Sends(ref), 0)
}

// Neither the key nor a provider token shows in an observation or a key error.
func TestAPNsRedaction(t *testing.T) {
	is := is.New(t)
	a, c := start(t, nil)
	var details []string
	for _, st := range []int{400, 403, 429, 500} {
		a.ScriptSend(ref, fakes.Step{Status: st})
		details = append(details, send(c, msg(time.Now().Add(time.Hour)), 5*time.Second).Detail)
	}
	p8 := string(a.KeyP8())
	_, err := apns.ParseKey([]byte(strings.Replace(p8, "MIG", "XXX", 1)))
	is.True(err != nil)
	details = append(details, err.Error())
	body := strings.Split(p8, "\n")[1]
	for _, d := range details {
		is.True(!strings.Contains(d, "eyJ") && !strings.Contains(d, body[:20])) // no JWT, no key
	}
}
