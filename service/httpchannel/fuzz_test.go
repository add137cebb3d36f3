package httpchannel

// Fuzz targets for everything a channel can answer. Whatever comes back, the client must not panic,
// must map it to an outcome the service and the delivery_attempt table know, must never call a 2xx a
// refusal (it may have been accepted: R6), and must stay bounded: at most MaxResponseBytes+1 bytes of a
// body are read, ids fit the table, Retry-After is capped.
//
//	go test -run '^$' -fuzz '^FuzzClassifySend$' -fuzztime 5m ./service/httpchannel/
//	go test -run '^$' -fuzz '^FuzzClassifyQuery$' -fuzztime 5m ./service/httpchannel/
//	go test -run '^$' -fuzz '^FuzzSendResponse$' -fuzztime 5m ./service/httpchannel/

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
)

// sendOutcomes are the observations ClassifySend may produce (all accepted by delivery_attempt.outcome).
var sendOutcomes = map[delivery.Outcome]bool{
	delivery.OutcomeAccepted: true, delivery.OutcomeAcceptedReplay: true, delivery.OutcomeMalformed: true,
	delivery.OutcomeInFlight: true, delivery.OutcomeThrottled: true, delivery.OutcomeHTTP5xx: true,
	delivery.OutcomeGatewayError: true, delivery.OutcomeRejected: true, delivery.OutcomeAccountRefused: true,
}

// requirePGText makes checkObservation demand that Detail and ProviderMsgID can be stored in a
// PostgreSQL text column (valid UTF-8 without NUL): a NUL in a channel's answer once failed the whole
// finish transaction of a batch (SQLSTATE 22021). The seeds below keep proving it cannot.
const requirePGText = true

// pgText reports whether s can be stored in a PostgreSQL text column.
func pgText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// checkObservation holds for every observation of a send or a query.
func checkObservation(t *testing.T, obs delivery.Observation, known map[delivery.Outcome]bool) {
	t.Helper()
	if requirePGText && !(pgText(obs.Detail) && pgText(obs.ProviderMsgID)) {
		t.Fatalf("observation %+v cannot be stored in PostgreSQL text", obs)
	}
	if !known[obs.Outcome] {
		t.Fatalf("outcome %q is not one this call may report (%+v)", obs.Outcome, obs)
	}
	if len(obs.ProviderMsgID) > 500 {
		t.Fatalf("provider message id of %d bytes: more than delivery_attempt.provider_msg_id holds", len(obs.ProviderMsgID))
	}
	if obs.RetryAfter < 0 || obs.RetryAfter > MaxRetryAfter {
		t.Fatalf("RetryAfter %s outside [0, %s]", obs.RetryAfter, MaxRetryAfter)
	}
	if len(obs.Detail) > 300 {
		t.Fatalf("detail of %d bytes: a channel's body must not flood last_error", len(obs.Detail))
	}
}

