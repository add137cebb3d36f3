package resend_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/resend"
)

const apiKey = "re_test_9f8e7d6c5b4a"

const ref = "0b6c1c4e-6f0a-4d0e-9d4b-2f3e8a1b7c55"

func client(t *testing.T, base string) *resend.Client {
	t.Helper()
	c, err := resend.New(resend.Options{APIKey: apiKey, From: "Shop <noreply@example.com>", SubjectPrefix: "[Shop] ", BaseURL: base})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func message() delivery.Message {
	return delivery.Message{Ref: ref, IdempotencyKey: delivery.IdempotencyKey(ref), To: "ada@example.com",
		Body: "Your order shipped\nIt arrives on Monday.", Action: delivery.ActionSend}
}

func send(c *resend.Client, msg delivery.Message, timeout time.Duration) delivery.Observation {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Send(ctx, msg)
}

func TestResendAccepted(t *testing.T) {
	is := is.New(t)
	f := fakes.StartResend(apiKey)
	defer f.Close()
	obs := send(client(t, f.URL()), message(), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccepted) // accepted
	msgs := f.Messages(ref)
	is.Equal(len(msgs), 1)                            // one email, filed under the ref tag
	is.Equal(obs.ProviderMsgID, msgs[0].ID)           // Resend's id is the provider id
	is.Equal(msgs[0].Key, "ntf-"+ref)                 // sent with the task's Idempotency-Key
	is.Equal(msgs[0].To, "ada@example.com")           // to the preference's address
	is.True(strings.Contains(msgs[0].Body, "Monday")) // the body as text
}

// The answer is lost after Resend accepted (a timeout, then a dropped connection); each resend carries
// the same key and Resend sends nothing again.
func TestResendLostAnswersResendWithTheKey(t *testing.T) {
	is := is.New(t)
	f := fakes.StartResend(apiKey)
	defer f.Close()
	c := client(t, f.URL())
	f.ScriptSend(ref, fakes.Step{Delay: 3 * time.Second}, fakes.Step{Drop: true})
	is.Equal(send(c, message(), 200*time.Millisecond).Outcome, delivery.OutcomeTimeout) // accepted, answered too late
	waitIdle(t, f)
	is.Equal(send(c, message(), 5*time.Second).Outcome, delivery.OutcomeIOError) // the replay's connection dropped
	obs := send(c, message(), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccepted) // the original answer
	is.Equal(obs.ProviderMsgID, f.Messages(ref)[0].ID)
	is.Equal(f.Sends(ref), 3)    // three requests
	is.Equal(f.Outbound(ref), 1) // one email
}

// The fake forgets a key 24 hours after its first request, as Resend does: a resend inside them is
// answered with the original email, one at the 24 hours' end is a new email.
func TestResendFakeForgetsKeysAfter24Hours(t *testing.T) {
	is := is.New(t)
	f := fakes.StartResend(apiKey)
	defer f.Close()
	first := time.Now()
	var offset atomic.Int64 // how far the fake's clock is ahead of first
	f.SetClock(func() time.Time { return first.Add(time.Duration(offset.Load())) })
	c := client(t, f.URL())
	obs := send(c, message(), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccepted)
	offset.Store(int64(resend.KeyLifetime - time.Nanosecond))
	replay := send(c, message(), 5*time.Second)
	is.Equal(replay.ProviderMsgID, obs.ProviderMsgID) // still the key's email
	is.Equal(f.Outbound(ref), 1)
	offset.Store(int64(resend.KeyLifetime))
	late := send(c, message(), 5*time.Second)
	is.Equal(late.Outcome, delivery.OutcomeAccepted)
	is.True(late.ProviderMsgID != obs.ProviderMsgID) // the key was forgotten
	is.Equal(f.Outbound(ref), 2)                     // a second email
}

// While the first request with a key is still being answered, Resend answers a second one 409
// concurrent_idempotent_requests: uncertain, tried again later with the key.
func TestResendConcurrentKeyIsInFlight(t *testing.T) {
	is := is.New(t)
	f := fakes.StartResend(apiKey)
	defer f.Close()
	c := client(t, f.URL())
	f.ScriptSend(ref, fakes.Step{Hang: true})
	done := make(chan delivery.Observation)
	go func() { done <- send(c, message(), 10*time.Second) }()
	testworld.Eventually(t, 10*time.Second, "the fake busy with the first request", func() bool { return f.Busy() })
	obs := send(c, message(), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeInFlight)                         // 409 in progress
	is.True(strings.Contains(obs.Detail, "concurrent_idempotent_requests")) // named
	f.Close()                                                               // releases the hang
	is.True((<-done).Outcome != delivery.OutcomeAccepted)                   // the first never heard
}

// Every documented error body maps as the package comment says.
func TestResendDocumentedErrors(t *testing.T) {
	cases := []struct {
		status     int
		name       string
		header     http.Header
		want       delivery.Outcome
		retryAfter time.Duration
		detail     string
	}{
		{400, "invalid_idempotency_key", nil, delivery.OutcomeRejected, 0, "invalid_idempotency_key"},
		{400, "validation_error", nil, delivery.OutcomeRejected, 0, "validation_error"},
		{401, "missing_api_key", nil, delivery.OutcomeAccountRefused, 0, "api_key_env"},
		{401, "restricted_api_key", nil, delivery.OutcomeAccountRefused, 0, "refused the API key"},
		{403, "invalid_api_key", nil, delivery.OutcomeAccountRefused, 0, "refused the API key"},
		{403, "validation_error", nil, delivery.OutcomeAccountRefused, 0, "domain is not verified"},
		{403, "invalid_to_address", nil, delivery.OutcomeAccountRefused, 0, "verify the from address's domain"},
		{403, "", nil, delivery.OutcomeAccountRefused, 0, "refused the API key"},
		{404, "not_found", nil, delivery.OutcomeRejected, 0, "not_found"},
		{405, "method_not_allowed", nil, delivery.OutcomeRejected, 0, "method_not_allowed"},
		{409, "invalid_idempotent_request", nil, delivery.OutcomeRejected, 0, "earlier attempt"},
		{409, "concurrent_idempotent_requests", nil, delivery.OutcomeInFlight, 0, "concurrent"},
		{422, "missing_required_field", nil, delivery.OutcomeRejected, 0, "missing_required_field"},
		{422, "invalid_from_address", nil, delivery.OutcomeRejected, 0, "invalid_from_address"},
		{429, "rate_limit_exceeded", http.Header{"Retry-After": {"3"}}, delivery.OutcomeThrottled, 3 * time.Second, "rate_limit_exceeded"},
		{429, "daily_quota_exceeded", nil, delivery.OutcomeThrottled, time.Hour, "daily_quota_exceeded"},
		{500, "internal_server_error", nil, delivery.OutcomeHTTP5xx, 0, "internal_server_error"},
		{500, "application_error", nil, delivery.OutcomeHTTP5xx, 0, "application_error"},
		{502, "", nil, delivery.OutcomeGatewayError, 0, "gateway"},
	}
	for _, tc := range cases {
		t.Run(tc.name+"-"+http.StatusText(tc.status), func(t *testing.T) {
			is := is.New(t)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tc.header {
					w.Header()[k] = v
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				if tc.name != "" {
					msg := "We found an error."
					if tc.status == 403 && tc.name == "validation_error" {
						msg = "The example.com domain is not verified. Please, add and verify your domain."
					}
					_, _ = w.Write([]byte(`{"statusCode":` + strconv.Itoa(tc.status) + `,"name":"` + tc.name + `","message":"` + msg + `"}`))
				}
			}))
			defer srv.Close()
			obs := send(client(t, srv.URL), message(), 5*time.Second)
			is.Equal(obs.Outcome, tc.want)                   // mapped
			is.Equal(obs.RetryAfter, tc.retryAfter)          // Retry-After honoured
			is.True(strings.Contains(obs.Detail, tc.detail)) // the detail names it
			is.True(!strings.Contains(obs.Detail, apiKey))   // never the key
		})
	}
}

