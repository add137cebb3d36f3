package fakes

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// APNs is a fake of Apple's Push Notification service provider API, served over TLS with HTTP/2 only
// (APNs refuses HTTP/1.1):
//
//	POST /3/device/{device token}   authorization: bearer <ES256 JWT>, apns-topic, apns-push-type, ...
//	                                -> 200, apns-id header; errors: {"reason":"..."} (410 adds "timestamp")
//
// The provider token is checked as APNs does: ES256 signed by the team's key with its kid and iss
// (403 InvalidProviderToken), no older than an hour (403 ExpiredProviderToken), and not replaced by a
// new one less than 20 minutes after the previous (429 TooManyProviderTokenUpdates). A device token
// made Unregister answers 410 Unregistered. Headers and device tokens are checked as Apple's error
// table describes them (https://developer.apple.com/documentation/usernotifications/handling-error-responses-from-apns):
// a device token of 64 hexadecimal digits (400 BadDeviceToken), apns-topic present (400 MissingTopic,
// required with token authentication) and the team's (400 TopicDisallowed), a known apns-push-type
// (400 InvalidPushType), apns-priority 1, 5 or 10 (400 BadPriority), an integer apns-expiration (400
// BadExpirationDate), a UUID apns-id (400 BadMessageId), an apns-collapse-id of at most 64 bytes (400
// BadCollapseId), no repeated header (400 DuplicateHeaders), a payload present (400 PayloadEmpty) and
// of at most 4 KB (413 PayloadTooLarge).
//
// Devices are offline until Online, and APNs stores for an offline device only the most recent
// notification of the app: each new one discards the one stored before ("coalescing",
// https://developer.apple.com/documentation/usernotifications/sending-notification-requests-to-apns).
// A device shows notifications with the same apns-collapse-id as one (Shown).
type APNs struct {
	srv   *httptest.Server
	key   *ecdsa.PrivateKey
	conns ConnCounter
	Team  string
	KeyID string
	Topic string

	mu           sync.Mutex
	now          func() time.Time
	seq          int
	lastIAT      int64 // iat of the newest provider token seen
	tokenChanges int
	script       map[string][]Step // by ref
	nextScript   []Step            // for requests of a ref without a script of its own
	sends        map[string]int
	unregistered map[string]bool
	devices      map[string]*apnsDevice // by device token
	lastHeader   http.Header
	lastBody     []byte
	protos       map[string]int
}

// StartAPNs starts the fake for one team, key and topic.
func StartAPNs() *APNs {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	a := &APNs{key: key, Team: "TEAM123456", KeyID: "KEY1234567", Topic: "com.example.app", now: time.Now,
		script: map[string][]Step{}, sends: map[string]int{}, unregistered: map[string]bool{},
		devices: map[string]*apnsDevice{}, protos: map[string]int{}}
	a.srv = httptest.NewUnstartedServer(http.HandlerFunc(a.serve))
	a.srv.EnableHTTP2 = true
	a.srv.Config.ConnState = a.conns.ConnState
	a.srv.StartTLS()
	return a
}

// Close stops the server.
func (a *APNs) Close() { a.srv.Close() }

// URL is the endpoint.
func (a *APNs) URL() string { return a.srv.URL }

// CertPEM is the server's certificate, for the client's CA file.
func (a *APNs) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.srv.Certificate().Raw})
}

// KeyP8 is the team's authentication key as Apple hands it out (.p8: PKCS#8 PEM).
func (a *APNs) KeyP8() []byte {
	der, err := x509.MarshalPKCS8PrivateKey(a.key)
	if err != nil {
		panic(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// SetClock sets the fake's clock (provider-token age checks).
func (a *APNs) SetClock(now func() time.Time) { a.mu.Lock(); a.now = now; a.mu.Unlock() }

// Conns is the number of connections accepted.
func (a *APNs) Conns() int { return a.conns.Count() }

// TokenChanges is how many times the provider token changed (the first one counts).
func (a *APNs) TokenChanges() int { a.mu.Lock(); defer a.mu.Unlock(); return a.tokenChanges }

// ScriptSend queues answers for the next requests of ref (Status before acceptance; Delay, Hang, Drop after).
func (a *APNs) ScriptSend(ref string, steps ...Step) {
	a.mu.Lock()
	a.script[ref] = append(a.script[ref], steps...)
	a.mu.Unlock()
}

// ScriptNext queues answers for the next requests of any ref without a script of its own.
func (a *APNs) ScriptNext(steps ...Step) {
	a.mu.Lock()
	a.nextScript = append(a.nextScript, steps...)
	a.mu.Unlock()
}

// Unregister makes a device token answer 410 Unregistered.
func (a *APNs) Unregister(device string) { a.mu.Lock(); a.unregistered[device] = true; a.mu.Unlock() }

// Sends is the number of requests received for ref.
func (a *APNs) Sends(ref string) int { a.mu.Lock(); defer a.mu.Unlock(); return a.sends[ref] }

// Protos counts requests by protocol ("HTTP/2.0", ...).
func (a *APNs) Protos() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string]int{}
	for k, v := range a.protos {
		out[k] = v
	}
	return out
}

// apnsDevice is what APNs holds for one device token of the fake's one app (topic).
type apnsDevice struct {
	online   bool
	stored   *apnsNotification // the most recent notification while offline
	received []apnsNotification
}

type apnsNotification struct {
	Message
	collapseID string
}

func (a *APNs) device(token string) *apnsDevice {
	d := a.devices[token]
	if d == nil {
		d = &apnsDevice{}
		a.devices[token] = d
	}
	return d
}

func (d *apnsDevice) flush() {
	if d.stored != nil {
		d.received = append(d.received, *d.stored)
		d.stored = nil
	}
}

// Deliver hands every device the notification APNs stored for it, as if each came online for a moment.
func (a *APNs) Deliver() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range a.devices {
		d.flush()
	}
}

