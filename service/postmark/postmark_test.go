package postmark_test

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
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/postmark"
)

const token = "pm-server-token-7c1e9a"

const ref = "5f0e7c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b"

func client(t *testing.T, base string) *postmark.Client {
	t.Helper()
	c, err := postmark.New(postmark.Options{ServerToken: token, From: "Shop <noreply@example.com>", BaseURL: base})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func message() delivery.Message {
	return delivery.Message{Ref: ref, IdempotencyKey: delivery.IdempotencyKey(ref), To: "ada@example.com",
		Body: "Your order shipped", Action: delivery.ActionSend}
}

func send(c *postmark.Client, timeout time.Duration) delivery.Observation {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Send(ctx, message())
}

func query(c *postmark.Client) delivery.Observation {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Query(ctx, ref)
}

func TestPostmarkAcceptedAndFound(t *testing.T) {
	is := is.New(t)
	f := fakes.StartPostmark(token)
	defer f.Close()
	c := client(t, f.URL())
	is.Equal(query(c).Outcome, delivery.OutcomeQueryNotFound) // nothing sent yet
	obs := send(c, 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccepted) // accepted
	msgs := f.Messages(ref)
	is.Equal(len(msgs), 1)                  // one email, filed under the ref's metadata
	is.Equal(obs.ProviderMsgID, msgs[0].ID) // Postmark's MessageID
	found := query(c)
	is.Equal(found.Outcome, delivery.OutcomeQueryFound) // the search finds it by metadata
	is.Equal(found.ProviderMsgID, msgs[0].ID)
	is.Equal(f.Queries(ref), 2)
}

// The search lags: an email accepted a moment ago is not found yet (the contract's query_settle).
func TestPostmarkSearchLags(t *testing.T) {
	is := is.New(t)
	f := fakes.StartPostmark(token)
	defer f.Close()
	f.SetSearchLag(time.Hour)
	c := client(t, f.URL())
	is.Equal(send(c, 5*time.Second).Outcome, delivery.OutcomeAccepted)
	is.Equal(query(c).Outcome, delivery.OutcomeQueryNotFound) // accepted, not searchable yet
}

// On the fake's clock: the search finds an email only once its lag has passed, and no longer once the
// account's retention has.
func TestPostmarkFakeSearchLagsAndForgets(t *testing.T) {
	is := is.New(t)
	f := fakes.StartPostmark(token)
	defer f.Close()
	start := time.Now()
	var offset atomic.Int64 // how far the fake's clock is ahead of start
	f.SetClock(func() time.Time { return start.Add(time.Duration(offset.Load())) })
	f.SetSearchLag(10 * time.Minute)
	f.SetRetention(7 * 24 * time.Hour)
	c := client(t, f.URL())
	is.Equal(send(c, 5*time.Second).Outcome, delivery.OutcomeAccepted)
	offset.Store(int64(10*time.Minute - time.Nanosecond))
	is.Equal(query(c).Outcome, delivery.OutcomeQueryNotFound) // inside the lag
	offset.Store(int64(10 * time.Minute))
	is.Equal(query(c).Outcome, delivery.OutcomeQueryFound) // searchable
	offset.Store(int64(7*24*time.Hour - time.Nanosecond))
	is.Equal(query(c).Outcome, delivery.OutcomeQueryFound) // still kept
	offset.Store(int64(7 * 24 * time.Hour))
	is.Equal(query(c).Outcome, delivery.OutcomeQueryNotFound) // expired: forgotten
	is.Equal(f.Outbound(ref), 1)                              // though it was sent
}

// Postmark has no key: each accepted request is one more email (which is why the mode queries first).
func TestPostmarkLostAnswerThenQuery(t *testing.T) {
	is := is.New(t)
	f := fakes.StartPostmark(token)
	defer f.Close()
	c := client(t, f.URL())
	f.ScriptSend(ref, fakes.Step{Delay: 3 * time.Second})
	is.Equal(send(c, 200*time.Millisecond).Outcome, delivery.OutcomeTimeout) // accepted, answered too late
	is.Equal(query(c).Outcome, delivery.OutcomeQueryFound)                   // the query settles it
	f.ScriptSend(ref, fakes.Step{Drop: true})
	is.Equal(send(c, 5*time.Second).Outcome, delivery.OutcomeIOError) // accepted, connection dropped
	is.Equal(f.Outbound(ref), 2)                                      // no dedupe at Postmark
}

func TestPostmarkDocumentedErrors(t *testing.T) {
	cases := []struct {
		status, code int
		header       http.Header
		want         delivery.Outcome
		unregistered bool
		retryAfter   time.Duration
		detail       string
	}{
		{401, 10, nil, delivery.OutcomeAccountRefused, false, 0, "server_token_env"},
		{401, 0, nil, delivery.OutcomeAccountRefused, false, 0, "refused the server token"},
		{422, 10, nil, delivery.OutcomeAccountRefused, false, 0, "refused the server token"},
		{422, 300, nil, delivery.OutcomeRejected, false, 0, "ErrorCode 300"},
		{422, 406, nil, delivery.OutcomeRejected, true, 0, "inactive"},
		{422, 400, nil, delivery.OutcomeAccountRefused, false, 0, "sender signature"},
		{422, 401, nil, delivery.OutcomeAccountRefused, false, 0, "sender signature"},
		{422, 405, nil, delivery.OutcomeAccountRefused, false, 0, "out of credits"},
		{422, 412, nil, delivery.OutcomeAccountRefused, false, 0, "pending approval"},
		{422, 413, nil, delivery.OutcomeAccountRefused, false, 0, "may not send"},
		{422, 402, nil, delivery.OutcomeRejected, false, 0, "ErrorCode 402"},
		{429, 429, http.Header{"Retry-After": {"4"}}, delivery.OutcomeThrottled, false, 4 * time.Second, "429"},
		{500, 0, nil, delivery.OutcomeHTTP5xx, false, 0, "500"},
		{503, 0, nil, delivery.OutcomeHTTP5xx, false, 0, "503"},
		{504, 0, nil, delivery.OutcomeGatewayError, false, 0, "gateway"},
	}
	for _, tc := range cases {
		t.Run(strconv.Itoa(tc.status)+"-"+strconv.Itoa(tc.code), func(t *testing.T) {
			is := is.New(t)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tc.header {
					w.Header()[k] = v
				}
				w.WriteHeader(tc.status)
				if tc.status != 504 {
					_, _ = w.Write([]byte(`{"ErrorCode":` + strconv.Itoa(tc.code) + `,"Message":"Postmark says no."}`))
				}
			}))
			defer srv.Close()
			obs := send(client(t, srv.URL), 5*time.Second)
			is.Equal(obs.Outcome, tc.want)                   // mapped
			is.Equal(obs.Unregistered, tc.unregistered)      // only an inactive recipient is gone for good
			is.Equal(obs.RetryAfter, tc.retryAfter)          // Retry-After honoured
			is.True(strings.Contains(obs.Detail, tc.detail)) // the detail names it
			is.True(!strings.Contains(obs.Detail, token))    // never the token
			q := client(t, srv.URL).Query(context.Background(), ref)
			is.Equal(q.Outcome, delivery.OutcomeQueryFailed) // a refused search is no answer
		})
	}
}

