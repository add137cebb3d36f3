package httpkit_test

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
)

// replayable are the requests net/http's Transport used to send twice by itself: a POST with either
// idempotency header (over HTTP/1, with a body it can rewind) and a GET.
var replayable = []struct {
	name    string
	request func(url string) httpkit.Request
}{
	{"POST with Idempotency-Key", func(u string) httpkit.Request {
		return httpkit.Request{Method: http.MethodPost, URL: u, Body: []byte(`{"ref":"task-1"}`),
			Header: http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {"ntf-task-1"}}}
	}},
	{"POST with X-Idempotency-Key", func(u string) httpkit.Request {
		return httpkit.Request{Method: http.MethodPost, URL: u, Body: []byte(`{"ref":"task-1"}`),
			Header: http.Header{"Content-Type": {"application/json"}, "X-Idempotency-Key": {"ntf-task-1"}}}
	}},
	{"GET", func(u string) httpkit.Request { return httpkit.Request{Method: http.MethodGet, URL: u + "?ref=task-1"} }},
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func newKit(t *testing.T, opt httpkit.Options) *httpkit.Client {
	t.Helper()
	c, err := httpkit.New(opt)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// h2cKit is the kit's transport speaking cleartext HTTP/2 (prior knowledge), so a test can see and
// forge its frames.
func h2cKit(t *testing.T, strict bool) *httpkit.Client {
	t.Helper()
	tr, err := httpkit.NewTransport(httpkit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	if strict {
		tr.HTTP2 = &http.HTTP2Config{StrictMaxConcurrentRequests: true}
	}
	t.Cleanup(tr.CloseIdleConnections)
	return httpkit.NewClient(tr)
}

// counter counts requests by path, and connections (conns.ConnState goes to http.Server.ConnState).
type counter struct {
	mu     sync.Mutex
	byPath map[string]int
	conns  fakes.ConnCounter
}

func (c *counter) add(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byPath == nil {
		c.byPath = map[string]int{}
	}
	c.byPath[path]++
	return c.byPath[path]
}

func (c *counter) get(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byPath[path]
}

// TestOneRequestWhenAKeptAliveConnectionDrops is issue 15 over HTTP/1.1: the server answers a first
// request (the connection stays open), then reads the second, counts it, and closes the connection
// without answering. The Transport used to send that request again on a new connection; the server
// must see it once, and the caller an uncertain IO_ERROR.
func TestOneRequestWhenAKeptAliveConnectionDrops(t *testing.T) {
	for _, v := range replayable {
		t.Run(v.name, func(t *testing.T) {
			is := is.New(t)
			var seen counter
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if seen.add(r.URL.Path) == 1 && r.URL.Path == "/second" {
					fakes.Drop(w, r) // accepted, then the connection broke
					return
				}
				_, _ = w.Write([]byte(`{"id":"m-1"}`))
			}))
			srv.Config.ConnState = seen.conns.ConnState
			srv.Start()
			defer srv.Close()
			kit := newKit(t, httpkit.Options{})

			resp, obs := kit.Do(ctxFor(t, 5*time.Second), v.request(srv.URL+"/first"))
			is.True(resp != nil)       // the first request is answered
			is.Equal(resp.Status, 200) // normally
			is.Equal(obs.Outcome, delivery.Outcome(""))

			resp, obs = kit.Do(ctxFor(t, 5*time.Second), v.request(srv.URL+"/second"))
			is.Equal(seen.get("/second"), 1)                    // the channel got it once
			is.Equal(seen.conns.Count(), 1)                     // on the kept-alive connection, and none was dialed to resend it
			is.True(resp == nil)                                // no answer came
			is.Equal(obs.Outcome, delivery.OutcomeIOError)      // uncertain: it may have been accepted
			is.True(strings.Contains(obs.Detail, "kept-alive")) // and the detail says where it broke
		})
	}
}

