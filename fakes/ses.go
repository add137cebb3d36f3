package fakes

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// SES is a fake of Amazon SES API v2's SendEmail, built from its documentation
// (https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_SendEmail.html, .../CommonErrors.html):
//
//	POST /v2/email/outbound-emails   SigV4 (service "ses", the fake's region, its one access key)
//	     {"FromEmailAddress","Destination":{"ToAddresses":[...]},"Content":{"Simple":{...}},"EmailTags":[{"Name","Value"}],...}
//	     -> 200 {"MessageId":"0100018c..."}
//
// Errors are SES's REST-JSON errors: X-Amzn-ErrorType names the error and the body is
// {"message":"..."}: a missing or wrong signature 403 InvalidSignatureException, an unknown access key
// 403 UnrecognizedClientException, a From that is not a verified identity 400 MessageRejected, no
// recipient 400 BadRequestException, a ConfigurationSetName the fake was not started with 404
// NotFoundException (SendEmail's errors), a message tag whose name or value is empty, longer than 256
// characters or has a character other than ASCII letters, digits, _ and - 400 BadRequestException
// (https://docs.aws.amazon.com/ses/latest/APIReference-V2/API_MessageTag.html), sending paused
// (PauseSending) 400 SendingPausedException. SES has no idempotency key: every accepted request is a
// new email.
//
// Scriptable like the channel fakes, per ref (the message tag notifier_ref): a Status is answered with
// SES's error for it before anything is recorded; Delay, Hang, Malformed and Drop come after.
type SES struct {
	providerServer

	region, keyID, secret string

	mu       sync.Mutex
	sendQ    queues
	verified map[string]bool
	confSets map[string]bool
	paused   bool
	requests int
	sends    map[string]int
	outbound map[string]int
	emails   []SESEmail
	named    map[int][2]string // a scripted status's error name and message, instead of the default
}

// SESEmail is one email the fake accepted.
type SESEmail struct {
	Message
	From             string
	Tags             map[string]string
	ConfigurationSet string
}

// SESRefTag is the message tag the fake files emails under (service/ses sets it).
const SESRefTag = "notifier_ref"

// StartSES starts an SES fake on 127.0.0.1 for region, accepting one access key, with from verified
// and the configuration sets configurationSets existing. It panics on failure, like httptest.NewServer.
func StartSES(region, keyID, secret, from string, configurationSets ...string) *SES {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	f := &SES{region: region, keyID: keyID, secret: secret, sendQ: queues{byRef: map[string][]Step{}}, verified: map[string]bool{strings.ToLower(from): true},
		confSets: map[string]bool{}, sends: map[string]int{}, outbound: map[string]int{}}
	for _, name := range configurationSets {
		f.confSets[name] = true
	}
	f.start(l, f.serveHTTP)
	return f
}

// ScriptSend appends steps consumed one per SendEmail for ref ("" is the shared queue).
func (f *SES) ScriptSend(ref string, steps ...Step) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sendQ.push(ref, steps)
}

// NameError makes a scripted Status answer SES's error name with message (say 400
// LimitExceededException instead of the default MessageRejected).
func (f *SES) NameError(status int, name, message string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.named == nil {
		f.named = map[int][2]string{}
	}
	f.named[status] = [2]string{name, message}
}

// PauseSending pauses (or resumes) the account's sending: while paused, SendEmail answers 400
// SendingPausedException.
func (f *SES) PauseSending(paused bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.paused = paused
}

// Requests counts every request received, refused ones included.
func (f *SES) Requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests
}

// Outbound counts the emails accepted for ref.
func (f *SES) Outbound(ref string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.outbound[ref]
}

// Emails lists the emails accepted for ref, in order.
func (f *SES) Emails(ref string) []SESEmail {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []SESEmail
	for _, e := range f.emails {
		if e.Ref == ref {
			out = append(out, e)
		}
	}
	return out
}

