package fakes

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Twilio is a fake of Twilio's Messaging API, built from its documentation
// (https://www.twilio.com/docs/messaging/api/message-resource, https://www.twilio.com/docs/usage/twilios-response):
//
//	POST /2010-04-01/Accounts/{AccountSid}/Messages.json   Basic auth (account SID + auth token, or an
//	     API key SID + secret); form To, Body, From or MessagingServiceSid, StatusCallback, ValidityPeriod
//	     -> 201 {"sid":"SM<32 hex>","account_sid":...,"to":...,"status":"queued"|"accepted",...}
//
// Errors are Twilio's {"code":N,"message":"...","more_info":"https://www.twilio.com/docs/errors/N","status":S}:
// bad credentials 401 code 20003, another account's path 404 20404, no To 400 21604, To not E.164 400
// 21211, no Body 400 21602, no sender 400 21603, a recipient that replied STOP (SetUnsubscribed) 400
// 21610, a ValidityPeriod outside 1..36000 400 21624, a From that is not one of the account's numbers
// (SetOwnedNumbers) 400 21606, an account that is not active (Suspend) 401 20005. Twilio has no
// idempotency key: every accepted request is a new SMS.
//
// Callback builds the status callback Twilio posts to a message's StatusCallback, signed with the
// auth token as Twilio signs it (TwilioSignature).
//
// Scriptable like the channel fakes, per ref (the ref= of StatusCallback): a Status is answered with
// Twilio's error for it before anything is recorded; Delay, Hang, Malformed and Drop come after.
type Twilio struct {
	providerServer

	account string
	creds   map[string]string // username -> password

	mu           sync.Mutex
	sendQ        queues
	requests     int
	sends        map[string]int
	outbound     map[string]int
	messages     []TwilioMessage
	unsubscribed map[string]bool
	owned        map[string]bool // nil: any From is accepted
	suspended    bool
}

// TwilioMessage is one SMS the fake queued.
type TwilioMessage struct {
	Message
	From           string
	StatusCallback string
	ValidityPeriod string
}

var e164 = regexp.MustCompile(`^\+[1-9][0-9]{6,14}$`)

// StartTwilio starts a Twilio fake on 127.0.0.1 for account (AC...) with its auth token. It panics on
// failure, like httptest.NewServer.
func StartTwilio(account, authToken string) *Twilio {
	f, err := StartTwilioOn(account, authToken, "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	return f
}

// StartTwilioOn starts a Twilio fake on addr.
func StartTwilioOn(account, authToken, addr string) (*Twilio, error) {
	if account == "" || authToken == "" {
		return nil, fmt.Errorf("fakes: twilio: an account SID and auth token to accept are required")
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fakes: listen %s: %w", addr, err)
	}
	f := &Twilio{account: account, creds: map[string]string{account: authToken}, sendQ: queues{byRef: map[string][]Step{}},
		sends: map[string]int{}, outbound: map[string]int{}, unsubscribed: map[string]bool{}}
	f.start(l, f.serveHTTP)
	return f, nil
}

// AddAPIKey lets an API key (SK...) of the account authenticate with its secret.
func (f *Twilio) AddAPIKey(sid, secret string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.creds[sid] = secret
}

// ScriptSend appends steps consumed one per Create Message for ref ("" is the shared queue).
func (f *Twilio) ScriptSend(ref string, steps ...Step) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sendQ.push(ref, steps)
}

// SetUnsubscribed marks a number as having replied STOP: messages to it are refused with 21610.
func (f *Twilio) SetUnsubscribed(number string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unsubscribed[number] = true
}

// SetOwnedNumbers makes the fake refuse, with 21606, a From that is not one of numbers (until then
// any From is the account's).
func (f *Twilio) SetOwnedNumbers(numbers ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.owned = map[string]bool{}
	for _, n := range numbers {
		f.owned[n] = true
	}
}

// Suspend makes the account inactive (suspended) or active again: while inactive, every authenticated
// request is refused with error 20005 "Account not active" (https://www.twilio.com/docs/api/errors/20005;
// Twilio's page names no HTTP status, the fake answers 401).
func (f *Twilio) Suspend(suspended bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.suspended = suspended
}

// Requests counts every request received, refused ones included.
func (f *Twilio) Requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests
}

// Sends counts the authenticated Create Message requests for ref, whatever their outcome.
func (f *Twilio) Sends(ref string) int { return f.count(f.sends, ref) }

// Outbound counts the SMS queued for ref: what the user would receive.
func (f *Twilio) Outbound(ref string) int { return f.count(f.outbound, ref) }

