package receipts_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/receipts"
)

const (
	sesTopic   = "arn:aws:sns:eu-west-1:123456789012:notifier-ses-events"
	sesMsgID   = "0100018c6f3a2b1c-5e4d3c2b-1a09-4f8e-9d7c-6b5a4f3e2d1c-000000"
	sesTestRef = "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b9a"
)

func startSNS(t *testing.T) *fakes.SNS {
	f := fakes.StartSNS("eu-west-1")
	t.Cleanup(f.Close)
	return f
}

// sesHandler serves /receipts/ses for sesTopic, fetching through the fake in process.
func sesHandler(f *fakes.SNS, rec receipts.Recorder, counts *counted) *receipts.Handler {
	cfg := receipts.Config{SES: receipts.SESConfig{TopicARNs: []string{sesTopic}, Fetch: f.Fetch}}
	if counts != nil {
		cfg.OnResult = counts.add
	}
	return receipts.NewHandler(rec, cfg)
}

func postSNS(h http.Handler, body []byte) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/receipts/ses", bytes.NewReader(body))
	r.Header.Set("Content-Type", "text/plain; charset=UTF-8") // as SNS sends it
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// Both signature versions verify; a changed field, a changed signature or an unknown version does not,
// and nothing is recorded then. The certificate is fetched once and cached.
func TestSESSignature(t *testing.T) {
	is := is.New(t)
	f := startSNS(t)
	rec := &fakeRecorder{answer: delivery.ReceiptResult{TaskID: 7, Effect: delivery.ReceiptSettled, State: delivery.StateSent}}
	counts := &counted{n: map[string]int{}}
	h := sesHandler(f, rec, counts)
	event := fakes.SESEvent{EventType: "Delivery", MessageID: sesMsgID, Ref: sesTestRef}.JSON()
	for _, version := range []int{1, 2} {
		w := postSNS(h, f.Notification(sesTopic, event, version).JSON())
		is.Equal(w.Code, http.StatusOK) // SignatureVersion 1 (SHA1withRSA) and 2 (SHA256withRSA)
	}
	is.Equal(len(rec.got), 2)
	is.Equal(len(f.Fetches()), 1) // the certificate, once: cached by URL

	forge := map[string]func(fakes.SNSMessage){
		"message changed":     func(m fakes.SNSMessage) { m["Message"] = strings.Replace(m["Message"], "Delivery", "Bounce", 1) },
		"message padded":      func(m fakes.SNSMessage) { m["Message"] += " " },
		"subject added":       func(m fakes.SNSMessage) { m["Subject"] = "Amazon SES Email Event Notification" },
		"signature of v1":     func(m fakes.SNSMessage) { m["SignatureVersion"] = "1" },
		"signature garbled":   func(m fakes.SNSMessage) { m["Signature"] = "AAAA" + m["Signature"][4:] },
		"signature not b64":   func(m fakes.SNSMessage) { m["Signature"] = "%%%" },
		"version 3":           func(m fakes.SNSMessage) { m["SignatureVersion"] = "3" },
		"no signature":        func(m fakes.SNSMessage) { delete(m, "Signature") },
		"timestamp changed":   func(m fakes.SNSMessage) { m["Timestamp"] = "2020-01-01T00:00:00.000Z" },
		"message id replayed": func(m fakes.SNSMessage) { m["MessageId"] = "other" },
	}
	for name, change := range forge {
		m := f.Notification(sesTopic, event, 2)
		change(m)
		w := postSNS(h, m.JSON())
		if w.Code != http.StatusUnauthorized && w.Code != http.StatusBadRequest {
			t.Errorf("%s: got %d, want 401 or 400: %s", name, w.Code, w.Body)
		}
	}
	is.Equal(len(rec.got), 2) // nothing more recorded
	is.True(counts.get("ses", "bad_signature") >= len(forge)-1)

	// A Subject that SNS signed verifies.
	m := f.Notification(sesTopic, event, 1)
	m["Subject"] = "Amazon SES Email Event Notification"
	f.Sign(m, 1)
	is.Equal(postSNS(h, m.JSON()).Code, http.StatusOK)
}

