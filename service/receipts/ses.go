package receipts

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
)

// Amazon SES event notifications reach notifier receipts through Amazon SNS: SES publishes each event of
// a message (https://docs.aws.amazon.com/ses/latest/dg/monitor-using-event-publishing.html for a
// configuration set's events, .../monitor-sending-activity-using-notifications-sns.html for an
// identity's notifications) to an SNS topic, and the topic's HTTPS subscription POSTs an SNS message
// whose Message is the SES event's JSON to /receipts/ses.
//
// SNS signs every message (https://docs.aws.amazon.com/sns/latest/dg/sns-verify-signature-of-message.html):
// SignatureVersion 1 is SHA1withRSA, 2 is SHA256withRSA, over a canonical string of the message's
// fields (snsCanonical), with the key of the X.509 certificate at SigningCertURL. The certificate is
// trusted because it comes over HTTPS (verified against the system roots) from an SNS host,
// sns.<region>.amazonaws.com[.cn] (snsHost, the pattern AWS's own validators use); any other URL is
// refused before anything is fetched. Messages from a topic that is not configured are refused (AWS:
// "Reject any message with an unexpected TopicArn"). Raw message delivery must be off: a raw message
// carries no signature and is refused as malformed.

// MaxSNSBodyBytes bounds an SNS message: SNS publishes up to 256 KiB, and the envelope's JSON escapes
// the SES event once more.
const MaxSNSBodyBytes = 1 << 20

// MaxFetchBytes bounds what a fetch (a signing certificate, a subscription's confirmation) may answer:
// a certificate is about 2 KiB.
const MaxFetchBytes = 64 << 10

// DefaultFetchTimeout bounds one fetch when SESConfig.FetchTimeout is zero.
const DefaultFetchTimeout = 10 * time.Second

// maxCachedCerts bounds the certificate cache: SNS signs with a few certificates (one per region, a new
// one now and then).
const maxCachedCerts = 64

// snsHost is the host a SigningCertURL and a SubscribeURL must have.
var snsHost = regexp.MustCompile(`^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$`)

// snsTopicARN is the shape of a topic's ARN, arn:PARTITION:sns:REGION:ACCOUNT:NAME (SES's own pattern,
// https://docs.aws.amazon.com/ses/latest/APIReference/API_SNSDestination.html, with the name's characters).
var snsTopicARN = regexp.MustCompile(`^arn:aws[a-z0-9-]*:sns:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_.-]{1,256}$`)

// ValidTopicARN reports whether arn is an SNS topic's ARN.
func ValidTopicARN(arn string) bool { return snsTopicARN.MatchString(arn) }

// Fetch GETs url within ctx and returns its body: at most MaxFetchBytes of a 200 answer, else an error.
// HTTPFetch is the production one; tests inject their own.
type Fetch func(ctx context.Context, url string) ([]byte, error)

// SESConfig enables /receipts/ses.
type SESConfig struct {
	// TopicARNs are the SNS topics SES publishes to: a message from any other topic is refused, and only
	// these topics' subscriptions are confirmed.
	TopicARNs []string
	// Fetch gets signing certificates and confirms subscriptions; HTTPFetch(FetchOptions{}) when nil.
	Fetch Fetch
	// FetchTimeout bounds one fetch; DefaultFetchTimeout when zero.
	FetchTimeout time.Duration
}

// Enabled reports whether any topic is configured.
func (c SESConfig) Enabled() bool { return len(c.TopicARNs) > 0 }

// FetchOptions configure HTTPFetch.
type FetchOptions struct {
	// CAFile adds PEM roots to the system's (a fake SNS in tests); verification stays on.
	CAFile string
	// ConnectTo, a loopback host:port, is dialled instead of the URL's host, which TLS still verifies
	// (as curl --connect-to): a fake SNS answering for sns.<region>.amazonaws.com.
	ConnectTo string
}

