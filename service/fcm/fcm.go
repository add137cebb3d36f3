// Package fcm delivers notifications with the Firebase Cloud Messaging HTTP v1 API
// (https://firebase.google.com/docs/reference/fcm/rest/v1/projects.messages/send): one
// POST {endpoint}/v1/projects/{project}/messages:send per attempt, authorised by an OAuth 2.0 access
// token that a service account's key obtains (the JWT bearer grant, RFC 7523, through
// golang.org/x/oauth2/jwt). The user's address on the channel (msg.To) is the app's registration token.
//
// Contract: NONE. FCM has no idempotency key and no way to look a message up, so after a lost answer
// the message may or may not be on its way. What it offers is collapsing, and only a channel with
// resend_with_collapse (Options.Collapse) uses it: then every message of a task carries the same
// collapse key (android.collapse_key, apns-collapse-id, the webpush Topic header), so a resend
// (TOPIC_RESEND) replaces a copy the device has not received yet. Collapsing has a price: FCM keeps at
// most four collapse keys per device (https://firebase.google.com/docs/cloud-messaging/customize-messages/collapsible-message-types),
// so a device offline for more than four tasks loses some of them. Without it, messages carry no
// collapse key and FCM stores up to 100 of them per offline device. A copy already delivered is not
// replaced: the data payload carries the task's ref ("ref") so the app can drop the duplicate.
//
// Response mapping (https://firebase.google.com/docs/reference/fcm/rest/v1/ErrorCode, docs/channels.md#fcm):
// 2xx -> ACCEPTED, ProviderMsgID = the response's "name" (projects/*/messages/*); UNREGISTERED (404),
// and INVALID_ARGUMENT that names the registration token -> REJECTED with Unregistered; 401
// UNAUTHENTICATED, THIRD_PARTY_AUTH_ERROR and 403 PERMISSION_DENIED -> ACCOUNT_REFUSED naming the
// credential (the cached access token is dropped after a 401, so the next call fetches a new one);
// SENDER_ID_MISMATCH and other 4xx -> REJECTED; 429 QUOTA_EXCEEDED -> THROTTLED with Retry-After;
// 500 INTERNAL and 503 UNAVAILABLE -> HTTP_5XX with Retry-After, which the kind's contract
// (ServerErrorsUncertain) reads as "may have been accepted": FCM does not say it refused before
// accepting; 502/504 -> GATEWAY_ERROR. No answer: as service/httpkit (CONNECT_FAILED, TIMEOUT,
// IO_ERROR).
//
// The access token is fetched before the send, never as part of it: a token failure means nothing
// went to FCM. A refusal by the token endpoint (4xx: a revoked key, a wrong account) is
// ACCOUNT_REFUSED with a detail naming the credential; any other failure (timeout, 5xx, no connection)
// is CONNECT_FAILED and retried by the backoff. The token request has its own timeout
// (Options.TokenTimeout), is never resent by the transport and does not follow redirects; a token is
// reused until five minutes before it expires.
package fcm

import (
	"cmp"
	"context"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/jwt"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
	"github.com/notifierhq/notifier/service/redact"
)

const (
	// DefaultEndpoint is FCM's API origin.
	DefaultEndpoint = "https://fcm.googleapis.com"
	// DefaultTokenURL is Google's OAuth 2.0 token endpoint, used when the key file names none.
	DefaultTokenURL = "https://oauth2.googleapis.com/token"
	// Scope is the OAuth scope the send method requires.
	Scope = "https://www.googleapis.com/auth/firebase.messaging"
	// DefaultTokenTimeout bounds one token request (it is not a channel call and has no attempt row).
	DefaultTokenTimeout = 10 * time.Second
	// MaxTTL is the longest TTL FCM accepts (4 weeks).
	MaxTTL = 28 * 24 * time.Hour
	// tokenEarly refreshes an access token this long before it expires, so no send carries one that
	// lapses on the way.
	tokenEarly = 5 * time.Minute
	// topicLength is the webpush Topic header's length (RFC 8030 section 5.4 allows 32).
	topicLength = 32
)

// ServiceAccount is the part of a Google service-account key file (JSON) the adapter reads.
type ServiceAccount struct {
	Type         string `json:"type"`
	ProjectID    string `json:"project_id"`
	PrivateKeyID string `json:"private_key_id"`
	PrivateKey   string `json:"private_key"`
	ClientEmail  string `json:"client_email"`
	TokenURI     string `json:"token_uri"`
}