func FuzzClassifySend(f *testing.F) {
	for _, status := range []int{200, 201, 202, 204, 299, 301, 400, 404, 409, 429, 500, 502, 503, 504, 599, 600, 0, -1, 199} {
		f.Add(status, "", []byte(`{"id":"m-1","replayed":false}`))
		f.Add(status, "120", []byte(`{"id":"m-1","replayed":true}`))
	}
	f.Add(200, "", []byte(`{"id":""}`))
	f.Add(200, "", []byte(`{"id":"`+strings.Repeat("x", 500)+`"}`))
	f.Add(200, "", []byte(`{"id":"`+strings.Repeat("x", 501)+`"}`))
	f.Add(200, "", []byte(`{"id":"`+strings.Repeat("é", 300)+`"}`))
	f.Add(200, "", []byte(`{"id":"a\u0000b"}`))
	f.Add(200, "", []byte(`{"id":"\xff\xfe"}`))
	f.Add(200, "", []byte(`{"id":1}`))
	f.Add(200, "", []byte(`{"id":"m","replayed":"yes"}`))
	f.Add(200, "", []byte(`[{"id":"m"}]`))
	f.Add(200, "", []byte(`null`))
	f.Add(200, "", []byte(`{"id":"m"}{"id":"n"}`))
	f.Add(200, "", append([]byte(`{"id":"m"}`), bytes.Repeat([]byte(" "), MaxResponseBytes)...))
	f.Add(202, "", []byte{})
	f.Add(429, "-5", []byte{})
	f.Add(429, "99999999999999999999", []byte{})
	f.Add(503, "9223372036854775807", []byte{})
	f.Add(503, "Wed, 21 Oct 2015 07:28:00 GMT", []byte{})
	f.Add(503, "Fri, 31 Dec 9999 23:59:59 GMT", []byte{})
	f.Add(503, " 30 ", []byte{})
	f.Add(503, "1e3", []byte{})
	f.Add(400, "", bytes.Repeat([]byte("é"), 150))
	f.Add(400, "", []byte("bad\x00request\xff"))

	f.Fuzz(func(t *testing.T, status int, retryAfter string, body []byte) {
		h := http.Header{}
		h.Set("Retry-After", retryAfter)
		obs := ClassifySend(status, h, body)
		checkObservation(t, obs, sendOutcomes)
		if status >= 200 && status < 300 {
			switch obs.Outcome {
			case delivery.OutcomeAccepted, delivery.OutcomeAcceptedReplay, delivery.OutcomeMalformed:
			default: // above all never REJECTED or HTTP_5XX: a 2xx may be an acceptance
				t.Fatalf("HTTP %d classified %s: a 2xx is an acceptance or uncertain", status, obs.Outcome)
			}
		}
		if (obs.Outcome == delivery.OutcomeAccepted || obs.Outcome == delivery.OutcomeAcceptedReplay) != (obs.ProviderMsgID != "") {
			t.Fatalf("%s with provider message id %q: an acceptance always carries one, nothing else does", obs.Outcome, obs.ProviderMsgID)
		}
		if obs.Outcome == delivery.OutcomeAccepted && len(body) > MaxResponseBytes {
			t.Fatalf("accepted a body of %d bytes, more than MaxResponseBytes", len(body))
		}
		if obs.RetryAfter != 0 && obs.Outcome != delivery.OutcomeThrottled && obs.Outcome != delivery.OutcomeHTTP5xx &&
			obs.Outcome != delivery.OutcomeGatewayError {
			t.Fatalf("Retry-After honoured for %s", obs.Outcome)
		}
		if (status == http.StatusBadGateway || status == http.StatusGatewayTimeout) != (obs.Outcome == delivery.OutcomeGatewayError) {
			t.Fatalf("HTTP %d classified %s: GATEWAY_ERROR is exactly a gateway's 502 or 504 here", status, obs.Outcome)
		}
		if again := ClassifySend(status, h, body); again.Outcome != obs.Outcome || again.ProviderMsgID != obs.ProviderMsgID {
			t.Fatalf("not deterministic: %+v then %+v", obs, again)
		}
	})
}

var queryOutcomes = map[delivery.Outcome]bool{
	delivery.OutcomeQueryFound: true, delivery.OutcomeQueryNotFound: true, delivery.OutcomeQueryFailed: true,
}

func FuzzClassifyQuery(f *testing.F) {
	for _, status := range []int{200, 201, 204, 404, 405, 500, 503, 0, -1} {
		f.Add(status, []byte(`{"found":1,"id":"sms-msg-0001"}`))
		f.Add(status, []byte(`{"found":0,"id":""}`))
	}
	f.Add(200, []byte(`{"found":-1}`))
	f.Add(200, []byte(`{"found":1.5}`))
	f.Add(200, []byte(`{"found":"1"}`))
	f.Add(200, []byte(`{"found":null}`))
	f.Add(200, []byte(`{"id":"x"}`))
	f.Add(200, []byte(`{"found":99999999999999999999}`))
	f.Add(200, []byte(`{"found":2,"id":"`+strings.Repeat("x", 501)+`"}`))
	f.Add(200, []byte(`{"found":1,"id":"a\u0000b"}`))
	f.Add(200, []byte(`{"found":0}trailing`))
	f.Add(200, append([]byte(`{"found":0}`), bytes.Repeat([]byte(" "), MaxResponseBytes)...))
	f.Add(200, []byte{})

	f.Fuzz(func(t *testing.T, status int, body []byte) {
		obs := ClassifyQuery(status, body)
		checkObservation(t, obs, queryOutcomes)
		if status != http.StatusOK && obs.Outcome != delivery.OutcomeQueryFailed {
			t.Fatalf("HTTP %d classified %s: only a 200 answers a query", status, obs.Outcome)
		}
		if obs.Outcome == delivery.OutcomeQueryNotFound && len(body) > MaxResponseBytes {
			t.Fatalf("trusted 'not found' from a body of %d bytes, more than MaxResponseBytes", len(body))
		}
		if obs.RetryAfter != 0 {
			t.Fatalf("a query has no Retry-After, got %s", obs.RetryAfter)
		}
		if obs.Outcome != delivery.OutcomeQueryFound && obs.ProviderMsgID != "" {
			t.Fatalf("%s with provider message id %q", obs.Outcome, obs.ProviderMsgID)
		}
	})
}

