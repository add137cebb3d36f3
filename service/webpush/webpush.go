// Package webpush delivers notifications with the Web Push protocol: RFC 8030 (the push service's
// HTTP API), RFC 8291 (payload encryption, aes128gcm) and RFC 8292 (VAPID application server
// identification). The user's address on the channel (msg.To) is the browser's PushSubscription as
// JSON: {"endpoint":"https://...","keys":{"p256dh":"...","auth":"..."}}.
//
// Contract: NONE. A push service offers neither idempotency keys nor a way to look a message up, so
// after a timeout the message may or may not be stored for the browser. What Web Push does offer is
// replacement (RFC 8030 section 5.4): every message of a task carries the same Topic header, and a
// new message with the Topic of a message the push service still holds *undelivered* replaces it.
// With Contract.ResendWithTopic the dispatcher resends after an uncertain attempt (action
// TOPIC_RESEND); this adapter sends it exactly like the first (same Topic, same payload). The resend
// replaces only undelivered copies: if the first copy already reached the browser, the browser gets
// a second one. The payload carries the task's ref so a service worker can drop that duplicate.
//
// Every message has a TTL header equal to the notification's remaining lifetime in whole seconds
// (rounded down, at most MaxTTL), so the push service never delivers it after its expiry; a
// notification already expired is not sent (REJECTED, "expired").
//
// Response mapping: 201 (any 2xx) -> ACCEPTED, ProviderMsgID = the Location header (the push
// service's message resource), from the status line and headers alone: a body that breaks off after
// them changes nothing (service/httpkit, Response.Unreadable); 404 and 410 -> REJECTED (the
// subscription is gone: the browser must subscribe again); 413 -> REJECTED (payload too large); 429 ->
// THROTTLED (Retry-After honoured); 502, 504, and a 5xx a forward proxy gave -> GATEWAY_ERROR
// (uncertain); other 5xx -> HTTP_5XX; 3xx (redirects are never followed) and other 4xx -> REJECTED; an
// endpoint in a network the egress policy refuses (loopback, private, link-local, ...:
// httpkit.Egress) -> REJECTED, before connecting; no connection or nothing of the request written ->
// CONNECT_FAILED; client timeout after that -> TIMEOUT; broken connection -> IO_ERROR. Each attempt puts at most one request on the wire
// (service/httpkit): HTTP/2, which push services speak, would otherwise resend after some stream resets.
package webpush

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
)

const (
	// RecordSize is the aes128gcm record size announced in the header (RFC 8188). One record holds
	// the whole payload.
	RecordSize = 4096
	// MaxPayloadBytes is the encrypted body every push service must accept (RFC 8291 section 4).
	MaxPayloadBytes = 4096
	headerBytes     = 16 + 4 + 1 + 65 // salt, rs, idlen, keyid (the sender's public key)
	tagBytes        = 16
	// MaxPlaintextBytes is the largest JSON payload that fits MaxPayloadBytes once encrypted.
	MaxPlaintextBytes = MaxPayloadBytes - headerBytes - tagBytes - 1
	// MaxTTL caps the TTL header; push services keep messages four weeks at most anyway.
	MaxTTL = 28 * 24 * time.Hour
	// TopicLength is the length of the Topic header (RFC 8030 section 5.4 allows at most 32).
	TopicLength = 32
	// vapidLifetime is the JWT's validity; RFC 8292 section 2 allows at most 24 hours.
	vapidLifetime = 12 * time.Hour
)

// Urgency is the RFC 8030 section 5.3 Urgency header.
type Urgency string

const (
	UrgencyVeryLow Urgency = "very-low"
	UrgencyLow     Urgency = "low"
	UrgencyNormal  Urgency = "normal"
	UrgencyHigh    Urgency = "high"
)

// ParseUrgency accepts very-low, low, normal or high; "" is normal.
func ParseUrgency(s string) (Urgency, error) {
	switch u := Urgency(strings.ToLower(strings.TrimSpace(s))); u {
	case "":
		return UrgencyNormal, nil
	case UrgencyVeryLow, UrgencyLow, UrgencyNormal, UrgencyHigh:
		return u, nil
	}
	return "", fmt.Errorf("%w: urgency %q: want very-low, low, normal or high", delivery.ErrInvalidInput, s)
}