// HTTPFetch is the Fetch over HTTPS: the proxy from the environment, TLS verified, no redirect
// followed (a redirect could leave the SNS host), the caller's context bounding the whole call.
func HTTPFetch(opt FetchOptions) (Fetch, error) {
	transport, err := httpkit.NewTransport(httpkit.Options{CAFile: opt.CAFile, MaxIdleConnsPerHost: 2})
	if err != nil {
		return nil, err
	}
	if opt.ConnectTo != "" {
		host, _, err := net.SplitHostPort(opt.ConnectTo)
		if err != nil || !(host == "127.0.0.1" || host == "::1" || host == "localhost") {
			return nil, fmt.Errorf("%w: connect-to %q: want a loopback host:port", delivery.ErrInvalidInput, opt.ConnectTo)
		}
		d := net.Dialer{Timeout: 5 * time.Second}
		transport.Proxy = nil
		transport.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, opt.ConnectTo)
		}
	}
	client := &http.Client{Transport: transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return func(ctx context.Context, u string) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, MaxFetchBytes+1))
		switch {
		case err != nil:
			return nil, err
		case resp.StatusCode != http.StatusOK:
			return nil, fmt.Errorf("HTTP %d", resp.StatusCode)
		case len(body) > MaxFetchBytes:
			return nil, fmt.Errorf("answer over %d bytes", MaxFetchBytes)
		}
		return body, nil
	}, nil
}

// SNSMessage is an SNS message as an HTTPS subscription receives it
// (https://docs.aws.amazon.com/sns/latest/dg/http-notification-json.html,
// .../http-subscription-confirmation-json.html, .../http-unsubscribe-confirmation-json.html).
type SNSMessage struct {
	Type             string  `json:"Type"`
	MessageID        string  `json:"MessageId"`
	Token            string  `json:"Token"`
	TopicArn         string  `json:"TopicArn"`
	Subject          *string `json:"Subject"`
	Message          string  `json:"Message"`
	SubscribeURL     string  `json:"SubscribeURL"`
	Timestamp        string  `json:"Timestamp"`
	SignatureVersion string  `json:"SignatureVersion"`
	Signature        string  `json:"Signature"`
	SigningCertURL   string  `json:"SigningCertURL"`
	UnsubscribeURL   string  `json:"UnsubscribeURL"`
}

// SNS message types.
const (
	SNSNotification             = "Notification"
	SNSSubscriptionConfirmation = "SubscriptionConfirmation"
	SNSUnsubscribeConfirmation  = "UnsubscribeConfirmation"
)

// snsCanonical is the string SNS signs: "Name\nvalue\n" for each field of the message's type, in this
// order. A Notification signs Message, MessageId, Subject (only when present), Timestamp, TopicArn and
// Type; a SubscriptionConfirmation or an UnsubscribeConfirmation signs Message, MessageId,
// SubscribeURL, Timestamp, Token, TopicArn and Type.
func snsCanonical(m SNSMessage) (string, error) {
	var fields [][2]string
	switch m.Type {
	case SNSNotification:
		fields = [][2]string{{"Message", m.Message}, {"MessageId", m.MessageID}}
		if m.Subject != nil {
			fields = append(fields, [2]string{"Subject", *m.Subject})
		}
		fields = append(fields, [][2]string{{"Timestamp", m.Timestamp}, {"TopicArn", m.TopicArn}, {"Type", m.Type}}...)
	case SNSSubscriptionConfirmation, SNSUnsubscribeConfirmation:
		fields = [][2]string{{"Message", m.Message}, {"MessageId", m.MessageID}, {"SubscribeURL", m.SubscribeURL},
			{"Timestamp", m.Timestamp}, {"Token", m.Token}, {"TopicArn", m.TopicArn}, {"Type", m.Type}}
	default:
		return "", refuse(http.StatusBadRequest, "unknown_type", "SNS message Type %q (want Notification, SubscriptionConfirmation or UnsubscribeConfirmation)", m.Type)
	}
	var b strings.Builder
	for _, f := range fields {
		b.WriteString(f[0])
		b.WriteByte('\n')
		b.WriteString(f[1])
		b.WriteByte('\n')
	}
	return b.String(), nil
}

