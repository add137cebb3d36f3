package httpkit_test

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
)

// TestRefusedNetwork classifies addresses only: nothing here is resolved or dialled.
func TestRefusedNetwork(t *testing.T) {
	cases := map[string]string{
		// loopback, unspecified, and their IPv4-mapped and -compatible forms
		"127.0.0.1":        "loopback",
		"127.0.0.2":        "loopback",
		"::1":              "loopback",
		"0.0.0.0":          "unspecified",
		"0.1.2.3":          "unspecified",
		"::":               "unspecified",
		"::ffff:127.0.0.1": "loopback",
		"::ffff:10.0.0.1":  "private",
		"::ffff:0.0.0.0":   "unspecified",
		"::127.0.0.1":      "IPv4-compatible",
		// private, CGNAT, link-local (the cloud metadata service)
		"10.0.0.1":        "private",
		"172.16.0.1":      "private",
		"172.31.255.255":  "private",
		"192.168.1.1":     "private",
		"fd00::1":         "private",
		"fc00::1":         "private",
		"100.64.0.1":      "CGNAT",
		"100.127.255.254": "CGNAT",
		"169.254.169.254": "link-local",
		"fe80::1":         "link-local",
		"fe80::1%eth0":    "link-local",
		"fec0::1":         "site-local",
		// multicast, broadcast, reserved and the other special-purpose blocks
		"224.0.0.1":       "multicast",
		"239.255.255.250": "multicast",
		"ff02::1":         "multicast",
		"255.255.255.255": "broadcast",
		"240.0.0.1":       "reserved",
		"192.0.0.8":       "IETF protocol assignments",
		"192.0.2.1":       "documentation",
		"198.51.100.1":    "documentation",
		"203.0.113.1":     "documentation",
		"2001:db8::1":     "documentation",
		"198.18.0.1":      "benchmarking",
		"2001:2::1":       "benchmarking",
		"192.88.99.1":     "6to4 relay anycast",
		"100::1":          "discard-only",
		"2001::1":         "Teredo",
		"64:ff9b:1::1":    "local-use NAT64",
		// IPv4 addresses embedded in NAT64 and 6to4 addresses are classified as IPv4
		"64:ff9b::7f00:1":    "loopback",
		"64:ff9b::a9fe:a9fe": "link-local",
		"2002:a00:1::1":      "private",
		// public addresses pass
		"8.8.8.8":            "",
		"1.1.1.1":            "",
		"172.32.0.1":         "",
		"100.128.0.1":        "",
		"2001:4860::8888":    "",
		"2606:4700::1111":    "",
		"::ffff:8.8.8.8":     "",
		"64:ff9b::808:808":   "",
		"2002:808:808::1":    "",
		"2001:4860:4860::88": "",
	}
	for in, want := range cases {
		t.Run(in, func(t *testing.T) {
			is := is.New(t)
			is.Equal(httpkit.RefusedNetwork(netip.MustParseAddr(in)), want)
		})
	}
	is.New(t).Equal(httpkit.RefusedNetwork(netip.Addr{}), "invalid") // never an address to let through
}

// TestEgressAllowed: allowed_networks opts networks in, an IPv4-mapped address by its IPv4 form too,
// and nothing else.
func TestEgressAllowed(t *testing.T) {
	is := is.New(t)
	e := &httpkit.Egress{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("fd00:1::/64")}}
	for _, ok := range []string{"127.0.0.1", "127.0.0.2", "::ffff:127.0.0.1", "fd00:1::5", "8.8.8.8"} {
		is.NoErr(e.Check(netip.MustParseAddr(ok))) // opted in, or public
	}
	for in, network := range map[string]string{"::1": "loopback", "0.0.0.0": "unspecified", "fd00:2::5": "private", "10.0.0.1": "private"} {
		err := e.Check(netip.MustParseAddr(in))
		var refused *httpkit.RefusedError
		is.True(errors.As(err, &refused)) // still refused
		is.Equal(refused.Network, network)
		is.Equal(err.Error(), "destination "+in+" is in a refused network ("+network+"); allowed_networks opts a network in")
	}
}

func TestParseNetworks(t *testing.T) {
	is := is.New(t)
	nets, err := httpkit.ParseNetworks([]string{"127.0.0.0/8", "::1/128", "10.1.2.0/24", "fd00::/8"})
	is.NoErr(err)
	is.Equal(len(nets), 4)
	for in, want := range map[string]string{
		"10.0.0.1":    "is not a CIDR network",
		"10.0.0.0/33": "is not a CIDR network",
		"nonsense":    "is not a CIDR network",
		"":            "is not a CIDR network",
		"10.0.0.1/8":  `has bits set beyond its /8: did you mean "10.0.0.0/8"?`,
	} {
		_, err := httpkit.ParseNetworks([]string{"127.0.0.0/8", in})
		is.True(errors.Is(err, delivery.ErrInvalidInput)) // bad input
		is.True(strings.Contains(err.Error(), want))      // says why
	}
}

// countingListener accepts connections on a loopback address and counts them.
type countingListener struct {
	ln net.Listener

	mu       sync.Mutex
	accepted []string        // remote addresses, in order
	control  map[string]bool // settled's own connections
}

func listenCounting(t *testing.T, addr string) *countingListener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	l := &countingListener{ln: ln, control: map[string]bool{}}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.mu.Lock()
			l.accepted = append(l.accepted, c.RemoteAddr().String())
			l.mu.Unlock()
			_ = c.Close() // no answer: a request that got through ends as IO_ERROR, never REJECTED
		}
	}()
	return l
}