// Options configure a client.
type Options struct {
	VAPIDKey *ecdsa.PrivateKey // the application server's P-256 key (required); see ParseVAPIDKey
	Subject  string            // VAPID "sub": a mailto: or https: URL where the push service can reach the operator
	Urgency  Urgency           // default normal
	CAFile   string            // extra PEM roots (tests, private push services); verification stays on
	// AllowedNetworks opts networks in that the egress policy refuses (httpkit.Egress): a private
	// push service. Every other loopback, private, link-local, ... endpoint address is refused.
	AllowedNetworks []netip.Prefix
	Now             func() time.Time // clock for TTL and the VAPID expiry (tests); default time.Now
}

// Client sends Web Push messages. Safe for concurrent use.
type Client struct {
	key      *ecdsa.PrivateKey
	pub      string // base64url of the uncompressed public key: the VAPID "k"
	subject  string
	urgency  Urgency
	now      func() time.Time
	kit      *httpkit.Client
	randSalt func([]byte) error
}

// New checks the options and builds a client.
func New(opt Options) (*Client, error) {
	if opt.VAPIDKey == nil || opt.VAPIDKey.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%w: VAPID key: want a P-256 private key", delivery.ErrInvalidInput)
	}
	pub, err := opt.VAPIDKey.PublicKey.Bytes()
	if err != nil {
		return nil, fmt.Errorf("%w: VAPID key: %v", delivery.ErrInvalidInput, err)
	}
	sub, err := url.Parse(opt.Subject)
	if err != nil || (sub.Scheme != "mailto" && sub.Scheme != "https") || (sub.Opaque == "" && sub.Host == "") {
		return nil, fmt.Errorf("%w: VAPID subject %q: want mailto:address or an https URL", delivery.ErrInvalidInput, opt.Subject)
	}
	urgency, err := ParseUrgency(string(opt.Urgency))
	if err != nil {
		return nil, err
	}
	kit, err := httpkit.New(httpkit.Options{CAFile: opt.CAFile, Egress: &httpkit.Egress{Allowed: opt.AllowedNetworks}})
	if err != nil {
		return nil, err
	}
	now := opt.Now
	if now == nil {
		now = time.Now
	}
	return &Client{
		key: opt.VAPIDKey, pub: base64.RawURLEncoding.EncodeToString(pub), subject: opt.Subject,
		urgency: urgency, now: now, randSalt: func(b []byte) error { _, err := rand.Read(b); return err },
		kit: kit,
	}, nil
}

// ParseVAPIDKey reads a P-256 private key: PEM ("EC PRIVATE KEY" or PKCS#8 "PRIVATE KEY", as
// `openssl ecparam -name prime256v1 -genkey` writes), or the base64url 32-byte scalar that
// `web-push generate-vapid-keys` prints. Errors never contain key material.
func ParseVAPIDKey(data []byte) (*ecdsa.PrivateKey, error) {
	if block, _ := pem.Decode(data); block != nil {
		var key any
		var err error
		switch block.Type {
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(block.Bytes)
		case "PRIVATE KEY":
			key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		default:
			return nil, fmt.Errorf("%w: VAPID key: PEM block %q, want EC PRIVATE KEY or PRIVATE KEY", delivery.ErrInvalidInput, block.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: VAPID key: not a valid private key", delivery.ErrInvalidInput)
		}
		k, ok := key.(*ecdsa.PrivateKey)
		if !ok || k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("%w: VAPID key: want a P-256 (prime256v1) key", delivery.ErrInvalidInput)
		}
		return k, nil
	}
	raw, err := decodeB64(strings.TrimSpace(string(data)))
	if err != nil || len(raw) != 32 {
		return nil, fmt.Errorf("%w: VAPID key: neither PEM nor a base64url 32-byte P-256 private key", delivery.ErrInvalidInput)
	}
	k, err := ecdsa.ParseRawPrivateKey(elliptic.P256(), raw)
	if err != nil {
		return nil, fmt.Errorf("%w: VAPID key: not a valid P-256 private key", delivery.ErrInvalidInput)
	}
	return k, nil
}

// PublicKey is the VAPID public key (base64url, uncompressed point): what the page passes to
// pushManager.subscribe as applicationServerKey.
func (c *Client) PublicKey() string { return c.pub }

// String names the channel kind for logs (each user has their own endpoint).
func (c *Client) String() string { return "webpush" }

// Subscription is a browser's PushSubscription (its toJSON form).
type Subscription struct {
	Endpoint string `json:"endpoint"`
	Keys     struct {
		P256dh string `json:"p256dh"`
		Auth   string `json:"auth"`
	} `json:"keys"`
}

// subscription is a checked Subscription.
type subscription struct {
	endpoint *url.URL
	ua       *ecdh.PublicKey
	auth     []byte
}

