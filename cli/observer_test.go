package cli

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
)

// A claim recovered after its commit's answer was lost is logged by the worker's wiring (it was
// reported to no one outside tests): a warning naming how many tasks and the lost answer's error, in
// the shape of the lost finish's line. The dispatcher and the loop share the one observer.
func TestWorkLogsARecoveredClaim(t *testing.T) {
	is := is.New(t)
	var buf bytes.Buffer
	var cfg workConfig
	cfg.observe(slog.New(slog.NewTextHandler(&buf, nil)).With("worker", "w1"), nil)
	is.Equal(cfg.loop.Observer, cfg.dispatcher.Observer) // one seam for both
	cfg.dispatcher.Observer.ClaimRecovered(3, errors.New("unexpected EOF"))
	line := strings.TrimSpace(buf.String())
	is.Equal(strings.Count(line, "\n"), 0)                                               // one line
	is.True(strings.Contains(line, "level=WARN"))                                        // as the lost finish's
	is.True(strings.Contains(line, "recovered by their tokens"))                         // says what happened
	is.True(strings.Contains(line, "tasks=3"))                                           // to how many
	is.True(strings.Contains(line, `error="unexpected EOF"`))                            // and why
	is.True(strings.Contains(line, "worker=w1"))                                         // which worker
	cfg.dispatcher.Observer.FinishRetried(service.FinishRetryEvent{Attempts: 2, Try: 1}) // a later retry: no line
	is.Equal(strings.TrimSpace(buf.String()), line)
}