// CheckSNSURL refuses a SigningCertURL or SubscribeURL that is not https://sns.<region>.amazonaws.com[.cn]/...
// (no credentials, no port other than https's): fetching anything else could serve an attacker's key or
// make the receiver a proxy.
func CheckSNSURL(field, raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" || u.User != nil || u.Port() != "" || !snsHost.MatchString(u.Host) {
		return nil, refuse(http.StatusUnauthorized, "bad_cert_url", "%s %q is not an https URL of an SNS host (sns.<region>.amazonaws.com)", field, raw)
	}
	return u, nil
}

// certCache keeps the signing certificates by URL: SNS signs every message with one of a few.
type certCache struct {
	mu    sync.Mutex
	certs map[string]*x509.Certificate
}

func (c *certCache) get(u string) *x509.Certificate {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.certs[u]
}

func (c *certCache) put(u string, cert *x509.Certificate) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.certs == nil || len(c.certs) >= maxCachedCerts {
		c.certs = map[string]*x509.Certificate{}
	}
	c.certs[u] = cert
}

// VerifySNS checks an SNS message: its type, its topic (one of topics), its SigningCertURL (an SNS host)
// and its signature by that certificate's key (SignatureVersion 1 or 2).
func (h *Handler) VerifySNS(ctx context.Context, m SNSMessage) error {
	canonical, err := snsCanonical(m)
	if err != nil {
		return err
	}
	if !h.topic(m.TopicArn) {
		return refuse(http.StatusForbidden, "foreign_topic", "TopicArn %q is not a configured topic (--ses-topic-arn)", m.TopicArn)
	}
	var hash crypto.Hash
	switch m.SignatureVersion {
	case "1":
		hash = crypto.SHA1
	case "2":
		hash = crypto.SHA256
	default:
		return refuse(http.StatusUnauthorized, "bad_signature", "SignatureVersion %q (want 1 or 2)", m.SignatureVersion)
	}
	sig, err := base64.StdEncoding.DecodeString(m.Signature)
	if err != nil || len(sig) == 0 {
		return refuse(http.StatusUnauthorized, "bad_signature", "Signature is not base64")
	}
	if _, err := CheckSNSURL("SigningCertURL", m.SigningCertURL); err != nil {
		return err
	}
	cert, err := h.signingCert(ctx, m.SigningCertURL)
	if err != nil {
		return err
	}
	pub, ok := cert.PublicKey.(*rsa.PublicKey)
	if !ok {
		return refuse(http.StatusUnauthorized, "bad_signature", "the signing certificate's key is not RSA")
	}
	var digest []byte
	if hash == crypto.SHA1 {
		d := sha1.Sum([]byte(canonical))
		digest = d[:]
	} else {
		d := sha256.Sum256([]byte(canonical))
		digest = d[:]
	}
	if rsa.VerifyPKCS1v15(pub, hash, digest, sig) != nil {
		return refuse(http.StatusUnauthorized, "bad_signature", "the SNS signature does not match")
	}
	return nil
}

func (h *Handler) topic(arn string) bool {
	for _, t := range h.cfg.SES.TopicARNs {
		if t == arn {
			return true
		}
	}
	return false
}

// signingCert is the certificate at u, fetched once.
func (h *Handler) signingCert(ctx context.Context, u string) (*x509.Certificate, error) {
	if cert := h.certs.get(u); cert != nil {
		return cert, nil
	}
	body, err := h.fetch(ctx, u)
	if err != nil {
		// Transient, perhaps: SNS retries a 5xx.
		return nil, refuse(http.StatusServiceUnavailable, "cert_unavailable", "signing certificate %s: %v", u, err)
	}
	block, _ := pem.Decode(body)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, refuse(http.StatusUnauthorized, "bad_signature", "signing certificate %s is not a PEM certificate", u)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, refuse(http.StatusUnauthorized, "bad_signature", "signing certificate %s: %v", u, err)
	}
	if now := h.cfg.Now(); now.After(cert.NotAfter) || now.Before(cert.NotBefore) {
		return nil, refuse(http.StatusUnauthorized, "bad_signature", "signing certificate %s is not valid now", u)
	}
	h.certs.put(u, cert)
	return cert, nil
}

func (h *Handler) fetch(ctx context.Context, u string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.SES.FetchTimeout)
	defer cancel()
	return h.cfg.SES.Fetch(ctx, u)
}