// parseSubscription checks the JSON, the https endpoint and both keys. Errors show no key material
// and no endpoint path (it identifies the browser).
func parseSubscription(s string) (subscription, error) {
	var sub Subscription
	if err := json.Unmarshal([]byte(s), &sub); err != nil {
		return subscription{}, errors.New("address is not a PushSubscription JSON object")
	}
	u, err := url.Parse(sub.Endpoint)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.Fragment != "" {
		return subscription{}, errors.New("subscription endpoint is not an https URL")
	}
	p256dh, err := decodeB64(sub.Keys.P256dh)
	if err != nil {
		return subscription{}, errors.New("subscription key p256dh is not base64url")
	}
	ua, err := ecdh.P256().NewPublicKey(p256dh)
	if err != nil {
		return subscription{}, errors.New("subscription key p256dh is not an uncompressed P-256 point")
	}
	auth, err := decodeB64(sub.Keys.Auth)
	if err != nil || len(auth) != 16 {
		return subscription{}, errors.New("subscription key auth is not 16 bytes of base64url")
	}
	return subscription{endpoint: u, ua: ua, auth: auth}, nil
}

// decodeB64 accepts base64url or standard base64, padded or not.
func decodeB64(s string) ([]byte, error) {
	s = strings.TrimRight(strings.NewReplacer("+", "-", "/", "_").Replace(strings.TrimSpace(s)), "=")
	if s == "" {
		return nil, errors.New("empty")
	}
	return base64.RawURLEncoding.DecodeString(s)
}

// Topic is the Topic header of every message of the task ref: 32 characters of the URL-safe base64
// alphabet derived from "ntf-"+ref, the same on every attempt and different per task.
func Topic(ref string) string {
	sum := sha256.Sum256([]byte("ntf-" + ref))
	return base64.RawURLEncoding.EncodeToString(sum[:])[:TopicLength]
}

// TTL is the remaining lifetime of a notification expiring at expiresAt, in whole seconds rounded
// down and capped at MaxTTL; 0 or less means it has expired (or expires within the second).
func TTL(expiresAt, now time.Time) int64 {
	return int64(min(expiresAt.Sub(now), MaxTTL) / time.Second)
}

// Notification is the plaintext the browser's service worker receives (after decryption).
type Notification struct {
	Ref  string `json:"ref"` // the task's reference: the same on every copy, so the service worker can drop a duplicate
	Body string `json:"body"`
}

// Send encrypts the notification for the subscription in msg.To and posts it to the push service.
// A TOPIC_RESEND is sent exactly like a SEND: the same Topic replaces only an undelivered copy.
func (c *Client) Send(ctx context.Context, msg delivery.Message) delivery.Observation {
	sub, err := parseSubscription(msg.To)
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: err.Error()}
	}
	now := c.now()
	if msg.ExpiresAt.IsZero() {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "no expiry: the TTL header needs the notification's expiry"}
	}
	ttl := TTL(msg.ExpiresAt, now)
	if ttl <= 0 {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "expired"}
	}
	plaintext, err := json.Marshal(Notification{Ref: msg.Ref, Body: msg.Body})
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "encode payload: " + err.Error()}
	}
	if len(plaintext) > MaxPlaintextBytes {
		return delivery.Observation{Outcome: delivery.OutcomeRejected,
			Detail: fmt.Sprintf("payload of %d bytes exceeds the Web Push limit of %d", len(plaintext), MaxPlaintextBytes)}
	}
	as, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeConnectFailed, Detail: "generate key: " + err.Error()}
	}
	salt := make([]byte, 16)
	if err := c.randSalt(salt); err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeConnectFailed, Detail: "generate salt: " + err.Error()}
	}
	body, err := encrypt(plaintext, sub.ua, sub.auth, as, salt)
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "encrypt: " + err.Error()}
	}
	auth, err := c.vapid(sub.endpoint, now)
	if err != nil {
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: "VAPID: " + err.Error()}
	}
	resp, failed := c.kit.Do(ctx, httpkit.Request{Method: http.MethodPost, URL: sub.endpoint.String(), Body: body, Header: http.Header{
		"Ttl":              {strconv.FormatInt(ttl, 10)},
		"Urgency":          {string(c.urgency)},
		"Topic":            {Topic(msg.Ref)},
		"Authorization":    {auth},
		"Content-Encoding": {"aes128gcm"},
		"Content-Type":     {"application/octet-stream"},
	}})
	if resp == nil {
		return failed
	}
	// The acceptance is the status and Location: a body that could not be read changes nothing, so
	// Unreadable is not called (with needBody=false it never reports one).
	return classify(resp)
}

