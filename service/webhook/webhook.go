// Package webhook delivers notifications as Standard Webhooks (https://www.standardwebhooks.com):
// a signed JSON POST to the subscriber's URL (the user's address on the channel, msg.To).
//
// The contract is IDEMPOTENT: every attempt of a task carries the same webhook-id (the task's
// idempotency key, ntf-<ref>), and the Standard Webhooks specification asks receivers to
// deduplicate on it. A resend after a timeout therefore reaches the user once if the receiver
// follows the specification. Receivers do not tell a replay from a first delivery, so a resend that
// the receiver deduplicated is reported as ACCEPTED, not ACCEPTED_REPLAY.
//
// Response mapping: 2xx -> ACCEPTED (ProviderMsgID = webhook-id), from the status line alone: the
// specification makes any 2xx the acceptance, so a body that breaks off after it changes nothing
// (service/httpkit, Response.Unreadable); 429 -> THROTTLED (Retry-After honoured); 502, 504, and a
// 5xx that a forward proxy gave a plain-http request -> GATEWAY_ERROR (uncertain: the gateway may have
// passed the webhook on); other 5xx -> HTTP_5XX; 3xx (redirects are never followed) and other 4xx ->
// REJECTED; a destination in a network the egress policy refuses (loopback, private, link-local,
// ...: httpkit.Egress) -> REJECTED, before connecting; no connection or nothing of the request written -> CONNECT_FAILED; client timeout after
// that -> TIMEOUT; a broken connection -> IO_ERROR. Each attempt puts at most one request on the wire
// (service/httpkit). Standard Webhooks does not promise that a 5xx or 429 comes before the receiver
// acted on the message; the resend carries the same webhook-id, so that only matters once the attempt
// budget is used up. Set server_errors_uncertain in the channel configuration to count them as
// uncertain.
package webhook

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
	"github.com/notifierhq/notifier/service/redact"
)

// SecretPrefix starts every Standard Webhooks signing secret; base64 of the key bytes follows it.
const SecretPrefix = "whsec_"

// Secret length bounds (decoded bytes), as the Standard Webhooks specification recommends.
const (
	MinSecretBytes = 24
	MaxSecretBytes = 64
)

// Options tune the transport. The zero value verifies TLS against the system roots.
type Options struct {
	CAFile string // extra PEM roots for private receivers; verification stays on
	// AllowedNetworks opts networks in that the egress policy refuses (httpkit.Egress): a receiver
	// on a private network. Every other loopback, private, link-local, ... address is refused.
	AllowedNetworks []netip.Prefix
	// Now is the clock for webhook-timestamp and the payload's timestamp (tests); default time.Now.
	Now func() time.Time
}

// Client sends Standard Webhooks. Safe for concurrent use.
type Client struct {
	key []byte
	now func() time.Time
	kit *httpkit.Client
}

// New checks the signing secret ("whsec_" + base64 of 24 to 64 bytes) and builds a client.
// Errors never contain the secret.
func New(secret string, opt Options) (*Client, error) {
	key, err := ParseSecret(secret)
	if err != nil {
		return nil, err
	}
	kit, err := httpkit.New(httpkit.Options{CAFile: opt.CAFile, MaxIdleConnsPerHost: 16,
		Egress: &httpkit.Egress{Allowed: opt.AllowedNetworks}})
	if err != nil {
		return nil, err
	}
	now := opt.Now
	if now == nil {
		now = time.Now
	}
	return &Client{key: key, now: now, kit: kit}, nil
}

// ParseSecret decodes a "whsec_<base64>" secret into the HMAC key.
func ParseSecret(secret string) ([]byte, error) {
	b64, ok := strings.CutPrefix(strings.TrimSpace(secret), SecretPrefix)
	if !ok {
		return nil, fmt.Errorf("%w: webhook secret: want %s followed by base64", delivery.ErrInvalidInput, SecretPrefix)
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("%w: webhook secret: the part after %s is not valid base64", delivery.ErrInvalidInput, SecretPrefix)
	}
	if len(key) < MinSecretBytes || len(key) > MaxSecretBytes {
		return nil, fmt.Errorf("%w: webhook secret: %d bytes, want %d to %d", delivery.ErrInvalidInput, len(key), MinSecretBytes, MaxSecretBytes)
	}
	return key, nil
}

