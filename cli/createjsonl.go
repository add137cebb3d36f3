package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/notifierhq/notifier/service"
)

// Bounds of create --jsonl.
const (
	// maxJSONLine bounds one input line: a body of the largest size, every character escaped, fits.
	maxJSONLine = 1 << 20
	// jsonlBatchBytes closes a batch early when its bodies reach this much, so that memory stays
	// bounded whatever the file holds.
	jsonlBatchBytes = 8 << 20
)

// jsonlEvent is one line of create --jsonl.
type jsonlEvent struct {
	User        string          `json:"user"`
	EventKey    string          `json:"event_key"`
	Body        *string         `json:"body"`
	TTL         json.RawMessage `json:"ttl"`          // "36h", or seconds
	MaxAttempts *int            `json:"max_attempts"` // default: --max-attempts
	Channels    *[]string       `json:"channels"`     // default: every enabled channel
	SendAt      *string         `json:"send_at"`      // RFC 3339; default: at once
	Fallback    *[]string       `json:"fallback"`     // an ordered chain (create --fallback); default: none
}

// jsonlResult is one line of create --jsonl's output: create's output and the input's line number, or
// why the line was refused.
type jsonlResult struct {
	Line int `json:"line"`
	*service.Created
	Error string `json:"error,omitempty"`
}

// jsonlStats counts what create --jsonl did.
type jsonlStats struct{ lines, created, duplicates, refused int }

// createJSONL submits the events of r, one JSON object per line, in batched transactions of up to batch
// events, and prints one result line per input line, in input order, once the line's batch committed
// (or at once, if the line was refused). A refused line costs only itself; any refused line makes the
// exit code 2. A database failure stops it, exit 1, with the results of committed batches printed: a
// rerun of the same input submits nothing twice.
func createJSONL(ctx context.Context, e *env, n *service.Notifier, r io.Reader, batch int, defaults service.CreateRequest) error {
	var (
		in         = bufio.NewReaderSize(r, maxJSONLine)
		out        = bufio.NewWriter(e.stdout)
		st         jsonlStats
		pending    []jsonlResult           // this batch's lines, in order; refused ones already decided
		reqs       []service.CreateRequest // the batch's valid events, in order
		batchBytes int                     // the bodies of reqs
	)
	progress := newProgress(e.stderr)
	flush := func() error {
		var created []service.Created
		if len(reqs) > 0 {
			dctx, cancel := e.dbContext(ctx)
			var err error
			created, err = n.CreateBatch(dctx, reqs)
			cancel()
			if err != nil {
				_ = out.Flush()
				return fmt.Errorf("create --jsonl: lines %d-%d not submitted (the results printed before are committed; running the same input again submits nothing twice): %w",
					pending[0].Line, pending[len(pending)-1].Line, err)
			}
		}
		j := 0
		for _, p := range pending {
			if p.Error == "" {
				p.Created = &created[j]
				j++
				if p.Created.Created {
					st.created++
				} else {
					st.duplicates++
				}
			}
			if err := writeJSONLine(out, p); err != nil {
				return err
			}
		}
		pending, reqs, batchBytes = pending[:0], reqs[:0], 0
		if err := out.Flush(); err != nil {
			return fmt.Errorf("write result: %w", err)
		}
		progress.show(st)
		return nil
	}
	for line := 1; ; line++ {
		raw, tooLong, err := readLine(in)
		if err == io.EOF && len(raw) == 0 && !tooLong {
			break
		}
		if err != nil && err != io.EOF {
			_ = flush()
			return fmt.Errorf("create --jsonl: read line %d: %w", line, err)
		}
		if !tooLong && len(bytes.TrimSpace(raw)) == 0 {
			if err == io.EOF {
				break
			}
			continue // a blank line: nothing to submit, nothing to say
		}
		st.lines++
		req, why := parseJSONLine(raw, tooLong, defaults)
		if why != "" {
			st.refused++
			pending = append(pending, jsonlResult{Line: line, Error: why})
		} else {
			pending = append(pending, jsonlResult{Line: line})
			reqs = append(reqs, req)
			batchBytes += len(req.Body)
		}
		if len(reqs) >= batch || batchBytes >= jsonlBatchBytes {
			if err := flush(); err != nil {
				return err
			}
		}
		if err == io.EOF {
			break
		}
	}
	if err := flush(); err != nil {
		return err
	}
	progress.done(st)
	if st.refused > 0 {
		return usagef("create --jsonl: %d of %d lines refused (their result lines say why); the other %d were submitted", st.refused, st.lines, st.lines-st.refused)
	}
	return nil
}

