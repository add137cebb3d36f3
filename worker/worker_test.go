package worker

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/matryer/is"
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
