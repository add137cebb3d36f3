// Package httpkit is the HTTP side that every HTTP channel adapter shares (service/httpchannel,
// service/webhook, service/webpush), so that its rules are written once:
//
//   - One transport: TLS always verified (TLS 1.2 or later, extra roots from a CA file), the proxy
//     from the environment, bounded dial and handshake, a keep-alive pool, HTTP/2 over https (ALPN)
//     and HTTP/1.1 otherwise. For destinations users supply, an Egress policy refuses internal
//     addresses as they are dialled (a certain refusal: REJECTED), and no proxy is used.
//   - At most one request on the wire per Do. net/http's Transport sends a request again by itself
//     when a kept-alive connection breaks and it judges the request replayable: over HTTP/1 any GET,
//     and any request carrying an Idempotency-Key or X-Idempotency-Key header, whose body it can
//     rewind (request.go isReplayable, transport.go shouldRetryRequest); over HTTP/2 any request
//     without a body or with GetBody, after a stream reset the peer may send once it processed the
//     request (h2_bundle.go http2shouldRetryRequest, http2canRetryError). Each such resend is a
//     channel call without an attempt row (R3) and, on a channel without a key, a second message (R4).
//     Do therefore gives every request a body the transport cannot rewind (see newRequest); the only
//     retries left are those of a request the transport proves it never wrote.
//   - When no answer came, what is known about the request: nothing of it written (no connection,
//     failed TLS, a proxy refusing CONNECT, a timeout before writing) is CONNECT_FAILED, certain; once
//     any of it may have been written, a timeout is TIMEOUT and a broken connection IO_ERROR, both
//     uncertain. Do traces the request (net/http/httptrace) to know which. An HTTP/2 stream the
//     server refused (REFUSED_STREAM) or left out of its GOAWAY's last stream id was not processed
//     (RFC 9113 section 8.7): CONNECT_FAILED too.
//   - The answer: the status line decides, and the body (read within the caller's context, at most
//     MaxResponseBytes) only adds to it. 429, 5xx and gateways' answers are read alike by every adapter
//     (Response.ServerAnswer); a 2xx whose body could not be read is never a certain failure
//     (Response.Unreadable).
//
// Standard library, service/delivery and service/redact (its error texts follow the one redaction
// rule) only: adapters must not pull pgx in.
package httpkit

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/redact"
)

// MaxResponseBytes bounds how much of a response body is read: a channel cannot make a worker buffer
// more. Do reads one byte more, so an adapter can tell a body that was too long.
const MaxResponseBytes = 64 << 10

// MaxRetryAfter caps a channel's Retry-After so a bad header cannot stall a task for days.
const MaxRetryAfter = time.Hour

// BackstopTimeout bounds a call whose context has no deadline (callers pass the real timeout): an
// HTTP call here, an SMTP session in service/smtpchannel.
const BackstopTimeout = 5 * time.Minute

// Options tune the transport. The zero value verifies TLS against the system roots and takes the
// proxy from the environment (HTTPS_PROXY, HTTP_PROXY, NO_PROXY).
type Options struct {
	CAFile string // extra PEM roots for a private channel; verification stays on
	// Proxy chooses the proxy of a request, as http.Transport.Proxy; default http.ProxyFromEnvironment.
	Proxy func(*http.Request) (*url.URL, error)
	// MaxIdleConnsPerHost is the keep-alive pool per host; default 1024. Over HTTP/1.1 a worker holds one
	// connection per call in flight to a provider (its window, 1024 by default): a smaller pool would
	// close most of them after each answer and dial, and shake hands, again for the next call.
	MaxIdleConnsPerHost int
	// Egress, for destinations users supply, refuses internal addresses when dialling (see Egress).
	// Such a transport uses no forward proxy: with Egress, Proxy must be nil and the environment's
	// proxy settings are ignored.
	Egress *Egress
}

// TLSConfig is the TLS setup of every adapter (SMTP's STARTTLS too): verification always on, TLS 1.2 or
// later, and the PEM roots of caFile added to the system's when given (a private channel).
// serverName may be "" (taken from the URL).
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

// dialer bounds every adapter's TCP connect and keeps pooled connections probed.
var dialer = net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}

