// Package apns delivers notifications with Apple's Push Notification service
// (https://developer.apple.com/documentation/usernotifications/sending-notification-requests-to-apns):
// one HTTP/2 POST {endpoint}/3/device/{device token} per attempt, with token-based authentication
// (https://developer.apple.com/documentation/usernotifications/establishing-a-token-based-connection-to-apns):
// an ES256 JWT signed with the team's .p8 key (github.com/golang-jwt/jwt/v5). The user's address on the
// channel (msg.To) is the device token (hex).
//
// Contract: NONE. APNs takes no idempotency key and cannot be asked about a notification, so after a
// lost answer the notification may be on its way. A channel with resend_with_collapse
// (Options.Collapse) gives every notification of a task the same apns-collapse-id ("ntf-"+ref), so a
// resend (TOPIC_RESEND) is shown as one notification with the first; without it no apns-collapse-id is
// sent. For an offline device APNs stores only the most recent notification of the app, whatever the
// collapse id (docs/channels.md#apns). The payload's "ref" lets the app drop a duplicate. A task whose
// ref is a UUID sends it as apns-id too, so Apple's id of the notification is our ref.
//
// Headers: apns-push-type (alert by default), apns-topic (the bundle id), apns-expiration = the
// notification's expiry (Message.ExpiresAt, Unix seconds: APNs stores it for an offline device until
// then and no longer), apns-priority 10 for alerts (5 otherwise), apns-collapse-id with Collapse,
// authorization.
//
// Provider token: a new JWT at most every TokenRefresh (40 minutes), inside Apple's window (APNs
// refuses a token older than an hour, and a provider that changes its token more often than every 20
// minutes); after ExpiredProviderToken it is dropped at once, so the next call signs a new one.
// Signing is local: it never sends a request.
//
// Response mapping (https://developer.apple.com/documentation/usernotifications/handling-error-responses-from-apns,
// docs/channels.md#apns): 200 -> ACCEPTED, ProviderMsgID = the apns-id header; 410 Unregistered (or
// ExpiredToken) -> REJECTED with Unregistered (the device token is no longer active for the topic);
// 403 (provider token or certificate: ExpiredProviderToken, InvalidProviderToken, MissingProviderToken,
// BadCertificate, Forbidden, ...), 400 TopicDisallowed, BadTopic and MissingTopic (the channel's
// topic), and 429 TooManyProviderTokenUpdates -> ACCOUNT_REFUSED naming the cause; 429
// TooManyRequests -> THROTTLED, Retry-After honoured when sent; 500 InternalServerError and 503
// ServiceUnavailable/Shutdown -> HTTP_5XX. Apple does not say that a throttled or failed request was
// not processed, so the kind's contract (ServerErrorsUncertain) reads 429 and 5xx as "may have been
// accepted". Other 4xx (BadDeviceToken, DeviceTokenNotForTopic, PayloadTooLarge, ...) -> REJECTED. No
// answer: as service/httpkit (CONNECT_FAILED, TIMEOUT, IO_ERROR), at most one request on the wire per
// attempt.
package apns

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
	"github.com/notifierhq/notifier/service/redact"
)

const (
	// ProductionEndpoint and SandboxEndpoint are APNs' two environments.
	ProductionEndpoint = "https://api.push.apple.com"
	SandboxEndpoint    = "https://api.sandbox.push.apple.com"
	// TokenRefresh is the age at which a provider token is replaced: past Apple's 20-minute minimum,
	// well before its one-hour limit.
	TokenRefresh = 40 * time.Minute
	// MaxPayloadBytes is APNs' limit for a notification's payload.
	MaxPayloadBytes = 4096
)

// Options configure a client.
type Options struct {
	Key      *ecdsa.PrivateKey // the .p8 key (ParseKey)
	KeyID    string            // the key's 10-character id (the JWT's kid)
	TeamID   string            // the developer team id (the JWT's iss)
	Topic    string            // apns-topic: the app's bundle id
	PushType string            // apns-push-type; default alert
	Endpoint string            // default ProductionEndpoint
	CAFile   string
	// Collapse (the channel's resend_with_collapse) gives every notification of a task the task's
	// apns-collapse-id; off, none is sent.
	Collapse bool
	Now      func() time.Time
}

