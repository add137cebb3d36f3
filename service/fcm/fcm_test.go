package fcm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/fcm"
)

const ref = "0b6a4e4e-8c47-4f43-9d1c-1f2e3d4c5b6a"

func start(t *testing.T) (*fakes.FCM, *fcm.Client) {
	t.Helper()
	f := fakes.StartFCM("demo-project")
	t.Cleanup(f.Close)
	return f, client(t, f, fcm.Options{})
}

func client(t *testing.T, f *fakes.FCM, opt fcm.Options) *fcm.Client {
	t.Helper()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, f.CertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	sa, err := fcm.ParseServiceAccount(f.ServiceAccountJSON())
	if err != nil {
		t.Fatal(err)
	}
	opt.Account, opt.Endpoint, opt.CAFile = sa, f.URL(), ca
	c, err := fcm.New(opt)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func msg(to string) delivery.Message {
	return delivery.Message{Ref: ref, IdempotencyKey: delivery.IdempotencyKey(ref), To: to, Body: "Your order has shipped",
		ExpiresAt: time.Now().Add(time.Hour), Action: delivery.ActionSend}
}

func send(c *fcm.Client, m delivery.Message, timeout time.Duration) delivery.Observation {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Send(ctx, m)
}

func TestFCMAccept(t *testing.T) {
	is := is.New(t)
	f, c := start(t)
	obs := send(c, msg("device-token-1"), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccepted)
	is.True(strings.HasPrefix(obs.ProviderMsgID, "projects/demo-project/messages/0:"))
	h, body := f.Last()
	is.True(strings.HasPrefix(h.Get("Authorization"), "Bearer ya29.fake-"))
	var got struct {
		Message struct {
			Token   string            `json:"token"`
			Data    map[string]string `json:"data"`
			Android struct {
				CollapseKey string `json:"collapse_key"`
				TTL         string `json:"ttl"`
			} `json:"android"`
			APNs    struct{ Headers map[string]string } `json:"apns"`
			Webpush struct{ Headers map[string]string } `json:"webpush"`
		} `json:"message"`
	}
	is.NoErr(json.Unmarshal(body, &got))
	is.Equal(got.Message.Token, "device-token-1")
	is.Equal(got.Message.Data["ref"], ref)        // the ref travels with the message
	is.Equal(got.Message.Android.CollapseKey, "") // no collapse key without resend_with_collapse
	_, collapseID := got.Message.APNs.Headers["apns-collapse-id"]
	is.True(!collapseID)
	_, topic := got.Message.Webpush.Headers["Topic"]
	is.True(!topic)
	is.True(got.Message.Android.TTL == "3599s" || got.Message.Android.TTL == "3600s")
	is.Equal(f.TokenRequests(), 1)

	// With resend_with_collapse, every message of the task carries its collapse key.
	c = client(t, f, fcm.Options{Collapse: true})
	is.Equal(send(c, msg("device-token-1"), 5*time.Second).Outcome, delivery.OutcomeAccepted)
	_, body = f.Last()
	is.NoErr(json.Unmarshal(body, &got))
	is.Equal(got.Message.Android.CollapseKey, "ntf-"+ref) // one collapse key per task
	is.Equal(got.Message.APNs.Headers["apns-collapse-id"], "ntf-"+ref)
	is.Equal(len(got.Message.Webpush.Headers["Topic"]), 32)
}

// taskMsg is a message of the i-th task to one device.
func taskMsg(i int, to string) delivery.Message {
	m := msg(to)
	m.Ref = fmt.Sprintf("0b6a4e4e-8c47-4f43-9d1c-%012d", i)
	m.IdempotencyKey = delivery.IdempotencyKey(m.Ref)
	return m
}

// Six tasks to one offline device: without resend_with_collapse FCM stores all six (it stores up to
// 100 non-collapsible messages), and the device receives them when it comes online. Collapse keys
// would keep four of them: FCM stores at most four collapse keys per device.
func TestFCMOfflineDeviceKeepsEveryTask(t *testing.T) {
	is := is.New(t)
	f, c := start(t)
	for i := range 6 {
		is.Equal(send(c, taskMsg(i, "offline-device"), 5*time.Second).Outcome, delivery.OutcomeAccepted)
	}
	is.Equal(len(f.Stored("offline-device")), 6) // all six kept
	f.Online("offline-device")
	is.Equal(len(f.Received("offline-device")), 6) // and received

	collapsing := client(t, f, fcm.Options{Collapse: true})
	for i := range 6 {
		is.Equal(send(collapsing, taskMsg(i, "second-device"), 5*time.Second).Outcome, delivery.OutcomeAccepted)
	}
	is.Equal(len(f.Stored("second-device")), fakes.FCMCollapseKeys) // what resend_with_collapse costs
}

// One token serves many sends; a token about to expire is replaced before it is used.
func TestFCMTokenReuse(t *testing.T) {
	is := is.New(t)
	f, c := start(t)
	for range 3 {
		is.Equal(send(c, msg("d"), 5*time.Second).Outcome, delivery.OutcomeAccepted)
	}
	is.Equal(f.TokenRequests(), 1)
	f.SetTokenLifetime(2 * time.Minute) // inside the five-minute margin: refreshed on every send
	f.RevokeTokens()
	is.Equal(send(c, msg("d"), 5*time.Second).Outcome, delivery.OutcomeAccountRefused) // the revoked token: 401
	is.Equal(send(c, msg("d"), 5*time.Second).Outcome, delivery.OutcomeAccepted)       // dropped after the 401, fetched anew
	is.Equal(send(c, msg("d"), 5*time.Second).Outcome, delivery.OutcomeAccepted)
	is.Equal(f.TokenRequests(), 3)
	is.Equal(f.Sends(ref), 6) // one request per send, token fetches aside
}

func TestFCMUnregistered(t *testing.T) {
	is := is.New(t)
	f, c := start(t)
	f.Unregister("gone-token")
	obs := send(c, msg("gone-token"), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected)
	is.True(obs.Unregistered)
	is.True(strings.Contains(obs.Detail, "UNREGISTERED"))
	is.Equal(f.Sends(ref), 1)
}

func TestFCMErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		status      int
		outcome     delivery.Outcome
		retryAfter  time.Duration
		detail      string
		unregistred bool
	}{
		{400, delivery.OutcomeRejected, 0, "INVALID_ARGUMENT", false},
		{401, delivery.OutcomeAccountRefused, 0, "credential", false},
		{403, delivery.OutcomeRejected, 0, "another sender", false},
		{404, delivery.OutcomeRejected, 0, "UNREGISTERED", true},
		{429, delivery.OutcomeThrottled, 7 * time.Second, "QUOTA_EXCEEDED", false},
		{500, delivery.OutcomeHTTP5xx, 7 * time.Second, "may be on its way", false}, // uncertain by the kind's contract
		{503, delivery.OutcomeHTTP5xx, 7 * time.Second, "UNAVAILABLE", false},
	} {
		t.Run(http.StatusText(tc.status), func(t *testing.T) {
			is := is.New(t)
			f, c := start(t)
			f.ScriptSend(ref, fakes.Step{Status: tc.status, RetryAfter: "7"})
			obs := send(c, msg("d"), 5*time.Second)
			is.Equal(obs.Outcome, tc.outcome)
			is.Equal(obs.RetryAfter, tc.retryAfter)
			is.True(strings.Contains(obs.Detail, tc.detail)) // names FCM's code
			is.Equal(obs.Unregistered, tc.unregistred)
			is.Equal(f.Sends(ref), 1)
		})
	}
	// A 404 without FCM's UNREGISTERED (a wrong project) says nothing about the token.
	obs := fcm.Classify(404, http.Header{}, []byte(`{"error":{"code":404,"status":"NOT_FOUND","message":"Requested entity was not found."}}`))
	if obs.Outcome != delivery.OutcomeRejected || obs.Unregistered {
		t.Fatalf("plain 404: %+v", obs)
	}
}

