// Package postmark delivers notifications as email through Postmark's API: one POST /email per
// attempt (https://postmarkapp.com/developer/api/email-api) with the server token in
// X-Postmark-Server-Token (https://postmarkapp.com/developer/api/overview).
//
// Contract: QUERYABLE. Postmark has no idempotency key: every accepted request is a new email. But each
// email carries the task's ref as the metadata field notifier_ref, and the outbound message search
// finds it: GET /messages/outbound?count=1&offset=0&metadata_notifier_ref=<ref>
// (https://postmarkapp.com/support/article/1125-custom-metadata-faq). So after a lost answer the
// service asks first and resends only when Postmark has no such email. The search lags behind
// acceptance, so a "not found" proves nothing until query_settle has passed (the kind's default,
// service/channelconfig/postmark.go), and it keeps messages for the account's retention (7 to 365
// days), which bounds max_in_flight_age (MaxInFlightAge).
//
// Response mapping (Postmark answers errors as {"ErrorCode":N,"Message":"..."}, HTTP 422 for most,
// https://postmarkapp.com/developer/api/overview#error-codes): 200 with a MessageID -> ACCEPTED (the
// provider id), a 2xx without one -> MALFORMED_RESPONSE; ErrorCode 406 (inactive recipient: bounced,
// complained or suppressed) -> REJECTED with Observation.Unregistered; ErrorCodes of the account's state (10 and HTTP 401 bad or missing server token, 400 sender signature
// not found, 401 sender signature not confirmed, 405 not allowed to send, 412 account pending approval,
// 413 account may not send) -> ACCOUNT_REFUSED naming the cause (accountStates), never the token; other
// ErrorCodes (300 invalid email request, 402 invalid JSON, ...) -> REJECTED with the code and
// Postmark's message; 429 -> THROTTLED with Retry-After; 5xx -> HTTP_5XX (502/504: GATEWAY_ERROR).
// Postmark does not promise that a 500 comes before it accepted ("in most cases the message is
// lost"), nor that a 429 was not processed, so the kind counts both as uncertain: the next attempt
// queries. No answer: CONNECT_FAILED, TIMEOUT or IO_ERROR as
// service/httpkit decides; each attempt puts at most one request on the wire.
package postmark

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/mail"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
	"github.com/notifierhq/notifier/service/redact"
)

// DefaultBaseURL is Postmark's API.
const DefaultBaseURL = "https://api.postmarkapp.com"

// DefaultMessageStream is the transactional stream every Postmark server has.
const DefaultMessageStream = "outbound"

// RefMetadata is the metadata field that carries the task's ref (and the search filters on).
const RefMetadata = "notifier_ref"

// Postmark keeps a message's content and metadata, and so finds it in the search, for the account's
// retention: 45 days by default, 7 to 365 days with the Retention Add-on, one setting for the whole
// account, and a change applies only to messages sent after it
// (https://postmarkapp.com/support/article/1289-how-does-the-retention-add-on-work,
// https://postmarkapp.com/support/article/838-how-long-are-inbound-and-outbound-messages-stored-in-activity).
const (
	MinRetention = 7 * 24 * time.Hour
	MaxRetention = 365 * 24 * time.Hour
	// DefaultRetention is the retention a channel that does not say is assumed to have: the shortest an
	// account can set, so the default is safe for every account.
	DefaultRetention = MinRetention
)

// ExpiryDayAllowance: Postmark shows a message's expiry as a date and does not say at what time of that
// day it is deleted; we assume the day's start, up to a day before retention has passed.
const ExpiryDayAllowance = 24 * time.Hour

// QueryReachAllowance is how long after its claim a query may still reach Postmark (its lease or client
// timeout, assumed at most 25 minutes) plus 5 minutes for the clocks' skew.
const QueryReachAllowance = 30 * time.Minute

// MaxInFlightAge is the longest max_in_flight_age a channel with this retention and query_settle may
// have: a query claimed before it is answered while an email accepted after the uncertain attempt began
// is still kept, with the settle time as a further margin. 0 or less: no such age.
func MaxInFlightAge(retention, settle time.Duration) time.Duration {
	return retention - ExpiryDayAllowance - settle - QueryReachAllowance
}

// Postmark's API error codes this adapter treats specially.
const (
	ErrorBadToken          = 10
	ErrorInvalidEmail      = 300
	ErrorInactiveRecipient = 406
)

