package fakes

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// FCM is a fake of Firebase Cloud Messaging's HTTP v1 send method and of Google's OAuth 2.0 token
// endpoint, served over TLS with HTTP/2 as the real ones are:
//
//	POST /token                                  grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<RS256 JWT>
//	                                             -> 200 {"access_token":"...","expires_in":3600,"token_type":"Bearer"}
//	POST /v1/projects/{project}/messages:send    Authorization: Bearer <token>, {"message":{"token":...,"data":{"ref":...},...}}
//	                                             -> 200 {"name":"projects/{project}/messages/<id>"}
//
// The assertion is checked against the service account's public key (iss, aud = the token URL, the
// firebase.messaging scope, exp); a send needs a live access token (401 UNAUTHENTICATED otherwise),
// the project (404 NOT_FOUND otherwise), a registered token (404 UNREGISTERED after Unregister) and a
// valid one (400 INVALID_ARGUMENT after Invalid, with the body FCM's error-codes page shows). Errors
// are google.rpc.Status bodies with an FcmError detail, as FCM answers them.
//
// Devices are offline until Online, and FCM stores their messages as it documents
// (https://firebase.google.com/docs/cloud-messaging/customize-messages/collapsible-message-types):
// a message with the collapse key of a stored one replaces it; at most four collapse keys are stored
// per device (a fifth evicts the oldest: FCM names no rule for which it keeps); at most 100
// non-collapsible messages are stored, and one more discards every stored message (the device is told
// so when it comes online: DeletedNotices).
type FCM struct {
	srv     *httptest.Server
	key     *rsa.PrivateKey
	project string
	email   string
	conns   ConnCounter

	mu           sync.Mutex
	seq          int
	tokens       map[string]time.Time // access token -> expiry
	tokenLife    time.Duration
	tokenReqs    int
	tokenScript  []Step
	sendScript   map[string][]Step // by ref
	nextScript   []Step            // for requests of a ref without a script of its own
	sends        map[string]int    // requests received, by ref
	unregistered map[string]bool
	invalid      map[string]bool
	devices      map[string]*fcmDevice // by registration token
	lastHeader   http.Header
	lastBody     []byte
}

// StartFCM starts the fake for project.
func StartFCM(project string) *FCM {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	f := &FCM{key: key, project: project, email: "notifier@" + project + ".iam.gserviceaccount.com",
		tokens: map[string]time.Time{}, tokenLife: time.Hour, sendScript: map[string][]Step{}, sends: map[string]int{},
		unregistered: map[string]bool{}, invalid: map[string]bool{}, devices: map[string]*fcmDevice{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /token", f.handleToken)
	mux.HandleFunc("POST /v1/projects/{project}/{method}", f.handleSend)
	f.srv = httptest.NewUnstartedServer(mux)
	f.srv.EnableHTTP2 = true
	f.srv.Config.ConnState = f.conns.ConnState
	f.srv.StartTLS()
	return f
}

// Close stops the server.
func (f *FCM) Close() { f.srv.Close() }

// URL is the API origin (the adapter's endpoint).
func (f *FCM) URL() string { return f.srv.URL }

// TokenURL is the OAuth token endpoint.
func (f *FCM) TokenURL() string { return f.srv.URL + "/token" }

// CertPEM is the server's certificate, for the client's CA file.
func (f *FCM) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
}

// Conns is the number of connections accepted.
func (f *FCM) Conns() int { return f.conns.Count() }

// ServiceAccountJSON is a key file for the fake's service account, token_uri pointing at the fake.
func (f *FCM) ServiceAccountJSON() []byte {
	der, err := x509.MarshalPKCS8PrivateKey(f.key)
	if err != nil {
		panic(err)
	}
	b, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": f.project, "private_key_id": "fake-key-1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": f.email, "client_id": "1", "token_uri": f.TokenURL(),
	})
	return b
}

// SetTokenLifetime sets expires_in of tokens issued from now on.
func (f *FCM) SetTokenLifetime(d time.Duration) { f.mu.Lock(); f.tokenLife = d; f.mu.Unlock() }

// RevokeTokens invalidates every access token issued so far.
func (f *FCM) RevokeTokens() { f.mu.Lock(); clear(f.tokens); f.mu.Unlock() }

// ScriptToken queues answers for the next token requests (Status: an OAuth error; Delay/Hang: slow).
func (f *FCM) ScriptToken(steps ...Step) {
	f.mu.Lock()
	f.tokenScript = append(f.tokenScript, steps...)
	f.mu.Unlock()
}

// ScriptSend queues answers for the next sends of ref (Status before acceptance; Delay, Hang, Drop after).
func (f *FCM) ScriptSend(ref string, steps ...Step) {
	f.mu.Lock()
	f.sendScript[ref] = append(f.sendScript[ref], steps...)
	f.mu.Unlock()
}

// ScriptNext queues answers for the next sends of any ref without a script of its own (a task
// whose ref is not known yet).
func (f *FCM) ScriptNext(steps ...Step) {
	f.mu.Lock()
	f.nextScript = append(f.nextScript, steps...)
	f.mu.Unlock()
}