// ParseServiceAccount reads a service-account key file. Errors never contain key material.
func ParseServiceAccount(data []byte) (ServiceAccount, error) {
	var sa ServiceAccount
	if err := json.Unmarshal(data, &sa); err != nil {
		return sa, fmt.Errorf("%w: service account: not a JSON key file", delivery.ErrInvalidInput)
	}
	switch {
	case sa.Type != "service_account":
		return sa, fmt.Errorf("%w: service account: type %q, want \"service_account\"", delivery.ErrInvalidInput, sa.Type)
	case sa.ClientEmail == "":
		return sa, fmt.Errorf("%w: service account: client_email missing", delivery.ErrInvalidInput)
	}
	// Checked now, so a bad key stops the worker at start rather than fail every send.
	block, _ := pem.Decode([]byte(sa.PrivateKey))
	if block == nil {
		return sa, fmt.Errorf("%w: service account: private_key is not PEM", delivery.ErrInvalidInput)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	}
	if _, ok := key.(*rsa.PrivateKey); err != nil || !ok {
		return sa, fmt.Errorf("%w: service account: private_key is not an RSA private key", delivery.ErrInvalidInput)
	}
	return sa, nil
}

// Options configure a client.
type Options struct {
	Account   ServiceAccount
	ProjectID string // default: the key file's project_id
	Endpoint  string // default DefaultEndpoint (a fake in tests)
	TokenURL  string // default: the key file's token_uri, else DefaultTokenURL (a fake in tests)
	CAFile    string // extra PEM roots; verification stays on
	// TokenTimeout bounds one token request; default DefaultTokenTimeout.
	TokenTimeout time.Duration
	// Collapse (the channel's resend_with_collapse) gives every message of a task the task's collapse
	// key, so that a resend replaces an undelivered copy. Off, messages carry none (see the package
	// comment for what collapsing costs).
	Collapse bool
	Now      func() time.Time
}

// Client sends FCM messages. Safe for concurrent use.
type Client struct {
	sendURL  string
	collapse bool
	kit      *httpkit.Client
	now      func() time.Time
	conf     *jwt.Config
	httpCtx  context.Context // carries the token request's client (oauth2.HTTPClient)

	mu    sync.Mutex
	token *oauth2.Token
}

// New checks the options and builds a client.
func New(opt Options) (*Client, error) {
	project := opt.ProjectID
	if project == "" {
		project = opt.Account.ProjectID
	}
	if project == "" || strings.ContainsAny(project, "/?#% ") {
		return nil, fmt.Errorf("%w: project id %q: want the Firebase project id", delivery.ErrInvalidInput, project)
	}
	endpoint := strings.TrimRight(opt.Endpoint, "/")
	if endpoint == "" {
		endpoint = DefaultEndpoint
	}
	tokenURL := opt.TokenURL
	if tokenURL == "" {
		tokenURL = opt.Account.TokenURI
	}
	if tokenURL == "" {
		tokenURL = DefaultTokenURL
	}
	for _, u := range []string{endpoint, tokenURL} {
		if p, err := url.Parse(u); err != nil || p.Scheme != "https" || p.Host == "" {
			return nil, fmt.Errorf("%w: %s: want an https URL", delivery.ErrInvalidInput, redact.Origin(u))
		}
	}
	if opt.Account.ClientEmail == "" || opt.Account.PrivateKey == "" {
		return nil, fmt.Errorf("%w: service account: client_email and private_key required", delivery.ErrInvalidInput)
	}
	kit, err := httpkit.New(httpkit.Options{CAFile: opt.CAFile})
	if err != nil {
		return nil, err
	}
	tokenTransport, err := httpkit.NewTransport(httpkit.Options{CAFile: opt.CAFile})
	if err != nil {
		return nil, err
	}
	conf := &jwt.Config{
		Email: opt.Account.ClientEmail, PrivateKey: []byte(opt.Account.PrivateKey), PrivateKeyID: opt.Account.PrivateKeyID,
		Scopes: []string{Scope}, TokenURL: tokenURL,
	}
	hc := &http.Client{
		Transport: onceTransport{tokenTransport},
		Timeout:   cmp.Or(opt.TokenTimeout, DefaultTokenTimeout),
		// A redirect would send the signed assertion somewhere else: the answer is a failure.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	now := opt.Now
	if now == nil {
		now = time.Now
	}
	return &Client{
		sendURL: endpoint + "/v1/projects/" + project + "/messages:send", collapse: opt.Collapse,
		kit: kit, now: now,
		conf: conf, httpCtx: context.WithValue(context.Background(), oauth2.HTTPClient, hc),
	}, nil
}

// onceTransport clears GetBody so net/http never sends the token request a second time (HTTP/2 would
// after some stream resets, see service/httpkit): one token request per fetch.
type onceTransport struct{ rt http.RoundTripper }

func (t onceTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.GetBody = nil
	return t.rt.RoundTrip(r)
}

// String names the channel kind for logs.
func (c *Client) String() string { return "fcm" }

// accessToken returns a cached token or fetches one; concurrent sends wait for one fetch.
func (c *Client) accessToken() (string, delivery.Observation, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token != nil && c.token.AccessToken != "" && (c.token.Expiry.IsZero() || c.now().Add(tokenEarly).Before(c.token.Expiry)) {
		return c.token.AccessToken, delivery.Observation{}, true
	}
	// A new source per fetch: jwt.Config's own would cache a token FCM has refused (see dropToken).
	tok, err := c.conf.TokenSource(c.httpCtx).Token()
	if err != nil {
		return "", tokenFailure(err), false
	}
	c.token = tok
	return tok.AccessToken, delivery.Observation{}, true
}

// dropToken forgets the cached token after FCM refused it, so the next send fetches a new one.
func (c *Client) dropToken(token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token != nil && c.token.AccessToken == token {
		c.token = nil
	}
}

// tokenFailure maps a failed token fetch. Nothing was sent to FCM either way.
func tokenFailure(err error) delivery.Observation {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) && re.Response != nil && re.Response.StatusCode >= 400 && re.Response.StatusCode < 500 {
		var body struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(re.Body, &body)
		code := delivery.Truncate(strings.Map(printable, body.Error), 64)
		if code == "" {
			code = "HTTP " + strconv.Itoa(re.Response.StatusCode)
		}
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused,
			Detail: "credential: the OAuth token endpoint refused the service account (" + code + "): check the key file (revoked or deleted?); nothing sent"}
	}
	msg := redact.Error(err)
	if errors.As(err, &re) && re.Response != nil {
		msg = "HTTP " + strconv.Itoa(re.Response.StatusCode) + " from the token endpoint"
	}
	return delivery.Observation{Outcome: delivery.OutcomeConnectFailed, Detail: "OAuth token (nothing sent): " + msg}
}

