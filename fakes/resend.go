package fakes

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Resend is a fake of Resend's email API (https://resend.com/docs/api-reference/emails/send-email),
// built from its documentation:
//
//	POST /emails  Authorization: Bearer <key>, Idempotency-Key: <key> (optional, 1-256 characters)
//	              {"from":"...","to":["..."],"subject":"...","text":"...","tags":[{"name":"...","value":"..."}]}
//	              -> 200 {"id":"<uuid>"}
//
// Errors are Resend's body {"statusCode":N,"name":"...","message":"..."}
// (https://resend.com/docs/api-reference/errors): no key 401 missing_api_key, another key 403
// invalid_api_key, a key longer than 256 characters 400 invalid_idempotency_key, a body that is not
// JSON 400 validation_error, no from, to or subject 422 missing_required_field, another path 404
// not_found, another method 405 method_not_allowed. Idempotency
// (https://resend.com/docs/dashboard/emails/idempotency-keys): a key seen before with the same
// payload is answered with the original id and sends nothing; with another payload 409
// invalid_idempotent_request; while the first request with the key is still being answered (a
// scripted delay or hang) 409 concurrent_idempotent_requests. A key is forgotten ResendKeyLifetime
// after the request that first used it reached the fake ("We keep idempotency keys in our system for
// 24 hours"), on the fake's clock (SetClock): a request with that key afterwards sends a new email.
//
// It is scriptable like the channel fakes, per ref (the tag notifier_ref): a Step's Status is
// answered before anything is recorded, with Resend's error name for that status (429 with
// Retry-After); Delay, Hang, Malformed and Drop come after the acceptance is recorded, and shape a
// replay's answer too.
type Resend struct {
	providerServer

	key string

	mu         sync.Mutex
	q          queues
	requests   int            // every request to /emails, whatever its outcome
	sends      map[string]int // authenticated POST /emails per ref
	outbound   map[string]int // new emails per ref
	byKey      map[string]resendSent
	inProgress map[string]bool // keys whose first request has not been answered yet
	messages   map[string][]Message
	now        func() time.Time
}

type resendSent struct {
	id      string
	payload string    // the request body, re-encoded: what "the same payload" compares
	first   time.Time // when the first request with the key reached the fake: the key expires 24 h later
}

// ResendKeyLifetime is how long Resend keeps an idempotency key
// (https://resend.com/docs/dashboard/emails/idempotency-keys), counted from its first request.
const ResendKeyLifetime = 24 * time.Hour

// ResendRefTag is the tag the fake reads the task's ref from (service/resend sets it).
const ResendRefTag = "notifier_ref"

// StartResend starts a Resend fake on 127.0.0.1 with a free port that accepts apiKey. It panics on
// failure, like httptest.NewServer.
func StartResend(apiKey string) *Resend {
	f, err := StartResendOn(apiKey, "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	return f
}

// StartResendOn starts a Resend fake on addr (the `notifier fake --resend` command).
func StartResendOn(apiKey, addr string) (*Resend, error) {
	if apiKey == "" {
		return nil, fmt.Errorf("fakes: resend: an API key to accept is required")
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fakes: listen %s: %w", addr, err)
	}
	f := &Resend{key: apiKey, q: queues{byRef: map[string][]Step{}}, sends: map[string]int{}, outbound: map[string]int{},
		byKey: map[string]resendSent{}, inProgress: map[string]bool{}, messages: map[string][]Message{}, now: time.Now}
	f.start(l, f.serveHTTP)
	return f, nil
}

// ScriptSend appends steps consumed one per POST /emails for ref ("" is the shared queue).
func (f *Resend) ScriptSend(ref string, steps ...Step) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.q.push(ref, steps)
}

// SetClock replaces the clock the fake ages idempotency keys by (time.Now by default), so a test can
// reach a key's 24 hours without waiting for them.
func (f *Resend) SetClock(now func() time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = now
}

// Requests counts every request to /emails, refused ones included: what reached the provider.
func (f *Resend) Requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests
}

// Sends counts the authenticated POST /emails for ref, whatever their outcome.
func (f *Resend) Sends(ref string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sends[ref]
}

// Outbound counts the emails really sent for ref: replays of a key do not count.
func (f *Resend) Outbound(ref string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.outbound[ref]
}

// Messages lists the emails sent for ref, in order.
func (f *Resend) Messages(ref string) []Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Message(nil), f.messages[ref]...)
}

// Busy reports whether a request with an idempotency key is still being answered (a scripted delay or
// hang): until it is not, a resend with that key is answered 409 concurrent_idempotent_requests.
func (f *Resend) Busy() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.inProgress) > 0
}

// ResendError is Resend's error body.
type ResendError struct {
	StatusCode int    `json:"statusCode"`
	Name       string `json:"name"`
	Message    string `json:"message"`
}

func resendError(w http.ResponseWriter, status int, name, message string) {
	writeJSON(w, status, ResendError{StatusCode: status, Name: name, Message: message})
}