// accountStates are Postmark's API error codes for a state of the account an operator can fix
// (https://postmarkapp.com/developer/api/overview#error-codes), with the cause an operator reads: the
// server token, the sender signature, sending not allowed (the account ran out of credits, or is paused),
// an account pending approval (it may send only to its own domains until then), an account that may not
// send. A refused request was not sent (ACCOUNT_REFUSED).
var accountStates = map[int]string{
	ErrorBadToken: "Postmark refused the server token: check server_token_env or server_token_file",
	400:           "no sender signature at Postmark for the from address: add it",
	401:           "the from address's sender signature is not confirmed at Postmark: confirm it",
	405:           "Postmark does not allow this account to send (out of credits, or sending paused)",
	412:           "the Postmark account is pending approval: it may send only to its own domains until approved",
	413:           "Postmark says this account may not send",
}

// Options configure a client.
type Options struct {
	ServerToken   string // required; from the environment or a file, never a flag
	From          string // required: a confirmed sender signature
	SubjectPrefix string
	MessageStream string // default DefaultMessageStream
	BaseURL       string // default DefaultBaseURL; plain http only to a loopback host (tests, the fake)
	CAFile        string
}

// Client sends email through Postmark. Safe for concurrent use.
type Client struct {
	token, from, prefix, stream string
	base                        string
	kit                         *httpkit.Client
}

// New checks the options and builds a client. Errors never contain the token.
func New(opt Options) (*Client, error) {
	token := strings.TrimSpace(opt.ServerToken)
	if token == "" || strings.ContainsAny(token, " \t\r\n") {
		return nil, fmt.Errorf("%w: Postmark server token: empty or holds white space", delivery.ErrInvalidInput)
	}
	from, err := mail.ParseAddress(opt.From)
	if err != nil {
		return nil, fmt.Errorf("%w: from %q: want an address such as \"Shop <noreply@example.com>\"", delivery.ErrInvalidInput, opt.From)
	}
	if strings.ContainsAny(opt.SubjectPrefix, "\r\n") {
		return nil, fmt.Errorf("%w: subject_prefix: holds a line break", delivery.ErrInvalidInput)
	}
	stream := opt.MessageStream
	if stream == "" {
		stream = DefaultMessageStream
	}
	base, err := checkBaseURL(opt.BaseURL)
	if err != nil {
		return nil, err
	}
	kit, err := httpkit.New(httpkit.Options{CAFile: opt.CAFile, MaxIdleConnsPerHost: 16})
	if err != nil {
		return nil, err
	}
	return &Client{token: token, from: from.String(), prefix: opt.SubjectPrefix, stream: stream, base: base, kit: kit}, nil
}

func checkBaseURL(raw string) (string, error) {
	if raw == "" {
		return DefaultBaseURL, nil
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("%w: base_url %q: want https://host[/path]", delivery.ErrInvalidInput, redact.Origin(raw))
	}
	if u.Scheme != "https" && (u.Scheme != "http" || !httpkit.IsLoopbackHost(u.Hostname())) {
		return "", fmt.Errorf("%w: base_url %q: https only (plain http only to a loopback host): the server token goes with every request", delivery.ErrInvalidInput, redact.Origin(raw))
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// String names the channel for logs.
func (c *Client) String() string { return "postmark " + c.base }

// Email is the body of POST /email, as far as notifier fills it.
type Email struct {
	From          string            `json:"From"`
	To            string            `json:"To"`
	Subject       string            `json:"Subject"`
	TextBody      string            `json:"TextBody"`
	Metadata      map[string]string `json:"Metadata"`
	MessageStream string            `json:"MessageStream"`
}

// Answer is Postmark's body for /email, accepted or not.
type Answer struct {
	To          string `json:"To"`
	SubmittedAt string `json:"SubmittedAt"`
	MessageID   string `json:"MessageID"`
	ErrorCode   int    `json:"ErrorCode"`
	Message     string `json:"Message"`
}

// Search is Postmark's answer to the outbound message search.
type Search struct {
	TotalCount int `json:"TotalCount"`
	Messages   []struct {
		MessageID string `json:"MessageID"`
		Status    string `json:"Status"`
	} `json:"Messages"`
}

func (c *Client) header() http.Header {
	return http.Header{
		"Accept":                  {"application/json"},
		"Content-Type":            {"application/json"},
		"X-Postmark-Server-Token": {c.token},
	}
}

// Send posts the email once. See the package comment for the outcome mapping.
func (c *Client) Send(ctx context.Context, msg delivery.Message) delivery.Observation {
	to, err := mail.ParseAddress(msg.To)
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "the address is not an email address"}
	}
	body, err := json.Marshal(Email{From: c.from, To: to.Address, Subject: delivery.Subject(c.prefix, msg.Body), TextBody: msg.Body,
		Metadata: map[string]string{RefMetadata: msg.Ref}, MessageStream: c.stream})
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "encode email: " + err.Error()}
	}
	resp, failed := c.kit.Do(ctx, httpkit.Request{Method: http.MethodPost, URL: c.base + "/email", Body: body, Header: c.header()})
	if resp == nil {
		return failed
	}
	return Classify(resp)
}