// TestOneRequestWhenHTTP2PeerResetsTheStream: over HTTP/2 the Transport resends a request whose
// stream the peer reset with PROTOCOL_ERROR, which a server may do after it processed the request.
// A proxy between client and server forges that reset once the server counted the request.
func TestOneRequestWhenHTTP2PeerResetsTheStream(t *testing.T) {
	for _, v := range replayable {
		t.Run(v.name, func(t *testing.T) {
			is := is.New(t)
			var seen counter
			var proxy *h2Proxy
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if seen.add(r.URL.Path) == 1 && r.URL.Path == "/second" {
					close(proxy.counted) // the server has it: now the "server" resets the stream
					select {
					case <-proxy.injected:
					case <-time.After(10 * time.Second):
					}
					// Nothing more on this stream: a response after the forged reset could still be
					// read as the answer (the client prefers headers that raced a reset).
					panic(http.ErrAbortHandler)
				}
				_, _ = w.Write([]byte(`{"id":"m-1"}`))
			}))
			srv.Config.Protocols = new(http.Protocols)
			srv.Config.Protocols.SetUnencryptedHTTP2(true)
			srv.Start()
			defer srv.Close()
			proxy = startH2Proxy(t, srv.Listener.Addr().String())
			proxy.resetNth = 2
			kit := h2cKit(t, false)

			resp, _ := kit.Do(ctxFor(t, 5*time.Second), v.request(proxy.URL()+"/first"))
			is.True(resp != nil)             // answered
			is.Equal(resp.Proto, "HTTP/2.0") // over HTTP/2
			resp, obs := kit.Do(ctxFor(t, 5*time.Second), v.request(proxy.URL()+"/second"))
			t.Logf("observed %+v; server saw %d, proxy relayed %d connections", obs, seen.get("/second"), proxy.connCount())
			is.Equal(seen.get("/second"), 1)               // one copy reached the server
			is.True(resp == nil)                           // the reset stream has no answer
			is.Equal(obs.Outcome, delivery.OutcomeIOError) // uncertain
		})
	}
}

// TestHTTP2RetryOfARequestNeverWritten: the one retry left is of a request the transport never
// started. A GOAWAY (the server will process nothing after stream 1) leaves the idle HTTP/2
// connection unusable; the next request finds no usable connection (http2isNoCachedConnError) and is
// sent on a new one: once on the wire, and answered.
func TestHTTP2RetryOfARequestNeverWritten(t *testing.T) {
	is := is.New(t)
	var seen counter
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		seen.add(r.URL.Path)
		_, _ = w.Write([]byte("ok"))
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	proxy := startH2Proxy(t, srv.Listener.Addr().String())
	kit := h2cKit(t, false)

	warm, _ := kit.Do(ctxFor(t, 5*time.Second), replayable[2].request(proxy.URL()+"/warm"))
	is.True(warm != nil)                // the connection is up and idle
	is.NoErr(proxy.goAwayAndWait(0, 1)) // and the client knows it takes no new stream
	resp, obs := kit.Do(ctxFor(t, 5*time.Second), replayable[0].request(proxy.URL()+"/b"))
	t.Logf("B: %+v; proxy connections %d", obs, proxy.connCount())
	is.True(resp != nil)           // answered
	is.Equal(resp.Status, 200)     // normally
	is.Equal(proxy.connCount(), 2) // on a new connection
	is.Equal(seen.get("/b"), 1)    // once
}

