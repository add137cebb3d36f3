package worker

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
)

// An outage is logged once when it starts and once when it ends, however many retries it takes.
func TestHealthLogsStateChangesOnly(t *testing.T) {
	is := is.New(t)
	var buf bytes.Buffer
	h := &dbHealth{log: slog.New(slog.NewTextHandler(&buf, nil))}
	h.ok() // healthy: nothing to say
	for range 50 {
		h.failed(errors.New("connection refused"))
	}
	h.ok()
	h.ok()
	h.failed(errors.New("again"))
	log := buf.String()
	is.Equal(strings.Count(log, "cycles failing"), 2)    // one line per outage, not per retry
	is.Equal(strings.Count(log, "cycles recovered"), 1)  // one line when it ends
	is.True(strings.Contains(log, "connection refused")) // the first error says why
}

func TestPrefix(t *testing.T) {
	is := is.New(t)
	is.Equal(prefix("0123456789abcdef"), "01234567") // tokens are logged by their first 8 characters
	is.Equal(prefix("abc"), "abc")
}

// An unrecorded finish is logged as an error that says how the task recovers, not as a RESULT.
func TestUnrecordedFinishIsLoggedAsAnError(t *testing.T) {
	is := is.New(t)
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	logFinished(log, []service.Result{
		{Kind: service.ResultSent, TaskID: 1},
		{Kind: service.ResultUnrecorded, TaskID: 2, Detail: "finish: ERROR: refused (SQLSTATE 23514)"},
	})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	is.Equal(len(lines), 2)                                          // one line per task
	is.True(strings.Contains(lines[0], "msg=RESULT"))                // the recorded one as a RESULT
	is.True(strings.Contains(lines[1], "level=ERROR"))               // the unrecorded one as an error
	is.True(strings.Contains(lines[1], "recovered after its lease")) // saying what happens next
	is.True(strings.Contains(lines[1], "SQLSTATE 23514"))            // and why
}