// NewTransport is the transport of every HTTP adapter. Tests may adjust the result (Protocols, say)
// before handing it to NewClient.
func NewTransport(opt Options) (*http.Transport, error) {
	tlsConf, err := TLSConfig(opt.CAFile, "")
	if err != nil {
		return nil, err
	}
	proxy, dial := opt.Proxy, dialer.DialContext
	if opt.Egress != nil {
		if proxy != nil {
			return nil, fmt.Errorf("%w: a forward proxy dials the destination itself, out of the egress policy's sight", delivery.ErrInvalidInput)
		}
		guarded := dialer
		guarded.ControlContext = opt.Egress.control
		dial = guarded.DialContext
	} else if proxy == nil {
		proxy = http.ProxyFromEnvironment
	}
	idle := opt.MaxIdleConnsPerHost
	if idle <= 0 {
		idle = 1024
	}
	return &http.Transport{
		Proxy:               recordProxy(proxy),
		DialContext:         dial,
		TLSClientConfig:     tlsConf,
		TLSHandshakeTimeout: 5 * time.Second,
		// A custom TLS config turns HTTP/2 off unless asked for: https channels get it by ALPN.
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: idle,
		IdleConnTimeout:     90 * time.Second,
		// No ResponseHeaderTimeout: the caller's context bounds the whole call, body included.
	}, nil
}

// Client calls channels over one transport. Safe for concurrent use.
type Client struct {
	rt http.RoundTripper
}

// New builds a client on NewTransport(opt).
func New(opt Options) (*Client, error) {
	t, err := NewTransport(opt)
	if err != nil {
		return nil, err
	}
	return NewClient(t), nil
}

// NewClient builds a client on rt: a transport from NewTransport, possibly adjusted or wrapped by a
// test. It is called through RoundTrip, which never follows a redirect: a 3xx is an answer like any
// other (a POST must not be replayed somewhere else behind our back).
func NewClient(rt http.RoundTripper) *Client { return &Client{rt: rt} }

// Request is one call: Body is sent as it is (none for a GET).
type Request struct {
	Method string
	URL    string
	Header http.Header
	Body   []byte
}

// Response is a status line, its headers and the start of the body.
type Response struct {
	Status int
	Header http.Header
	// Body is at most MaxResponseBytes+1 bytes: whatever arrived, also when BodyErr is set.
	Body []byte
	// BodyErr is why the body could not be read to its end (a timeout, a broken connection).
	BodyErr error
	// Proxy is the forward proxy that relayed a plain-http request (nil otherwise): its own 5xx may
	// come after it passed the request on.
	Proxy *url.URL
	Proto string
}

// call is what one Do learns about its request while the transport works: whether any byte of it
// may be on the wire, and through which proxy it went (whether that proxy relayed the request itself
// follows from the two schemes: see relays). The transport calls the hooks from its own goroutines.
type call struct {
	connected atomic.Bool // the transport handed the request a connection (GotConn)
	wrote     atomic.Bool // a header field was written, at least into the connection's buffer
	reused    atomic.Bool
	proxy     atomic.Pointer[url.URL] // any proxy the transport chose for the request
}

// progress is what the call knows about its request so far.
func (c *call) progress() Progress {
	return Progress{Connected: c.connected.Load(), Wrote: c.wrote.Load(), Reused: c.reused.Load(), Proxy: c.proxy.Load()}
}

type callKey struct{}

// recordProxy wraps the transport's proxy choice to note it on the request's call.
func recordProxy(next func(*http.Request) (*url.URL, error)) func(*http.Request) (*url.URL, error) {
	if next == nil {
		return nil // no proxy
	}
	return func(req *http.Request) (*url.URL, error) {
		u, err := next(req)
		if c, ok := req.Context().Value(callKey{}).(*call); ok && err == nil && u != nil {
			c.proxy.Store(u)
		}
		return u, err
	}
}

// relays reports whether proxy (nil for none) relays a request to target itself: a plain-http
// request through an HTTP proxy. An https request through a proxy is a CONNECT tunnel, and a SOCKS
// proxy tunnels too: the answer comes end to end from the provider.
func relays(target, proxy *url.URL) bool {
	return proxy != nil && target.Scheme == "http" && (proxy.Scheme == "http" || proxy.Scheme == "https")
}