// A SigningCertURL that is not https on an SNS host is refused before anything is fetched, and so is
// a message from a topic that is not configured.
func TestSESCertURLAndTopicRefused(t *testing.T) {
	is := is.New(t)
	f := startSNS(t)
	rec := &fakeRecorder{answer: delivery.ReceiptResult{TaskID: 7, Effect: delivery.ReceiptSettled}}
	counts := &counted{n: map[string]int{}}
	h := sesHandler(f, rec, counts)
	event := fakes.SESEvent{EventType: "Delivery", MessageID: sesMsgID, Ref: sesTestRef}.JSON()
	path := strings.TrimPrefix(f.CertURL(), "https://"+f.Host())
	for _, u := range []string{
		"http://sns.eu-west-1.amazonaws.com" + path,              // not https
		"https://sns.evil.com" + path,                            // another host
		"https://sns.evil.com.attacker" + path,                   // a look-alike
		"https://sns.eu-west-1.amazonaws.com.attacker.io" + path, // an SNS host as a prefix
		"https://evil.com/sns.eu-west-1.amazonaws.com" + path,    // in the path
		"https://x@sns.eu-west-1.amazonaws.com" + path,           // with credentials
		"https://sns.eu-west-1.amazonaws.com:8443" + path,        // another port
		"https://s3.eu-west-1.amazonaws.com" + path,              // another AWS service
		"",
	} {
		m := f.Notification(sesTopic, event, 2)
		m["SigningCertURL"] = u // not in the canonical string: the signature still matches
		w := postSNS(h, m.JSON())
		is.Equal(w.Code, http.StatusUnauthorized) // refused
		t.Logf("%q: %s", u, strings.TrimSpace(w.Body.String()))
	}
	is.Equal(counts.get("ses", "bad_cert_url"), 9)
	is.Equal(len(f.Fetches()), 0) // nothing fetched

	w := postSNS(h, f.Notification("arn:aws:sns:eu-west-1:123456789012:someone-else", event, 2).JSON())
	is.Equal(w.Code, http.StatusForbidden) // a foreign topic, though SNS signed it
	is.Equal(counts.get("ses", "foreign_topic"), 1)
	is.Equal(len(rec.got), 0)
	is.Equal(len(f.Fetches()), 0)

	is.Equal(postSNS(h, f.Notification(sesTopic, event, 2).JSON()).Code, http.StatusOK) // the right one passes
}

// A SubscriptionConfirmation of a configured topic is confirmed by GETting its SubscribeURL through the
// fetcher; a foreign topic's, or one whose SubscribeURL is not an SNS host, is not.
func TestSESSubscriptionConfirmation(t *testing.T) {
	is := is.New(t)
	f := startSNS(t)
	rec := &fakeRecorder{}
	counts := &counted{n: map[string]int{}}
	h := sesHandler(f, rec, counts)
	w := postSNS(h, f.SubscriptionConfirmation(sesTopic, 1).JSON())
	is.Equal(w.Code, http.StatusOK)
	is.Equal(f.Confirmed(sesTopic), 1) // confirmed
	is.True(strings.Contains(w.Body.String(), "subscription_confirmed"))
	is.Equal(counts.get("ses", "subscription_confirmed"), 1)

	other := "arn:aws:sns:eu-west-1:123456789012:someone-else"
	is.Equal(postSNS(h, f.SubscriptionConfirmation(other, 2).JSON()).Code, http.StatusForbidden)
	is.Equal(f.Confirmed(other), 0) // never confirmed

	m := f.SubscriptionConfirmation(sesTopic, 2)
	m["SubscribeURL"] = "https://attacker.example/?Action=ConfirmSubscription&Token=x"
	f.Sign(m, 2) // even signed
	is.Equal(postSNS(h, m.JSON()).Code, http.StatusUnauthorized)
	m = f.SubscriptionConfirmation(sesTopic, 2)
	m["Token"] = "forged"
	is.Equal(postSNS(h, m.JSON()).Code, http.StatusUnauthorized) // the Token is signed
	is.Equal(f.Confirmed(sesTopic), 1)
	is.Equal(len(rec.got), 0) // no receipt either way
}