// The fake's own refusals: another token, an inactive recipient, a failing search.
func TestPostmarkFakeRefusals(t *testing.T) {
	is := is.New(t)
	f := fakes.StartPostmark(token)
	defer f.Close()
	wrong, err := postmark.New(postmark.Options{ServerToken: "not-the-token", From: "noreply@example.com", BaseURL: f.URL()})
	is.NoErr(err)
	obs := send(wrong, 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeAccountRefused) // 401 ErrorCode 10: the server token
	is.True(strings.Contains(obs.Detail, "ErrorCode 10"))
	is.True(!strings.Contains(obs.Detail, "not-the-token"))
	c := client(t, f.URL())
	f.SetInactive("ada@example.com")
	obs = send(c, 5*time.Second)
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // 406
	is.True(obs.Unregistered)                       // the address is gone
	f.ScriptQuery(ref, fakes.Step{Status: 503})
	is.Equal(query(c).Outcome, delivery.OutcomeQueryFailed) // a failing search proves nothing
	is.Equal(f.Outbound(ref), 0)
	is.Equal(f.Requests(), 3)
}

// A dropped kept-alive connection is one request on the wire, not a transparent retry.
func TestPostmarkDropOnKeptAliveConnection(t *testing.T) {
	is := is.New(t)
	f := fakes.StartPostmark(token)
	defer f.Close()
	c := client(t, f.URL())
	is.Equal(query(c).Outcome, delivery.OutcomeQueryNotFound) // the connection stays open
	f.ScriptSend(ref, fakes.Step{Drop: true})
	is.Equal(send(c, 5*time.Second).Outcome, delivery.OutcomeIOError) // uncertain
	is.Equal(f.Requests(), 2)                                         // one request for the attempt
	is.Equal(f.Conns(), 1)                                            // on the kept-alive connection
	f.ScriptQuery(ref, fakes.Step{Drop: true})
	is.Equal(query(c).Outcome, delivery.OutcomeQueryFailed) // a dropped search: no answer
	is.Equal(f.Requests(), 3)                               // once, though a GET is replayable to net/http
}

func TestPostmarkOptions(t *testing.T) {
	is := is.New(t)
	for _, base := range []string{"http://api.postmarkapp.com", "https://u:p@api.example.com", "https://api.example.com/?x=1"} {
		_, err := postmark.New(postmark.Options{ServerToken: token, From: "noreply@example.com", BaseURL: base})
		is.True(err != nil) // refused
		is.True(!strings.Contains(err.Error(), token))
	}
	_, err := postmark.New(postmark.Options{From: "noreply@example.com"})
	is.True(err != nil) // no token
	c, err := postmark.New(postmark.Options{ServerToken: token, From: "noreply@example.com"})
	is.NoErr(err)
	is.Equal(c.String(), "postmark https://api.postmarkapp.com")
}