// Unregister makes a registration token answer 404 UNREGISTERED.
func (f *FCM) Unregister(token string) { f.mu.Lock(); f.unregistered[token] = true; f.mu.Unlock() }

// Invalid makes a registration token answer 400 INVALID_ARGUMENT, "not a valid FCM registration token".
func (f *FCM) Invalid(token string) { f.mu.Lock(); f.invalid[token] = true; f.mu.Unlock() }

// TokenRequests is the number of token requests received.
func (f *FCM) TokenRequests() int { f.mu.Lock(); defer f.mu.Unlock(); return f.tokenReqs }

// Sends is the number of send requests received for ref (each one an attempt, whatever its answer).
func (f *FCM) Sends(ref string) int { f.mu.Lock(); defer f.mu.Unlock(); return f.sends[ref] }

// FCM's documented storage for an offline device.
const (
	// FCMCollapseKeys is how many collapse keys FCM stores per device.
	FCMCollapseKeys = 4
	// FCMStoredLimit is how many non-collapsible messages FCM stores per device; one more discards all.
	FCMStoredLimit = 100
)

// fcmDevice is what FCM holds for one registration token.
type fcmDevice struct {
	online      bool
	collapsible []fcmCollapsed // oldest first, at most FCMCollapseKeys
	plain       []Message      // at most FCMStoredLimit
	received    []Message
	deleted     int
}

type fcmCollapsed struct {
	key string
	msg Message
}

func (f *FCM) device(token string) *fcmDevice {
	d := f.devices[token]
	if d == nil {
		d = &fcmDevice{}
		f.devices[token] = d
	}
	return d
}

// store keeps m for the device as FCM does; an online device receives it at once.
func (d *fcmDevice) store(m Message, collapseKey string) {
	switch {
	case d.online:
		d.received = append(d.received, m)
	case collapseKey != "":
		d.collapsible = slices.DeleteFunc(d.collapsible, func(c fcmCollapsed) bool { return c.key == collapseKey })
		if len(d.collapsible) == FCMCollapseKeys {
			d.collapsible = d.collapsible[1:]
		}
		d.collapsible = append(d.collapsible, fcmCollapsed{collapseKey, m})
	case len(d.plain) == FCMStoredLimit:
		d.collapsible, d.plain = nil, nil
		d.deleted++
	default:
		d.plain = append(d.plain, m)
	}
}

// flush hands the device what FCM stored for it.
func (d *fcmDevice) flush() {
	for _, c := range d.collapsible {
		d.received = append(d.received, c.msg)
	}
	d.received = append(d.received, d.plain...)
	d.collapsible, d.plain = nil, nil
}

func (d *fcmDevice) stored() []Message {
	out := slices.Clone(d.plain)
	for _, c := range d.collapsible {
		out = append(out, c.msg)
	}
	return out
}

// Deliver hands every device what FCM stored for it, as if each came online for a moment: from now on
// those messages can no longer be collapsed.
func (f *FCM) Deliver() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range f.devices {
		d.flush()
	}
}

// Online brings the device of a registration token online: it receives what FCM stored, and every
// later message at once.
func (f *FCM) Online(token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.device(token)
	d.flush()
	d.online = true
}

// Offline takes the device offline again: FCM stores its messages.
func (f *FCM) Offline(token string) { f.mu.Lock(); f.device(token).online = false; f.mu.Unlock() }

// Received is what the device of a registration token received, in order.
func (f *FCM) Received(token string) []Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.device(token).received)
}

// Stored is what FCM holds for the (offline) device of a registration token.
func (f *FCM) Stored(token string) []Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.device(token).stored()
}

// DeletedNotices is how many times FCM discarded the device's stored messages (too many stored).
func (f *FCM) DeletedNotices(token string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.device(token).deleted
}

// Outbound is how many copies of ref the devices have or will get: received ones and stored ones.
func (f *FCM) Outbound(ref string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, d := range f.devices {
		for _, m := range append(d.stored(), d.received...) {
			if m.Ref == ref {
				n++
			}
		}
	}
	return n
}

// Last is the last send request's headers and body.
func (f *FCM) Last() (http.Header, []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastHeader, f.lastBody
}

func (f *FCM) handleToken(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	f.mu.Lock()
	f.tokenReqs++
	var step Step
	if len(f.tokenScript) > 0 {
		step, f.tokenScript = f.tokenScript[0], f.tokenScript[1:]
	}
	f.mu.Unlock()
	if step.Delay > 0 || step.Hang {
		wait(r, step)
	}
	if step.Drop {
		Drop(w, r)
		return
	}
	if step.Status != 0 {
		oauthError(w, step.Status, "invalid_grant", "scripted")
		return
	}
	if r.PostForm.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
		oauthError(w, http.StatusBadRequest, "unsupported_grant_type", "Invalid grant_type.")
		return
	}
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(r.PostForm.Get("assertion"), claims, func(*jwt.Token) (any, error) { return &f.key.PublicKey, nil },
		jwt.WithValidMethods([]string{"RS256"}), jwt.WithAudience(f.TokenURL()), jwt.WithIssuer(f.email), jwt.WithExpirationRequired())
	if err != nil {
		oauthError(w, http.StatusBadRequest, "invalid_grant", "Invalid JWT Signature.")
		return
	}
	if scope, _ := claims["scope"].(string); !strings.Contains(" "+scope+" ", " https://www.googleapis.com/auth/firebase.messaging ") {
		oauthError(w, http.StatusBadRequest, "invalid_scope", "Invalid OAuth scope or ID token audience provided.")
		return
	}
	f.mu.Lock()
	f.seq++
	tok := fmt.Sprintf("ya29.fake-%04d", f.seq)
	f.tokens[tok] = time.Now().Add(f.tokenLife)
	life := f.tokenLife
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"access_token": tok, "expires_in": int(life / time.Second), "token_type": "Bearer"})
}

