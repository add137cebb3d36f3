// Package resend delivers notifications as email through Resend's API: one POST /emails per attempt
// (https://resend.com/docs/api-reference/emails/send-email), authenticated with an API key as a
// Bearer token.
//
// Contract: IDEMPOTENT. Every attempt of a task carries the same Idempotency-Key header (the task's
// key, ntf-<ref>), and Resend answers a request whose key it saw in the last 24 hours with the
// original response and sends nothing again
// (https://resend.com/docs/dashboard/emails/idempotency-keys). Resend does not say whether an answer
// is such a replay, so a deduplicated resend is reported ACCEPTED, like a first acceptance. The
// channels file's idempotency_window defaults to, and may not exceed, IdempotencyWindow: those 24
// hours less the time a resend may take to reach Resend and a clock-skew allowance, so that no resend
// arrives after the key expired.
//
// The message: from the configured sender to msg.To, the subject the body's first line (after an
// optional prefix), the body as the plain-text part, and the task's ref as the tag notifier_ref
// (Resend returns tags in its webhooks, so a receiver can match the message to the task).
//
// Response mapping (https://resend.com/docs/api-reference/errors): 200 {"id":...} -> ACCEPTED with
// the id; a 2xx without a readable id -> MALFORMED_RESPONSE (it may have been accepted); 409
// concurrent_idempotent_requests -> IN_FLIGHT (the first request with our key is still being
// processed: uncertain, resent later with the key); 409 invalid_idempotent_request -> REJECTED (the
// key was used with another payload: an earlier attempt reached Resend, so the task's history is
// uncertain and it is parked); every 401 and 403, which Resend documents only for states of the
// account (the API key: missing_api_key, restricted_api_key, invalid_api_key; the sender: a domain not
// verified, "testing emails only to your own address") -> ACCOUNT_REFUSED with a detail that names the
// cause, never the key; 429 rate_limit_exceeded -> THROTTLED with Retry-After; 429
// daily_quota_exceeded -> THROTTLED, at least an hour when Resend sends no Retry-After; other 4xx
// (validation_error, missing_required_field, invalid_from_address 422, ...) -> REJECTED with Resend's
// name and message; 5xx -> HTTP_5XX (502/504: GATEWAY_ERROR). Resend promises neither that a 5xx nor
// that a 429 comes before it accepted the email (https://resend.com/docs/api-reference/rate-limit says
// only that the limit was exceeded), so the kind counts both as uncertain
// (service/channelconfig/resend.go): the next attempt resends with the key. No answer: CONNECT_FAILED,
// TIMEOUT or IO_ERROR as service/httpkit decides; each attempt puts at most one request on the wire.
package resend

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

// DefaultBaseURL is Resend's API.
const DefaultBaseURL = "https://api.resend.com"

// KeyLifetime is how long Resend remembers an idempotency key: "We keep idempotency keys in our system
// for 24 hours" (https://resend.com/docs/dashboard/emails/idempotency-keys). Resend does not say from
// when; we count from the first request that carried the key.
const KeyLifetime = 24 * time.Hour

// CallReachAllowance is how long after its claim a resend may still reach Resend: a call runs until its
// lease ends (or its client timeout, if that is longer: work --allow-lease-overlap). It assumes work's
// --lease and --timeout at most 25 minutes (their defaults: 30 s and 10 s).
const CallReachAllowance = 25 * time.Minute

// ClockSkewAllowance is how far the database's clock (which ages the uncertainty) and Resend's (which
// ages the key) may disagree.
const ClockSkewAllowance = 5 * time.Minute

// IdempotencyWindow is the kind's idempotency_window: how long after the first uncertain attempt was
// claimed a resend may still be claimed. That attempt's request reached Resend after its claim, so its
// key lives at least KeyLifetime from then; a resend claimed before IdempotencyWindow reaches Resend
// before KeyLifetime, however late in its lease it is sent and however the clocks disagree.
const IdempotencyWindow = KeyLifetime - CallReachAllowance - ClockSkewAllowance