// Each SES event type maps to its receipt; the ref comes from mail.tags.notifier_ref, else the task is
// matched by mail.messageId.
func TestParseSES(t *testing.T) {
	is := is.New(t)
	f := startSNS(t)
	for _, c := range []struct {
		event fakes.SESEvent
		kind  delivery.ReceiptKind
		hard  bool
	}{
		{fakes.SESEvent{EventType: "Send"}, delivery.ReceiptAccepted, false},
		{fakes.SESEvent{EventType: "DeliveryDelay"}, delivery.ReceiptAccepted, false},
		{fakes.SESEvent{EventType: "Delivery"}, delivery.ReceiptDelivered, false},
		{fakes.SESEvent{EventType: "Bounce", BounceType: "Permanent"}, delivery.ReceiptBounced, true},
		{fakes.SESEvent{EventType: "Bounce", BounceType: "Transient"}, delivery.ReceiptBounced, false},
		{fakes.SESEvent{EventType: "Bounce", BounceType: "Undetermined"}, delivery.ReceiptBounced, false},
		{fakes.SESEvent{EventType: "Complaint"}, delivery.ReceiptComplained, false},
		{fakes.SESEvent{EventType: "Reject"}, delivery.ReceiptUndelivered, false},
		{fakes.SESEvent{NotificationType: "Delivery"}, delivery.ReceiptDelivered, false},
		{fakes.SESEvent{NotificationType: "Bounce", BounceType: "Permanent"}, delivery.ReceiptBounced, true},
		{fakes.SESEvent{NotificationType: "Complaint"}, delivery.ReceiptComplained, false},
	} {
		c.event.MessageID, c.event.Ref = sesMsgID, sesTestRef
		m := f.Notification(sesTopic, c.event.JSON(), 2)
		rec, err := receipts.ParseSES(receipts.SNSMessage{Type: m["Type"], MessageID: m["MessageId"], Message: m["Message"], Timestamp: m["Timestamp"]})
		is.NoErr(err)
		name := c.event.EventType + c.event.NotificationType + " " + c.event.BounceType
		if rec.Kind != c.kind || rec.HardBounce != c.hard {
			t.Errorf("%s: got %s hard=%v, want %s hard=%v", name, rec.Kind, rec.HardBounce, c.kind, c.hard)
		}
		is.Equal(rec.Source, delivery.ReceiptSourceSES)
		is.Equal(rec.ProviderMsgID, sesMsgID)        // mail.messageId
		is.Equal(rec.EventID, "sns:"+m["MessageId"]) // SNS keeps it on a retry
		is.True(!rec.OccurredAt.IsZero())            // the event's time
		if c.event.NotificationType == "" {
			is.Equal(rec.Ref, sesTestRef) // from mail.tags
		} else {
			is.Equal(rec.Ref, "") // an identity's notifications carry no tags: matched by mail.messageId
		}
		t.Logf("%s: %s", name, rec.Detail)
	}
	for name, msg := range map[string]string{
		"open":      fakes.SESEvent{EventType: "Open", MessageID: sesMsgID, Ref: sesTestRef}.JSON(),
		"not json":  `{`,
		"foreign":   fakes.SESEvent{EventType: "Delivery", MessageID: sesMsgID, Ref: "someone-elses"}.JSON(),
		"no bounce": `{"eventType":"Bounce","mail":{"messageId":"m"}}`,
		"nothing":   `{"eventType":"Delivery","mail":{}}`,
	} {
		_, err := receipts.ParseSES(receipts.SNSMessage{Type: "Notification", MessageID: "x", Message: msg})
		is.True(err != nil) // refused
		t.Logf("%s: %v", name, err)
	}
}

// Over HTTPS with the default fetcher: the fake SNS's TLS certificate for sns.eu-west-1.amazonaws.com
// verifies against its CA, the certificate is fetched, and a redirect or a non-loopback connect-to is
// refused.
func TestSESHTTPFetch(t *testing.T) {
	is := is.New(t)
	f := startSNS(t)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	is.NoErr(os.WriteFile(ca, f.CAPEM(), 0o600))
	fetch, err := receipts.HTTPFetch(receipts.FetchOptions{CAFile: ca, ConnectTo: f.Addr()})
	is.NoErr(err)
	rec := &fakeRecorder{answer: delivery.ReceiptResult{TaskID: 7, Effect: delivery.ReceiptSettled}}
	h := receipts.NewHandler(rec, receipts.Config{SES: receipts.SESConfig{TopicARNs: []string{sesTopic}, Fetch: fetch}})
	event := fakes.SESEvent{EventType: "Delivery", MessageID: sesMsgID, Ref: sesTestRef}.JSON()
	w := postSNS(h, f.Notification(sesTopic, event, 2).JSON())
	is.Equal(w.Code, http.StatusOK)
	is.Equal(f.Fetches(), []string{f.CertURL()})
	_, err = fetch(context.Background(), "https://"+f.Host()+"/missing.pem")
	is.True(err != nil) // a 404 is no certificate

	untrusted, err := receipts.HTTPFetch(receipts.FetchOptions{ConnectTo: f.Addr()})
	is.NoErr(err)
	_, err = untrusted(context.Background(), f.CertURL())
	is.True(err != nil) // without the fake's CA, TLS refuses it
	_, err = receipts.HTTPFetch(receipts.FetchOptions{ConnectTo: "192.0.2.1:443"})
	is.True(err != nil) // connect-to is for a local fake only
}

func (c *counted) get(source, result string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[source+" "+result]
}
