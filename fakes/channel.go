// Package fakes provides test doubles of the external notification channels
// (push, sms, none) as real HTTP servers.
//
// The fakes exist so the service's hardest case, "the request went out and no
// answer came back", can be reproduced on demand: a fake records the
// acceptance of a message first and only then delays, hangs, garbles its
// answer or drops the connection without one, exactly as scripted by the test. Counts of sends, new outbound
// messages and queries let a test prove how many messages the user would
// really have received.
//
// Wire protocol (shared with the service's channel client):
//
//	POST {base}/send               {"ref":"<ref>","to":"...","body":"..."}, header Idempotency-Key: ntf-<ref>
//	                               -> 200 {"id":"<provider id>","replayed":<bool>}
//	GET  {base}/messages?ref=<ref> -> 200 {"found":<n>,"id":"<first provider id or empty>"} (sms only, 405 elsewhere)
package fakes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"
)

// Kind names a channel and thereby its delivery contract.
type Kind string

// The three channel kinds, one per retry strategy of the service.
const (
	// Push is IDEMPOTENT: a repeated Idempotency-Key is answered with the
	// original message id and creates no new outbound message.
	Push Kind = "push"
	// SMS is QUERYABLE: every accepted send is a new outbound message, but
	// GET /messages?ref= tells how many were accepted for a reference.
	SMS Kind = "sms"
	// None offers neither: every accepted send is a new outbound message and
	// there is no way to ask what happened.
	None Kind = "none"
)

// ErrClosed is returned by WaitOutbound when the channel is closed before
// the awaited count is reached, so a waiter never blocks forever.
var ErrClosed = errors.New("fakes: channel closed")

// Step scripts the answer to one request. The zero Step means: accept at once.
type Step struct {
	// Status, when non-zero, is answered before acceptance is recorded
	// (503, 400, 409, 429...), so it never creates an outbound message.
	Status int
	// RetryAfter is the value of the Retry-After header sent with Status.
	RetryAfter string
	// Delay is waited after acceptance is recorded and before answering, so
	// a client with a shorter timeout gives up on an accepted message.
	Delay time.Duration
	// Hang, after acceptance is recorded, never answers until the client
	// goes away or the channel is closed.
	Hang bool
	// Malformed, after acceptance is recorded, answers 200 with a body that
	// is not valid JSON.
	Malformed bool
	// SlowBody, after acceptance is recorded, sends the headers and the
	// first byte at once and dribbles the rest of the body over this span.
	SlowBody time.Duration
	// Drop, after acceptance is recorded (and after Delay), closes the TCP
	// connection without writing any answer: the provider took the message
	// and the connection broke before the client heard so. On a kept-alive
	// connection this is the case a client must not "retry" behind the
	// caller's back. HTTP/2 (should a fake ever serve it) cannot close one
	// request's connection: there the stream is aborted. Drop takes the place
	// of any answer, so Malformed and SlowBody do not apply; for a query the
	// query is counted and then the connection dropped.
	Drop bool
}

// Message is one new outbound message a fake accepted: what the user would have received. A replay
// (push: a key seen before) is not one; it answers with the message first accepted under that key.
type Message struct {
	ID   string `json:"id"`
	Ref  string `json:"ref"`
	Key  string `json:"key,omitempty"` // the Idempotency-Key it came with
	To   string `json:"to"`
	Body string `json:"body"`
}

// Counts is a copy of a channel's per-reference counters.
type Counts struct {
	Sends     map[string]int `json:"sends"`
	Outbound  map[string]int `json:"outbound"`
	Queries   map[string]int `json:"queries"`
	Throttled map[string]int `json:"throttled"` // sends answered 429 by the rate limit (SetRateLimit)
}

// Channel is one running fake channel. All methods are safe for concurrent use.
type Channel struct {
	kind      Kind
	url       string
	srv       *http.Server
	done      chan struct{} // closed by Close: releases hanging handlers and waiters
	closeOnce sync.Once

	mu       sync.Mutex
	sendQ    queues
	queryQ   queues
	sends    map[string]int
	outbound map[string]int
	queries  map[string]int
	firstID  map[string]string    // ref -> provider id of its first accepted message
	messages map[string][]Message // ref -> the new outbound messages accepted under it, in order
	byKey    map[string]string    // Idempotency-Key -> provider id (push only)
	seq      int
	changed  chan struct{} // closed and replaced whenever an outbound is recorded

	now        func() time.Time // the fake's clock (SetClock): time.Now unless a test moves it
	limit      *bucket          // the provider's rate limit (SetRateLimit); nil: none
	throttled  map[string]int   // sends answered 429 by limit, per ref
	acceptedAt []time.Time      // when each new outbound message was accepted, in order

	conns ConnCounter // TCP connections accepted

	credential string // the bearer token every request must carry (SetCredential); "": none checked
	refused    int    // requests answered 401 for their credential
}

