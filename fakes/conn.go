package fakes

import (
	"io"
	"net"
	"net/http"
	"sync/atomic"
)

// Drop closes the request's connection without a byte of answer: a server that
// took the request and then broke. The request body is read to its end first,
// so the close is an orderly FIN after a request the server took whole (unread
// data would make it a reset). Over HTTP/2, which cannot hand its connection
// over, it resets the request's stream instead (it panics http.ErrAbortHandler,
// so call it last in a handler).
func Drop(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// HTTP/2 cannot hand its connection over; aborting the handler resets
		// this request's stream, which is what a drop is to one request there.
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

// ConnCounter counts the TCP connections a server accepts, so a test can tell
// a kept-alive connection from a new one. Assign its ConnState method to
// http.Server.ConnState. The zero value is ready; safe for concurrent use.
type ConnCounter struct {
	n atomic.Int64
}

// ConnState counts each new connection (http.StateNew).
func (c *ConnCounter) ConnState(_ net.Conn, state http.ConnState) {
	if state == http.StateNew {
		c.n.Add(1)
	}
}

// Count is the number of connections accepted so far.
func (c *ConnCounter) Count() int { return int(c.n.Load()) }