// TestHTTP2UnusableConnectionIsCertain: a request waiting on a connection for a free stream (the
// server allows one at a time, the client waits instead of dialing) when a GOAWAY arrives fails with
// errClientConnUnusable before any frame of it was written. The transport would resend it but cannot
// rewind the body; the call ends with nothing sent, which is certain: CONNECT_FAILED.
func TestHTTP2UnusableConnectionIsCertain(t *testing.T) {
	is := is.New(t)
	var seen counter
	holding, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if seen.add(r.URL.Path) == 1 && r.URL.Path == "/hold" {
			close(holding)
			<-release
		}
		_, _ = w.Write([]byte("ok"))
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 1}
	srv.Start()
	defer srv.Close()
	defer close(release)
	proxy := startH2Proxy(t, srv.Listener.Addr().String())
	kit := h2cKit(t, true)

	warm, _ := kit.Do(ctxFor(t, 5*time.Second), replayable[2].request(proxy.URL()+"/warm"))
	is.True(warm != nil) // the connection is up and knows the server's one-stream limit
	aDone := make(chan *httpkit.Response, 1)
	go func() {
		resp, _ := kit.Do(ctxFor(t, 10*time.Second), replayable[2].request(proxy.URL()+"/hold"))
		aDone <- resp
	}()
	<-holding // A holds the only stream (3)

	gotB := make(chan struct{}, 4)
	ctxB := httptrace.WithClientTrace(ctxFor(t, 10*time.Second), &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { gotB <- struct{}{} }})
	bDone := make(chan struct{})
	var respB *httpkit.Response
	var obsB delivery.Observation
	go func() {
		defer close(bDone)
		respB, obsB = kit.Do(ctxB, replayable[0].request(proxy.URL()+"/b"))
	}()
	<-gotB                              // B has the connection and waits for a stream
	is.NoErr(proxy.goAwayAndWait(0, 3)) // nothing after A's stream will be processed
	release <- struct{}{}               // A ends; B wakes to a connection that takes no new stream
	<-bDone
	is.True(<-aDone != nil) // A was answered
	t.Logf("B: %+v", obsB)
	is.True(respB == nil)                                 // B was not answered
	is.Equal(obsB.Outcome, delivery.OutcomeConnectFailed) // and certainly not received
	is.Equal(seen.get("/b"), 0)                           // indeed
}

// TestHTTP2OverTLS: https channels speak HTTP/2 (ALPN); a reset stream is uncertain and not resent.
func TestHTTP2OverTLS(t *testing.T) {
	is := is.New(t)
	var seen counter
	var gotBody []byte
	var gotMethod string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		seen.add(r.URL.Path)
		if r.URL.Path == "/drop" {
			panic(http.ErrAbortHandler) // HTTP/2: the stream is reset after the server took the request
		}
		if r.URL.Path == "/query" {
			gotBody, gotMethod = body, r.Method
		}
		_, _ = w.Write([]byte("ok"))
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	kit := newKit(t, httpkit.Options{CAFile: caFile(t, srv)})

	resp, obs := kit.Do(ctxFor(t, 5*time.Second), replayable[0].request(srv.URL+"/send"))
	is.True(resp != nil) // answered
	is.Equal(obs.Outcome, delivery.Outcome(""))
	is.Equal(resp.Proto, "HTTP/2.0") // over HTTP/2
	resp, _ = kit.Do(ctxFor(t, 5*time.Second), replayable[2].request(srv.URL+"/query"))
	is.True(resp != nil)       // a query is answered too
	is.Equal(gotMethod, "GET") // as a GET
	is.Equal(len(gotBody), 0)  // whose (empty DATA frame) body is empty
	for _, v := range replayable {
		resp, obs = kit.Do(ctxFor(t, 5*time.Second), v.request(srv.URL+"/drop"))
		is.True(resp == nil)                           // no answer
		is.Equal(obs.Outcome, delivery.OutcomeIOError) // uncertain
	}
	is.Equal(seen.get("/drop"), 3) // one copy per call
}