// A refused service account is a credential error and nothing reaches FCM; a token endpoint that does
// not answer is CONNECT_FAILED (nothing sent, retried by the backoff), within the token timeout, after
// one token request.
func TestFCMTokenFailures(t *testing.T) {
	is := is.New(t)
	f := fakes.StartFCM("demo-project")
	t.Cleanup(f.Close)
	c := client(t, f, fcm.Options{TokenTimeout: 300 * time.Millisecond})
	f.ScriptToken(fakes.Step{Status: 400})
	obs := send(c, msg("d"), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccountRefused) // a revoked key: the operator's to fix
	is.True(strings.Contains(obs.Detail, "credential") && strings.Contains(obs.Detail, "invalid_grant"))
	f.ScriptToken(fakes.Step{Hang: true})
	obs = send(c, msg("d"), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeConnectFailed)
	f.ScriptToken(fakes.Step{Drop: true})
	obs = send(c, msg("d"), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeConnectFailed)
	f.ScriptToken(fakes.Step{Status: 503})
	is.Equal(send(c, msg("d"), 5*time.Second).Outcome, delivery.OutcomeConnectFailed)
	is.Equal(f.TokenRequests(), 4) // each failure one request: the dropped one was not resent
	is.Equal(f.Sends(ref), 0)      // and no send went out without a token
	is.Equal(send(c, msg("d"), 5*time.Second).Outcome, delivery.OutcomeAccepted)
}