// readLine reads one line without its newline. A line longer than the reader's buffer is skipped to
// its end and reported tooLong, with no bytes.
func readLine(in *bufio.Reader) (line []byte, tooLong bool, err error) {
	line, err = in.ReadSlice('\n')
	for errors.Is(err, bufio.ErrBufferFull) {
		tooLong, line = true, nil
		_, err = in.ReadSlice('\n')
	}
	if tooLong {
		line = nil
	}
	return bytes.TrimSuffix(line, []byte("\n")), tooLong, err
}

// parseJSONLine reads one event, or says why the line is refused.
func parseJSONLine(raw []byte, tooLong bool, defaults service.CreateRequest) (service.CreateRequest, string) {
	if tooLong {
		return service.CreateRequest{}, fmt.Sprintf("line longer than %d bytes", maxJSONLine)
	}
	var ev jsonlEvent
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ev); err != nil {
		return service.CreateRequest{}, "not a JSON event: " + err.Error()
	}
	if dec.More() {
		return service.CreateRequest{}, "more than one JSON value on the line"
	}
	req := defaults
	req.UserID, req.EventKey = ev.User, ev.EventKey
	if ev.Body == nil {
		return req, `"body" is required`
	}
	req.Body = *ev.Body
	if len(ev.TTL) > 0 {
		ttl, err := parseTTL(ev.TTL)
		if err != nil {
			return req, err.Error()
		}
		req.TTL = ttl
	}
	if ev.MaxAttempts != nil {
		req.MaxAttempts = *ev.MaxAttempts
	}
	if ev.Channels != nil {
		if len(*ev.Channels) == 0 {
			return req, `"channels" is empty: name at least one channel, or leave it out for every enabled channel`
		}
		req.Channels = *ev.Channels
	}
	if ev.SendAt != nil {
		t, err := parseSendAt(*ev.SendAt)
		if err != nil {
			return req, `"send_at": ` + err.Error()
		}
		req.SendAt = t
	}
	if ev.Fallback != nil {
		if len(*ev.Fallback) == 0 {
			return req, `"fallback" is empty: name the chain's channels, or leave it out`
		}
		req.Fallback = *ev.Fallback
	}
	if err := req.Validate(); err != nil {
		return req, err.Error()
	}
	return req, ""
}

// parseTTL reads "36h" (a Go duration) or a number of seconds.
func parseTTL(raw json.RawMessage) (time.Duration, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf(`invalid ttl %q: want a duration such as "36h" or a number of seconds`, s)
		}
		return d, nil
	}
	secs, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || secs > float64(service.MaxTTL/time.Second) {
		return 0, fmt.Errorf(`invalid ttl %s: want a duration such as "36h" or a number of seconds`, raw)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

func writeJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	return nil
}

// progress shows create --jsonl's counts on stderr, when stderr is a terminal, at most a few times a
// second.
type progress struct {
	w    io.Writer
	last time.Time
}

func newProgress(stderr io.Writer) *progress {
	if f, ok := stderr.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			return &progress{w: stderr}
		}
	}
	return &progress{}
}

func (p *progress) show(st jsonlStats) {
	if p.w == nil || time.Since(p.last) < 250*time.Millisecond {
		return
	}
	p.last = time.Now()
	fmt.Fprintf(p.w, "\r%d lines: %d created, %d duplicates, %d refused", st.lines, st.created, st.duplicates, st.refused)
}

func (p *progress) done(st jsonlStats) {
	if p.w == nil {
		return
	}
	p.last = time.Time{}
	p.show(st)
	fmt.Fprintln(p.w)
}