// Messages lists the SMS queued for ref, in order.
func (f *Twilio) Messages(ref string) []TwilioMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []TwilioMessage
	for _, m := range f.messages {
		if m.Ref == ref {
			out = append(out, m)
		}
	}
	return out
}

func (f *Twilio) count(m map[string]int, ref string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return m[ref]
}

// TwilioError is Twilio's error body.
type TwilioError struct {
	Code     int    `json:"code"`
	Message  string `json:"message"`
	MoreInfo string `json:"more_info"`
	Status   int    `json:"status"`
}

func twilioError(w http.ResponseWriter, status, code int, message string) {
	writeJSON(w, status, TwilioError{Code: code, Message: message, Status: status,
		MoreInfo: fmt.Sprintf("https://www.twilio.com/docs/errors/%d", code)})
}

// twilioScripted answers a scripted status with the error Twilio documents for it.
func twilioScripted(w http.ResponseWriter, step Step) {
	code, message := 20500, "Internal Server Error"
	switch step.Status {
	case http.StatusBadRequest:
		code, message = 21211, "Invalid 'To' Phone Number"
	case http.StatusUnauthorized:
		code, message = 20003, "Authenticate"
	case http.StatusNotFound:
		code, message = 20404, "The requested resource was not found"
	case http.StatusTooManyRequests:
		code, message = 20429, "Too Many Requests"
	case http.StatusServiceUnavailable:
		code, message = 20503, "Service Unavailable"
	}
	if step.RetryAfter != "" {
		w.Header().Set("Retry-After", step.RetryAfter)
	}
	twilioError(w, step.Status, code, message)
}

func (f *Twilio) serveHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests++
	user, pass, ok := r.BasicAuth()
	authed := ok && f.creds[user] != "" && f.creds[user] == pass
	suspended := f.suspended
	f.mu.Unlock()
	if !authed {
		w.Header().Set("WWW-Authenticate", `Basic realm="Twilio API"`)
		twilioError(w, http.StatusUnauthorized, 20003, "Authenticate")
		return
	}
	if suspended {
		twilioError(w, http.StatusUnauthorized, 20005, "Account not active")
		return
	}
	account, ok := strings.CutPrefix(r.URL.Path, "/2010-04-01/Accounts/")
	account, okSuffix := strings.CutSuffix(account, "/Messages.json")
	switch {
	case !ok || !okSuffix:
		twilioError(w, http.StatusNotFound, 20404, "The requested resource "+r.URL.Path+" was not found")
	case account != f.account:
		twilioError(w, http.StatusNotFound, 20404, "The requested resource "+r.URL.Path+" was not found")
	case r.Method != http.MethodPost:
		twilioError(w, http.StatusMethodNotAllowed, 20004, "Method not allowed")
	default:
		f.create(w, r)
	}
}

