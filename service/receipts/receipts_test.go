package receipts_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/receipts"
	"github.com/notifierhq/notifier/service/webhook"
)

// The Standard Webhooks specification's published test vector (testdata/vectors/standard-webhooks.json):
// any receiver of the specification must accept it.
var spec = func() (v struct {
	Secret    string `json:"secret"`
	ID        string `json:"id"`
	Timestamp int64  `json:"timestamp"`
	Body      string `json:"body"`
	Signature string `json:"signature"`
}) {
	readVector("standard-webhooks.json", &v)
	return v
}()

var (
	specSecret, specID, specTimestamp = spec.Secret, spec.ID, spec.Timestamp
	specBody, specSignature           = spec.Body, spec.Signature
)

// readVector reads a published test vector from testdata/vectors.
func readVector(name string, v any) {
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "vectors", name))
	if err == nil {
		err = json.Unmarshal(data, v)
	}
	if err != nil {
		panic(err)
	}
}

func specKey(t *testing.T) []byte {
	t.Helper()
	key, err := webhook.ParseSecret(specSecret)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func swHeader(id string, ts int64, sig string) http.Header {
	h := http.Header{}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	h.Set("webhook-signature", sig)
	return h
}

func TestStandardWebhooksSpecVector(t *testing.T) {
	is := is.New(t)
	key := specKey(t)
	at := time.Unix(specTimestamp, 0)
	id, ts, err := receipts.VerifyStandardWebhook([][]byte{key}, swHeader(specID, specTimestamp, specSignature), []byte(specBody), at, receipts.DefaultTolerance)
	is.NoErr(err)         // the specification's vector verifies
	is.Equal(id, specID)  // the event id is the message id
	is.True(ts.Equal(at)) // at the signed time
	other := [][]byte{[]byte("another key, from before a rotation"), key}
	_, _, err = receipts.VerifyStandardWebhook(other, swHeader(specID, specTimestamp, "v1,bm90IGl0 "+specSignature), []byte(specBody), at, receipts.DefaultTolerance)
	is.NoErr(err) // any listed signature by any key passes (key rotation)

	for name, c := range map[string]struct {
		header http.Header
		body   string
		now    time.Time
	}{
		"tampered body":       {swHeader(specID, specTimestamp, specSignature), `{"test": 2432232315}`, at},
		"other id":            {swHeader("msg_other", specTimestamp, specSignature), specBody, at},
		"no signature":        {swHeader(specID, specTimestamp, ""), specBody, at},
		"v2 scheme only":      {swHeader(specID, specTimestamp, strings.Replace(specSignature, "v1,", "v2,", 1)), specBody, at},
		"stale: 6 min old":    {swHeader(specID, specTimestamp, specSignature), specBody, at.Add(6 * time.Minute)},
		"from 6 min ahead":    {swHeader(specID, specTimestamp, specSignature), specBody, at.Add(-6 * time.Minute)},
		"timestamp not a int": {http.Header{"Webhook-Id": {specID}, "Webhook-Timestamp": {"soon"}, "Webhook-Signature": {specSignature}}, specBody, at},
	} {
		_, _, err := receipts.VerifyStandardWebhook([][]byte{key}, c.header, []byte(c.body), c.now, receipts.DefaultTolerance)
		if err == nil {
			t.Errorf("%s: verified", name)
		}
	}
}

// Twilio's published validator vector (its libraries' tests and documentation;
// testdata/vectors/twilio.json).
func TestTwilioSignatureVector(t *testing.T) {
	is := is.New(t)
	var v struct {
		AuthToken string            `json:"auth_token"`
		URL       string            `json:"url"`
		Params    map[string]string `json:"params"`
		Signature string            `json:"signature"`
	}
	readVector("twilio.json", &v)
	params := url.Values{}
	for k, val := range v.Params {
		params.Set(k, val)
	}
	is.Equal(receipts.TwilioSignature(v.AuthToken, v.URL, params), v.Signature) // the published signature
	is.True(receipts.VerifyTwilio(v.AuthToken, v.URL, params, v.Signature))
	withPort := strings.Replace(v.URL, "https://mycompany.com/", "https://mycompany.com:443/", 1)
	is.True(withPort != v.URL)                                                   // (the vector's host, with the default port)
	is.True(receipts.VerifyTwilio(v.AuthToken, withPort, params, v.Signature))   // with the default port
	is.True(!receipts.VerifyTwilio(v.AuthToken+"6", v.URL, params, v.Signature)) // another token
	params.Set("Digits", "1235")
	is.True(!receipts.VerifyTwilio(v.AuthToken, v.URL, params, v.Signature)) // a changed parameter
}

func TestParseTwilio(t *testing.T) {
	is := is.New(t)
	for status, want := range map[string]delivery.ReceiptKind{
		"queued": delivery.ReceiptAccepted, "sent": delivery.ReceiptAccepted, "delivered": delivery.ReceiptDelivered,
		"read": delivery.ReceiptDelivered, "undelivered": delivery.ReceiptUndelivered, "failed": delivery.ReceiptUndelivered,
		"partially_delivered": delivery.ReceiptAccepted, // Twilio had the message: accepted, never written off
	} {
		r, err := receipts.ParseTwilio(url.Values{"MessageSid": {"SM1"}, "MessageStatus": {status}}, "ntf-task-7")
		is.NoErr(err)
		is.Equal(r.Kind, want)             // the status's kind
		is.Equal(r.Ref, "task-7")          // our reference, without the key prefix
		is.Equal(r.EventID, "SM1:"+status) // one event per message and status
		is.Equal(r.ProviderMsgID, "SM1")   // and the provider's id
	}
	r, err := receipts.ParseTwilio(url.Values{"MessageSid": {"SM1"}, "MessageStatus": {"undelivered"}, "ErrorCode": {"30005"}}, "")
	is.NoErr(err)
	is.Equal(r.Kind, delivery.ReceiptBounced) // an unknown handset: a hard bounce
	is.True(r.HardBounce)
	_, err = receipts.ParseTwilio(url.Values{"MessageSid": {"SM1"}, "MessageStatus": {"exploded"}}, "")
	is.True(err != nil) // an unknown status is refused
	_, err = receipts.ParseTwilio(url.Values{"MessageSid": {"SM1"}, "MessageStatus": {"sent"}}, "task 7/../x")
	is.True(err != nil) // so is a reference that cannot be ours
}

// fakeRecorder records what the handler passes on and answers what the test says.
type fakeRecorder struct {
	mu       sync.Mutex
	got      []delivery.Receipt
	answer   delivery.ReceiptResult
	err      error
	disabled []bool
}

func (f *fakeRecorder) RecordReceipt(_ context.Context, r delivery.Receipt, disable bool) (delivery.ReceiptResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, r)
	f.disabled = append(f.disabled, disable)
	return f.answer, f.err
}