// The fake's own refusals: another key (403 invalid_api_key), and a scripted 429 and 500.
func TestResendFakeRefusals(t *testing.T) {
	is := is.New(t)
	f := fakes.StartResend(apiKey)
	defer f.Close()
	wrong, err := resend.New(resend.Options{APIKey: "re_wrong_key_123", From: "noreply@example.com", BaseURL: f.URL()})
	is.NoErr(err)
	obs := send(wrong, message(), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccountRefused)      // the account's key: an operator fixes it
	is.True(strings.Contains(obs.Detail, "invalid_api_key"))   // named
	is.True(!strings.Contains(obs.Detail, "re_wrong_key_123")) // without the key
	f.ScriptSend(ref, fakes.Step{Status: 429, RetryAfter: "2"}, fakes.Step{Status: 500})
	c := client(t, f.URL())
	obs = send(c, message(), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeThrottled) // 429
	is.Equal(obs.RetryAfter, 2*time.Second)          // its Retry-After
	is.Equal(send(c, message(), 5*time.Second).Outcome, delivery.OutcomeHTTP5xx)
	is.Equal(f.Outbound(ref), 0) // nothing sent
	is.Equal(f.Requests(), 3)    // three requests reached it
}

// A dropped kept-alive connection is one request on the wire, not a transparent retry (the
// Idempotency-Key header makes net/http's transport think it may resend).
func TestResendDropOnKeptAliveConnection(t *testing.T) {
	is := is.New(t)
	f := fakes.StartResend(apiKey)
	defer f.Close()
	c := client(t, f.URL())
	warm := message()
	warm.Ref, warm.IdempotencyKey = "task-1", "ntf-task-1"
	is.Equal(send(c, warm, 5*time.Second).Outcome, delivery.OutcomeAccepted) // the connection stays open
	f.ScriptSend(ref, fakes.Step{Drop: true})
	obs := send(c, message(), 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeIOError) // uncertain
	is.Equal(f.Requests(), 2)                      // one request for the attempt, no resend behind our back
	is.Equal(f.Conns(), 1)                         // on the kept-alive connection
	is.Equal(f.Outbound(ref), 1)                   // Resend has it
}

func TestResendOptions(t *testing.T) {
	is := is.New(t)
	for _, base := range []string{"http://api.resend.com", "ftp://x", "https://user:pw@api.example.com", "https://api.example.com/?q=1"} {
		_, err := resend.New(resend.Options{APIKey: apiKey, From: "noreply@example.com", BaseURL: base})
		is.True(err != nil) // refused: the key must not travel in clear text, nor be misread
		is.True(!strings.Contains(err.Error(), apiKey))
	}
	_, err := resend.New(resend.Options{APIKey: apiKey, From: "not an address"})
	is.True(err != nil) // a bad sender
	_, err = resend.New(resend.Options{From: "noreply@example.com"})
	is.True(err != nil) // no key
	c, err := resend.New(resend.Options{APIKey: apiKey, From: "noreply@example.com"})
	is.NoErr(err)
	is.Equal(c.String(), "resend https://api.resend.com/emails")                      // the default endpoint, no key
	is.Equal(c.Query(context.Background(), ref).Outcome, delivery.OutcomeQueryFailed) // no lookup
}

func waitIdle(t *testing.T, f *fakes.Resend) {
	t.Helper()
	testworld.Eventually(t, 10*time.Second, "the fake done with its requests", func() bool { return !f.Busy() })
}