// Online brings a device online: it receives the stored notification, and every later one at once.
func (a *APNs) Online(device string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	d := a.device(device)
	d.flush()
	d.online = true
}

// Offline takes a device offline again.
func (a *APNs) Offline(device string) { a.mu.Lock(); a.device(device).online = false; a.mu.Unlock() }

// Received is every notification the device received, in order.
func (a *APNs) Received(device string) []Message {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []Message
	for _, n := range a.device(device).received {
		out = append(out, n.Message)
	}
	return out
}

// Shown is what the device shows: the notifications it received, those with the same apns-collapse-id
// as one (the newest, in the place of the first).
func (a *APNs) Shown(device string) []Message {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []Message
	at := map[string]int{}
	for _, n := range a.device(device).received {
		if i, ok := at[n.collapseID]; ok && n.collapseID != "" {
			out[i] = n.Message
			continue
		}
		at[n.collapseID] = len(out)
		out = append(out, n.Message)
	}
	return out
}

// Stored is the notification APNs holds for an offline device, if any.
func (a *APNs) Stored(device string) (Message, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n := a.device(device).stored; n != nil {
		return n.Message, true
	}
	return Message{}, false
}

// Outbound is how many copies of ref the devices have or will get: received ones and stored ones.
func (a *APNs) Outbound(ref string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, d := range a.devices {
		if d.stored != nil && d.stored.Ref == ref {
			n++
		}
		for _, m := range d.received {
			if m.Ref == ref {
				n++
			}
		}
	}
	return n
}

// Last is the last request's headers and body.
func (a *APNs) Last() (http.Header, []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastHeader, a.lastBody
}

func apnsError(w http.ResponseWriter, status int, reason string) {
	w.Header().Set("apns-id", "00000000-0000-0000-0000-000000000000")
	body := map[string]any{"reason": reason}
	if status == http.StatusGone {
		body["timestamp"] = time.Now().UnixMilli()
	}
	writeJSON(w, status, body)
}

// apnsReason is the reason of a scripted status.
var apnsReason = map[int]string{400: "BadDeviceToken", 403: "InvalidProviderToken", 404: "BadPath", 405: "MethodNotAllowed",
	410: "Unregistered", 413: "PayloadTooLarge", 429: "TooManyRequests", 500: "InternalServerError", 503: "ServiceUnavailable"}

func (a *APNs) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		return
	}
	var p struct {
		Ref string `json:"ref"`
	}
	_ = json.Unmarshal(body, &p)
	a.mu.Lock()
	a.sends[p.Ref]++
	a.protos[r.Proto]++
	a.lastHeader, a.lastBody = r.Header.Clone(), body
	var step Step
	if q := a.script[p.Ref]; len(q) > 0 {
		step, a.script[p.Ref] = q[0], q[1:]
	} else if len(a.nextScript) > 0 {
		step, a.nextScript = a.nextScript[0], a.nextScript[1:]
	}
	now := a.now()
	a.mu.Unlock()
	device, ok := strings.CutPrefix(r.URL.Path, "/3/device/")
	switch {
	case r.ProtoMajor != 2:
		apnsError(w, http.StatusBadRequest, "BadRequest") // APNs speaks HTTP/2 only
		return
	case r.Method != http.MethodPost:
		apnsError(w, http.StatusMethodNotAllowed, "MethodNotAllowed")
		return
	case !ok || device == "":
		apnsError(w, http.StatusNotFound, "BadPath")
		return
	}
	if status, reason := a.checkToken(r.Header.Get("Authorization"), now); status != 0 {
		apnsError(w, status, reason)
		return
	}
	a.mu.Lock()
	unregistered := a.unregistered[device]
	a.mu.Unlock()
	if status, reason := a.checkRequest(r.Header, device, body); status != 0 {
		apnsError(w, status, reason)
		return
	}
	switch {
	case unregistered:
		apnsError(w, http.StatusGone, "Unregistered")
		return
	case step.Status != 0:
		if step.RetryAfter != "" {
			w.Header().Set("Retry-After", step.RetryAfter)
		}
		reason := apnsReason[step.Status]
		if reason == "" {
			reason = "BadRequest"
		}
		apnsError(w, step.Status, reason)
		return
	}
	a.mu.Lock()
	a.seq++
	id := r.Header.Get("apns-id")
	if id == "" {
		id = fmt.Sprintf("%08x-0000-4000-8000-000000000000", a.seq)
	}
	n := apnsNotification{Message{ID: id, Ref: p.Ref, To: device, Body: string(body)}, r.Header.Get("apns-collapse-id")}
	if d := a.device(device); d.online {
		d.received = append(d.received, n)
	} else {
		d.stored = &n // replaces the one stored before: one per app
	}
	a.mu.Unlock()
	if step.Delay > 0 || step.Hang {
		wait(r, step)
	}
	if step.Drop {
		Drop(w, r)
		return
	}
	w.Header().Set("apns-id", id)
	w.WriteHeader(http.StatusOK)
}