func (f *Twilio) create(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	form, perr := url.ParseQuery(string(body))
	if err != nil || perr != nil || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		twilioError(w, http.StatusBadRequest, 20001, "Unable to parse the request: want a form-encoded body")
		return
	}
	to, from, service := form.Get("To"), form.Get("From"), form.Get("MessagingServiceSid")
	switch {
	case to == "":
		twilioError(w, http.StatusBadRequest, 21604, "A 'To' phone number is required.")
		return
	case !e164.MatchString(to):
		twilioError(w, http.StatusBadRequest, 21211, "The 'To' number "+to+" is not a valid phone number.")
		return
	case from == "" && service == "":
		twilioError(w, http.StatusBadRequest, 21603, "A 'From' phone number is required.")
		return
	case form.Get("Body") == "":
		twilioError(w, http.StatusBadRequest, 21602, "Message body is required.")
		return
	}
	if v := form.Get("ValidityPeriod"); v != "" {
		var n int
		if _, err := fmt.Sscanf(v, "%d", &n); err != nil || n < 1 || n > 36000 {
			twilioError(w, http.StatusBadRequest, 21624, "Invalid validity period value")
			return
		}
	}
	var ref string
	if cb := form.Get("StatusCallback"); cb != "" {
		u, err := url.Parse(cb)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
			twilioError(w, http.StatusBadRequest, 21609, "Invalid StatusCallback URL")
			return
		}
		ref = u.Query().Get("ref")
	}
	f.mu.Lock()
	f.sends[ref]++
	step := f.sendQ.pop(ref)
	if step.Status != 0 {
		f.mu.Unlock()
		twilioScripted(w, step)
		return
	}
	if f.unsubscribed[to] {
		f.mu.Unlock()
		twilioError(w, http.StatusBadRequest, 21610, "Attempt to send to unsubscribed recipient")
		return
	}
	if from != "" && f.owned != nil && !f.owned[from] {
		f.mu.Unlock()
		twilioError(w, http.StatusBadRequest, 21606, "The From phone number "+from+" is not a valid, message-capable Twilio phone number for this account.")
		return
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	sid := "SM" + hex.EncodeToString(b[:])
	status := "queued"
	if service != "" {
		status = "accepted" // a messaging service picks the sender first
	}
	f.outbound[ref]++
	f.messages = append(f.messages, TwilioMessage{Message: Message{ID: sid, Ref: ref, To: to, Body: form.Get("Body")},
		From: from, StatusCallback: form.Get("StatusCallback"), ValidityPeriod: form.Get("ValidityPeriod")})
	f.mu.Unlock()
	now := time.Now().UTC().Format(http.TimeFormat)
	reply := map[string]any{"sid": sid, "account_sid": f.account, "to": to, "from": nilIfEmpty(from),
		"messaging_service_sid": nilIfEmpty(service), "body": form.Get("Body"), "status": status,
		"num_segments": "1", "direction": "outbound-api", "api_version": "2010-04-01",
		"date_created": now, "date_updated": now, "date_sent": nil, "error_code": nil, "error_message": nil,
		"price": nil, "uri": "/2010-04-01/Accounts/" + f.account + "/Messages/" + sid + ".json"}
	if step.Delay > 0 {
		providerWait(r, f.done, step.Delay)
	}
	if step.Hang {
		providerWait(r, f.done, -1)
	}
	if step.Drop {
		Drop(w, r)
		return
	}
	out, _ := json.Marshal(reply)
	if step.Malformed {
		out = out[:len(out)/2]
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(out)
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// providerWait waits d (forever when d < 0); if the client goes away or the fake closes first, the
// handler is aborted with http.ErrAbortHandler (the client sees no answer).
func providerWait(r *http.Request, done <-chan struct{}, d time.Duration) {
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

// Callback is the status callback Twilio posts for the message sid (one the fake queued) with
// MessageStatus status: to the message's StatusCallback, form-encoded, signed with the account's auth
// token. extra adds parameters, repeated names included.
func (f *Twilio) Callback(sid, status string, extra url.Values) (*http.Request, error) {
	f.mu.Lock()
	var msg *TwilioMessage
	for i := range f.messages {
		if f.messages[i].ID == sid {
			msg = &f.messages[i]
		}
	}
	token := f.creds[f.account]
	f.mu.Unlock()
	if msg == nil || msg.StatusCallback == "" {
		return nil, fmt.Errorf("fakes: twilio: no message %s with a StatusCallback", sid)
	}
	form := url.Values{"MessageSid": {sid}, "SmsSid": {sid}, "MessageStatus": {status}, "SmsStatus": {status},
		"AccountSid": {f.account}, "To": {msg.To}, "ApiVersion": {"2010-04-01"}}
	if msg.From != "" {
		form.Set("From", msg.From)
	}
	for name, values := range extra {
		form[name] = append(form[name], values...)
	}
	req, err := http.NewRequest(http.MethodPost, msg.StatusCallback, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Twilio-Signature", TwilioSignature(token, msg.StatusCallback, form))
	return req, nil
}

// TwilioSignature is X-Twilio-Signature as Twilio computes it
// (https://www.twilio.com/docs/usage/webhooks/webhooks-security): base64 of HMAC-SHA1, keyed with the
// auth token, over the full URL followed by the POST parameters sorted by name, each as name+value
// without delimiters. A name given several times contributes each of its distinct values, sorted: the
// rule of Twilio's own validators (twilio-node's toFormUrlEncodedParam,
// https://github.com/twilio/twilio-node/blob/main/src/webhooks/webhooks.ts; twilio-python's
// compute_signature), which the webhooks-security page asks receivers to use. Written apart from
// service/receipts' verifier on purpose: the fake must not share the code it checks.
func TwilioSignature(authToken, fullURL string, form url.Values) string {
	names := make([]string, 0, len(form))
	for name := range form {
		names = append(names, name)
	}
	slices.Sort(names)
	data := fullURL
	for _, name := range names {
		values := slices.Clone(form[name])
		slices.Sort(values)
		for _, v := range slices.Compact(values) {
			data += name + v
		}
	}
	mac := hmac.New(sha1.New, []byte(authToken))
	mac.Write([]byte(data))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}