// ParseKey reads an APNs authentication key (.p8: PKCS#8 PEM, P-256). Errors never contain key material.
func ParseKey(data []byte) (*ecdsa.PrivateKey, error) {
	k, err := jwt.ParseECPrivateKeyFromPEM(data)
	if err != nil || k.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%w: APNs key: want the .p8 file (a P-256 private key in PEM)", delivery.ErrInvalidInput)
	}
	return k, nil
}

// Client sends APNs notifications. Safe for concurrent use.
type Client struct {
	key                          *ecdsa.PrivateKey
	keyID, teamID, topic, pushTy string
	endpoint                     string
	collapse                     bool
	kit                          *httpkit.Client
	now                          func() time.Time

	mu       sync.Mutex
	token    string
	signedAt time.Time
}

// New checks the options and builds a client.
func New(opt Options) (*Client, error) {
	if opt.Key == nil || opt.Key.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%w: APNs key: want a P-256 private key", delivery.ErrInvalidInput)
	}
	if len(opt.KeyID) != 10 || len(opt.TeamID) != 10 {
		return nil, fmt.Errorf("%w: key_id and team_id: want Apple's 10-character ids", delivery.ErrInvalidInput)
	}
	if opt.Topic == "" {
		return nil, fmt.Errorf("%w: topic: required (the app's bundle id)", delivery.ErrInvalidInput)
	}
	pushType := opt.PushType
	if pushType == "" {
		pushType = "alert"
	}
	switch pushType {
	case "alert", "background":
	default:
		return nil, fmt.Errorf("%w: push_type %q: want alert or background", delivery.ErrInvalidInput, pushType)
	}
	endpoint := strings.TrimRight(opt.Endpoint, "/")
	if endpoint == "" {
		endpoint = ProductionEndpoint
	}
	if u, err := url.Parse(endpoint); err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("%w: endpoint %s: want an https URL (APNs speaks HTTP/2 over TLS only)", delivery.ErrInvalidInput, redact.Origin(endpoint))
	}
	kit, err := httpkit.New(httpkit.Options{CAFile: opt.CAFile})
	if err != nil {
		return nil, err
	}
	now := opt.Now
	if now == nil {
		now = time.Now
	}
	return &Client{key: opt.Key, keyID: opt.KeyID, teamID: opt.TeamID, topic: opt.Topic, pushTy: pushType,
		endpoint: endpoint, collapse: opt.Collapse, kit: kit, now: now}, nil
}

// String names the channel kind for logs.
func (c *Client) String() string { return "apns" }

// providerToken returns the current JWT, signing a new one when it is TokenRefresh old.
func (c *Client) providerToken() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if c.token != "" && now.Sub(c.signedAt) < TokenRefresh {
		return c.token, nil
	}
	t := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": c.teamID, "iat": now.Unix()})
	t.Header["kid"] = c.keyID
	s, err := t.SignedString(c.key)
	if err != nil {
		return "", err
	}
	c.token, c.signedAt = s, now
	return s, nil
}

// expired drops token after ExpiredProviderToken: APNs will refuse it until it is replaced, so the
// next call (the paused channel's probe) signs a new one, however young the old one is.
func (c *Client) expired(token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token == token {
		c.token = ""
	}
}

// CollapseID is apns-collapse-id of every notification of task ref (at most 64 bytes).
func CollapseID(ref string) string { return delivery.IdempotencyKey(ref) }

type payload struct {
	APS struct {
		Alert *alert `json:"alert,omitempty"`
		// ContentAvailable marks a background notification.
		ContentAvailable int `json:"content-available,omitempty"`
	} `json:"aps"`
	Ref  string `json:"ref"`
	Body string `json:"body,omitempty"` // background notifications carry the text here
}

type alert struct {
	Body string `json:"body"`
}