// ses verifies one SNS message: a Notification is recorded as a receipt; a SubscriptionConfirmation of a
// configured topic is confirmed (GET SubscribeURL); an UnsubscribeConfirmation is logged only (nothing
// subscribes again behind the operator's back).
func (h *Handler) ses(w http.ResponseWriter, r *http.Request) {
	source := delivery.ReceiptSourceSES
	m, err := h.readSNS(r)
	if err != nil {
		h.fail(w, source, err)
		return
	}
	switch m.Type {
	case SNSSubscriptionConfirmation:
		u, err := CheckSNSURL("SubscribeURL", m.SubscribeURL)
		if err == nil {
			if _, ferr := h.fetch(r.Context(), u.String()); ferr != nil {
				err = refuse(http.StatusServiceUnavailable, "confirm_failed", "confirm the subscription to %s: %v", m.TopicArn, ferr)
			}
		}
		if err != nil {
			h.fail(w, source, err)
			return
		}
		h.count(source, "subscription_confirmed")
		h.cfg.Logger.Info("SNS SUBSCRIPTION CONFIRMED", "topic", m.TopicArn)
		writeJSON(w, http.StatusOK, map[string]string{"result": "subscription_confirmed"})
	case SNSUnsubscribeConfirmation:
		h.count(source, "unsubscribed")
		h.cfg.Logger.Warn("SNS subscription ended: SES events of this topic no longer come", "topic", m.TopicArn)
		writeJSON(w, http.StatusOK, map[string]string{"result": "unsubscribed"})
	default:
		h.serve(w, r, source, func() (delivery.Receipt, error) { return ParseSES(m) })
	}
}

// readSNS reads and verifies the SNS message of r.
func (h *Handler) readSNS(r *http.Request) (SNSMessage, error) {
	body, err := readBodyLimit(r, MaxSNSBodyBytes)
	if err != nil {
		return SNSMessage{}, err
	}
	var m SNSMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return m, refuse(http.StatusBadRequest, "malformed", "body is not an SNS message: %v", err)
	}
	if m.Type == "" || m.Signature == "" {
		return m, refuse(http.StatusBadRequest, "malformed", "not a signed SNS message (turn raw message delivery off)")
	}
	if t := r.Header.Get("x-amz-sns-message-type"); t != "" && t != m.Type {
		return m, refuse(http.StatusBadRequest, "malformed", "x-amz-sns-message-type %q but Type %q", t, m.Type)
	}
	return m, h.VerifySNS(r.Context(), m)
}

// SESRefTag is the message tag our emails carry the task's ref in (service/ses sets it).
const SESRefTag = "notifier_ref"

// sesEvent is the part of an SES event receipts read: a configuration set's event (eventType,
// https://docs.aws.amazon.com/ses/latest/dg/event-publishing-retrieving-sns-contents.html) or an
// identity's notification (notificationType, .../notification-contents.html).
type sesEvent struct {
	EventType        string `json:"eventType"`
	NotificationType string `json:"notificationType"`
	Mail             struct {
		Timestamp string              `json:"timestamp"`
		MessageID string              `json:"messageId"`
		Tags      map[string][]string `json:"tags"`
	} `json:"mail"`
	Bounce *struct {
		BounceType    string `json:"bounceType"`
		BounceSubType string `json:"bounceSubType"`
		Timestamp     string `json:"timestamp"`
		Recipients    []struct {
			DiagnosticCode string `json:"diagnosticCode"`
		} `json:"bouncedRecipients"`
	} `json:"bounce"`
	Complaint *struct {
		Timestamp    string `json:"timestamp"`
		FeedbackType string `json:"complaintFeedbackType"`
	} `json:"complaint"`
	Delivery *struct {
		Timestamp    string `json:"timestamp"`
		SMTPResponse string `json:"smtpResponse"`
	} `json:"delivery"`
	Reject *struct {
		Reason string `json:"reason"`
	} `json:"reject"`
	DeliveryDelay *struct {
		Timestamp string `json:"timestamp"`
		DelayType string `json:"delayType"`
	} `json:"deliveryDelay"`
}