// newRequest builds a request that neither HTTP/1 nor HTTP/2 will send twice. Its body is never nil
// or http.NoBody and has no GetBody, which is what both transports test before a resend:
//
//   - HTTP/1 (transport.go shouldRetryRequest): after anything was written only a replayable request
//     is resent, and isReplayable needs a nil/NoBody body or GetBody; when the transport proves
//     nothing was written (nothingWrittenError) it resends only with outgoingLength() == 0 or
//     GetBody, and a non-nil body of unknown or positive length has neither.
//   - HTTP/2 (h2_bundle.go http2shouldRetryRequest): a body that is not nil/NoBody and has no
//     GetBody is resent only after errClientConnUnusable, which means the connection could not take
//     the stream at all (awaitOpenSlotForStreamLocked), before any frame of it was written. By then
//     the body counts as closed, so the HTTP/1 transport's loop cannot rewind it and the call fails
//     with nothing sent (transportObservation: CONNECT_FAILED).
//
// The one retry left is the HTTP/1 transport's after http2isNoCachedConnError with the body
// untouched: the HTTP/2 pool had no usable connection for a request it never started, which then
// goes out once on a new connection. Both are of a request never written.
//
// A GET (a query) gets an empty body of the same kind. On the wire: HTTP/1 probes a body of unknown
// length on a GET (transfer.go probeRequestBody), finds it empty and sends a plain GET, no
// Content-Length and no Transfer-Encoding; HTTP/2 sends HEADERS without END_STREAM and then one empty
// DATA frame with END_STREAM, which servers read as an empty body. Other ways were weighed: a
// non-canonical "idempotency-key" header name hides the key from isReplayable but not a GET, and
// not HTTP/2, which looks at the body only; a connection per call (DisableKeepAlives) stops HTTP/1's
// resends, which need a reused connection, but not HTTP/2's, and costs a handshake per call.
func newRequest(ctx context.Context, r Request) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, r.Method, r.URL, nil)
	if err != nil {
		return nil, err
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if u := req.URL.User; u != nil && req.Header.Get("Authorization") == "" {
		// What http.Client does and RoundTrip does not: user:password@ in a channel URL is Basic
		// authentication.
		password, _ := u.Password()
		req.SetBasicAuth(u.Username(), password)
	}
	// io.NopCloser over a bytes.Reader: an in-memory body (net/http then writes headers and body in
	// one go), neither nil nor NoBody, and without GetBody.
	req.Body = io.NopCloser(bytes.NewReader(r.Body))
	req.GetBody = nil
	req.ContentLength = int64(len(r.Body)) // 0 means "unknown" with a body: see above for a GET
	return req, nil
}

// Do sends r once and reads the answer's first MaxResponseBytes+1 body bytes, all within ctx. With no
// status line it returns nil and the observation of the failure: CONNECT_FAILED when nothing of the
// request was written, otherwise TIMEOUT or IO_ERROR.
func (c *Client) Do(ctx context.Context, r Request) (*Response, delivery.Observation) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, BackstopTimeout)
		defer cancel()
	}
	cl := &call{}
	ctx = context.WithValue(ctx, callKey{}, cl)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			cl.connected.Store(true)
			if info.Reused {
				cl.reused.Store(true)
			}
		},
		WroteHeaderField: func(string, []string) { cl.wrote.Store(true) },
		WroteHeaders:     func() { cl.wrote.Store(true) },
	})
	req, err := newRequest(ctx, r)
	if err != nil {
		return nil, delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "build request: " + redact.Error(err)}
	}
	resp, err := c.rt.RoundTrip(req)
	if err != nil {
		return nil, transportObservation(ctx, err, cl.progress())
	}
	defer resp.Body.Close()
	body, bodyErr := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	out := &Response{Status: resp.StatusCode, Header: resp.Header, Body: body, BodyErr: bodyErr, Proto: resp.Proto}
	if p := cl.proxy.Load(); relays(req.URL, p) {
		out.Proxy = p
	}
	return out, delivery.Observation{}
}

// Progress is what a call learned about its request before it failed, from Do's trace.
type Progress struct {
	// Connected: the transport handed the request a connection (GotConn). A request is written only
	// on such a connection, so without it nothing was sent.
	Connected bool
	// Wrote: a header field of the request was encoded for the connection. The hooks fire before the
	// bytes leave (into a buffer, before a frame is flushed), so false means nothing was written so
	// far; but HTTP/2 writes from its own goroutine, which may still be at work when the call returns
	// on a timeout, so only Connected proves nothing will be.
	Wrote  bool
	Reused bool     // on a kept-alive connection
	Proxy  *url.URL // the proxy the transport chose, if any
}

