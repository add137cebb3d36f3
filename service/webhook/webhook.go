// Package webhook delivers notifications as Standard Webhooks (https://www.standardwebhooks.com):
// a signed JSON POST to the subscriber's URL (the user's address on the channel, msg.To).
//
// The contract is IDEMPOTENT: every attempt of a task carries the same webhook-id (the task's
// idempotency key, ntf-task-<id>), and the Standard Webhooks specification asks receivers to
// deduplicate on it. A resend after a timeout therefore reaches the user once if the receiver
// follows the specification. Receivers do not tell a replay from a first delivery, so a resend that
// the receiver deduplicated is reported as ACCEPTED, not ACCEPTED_REPLAY.
//
// Response mapping: 2xx -> ACCEPTED (ProviderMsgID = webhook-id); 429 -> THROTTLED (Retry-After
// honoured); 5xx -> HTTP_5XX; 3xx (redirects are never followed) and other 4xx -> REJECTED; client
// timeout -> TIMEOUT; a broken connection -> IO_ERROR; no connection -> CONNECT_FAILED. Standard
// Webhooks does not promise that a 5xx or 429 comes before the receiver acted on the message; the
// resend carries the same webhook-id, so that only matters once the attempt budget is used up. Set
// server_errors_uncertain in the channel configuration to count them as uncertain.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
)

// MaxResponseBytes bounds how much of a response body is read.
const MaxResponseBytes = 64 << 10

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
	// Now is the clock for webhook-timestamp and the payload's timestamp (tests); default time.Now.
	Now func() time.Time
}

// Client sends Standard Webhooks. Safe for concurrent use.
type Client struct {
	key  []byte
	now  func() time.Time
	http *http.Client
}

// New checks the signing secret ("whsec_" + base64 of 24 to 64 bytes) and builds a client.
// Errors never contain the secret.
func New(secret string, opt Options) (*Client, error) {
	key, err := ParseSecret(secret)
	if err != nil {
		return nil, err
	}
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	if opt.CAFile != "" {
		pool, err := loadRoots(opt.CAFile)
		if err != nil {
			return nil, err
		}
		tlsConf.RootCAs = pool
	}
	transport := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsConf,
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
	now := opt.Now
	if now == nil {
		now = time.Now
	}
	return &Client{key: key, now: now, http: &http.Client{
		Transport:     transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       5 * time.Minute, // backstop only; the caller's context has the real timeout
	}}, nil
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

func loadRoots(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: CA file %s holds no PEM certificate", delivery.ErrInvalidInput, file)
	}
	return pool, nil
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
	Ref  string `json:"ref"` // task-<id>: the same on every attempt
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
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), bytes.NewReader(body))
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "build request: " + redactErr(err)}
	}
	ts := now.Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", msg.IdempotencyKey)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", Sign(c.key, msg.IdempotencyKey, ts, body))
	resp, err := c.http.Do(req)
	if err != nil {
		return httpchannel.TransportObservation(ctx, err, redactErr)
	}
	defer resp.Body.Close()
	respBody, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	if err != nil && resp.StatusCode >= 200 && resp.StatusCode < 300 {
		// The status line said accepted; a body we could not read does not change that.
		err = nil
	}
	if err != nil {
		return httpchannel.TransportObservation(ctx, err, redactErr)
	}
	return Classify(resp.StatusCode, resp.Header, respBody, msg.IdempotencyKey)
}

// Classify maps a receiver's response to an observation.
func Classify(status int, header http.Header, body []byte, webhookID string) delivery.Observation {
	switch {
	case status >= 200 && status < 300:
		return delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: webhookID}
	case status == http.StatusTooManyRequests:
		return delivery.Observation{Outcome: delivery.OutcomeThrottled, RetryAfter: httpchannel.RetryAfter(header), Detail: "HTTP 429"}
	case status >= 500:
		return delivery.Observation{Outcome: delivery.OutcomeHTTP5xx, RetryAfter: httpchannel.RetryAfter(header), Detail: "HTTP " + strconv.Itoa(status)}
	case status >= 300 && status < 400:
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "HTTP " + strconv.Itoa(status) + ": redirects are not followed"}
	default:
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "HTTP " + strconv.Itoa(status) + httpchannel.Snippet(body)}
	}
}

// Query is not offered: Standard Webhooks has no way to ask a receiver what it got.
func (c *Client) Query(context.Context, string) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, Detail: "not supported"}
}

// checkURL accepts an absolute http(s) URL without a fragment. Its error shows no credentials.
func checkURL(raw string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Fragment != "" {
		return nil, fmt.Errorf("subscriber address is not an http(s) URL: %q", redactURL(raw))
	}
	return u, nil
}

// redactURL keeps only scheme and host of a subscriber URL: its path and query often carry a token.
func redactURL(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Host == "" {
		return "(unparsable URL)"
	}
	return u.Scheme + "://" + u.Host + "/..."
}

// redactErr is err's text with any URL reduced to scheme and host.
func redactErr(err error) string {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Op + " " + redactURL(uerr.URL) + ": " + redactErr(uerr.Err)
	}
	return err.Error()
}