// MaxKeyLength is the longest Idempotency-Key Resend accepts.
const MaxKeyLength = 256

// RefTag is the name of the tag that carries the task's ref.
const RefTag = "notifier_ref"

// Options configure a client.
type Options struct {
	APIKey        string // required; from the environment or a file, never a flag
	From          string // required: "Name <sender@verified-domain>" or an address
	SubjectPrefix string // prepended to the body's first line
	BaseURL       string // default DefaultBaseURL; plain http only to a loopback host (tests, the fake)
	CAFile        string // extra PEM roots; verification stays on
}

// Client sends email through Resend. Safe for concurrent use.
type Client struct {
	key, from, prefix string
	endpoint          string
	kit               *httpkit.Client
}

// New checks the options and builds a client. Errors never contain the API key.
func New(opt Options) (*Client, error) {
	key := strings.TrimSpace(opt.APIKey)
	if key == "" || strings.ContainsAny(key, " \t\r\n") {
		return nil, fmt.Errorf("%w: Resend API key: empty or holds white space", delivery.ErrInvalidInput)
	}
	from, err := mail.ParseAddress(opt.From)
	if err != nil {
		return nil, fmt.Errorf("%w: from %q: want an address such as \"Shop <noreply@example.com>\"", delivery.ErrInvalidInput, opt.From)
	}
	if strings.ContainsAny(opt.SubjectPrefix, "\r\n") {
		return nil, fmt.Errorf("%w: subject_prefix: holds a line break", delivery.ErrInvalidInput)
	}
	base, err := CheckBaseURL(opt.BaseURL)
	if err != nil {
		return nil, err
	}
	kit, err := httpkit.New(httpkit.Options{CAFile: opt.CAFile, MaxIdleConnsPerHost: 16})
	if err != nil {
		return nil, err
	}
	return &Client{key: key, from: from.String(), prefix: opt.SubjectPrefix, endpoint: base + "/emails", kit: kit}, nil
}

// CheckBaseURL accepts an https URL without query or fragment, or plain http to a loopback host (the
// API key is sent with every request). "" is DefaultBaseURL. The result has no trailing slash.
func CheckBaseURL(raw string) (string, error) {
	if raw == "" {
		return DefaultBaseURL, nil
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("%w: base_url %q: want https://host[/path]", delivery.ErrInvalidInput, redact.Origin(raw))
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && httpkit.IsLoopbackHost(u.Hostname()):
	default:
		return "", fmt.Errorf("%w: base_url %q: https only (plain http only to a loopback host): the API key goes with every request", delivery.ErrInvalidInput, redact.Origin(raw))
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// String names the channel for logs.
func (c *Client) String() string { return "resend " + c.endpoint }

// Tag is one of Resend's email tags.
type Tag struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Email is the body of POST /emails, as far as notifier fills it.
type Email struct {
	From    string   `json:"from"`
	To      []string `json:"to"`
	Subject string   `json:"subject"`
	Text    string   `json:"text"`
	Tags    []Tag    `json:"tags"`
}

// Sent is Resend's answer to an accepted email.
type Sent struct {
	ID string `json:"id"`
}

// Error is Resend's error body.
type Error struct {
	StatusCode int    `json:"statusCode"`
	Name       string `json:"name"`
	Message    string `json:"message"`
}

// Send posts the email once. See the package comment for the outcome mapping.
func (c *Client) Send(ctx context.Context, msg delivery.Message) delivery.Observation {
	if msg.IdempotencyKey == "" || len(msg.IdempotencyKey) > MaxKeyLength {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "no usable idempotency key (1 to 256 characters)"}
	}
	to, err := mail.ParseAddress(msg.To)
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "the address is not an email address"}
	}
	body, err := json.Marshal(Email{From: c.from, To: []string{to.Address}, Subject: delivery.Subject(c.prefix, msg.Body),
		Text: msg.Body, Tags: []Tag{{Name: RefTag, Value: msg.Ref}}})
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "encode email: " + err.Error()}
	}
	resp, failed := c.kit.Do(ctx, httpkit.Request{Method: http.MethodPost, URL: c.endpoint, Body: body, Header: http.Header{
		"Authorization":   {"Bearer " + c.key},
		"Content-Type":    {"application/json"},
		"Idempotency-Key": {msg.IdempotencyKey},
	}})
	if resp == nil {
		return failed
	}
	return Classify(resp)
}

