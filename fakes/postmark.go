package fakes

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Postmark is a fake of Postmark's email API, built from its documentation
// (https://postmarkapp.com/developer/api/email-api, .../api/messages-api, .../api/overview):
//
//	POST /email              X-Postmark-Server-Token: <token>
//	                         {"From","To","Subject","TextBody","Metadata":{...},"MessageStream"}
//	                         -> 200 {"To","SubmittedAt","MessageID":"<uuid>","ErrorCode":0,"Message":"OK"}
//	GET  /messages/outbound  ?count=N&offset=M (both required, count at most 500)[&metadata_<key>=<value>][&messagestream=]
//	                         -> 200 {"TotalCount":N,"Messages":[{"MessageID","Status":"Sent","Metadata",...}]}
//
// Errors are Postmark's {"ErrorCode":N,"Message":"..."}: a missing or wrong token 401 ErrorCode 10, a
// body that is not JSON 422 ErrorCode 402, no From or To 422 ErrorCode 300, a recipient marked
// inactive (SetInactive) 422 ErrorCode 406, a search without count and offset 422. Postmark has no
// idempotency key: every accepted request is a new email. The search lags: an email is found only
// SetSearchLag after it was accepted (Postmark publishes no bound on the lag). It forgets: an email is
// no longer found once the account's retention (SetRetention; Postmark's default, 45 days) has passed
// since it was accepted
// (https://postmarkapp.com/support/article/1289-how-does-the-retention-add-on-work). Both are measured
// on the fake's clock (SetClock).
//
// Scriptable like the channel fakes, per ref (the metadata field notifier_ref): ScriptSend and
// ScriptQuery take Steps; a Status is answered with Postmark's error for it before anything is
// recorded; Delay, Hang, Malformed and Drop come after.
type Postmark struct {
	providerServer

	token string

	mu        sync.Mutex
	sendQ     queues
	queryQ    queues
	requests  int
	sends     map[string]int
	queries   map[string]int
	outbound  map[string]int
	emails    []postmarkEmail
	inactive  map[string]bool
	lag       time.Duration
	retention time.Duration
	now       func() time.Time
}

// PostmarkDefaultRetention is how long Postmark keeps messages unless the account's Retention Add-on
// says otherwise (7 to 365 days).
const PostmarkDefaultRetention = 45 * 24 * time.Hour

type postmarkEmail struct {
	Message
	metadata map[string]string
	stream   string
	at       time.Time
}

// PostmarkRefMetadata is the metadata field the fake files emails under (service/postmark sets it).
const PostmarkRefMetadata = "notifier_ref"

// StartPostmark starts a Postmark fake on 127.0.0.1 with a free port that accepts token. It panics
// on failure, like httptest.NewServer.
func StartPostmark(token string) *Postmark {
	f, err := StartPostmarkOn(token, "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	return f
}

// StartPostmarkOn starts a Postmark fake on addr.
func StartPostmarkOn(token, addr string) (*Postmark, error) {
	if token == "" {
		return nil, fmt.Errorf("fakes: postmark: a server token to accept is required")
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fakes: listen %s: %w", addr, err)
	}
	f := &Postmark{token: token, sendQ: queues{byRef: map[string][]Step{}}, queryQ: queues{byRef: map[string][]Step{}},
		sends: map[string]int{}, queries: map[string]int{}, outbound: map[string]int{}, inactive: map[string]bool{},
		retention: PostmarkDefaultRetention, now: time.Now}
	f.start(l, f.serveHTTP)
	return f, nil
}

// ScriptSend appends steps consumed one per POST /email for ref ("" is the shared queue).
func (f *Postmark) ScriptSend(ref string, steps ...Step) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sendQ.push(ref, steps)
}

// ScriptQuery appends steps consumed one per search for ref.
func (f *Postmark) ScriptQuery(ref string, steps ...Step) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queryQ.push(ref, steps)
}