func sesError(w http.ResponseWriter, status int, name, message string) {
	w.Header().Set("X-Amzn-ErrorType", name)
	w.Header().Set("X-Amzn-Requestid", newRequestID())
	writeJSON(w, status, map[string]string{"message": message})
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// sesScripted answers a scripted status with the error SES documents for it, or the one NameError gave.
func sesScripted(w http.ResponseWriter, step Step, named map[int][2]string) {
	name, message := "InternalFailure", "The request processing has failed because of an unknown error."
	switch step.Status {
	case http.StatusBadRequest:
		name, message = "MessageRejected", "Email address is not verified."
	case http.StatusForbidden:
		name, message = "AccessDeniedException", "User is not authorized to perform: ses:SendEmail"
	case http.StatusTooManyRequests:
		name, message = "TooManyRequestsException", "Maximum sending rate exceeded."
	case http.StatusServiceUnavailable:
		name, message = "ServiceUnavailable", "The request has failed due to a temporary failure of the server."
	}
	if n, ok := named[step.Status]; ok {
		name, message = n[0], n[1]
	}
	if step.RetryAfter != "" {
		w.Header().Set("Retry-After", step.RetryAfter)
	}
	sesError(w, step.Status, name, message)
}

// verify checks the request's SigV4 signature by signing it again with the fake's key.
func (f *SES) verify(r *http.Request, body []byte) (int, string, string) {
	auth := r.Header.Get("Authorization")
	rest, ok := strings.CutPrefix(auth, "AWS4-HMAC-SHA256 ")
	if !ok {
		return http.StatusForbidden, "MissingAuthenticationTokenException", "Missing Authentication Token"
	}
	fields := map[string]string{}
	for _, part := range strings.Split(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		fields[k] = v
	}
	scope := strings.Split(fields["Credential"], "/")
	if len(scope) != 5 || scope[4] != "aws4_request" {
		return http.StatusForbidden, "IncompleteSignatureException", "Credential is not a SigV4 credential scope"
	}
	if scope[0] != f.keyID {
		return http.StatusForbidden, "UnrecognizedClientException", "The security token included in the request is invalid."
	}
	if scope[2] != f.region || scope[3] != "ses" {
		return http.StatusForbidden, "InvalidSignatureException", "Credential should be scoped to a valid region and service ses."
	}
	at, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil || time.Since(at).Abs() > 5*time.Minute {
		return http.StatusForbidden, "InvalidSignatureException", "Signature expired or X-Amz-Date missing."
	}
	sum := sha256.Sum256(body)
	payload := hex.EncodeToString(sum[:])
	again, _ := http.NewRequest(r.Method, "http://"+r.Host+r.URL.RequestURI(), bytes.NewReader(body))
	for _, h := range strings.Split(fields["SignedHeaders"], ";") {
		if h != "host" && h != "x-amz-date" {
			again.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	creds := aws.Credentials{AccessKeyID: f.keyID, SecretAccessKey: f.secret, SessionToken: r.Header.Get("X-Amz-Security-Token")}
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, again, payload, "ses", f.region, at); err != nil {
		return http.StatusForbidden, "InvalidSignatureException", "cannot sign: " + err.Error()
	}
	if want := again.Header.Get("Authorization"); want != auth {
		return http.StatusForbidden, "InvalidSignatureException",
			"The request signature we calculated does not match the signature you provided."
	}
	return 0, "", ""
}

type sesRequest struct {
	ConfigurationSetName string `json:"ConfigurationSetName"`
	FromEmailAddress     string `json:"FromEmailAddress"`
	Destination          struct {
		ToAddresses []string `json:"ToAddresses"`
	} `json:"Destination"`
	Content struct {
		Simple *struct {
			Body struct {
				Text *struct {
					Data string `json:"Data"`
				} `json:"Text"`
			} `json:"Body"`
		} `json:"Simple"`
	} `json:"Content"`
	EmailTags []struct {
		Name  string `json:"Name"`
		Value string `json:"Value"`
	} `json:"EmailTags"`
}

func (f *SES) serveHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests++
	f.mu.Unlock()
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		sesError(w, http.StatusBadRequest, "BadRequestException", "cannot read the body")
		return
	}
	if status, name, msg := f.verify(r, body); status != 0 {
		sesError(w, status, name, msg)
		return
	}
	if r.URL.Path != "/v2/email/outbound-emails" || r.Method != http.MethodPost {
		sesError(w, http.StatusNotFound, "NotFoundException", "unknown operation "+r.Method+" "+r.URL.Path)
		return
	}
	var req sesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		sesError(w, http.StatusBadRequest, "BadRequestException", "the body is not JSON")
		return
	}
	if len(req.Destination.ToAddresses) == 0 || req.Content.Simple == nil {
		sesError(w, http.StatusBadRequest, "BadRequestException", "Destination and Content are required")
		return
	}
	tags := map[string]string{}
	for _, t := range req.EmailTags {
		if !validTagPart(t.Name) || !validTagPart(t.Value) {
			sesError(w, http.StatusBadRequest, "BadRequestException",
				"Invalid message tag: a name and a value of 1 to 256 ASCII letters, digits, '_' or '-' are required.")
			return
		}
		tags[t.Name] = t.Value
	}
	ref := tags[SESRefTag]
	f.mu.Lock()
	f.sends[ref]++
	step := f.sendQ.pop(ref)
	if step.Status != 0 {
		named := f.named
		f.mu.Unlock()
		sesScripted(w, step, named)
		return
	}
	if req.ConfigurationSetName != "" && !f.confSets[req.ConfigurationSetName] {
		f.mu.Unlock()
		sesError(w, http.StatusNotFound, "NotFoundException", "Configuration set <"+req.ConfigurationSetName+"> does not exist.")
		return
	}
	if f.paused {
		f.mu.Unlock()
		sesError(w, http.StatusBadRequest, "SendingPausedException", "Sending is paused for this account.")
		return
	}
	if !f.verified[strings.ToLower(req.FromEmailAddress)] {
		f.mu.Unlock()
		sesError(w, http.StatusBadRequest, "MessageRejected", "Email address is not verified. The following identities failed the check in region "+strings.ToUpper(f.region)+": "+req.FromEmailAddress)
		return
	}
	id := fmt.Sprintf("0100%012x-%s-000000", time.Now().UnixMilli(), newRequestID())
	text := ""
	if req.Content.Simple.Body.Text != nil {
		text = req.Content.Simple.Body.Text.Data
	}
	f.outbound[ref]++
	f.emails = append(f.emails, SESEmail{Message: Message{ID: id, Ref: ref, To: req.Destination.ToAddresses[0], Body: text},
		From: req.FromEmailAddress, Tags: tags, ConfigurationSet: req.ConfigurationSetName})
	f.mu.Unlock()
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
	out, _ := json.Marshal(map[string]string{"MessageId": id})
	if step.Malformed {
		out = out[:len(out)/2]
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Amzn-Requestid", newRequestID())
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

// validTagPart is a message tag's name or value as SES accepts it: 1 to 256 ASCII letters, digits,
// underscores or dashes.
func validTagPart(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}