func caFile(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// TestGETOnTheWire: a GET's body exists only to make it non-replayable; HTTP/1 sends a plain GET,
// with neither Content-Length nor Transfer-Encoding. A POST keeps its Content-Length.
func TestGETOnTheWire(t *testing.T) {
	is := is.New(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	is.NoErr(err)
	defer ln.Close()
	requests := make(chan string, 2)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		br := bufio.NewReader(conn)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			body, _ := io.ReadAll(req.Body)
			var b strings.Builder
			_ = req.Header.Write(&b)
			requests <- fmt.Sprintf("%s %s\n%s\nbody=%q", req.Method, req.URL, b.String(), body)
			_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	}()
	kit := newKit(t, httpkit.Options{})
	resp, _ := kit.Do(ctxFor(t, 5*time.Second), replayable[2].request("http://"+ln.Addr().String()+"/messages"))
	is.True(resp != nil) // answered
	get := <-requests
	t.Log(get)
	is.True(!strings.Contains(get, "Content-Length"))    // no length
	is.True(!strings.Contains(get, "Transfer-Encoding")) // and no chunked body
	is.True(strings.HasSuffix(get, `body=""`))           // nothing after the headers
	resp, _ = kit.Do(ctxFor(t, 5*time.Second), replayable[0].request("http://"+ln.Addr().String()+"/send"))
	is.True(resp != nil) // answered
	post := <-requests
	is.True(strings.Contains(post, "Content-Length: 16"))           // a POST's body has its length
	is.True(strings.HasSuffix(post, `body="{\"ref\":\"task-1\"}"`)) // and is sent whole
}

// TestNothingWrittenIsCertain: when the transport never wrote a byte of the request, the outcome is
// certain (CONNECT_FAILED, retried by the service as not accepted), whatever the cause.
func TestNothingWrittenIsCertain(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	_ = closed.Close()

	var handled atomic.Int32
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { handled.Add(1) }))
	tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are the point
	tlsSrv.StartTLS()
	defer tlsSrv.Close()

	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts, reads, never says a word
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }()
		}
	}()

	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			handled.Add(1000) // an https request relayed, not tunnelled, would be a bug
		}
		http.Error(w, "forbidden", http.StatusForbidden)
	}))
	defer refusing.Close()
	refusingURL, _ := url.Parse(refusing.URL)

	cases := []struct {
		name    string
		opt     httpkit.Options
		target  string
		timeout time.Duration
		detail  string
	}{
		{"dial refused", httpkit.Options{}, "http://" + closedAddr + "/send", 5 * time.Second, "connect"},
		{"TLS certificate not trusted", httpkit.Options{}, tlsSrv.URL + "/send", 5 * time.Second, "TLS"},
		{"TLS handshake never answered", httpkit.Options{}, "https://" + silent.Addr().String() + "/send", 300 * time.Millisecond, "no connection within the client timeout"},
		{"proxy refuses CONNECT", httpkit.Options{Proxy: http.ProxyURL(refusingURL)}, tlsSrv.URL + "/send", 5 * time.Second, "proxy " + refusing.URL},
		{"proxy never answers CONNECT", httpkit.Options{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: silent.Addr().String()})}, tlsSrv.URL + "/send", 300 * time.Millisecond, "no connection within the client timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			kit := newKit(t, tc.opt)
			for _, v := range replayable {
				resp, obs := kit.Do(ctxFor(t, tc.timeout), v.request(tc.target))
				t.Logf("%s: %+v", v.name, obs)
				is.True(resp == nil)                                 // no answer
				is.Equal(obs.Outcome, delivery.OutcomeConnectFailed) // certain: never received
				is.True(strings.Contains(obs.Detail, tc.detail))     // saying why
			}
			is.Equal(handled.Load(), int32(0)) // no handler ever ran
		})
	}
}