// Accepted, then the answer is lost: uncertain, and the transport sends nothing again (over HTTP/2,
// where a stream reset would otherwise invite a resend).
func TestFCMLostAnswer(t *testing.T) {
	is := is.New(t)
	f, c := start(t)
	is.Equal(send(c, msg("d"), 5*time.Second).Outcome, delivery.OutcomeAccepted) // a kept-alive connection
	conns := f.Conns()
	f.ScriptSend(ref, fakes.Step{Drop: true})
	obs := send(c, msg("d"), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeIOError)
	is.Equal(f.Sends(ref), 2) // the reset stream was not retried
	is.Equal(f.Conns(), conns)
	f.ScriptSend(ref, fakes.Step{Delay: 2 * time.Second})
	is.Equal(send(c, msg("d"), 300*time.Millisecond).Outcome, delivery.OutcomeTimeout)
	is.Equal(f.Sends(ref), 3)
}

// A resend with the collapse key replaces the undelivered copy; once delivered, a resend is a second copy.
func TestFCMCollapseResend(t *testing.T) {
	is := is.New(t)
	f := fakes.StartFCM("demo-project")
	t.Cleanup(f.Close)
	c := client(t, f, fcm.Options{Collapse: true})
	f.ScriptSend(ref, fakes.Step{Delay: 2 * time.Second})
	is.Equal(send(c, msg("d"), 300*time.Millisecond).Outcome, delivery.OutcomeTimeout)
	m := msg("d")
	m.Action = delivery.ActionTopicResend
	is.Equal(send(c, m, 5*time.Second).Outcome, delivery.OutcomeAccepted)
	is.Equal(f.Outbound(ref), 1) // collapsed
	f.Deliver()
	is.Equal(send(c, m, 5*time.Second).Outcome, delivery.OutcomeAccepted)
	is.Equal(f.Outbound(ref), 2)
}

// Neither the key nor an access token shows in an observation or a key-file error.
func TestFCMRedaction(t *testing.T) {
	is := is.New(t)
	f, c := start(t)
	var details []string
	for _, st := range []int{400, 401, 403, 500} {
		f.ScriptSend(ref, fakes.Step{Status: st})
		details = append(details, send(c, msg("d"), 5*time.Second).Detail)
	}
	f.ScriptToken(fakes.Step{Status: 400})
	f.RevokeTokens()
	details = append(details, send(c, msg("d"), 5*time.Second).Detail, send(c, msg("d"), 5*time.Second).Detail)
	bad := strings.Replace(string(f.ServiceAccountJSON()), `"service_account"`, `"user"`, 1)
	_, err := fcm.ParseServiceAccount([]byte(bad))
	is.True(err != nil)
	details = append(details, err.Error())
	_, err = fcm.ParseServiceAccount([]byte(bad[:len(bad)/2]))
	details = append(details, err.Error())
	for _, d := range details {
		is.True(!strings.Contains(d, "PRIVATE KEY") && !strings.Contains(d, "ya29.")) // no key, no token
	}
}

