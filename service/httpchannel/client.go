// Package httpchannel is the adapter for notifier's generic HTTP channel protocol (README, "Channel
// protocol"): POST {base}/send with an Idempotency-Key, GET {base}/messages?ref= to query. It turns every
// response, error and silence into a delivery.Observation; deciding what that means is the service's job.
package httpchannel

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
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
	"unicode"
	"unicode/utf8"

	"github.com/notifierhq/notifier/service/delivery"
)

// MaxResponseBytes bounds how much of a response body is read: a channel cannot make a worker buffer more.
const MaxResponseBytes = 64 << 10

// MaxRetryAfter caps a channel's Retry-After so a bad header cannot stall a task for days.
const MaxRetryAfter = time.Hour

// Client calls one channel. Safe for concurrent use.
type Client struct {
	base *url.URL
	http *http.Client
}

// Options tune the transport. The zero value verifies TLS against the system roots.
type Options struct {
	CAFile string // extra PEM roots for a private channel; verification stays on
}

// New checks base (http or https, no query) and builds a client. Redirects are never followed: a POST
// must not be replayed somewhere else behind our back.
func New(base string, opt Options) (*Client, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("%w: channel URL %q: want http(s)://host[:port][/path]", delivery.ErrInvalidInput, Redact(base))
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	tlsConf, err := TLSConfig(opt.CAFile, "")
	if err != nil {
		return nil, err
	}
	transport := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tlsConf,
		TLSHandshakeTimeout:   5 * time.Second,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // the caller's context bounds the whole call
	}
	return &Client{base: u, http: &http.Client{
		Transport:     transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       5 * time.Minute, // backstop only; callers pass a context with the real timeout
	}}, nil
}

// TLSConfig is the TLS setup every adapter uses: verification always on, TLS 1.2 or later, and the
// PEM roots of caFile added to the system's when given (for a private channel). serverName may be "".
func TLSConfig(caFile, serverName string) (*tls.Config, error) {
	conf := &tls.Config{ServerName: serverName, MinVersion: tls.VersionTLS12}
	if caFile == "" {
		return conf, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: CA file %s holds no PEM certificate", delivery.ErrInvalidInput, caFile)
	}
	conf.RootCAs = pool
	return conf, nil
}

// String is the base URL without credentials, for logs.
func (c *Client) String() string { return Redact(c.base.String()) }

type sendRequest struct {
	Ref  string `json:"ref"`
	To   string `json:"to"`
	Body string `json:"body"`
}

// Send posts the message. 200/201/202 with {"id","replayed"} is an acceptance; see ClassifySend.
func (c *Client) Send(ctx context.Context, msg delivery.Message) delivery.Observation {
	payload, err := json.Marshal(sendRequest{Ref: msg.Ref, To: msg.To, Body: msg.Body})
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "encode request: " + err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base.String()+"/send", bytes.NewReader(payload))
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "build request: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", msg.IdempotencyKey)
	status, header, body, err := c.do(req)
	if err != nil {
		return TransportObservation(ctx, err, redactErr)
	}
	return ClassifySend(status, header, body)
}

// Query asks the channel whether it accepted a message for ref; see ClassifyQuery.
func (c *Client) Query(ctx context.Context, ref string) delivery.Observation {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base.String()+"/messages?ref="+url.QueryEscape(ref), nil)
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, Detail: "build request: " + err.Error()}
	}
	status, _, body, err := c.do(req)
	if err != nil {
		obs := TransportObservation(ctx, err, redactErr)
		obs.Detail = string(obs.Outcome) + ": " + obs.Detail
		obs.Outcome = delivery.OutcomeQueryFailed
		return obs
	}
	return ClassifyQuery(status, body)
}

// do performs the request and reads at most MaxResponseBytes+1 of the body, within the context.
func (c *Client) do(req *http.Request) (int, http.Header, []byte, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	if err != nil {
		return 0, nil, nil, err
	}
	return resp.StatusCode, resp.Header, body, nil
}

// TransportObservation tells a request that certainly never left (no connection, failed TLS
// handshake) from one that may have been received (timeout, broken connection). describe turns an
// error into text without secrets; every HTTP adapter shares this mapping.
func TransportObservation(ctx context.Context, err error, describe func(error) string) delivery.Observation {
	var (
		opErr   *net.OpError
		certErr *tls.CertificateVerificationError
		recErr  tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &certErr) || errors.As(err, &recErr):
		// The TLS handshake failed: no request was ever sent.
		return delivery.Observation{Outcome: delivery.OutcomeConnectFailed, Detail: "TLS: " + describe(err)}
	case errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return delivery.Observation{Outcome: delivery.OutcomeTimeout, Detail: "no response within the client timeout"}
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return delivery.Observation{Outcome: delivery.OutcomeConnectFailed, Detail: "connect: " + describe(opErr.Err)}
	default:
		return delivery.Observation{Outcome: delivery.OutcomeIOError, Detail: describe(err)}
	}
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