// MayHaveSent reports whether any byte of the request may have reached the wire.
func (p Progress) MayHaveSent() bool { return p.Connected || p.Wrote }

// errCannotRewind is net/http's text for a retry it wanted and could not make: the transport resends
// a body without GetBody only after proving nothing was written, and here (see newRequest) that is
// HTTP/2's errClientConnUnusable, returned before the request got a stream, after which the body
// counts as closed. Matched by text, as net/http does not export it: should the text change, such a
// call is reported uncertain, which is safe.
const errCannotRewind = "net/http: cannot rewind body after connection loss"

// transportObservation maps a Do that got no status line, with what Do's trace learned (p). Nothing
// of the request written is certain, whatever the error says: CONNECT_FAILED (no connection, TLS
// refused, a proxy refusing or not answering CONNECT, a timeout before writing). Once something may
// have been written, the channel may have the request: TIMEOUT when the deadline passed, otherwise
// IO_ERROR.
func transportObservation(ctx context.Context, err error, p Progress) delivery.Observation {
	var refused *RefusedError
	if errors.As(err, &refused) {
		// The Egress policy refused the address before connecting: no request, no answer to quote.
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: refused.Error()}
	}
	if why := notProcessed(err); why != "" {
		return delivery.Observation{Outcome: delivery.OutcomeConnectFailed,
			Detail: "not processed (" + why + "): " + redact.Error(err)}
	}
	timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded) || IsTimeout(err)
	if !p.Wrote && err.Error() == errCannotRewind {
		// The transport proved nothing of the request was written and could not send it again.
		return delivery.Observation{Outcome: delivery.OutcomeConnectFailed,
			Detail: "the connection could not take the request (nothing sent): " + err.Error()}
	}
	if !p.MayHaveSent() {
		var (
			certErr *tls.CertificateVerificationError
			recErr  tls.RecordHeaderError
			alert   tls.AlertError
		)
		what := "connect"
		if errors.As(err, &certErr) || errors.As(err, &recErr) || errors.As(err, &alert) {
			what = "TLS"
		} else if p.Proxy != nil {
			what = "proxy " + redact.Origin(p.Proxy.String())
		}
		if timedOut {
			what += ": no connection within the client timeout"
		}
		return delivery.Observation{Outcome: delivery.OutcomeConnectFailed, Detail: what + " (nothing sent): " + redact.Error(err)}
	}
	if timedOut {
		return delivery.Observation{Outcome: delivery.OutcomeTimeout, Detail: "no response within the client timeout"}
	}
	where := "the connection"
	if p.Reused {
		where = "the kept-alive connection"
	}
	return delivery.Observation{Outcome: delivery.OutcomeIOError,
		Detail: where + " broke after the request was sent, without an answer: " + redact.Error(err)}
}

// The texts of net/http's HTTP/2 errors for a stream the server did not process (h2_bundle.go). The
// transport would resend such a request (http2canRetryError) but cannot rewind our body (see
// newRequest), so it returns its error inside errCannotRetryPrefix's text, formatted with %v: only
// the text is left to match, as the types are not exported. Should a text change, such a call is
// reported IO_ERROR, uncertain, which is safe.
const (
	errCannotRetryPrefix = "http2: Transport: cannot retry err ["
	// A RST_STREAM with REFUSED_STREAM: http2StreamError's text ends with its code, then the cause.
	refusedStreamCode = "; REFUSED_STREAM"
	// A GOAWAY whose last stream id is below the stream (setGoAway): with NO_ERROR, or the stream
	// being the connection's first, with this prefix and the error code.
	errGotGoAway     = "http2: Transport received Server's graceful shutdown GOAWAY"
	errGoAwayOnFirst = "http2: Transport received GOAWAY from server ErrCode:"
)

// notProcessed names why an HTTP/2 server certainly did not process the request, or returns "":
// RFC 9113 section 8.7 makes a stream reset with REFUSED_STREAM, and one above the last stream id of
// a GOAWAY, unprocessed, so it can be sent again safely. Another reset (PROTOCOL_ERROR, say), or a
// GOAWAY that covers the stream and a broken connection after it, says nothing of the sort.
func notProcessed(err error) string {
	msg := err.Error()
	if inner, ok := strings.CutPrefix(msg, errCannotRetryPrefix); ok {
		inner, _, _ = strings.Cut(inner, "] after Request.Body was written")
		if strings.HasPrefix(inner, "stream error: ") && strings.Contains(inner, refusedStreamCode) {
			return "HTTP/2 REFUSED_STREAM"
		}
		if inner == errGotGoAway {
			return "HTTP/2 GOAWAY below this stream"
		}
		return ""
	}
	if strings.HasPrefix(msg, errGoAwayOnFirst) {
		return "HTTP/2 GOAWAY below this stream"
	}
	return ""
}