// Classify maps Resend's answer to an observation.
func Classify(resp *httpkit.Response) delivery.Observation {
	if resp.Success() {
		if obs, bad := resp.Unreadable(true); bad {
			return obs
		}
		var sent Sent
		if err := json.Unmarshal(resp.Body, &sent); err != nil || sent.ID == "" {
			return delivery.Observation{Outcome: delivery.OutcomeMalformed,
				Detail: "HTTP " + strconv.Itoa(resp.Status) + " without an email id (it may have been accepted)" + httpkit.Snippet(resp.Body)}
		}
		return delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: sent.ID}
	}
	var e Error
	_ = json.Unmarshal(resp.Body, &e) // an error body we cannot read leaves the status to decide
	what := "HTTP " + strconv.Itoa(resp.Status)
	if e.Name != "" {
		what += " " + e.Name
	}
	if e.Message != "" {
		what += ": " + delivery.OneLine(e.Message, 200)
	}
	switch {
	case resp.Status == http.StatusConflict && e.Name == "concurrent_idempotent_requests":
		return delivery.Observation{Outcome: delivery.OutcomeInFlight, RetryAfter: httpkit.RetryAfter(resp.Header), Detail: what}
	case resp.Status == http.StatusConflict && e.Name == "invalid_idempotent_request":
		return delivery.Observation{Outcome: delivery.OutcomeRejected,
			Detail: what + " (an earlier attempt with this key reached Resend: check whether it was sent)"}
	case resp.Status == http.StatusConflict:
		// A 409 we cannot name concerns our key all the same: the first request may be in progress.
		return delivery.Observation{Outcome: delivery.OutcomeInFlight, RetryAfter: httpkit.RetryAfter(resp.Header), Detail: what}
	case resp.Status == http.StatusUnauthorized || resp.Status == http.StatusForbidden:
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused, Detail: what + " (" + accountCause(e.Name) + ")"}
	case resp.Status == http.StatusTooManyRequests:
		obs := delivery.Observation{Outcome: delivery.OutcomeThrottled, RetryAfter: httpkit.RetryAfter(resp.Header), Detail: what}
		if e.Name == "daily_quota_exceeded" && obs.RetryAfter == 0 {
			obs.RetryAfter = httpkit.MaxRetryAfter // the quota is per day: trying again in seconds is pointless
		}
		return obs
	case resp.Status >= 300 && resp.Status < 400:
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: what + ": redirects are not followed"}
	}
	obs := resp.Refused() // 5xx, gateways, and any other 4xx: a rejection
	if e.Name != "" && obs.Outcome != delivery.OutcomeGatewayError {
		obs.Detail = what // Resend's own words (a gateway's detail says why it is uncertain)
	}
	return obs
}

// accountCause names, for an operator, the state of the account behind a 401 or 403. Resend documents
// these as the API key (missing_api_key, restricted_api_key: 401; invalid_api_key: 403) or the sender
// (validation_error 403: testing emails only to your own address, or the domain is not verified;
// invalid_from_address, invalid_to_address 403 in older versions of the page):
// https://resend.com/docs/api-reference/errors.
func accountCause(name string) string {
	if strings.HasSuffix(name, "_api_key") || name == "" {
		return "Resend refused the API key: check api_key_env or api_key_file"
	}
	return "Resend does not let this account send from this sender: verify the from address's domain at Resend"
}

// Query is not offered: Resend cannot look an email up by our reference (the contract is the key).
func (c *Client) Query(context.Context, string) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, Detail: "not supported: Resend is idempotent, not queryable"}
}