// Send posts the notification once. A TOPIC_RESEND is sent exactly like a SEND (same collapse id).
func (c *Client) Send(ctx context.Context, msg delivery.Message) delivery.Observation {
	if _, err := hex.DecodeString(msg.To); err != nil || len(msg.To) < 32 {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "address: not a hexadecimal device token"}
	}
	if msg.ExpiresAt.IsZero() {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "no expiry: apns-expiration needs the notification's expiry"}
	}
	if !msg.ExpiresAt.After(c.now()) {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "expired"}
	}
	var p payload
	p.Ref = msg.Ref
	priority := "10"
	if c.pushTy == "alert" {
		p.APS.Alert = &alert{Body: msg.Body}
	} else {
		p.APS.ContentAvailable, p.Body, priority = 1, msg.Body, "5" // Apple: background pushes must use priority 5
	}
	body, err := json.Marshal(p)
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "encode payload: " + err.Error()}
	}
	if len(body) > MaxPayloadBytes {
		return delivery.Observation{Outcome: delivery.OutcomeRejected,
			Detail: fmt.Sprintf("payload of %d bytes exceeds APNs' limit of %d", len(body), MaxPayloadBytes)}
	}
	token, err := c.providerToken()
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused, Detail: "credential: sign the provider token: " + err.Error()}
	}
	h := http.Header{
		"Authorization":   {"bearer " + token},
		"Apns-Push-Type":  {c.pushTy},
		"Apns-Topic":      {c.topic},
		"Apns-Expiration": {strconv.FormatInt(msg.ExpiresAt.Unix(), 10)},
		"Apns-Priority":   {priority},
		"Content-Type":    {"application/json"},
	}
	if c.collapse {
		h.Set("Apns-Collapse-Id", CollapseID(msg.Ref))
	}
	if len(msg.Ref) == 36 && strings.Count(msg.Ref, "-") == 4 {
		h.Set("Apns-Id", msg.Ref) // our ref is a UUID, the form apns-id takes
	}
	resp, failed := c.kit.Do(ctx, httpkit.Request{Method: http.MethodPost, URL: c.endpoint + "/3/device/" + msg.To, Header: h, Body: body})
	if resp == nil {
		return failed
	}
	obs, reason := classify(resp)
	if reason == "ExpiredProviderToken" {
		c.expired(token)
	}
	return obs
}

// Classify maps an APNs answer (see the package comment).
func Classify(status int, header http.Header, body []byte) delivery.Observation {
	obs, _ := classify(&httpkit.Response{Status: status, Header: header, Body: body})
	return obs
}

func classify(resp *httpkit.Response) (delivery.Observation, string) {
	if resp.Status == http.StatusOK {
		return delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: delivery.Truncate(resp.Header.Get("Apns-Id"), 100)}, ""
	}
	var e struct {
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal(resp.Body, &e)
	reason := delivery.Truncate(strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, e.Reason), 64)
	what := "HTTP " + strconv.Itoa(resp.Status)
	if reason != "" {
		what += " " + reason
	}
	switch {
	case resp.Status == http.StatusGone || reason == "Unregistered" || reason == "ExpiredToken":
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Unregistered: true,
			Detail: what + ": the device token is no longer active for the topic"}, reason
	case resp.Status == http.StatusForbidden:
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused,
			Detail: what + ": credential: APNs refused the provider token or certificate (check key_id, team_id and the .p8 key)"}, reason
	case reason == "TopicDisallowed" || reason == "BadTopic" || reason == "MissingTopic":
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused,
			Detail: what + ": the channel's topic (bundle id) is not allowed for this key's team"}, reason
	case reason == "TooManyProviderTokenUpdates":
		return delivery.Observation{Outcome: delivery.OutcomeAccountRefused, RetryAfter: httpkit.RetryAfter(resp.Header),
			Detail: what + ": credential: the provider token changed less than 20 minutes after the previous one"}, reason
	case resp.Status >= 300 && resp.Status < 400:
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: what + ": redirects are not followed"}, reason
	}
	obs := resp.Refused()
	if obs.Outcome == delivery.OutcomeHTTP5xx {
		obs.Detail = what + ": APNs does not say whether it refused before accepting: the notification may be on its way"
	} else if reason != "" {
		obs.Detail = what
	}
	return obs, reason
}

// Query is not offered: APNs cannot be asked about a notification.
func (c *Client) Query(context.Context, string) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, Detail: "not supported"}
}