type counted struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counted) add(source, result string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[source+" "+result]++
}

// Every refusal is a clear 4xx, nothing reaches the recorder, and each is counted.
func TestHandlerRefusesUnverifiedCallbacks(t *testing.T) {
	is := is.New(t)
	key := specKey(t)
	now := time.Unix(1_800_000_000, 0)
	rec := &fakeRecorder{answer: delivery.ReceiptResult{TaskID: 42, Effect: delivery.ReceiptSettled, State: delivery.StateSent}}
	counts := &counted{n: map[string]int{}}
	h := receipts.NewHandler(rec, receipts.Config{WebhookKeys: [][]byte{key}, TwilioAuthToken: "tok",
		PublicURL: &url.URL{Scheme: "https", Host: "receipts.example"}, Now: func() time.Time { return now },
		OnResult: counts.add, DisableOnBounce: true})
	body := `{"type":"message.bounced","timestamp":"2027-01-15T08:00:00Z","data":{"ref":"ntf-task-42","bounce":"hard"}}`
	signed := func(body string, ts time.Time) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/receipts/standard-webhooks", strings.NewReader(body))
		sig := webhook.Sign(key, "msg_1", ts.Unix(), []byte(body))
		for k, v := range swHeader("msg_1", ts.Unix(), sig) {
			r.Header[k] = v
		}
		return r
	}
	do := func(r *http.Request) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}

	w := do(signed(body, now))
	is.Equal(w.Code, http.StatusOK) // a signed receipt is recorded
	is.Equal(len(rec.got), 1)
	is.Equal(rec.got[0], delivery.Receipt{Source: delivery.ReceiptSourceStandardWebhooks, EventID: "msg_1",
		Kind: delivery.ReceiptBounced, HardBounce: true, Ref: "task-42", OccurredAt: time.Date(2027, 1, 15, 8, 0, 0, 0, time.UTC)})
	is.True(rec.disabled[0]) // with --disable-on-bounce passed on
	is.True(strings.Contains(w.Body.String(), `"result":"settled"`))

	tampered := signed(body, now)
	tampered.Body = http.NoBody
	for name, c := range map[string]struct {
		r      *http.Request
		status int
	}{
		"bad signature":   {func() *http.Request { r := signed(body, now); r.Header.Set("webhook-signature", "v1,AAAA"); return r }(), 401},
		"stale timestamp": {signed(body, now.Add(-10*time.Minute)), 401},
		"body changed":    {tampered, 401},
		"oversized":       {signed(`{"type":"message.sent","data":{"ref":"ntf-task-1","detail":"`+strings.Repeat("x", receipts.MaxBodyBytes)+`"}}`, now), 413},
		"unknown type":    {signed(`{"type":"message.opened","data":{"ref":"ntf-task-1"}}`, now), 400},
		"not JSON":        {signed(`hello`, now), 400},
		"foreign ref":     {signed(`{"type":"message.sent","data":{"ref":"order-1"}}`, now), 400},
		"twilio unsigned": {httptest.NewRequest(http.MethodPost, "/receipts/twilio?ref=ntf-task-1", strings.NewReader("MessageSid=SM1&MessageStatus=sent")), 401},
		"wrong method":    {httptest.NewRequest(http.MethodGet, "/receipts/standard-webhooks", nil), 405},
	} {
		w := do(c.r)
		if w.Code != c.status {
			t.Errorf("%s: status %d, want %d (%s)", name, w.Code, c.status, w.Body)
		}
	}
	is.Equal(len(rec.got), 1) // no refused callback reached the recorder: nothing written

	rec.err = delivery.ErrUnknownReference
	w = do(signed(body, now))
	is.Equal(w.Code, http.StatusNotFound) // a reference no task has
	rec.err = nil
	rec.answer = delivery.ReceiptResult{TaskID: 42, Duplicate: true}
	w = do(signed(body, now))
	is.Equal(w.Code, http.StatusOK) // a replayed event is answered, and changes nothing
	is.True(strings.Contains(w.Body.String(), `"result":"duplicate"`))

	is.Equal(counts.n["standard-webhooks bad_signature"], 2) // counted by why
	is.Equal(counts.n["standard-webhooks stale"], 1)
	is.Equal(counts.n["standard-webhooks too_large"], 1)
	is.Equal(counts.n["standard-webhooks unknown_type"], 1)
	is.Equal(counts.n["standard-webhooks unknown_reference"], 1)
	is.Equal(counts.n["standard-webhooks duplicate"], 1)
	is.Equal(counts.n["twilio bad_signature"], 1)
}