// apnsPushTypes are the values of apns-push-type Apple lists.
var apnsPushTypes = []string{"alert", "background", "location", "voip", "complication", "fileprovider", "mdm",
	"liveactivity", "pushtotalk", "widgets", "controls"}

// checkRequest applies Apple's rules for the device token, the headers and the payload; status 0
// means the request is well formed.
func (a *APNs) checkRequest(h http.Header, device string, body []byte) (int, string) {
	for name, values := range h {
		if strings.HasPrefix(strings.ToLower(name), "apns-") && len(values) > 1 {
			return http.StatusBadRequest, "DuplicateHeaders"
		}
	}
	if _, err := hex.DecodeString(device); err != nil || len(device) != 64 {
		return http.StatusBadRequest, "BadDeviceToken"
	}
	topic := h.Get("apns-topic")
	switch {
	case topic == "":
		return http.StatusBadRequest, "MissingTopic" // required with token-based authentication
	case topic != a.Topic:
		return http.StatusBadRequest, "TopicDisallowed"
	case !slices.Contains(apnsPushTypes, h.Get("apns-push-type")):
		return http.StatusBadRequest, "InvalidPushType"
	}
	if p := h.Get("apns-priority"); p != "" && p != "1" && p != "5" && p != "10" {
		return http.StatusBadRequest, "BadPriority"
	}
	if e := h.Get("apns-expiration"); e != "" {
		if _, err := strconv.ParseInt(e, 10, 64); err != nil {
			return http.StatusBadRequest, "BadExpirationDate"
		}
	}
	if id := h.Get("apns-id"); id != "" && !isUUID(id) {
		return http.StatusBadRequest, "BadMessageId"
	}
	switch {
	case len(h.Get("apns-collapse-id")) > 64:
		return http.StatusBadRequest, "BadCollapseId"
	case len(body) == 0:
		return http.StatusBadRequest, "PayloadEmpty"
	case len(body) > 4096:
		return http.StatusRequestEntityTooLarge, "PayloadTooLarge"
	}
	return 0, ""
}

// isUUID reports the canonical 8-4-4-4-12 hexadecimal form.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case !strings.ContainsRune("0123456789abcdefABCDEF", c):
			return false
		}
	}
	return true
}

// checkToken applies APNs' provider-token rules; status 0 means the token is good.
func (a *APNs) checkToken(auth string, now time.Time) (int, string) {
	raw, ok := strings.CutPrefix(auth, "bearer ")
	if !ok || raw == "" {
		return http.StatusForbidden, "MissingProviderToken"
	}
	claims := jwt.MapClaims{}
	tok, err := jwt.ParseWithClaims(raw, claims, func(*jwt.Token) (any, error) { return &a.key.PublicKey, nil },
		jwt.WithValidMethods([]string{"ES256"}), jwt.WithIssuer(a.Team), jwt.WithoutClaimsValidation())
	if err != nil || tok.Header["kid"] != a.KeyID {
		return http.StatusForbidden, "InvalidProviderToken"
	}
	iatF, _ := claims["iat"].(float64)
	iat := int64(iatF)
	if now.Sub(time.Unix(iat, 0)) > time.Hour {
		return http.StatusForbidden, "ExpiredProviderToken"
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if iat != a.lastIAT {
		if a.lastIAT != 0 && iat < a.lastIAT+int64((20*time.Minute)/time.Second) {
			return http.StatusTooManyRequests, "TooManyProviderTokenUpdates"
		}
		if iat > a.lastIAT {
			a.lastIAT = iat
			a.tokenChanges++
		}
	}
	return 0, ""
}
