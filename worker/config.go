package worker

import (
	"log/slog"
	"time"

	"github.com/notifierhq/notifier/service"
)

// Defaults of Config, sized for channels that answer in 50-500 ms: a window of 1024 calls allows up
// to ~7,400 deliveries/s at a 100 ms median with a long tail (a mean call of 138 ms), about what one
// database of modest size records; it costs little when answers come at once. Claims of up to 256
// keep claim round trips few at that rate. An answer waits up to 20 ms for others to share its
// finish: at 100 ms answers that makes groups of about 100 in place of 25, and the database's CPU per
// delivery about a fifth less; River holds its completions up to 50-250 ms. Such a wait is a small
// part of a call's 50-500 ms, in which a crash leaves the task uncertain anyway (docs/benchmarks.md
// has the measurements).
const (
	DefaultMaxInFlight = 1024
	DefaultBatch       = 256
	DefaultFinishBatch = 128
	DefaultFinishers   = 2
	DefaultFinishDelay = 20 * time.Millisecond
	DefaultPoll        = 200 * time.Millisecond
	DefaultMaxBackoff  = 10 * time.Second
	// DefaultReadOnlyGrace outlasts a failover that leaves a connection on the demoted primary, or a
	// DNS name moving to the new one, and is short enough that a worker pointed at a standby stops
	// (and says why) instead of delivering nothing forever.
	DefaultReadOnlyGrace = time.Minute
)

// Bounds of Config that the command lines accept (`notifier work` and the load bench).
const (
	// MaxInFlightLimit bounds MaxInFlight: each call in flight is a goroutine and an open HTTP request.
	MaxInFlightLimit = 100_000
	// MaxFinishersLimit bounds Finishers: each finish at once holds a database connection.
	MaxFinishersLimit = 64
)

// Config of a worker loop. Zero fields take the defaults above.
type Config struct {
	// MaxInFlight bounds the calls in flight: the window. Each call has its own lease; answers waiting
	// to be recorded do not take room in it, but while as many wait as the window holds, no claim is
	// made (the database is behind). A crash leaves at most twice this many tasks uncertain.
	MaxInFlight int
	// Batch is the most tasks one claim takes; a claim never takes more than the room in the window, and
	// waits until that room is worth a claim (an eighth of the window, or Batch) unless nothing is in
	// flight.
	Batch int
	// FinishBatch is the most answers one finish records. Answers that arrive while a finish runs are
	// recorded together by the next one (group commit): no answer waits for another call.
	FinishBatch int
	// FinishDelay is how long an answer may wait for others to share its finish while more calls are in
	// flight (never when none is: a lone answer is recorded at once).
	FinishDelay time.Duration
	// Finishers is how many finish statements may run at once.
	Finishers  int
	Poll       time.Duration // wait after a claim found nothing to do
	MaxBackoff time.Duration // longest wait between claims while the database fails
	// ReadOnlyGrace is how long claims may keep meeting a read-only server (a standby: service.
	// ErrReadOnly) before Run stops and returns that error. Each such claim has the dispatcher reconnect,
	// which after a failover finds the new primary (with target_session_attrs=read-write).
	ReadOnlyGrace time.Duration
	Logger        *slog.Logger
	// Observer is told of each claim, call, finish and result, on the loop's goroutine, one at a time
	// (nil: service.NopObserver).
	Observer service.Observer
}

// WithDefaults returns c with its zero fields set.
func (c Config) WithDefaults() Config {
	setInt(&c.MaxInFlight, DefaultMaxInFlight)
	setInt(&c.Batch, DefaultBatch)
	setInt(&c.FinishBatch, DefaultFinishBatch)
	setInt(&c.Finishers, DefaultFinishers)
	if c.Poll <= 0 {
		c.Poll = DefaultPoll
	}
	if c.FinishDelay <= 0 {
		c.FinishDelay = DefaultFinishDelay
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.ReadOnlyGrace <= 0 {
		c.ReadOnlyGrace = DefaultReadOnlyGrace
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Observer == nil {
		c.Observer = service.NopObserver{}
	}
	c.Batch = min(c.Batch, c.MaxInFlight, service.MaxBatch)
	return c
}

// Connections is how many database connections the loop uses at most: one claim and Finishers
// finishes at once. It does not grow with MaxInFlight: no connection is held during a call.
func (c Config) Connections() int { return 1 + c.WithDefaults().Finishers }

func setInt(v *int, def int) {
	if *v <= 0 {
		*v = def
	}
}