// A parameter Twilio repeats: the signature covers the parameters sorted by name and, for a repeated
// name, its distinct values sorted (Twilio's validators, twilio-node toFormUrlEncodedParam), whatever
// the order on the wire. The string signed is spelt out here, apart from both signers.
func TestTwilioSignatureRepeatedValues(t *testing.T) {
	is := is.New(t)
	const token, callback = "tok", "https://receipts.example/receipts/twilio?ref=ntf-task-9"
	body := "MessageStatus=partially_delivered&MessageSid=SM9&Tag=b&AccountSid=AC1&Tag=a&Tag=b"
	form, err := url.ParseQuery(body)
	is.NoErr(err)
	mac := hmac.New(sha1.New, []byte(token))
	mac.Write([]byte(callback + "AccountSidAC1" + "MessageSidSM9" + "MessageStatuspartially_delivered" + "Taga" + "Tagb"))
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	is.Equal(fakes.TwilioSignature(token, callback, form), want)    // the fake signs as Twilio does
	is.Equal(receipts.TwilioSignature(token, callback, form), want) // and the receiver computes the same
	is.True(receipts.VerifyTwilio(token, callback, form, want))

	rec := &fakeRecorder{answer: delivery.ReceiptResult{TaskID: 9, Effect: delivery.ReceiptNoted, State: delivery.StateSending}}
	h := receipts.NewHandler(rec, receipts.Config{TwilioAuthToken: token, PublicURL: &url.URL{Scheme: "https", Host: "receipts.example"}})
	r := httptest.NewRequest(http.MethodPost, "/receipts/twilio?ref=ntf-task-9", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("X-Twilio-Signature", want)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	is.Equal(w.Code, http.StatusOK) // verified, and partially_delivered accepted
	is.Equal(rec.got[0].Kind, delivery.ReceiptAccepted)
	is.Equal(rec.got[0].Ref, "task-9")
}

// A Twilio callback signed for the public URL the receiver is told (it sits behind a proxy).
func TestHandlerTwilio(t *testing.T) {
	is := is.New(t)
	rec := &fakeRecorder{answer: delivery.ReceiptResult{TaskID: 9, Effect: delivery.ReceiptNoted, State: delivery.StateSending}}
	h := receipts.NewHandler(rec, receipts.Config{TwilioAuthToken: "tok", PublicURL: &url.URL{Scheme: "https", Host: "receipts.example"}})
	form := url.Values{"MessageSid": {"SM9"}, "MessageStatus": {"delivered"}, "AccountSid": {"AC1"}}
	r := httptest.NewRequest(http.MethodPost, "/receipts/twilio?ref=ntf-task-9", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("X-Twilio-Signature", receipts.TwilioSignature("tok", "https://receipts.example/receipts/twilio?ref=ntf-task-9", form))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	is.Equal(w.Code, http.StatusOK) // verified against the public URL
	is.Equal(rec.got[0].Ref, "task-9")
	is.Equal(rec.got[0].Kind, delivery.ReceiptDelivered)
	is.True(strings.Contains(w.Body.String(), `"result":"noted"`))
}

// svixHeader is swHeader under Svix's names, as Resend sends its webhooks.
func svixHeader(id string, ts int64, sig string) http.Header {
	h := http.Header{}
	h.Set("svix-id", id)
	h.Set("svix-timestamp", strconv.FormatInt(ts, 10))
	h.Set("svix-signature", sig)
	return h
}

// Svix signs Resend's webhooks with the Standard Webhooks algorithm under svix-* header names: the
// specification's vector under those names verifies; a mix of the two namings does not.
func TestStandardWebhooksSvixHeaders(t *testing.T) {
	is := is.New(t)
	key := specKey(t)
	at := time.Unix(specTimestamp, 0)
	id, ts, err := receipts.VerifyStandardWebhook([][]byte{key}, svixHeader(specID, specTimestamp, specSignature), []byte(specBody), at, receipts.DefaultTolerance)
	is.NoErr(err) // svix-id, svix-timestamp, svix-signature
	is.Equal(id, specID)
	is.True(ts.Equal(at))
	_, _, err = receipts.VerifyStandardWebhook([][]byte{key}, svixHeader(specID, specTimestamp, "v1,AAAA"), []byte(specBody), at, receipts.DefaultTolerance)
	is.True(err != nil) // a wrong signature under svix-* is refused like one under webhook-*
	mixed := swHeader(specID, specTimestamp, "")
	mixed.Del("webhook-signature")
	mixed.Set("svix-signature", specSignature)
	_, _, err = receipts.VerifyStandardWebhook([][]byte{key}, mixed, []byte(specBody), at, receipts.DefaultTolerance)
	is.True(err != nil) // never half of each
}

// A Resend webhook, signed by Svix with the endpoint's whsec_ secret, settles the task its tag names:
// the receipt path of a Resend task parked after its key window.
func TestHandlerResendWebhook(t *testing.T) {
	is := is.New(t)
	key := specKey(t)
	now := time.Unix(1_800_000_000, 0)
	rec := &fakeRecorder{answer: delivery.ReceiptResult{TaskID: 42, Effect: delivery.ReceiptSettled, State: delivery.StateSent}}
	h := receipts.NewHandler(rec, receipts.Config{WebhookKeys: [][]byte{key}, Now: func() time.Time { return now }})
	body := `{"type":"email.delivered","created_at":"2027-01-15T08:00:00.126Z","data":{"created_at":"2027-01-15T07:59:59.894719+00:00",` +
		`"email_id":"56761188-7520-42d8-8898-ff6fc54ce618","from":"Acme <noreply@example.com>","to":["ada@example.com"],` +
		`"subject":"Your order shipped","tags":{"notifier_ref":"ntf-task-42"}}}`
	r := httptest.NewRequest(http.MethodPost, "/receipts/standard-webhooks", strings.NewReader(body))
	for k, v := range svixHeader("msg_2Lh9KRb0pzN4LePd3XjFuaA", now.Unix(), webhook.Sign(key, "msg_2Lh9KRb0pzN4LePd3XjFuaA", now.Unix(), []byte(body))) {
		r.Header[k] = v
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	is.Equal(w.Code, http.StatusOK) // verified and recorded
	is.Equal(len(rec.got), 1)
	is.Equal(rec.got[0], delivery.Receipt{Source: delivery.ReceiptSourceStandardWebhooks, EventID: "msg_2Lh9KRb0pzN4LePd3XjFuaA",
		Kind: delivery.ReceiptDelivered, Ref: "task-42", ProviderMsgID: "56761188-7520-42d8-8898-ff6fc54ce618",
		OccurredAt: time.Date(2027, 1, 15, 8, 0, 0, 126_000_000, time.UTC), Detail: "Resend email.delivered"})
}

// Resend's event types as receipts; tags as an object or a list; opens and clicks are no receipt.
func TestParseResend(t *testing.T) {
	for _, tc := range []struct {
		body string
		kind delivery.ReceiptKind
		hard bool
		ref  string
	}{
		{`{"type":"email.sent","data":{"email_id":"e1","tags":{"notifier_ref":"task-7"}}}`, delivery.ReceiptAccepted, false, "task-7"},
		{`{"type":"email.delivery_delayed","data":{"email_id":"e1"}}`, delivery.ReceiptAccepted, false, ""},
		{`{"type":"email.bounced","data":{"email_id":"e1","tags":[{"name":"notifier_ref","value":"ntf-task-7"}]}}`, delivery.ReceiptBounced, true, "task-7"},
		{`{"type":"email.complained","data":{"email_id":"e1"}}`, delivery.ReceiptComplained, false, ""},
		{`{"type":"email.failed","data":{"email_id":"e1"}}`, delivery.ReceiptUndelivered, false, ""},
	} {
		t.Run(tc.body, func(t *testing.T) {
			is := is.New(t)
			rec, err := receipts.ParseStandardWebhook([]byte(tc.body))
			is.NoErr(err)
			is.Equal(rec.Kind, tc.kind)
			is.Equal(rec.HardBounce, tc.hard) // email.bounced: "permanently rejected"
			is.Equal(rec.Ref, tc.ref)
			is.Equal(rec.ProviderMsgID, "e1")
		})
	}
	for _, body := range []string{
		`{"type":"email.opened","data":{"email_id":"e1"}}`,
		`{"type":"email.sent","data":{}}`,
		`{"type":"email.sent","data":{"email_id":"e1","tags":{"notifier_ref":"order-1"}}}`,
	} {
		_, err := receipts.ParseStandardWebhook([]byte(body))
		if err == nil {
			t.Errorf("%s: accepted", body)
		}
	}
}