// String names the channel kind for logs (there is no fixed URL: each user has their own).
func (c *Client) String() string { return "webhook" }

// Payload is the JSON body of every webhook.
type Payload struct {
	Type      string `json:"type"`      // always "notification"
	Timestamp string `json:"timestamp"` // RFC 3339, when this attempt was made
	Data      Data   `json:"data"`
}

// Data is the notification itself.
type Data struct {
	Ref  string `json:"ref"` // the task's reference: the same on every attempt
	Body string `json:"body"`
}

// Sign computes the webhook-signature header value: "v1," + base64(HMAC-SHA256(key, id.timestamp.body)).
func Sign(key []byte, id string, timestamp int64, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + strconv.FormatInt(timestamp, 10) + "."))
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// Send posts the signed webhook to msg.To. See the package comment for the outcome mapping.
func (c *Client) Send(ctx context.Context, msg delivery.Message) delivery.Observation {
	target, err := checkURL(msg.To)
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: err.Error()}
	}
	if msg.IdempotencyKey == "" || strings.ContainsAny(msg.IdempotencyKey, " ,\r\n") {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "no usable idempotency key for webhook-id"}
	}
	now := c.now()
	body, err := json.Marshal(Payload{Type: "notification", Timestamp: now.UTC().Format(time.RFC3339),
		Data: Data{Ref: msg.Ref, Body: msg.Body}})
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "encode payload: " + err.Error()}
	}
	ts := now.Unix()
	resp, failed := c.kit.Do(ctx, httpkit.Request{Method: http.MethodPost, URL: target.String(), Body: body, Header: http.Header{
		"Content-Type":      {"application/json"},
		"Webhook-Id":        {msg.IdempotencyKey},
		"Webhook-Timestamp": {strconv.FormatInt(ts, 10)},
		"Webhook-Signature": {Sign(c.key, msg.IdempotencyKey, ts, body)},
	}})
	if resp == nil {
		return failed
	}
	// Any 2xx is the acceptance: a body that could not be read does not change it, so Unreadable is
	// not called (with needBody=false it never reports one).
	return classify(resp, msg.IdempotencyKey)
}

// Classify maps a receiver's response to an observation, for a request that went to it directly.
func Classify(status int, header http.Header, body []byte, webhookID string) delivery.Observation {
	return classify(&httpkit.Response{Status: status, Header: header, Body: body}, webhookID)
}

func classify(resp *httpkit.Response, webhookID string) delivery.Observation {
	status := resp.Status
	if resp.Success() {
		return delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: webhookID}
	}
	if status >= 300 && status < 400 {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "HTTP " + strconv.Itoa(status) + ": redirects are not followed"}
	}
	return resp.Refused() // 429, 5xx, gateways; any other status is a rejection
}

// Query is not offered: Standard Webhooks has no way to ask a receiver what it got.
func (c *Client) Query(context.Context, string) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, Detail: "not supported"}
}

// checkURL accepts an absolute http(s) URL without a fragment, read the same way by net/url and by the
// conservative reading of redaction (a password with an unescaped '/' would send the webhook to a
// host made of the password). Its error shows the URL's origin only: a path often carries a token.
func checkURL(raw string) (*url.URL, error) {
	raw = strings.TrimSpace(raw)
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Fragment != "" {
		return nil, fmt.Errorf("subscriber address is not an http(s) URL: %q", redact.Origin(raw))
	}
	if got, _ := u.User.Password(); redact.Misread(raw, got) {
		return nil, fmt.Errorf("subscriber address %q: its password holds a character a URL needs percent-encoded", redact.Origin(raw))
	}
	return u, nil
}