// SetCredential makes the fake require "Authorization: Bearer <token>" on every request, as a channel
// endpoint that authenticates its callers does; a request without it is answered 401 before anything
// else is read or recorded. A test rotates the credential by setting another token, and restores it by
// setting ours again. "" turns the check off (the default).
func (c *Channel) SetCredential(token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.credential = token
}

// RefusedCredential counts the requests answered 401 for their credential.
func (c *Channel) RefusedCredential() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refused
}

// authorized answers 401 to a request without the credential (SetCredential), else serves it.
func (c *Channel) authorized(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	want := c.credential
	ok := want == "" || r.Header.Get("Authorization") == "Bearer "+want
	if !ok {
		c.refused++
	}
	c.mu.Unlock()
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		writeJSON(w, http.StatusUnauthorized, errorReply{Error: "invalid or missing credential"})
		return
	}
	c.serveHTTP(w, r)
}

// queues holds scripted steps: one queue per ref plus a shared default, and a generator for when both
// are empty.
type queues struct {
	byRef    map[string][]Step
	all      []Step
	fallback func() Step
}

// push appends steps for ref; ref "" means the shared default queue.
func (q *queues) push(ref string, steps []Step) {
	if ref == "" {
		q.all = append(q.all, steps...)
		return
	}
	q.byRef[ref] = append(q.byRef[ref], steps...)
}

// pop takes the next step for ref: its own queue first, then the shared
// default, then the zero Step (accept at once).
func (q *queues) pop(ref string) Step {
	if own := q.byRef[ref]; len(own) > 0 {
		if len(own) == 1 {
			delete(q.byRef, ref)
		} else {
			q.byRef[ref] = own[1:]
		}
		return own[0]
	}
	if len(q.all) > 0 {
		s := q.all[0]
		q.all = q.all[1:]
		return s
	}
	if q.fallback != nil {
		return q.fallback()
	}
	return Step{}
}

// Start starts a fake of the given kind on 127.0.0.1 with a free port.
// It panics on failure, like httptest.NewServer, because tests cannot go on.
func Start(kind Kind) *Channel {
	c, err := StartOn(kind, "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	return c
}

// StartOn starts a fake of the given kind on addr, so a separate process (the
// `notifier fake` command) can serve it on a known port.
func StartOn(kind Kind, addr string) (*Channel, error) {
	if !kind.valid() {
		return nil, fmt.Errorf("fakes: unknown channel kind %q", kind)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fakes: listen %s: %w", addr, err)
	}
	c := newChannel(kind)
	c.url = "http://" + l.Addr().String()
	c.srv = &http.Server{Handler: http.HandlerFunc(c.authorized), ReadHeaderTimeout: 10 * time.Second,
		ConnState: c.conns.ConnState}
	go func() { _ = c.srv.Serve(l) }()
	return c, nil
}

func newChannel(kind Kind) *Channel {
	return &Channel{
		kind:      kind,
		done:      make(chan struct{}),
		sendQ:     queues{byRef: map[string][]Step{}},
		queryQ:    queues{byRef: map[string][]Step{}},
		sends:     map[string]int{},
		outbound:  map[string]int{},
		queries:   map[string]int{},
		firstID:   map[string]string{},
		messages:  map[string][]Message{},
		byKey:     map[string]string{},
		changed:   make(chan struct{}),
		throttled: map[string]int{},
		now:       time.Now,
	}
}

func (k Kind) valid() bool { return k == Push || k == SMS || k == None }

// Kind reports which contract this fake implements.
func (c *Channel) Kind() Kind { return c.kind }

// URL is the base URL the service's channel client is configured with.
func (c *Channel) URL() string { return c.url }

// Close stops the server. Hanging or delayed handlers are released first
// (their connections are aborted), so Close never waits on a scripted hang.
// Close is idempotent.
func (c *Channel) Close() {
	c.closeOnce.Do(func() {
		close(c.done)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.srv.Shutdown(ctx); err != nil {
			_ = c.srv.Close()
		}
	})
}

// ScriptSend appends steps consumed one per POST /send for ref. When ref's
// queue is empty the shared ScriptAll queue applies, then "accept at once".
// ref "" is the same as ScriptAll.
func (c *Channel) ScriptSend(ref string, steps ...Step) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sendQ.push(ref, steps)
}

// ScriptQuery appends steps consumed one per GET /messages for ref. Status
// is what matters (e.g. 503 for a failed query); Delay, Hang, Malformed and
// SlowBody are honoured too. ref "" scripts a shared default query queue.
func (c *Channel) ScriptQuery(ref string, steps ...Step) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queryQ.push(ref, steps)
}

// ScriptAll appends steps to the shared send queue used, in order, by any
// ref whose own queue is empty.
func (c *Channel) ScriptAll(steps ...Step) { c.ScriptSend("", steps...) }