// TestGatewayAnswers: 502 and 504 are a gateway's answers and so is any 5xx that a forward proxy
// gave a plain-http request: GATEWAY_ERROR, uncertain. A 5xx from the channel itself (directly, or
// end to end through a CONNECT tunnel) is HTTP_5XX, the fakes' "refused before acceptance".
func TestGatewayAnswers(t *testing.T) {
	is := is.New(t)
	channel := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var code int
		_, _ = fmt.Sscanf(r.URL.Path, "/%d", &code)
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(code)
	})
	direct := httptest.NewServer(channel)
	defer direct.Close()
	kit := newKit(t, httpkit.Options{})
	for code, want := range map[int]delivery.Outcome{502: delivery.OutcomeGatewayError, 504: delivery.OutcomeGatewayError,
		503: delivery.OutcomeHTTP5xx, 500: delivery.OutcomeHTTP5xx, 429: delivery.OutcomeThrottled} {
		resp, _ := kit.Do(ctxFor(t, 5*time.Second), replayable[0].request(fmt.Sprintf("%s/%d", direct.URL, code)))
		is.True(resp != nil) // answered
		obs, ok := resp.ServerAnswer()
		is.True(ok)                             // a status every adapter reads alike
		is.Equal(obs.Outcome, want)             // mapped
		is.Equal(obs.RetryAfter, 7*time.Second) // with the channel's Retry-After
	}
	resp, _ := kit.Do(ctxFor(t, 5*time.Second), replayable[0].request(direct.URL+"/404"))
	_, ok := resp.ServerAnswer()
	is.True(!ok) // a 4xx is the adapter's to read

	// A plain-http forward proxy that answers 503 itself.
	var relayed atomic.Int32
	forward := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		relayed.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer forward.Close()
	forwardURL, _ := url.Parse(forward.URL)
	viaProxy := newKit(t, httpkit.Options{Proxy: http.ProxyURL(forwardURL)})
	resp, _ = viaProxy.Do(ctxFor(t, 5*time.Second), replayable[0].request("http://channel.invalid/send"))
	is.True(resp != nil)               // the proxy answered
	is.Equal(relayed.Load(), int32(1)) // the request went to the proxy, to be relayed
	obs, _ := resp.ServerAnswer()
	is.Equal(obs.Outcome, delivery.OutcomeGatewayError)    // not HTTP_5XX: the proxy may have passed it on
	is.True(strings.Contains(obs.Detail, "forward proxy")) // and the detail says so
	is.True(strings.Contains(obs.Detail, forwardURL.Host)) // naming the proxy

	// A forward proxy reached over TLS relays a plain-http request just the same.
	forwardTLS := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		relayed.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer forwardTLS.Close()
	forwardTLSURL, _ := url.Parse(forwardTLS.URL)
	viaTLSProxy := newKit(t, httpkit.Options{Proxy: http.ProxyURL(forwardTLSURL), CAFile: caFile(t, forwardTLS)})
	resp, _ = viaTLSProxy.Do(ctxFor(t, 5*time.Second), replayable[0].request("http://channel.invalid/send"))
	is.True(resp != nil)               // the proxy answered
	is.Equal(relayed.Load(), int32(2)) // relayed by the proxy
	obs, _ = resp.ServerAnswer()
	is.Equal(obs.Outcome, delivery.OutcomeGatewayError) // maybe the proxy's own answer

	// https through a proxy is a CONNECT tunnel: the 503 comes from the channel, end to end.
	tlsChannel := httptest.NewTLSServer(channel)
	defer tlsChannel.Close()
	tunnel := httptest.NewServer(http.HandlerFunc(connectTunnel))
	defer tunnel.Close()
	tunnelURL, _ := url.Parse(tunnel.URL)
	viaTunnel := newKit(t, httpkit.Options{Proxy: http.ProxyURL(tunnelURL), CAFile: caFile(t, tlsChannel)})
	resp, obs = viaTunnel.Do(ctxFor(t, 5*time.Second), replayable[0].request(tlsChannel.URL+"/503"))
	is.True(resp != nil)       // answered through the tunnel
	is.True(resp.Proxy == nil) // no proxy relayed the request itself
	obs, _ = resp.ServerAnswer()
	is.Equal(obs.Outcome, delivery.OutcomeHTTP5xx) // the channel's own refusal
}

// connectTunnel is a proxy that serves CONNECT by splicing the two connections.
func connectTunnel(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
		return
	}
	dst, err := net.Dial("tcp", r.Host)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	src, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		_ = dst.Close()
		return
	}
	_, _ = io.WriteString(src, "HTTP/1.1 200 Connection established\r\n\r\n")
	go func() { _, _ = io.Copy(dst, src); _ = dst.Close() }()
	_, _ = io.Copy(src, dst)
	_ = src.Close()
}

