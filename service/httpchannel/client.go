// Package httpchannel is the adapter for notifier's generic HTTP channel protocol
// (docs/channels.md#channel-protocol): POST {base}/send with an Idempotency-Key, GET {base}/messages?ref= to query. It turns every
// response, error and silence into a delivery.Observation; deciding what that means is the service's job.
//
// The HTTP side (transport, one request on the wire per call, what a failure proves, the statuses all
// adapters read alike) is service/httpkit's. This package reads the protocol's own answers: the
// provider id in a 2xx (without it a 2xx is MALFORMED_RESPONSE: it may have been accepted), 409, and
// the query's count.
package httpchannel

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
	"github.com/notifierhq/notifier/service/redact"
)

// MaxResponseBytes bounds how much of a response body is read: a channel cannot make a worker buffer more.
const MaxResponseBytes = httpkit.MaxResponseBytes

// MaxRetryAfter caps a channel's Retry-After so a bad header cannot stall a task for days.
const MaxRetryAfter = httpkit.MaxRetryAfter

// Client calls one channel. Safe for concurrent use.
type Client struct {
	base *url.URL
	kit  *httpkit.Client
	// sendURL and queryPrefix are built from base once: Send posts to sendURL, Query gets
	// queryPrefix + the escaped ref.
	sendURL, queryPrefix string
	token                string // Options.Token
}

// Options tune the transport. The zero value verifies TLS against the system roots.
type Options struct {
	CAFile string // extra PEM roots for a private channel; verification stays on
	// Token, when set, is sent as "Authorization: Bearer <Token>" on every request. A 401 or 403 then
	// means the endpoint refuses our credential: ACCOUNT_REFUSED, which pauses the channel.
	Token string
}

// New checks base (http or https, no query) and builds a client. Redirects are never followed: a POST
// must not be replayed somewhere else behind our back.
func New(base string, opt Options) (*Client, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("%w: channel URL %q: want http(s)://host[:port][/path]", delivery.ErrInvalidInput, redact.URL(base))
	}
	if got, _ := u.User.Password(); redact.Misread(base, got) {
		// A password with an unescaped '/', '?' or '#' makes net/url read part of it as the host,
		// port or path: the client would call somewhere else, with a wrong password.
		return nil, fmt.Errorf("%w: channel URL %q: its password holds a character a URL needs percent-encoded ('/' as %%2F, '?' as %%3F, '#' as %%23)",
			delivery.ErrInvalidInput, redact.URL(base))
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	kit, err := httpkit.New(httpkit.Options{CAFile: opt.CAFile})
	if err != nil {
		return nil, err
	}
	b := u.String()
	return &Client{base: u, kit: kit, sendURL: b + "/send", queryPrefix: b + "/messages?ref=", token: opt.Token}, nil
}

// String is the base URL without credentials, for logs.
func (c *Client) String() string { return redact.URL(c.base.String()) }

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
	resp, failed := c.kit.Do(ctx, httpkit.Request{Method: http.MethodPost, URL: c.sendURL, Body: payload,
		Header: c.header(http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {msg.IdempotencyKey}})})
	if resp == nil {
		return failed
	}
	// The provider id is in the body: a 2xx without a readable one may still be an acceptance.
	if obs, ok := resp.Unreadable(true); ok {
		return obs
	}
	return classifySend(resp)
}

// Query asks the channel whether it accepted a message for ref; see ClassifyQuery.
func (c *Client) Query(ctx context.Context, ref string) delivery.Observation {
	resp, failed := c.kit.Do(ctx, httpkit.Request{Method: http.MethodGet, URL: c.queryPrefix + url.QueryEscape(ref),
		Header: c.header(http.Header{})})
	if resp == nil {
		failed.Detail = string(failed.Outcome) + ": " + failed.Detail
		failed.Outcome = delivery.OutcomeQueryFailed
		return failed
	}
	if obs, ok := resp.Unreadable(true); ok {
		return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, Detail: obs.Detail}
	}
	return ClassifyQuery(resp.Status, resp.Body)
}

// header adds the credential, when the client has one, to h.
func (c *Client) header(h http.Header) http.Header {
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
	return h
}

type sendResponse struct {
	ID       string `json:"id"`
	Replayed bool   `json:"replayed"`
}

// ClassifySend maps a send response to an observation, for a request that went to the channel
// directly. A 2xx we cannot read may still be an acceptance, so it is MALFORMED_RESPONSE (uncertain),
// never a rejection.
func ClassifySend(status int, header http.Header, body []byte) delivery.Observation {
	return classifySend(&httpkit.Response{Status: status, Header: header, Body: body})
}

func classifySend(resp *httpkit.Response) delivery.Observation {
	status, body := resp.Status, resp.Body
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
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		// The endpoint refuses our credential (the channel protocol, docs/channels.md#channel-protocol):
		// certainly not accepted, and fixed by an operator, not by giving up on the message.
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused,
			Detail: fmt.Sprintf("HTTP %d: the channel refuses our credential", status)}
	case status == http.StatusConflict:
		// The idempotency draft's "original request still in flight": it may yet be accepted.
		return delivery.Observation{Outcome: delivery.OutcomeInFlight, Detail: "HTTP 409: the original request is still being processed"}
	}
	// 429, 5xx and gateways' answers as every adapter reads them. The fakes promise a 5xx is
	// answered before acceptance; a real channel without that promise is configured so that its
	// 5xx counts as uncertain (server_errors_uncertain).
	return resp.Refused()
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
