package httpkit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
)

// TestNewTransport: the settings every adapter's transport is built with.
func TestNewTransport(t *testing.T) {
	is := is.New(t)
	tr, err := httpkit.NewTransport(httpkit.Options{})
	is.NoErr(err)
	is.Equal(tr.MaxIdleConnsPerHost, 1024)                  // a pool for work's default window (docs/channels.md)
	is.Equal(tr.TLSHandshakeTimeout, 5*time.Second)         // a handshake is bounded
	is.Equal(tr.IdleConnTimeout, 90*time.Second)            // idle connections are closed in time
	is.True(tr.ForceAttemptHTTP2)                           // HTTP/2 by ALPN despite the custom TLS config
	is.Equal(tr.TLSClientConfig.MinVersion, uint16(0x0303)) // TLS 1.2 or later
	is.True(tr.DialContext != nil)                          // the bounded dialer
	is.Equal(tr.ResponseHeaderTimeout, time.Duration(0))    // the caller's context bounds the call instead

	for in, want := range map[int]int{1: 1, 7: 7, 0: 1024, -1: 1024} {
		tr, err := httpkit.NewTransport(httpkit.Options{MaxIdleConnsPerHost: in})
		is.NoErr(err)
		is.Equal(tr.MaxIdleConnsPerHost, want) // a pool size of the caller's, or the default for none
	}

	_, err = httpkit.NewTransport(httpkit.Options{CAFile: t.TempDir() + "/missing.pem"})
	is.True(err != nil) // a CA file that cannot be read stops the transport
}

func TestSuccess(t *testing.T) {
	is := is.New(t)
	for status, want := range map[int]bool{199: false, 200: true, 201: true, 299: true, 300: false, 404: false, 500: false} {
		is.Equal((&httpkit.Response{Status: status}).Success(), want) // 2xx only
	}
}

// TestServerAnswerStatuses: which statuses ServerAnswer takes, at the edges of the 5xx range.
func TestServerAnswerStatuses(t *testing.T) {
	proxy, _ := url.Parse("http://proxy.example:3128")
	cases := []struct {
		status int
		proxy  *url.URL
		want   delivery.Outcome // "" for not taken
	}{
		{429, nil, delivery.OutcomeThrottled},
		{502, nil, delivery.OutcomeGatewayError},
		{504, nil, delivery.OutcomeGatewayError},
		{500, nil, delivery.OutcomeHTTP5xx},
		{503, nil, delivery.OutcomeHTTP5xx},
		{599, nil, delivery.OutcomeHTTP5xx},
		{500, proxy, delivery.OutcomeGatewayError},
		{599, proxy, delivery.OutcomeGatewayError},
		{429, proxy, delivery.OutcomeThrottled},
		{499, nil, ""},
		{499, proxy, ""},
		{600, nil, ""},
		{600, proxy, ""},
		{400, nil, ""},
		{200, proxy, ""},
	}
	for _, c := range cases {
		is := is.New(t)
		obs, ok := (&httpkit.Response{Status: c.status, Proxy: c.proxy}).ServerAnswer()
		is.Equal(ok, c.want != "")    // taken or left to the adapter
		is.Equal(obs.Outcome, c.want) // mapped
		if ok {
			is.True(strings.HasPrefix(obs.Detail, "HTTP ")) // the detail names the status
		}
	}
}

func TestRefused(t *testing.T) {
	is := is.New(t)
	obs := (&httpkit.Response{Status: 400, Body: []byte(" bad address \n")}).Refused()
	is.Equal(obs.Outcome, delivery.OutcomeRejected) // a 4xx nothing else took
	is.Equal(obs.Detail, "HTTP 400: bad address")   // the status and the body's start
	obs = (&httpkit.Response{Status: 404}).Refused()
	is.Equal(obs.Detail, "HTTP 404") // no body, no colon
	h := http.Header{"Retry-After": {"3"}}
	obs = (&httpkit.Response{Status: 503, Header: h, Body: []byte("busy")}).Refused()
	is.Equal(obs, delivery.Observation{Outcome: delivery.OutcomeHTTP5xx, RetryAfter: 3 * time.Second, Detail: "HTTP 503"}) // ServerAnswer's
}

func TestRetryAfter(t *testing.T) {
	date := func(d time.Duration) string { return time.Now().Add(d).UTC().Format(http.TimeFormat) }
	cases := []struct {
		header   string
		min, max time.Duration
	}{
		{"", 0, 0},
		{"7", 7 * time.Second, 7 * time.Second},
		{" 7 ", 7 * time.Second, 7 * time.Second},
		{"1", time.Second, time.Second},
		{"0", 0, 0},
		{"-5", 0, 0},
		{"3600", time.Hour, time.Hour},
		{"3601", time.Hour, time.Hour},           // capped
		{"99999999999999", time.Hour, time.Hour}, // no overflow past the cap
		{"soon", 0, 0},                           // neither seconds nor a date
		{"1.5", 0, 0},
		{date(90 * time.Second), 80 * time.Second, 90 * time.Second}, // a date: the time until it (to the second)
		{date(-time.Minute), 0, 0},                                   // a date past
		{date(48 * time.Hour), time.Hour, time.Hour},                 // capped
	}
	for _, c := range cases {
		is := is.New(t)
		got := httpkit.RetryAfter(http.Header{"Retry-After": {c.header}})
		is.True(got >= c.min && got <= c.max) // within the expected range
		if c.header == "" {
			is.Equal(httpkit.RetryAfter(http.Header{}), time.Duration(0)) // no header, no wait
		}
	}
}

func TestSnippet(t *testing.T) {
	is := is.New(t)
	is.Equal(httpkit.Snippet(nil), "")                                     // nothing to add
	is.Equal(httpkit.Snippet([]byte(" \n\t ")), "")                        // nor for blanks
	is.Equal(httpkit.Snippet([]byte(" no such user\n")), ": no such user") // trimmed
	is.Equal(httpkit.Snippet([]byte("a\x00b\tc\xffd")), ": a?b?c?d")       // printable characters only, valid text
	long := strings.Repeat("x", 200)
	is.Equal(httpkit.Snippet([]byte(long)), ": "+long)      // 200 characters are kept
	is.Equal(httpkit.Snippet([]byte(long+"yz")), ": "+long) // and no more
}

// TestDoRejectsARequestItCannotBuild: a channel URL that is no URL is REJECTED, with nothing sent.
func TestDoRejectsARequestItCannotBuild(t *testing.T) {
	is := is.New(t)
	var handled atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { handled.Add(1) }))
	defer srv.Close()
	kit := newKit(t, httpkit.Options{})
	for _, r := range []httpkit.Request{
		{Method: http.MethodPost, URL: srv.URL + "/send\x7f"},
		{Method: "BAD METHOD", URL: srv.URL + "/send"},
	} {
		resp, obs := kit.Do(context.Background(), r)
		is.True(resp == nil)                                      // no answer
		is.Equal(obs.Outcome, delivery.OutcomeRejected)           // the request can never be made
		is.True(strings.HasPrefix(obs.Detail, "build request: ")) // saying why
	}
	is.Equal(handled.Load(), int32(0)) // nothing reached the channel
}
