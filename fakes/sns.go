package fakes

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"time"
)

// SNS is a fake of the Amazon SNS side of an HTTPS subscription, built from its documentation
// (https://docs.aws.amazon.com/sns/latest/dg/sns-verify-signature-of-message.html,
// .../http-notification-json.html, .../http-subscription-confirmation-json.html): it publishes SNS
// messages signed like SNS's (SignatureVersion 1 SHA1withRSA or 2 SHA256withRSA over the canonical
// string of the message's type) with a key whose certificate it serves at SigningCertURL
// (https://sns.<region>.amazonaws.com/SimpleNotificationService-<hex>.pem), and it answers the
// SubscribeURL of a confirmation (GET /?Action=ConfirmSubscription&TopicArn=...&Token=...).
//
// It serves those over TLS on 127.0.0.1 with a certificate for sns.<region>.amazonaws.com from its own
// CA (CAPEM; connect with receipts.FetchOptions{CAFile, ConnectTo: Addr()}), and in process through
// Fetch (no network) for tests that inject the fetcher.
type SNS struct {
	region   string
	key      *rsa.PrivateKey
	certPEM  []byte
	certPath string
	caPEM    []byte
	srv      *http.Server
	addr     string

	mu        sync.Mutex
	fetches   []string
	confirmed map[string]int
	seq       int
}

// StartSNS starts an SNS fake for region. It panics on failure, like httptest.NewServer.
func StartSNS(region string) *SNS {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	check(err)
	now := time.Now()
	signing := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sns.amazonaws.com"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, signing, signing, &key.PublicKey, key)
	check(err)
	sum := sha256.Sum256(der)
	f := &SNS{region: region, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		certPath: "/SimpleNotificationService-" + hex.EncodeToString(sum[:16]) + ".pem", confirmed: map[string]int{}}

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check(err)
	ca := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "fake SNS CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	check(err)
	ca, err = x509.ParseCertificate(caDER)
	check(err)
	f.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check(err)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: f.Host()}, DNSNames: []string{f.Host()},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour)}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &srvKey.PublicKey, caKey)
	check(err)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	f.addr = l.Addr().String()
	f.srv = &http.Server{Handler: http.HandlerFunc(f.serveHTTP), ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: srvKey}}}}
	go func() { _ = f.srv.ServeTLS(l, "", "") }()
	return f
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}

// Close stops the TLS server.
func (f *SNS) Close() { _ = f.srv.Close() }

// Host is the SNS host the fake answers for: sns.<region>.amazonaws.com.
func (f *SNS) Host() string { return "sns." + f.region + ".amazonaws.com" }

// Addr is where the TLS server listens (host:port on 127.0.0.1).
func (f *SNS) Addr() string { return f.addr }

// CAPEM is the PEM certificate of the CA that signed the TLS server's certificate.
func (f *SNS) CAPEM() []byte { return f.caPEM }

// CertURL is the SigningCertURL of the fake's messages.
func (f *SNS) CertURL() string { return "https://" + f.Host() + f.certPath }

// Fetches lists every URL fetched, over TLS or through Fetch, in order.
func (f *SNS) Fetches() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.fetches...)
}

// Confirmed counts the subscription confirmations received for topic.
func (f *SNS) Confirmed(topic string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.confirmed[topic]
}

// Fetch GETs u from the fake in process: the fetcher tests inject (receipts.SESConfig.Fetch). A URL of
// another host is not the fake's: an error, as no server would answer.
func (f *SNS) Fetch(ctx context.Context, u string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	parsed, err := url.Parse(u)
	if err != nil || parsed.Host != f.Host() {
		return nil, fmt.Errorf("fake SNS: no such host in %q", u)
	}
	w := httptest.NewRecorder()
	f.serveHTTP(w, httptest.NewRequest(http.MethodGet, u, nil))
	if w.Code != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d", w.Code)
	}
	return w.Body.Bytes(), nil
}

func (f *SNS) serveHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.fetches = append(f.fetches, "https://"+f.Host()+r.URL.RequestURI())
	f.mu.Unlock()
	switch {
	case r.Method != http.MethodGet:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	case r.URL.Path == f.certPath:
		w.Header().Set("Content-Type", "application/x-x509-ca-cert")
		_, _ = w.Write(f.certPEM)
	case r.URL.Path == "/" && r.URL.Query().Get("Action") == "ConfirmSubscription" && r.URL.Query().Get("Token") != "":
		topic := r.URL.Query().Get("TopicArn")
		f.mu.Lock()
		f.confirmed[topic]++
		f.mu.Unlock()
		w.Header().Set("Content-Type", "text/xml")
		_, _ = io.WriteString(w, `<ConfirmSubscriptionResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><ConfirmSubscriptionResult><SubscriptionArn>`+
			topic+`:`+newRequestID()+`</SubscriptionArn></ConfirmSubscriptionResult></ConfirmSubscriptionResponse>`)
	default:
		http.Error(w, "not found", http.StatusNotFound)
	}
}

// SNSMessage is a message the fake publishes: the JSON an HTTPS subscription receives. Edit a field
// after Sign to forge one.
type SNSMessage map[string]string

// JSON is the message's body.
func (m SNSMessage) JSON() []byte {
	b, _ := json.Marshal(m)
	return b
}

// Notification is an SNS Notification of message (an SES event's JSON) from topic, signed with
// SignatureVersion version (1 or 2).
func (f *SNS) Notification(topic, message string, version int) SNSMessage {
	m := f.envelope("Notification", topic, message)
	m["UnsubscribeURL"] = "https://" + f.Host() + "/?Action=Unsubscribe&SubscriptionArn=" + topic + ":sub"
	f.Sign(m, version)
	return m
}