// ParseSES reads the SES event in a verified SNS Notification. Send and DeliveryDelay -> ACCEPTED (SES
// has the message; nothing final about its delivery); Delivery -> DELIVERED; Bounce -> BOUNCED, hard for
// bounceType Permanent (Transient and Undetermined are soft); Complaint -> COMPLAINED; Reject ->
// UNDELIVERED (SES accepted the call, found a virus and sent nothing). Open, Click, Rendering Failure
// and Subscription events are refused as no receipt: publish only the six above. The ref is
// mail.tags.notifier_ref[0]; mail.messageId (the MessageId SendEmail answered) is matched when there is
// none (an identity's notifications carry no tags). The event id is the SNS MessageId, which SNS keeps
// when it retries a message: each is recorded once.
func ParseSES(m SNSMessage) (delivery.Receipt, error) {
	var ev sesEvent
	if err := json.Unmarshal([]byte(m.Message), &ev); err != nil {
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "the SNS Message is not an SES event: %v", err)
	}
	typ := ev.EventType
	if typ == "" {
		typ = ev.NotificationType
	}
	if m.MessageID == "" {
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "SNS message without a MessageId")
	}
	rec := delivery.Receipt{Source: delivery.ReceiptSourceSES, EventID: "sns:" + m.MessageID, ProviderMsgID: ev.Mail.MessageID}
	at := ""
	switch typ {
	case "Send":
		rec.Kind, rec.Detail = delivery.ReceiptAccepted, "SES Send"
	case "DeliveryDelay":
		rec.Kind, rec.Detail = delivery.ReceiptAccepted, "SES DeliveryDelay"
		if d := ev.DeliveryDelay; d != nil {
			rec.Detail, at = "SES DeliveryDelay "+d.DelayType, d.Timestamp
		}
	case "Delivery":
		rec.Kind, rec.Detail = delivery.ReceiptDelivered, "SES Delivery"
		if d := ev.Delivery; d != nil {
			rec.Detail, at = "SES Delivery: "+d.SMTPResponse, d.Timestamp
		}
	case "Bounce":
		b := ev.Bounce
		if b == nil || b.BounceType == "" {
			return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "Bounce without bounce.bounceType")
		}
		rec.Kind, rec.HardBounce, at = delivery.ReceiptBounced, b.BounceType == "Permanent", b.Timestamp
		rec.Detail = "SES Bounce " + b.BounceType + "/" + b.BounceSubType
		if len(b.Recipients) > 0 && b.Recipients[0].DiagnosticCode != "" {
			rec.Detail += ": " + b.Recipients[0].DiagnosticCode
		}
	case "Complaint":
		rec.Kind, rec.Detail = delivery.ReceiptComplained, "SES Complaint"
		if c := ev.Complaint; c != nil {
			rec.Detail, at = strings.TrimSpace("SES Complaint "+c.FeedbackType), c.Timestamp
		}
	case "Reject":
		rec.Kind, rec.Detail = delivery.ReceiptUndelivered, "SES Reject"
		if r := ev.Reject; r != nil {
			rec.Detail = "SES Reject: " + r.Reason
		}
	default:
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "unknown_type",
			"SES event %q is not a receipt (publish Send, Delivery, Bounce, Complaint, Reject and DeliveryDelay)", typ)
	}
	if refs := ev.Mail.Tags[SESRefTag]; len(refs) > 0 {
		ref, ok := delivery.ParseRef(refs[0])
		if !ok {
			return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "mail.tags.%s %q is not a reference of ours", SESRefTag, refs[0])
		}
		rec.Ref = ref
	}
	if rec.Ref == "" && rec.ProviderMsgID == "" {
		return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "neither mail.tags.%s nor mail.messageId", SESRefTag)
	}
	if at == "" {
		at = m.Timestamp
	}
	if at != "" {
		t, err := time.Parse(time.RFC3339, at)
		if err != nil {
			return delivery.Receipt{}, refuse(http.StatusBadRequest, "malformed", "time %q is not ISO 8601", at)
		}
		rec.OccurredAt = t
	}
	return rec, nil
}