// TestUnreadableBody: a 2xx whose body breaks off is uncertain for an adapter that needs the body
// (MALFORMED_RESPONSE), and the status alone decides otherwise; after another status the body never
// matters.
func TestUnreadableBody(t *testing.T) {
	is := is.New(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var code int
		_, _ = fmt.Sscanf(r.URL.Path, "/%d", &code)
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(`{"id":`))
		_ = http.NewResponseController(w).Flush()
		fakes.Drop(w, r)
	}))
	defer srv.Close()
	kit := newKit(t, httpkit.Options{})

	resp, _ := kit.Do(ctxFor(t, 5*time.Second), replayable[0].request(srv.URL+"/200"))
	is.True(resp != nil)                  // the status line came
	is.True(resp.BodyErr != nil)          // the body did not
	is.Equal(string(resp.Body), `{"id":`) // what came is kept
	obs, ok := resp.Unreadable(true)
	is.True(ok)                                      // an adapter that needs the body
	is.Equal(obs.Outcome, delivery.OutcomeMalformed) // may not call it anything but uncertain
	_, ok = resp.Unreadable(false)
	is.True(!ok) // one for which 2xx is acceptance reads the status

	resp, _ = kit.Do(ctxFor(t, 5*time.Second), replayable[0].request(srv.URL+"/503"))
	is.True(resp != nil && resp.BodyErr != nil) // a refusal whose body broke off
	_, ok = resp.Unreadable(true)
	is.True(!ok) // is still the refusal
	obs, _ = resp.ServerAnswer()
	is.Equal(obs.Outcome, delivery.OutcomeHTTP5xx) // the status line decides
}