func (l *countingListener) port() string {
	_, port, _ := net.SplitHostPort(l.ln.Addr().String())
	return port
}

// settled makes a connection of its own and waits until the listener accepted it: connections are
// accepted in order, so by then every earlier one was counted. It returns how many connections other
// than its own the listener accepted so far.
func (l *countingListener) settled(t *testing.T) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", l.ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	own := c.LocalAddr().String()
	l.mu.Lock()
	l.control[own] = true
	l.mu.Unlock()
	n := 0
	testworld.Eventually(t, 10*time.Second, "the listener accepts the control connection", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		seen := false
		n = 0
		for _, a := range l.accepted {
			seen = seen || a == own
			if !l.control[a] {
				n++
			}
		}
		return seen
	})
	return n
}

// TestEgressRefusesLoopbackWhenDialling: a transport with the Egress policy refuses every loopback
// form of this machine's addresses (only those are dialled here) before connecting: 0 connections
// reach a listener there, and the call is REJECTED naming the refused network. Without the policy,
// the same URLs reach the listeners.
func TestEgressRefusesLoopbackWhenDialling(t *testing.T) {
	v4 := listenCounting(t, "127.0.0.1:0")
	v4b := listenCounting(t, "127.0.0.2:0")
	v6 := listenCounting(t, "[::1]:0")
	targets := []struct {
		url     string
		ln      *countingListener
		network string
		addr    string
	}{
		{"http://127.0.0.1:" + v4.port() + "/hook", v4, "loopback", "127.0.0.1"},
		{"http://localhost:" + v4.port() + "/hook", v4, "loopback", "127.0.0.1"},
		{"http://0.0.0.0:" + v4.port() + "/hook", v4, "unspecified", "0.0.0.0"},
		{"http://[::ffff:127.0.0.1]:" + v4.port() + "/hook", v4, "loopback", "127.0.0.1"},
		{"https://127.0.0.1:" + v4.port() + "/hook", v4, "loopback", "127.0.0.1"},
		{"http://127.0.0.2:" + v4b.port() + "/hook", v4b, "loopback", "127.0.0.2"},
		{"http://[::1]:" + v6.port() + "/hook", v6, "loopback", "::1"},
	}
	guarded := newKit(t, httpkit.Options{Egress: &httpkit.Egress{}})
	for _, tc := range targets {
		t.Run(tc.url, func(t *testing.T) {
			is := is.New(t)
			before := tc.ln.settled(t)
			resp, obs := guarded.Do(ctxFor(t, 5*time.Second), httpkit.Request{Method: http.MethodPost, URL: tc.url, Body: []byte("{}")})
			t.Logf("%+v", obs)
			is.True(resp == nil)                                                           // no answer
			is.Equal(tc.ln.settled(t)-before, 0)                                           // no connection reached the listener
			is.Equal(obs.Outcome, delivery.OutcomeRejected)                                // a certain refusal, not to be retried
			is.True(strings.Contains(obs.Detail, "in a refused network ("+tc.network+")")) // naming the network
			is.True(strings.Contains(obs.Detail, tc.addr))                                 // and the address
		})
	}

	// Opted in, the same destinations are dialled (the listener answers nothing: IO_ERROR).
	opened := newKit(t, httpkit.Options{Egress: &httpkit.Egress{Allowed: httpkit.Loopback}})
	for _, tc := range targets {
		is := is.New(t)
		before := tc.ln.settled(t)
		_, obs := opened.Do(ctxFor(t, 5*time.Second), httpkit.Request{Method: http.MethodPost, URL: tc.url, Body: []byte("{}")})
		if tc.network == "unspecified" {
			is.Equal(obs.Outcome, delivery.OutcomeRejected) // 0.0.0.0 is not in 127.0.0.0/8: still refused
			is.Equal(tc.ln.settled(t)-before, 0)
			continue
		}
		is.True(obs.Outcome != delivery.OutcomeRejected) // not refused
		is.True(tc.ln.settled(t)-before >= 1)            // it connected
	}

	// Without the policy (the operator's own URLs) every one of them is dialled.
	plain := newKit(t, httpkit.Options{Proxy: func(*http.Request) (*url.URL, error) { return nil, nil }})
	for _, tc := range targets {
		is := is.New(t)
		before := tc.ln.settled(t)
		_, obs := plain.Do(ctxFor(t, 5*time.Second), httpkit.Request{Method: http.MethodPost, URL: tc.url, Body: []byte("{}")})
		is.True(obs.Outcome != delivery.OutcomeRejected)
		is.True(tc.ln.settled(t)-before >= 1) // the listener got it
	}
}

// TestEgressUsesNoProxy: a forward proxy would dial the user's destination itself, so a transport
// with the policy uses none, and refuses to be given one.
func TestEgressUsesNoProxy(t *testing.T) {
	is := is.New(t)
	t.Setenv("HTTP_PROXY", "http://127.0.0.1:9")
	t.Setenv("HTTPS_PROXY", "http://127.0.0.1:9")
	tr, err := httpkit.NewTransport(httpkit.Options{Egress: &httpkit.Egress{}})
	is.NoErr(err)
	is.True(tr.Proxy == nil) // the environment's proxy is not used
	_, err = httpkit.NewTransport(httpkit.Options{Egress: &httpkit.Egress{},
		Proxy: func(*http.Request) (*url.URL, error) { return nil, nil }})
	is.True(errors.Is(err, delivery.ErrInvalidInput)) // nor an explicit one
}
