package fakes

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// scriptRequest is the body of POST /control/{kind}/script.
type scriptRequest struct {
	Ref    string     `json:"ref"`    // "" scripts the shared default queue
	Target string     `json:"target"` // "send" (default when empty) or "query"
	Steps  []stepJSON `json:"steps"`
}

// stepJSON is Step on the wire, with durations in milliseconds.
type stepJSON struct {
	Status     int    `json:"status"`
	RetryAfter string `json:"retry_after"`
	DelayMS    int64  `json:"delay_ms"`
	Hang       bool   `json:"hang"`
	Malformed  bool   `json:"malformed"`
	SlowBodyMS int64  `json:"slow_body_ms"`
	Drop       bool   `json:"drop"`
}

type scriptReply struct {
	Kind   Kind   `json:"kind"`
	Ref    string `json:"ref"`
	Target string `json:"target"`
	Queued int    `json:"queued"`
}

// ControlHandler lets another process script and read the given fakes over
// HTTP, so a worker running in its own process can be tested against a fake
// served by the `notifier fake` command:
//
//	POST /control/{kind}/script  {"ref":"task-1","target":"send"|"query","steps":[{"status":503,"delay_ms":1200,...}]}
//
// A step's fields: status, retry_after, delay_ms, hang, malformed,
// slow_body_ms and drop (accept, then close the connection without an
// answer), as in Step.
//
//	GET  /control/{kind}/counts  -> Counts
//	GET  /control/counts         -> {"push":Counts,"sms":Counts,"none":Counts} (the kinds given)
//
// Bad JSON, an unknown kind or target, or a bad step answer 400 with a JSON
// error. Nil channels are ignored; for a repeated kind the last one wins.
func ControlHandler(channels ...*Channel) http.Handler {
	byKind := map[Kind]*Channel{}
	for _, c := range channels {
		if c != nil {
			byKind[c.kind] = c
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		serveControl(byKind, w, r)
	})
}

func serveControl(byKind map[Kind]*Channel, w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) == 2 && parts[0] == "control" && parts[1] == "counts":
		if requireMethod(w, r, http.MethodGet) {
			allCounts(byKind, w)
		}
	case len(parts) == 3 && parts[0] == "control" && (parts[2] == "script" || parts[2] == "counts"):
		c, ok := byKind[Kind(parts[1])]
		if !ok {
			writeJSON(w, http.StatusBadRequest, errorReply{Error: fmt.Sprintf("unknown channel kind %q (served: %s)", parts[1], servedKinds(byKind))})
			return
		}
		if parts[2] == "counts" {
			if requireMethod(w, r, http.MethodGet) {
				writeJSON(w, http.StatusOK, c.Snapshot())
			}
			return
		}
		if requireMethod(w, r, http.MethodPost) {
			script(c, w, r)
		}
	default:
		writeJSON(w, http.StatusNotFound, errorReply{Error: "unknown path " + r.URL.Path})
	}
}

// script queues the posted steps on c.
func script(c *Channel, w http.ResponseWriter, r *http.Request) {
	var req scriptRequest
	if status, err := decodeJSON(w, r, &req, true); err != nil {
		writeJSON(w, status, errorReply{Error: err.Error()})
		return
	}
	steps, err := req.steps()
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorReply{Error: err.Error()})
		return
	}
	switch req.Target {
	case "", "send":
		req.Target = "send"
		c.ScriptSend(req.Ref, steps...)
	case "query":
		c.ScriptQuery(req.Ref, steps...)
	default:
		writeJSON(w, http.StatusBadRequest, errorReply{Error: fmt.Sprintf("unknown target %q (want \"send\" or \"query\")", req.Target)})
		return
	}
	writeJSON(w, http.StatusOK, scriptReply{Kind: c.kind, Ref: req.Ref, Target: req.Target, Queued: len(steps)})
}

// steps validates and converts the wire steps.
func (req scriptRequest) steps() ([]Step, error) {
	if len(req.Steps) == 0 {
		return nil, fmt.Errorf("steps is required (at least one step)")
	}
	steps := make([]Step, 0, len(req.Steps))
	for i, s := range req.Steps {
		if s.Status != 0 && (s.Status < 100 || s.Status > 599) {
			return nil, fmt.Errorf("steps[%d]: status %d is not an HTTP status", i, s.Status)
		}
		if s.DelayMS < 0 || s.SlowBodyMS < 0 {
			return nil, fmt.Errorf("steps[%d]: delay_ms and slow_body_ms must not be negative", i)
		}
		if s.Drop && (s.Status != 0 || s.Hang || s.Malformed || s.SlowBodyMS != 0) {
			return nil, fmt.Errorf("steps[%d]: drop answers nothing: it excludes status, hang, malformed and slow_body_ms", i)
		}
		steps = append(steps, Step{
			Status:     s.Status,
			RetryAfter: s.RetryAfter,
			Delay:      time.Duration(s.DelayMS) * time.Millisecond,
			Hang:       s.Hang,
			Malformed:  s.Malformed,
			SlowBody:   time.Duration(s.SlowBodyMS) * time.Millisecond,
			Drop:       s.Drop,
		})
	}
	return steps, nil
}

func allCounts(byKind map[Kind]*Channel, w http.ResponseWriter) {
	out := make(map[Kind]Counts, len(byKind))
	for k, c := range byKind {
		out[k] = c.Snapshot()
	}
	writeJSON(w, http.StatusOK, out)
}

func servedKinds(byKind map[Kind]*Channel) string {
	var names []string
	for _, k := range []Kind{Push, SMS, None} {
		if _, ok := byKind[k]; ok {
			names = append(names, string(k))
		}
	}
	return strings.Join(names, ", ")
}

// requireMethod answers 405 and reports false unless r uses method.
func requireMethod(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method {
		return true
	}
	methodNotAllowed(w, method)
	return false
}