// SubscriptionConfirmation is the message SNS sends to a new HTTPS subscription of topic.
func (f *SNS) SubscriptionConfirmation(topic string, version int) SNSMessage {
	token := newRequestID() + newRequestID()
	m := f.envelope("SubscriptionConfirmation", topic, "You have chosen to subscribe to the topic "+topic+
		".\nTo confirm the subscription, visit the SubscribeURL included in this message.")
	m["Token"] = token
	m["SubscribeURL"] = "https://" + f.Host() + "/?Action=ConfirmSubscription&TopicArn=" + url.QueryEscape(topic) + "&Token=" + token
	f.Sign(m, version)
	return m
}

func (f *SNS) envelope(typ, topic, message string) SNSMessage {
	f.mu.Lock()
	f.seq++
	seq := f.seq
	f.mu.Unlock()
	return SNSMessage{"Type": typ, "MessageId": fmt.Sprintf("%08x-%s", seq, newRequestID()[9:]), "TopicArn": topic,
		"Message": message, "Timestamp": time.Now().UTC().Format("2006-01-02T15:04:05.000Z"), "SigningCertURL": f.CertURL()}
}

// Sign (re)computes m's Signature and SignatureVersion: the canonical string is "Name\nvalue\n" for
// Message, MessageId, Subject (if present), Timestamp, TopicArn, Type of a Notification, and Message,
// MessageId, SubscribeURL, Timestamp, Token, TopicArn, Type of a (un)subscribe confirmation.
func (f *SNS) Sign(m SNSMessage, version int) {
	names := []string{"Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"}
	if m["Type"] != "Notification" {
		names = []string{"Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"}
	}
	var b strings.Builder
	for _, n := range names {
		if v, ok := m[n]; ok {
			b.WriteString(n + "\n" + v + "\n")
		}
	}
	var sig []byte
	var err error
	if version == 1 {
		sum := sha1.Sum([]byte(b.String()))
		sig, err = rsa.SignPKCS1v15(rand.Reader, f.key, crypto.SHA1, sum[:])
	} else {
		sum := sha256.Sum256([]byte(b.String()))
		sig, err = rsa.SignPKCS1v15(rand.Reader, f.key, crypto.SHA256, sum[:])
	}
	check(err)
	m["SignatureVersion"] = fmt.Sprint(version)
	m["Signature"] = base64.StdEncoding.EncodeToString(sig)
}

// SESEvent is an SES event as event publishing (EventType) or an identity's notifications
// (NotificationType) publish it (https://docs.aws.amazon.com/ses/latest/dg/event-publishing-retrieving-sns-examples.html).
type SESEvent struct {
	EventType        string // Send, Delivery, Bounce, Complaint, Reject, DeliveryDelay, Open, ...
	NotificationType string // instead of EventType: an identity's notification (no tags)
	MessageID        string // mail.messageId: the MessageId SendEmail answered
	Ref              string // mail.tags.notifier_ref, when set
	BounceType       string // Permanent, Transient or Undetermined
}

// JSON is the event's body, in the documented examples' shape.
func (e SESEvent) JSON() string {
	now := time.Now().UTC().Format("2006-01-02T15:04:05.000Z")
	mail := map[string]any{"timestamp": now, "source": "noreply@example.com", "messageId": e.MessageID,
		"sourceArn": "arn:aws:ses:eu-west-1:123456789012:identity/example.com", "sendingAccountId": "123456789012",
		"destination": []string{"u1@example.com"}, "headersTruncated": false}
	if e.NotificationType == "" {
		tags := map[string][]string{"ses:configuration-set": {"notifier-events"}, "ses:source-ip": {"192.0.2.0"}}
		if e.Ref != "" {
			tags[SESRefTag] = []string{e.Ref}
		}
		mail["tags"] = tags
	}
	ev := map[string]any{"mail": mail}
	typ := e.EventType
	if e.NotificationType != "" {
		ev["notificationType"], typ = e.NotificationType, e.NotificationType
	} else {
		ev["eventType"] = e.EventType
	}
	switch typ {
	case "Send":
		ev["send"] = map[string]any{}
	case "Delivery":
		ev["delivery"] = map[string]any{"timestamp": now, "processingTimeMillis": 546, "recipients": []string{"u1@example.com"},
			"smtpResponse": "250 2.6.0 Message received", "reportingMTA": "mta-out.example.com"}
	case "Bounce":
		sub := "General"
		if e.BounceType == "Transient" {
			sub = "MailboxFull"
		}
		ev["bounce"] = map[string]any{"bounceType": e.BounceType, "bounceSubType": sub, "timestamp": now,
			"feedbackId": "0100" + newRequestID(), "reportingMTA": "dsn; mta.example.com",
			"bouncedRecipients": []map[string]string{{"emailAddress": "u1@example.com", "action": "failed", "status": "5.1.1",
				"diagnosticCode": "smtp; 550 5.1.1 user unknown"}}}
	case "Complaint":
		ev["complaint"] = map[string]any{"timestamp": now, "feedbackId": "0100" + newRequestID(), "complaintFeedbackType": "abuse",
			"complainedRecipients": []map[string]string{{"emailAddress": "u1@example.com"}}}
	case "Reject":
		ev["reject"] = map[string]any{"reason": "Bad content"}
	case "DeliveryDelay":
		ev["deliveryDelay"] = map[string]any{"timestamp": now, "delayType": "TransientCommunicationFailure",
			"delayedRecipients": []map[string]string{{"emailAddress": "u1@example.com", "status": "4.4.1"}}}
	case "Open":
		ev["open"] = map[string]any{"timestamp": now, "ipAddress": "192.0.2.1", "userAgent": "Mozilla/5.0"}
	}
	b, _ := json.Marshal(ev)
	return string(b)
}