func oauthError(w http.ResponseWriter, status int, code, desc string) {
	writeJSON(w, status, map[string]string{"error": code, "error_description": desc})
}

// googleError answers a google.rpc.Status body, with an FcmError detail when fcmCode is set.
func googleError(w http.ResponseWriter, status int, rpcStatus, fcmCode, msg string) {
	e := map[string]any{"code": status, "message": msg, "status": rpcStatus}
	if fcmCode != "" {
		e["details"] = []map[string]string{{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": fcmCode}}
	}
	writeJSON(w, status, map[string]any{"error": e})
}

// fcmStatus is the FCM error code and google.rpc status of a scripted HTTP status.
var fcmStatus = map[int][2]string{
	400: {"INVALID_ARGUMENT", "INVALID_ARGUMENT"}, 401: {"THIRD_PARTY_AUTH_ERROR", "UNAUTHENTICATED"},
	403: {"SENDER_ID_MISMATCH", "PERMISSION_DENIED"}, 404: {"UNREGISTERED", "NOT_FOUND"},
	429: {"QUOTA_EXCEEDED", "RESOURCE_EXHAUSTED"}, 500: {"INTERNAL", "INTERNAL"}, 503: {"UNAVAILABLE", "UNAVAILABLE"},
}

type fcmSend struct {
	Message struct {
		Token        string            `json:"token"`
		Data         map[string]string `json:"data"`
		Notification struct {
			Body string `json:"body"`
		} `json:"notification"`
		Android struct {
			CollapseKey string `json:"collapse_key"`
		} `json:"android"`
	} `json:"message"`
}

func (f *FCM) handleSend(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		return
	}
	var req fcmSend
	jsonErr := json.Unmarshal(body, &req)
	ref := req.Message.Data["ref"]
	f.mu.Lock()
	f.sends[ref]++
	f.lastHeader, f.lastBody = r.Header.Clone(), body
	var step Step
	if q := f.sendScript[ref]; len(q) > 0 {
		step, f.sendScript[ref] = q[0], q[1:]
	} else if len(f.nextScript) > 0 {
		step, f.nextScript = f.nextScript[0], f.nextScript[1:]
	}
	bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	exp, live := f.tokens[bearer]
	live = live && time.Now().Before(exp)
	unregistered := f.unregistered[req.Message.Token]
	invalid := f.invalid[req.Message.Token]
	f.mu.Unlock()
	switch {
	case !live:
		googleError(w, http.StatusUnauthorized, "UNAUTHENTICATED", "", "Request had invalid authentication credentials.")
		return
	case r.PathValue("project") != f.project || r.PathValue("method") != "messages:send":
		googleError(w, http.StatusNotFound, "NOT_FOUND", "", "Requested entity was not found.")
		return
	case jsonErr != nil || req.Message.Token == "" || invalid:
		googleError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "The registration token is not a valid FCM registration token")
		return
	case unregistered:
		googleError(w, http.StatusNotFound, "NOT_FOUND", "UNREGISTERED", "Requested entity was not found.")
		return
	case step.Status != 0:
		if step.RetryAfter != "" {
			w.Header().Set("Retry-After", step.RetryAfter)
		}
		c := fcmStatus[step.Status]
		if c[0] == "" {
			c = [2]string{"UNSPECIFIED_ERROR", "UNKNOWN"}
		}
		googleError(w, step.Status, c[1], c[0], "scripted")
		return
	}
	f.mu.Lock()
	f.seq++
	id := fmt.Sprintf("0:%d%%fake", f.seq)
	m := Message{ID: id, Ref: ref, To: req.Message.Token, Body: req.Message.Notification.Body}
	f.device(req.Message.Token).store(m, req.Message.Android.CollapseKey)
	f.mu.Unlock()
	if step.Delay > 0 || step.Hang {
		wait(r, step)
	}
	if step.Drop {
		Drop(w, r)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"name": "projects/" + f.project + "/messages/" + id})
}

// wait sleeps a step's Delay (or until the client goes away for Hang).
func wait(r *http.Request, step Step) {
	var expired <-chan time.Time
	if !step.Hang {
		t := time.NewTimer(step.Delay)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-expired:
	case <-r.Context().Done():
		// The client gave up: no answer at all, never the success the caller would write next (nor
		// net/http's implicit 200).
		panic(http.ErrAbortHandler)
	}
}