type sendResponse struct {
	ID       string `json:"id"`
	Replayed bool   `json:"replayed"`
}

// ClassifySend maps a send response to an observation. A 2xx we cannot read may still be an
// acceptance, so it is MALFORMED_RESPONSE (uncertain), never a rejection.
func ClassifySend(status int, header http.Header, body []byte) delivery.Observation {
	switch {
	case status == http.StatusOK || status == http.StatusCreated || status == http.StatusAccepted:
		var r sendResponse
		if len(body) > MaxResponseBytes || json.Unmarshal(body, &r) != nil || !plausibleID(r.ID) {
			return delivery.Observation{Outcome: delivery.OutcomeMalformed, Detail: fmt.Sprintf("HTTP %d with an unreadable body", status)}
		}
		if r.Replayed {
			return delivery.Observation{Outcome: delivery.OutcomeAcceptedReplay, ProviderMsgID: r.ID}
		}
		return delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: r.ID}
	case status >= 200 && status < 300:
		return delivery.Observation{Outcome: delivery.OutcomeMalformed, Detail: fmt.Sprintf("unexpected HTTP %d", status)}
	case status == http.StatusConflict:
		// The idempotency draft's "original request still in flight": it may yet be accepted.
		return delivery.Observation{Outcome: delivery.OutcomeInFlight, Detail: "HTTP 409: the original request is still being processed"}
	case status == http.StatusTooManyRequests:
		return delivery.Observation{Outcome: delivery.OutcomeThrottled, RetryAfter: RetryAfter(header), Detail: "HTTP 429"}
	case status >= 500:
		// The fakes promise 5xx is answered before acceptance. A real channel without that promise
		// should be configured so that a 5xx counts as uncertain (see README, "Channel protocol").
		return delivery.Observation{Outcome: delivery.OutcomeHTTP5xx, RetryAfter: RetryAfter(header), Detail: "HTTP " + strconv.Itoa(status)}
	default:
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "HTTP " + strconv.Itoa(status) + Snippet(body)}
	}
}

type queryResponse struct {
	Found *int   `json:"found"`
	ID    string `json:"id"`
}

// ClassifyQuery maps a query response: found >= 1 -> QUERY_FOUND, found = 0 -> QUERY_NOT_FOUND,
// anything else QUERY_FAILED.
func ClassifyQuery(status int, body []byte) delivery.Observation {
	if status != http.StatusOK {
		return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, Detail: "HTTP " + strconv.Itoa(status)}
	}
	var r queryResponse
	if len(body) > MaxResponseBytes || json.Unmarshal(body, &r) != nil || r.Found == nil || *r.Found < 0 ||
		(*r.Found > 0 && r.ID != "" && !plausibleID(r.ID)) {
		return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, Detail: "HTTP 200 with an unreadable body"}
	}
	if *r.Found == 0 {
		return delivery.Observation{Outcome: delivery.OutcomeQueryNotFound}
	}
	return delivery.Observation{Outcome: delivery.OutcomeQueryFound, ProviderMsgID: r.ID}
}

// RetryAfter reads Retry-After as seconds or an HTTP date, capped at MaxRetryAfter.
func RetryAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	var d time.Duration
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil && secs > 0 {
		d = time.Duration(min(secs, int64(MaxRetryAfter/time.Second))) * time.Second
	} else if at, err := http.ParseTime(v); err == nil {
		d = time.Until(at)
	}
	return max(0, min(d, MaxRetryAfter))
}

// plausibleID accepts a provider id we can store and show: 1-500 bytes of printable UTF-8.
func plausibleID(id string) bool {
	if id == "" || len(id) > 500 || !utf8.ValidString(id) {
		return false
	}
	for _, r := range id {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// Snippet is the start of an error body for last_error, ": "-prefixed: printable characters only.
func Snippet(body []byte) string {
	s := strings.TrimSpace(string(body))
	if s == "" {
		return ""
	}
	if len(s) > 200 {
		s = s[:200]
	}
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return '?'
	}, strings.ToValidUTF8(s, "?"))
	return ": " + s
}

// Redact removes a password from a URL for logs and errors.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)" // it might hold a password we cannot find
	}
	if u.User == nil {
		return raw
	}
	return u.Redacted()
}

func redactErr(err error) string {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Op + " " + Redact(uerr.URL) + ": " + redactErr(uerr.Err)
	}
	return err.Error()
}