// resendScripted answers a scripted status with the error Resend documents for it.
func resendScripted(w http.ResponseWriter, step Step) {
	name, message := "application_error", "An unexpected error occurred."
	switch step.Status {
	case http.StatusBadRequest:
		name, message = "validation_error", "We found an error with one or more fields in the request."
	case http.StatusUnauthorized:
		name, message = "missing_api_key", "Missing API key in the authorization header."
	case http.StatusForbidden:
		name, message = "validation_error", "The example.com domain is not verified. Please, add and verify your domain."
	case http.StatusConflict:
		name, message = "concurrent_idempotent_requests", "Same idempotency key used while original request is still in progress."
	case http.StatusUnprocessableEntity:
		name, message = "invalid_parameter", "The request has an invalid parameter."
	case http.StatusTooManyRequests:
		name, message = "rate_limit_exceeded", "Too many requests. Please limit the number of requests per second."
		retry := step.RetryAfter
		if retry == "" {
			retry = "1"
		}
		w.Header().Set("Retry-After", retry)
		w.Header().Set("Ratelimit-Limit", "2")
		w.Header().Set("Ratelimit-Remaining", "0")
		w.Header().Set("Ratelimit-Reset", retry)
	case http.StatusInternalServerError:
		name, message = "internal_server_error", "An unexpected error occurred."
	}
	if step.RetryAfter != "" {
		w.Header().Set("Retry-After", step.RetryAfter)
	}
	resendError(w, step.Status, name, message)
}

type resendEmail struct {
	From    string          `json:"from"`
	To      json.RawMessage `json:"to"` // a string or an array of strings
	Subject string          `json:"subject"`
	Text    string          `json:"text"`
	HTML    string          `json:"html"`
	Tags    []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"tags"`
}

func (f *Resend) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/emails" {
		resendError(w, http.StatusNotFound, "not_found", "The requested endpoint does not exist.")
		return
	}
	f.mu.Lock()
	f.requests++
	f.mu.Unlock()
	if r.Method != http.MethodPost {
		resendError(w, http.StatusMethodNotAllowed, "method_not_allowed", "Method is not allowed for the requested path.")
		return
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	switch {
	case !ok || token == "":
		resendError(w, http.StatusUnauthorized, "missing_api_key", "Missing API key in the authorization header.")
		return
	case token != f.key:
		resendError(w, http.StatusForbidden, "invalid_api_key", "API key is invalid.")
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if _, given := r.Header["Idempotency-Key"]; given && (key == "" || len(key) > 256) {
		resendError(w, http.StatusBadRequest, "invalid_idempotency_key", "The key must be between 1-256 chars.")
		return
	}
	var email resendEmail
	if _, err := decodeJSON(w, r, &email, false); err != nil {
		resendError(w, http.StatusBadRequest, "validation_error", "Invalid JSON body.")
		return
	}
	to := email.recipients()
	if email.From == "" || len(to) == 0 || email.Subject == "" {
		resendError(w, http.StatusUnprocessableEntity, "missing_required_field", "The request body is missing one or more required fields: from, to, subject.")
		return
	}
	ref := email.ref()
	payload, _ := json.Marshal(email)

	f.mu.Lock()
	f.sends[ref]++
	step := f.q.pop(ref)
	if step.Status != 0 {
		f.mu.Unlock()
		resendScripted(w, step)
		return
	}
	now := f.now()
	if seen, ok := f.byKey[key]; ok && !now.Before(seen.first.Add(ResendKeyLifetime)) {
		delete(f.byKey, key) // expired: Resend no longer knows the key
	}
	if key != "" {
		if f.inProgress[key] {
			f.mu.Unlock()
			resendError(w, http.StatusConflict, "concurrent_idempotent_requests", "Same idempotency key used while original request is still in progress.")
			return
		}
		if seen, ok := f.byKey[key]; ok {
			f.mu.Unlock()
			if seen.payload != string(payload) {
				resendError(w, http.StatusConflict, "invalid_idempotent_request", "Same idempotency key used with a different request payload.")
				return
			}
			f.answer(w, r, step, seen.id) // the original response, nothing sent (answered as scripted)
			return
		}
	}
	id := newUUID()
	if key != "" {
		f.byKey[key] = resendSent{id: id, payload: string(payload), first: now}
		f.inProgress[key] = true
		defer func() { // answered or aborted: the request is no longer in progress
			f.mu.Lock()
			delete(f.inProgress, key)
			f.mu.Unlock()
		}()
	}
	f.outbound[ref]++
	f.messages[ref] = append(f.messages[ref], Message{ID: id, Ref: ref, Key: key, To: strings.Join(to, ","), Body: email.Text})
	f.mu.Unlock()

	f.answer(w, r, step, id)
}

// answer writes the acceptance as the step scripts it (after the acceptance was recorded).
func (f *Resend) answer(w http.ResponseWriter, r *http.Request, step Step, id string) {
	if step.Delay > 0 {
		waitOrAbort(r, f.done, step.Delay)
	}
	if step.Hang {
		waitOrAbort(r, f.done, -1)
	}
	if step.Drop {
		Drop(w, r)
		return
	}
	body := []byte(`{"id":"` + id + `"}`)
	if step.Malformed {
		body = body[:len(body)/2]
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

func (e resendEmail) recipients() []string {
	var one string
	if json.Unmarshal(e.To, &one) == nil && one != "" {
		return []string{one}
	}
	var many []string
	_ = json.Unmarshal(e.To, &many)
	return many
}

func (e resendEmail) ref() string {
	for _, t := range e.Tags {
		if t.Name == ResendRefTag {
			return t.Value
		}
	}
	return ""
}

// newUUID is a random (version 4) UUID, the form of Resend's email ids.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// waitOrAbort waits d (forever when d < 0) in a provider fake's handler; if the client goes away or the
// fake closes first, the handler is aborted with http.ErrAbortHandler (the client sees no answer).
func waitOrAbort(r *http.Request, done <-chan struct{}, d time.Duration) {
	var expired <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-expired:
	case <-r.Context().Done():
		panic(http.ErrAbortHandler)
	case <-done:
		panic(http.ErrAbortHandler)
	}
}