// IsTimeout reports whether err is a deadline's: context.DeadlineExceeded anywhere in its chain, or
// the first error in the chain with a Timeout method (a net.Error, a *url.Error) says so. Both are
// checked: a wrapper's Timeout may answer false above a DeadlineExceeded. The SMTP adapter uses it too.
func IsTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &t) && t.Timeout())
}

// Success reports a 2xx status.
func (r *Response) Success() bool { return r.Status >= 200 && r.Status < 300 }

// Unreadable is the rule every adapter applies to "the status line said 2xx, reading the body
// failed": the channel may have accepted, so it is never a certain failure. An adapter that needs the
// body to know what happened (the generic protocol's provider id) gets MALFORMED_RESPONSE, uncertain,
// and ok=true; one for which a 2xx alone is the acceptance (Standard Webhooks, Web Push's 201 with
// Location) passes needBody=false and classifies the status. A failed body after another status
// changes nothing either: the status line was whole, and the body only feeds a snippet.
func (r *Response) Unreadable(needBody bool) (delivery.Observation, bool) {
	if r.BodyErr == nil || !r.Success() || !needBody {
		return delivery.Observation{}, false
	}
	return delivery.Observation{Outcome: delivery.OutcomeMalformed,
		Detail: fmt.Sprintf("HTTP %d, then the body could not be read (it may have been accepted): %s", r.Status, redact.Error(r.BodyErr))}, true
}

// ServerAnswer maps the statuses every adapter reads alike, ok=false for the others:
//
//   - 429: THROTTLED, with Retry-After (capped at MaxRetryAfter).
//   - 502 and 504: GATEWAY_ERROR, uncertain. A gateway answered (a forward proxy, the provider's own
//     load balancer) and it may have passed the request on before failing; it is never "refused
//     before acceptance".
//   - any other 5xx of a plain-http request that a forward proxy relayed: GATEWAY_ERROR too, since it
//     may be the proxy's own answer after it forwarded the request.
//   - any other 5xx: HTTP_5XX, refused before acceptance as the provider promises (a contract with
//     ServerErrorsUncertain makes it uncertain).
func (r *Response) ServerAnswer() (delivery.Observation, bool) {
	// A switch on the status and ifs, not a tagless switch: coverage profiles (and so `just mutants`)
	// count no case expression of a tagless switch as a statement.
	code := "HTTP " + strconv.Itoa(r.Status)
	switch r.Status {
	case http.StatusTooManyRequests:
		return delivery.Observation{Outcome: delivery.OutcomeThrottled, RetryAfter: RetryAfter(r.Header), Detail: code}, true
	case http.StatusBadGateway, http.StatusGatewayTimeout:
		return delivery.Observation{Outcome: delivery.OutcomeGatewayError, RetryAfter: RetryAfter(r.Header),
			Detail: code + " from a gateway: the request may have been passed on and accepted"}, true
	}
	if r.Status < 500 || r.Status >= 600 {
		return delivery.Observation{}, false
	}
	if r.Proxy != nil { // set only for a relay
		return delivery.Observation{Outcome: delivery.OutcomeGatewayError, RetryAfter: RetryAfter(r.Header),
			Detail: code + " through the forward proxy " + redact.Origin(r.Proxy.String()) + ": maybe the proxy's own answer after it passed the request on"}, true
	}
	return delivery.Observation{Outcome: delivery.OutcomeHTTP5xx, RetryAfter: RetryAfter(r.Header), Detail: code}, true
}

// Refused is the observation of an answer that no adapter-specific rule took: ServerAnswer's for
// 429, 5xx and gateways, otherwise REJECTED with "HTTP <status>" and the body's Snippet. An adapter
// handles its 2xx, 3xx and other special statuses before calling it.
func (r *Response) Refused() delivery.Observation {
	if obs, ok := r.ServerAnswer(); ok {
		return obs
	}
	return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "HTTP " + strconv.Itoa(r.Status) + Snippet(r.Body)}
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