// The mapping of FCM's errors (https://firebase.google.com/docs/reference/fcm/rest/v1/ErrorCode):
// states of our account are ACCOUNT_REFUSED, a bad registration token is unregistered, the rest of
// INVALID_ARGUMENT and SENDER_ID_MISMATCH stay the task's own refusal.
func TestFCMClassify(t *testing.T) {
	fcmErr := func(status int, rpc, code, message, details string) []byte {
		d := `{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"` + code + `"}`
		if details != "" {
			d += "," + details
		}
		return []byte(fmt.Sprintf(`{"error":{"code":%d,"message":%q,"status":%q,"details":[%s]}}`, status, message, rpc, d))
	}
	violation := func(field string) string {
		return `{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"` + field + `","description":"x"}]}`
	}
	for _, tc := range []struct {
		name         string
		status       int
		body         []byte
		outcome      delivery.Outcome
		unregistered bool
		detail       string
	}{
		{"unauthenticated", 401, []byte(`{"error":{"code":401,"message":"Request had invalid authentication credentials.","status":"UNAUTHENTICATED"}}`),
			delivery.OutcomeAccountRefused, false, "access token"},
		{"third party auth", 401, fcmErr(401, "UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR", "Auth error from APNS or Web Push Service", ""),
			delivery.OutcomeAccountRefused, false, "APNs certificate or web push key"},
		{"permission denied", 403, []byte(`{"error":{"code":403,"message":"Permission 'cloudmessaging.messages.create' denied","status":"PERMISSION_DENIED"}}`),
			delivery.OutcomeAccountRefused, false, "may not send"},
		{"sender id mismatch", 403, fcmErr(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH", "SenderId mismatch", ""),
			delivery.OutcomeRejected, false, "another sender"},
		{"invalid token (FCM's example)", 400, fcmErr(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "The registration token is not a valid FCM registration token", ""),
			delivery.OutcomeRejected, true, "not a valid FCM registration token"},
		{"invalid token (field)", 400, fcmErr(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "Invalid value", violation("message.token")),
			delivery.OutcomeRejected, true, "not a valid FCM registration token"},
		{"invalid data value", 400, fcmErr(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "Invalid value at 'message.data[0].value' (TYPE_STRING), 12", violation("message.data[0].value")),
			delivery.OutcomeRejected, false, "INVALID_ARGUMENT"},
		{"message too big", 400, fcmErr(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "Message is too big", ""),
			delivery.OutcomeRejected, false, "INVALID_ARGUMENT"},
		{"internal", 500, fcmErr(500, "INTERNAL", "INTERNAL", "Internal error", ""), delivery.OutcomeHTTP5xx, false, "may be on its way"},
		{"unavailable", 503, fcmErr(503, "UNAVAILABLE", "UNAVAILABLE", "The service is currently unavailable.", ""), delivery.OutcomeHTTP5xx, false, "may be on its way"},
		{"quota", 429, fcmErr(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED", "Quota exceeded", ""), delivery.OutcomeThrottled, false, "QUOTA_EXCEEDED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			obs := fcm.Classify(tc.status, http.Header{}, tc.body)
			is.Equal(obs.Outcome, tc.outcome)
			is.Equal(obs.Unregistered, tc.unregistered)
			is.True(strings.Contains(obs.Detail, tc.detail)) // names the cause
		})
	}
}

// A registration token FCM calls invalid is gone for good, as an UNREGISTERED one is.
func TestFCMInvalidToken(t *testing.T) {
	is := is.New(t)
	f, c := start(t)
	f.Invalid("truncated-token")
	obs := send(c, msg("truncated-token"), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected)
	is.True(obs.Unregistered)
	is.Equal(f.Sends(ref), 1)
}

// After a 401 the cached access token is dropped: the next call (the paused channel's probe) carries a
// new one, and a 401 that persists is ACCOUNT_REFUSED, never a task's failure.
func TestFCMTokenRefreshAfterUnauthenticated(t *testing.T) {
	is := is.New(t)
	f, c := start(t)
	is.Equal(send(c, msg("d"), 5*time.Second).Outcome, delivery.OutcomeAccepted)
	h, _ := f.Last()
	first := h.Get("Authorization")
	f.RevokeTokens() // the access token no longer works (a rotated key, a revoked token)
	obs := send(c, msg("d"), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccountRefused)
	is.True(strings.Contains(obs.Detail, "credential"))
	is.True(!strings.Contains(obs.Detail, "ya29.")) // never the token
	is.Equal(send(c, msg("d"), 5*time.Second).Outcome, delivery.OutcomeAccepted)
	h, _ = f.Last()
	is.True(h.Get("Authorization") != first) // a new token
	is.Equal(f.TokenRequests(), 2)
}

// The fake stores what FCM documents for an offline device: 100 non-collapsible messages, and one
// more discards them all (the device is told when it comes online).
func TestFCMFakeStoredLimit(t *testing.T) {
	is := is.New(t)
	f, c := start(t)
	for i := range fakes.FCMStoredLimit {
		is.Equal(send(c, taskMsg(i, "offline-device"), 5*time.Second).Outcome, delivery.OutcomeAccepted)
	}
	is.Equal(len(f.Stored("offline-device")), fakes.FCMStoredLimit)
	is.Equal(send(c, taskMsg(fakes.FCMStoredLimit, "offline-device"), 5*time.Second).Outcome, delivery.OutcomeAccepted)
	is.Equal(len(f.Stored("offline-device")), 0) // all discarded
	is.Equal(f.DeletedNotices("offline-device"), 1)
}