// SetInactive marks a recipient inactive (bounced, complained, suppressed): sends to it are 406.
func (f *Postmark) SetInactive(address string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inactive[strings.ToLower(address)] = true
}

// SetSearchLag makes the search see an email only this long after it was accepted.
func (f *Postmark) SetSearchLag(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lag = d
}

// SetRetention sets the account's retention: the search no longer finds an email this long after it
// was accepted.
func (f *Postmark) SetRetention(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.retention = d
}

// SetClock replaces the clock the fake stamps acceptances and ages the search's lag and retention by
// (time.Now by default), so a test can reach days without waiting for them.
func (f *Postmark) SetClock(now func() time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = now
}

// Requests counts every request received (sends and searches, refused ones included).
func (f *Postmark) Requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests
}

// Sends counts the authenticated POST /email for ref, whatever their outcome.
func (f *Postmark) Sends(ref string) int { return f.count(f.sends, ref) }

// Queries counts the authenticated searches for ref.
func (f *Postmark) Queries(ref string) int { return f.count(f.queries, ref) }

// Outbound counts the emails accepted for ref: what the user would receive.
func (f *Postmark) Outbound(ref string) int { return f.count(f.outbound, ref) }

// Messages lists the emails accepted for ref, in order.
func (f *Postmark) Messages(ref string) []Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Message
	for _, e := range f.emails {
		if e.Ref == ref {
			out = append(out, e.Message)
		}
	}
	return out
}

func (f *Postmark) count(m map[string]int, ref string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return m[ref]
}

// PostmarkError is Postmark's error body.
type PostmarkError struct {
	ErrorCode int    `json:"ErrorCode"`
	Message   string `json:"Message"`
}

func postmarkError(w http.ResponseWriter, status, code int, message string) {
	writeJSON(w, status, PostmarkError{ErrorCode: code, Message: message})
}

// postmarkScripted answers a scripted status with the error Postmark documents for it.
func postmarkScripted(w http.ResponseWriter, step Step) {
	code, message := 0, "Internal server error."
	switch step.Status {
	case http.StatusUnauthorized:
		code, message = 10, "Bad or missing Server API token."
	case http.StatusUnprocessableEntity:
		code, message = 300, "Invalid email request."
	case http.StatusTooManyRequests:
		code, message = 429, "Rate limit exceeded."
	case http.StatusServiceUnavailable:
		message = "Service unavailable."
	}
	if step.RetryAfter != "" {
		w.Header().Set("Retry-After", step.RetryAfter)
	}
	postmarkError(w, step.Status, code, message)
}

func (f *Postmark) serveHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests++
	f.mu.Unlock()
	if r.Header.Get("X-Postmark-Server-Token") != f.token { // the header name is case-insensitive
		postmarkError(w, http.StatusUnauthorized, 10, "Bad or missing Server API token.")
		return
	}
	switch {
	case r.URL.Path == "/email" && r.Method == http.MethodPost:
		f.send(w, r)
	case r.URL.Path == "/messages/outbound" && r.Method == http.MethodGet:
		f.search(w, r)
	default:
		postmarkError(w, http.StatusNotFound, 0, "Entity doesn't exist.")
	}
}

type postmarkRequest struct {
	From          string            `json:"From"`
	To            string            `json:"To"`
	Subject       string            `json:"Subject"`
	TextBody      string            `json:"TextBody"`
	HTMLBody      string            `json:"HtmlBody"`
	Metadata      map[string]string `json:"Metadata"`
	MessageStream string            `json:"MessageStream"`
}