// SetFallback makes send and query draw a step from a generator once every scripted queue is empty
// (fault injection for soak tests); nil restores "accept at once". The generators are called with the
// channel's lock held: they must be quick and must not call the channel.
func (c *Channel) SetFallback(send, query func() Step) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sendQ.fallback, c.queryQ.fallback = send, query
}

// SetRateLimit makes the channel enforce a provider's rate limit of perSecond sends a second, as a token
// bucket holding one second's worth (at least one), full now: a send that finds no token is answered
// 429 with Retry-After (whole seconds until the next token) before anything else happens: it takes no
// scripted step, records no acceptance and is counted by Throttled. Only sends are limited. 0 or less
// removes the limit.
func (c *Channel) SetRateLimit(perSecond float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if perSecond <= 0 {
		c.limit = nil
		return
	}
	burst := max(1, perSecond)
	c.limit = &bucket{perSecond: perSecond, burst: burst, tokens: burst, at: c.now()}
}

// SetClock replaces the fake's clock, which refills the rate limit's bucket (SetRateLimit) and stamps
// AcceptedAt, so a test can move time on instead of sleeping.
func (c *Channel) SetClock(now func() time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = now
}

// bucket is a token bucket on the fake's own clock.
type bucket struct {
	perSecond, burst, tokens float64
	at                       time.Time
}

// take takes a token if there is one; otherwise it returns how long until there is.
func (b *bucket) take(now time.Time) (ok bool, wait time.Duration) {
	b.tokens = min(b.burst, b.tokens+b.perSecond*now.Sub(b.at).Seconds())
	b.at = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / b.perSecond * float64(time.Second))
}

// Throttled counts the sends for ref that the rate limit answered 429.
func (c *Channel) Throttled(ref string) int { return c.count(c.throttled, ref) }

// TotalThrottled is Throttled summed over all refs.
func (c *Channel) TotalThrottled() int { return c.total(c.throttled) }

// AcceptedAt lists when each new outbound message was accepted (replays not included), in order, on
// the fake's clock: the rate a channel really received.
func (c *Channel) AcceptedAt() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.acceptedAt...)
}

// Sends counts POST /send requests for ref, whatever their outcome.
func (c *Channel) Sends(ref string) int { return c.count(c.sends, ref) }

// Outbound counts new messages accepted for ref; replays do not count. This
// is how many messages the user would receive.
func (c *Channel) Outbound(ref string) int { return c.count(c.outbound, ref) }

// Queries counts GET /messages requests for ref, whatever their outcome.
func (c *Channel) Queries(ref string) int { return c.count(c.queries, ref) }

// TotalSends is Sends summed over all refs.
func (c *Channel) TotalSends() int { return c.total(c.sends) }

// TotalOutbound is Outbound summed over all refs.
func (c *Channel) TotalOutbound() int { return c.total(c.outbound) }

// MaxOutboundPerRef is the most new messages accepted for any one ref (0 before any): above 1, some
// ref's message went out more than once.
func (c *Channel) MaxOutboundPerRef() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.outbound {
		n = max(n, v)
	}
	return n
}

// Conns counts the TCP connections the fake has accepted, so a test can tell
// whether a request came on a kept-alive (reused) connection.
func (c *Channel) Conns() int { return c.conns.Count() }

// TotalQueries is Queries summed over all refs.
func (c *Channel) TotalQueries() int { return c.total(c.queries) }

func (c *Channel) count(m map[string]int, ref string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return m[ref]
}

func (c *Channel) total(m map[string]int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// Messages returns the new outbound messages accepted under ref, in order: a test can check whose
// message a channel holds under a reference (after a restore or a failover, ids are handed out again).
func (c *Channel) Messages(ref string) []Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Message(nil), c.messages[ref]...)
}

// AcceptedRefs lists, sorted, the refs with at least one outbound message.
func (c *Channel) AcceptedRefs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	refs := make([]string, 0, len(c.outbound))
	for ref, n := range c.outbound {
		if n > 0 {
			refs = append(refs, ref)
		}
	}
	sort.Strings(refs)
	return refs
}

// WaitOutbound blocks until Outbound(ref) >= n, so a test can act exactly
// after a hanging or delayed send was accepted. It returns ctx.Err() when
// ctx ends first and ErrClosed when the channel is closed first.
func (c *Channel) WaitOutbound(ctx context.Context, ref string, n int) error {
	for {
		c.mu.Lock()
		reached, changed := c.outbound[ref] >= n, c.changed
		c.mu.Unlock()
		if reached {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-c.done:
			return ErrClosed
		}
	}
}

// Snapshot copies all counters at one instant.
func (c *Channel) Snapshot() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Counts{Sends: copyMap(c.sends), Outbound: copyMap(c.outbound), Queries: copyMap(c.queries),
		Throttled: copyMap(c.throttled)}
}

func copyMap(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