// Classify maps Postmark's answer to POST /email to an observation.
func Classify(resp *httpkit.Response) delivery.Observation {
	var a Answer
	if resp.Success() {
		if obs, bad := resp.Unreadable(true); bad {
			return obs
		}
		if err := json.Unmarshal(resp.Body, &a); err != nil || a.MessageID == "" {
			return delivery.Observation{Outcome: delivery.OutcomeMalformed,
				Detail: "HTTP " + strconv.Itoa(resp.Status) + " without a MessageID (it may have been accepted)" + httpkit.Snippet(resp.Body)}
		}
		return delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: a.MessageID}
	}
	_ = json.Unmarshal(resp.Body, &a) // an error body we cannot read leaves the status to decide
	what := "HTTP " + strconv.Itoa(resp.Status)
	if a.ErrorCode != 0 {
		what += " ErrorCode " + strconv.Itoa(a.ErrorCode)
	}
	if m := delivery.OneLine(a.Message, 200); m != "" {
		what += ": " + m
	}
	if cause, ok := accountStates[a.ErrorCode]; ok || resp.Status == http.StatusUnauthorized {
		if !ok {
			cause = accountStates[ErrorBadToken]
		}
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused, Detail: what + " (" + cause + ")"}
	}
	switch {
	case a.ErrorCode == ErrorInactiveRecipient:
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Unregistered: true,
			Detail: what + " (the recipient is inactive at Postmark: bounced, complained or suppressed)"}
	case resp.Status == http.StatusTooManyRequests:
		return delivery.Observation{Outcome: delivery.OutcomeThrottled, RetryAfter: httpkit.RetryAfter(resp.Header), Detail: what}
	case resp.Status >= 300 && resp.Status < 400:
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: what + ": redirects are not followed"}
	}
	obs := resp.Refused() // 5xx, gateways; any other 4xx (422 with an ErrorCode) is a rejection
	if a.ErrorCode != 0 || a.Message != "" {
		if obs.Outcome != delivery.OutcomeGatewayError {
			obs.Detail = what
		}
	}
	return obs
}

// Query searches the outbound messages for the ref's metadata. A hit is QUERY_FOUND with Postmark's
// MessageID; none is QUERY_NOT_FOUND (which the contract's query_settle and the account's retention
// qualify); anything else is QUERY_FAILED.
func (c *Client) Query(ctx context.Context, ref string) delivery.Observation {
	q := url.Values{"count": {"1"}, "offset": {"0"}, "metadata_" + RefMetadata: {ref}, "messagestream": {c.stream}}
	resp, failed := c.kit.Do(ctx, httpkit.Request{Method: http.MethodGet, URL: c.base + "/messages/outbound?" + q.Encode(), Header: c.header()})
	if resp == nil {
		return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, Detail: "search: " + failed.Detail}
	}
	if !resp.Success() || resp.BodyErr != nil {
		obs := Classify(resp)
		return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, RetryAfter: obs.RetryAfter, Detail: "search: " + obs.Detail}
	}
	var s Search
	if err := json.Unmarshal(resp.Body, &s); err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, Detail: "search: unreadable answer" + httpkit.Snippet(resp.Body)}
	}
	if s.TotalCount == 0 || len(s.Messages) == 0 {
		return delivery.Observation{Outcome: delivery.OutcomeQueryNotFound}
	}
	detail := ""
	if s.TotalCount > 1 {
		detail = strconv.Itoa(s.TotalCount) + " emails carry this ref" // an earlier resend went out too
	}
	return delivery.Observation{Outcome: delivery.OutcomeQueryFound, ProviderMsgID: s.Messages[0].MessageID, Detail: detail}
}