func (f *Postmark) send(w http.ResponseWriter, r *http.Request) {
	var req postmarkRequest
	if _, err := decodeJSON(w, r, &req, false); err != nil {
		postmarkError(w, http.StatusUnprocessableEntity, 402, "Received invalid JSON input.")
		return
	}
	if req.From == "" || req.To == "" || (req.TextBody == "" && req.HTMLBody == "") {
		postmarkError(w, http.StatusUnprocessableEntity, 300, "Invalid email request: From, To and a body are required.")
		return
	}
	ref := req.Metadata[PostmarkRefMetadata]
	f.mu.Lock()
	f.sends[ref]++
	step := f.sendQ.pop(ref)
	if step.Status != 0 {
		f.mu.Unlock()
		postmarkScripted(w, step)
		return
	}
	if f.inactive[strings.ToLower(req.To)] {
		f.mu.Unlock()
		postmarkError(w, http.StatusUnprocessableEntity, 406, "You tried to send to recipient(s) that have been marked as inactive.")
		return
	}
	stream := req.MessageStream
	if stream == "" {
		stream = "outbound"
	}
	id := newUUID()
	now := f.now()
	f.outbound[ref]++
	f.emails = append(f.emails, postmarkEmail{Message: Message{ID: id, Ref: ref, To: req.To, Body: req.TextBody},
		metadata: req.Metadata, stream: stream, at: now})
	f.mu.Unlock()
	f.answer(w, r, step, map[string]any{"To": req.To, "SubmittedAt": now.UTC().Format(time.RFC3339Nano),
		"MessageID": id, "ErrorCode": 0, "Message": "OK"})
}

func (f *Postmark) search(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	count, errC := strconv.Atoi(q.Get("count"))
	offset, errO := strconv.Atoi(q.Get("offset"))
	if errC != nil || errO != nil || count < 1 || count > 500 || offset < 0 {
		postmarkError(w, http.StatusUnprocessableEntity, 300, "count (1 to 500) and offset are required.")
		return
	}
	var key, value string
	for k, v := range q {
		if name, ok := strings.CutPrefix(k, "metadata_"); ok && len(v) > 0 {
			key, value = name, v[0]
		}
	}
	ref := ""
	if key == PostmarkRefMetadata {
		ref = value
	}
	f.mu.Lock()
	f.queries[ref]++
	step := f.queryQ.pop(ref)
	if step.Status != 0 {
		f.mu.Unlock()
		postmarkScripted(w, step)
		return
	}
	type found struct {
		MessageID     string            `json:"MessageID"`
		To            []map[string]any  `json:"To"`
		Recipients    []string          `json:"Recipients"`
		ReceivedAt    string            `json:"ReceivedAt"`
		Status        string            `json:"Status"`
		Metadata      map[string]string `json:"Metadata"`
		MessageStream string            `json:"MessageStream"`
	}
	var hits []found
	now := f.now()
	visible, kept := now.Add(-f.lag), now.Add(-f.retention)
	for i := len(f.emails) - 1; i >= 0; i-- { // newest first, as Postmark lists them
		e := f.emails[i]
		if e.at.After(visible) || !e.at.After(kept) { // not searchable yet, or expired
			continue
		}
		if (key != "" && e.metadata[key] != value) || (q.Has("messagestream") && q.Get("messagestream") != e.stream) {
			continue
		}
		hits = append(hits, found{MessageID: e.ID, To: []map[string]any{{"Email": e.To, "Name": nil}}, Recipients: []string{e.To},
			ReceivedAt: e.at.UTC().Format(time.RFC3339Nano), Status: "Sent", Metadata: e.metadata, MessageStream: e.stream})
	}
	f.mu.Unlock()
	total := len(hits)
	hits = hits[min(offset, total):min(offset+count, total)]
	if hits == nil {
		hits = []found{}
	}
	f.answer(w, r, step, map[string]any{"TotalCount": total, "Messages": hits})
}

// answer writes a 200 as the step scripts it (after anything was recorded).
func (f *Postmark) answer(w http.ResponseWriter, r *http.Request, step Step, reply any) {
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
	body, _ := json.Marshal(reply)
	if step.Malformed {
		body = body[:len(body)/2]
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}