// countingTransport counts the bytes the client reads from response bodies.
type countingTransport struct {
	inner http.RoundTripper
	read  *atomic.Int64
}

func (c countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.inner.RoundTrip(req)
	if err == nil {
		resp.Body = &countingBody{ReadCloser: resp.Body, read: c.read}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	read *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.read.Add(int64(n))
	return n, err
}

// fuzzAnswer is what the test server answers to the current input (inputs run one at a time).
type fuzzAnswer struct {
	status int
	body   []byte
	pad    int // bytes of filler after body
}

// maxPad bounds the filler: responses of up to 4 MiB, far more than the client may read.
const maxPad = 4 << 20

func FuzzSendResponse(f *testing.F) {
	ok := []byte(`{"id":"m-1","replayed":false}`)
	f.Add(200, ok, uint32(0))
	f.Add(201, []byte(`{"id":"m-1","replayed":true}`), uint32(0))
	f.Add(200, ok, uint32(MaxResponseBytes-len(ok)))   // exactly MaxResponseBytes: still read whole
	f.Add(200, ok, uint32(MaxResponseBytes-len(ok)+1)) // one byte more: too long, uncertain
	f.Add(200, ok, uint32(3<<20))                      // 3 MiB
	f.Add(202, []byte(`{"id":"`), uint32(2<<20))       // an id that never ends
	f.Add(204, ok, uint32(0))                          // no body allowed
	f.Add(304, ok, uint32(0))                          // no body allowed, not a 2xx
	f.Add(400, []byte("bad request\xff\xfe"), uint32(1<<20))
	f.Add(409, []byte{}, uint32(0))
	f.Add(429, []byte{}, uint32(0))
	f.Add(503, bytes.Repeat([]byte("x"), 1000), uint32(maxPad))
	f.Add(-7, ok, uint32(0))

	var (
		mu      sync.Mutex
		current fuzzAnswer
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		a := current
		mu.Unlock()
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(a.status)
		if _, err := w.Write(a.body); err != nil {
			return // the client went away, or the status allows no body
		}
		filler := bytes.Repeat([]byte(" "), 32<<10)
		for left := a.pad; left > 0; left -= len(filler) {
			if _, err := w.Write(filler[:min(left, len(filler))]); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	client, err := New(srv.URL, Options{})
	if err != nil {
		f.Fatal(err)
	}
	var read atomic.Int64
	transport, err := httpkit.NewTransport(httpkit.Options{})
	if err != nil {
		f.Fatal(err)
	}
	client.kit = httpkit.NewClient(countingTransport{inner: transport, read: &read})

	f.Fuzz(func(t *testing.T, status int, body []byte, pad uint32) {
		// Any status a server can send as a final answer (net/http refuses others), any body, up to a
		// few MiB of it.
		a := fuzzAnswer{status: 200 + int(uint(status)%400), body: body, pad: int(pad % (maxPad + 1))}
		mu.Lock()
		current = a
		mu.Unlock()
		read.Store(0)

		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		start := time.Now()
		obs := client.Send(ctx, delivery.Message{Ref: "task-1", IdempotencyKey: "ntf-task-1", To: "u1", Body: "hello"})
		took := time.Since(start)

		if n := read.Load(); n > MaxResponseBytes+1 {
			t.Fatalf("read %d bytes of a response body, more than MaxResponseBytes+1 = %d", n, MaxResponseBytes+1)
		}
		if took > 10*time.Second {
			t.Fatalf("a prompt answer took %s", took)
		}
		checkObservation(t, obs, sendOutcomes)

		// What the client saw is exactly the classification of the first MaxResponseBytes+1 bytes.
		full := append(append([]byte{}, a.body...), bytes.Repeat([]byte(" "), a.pad)...)
		if a.status == http.StatusNoContent || a.status == http.StatusNotModified {
			full = nil
		}
		want := ClassifySend(a.status, http.Header{"Retry-After": {"7"}}, full[:min(len(full), MaxResponseBytes+1)])
		if obs.Outcome != want.Outcome || obs.ProviderMsgID != want.ProviderMsgID || obs.Detail != want.Detail || obs.RetryAfter != want.RetryAfter {
			t.Fatalf("HTTP %d with %d+%d bytes: client observed %+v, want %+v", a.status, len(a.body), a.pad, obs, want)
		}
		if len(full) > MaxResponseBytes && (obs.Outcome == delivery.OutcomeAccepted || obs.Outcome == delivery.OutcomeAcceptedReplay) {
			t.Fatalf("accepted a response of %d bytes, more than MaxResponseBytes", len(full))
		}
	})
}
