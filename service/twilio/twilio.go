// Package twilio sends SMS through Twilio's Programmable Messaging API: one
// POST /2010-04-01/Accounts/{AccountSid}/Messages.json per attempt, form-encoded, with HTTP Basic
// authentication (the account SID and auth token, or an API key SID and its secret)
// (https://www.twilio.com/docs/messaging/api/message-resource#create-a-message-resource,
// https://www.twilio.com/docs/usage/api#authenticate-with-http).
//
// Contract: NONE. Twilio takes no idempotency key, and its List Messages filters only by To, From and
// DateSent (https://www.twilio.com/docs/messaging/api/message-resource#read-multiple-message-resources),
// so after a lost answer nobody can tell whether the SMS was queued. Such a task is parked; Twilio's
// status callback settles it: every message carries StatusCallback = our receipts endpoint with
// ?ref=<the task's ref> (service/receipts reads it back), so a callback names the task even when we
// never learnt the message SID.
//
// ValidityPeriod is the notification's remaining lifetime in whole seconds (at most 36000, Twilio's
// maximum), so Twilio drops a message still queued after its expiry; an expired one is not sent.
//
// Response mapping (https://www.twilio.com/docs/usage/twilios-response, https://www.twilio.com/docs/errors):
// 201 Created -> ACCEPTED with the message "sid" ("201 CREATED: The request was successful. We created a
// new resource", twilios-response). A 201 whose body cannot be read is ACCEPTED too: the status alone
// says the Message resource exists, so the SMS is Twilio's to send; it has no provider message id, and
// Twilio's status callback finds the task by the ?ref= of its StatusCallback (service/receipts). Another
// 2xx without a sid is MALFORMED_RESPONSE (uncertain): Twilio documents 201 for Create Message.
// Account states an operator fixes -> ACCOUNT_REFUSED naming the cause: 401 or 403 or error 20003 (the
// credential, https://www.twilio.com/docs/api/errors/20003), 20005 and 10001 (the account is not active:
// suspended, out of funds, https://www.twilio.com/docs/api/errors/20005,
// https://www.twilio.com/docs/api/errors/10001), 21606 (the From number is not a message-capable Twilio
// number of this account, https://www.twilio.com/docs/api/errors/21606). 400 21610 (the recipient
// replied STOP) -> REJECTED and Unregistered; other 4xx (21211 invalid To, 21614 not a mobile number,
// 21408 region not enabled, ...) -> REJECTED with Twilio's code; 429 or 20429 -> THROTTLED with
// Retry-After, a refusal ("Requests that receive 429 responses aren't processed and are safe to retry
// after backing off", https://www.twilio.com/docs/api/errors/20429: the kind sets ThrottleRefuses, so a
// 429 is retried and never parks); 5xx -> uncertain (the kind sets ServerErrorsUncertain: Twilio does
// not promise a 5xx comes before it queued the message). Each attempt puts at most one request on the
// wire (service/httpkit).
package twilio

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
)

// DefaultBaseURL is Twilio's REST API.
const DefaultBaseURL = "https://api.twilio.com"

// MaxValidityPeriod is the longest ValidityPeriod Twilio accepts (and its default).
const MaxValidityPeriod = 36000 * time.Second

// Error codes with a meaning of their own (https://www.twilio.com/docs/errors/<code>).
const (
	CodeAccountInactive  = 10001 // the account is not active (suspended, disabled)
	CodeAuthenticate     = 20003 // bad account SID, API key or secret
	CodeAccountNotActive = 20005 // the account is not active: out of funds, suspended, trial not activated
	CodeTooManyRequests  = 20429
	CodeFromNotOwned     = 21606 // the From number is not a message-capable Twilio number of this account
	CodeInvalidTo        = 21211
	CodeUnsubscribed     = 21610 // the recipient replied STOP: Twilio refuses every message to it
)