// CollapseKey is the collapse key of every message of task ref: "ntf-"+ref (android.collapse_key and
// apns-collapse-id, at most 64 bytes).
func CollapseKey(ref string) string { return delivery.IdempotencyKey(ref) }

// Topic is the webpush Topic header of task ref: 32 URL-safe base64 characters derived from its key.
func Topic(ref string) string {
	sum := sha256.Sum256([]byte(delivery.IdempotencyKey(ref)))
	return base64.RawURLEncoding.EncodeToString(sum[:])[:topicLength]
}

// TTL is the notification's remaining lifetime in whole seconds, capped at MaxTTL; <= 0: expired.
func TTL(expiresAt, now time.Time) int64 { return int64(min(expiresAt.Sub(now), MaxTTL) / time.Second) }

type sendRequest struct {
	Message message `json:"message"`
}

type message struct {
	Token        string            `json:"token"`
	Notification notification      `json:"notification"`
	Data         map[string]string `json:"data"`
	Android      android           `json:"android"`
	APNs         headers           `json:"apns"`
	Webpush      headers           `json:"webpush"`
}

type notification struct {
	Body string `json:"body"`
}

type android struct {
	CollapseKey string `json:"collapse_key,omitempty"`
	TTL         string `json:"ttl"`
}

type headers struct {
	Headers map[string]string `json:"headers"`
}

// Body is the JSON request body of msg with ttl seconds left; with collapse, it carries the task's
// collapse key (android.collapse_key, apns-collapse-id, the webpush Topic).
func Body(msg delivery.Message, ttl int64, collapse bool) ([]byte, error) {
	m := message{
		Token:        msg.To,
		Notification: notification{Body: msg.Body},
		Data:         map[string]string{"ref": msg.Ref},
		Android:      android{TTL: strconv.FormatInt(ttl, 10) + "s"},
		APNs:         headers{Headers: map[string]string{"apns-expiration": strconv.FormatInt(msg.ExpiresAt.Unix(), 10)}},
		Webpush:      headers{Headers: map[string]string{"TTL": strconv.FormatInt(ttl, 10)}},
	}
	if collapse {
		m.Android.CollapseKey = CollapseKey(msg.Ref)
		m.APNs.Headers["apns-collapse-id"] = CollapseKey(msg.Ref)
		m.Webpush.Headers["Topic"] = Topic(msg.Ref)
	}
	return json.Marshal(sendRequest{Message: m})
}

