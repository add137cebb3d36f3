package httpchannel_test

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
)

var msg = delivery.Message{Ref: "task-1", IdempotencyKey: "ntf-task-1", To: "a", Body: "b"}

func accepting(hits *atomic.Int32) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Write([]byte(`{"id":"m-1","replayed":false}`))
	}
}

// TLS is always verified: an unknown certificate means no request left (CONNECT_FAILED, certain), and
// a CA file makes a private channel reachable.
func TestTLSVerification(t *testing.T) {
	is := is.New(t)
	var hits atomic.Int32
	srv := httptest.NewTLSServer(accepting(&hits))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	plain, err := httpchannel.New(srv.URL, httpchannel.Options{})
	is.NoErr(err)
	obs := plain.Send(ctx, msg)
	is.Equal(obs.Outcome, delivery.OutcomeConnectFailed) // an unverifiable certificate: nothing was sent
	is.Equal(hits.Load(), int32(0))                      // the handler never ran

	caFile := filepath.Join(t.TempDir(), "ca.pem")
	is.NoErr(os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	private, err := httpchannel.New(srv.URL, httpchannel.Options{CAFile: caFile})
	is.NoErr(err)
	is.Equal(private.Send(ctx, msg).Outcome, delivery.OutcomeAccepted) // verified against the given CA
	is.Equal(hits.Load(), int32(1))

	_, err = httpchannel.New(srv.URL, httpchannel.Options{CAFile: filepath.Join(t.TempDir(), "missing.pem")})
	is.True(err != nil) // a missing CA file is a configuration error, not a silent fallback
}

// A POST is never replayed somewhere else behind our back: a redirect is a refusal.
func TestRedirectNotFollowed(t *testing.T) {
	is := is.New(t)
	var hits atomic.Int32
	target := httptest.NewServer(accepting(&hits))
	defer target.Close()
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/send", http.StatusTemporaryRedirect)
	}))
	defer redirect.Close()
	c, err := httpchannel.New(redirect.URL, httpchannel.Options{})
	is.NoErr(err)
	obs := c.Send(context.Background(), msg)
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // 307 is not an acceptance
	is.Equal(hits.Load(), int32(0))                 // and the target was never called
}

// The client timeout bounds the whole call, body included: a server that dribbles its body forever
// cannot hold a worker.
func TestTimeoutIncludesBody(t *testing.T) {
	is := is.New(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(`{"id":`))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}))
	defer srv.Close()
	c, err := httpchannel.New(srv.URL, httpchannel.Options{})
	is.NoErr(err)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	obs := c.Send(ctx, msg)
	is.Equal(obs.Outcome, delivery.OutcomeMalformed)  // a 2xx came, its provider id did not: outcome unknown
	is.True(strings.Contains(obs.Detail, "deadline")) // the detail says why the body is missing
	is.True(time.Since(start) < 5*time.Second)        // bounded by the client timeout, not the server
}

// Credentials in a channel URL never show in what the client reports.
func TestCredentialsNotShown(t *testing.T) {
	is := is.New(t)
	c, err := httpchannel.New("http://user:s3cret@127.0.0.1:1", httpchannel.Options{})
	is.NoErr(err)
	is.True(!strings.Contains(c.String(), "s3cret")) // String redacts
	obs := c.Send(context.Background(), msg)
	is.Equal(obs.Outcome, delivery.OutcomeConnectFailed) // nothing listens there
	is.True(!strings.Contains(obs.Detail, "s3cret"))     // the error text is redacted too
	_, err = httpchannel.New("http://user:s3cret@host:notaport/", httpchannel.Options{})
	is.True(err != nil && !strings.Contains(err.Error(), "s3cret")) // a bad URL is refused without echoing it
}

// TestGatewayAnswers: a 502 or 504 is a gateway's answer that may come after the request was passed
// on (GATEWAY_ERROR, uncertain); the channel's own 503 is its refusal before acceptance (HTTP_5XX).
// (A forward proxy's 5xx, GATEWAY_ERROR too, is service/httpkit's TestGatewayAnswers.)
func TestGatewayAnswers(t *testing.T) {
	is := is.New(t)
	for status, want := range map[int]delivery.Outcome{502: delivery.OutcomeGatewayError, 504: delivery.OutcomeGatewayError,
		503: delivery.OutcomeHTTP5xx, 500: delivery.OutcomeHTTP5xx, 429: delivery.OutcomeThrottled} {
		is.Equal(httpchannel.ClassifySend(status, http.Header{}, nil).Outcome, want) // mapped as every adapter maps it
	}
}

// TestQueryDropped: a query whose connection closes without an answer is QUERY_FAILED, and says
// what happened; it is sent once.
func TestQueryDropped(t *testing.T) {
	is := is.New(t)
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			_, _ = w.Write([]byte(`{"found":0}`)) // the first query keeps the connection open
			return
		}
		fakes.Drop(w, r)
	}))
	defer srv.Close()
	c, err := httpchannel.New(srv.URL, httpchannel.Options{})
	is.NoErr(err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	is.Equal(c.Query(ctx, "task-1").Outcome, delivery.OutcomeQueryNotFound) // answered
	obs := c.Query(ctx, "task-1")
	is.Equal(obs.Outcome, delivery.OutcomeQueryFailed)   // no usable answer
	is.True(strings.HasPrefix(obs.Detail, "IO_ERROR: ")) // a broken connection
	is.Equal(hits.Load(), int32(2))                      // and not asked again behind our back
}

// The channel protocol's 401 and 403 say the endpoint refuses our credential: ACCOUNT_REFUSED (the
// channel pauses), never REJECTED (the task written off). The token goes out as a bearer credential.
func TestCredentialRefusalIsAccountRefused(t *testing.T) {
	is := is.New(t)
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		obs := httpchannel.ClassifySend(status, http.Header{}, []byte(`{"error":"no"}`))
		is.Equal(obs.Outcome, delivery.OutcomeAccountRefused) // the account, not the message
		is.True(strings.Contains(obs.Detail, strconv.Itoa(status)))
	}
	is.Equal(httpchannel.ClassifySend(http.StatusBadRequest, http.Header{}, nil).Outcome, delivery.OutcomeRejected) // other 4xx: the message
}