// Options configure a client.
type Options struct {
	AccountSID string // AC...: the account the message is created in (the URL path)
	// Username and Password authenticate: the account SID and auth token, or an API key SID (SK...) and
	// its secret. Username defaults to AccountSID.
	Username string
	Password string
	// From (a Twilio number in E.164, a short code or an alphanumeric sender id) or MessagingServiceSID
	// (MG...): exactly one.
	From                string
	MessagingServiceSID string
	// StatusCallbackURL is the public URL of notifier receipts' Twilio endpoint
	// (https://host/receipts/twilio); each message gets it with ?ref=<ref> added.
	StatusCallbackURL string
	BaseURL           string // default DefaultBaseURL (the fake in tests)
	CAFile            string
	Now               func() time.Time
}

// Client sends SMS through Twilio. Safe for concurrent use.
type Client struct {
	endpoint string
	auth     string
	from     string
	service  string
	callback *url.URL
	now      func() time.Time
	kit      *httpkit.Client
}

// New checks the options and builds a client. Errors never contain the password.
func New(opt Options) (*Client, error) {
	if _, err := hex.DecodeString(strings.TrimPrefix(opt.AccountSID, "AC")); err != nil || len(opt.AccountSID) != 34 || !strings.HasPrefix(opt.AccountSID, "AC") {
		return nil, fmt.Errorf("%w: account SID %q: want AC followed by 32 hex digits", delivery.ErrInvalidInput, opt.AccountSID)
	}
	user := opt.Username
	if user == "" {
		user = opt.AccountSID
	}
	if opt.Password == "" {
		return nil, fmt.Errorf("%w: Twilio auth token or API key secret: empty", delivery.ErrInvalidInput)
	}
	if (opt.From == "") == (opt.MessagingServiceSID == "") {
		return nil, fmt.Errorf("%w: want exactly one of a From sender and a messaging service SID", delivery.ErrInvalidInput)
	}
	cb, err := url.Parse(opt.StatusCallbackURL)
	if err != nil || (cb.Scheme != "https" && cb.Scheme != "http") || cb.Host == "" || cb.User != nil || cb.Fragment != "" {
		return nil, fmt.Errorf("%w: status callback URL %q: want the http(s) URL of notifier receipts' /receipts/twilio", delivery.ErrInvalidInput, opt.StatusCallbackURL)
	}
	base := opt.BaseURL
	if base == "" {
		base = DefaultBaseURL
	}
	bu, err := url.Parse(base)
	if err != nil || !(bu.Scheme == "https" || bu.Scheme == "http" && loopback(bu.Hostname())) || bu.Host == "" || bu.User != nil || bu.RawQuery != "" {
		// Plain http only to this machine (a fake): the credentials travel in every request.
		return nil, fmt.Errorf("%w: base URL %q: want an https URL (http only to a loopback host)", delivery.ErrInvalidInput, base)
	}
	kit, err := httpkit.New(httpkit.Options{CAFile: opt.CAFile})
	if err != nil {
		return nil, err
	}
	now := opt.Now
	if now == nil {
		now = time.Now
	}
	return &Client{
		endpoint: strings.TrimSuffix(bu.String(), "/") + "/2010-04-01/Accounts/" + opt.AccountSID + "/Messages.json",
		auth:     "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+opt.Password)),
		from:     opt.From, service: opt.MessagingServiceSID, callback: cb, now: now, kit: kit,
	}, nil
}

func loopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}

// String names the channel kind for logs.
func (c *Client) String() string { return "twilio" }

// StatusCallback is the callback URL of the task ref: the configured URL with ref=<ref> added to its
// query, which service/receipts reads back.
func StatusCallback(base *url.URL, ref string) string {
	u := *base
	q := u.Query()
	q.Set("ref", ref)
	u.RawQuery = q.Encode()
	return u.String()
}

// Form is the Create Message request of msg, with ValidityPeriod validity seconds (0: not sent).
func (c *Client) Form(msg delivery.Message, validity int64) url.Values {
	form := url.Values{"To": {msg.To}, "Body": {msg.Body}, "StatusCallback": {StatusCallback(c.callback, msg.Ref)}}
	if c.service != "" {
		form.Set("MessagingServiceSid", c.service)
	} else {
		form.Set("From", c.from)
	}
	if validity > 0 {
		form.Set("ValidityPeriod", strconv.FormatInt(validity, 10))
	}
	return form
}