// TestBodyBoundAndTimeout: at most MaxResponseBytes+1 bytes are read, and the caller's deadline
// bounds the body too.
func TestBodyBoundAndTimeout(t *testing.T) {
	is := is.New(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			_, _ = w.Write(make([]byte, 4<<20))
			return
		}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"id":`))
		_ = http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}))
	defer srv.Close()
	kit := newKit(t, httpkit.Options{})
	resp, _ := kit.Do(ctxFor(t, 5*time.Second), replayable[2].request(srv.URL+"/big"))
	is.Equal(len(resp.Body), httpkit.MaxResponseBytes+1) // bounded
	start := time.Now()
	resp, _ = kit.Do(ctxFor(t, 300*time.Millisecond), replayable[2].request(srv.URL+"/slow"))
	is.True(resp != nil && resp.BodyErr != nil) // the body did not come in time
	is.True(time.Since(start) < 5*time.Second)  // and the call ended with the caller's deadline
}

func TestTLSConfig(t *testing.T) {
	is := is.New(t)
	conf, err := httpkit.TLSConfig("", "relay.example")
	is.NoErr(err)
	is.Equal(conf.MinVersion, uint16(0x0303)) // TLS 1.2 or later
	is.True(!conf.InsecureSkipVerify)         // always verified
	_, err = httpkit.TLSConfig(filepath.Join(t.TempDir(), "missing.pem"), "")
	is.True(err != nil) // a missing CA file is an error, not a silent fallback
	empty := filepath.Join(t.TempDir(), "empty.pem")
	is.NoErr(os.WriteFile(empty, []byte("no certificate"), 0o600))
	_, err = httpkit.TLSConfig(empty, "")
	is.True(err != nil) // as is one without a certificate

	private := httptest.NewTLSServer(http.NotFoundHandler())
	defer private.Close()
	conf, err = httpkit.TLSConfig(caFile(t, private), "")
	is.NoErr(err)
	want, err := x509.SystemCertPool()
	is.NoErr(err)
	want.AddCert(private.Certificate())
	is.True(conf.RootCAs.Equal(want)) // the CA file's roots join the system's, which stay trusted
}

// TestBasicAuthFromURL: credentials in a channel URL are sent as Basic authentication, as http.Client
// would, and are not in the request line.
func TestBasicAuthFromURL(t *testing.T) {
	is := is.New(t)
	var user, pass, uri string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pass, _ = r.BasicAuth()
		uri = r.RequestURI
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL + "/send")
	u.User = url.UserPassword("notifier", "p@ss/w rd")
	resp, _ := newKit(t, httpkit.Options{}).Do(ctxFor(t, 5*time.Second), replayable[0].request(u.String()))
	is.True(resp != nil)        // answered
	is.Equal(user, "notifier")  // the user
	is.Equal(pass, "p@ss/w rd") // and the password, decoded
	is.Equal(uri, "/send")      // and nothing of them in the request line
}

// TestHTTP2RefusedStreamIsNotProcessed: a stream reset with REFUSED_STREAM was not processed (RFC
// 9113 section 8.7), so the call is CONNECT_FAILED, certain and retried by the dispatcher; the
// transport does not resend it by itself (one request on the wire).
func TestHTTP2RefusedStreamIsNotProcessed(t *testing.T) {
	for _, v := range replayable {
		t.Run(v.name, func(t *testing.T) {
			is := is.New(t)
			var seen counter
			var proxy *h2Proxy
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if seen.add(r.URL.Path) == 1 && r.URL.Path == "/second" {
					close(proxy.counted)
					select {
					case <-proxy.injected:
					case <-time.After(10 * time.Second):
					}
					panic(http.ErrAbortHandler)
				}
				_, _ = w.Write([]byte(`{"id":"m-1"}`))
			}))
			srv.Config.Protocols = new(http.Protocols)
			srv.Config.Protocols.SetUnencryptedHTTP2(true)
			srv.Start()
			defer srv.Close()
			proxy = startH2Proxy(t, srv.Listener.Addr().String())
			proxy.resetNth, proxy.resetCode = 2, codeRefused
			kit := h2cKit(t, false)

			resp, _ := kit.Do(ctxFor(t, 5*time.Second), v.request(proxy.URL()+"/first"))
			is.True(resp != nil) // answered, over the one connection
			resp, obs := kit.Do(ctxFor(t, 5*time.Second), v.request(proxy.URL()+"/second"))
			t.Logf("observed %+v", obs)
			is.True(resp == nil)                                                           // no answer
			is.Equal(obs.Outcome, delivery.OutcomeConnectFailed)                           // certainly not processed
			is.True(strings.Contains(obs.Detail, "not processed (HTTP/2 REFUSED_STREAM)")) // says why
			is.Equal(seen.get("/second"), 1)                                               // and not resent by the transport
			is.Equal(proxy.connCount(), 1)
		})
	}
}

// TestHTTP2GoAwayBelowTheStreamIsNotProcessed: a GOAWAY whose last stream id is below a stream in
// flight says the server will not process it (RFC 9113 section 8.7): CONNECT_FAILED, not resent. A
// stream the GOAWAY covers and whose connection then breaks stays uncertain (the PROTOCOL_ERROR and
// kept-alive tests above).
func TestHTTP2GoAwayBelowTheStreamIsNotProcessed(t *testing.T) {
	is := is.New(t)
	var seen counter
	held, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if seen.add(r.URL.Path) == 1 && r.URL.Path == "/held" {
			close(held)
			<-release
		}
		_, _ = w.Write([]byte("ok"))
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	defer close(release)
	proxy := startH2Proxy(t, srv.Listener.Addr().String())
	kit := h2cKit(t, false)

	warm, _ := kit.Do(ctxFor(t, 5*time.Second), replayable[0].request(proxy.URL()+"/warm"))
	is.True(warm != nil) // stream 1
	done := make(chan delivery.Observation, 1)
	go func() {
		_, obs := kit.Do(ctxFor(t, 10*time.Second), replayable[0].request(proxy.URL()+"/held"))
		done <- obs
	}()
	<-held                              // stream 3 is in flight
	is.NoErr(proxy.goAwayAndWait(0, 1)) // the "server" will process nothing after stream 1
	obs := <-done
	t.Logf("observed %+v", obs)
	is.Equal(obs.Outcome, delivery.OutcomeConnectFailed)                                     // certainly not processed
	is.True(strings.Contains(obs.Detail, "not processed (HTTP/2 GOAWAY below this stream)")) // says why
	is.Equal(seen.get("/held"), 1)                                                           // not resent by the transport
}