// Send posts the message once. A TOPIC_RESEND is sent exactly like a SEND: with Collapse, the same
// collapse key replaces only a copy not yet delivered.
func (c *Client) Send(ctx context.Context, msg delivery.Message) delivery.Observation {
	if strings.TrimSpace(msg.To) == "" {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "address: no registration token"}
	}
	if msg.ExpiresAt.IsZero() {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "no expiry: the TTL needs the notification's expiry"}
	}
	ttl := TTL(msg.ExpiresAt, c.now())
	if ttl <= 0 {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "expired"}
	}
	body, err := Body(msg, ttl, c.collapse)
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "encode message: " + err.Error()}
	}
	token, failed, ok := c.accessToken()
	if !ok {
		return failed
	}
	resp, failed := c.kit.Do(ctx, httpkit.Request{Method: http.MethodPost, URL: c.sendURL, Body: body, Header: http.Header{
		"Authorization": {"Bearer " + token},
		"Content-Type":  {"application/json; charset=utf-8"},
	}})
	if resp == nil {
		return failed
	}
	obs := classify(resp)
	if resp.Status == http.StatusUnauthorized {
		c.dropToken(token)
	}
	return obs
}

// errorReply is google.rpc.Status as FCM answers it: an FcmError detail names FCM's code, a
// google.rpc.BadRequest detail the invalid fields.
type errorReply struct {
	Error struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Status  string `json:"status"`
		Details []struct {
			Type            string `json:"@type"`
			ErrorCode       string `json:"errorCode"`
			FieldViolations []struct {
				Field string `json:"field"`
			} `json:"fieldViolations"`
		} `json:"details"`
	} `json:"error"`
}

// tokenField is the request field of the registration token, as a BadRequest detail names it.
const tokenField = "message.token"

// invalidToken reports whether an INVALID_ARGUMENT is about the registration token: a BadRequest
// detail that names message.token (and no other field), or, without field violations, FCM's message
// for a bad token ("The registration token is not a valid FCM registration token",
// https://firebase.google.com/docs/cloud-messaging/error-codes).
func (e errorReply) invalidToken() bool {
	var fields []string
	for _, d := range e.Error.Details {
		for _, v := range d.FieldViolations {
			fields = append(fields, v.Field)
		}
	}
	if len(fields) > 0 {
		for _, f := range fields {
			if f != tokenField {
				return false
			}
		}
		return true
	}
	return strings.Contains(strings.ToLower(e.Error.Message), "registration token is not a valid")
}

// Classify maps an FCM answer (see the package comment).
func Classify(status int, header http.Header, body []byte) delivery.Observation {
	return classify(&httpkit.Response{Status: status, Header: header, Body: body})
}

func classify(resp *httpkit.Response) delivery.Observation {
	if resp.Success() {
		// The 2xx is the acceptance; the name only adds the id (a body cut short changes nothing).
		var ok struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(resp.Body, &ok)
		return delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: delivery.Truncate(ok.Name, 500)}
	}
	var e errorReply
	_ = json.Unmarshal(resp.Body, &e)
	code := e.Error.Status
	for _, d := range e.Error.Details {
		if d.ErrorCode != "" {
			code = d.ErrorCode
		}
	}
	code = delivery.Truncate(strings.Map(printable, code), 64)
	what := "HTTP " + strconv.Itoa(resp.Status)
	if code != "" {
		what += " " + code
	}
	switch {
	case code == "UNREGISTERED": // only FCM's own code: a 404 of a wrong project or path is no verdict on the token
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Unregistered: true,
			Detail: what + ": the registration token is no longer valid"}
	case code == "INVALID_ARGUMENT" && resp.Status == http.StatusBadRequest && e.invalidToken():
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Unregistered: true,
			Detail: what + ": the registration token is not a valid FCM registration token"}
	case code == "SENDER_ID_MISMATCH": // the token's app registered for another sender: this task's address
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: what + ": the token belongs to another sender (project)"}
	case code == "THIRD_PARTY_AUTH_ERROR":
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused,
			Detail: what + ": credential: the APNs certificate or web push key configured in the Firebase project was refused"}
	case resp.Status == http.StatusUnauthorized:
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused,
			Detail: what + ": credential: FCM refused the service account's access token (revoked key or account?)"}
	case resp.Status == http.StatusForbidden:
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused,
			Detail: what + ": credential: the service account may not send for this project (check its role and project_id)"}
	case resp.Status >= 300 && resp.Status < 400:
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: what + ": redirects are not followed"}
	}
	obs := resp.Refused()
	if obs.Outcome == delivery.OutcomeHTTP5xx {
		obs.Detail = what + ": FCM does not say whether it refused before accepting: the message may be on its way"
	} else if code != "" {
		obs.Detail = what + strings.TrimPrefix(obs.Detail, "HTTP "+strconv.Itoa(resp.Status))
	}
	return obs
}

func printable(r rune) rune {
	if r < 0x20 || r > 0x7e {
		return '?'
	}
	return r
}

// Query is not offered: FCM cannot be asked whether it holds a message.
func (c *Client) Query(context.Context, string) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, Detail: "not supported"}
}