// Send creates one Message. A TOPIC_RESEND never comes (the kind has no collapse), and would be sent
// as a new message.
func (c *Client) Send(ctx context.Context, msg delivery.Message) delivery.Observation {
	if strings.TrimSpace(msg.To) == "" {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "no phone number"}
	}
	var validity int64
	if !msg.ExpiresAt.IsZero() {
		validity = int64(min(msg.ExpiresAt.Sub(c.now()), MaxValidityPeriod) / time.Second)
		if validity < 1 {
			return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "expired"}
		}
	}
	resp, failed := c.kit.Do(ctx, httpkit.Request{Method: http.MethodPost, URL: c.endpoint,
		Body: []byte(c.Form(msg, validity).Encode()), Header: http.Header{
			"Authorization": {c.auth},
			"Content-Type":  {"application/x-www-form-urlencoded"},
			"Accept":        {"application/json"},
		}})
	if resp == nil {
		return failed
	}
	// A 201 proves the message was created even when its body is lost: Classify reads the status first.
	if obs, ok := resp.Unreadable(false); ok {
		return obs
	}
	return Classify(resp.Status, resp.Header, resp.Body)
}

// apiError is Twilio's error body: {"code":21211,"message":"...","more_info":"...","status":400}.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Status  int    `json:"status"`
}

// Classify maps Twilio's answer to an observation (see the package comment).
func Classify(status int, header http.Header, body []byte) delivery.Observation {
	resp := &httpkit.Response{Status: status, Header: header, Body: body}
	if resp.Success() {
		var m struct {
			SID    string `json:"sid"`
			Status string `json:"status"`
		}
		if err := json.Unmarshal(body, &m); err == nil && m.SID != "" {
			return delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: m.SID}
		}
		if status == http.StatusCreated {
			return delivery.Observation{Outcome: delivery.OutcomeAccepted,
				Detail: "HTTP 201 Created without a readable message sid: Twilio created the message; its status callback names the task by ref"}
		}
		return delivery.Observation{Outcome: delivery.OutcomeMalformed,
			Detail: "HTTP " + strconv.Itoa(status) + " without a message sid (it may have been accepted)"}
	}
	var e apiError
	_ = json.Unmarshal(body, &e)
	what := "HTTP " + strconv.Itoa(status)
	if e.Code != 0 {
		what += ", Twilio error " + strconv.Itoa(e.Code) + " (https://www.twilio.com/docs/errors/" + strconv.Itoa(e.Code) + ")"
	}
	switch {
	case e.Code == CodeAccountNotActive || e.Code == CodeAccountInactive:
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused,
			Detail: what + ": the Twilio account is not active (suspended or out of funds): reactivate it in the Twilio Console"}
	case status == http.StatusUnauthorized || status == http.StatusForbidden || e.Code == CodeAuthenticate:
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused,
			Detail: what + ": Twilio refused the credentials: check the account SID, the API key SID and its secret or auth token"}
	case e.Code == CodeFromNotOwned:
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused,
			Detail: what + ": the channel's From number is not a message-capable Twilio number of this account"}
	case status == http.StatusTooManyRequests || e.Code == CodeTooManyRequests:
		return delivery.Observation{Outcome: delivery.OutcomeThrottled, RetryAfter: httpkit.RetryAfter(header), Detail: what}
	case e.Code == CodeUnsubscribed:
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Unregistered: true,
			Detail: what + ": the recipient unsubscribed (replied STOP)"}
	case e.Code == CodeInvalidTo:
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: what + ": the To number is not a valid phone number"}
	case status >= 300 && status < 400:
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: what + ": redirects are not followed"}
	case status >= 400 && status < 500:
		// Twilio's message may quote the phone number: only the code and its documentation page.
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: what}
	}
	return resp.Refused() // 5xx and gateways
}

// Query is not offered: Twilio cannot look a message up by our reference.
func (c *Client) Query(context.Context, string) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, Detail: "not supported"}
}
