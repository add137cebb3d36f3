package fakes

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// providerServer is the HTTP server under a provider's fake (Postmark, Resend, SES, Twilio): it
// listens, counts connections, and closes once, releasing scripted hangs (done) first. Each fake
// embeds it and serves its own API.
type providerServer struct {
	url       string
	srv       *http.Server
	done      chan struct{} // closed by Close: a scripted hang returns
	closeOnce sync.Once
	conns     ConnCounter
}

// start serves handler on l.
func (p *providerServer) start(l net.Listener, handler http.HandlerFunc) {
	p.url = "http://" + l.Addr().String()
	p.done = make(chan struct{})
	p.srv = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, ConnState: p.conns.ConnState}
	go func() { _ = p.srv.Serve(l) }()
}

// URL is the base URL (the channels file's base_url or endpoint).
func (p *providerServer) URL() string { return p.url }

// Conns counts the TCP connections the fake accepted.
func (p *providerServer) Conns() int { return p.conns.Count() }

// Close stops the server, releasing scripted hangs first. Idempotent.
func (p *providerServer) Close() {
	p.closeOnce.Do(func() {
		close(p.done)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.srv.Shutdown(ctx); err != nil {
			_ = p.srv.Close()
		}
	})
}