// Classify maps a push service's response to an observation (see the package comment), for a
// request that went to it directly.
func Classify(status int, header http.Header, body []byte) delivery.Observation {
	return classify(&httpkit.Response{Status: status, Header: header, Body: body})
}

func classify(resp *httpkit.Response) delivery.Observation {
	status := resp.Status
	code := "HTTP " + strconv.Itoa(status)
	switch {
	case resp.Success():
		loc := resp.Header.Get("Location")
		if len(loc) > 500 {
			loc = loc[:500]
		}
		return delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: loc}
	case status == http.StatusNotFound || status == http.StatusGone:
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: code + ": subscription gone"}
	case status == http.StatusRequestEntityTooLarge:
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: code + ": payload too large"}
	case status >= 300 && status < 400:
		return delivery.Observation{Outcome: delivery.OutcomeRejected, Detail: code + ": redirects are not followed"}
	}
	return resp.Refused() // 429, 5xx, gateways; any other status is a rejection
}

// Query is not offered: a push service cannot be asked whether it holds a message.
func (c *Client) Query(context.Context, string) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeQueryFailed, Detail: "not supported"}
}

// encrypt is RFC 8291 section 3 with one aes128gcm record (RFC 8188): the header (salt, record
// size, the sender's public key) followed by the AES-128-GCM ciphertext of plaintext || 0x02.
func encrypt(plaintext []byte, ua *ecdh.PublicKey, authSecret []byte, as *ecdh.PrivateKey, salt []byte) ([]byte, error) {
	if len(plaintext) > MaxPlaintextBytes {
		return nil, fmt.Errorf("plaintext of %d bytes exceeds %d", len(plaintext), MaxPlaintextBytes)
	}
	ecdhSecret, err := as.ECDH(ua)
	if err != nil {
		return nil, err
	}
	uaPub, asPub := ua.Bytes(), as.PublicKey().Bytes()
	keyInfo := "WebPush: info\x00" + string(uaPub) + string(asPub)
	ikm, err := hkdf.Key(sha256.New, ecdhSecret, authSecret, keyInfo, 32)
	if err != nil {
		return nil, err
	}
	prk, err := hkdf.Extract(sha256.New, ikm, salt)
	if err != nil {
		return nil, err
	}
	cek, err := hkdf.Expand(sha256.New, prk, "Content-Encoding: aes128gcm\x00", 16)
	if err != nil {
		return nil, err
	}
	nonce, err := hkdf.Expand(sha256.New, prk, "Content-Encoding: nonce\x00", 12)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(cek)
	if err != nil {
		return nil, err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, headerBytes+len(plaintext)+1+tagBytes)
	out = append(out, salt...)
	out = binary.BigEndian.AppendUint32(out, RecordSize)
	out = append(out, byte(len(asPub)))
	out = append(out, asPub...)
	record := append(append(make([]byte, 0, len(plaintext)+1), plaintext...), 0x02) // last record, no padding
	return gcm.Seal(out, nonce, record, nil), nil
}

// vapid builds the RFC 8292 Authorization header: an ES256 JWT for the endpoint's origin, and the
// public key that verifies it.
func (c *Client) vapid(endpoint *url.URL, now time.Time) (string, error) {
	header := base64.RawURLEncoding.EncodeToString([]byte(`{"typ":"JWT","alg":"ES256"}`))
	claims, err := json.Marshal(struct {
		Aud string `json:"aud"`
		Exp int64  `json:"exp"`
		Sub string `json:"sub"`
	}{Aud: origin(endpoint), Exp: now.Add(vapidLifetime).Unix(), Sub: c.subject})
	if err != nil {
		return "", err
	}
	signing := header + "." + base64.RawURLEncoding.EncodeToString(claims)
	digest := sha256.Sum256([]byte(signing))
	r, s, err := ecdsa.Sign(rand.Reader, c.key, digest[:])
	if err != nil {
		return "", err
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return "vapid t=" + signing + "." + base64.RawURLEncoding.EncodeToString(sig) + ", k=" + c.pub, nil
}

// origin is the ASCII serialisation of the endpoint's origin (RFC 6454), the JWT audience.
func origin(u *url.URL) string {
	host := strings.ToLower(u.Host)
	if h, port, err := net.SplitHostPort(host); err == nil && port == "443" {
		host = h
		if strings.Contains(h, ":") {
			host = "[" + h + "]"
		}
	}
	return "https://" + host
}
