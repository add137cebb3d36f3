package fakes

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// maxBody bounds request bodies read by the fakes and the control API.
const maxBody = 1 << 20

type sendRequest struct {
	Ref  string `json:"ref"`
	To   string `json:"to"`
	Body string `json:"body"`
}

type sendReply struct {
	ID       string `json:"id"`
	Replayed bool   `json:"replayed"`
}

type queryReply struct {
	Found int    `json:"found"`
	ID    string `json:"id"`
}

type errorReply struct {
	Error string `json:"error"`
}

// serveHTTP routes the channel protocol: POST /send and GET /messages.
func (c *Channel) serveHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/send":
		if r.Method != http.MethodPost {
			methodNotAllowed(w, http.MethodPost)
			return
		}
		c.handleSend(w, r)
	case "/messages":
		c.handleQuery(w, r)
	default:
		writeJSON(w, http.StatusNotFound, errorReply{Error: "unknown path " + r.URL.Path})
	}
}

// handleSend counts the request, applies the next scripted step and, unless
// the step answers a status first, records acceptance before answering.
func (c *Channel) handleSend(w http.ResponseWriter, r *http.Request) {
	var req sendRequest
	if status, err := decodeJSON(w, r, &req, false); err != nil {
		writeJSON(w, status, errorReply{Error: err.Error()})
		return
	}
	if req.Ref == "" {
		writeJSON(w, http.StatusBadRequest, errorReply{Error: "ref is required"})
		return
	}
	c.mu.Lock()
	c.sends[req.Ref]++
	if c.limit != nil {
		if ok, wait := c.limit.take(c.now()); !ok {
			c.throttled[req.Ref]++
			c.mu.Unlock()
			secs := int64(math.Ceil(wait.Seconds()))
			writeStatus(w, Step{Status: http.StatusTooManyRequests, RetryAfter: strconv.FormatInt(max(1, secs), 10)})
			return
		}
	}
	step := c.sendQ.pop(req.Ref)
	if step.Status != 0 {
		c.mu.Unlock()
		writeStatus(w, step)
		return
	}
	reply := c.accept(req, r.Header.Get("Idempotency-Key"))
	c.mu.Unlock()
	c.finish(w, r, step, reply)
}

// accept records one accepted send and returns the answer for it. A push
// request whose Idempotency-Key was seen before is a replay: same id, no new
// outbound. Callers hold c.mu.
func (c *Channel) accept(req sendRequest, key string) sendReply {
	ref := req.Ref
	if c.kind == Push && key != "" {
		if id, ok := c.byKey[key]; ok {
			return sendReply{ID: id, Replayed: true}
		}
	}
	c.seq++
	id := fmt.Sprintf("%s-msg-%04d", c.kind, c.seq)
	if c.kind == Push && key != "" {
		c.byKey[key] = id
	}
	if _, ok := c.firstID[ref]; !ok {
		c.firstID[ref] = id
	}
	c.outbound[ref]++
	c.messages[ref] = append(c.messages[ref], Message{ID: id, Ref: ref, Key: key, To: req.To, Body: req.Body})
	c.acceptedAt = append(c.acceptedAt, c.now())
	close(c.changed)
	c.changed = make(chan struct{})
	return sendReply{ID: id}
}

// handleQuery answers how many messages were accepted for a ref; only the
// QUERYABLE kind offers it, the others answer 405 (but the call is counted,
// so a test can prove the service never asked).
func (c *Channel) handleQuery(w http.ResponseWriter, r *http.Request) {
	ref := r.URL.Query().Get("ref")
	if r.Method == http.MethodGet && ref != "" {
		c.mu.Lock()
		c.queries[ref]++
		c.mu.Unlock()
	}
	if c.kind != SMS {
		writeJSON(w, http.StatusMethodNotAllowed, errorReply{Error: "query not offered by " + string(c.kind) + " channel"})
		return
	}
	if r.Method != http.MethodGet {
		methodNotAllowed(w, http.MethodGet)
		return
	}
	if ref == "" {
		writeJSON(w, http.StatusBadRequest, errorReply{Error: "ref is required"})
		return
	}
	c.mu.Lock()
	step := c.queryQ.pop(ref)
	reply := queryReply{Found: c.outbound[ref], ID: c.firstID[ref]}
	c.mu.Unlock()
	if step.Status != 0 {
		writeStatus(w, step)
		return
	}
	c.finish(w, r, step, reply)
}

// finish answers an accepted request as the step scripts it. It must be
// called without c.mu held: it may sleep. When the client goes away or the
// channel closes mid-way the response is aborted, so the client sees a
// broken connection rather than an empty 200.
func (c *Channel) finish(w http.ResponseWriter, r *http.Request, step Step, reply any) {
	if step.Delay > 0 {
		c.sleep(r, step.Delay)
	}
	if step.Hang {
		c.sleep(r, -1)
	}
	if step.Drop {
		Drop(w, r)
		return
	}
	body, err := json.Marshal(reply)
	if err != nil {
		panic(err) // our own reply types always marshal
	}
	if step.Malformed {
		body = body[:len(body)/2]
	}
	w.Header().Set("Content-Type", "application/json")
	if step.SlowBody <= 0 {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body)
		return
	}
	c.dribble(w, r, body, step.SlowBody)
}

// dribble sends the first byte at once and the rest one byte at a time,
// spread over span.
func (c *Channel) dribble(w http.ResponseWriter, r *http.Request, body []byte, span time.Duration) {
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	gap := span / time.Duration(max(len(body)-1, 1))
	for i := range body {
		if i > 0 {
			c.sleep(r, gap)
		}
		if _, err := w.Write(body[i : i+1]); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
}

// sleep waits d (forever when d < 0). If the client goes away or the channel
// closes first, the handler is aborted with http.ErrAbortHandler.
func (c *Channel) sleep(r *http.Request, d time.Duration) {
	var expired <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-expired:
	case <-r.Context().Done():
		panic(http.ErrAbortHandler)
	case <-c.done:
		panic(http.ErrAbortHandler)
	}
}

// writeStatus answers a scripted status step with a short JSON error.
func writeStatus(w http.ResponseWriter, step Step) {
	if step.RetryAfter != "" {
		w.Header().Set("Retry-After", step.RetryAfter)
	}
	writeJSON(w, step.Status, errorReply{Error: fmt.Sprintf("scripted status %d", step.Status)})
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeJSON(w, http.StatusMethodNotAllowed, errorReply{Error: "method not allowed, use " + allow})
}

// decodeJSON reads at most maxBody bytes of JSON into v; strict rejects
// unknown fields (so a typo in a script is an error, not a silent no-op).
// On failure it returns the status to answer with.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any, strict bool) (int, error) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return http.StatusRequestEntityTooLarge, fmt.Errorf("body larger than %d bytes", maxBody)
		}
		return http.StatusBadRequest, fmt.Errorf("malformed JSON: %w", err)
	}
	return 0, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
