package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/notifierhq/notifier/service"
)

// Dispatcher is what the loop needs of a *service.Dispatcher: claim, call, finish. The loop's own tests
// drive it with an in-memory one.
type Dispatcher interface {
	ClaimBatch(ctx context.Context, limit int) ([]*service.Attempt, []service.Result, error)
	Call(ctx context.Context, a *service.Attempt) service.Observation
	FinishBatch(ctx context.Context, attempts []*service.Attempt, obs []service.Observation) ([]service.Result, error)
	FinishBatchThenClaim(ctx context.Context, attempts []*service.Attempt, obs []service.Observation, limit int) service.Handoff
}

// Defaults of Config, sized for channels that answer in 50-500 ms: a window of 1024 calls allows up
// to ~10,000 deliveries/s at a 100 ms median, more than one database of modest size records, so the
// database and not the window sets the pace; it costs little when answers come at once. Claims of up
// to 256 keep claim round trips few at that rate (docs/benchmarks.md has the measurements).
const (
	DefaultMaxInFlight = 1024
	DefaultBatch       = 256
	DefaultFinishBatch = 128
	DefaultFinishers   = 2
	DefaultFinishDelay = 2 * time.Millisecond
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

// Hooks let a caller time the loop's database work (the bench does). Each runs on the loop's own
// goroutine: keep it short.
type Hooks struct {
	Claimed  func(took time.Duration, tasks int, err error) // after each claim (tasks: attempts and settled)
	Finished func(took time.Duration, tasks int, err error) // after each finish (tasks: answers recorded)
}

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
	OnResult      func(service.Result)
	Hooks         Hooks
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

// answer is one call's observation, waiting to be recorded.
type answer struct {
	attempt *service.Attempt
	obs     service.Observation
	took    time.Duration
}

// claimDone is what a claim (alone, or behind a finish) brought back.
type claimDone struct {
	attempts []*service.Attempt
	settled  []service.Result
	err      error
	took     time.Duration
	finish   *finishDone // set when a finish rode ahead of the claim
}

// finishDone is what one finish recorded.
type finishDone struct {
	answers []answer
	results []service.Result
	err     error
	took    time.Duration
}

// Run delivers until ctx ends, streaming: calls in flight are a window (MaxInFlight) refilled by
// claims as room opens, and answers are recorded as they come, in groups (FinishBatch, FinishDelay), by
// up to Finishers finishes at once, so a slow call never holds another task's answer or lease hostage.
// When a group is ready and a claim is due, the finish carries the claim in its round trip
// (service.Dispatcher.FinishBatchThenClaim): one worker with a window of one runs the per-task cycle
// in two round trips. After an empty claim the loop waits Poll; while the
// database fails it backs off up to MaxBackoff and logs once when that starts and once when it ends.
//
// On cancellation no new task is claimed; calls in flight end (bounded by the client timeout) and are
// recorded before Run returns nil. Run stops the same way, and returns the error, when the database has
// answered read-only for longer than ReadOnlyGrace: the worker is pointed at a standby.
func Run(ctx context.Context, d Dispatcher, cfg Config) error {
	cfg = cfg.WithDefaults()
	s := &stream{
		d: d, cfg: cfg, health: &dbHealth{log: cfg.Logger},
		answers:  make(chan answer, cfg.MaxInFlight),
		claims:   make(chan claimDone, 1),
		finishes: make(chan finishDone, cfg.Finishers),
	}
	return s.run(ctx)
}

type stream struct {
	d        Dispatcher
	cfg      Config
	health   *dbHealth
	answers  chan answer
	claims   chan claimDone
	finishes chan finishDone
}

func (s *stream) run(ctx context.Context) (fatal error) {
	var (
		readOnlySince time.Time // claims have met a read-only server since; zero while they do not
		calling       int       // calls in flight: the window's fill
		waiting       []answer  // answered, not yet being recorded
		recording     int       // answers in finishes running now
		finishing     int       // finish statements running
		claiming      bool
		backoff       time.Duration // after a failed claim or finish; 0 while healthy
		nextClaim     time.Time     // no claim before this
		oldest        time.Time     // when the first of waiting arrived
		timer         = time.NewTimer(time.Hour)
		done          = ctx.Done()
		worthClaim    = min(s.cfg.Batch, max(1, s.cfg.MaxInFlight/8))
	)
	timer.Stop()
	defer timer.Stop()
	for {
		now := time.Now()
		stopping := done == nil
		room := s.cfg.MaxInFlight - calling
		canClaim := !stopping && !claiming && !now.Before(nextClaim) &&
			(room >= worthClaim || (room > 0 && calling == 0)) &&
			len(waiting)+recording <= s.cfg.MaxInFlight // the database keeps up with the answers

		// Record answers once enough are waiting, or one has waited FinishDelay, or no other answer is
		// coming (nothing in flight, or stopping).
		flush := len(waiting) >= s.cfg.FinishBatch || calling == 0 || stopping ||
			(len(waiting) > 0 && now.Sub(oldest) >= s.cfg.FinishDelay)
		for flush && len(waiting) > 0 && finishing < s.cfg.Finishers {
			group := waiting[:min(len(waiting), s.cfg.FinishBatch)]
			waiting = waiting[len(group):]
			oldest = now
			finishing++
			recording += len(group)
			if canClaim { // one round trip: the finish, then the claim
				claiming, canClaim = true, false
				go s.finishThenClaim(ctx, group, min(s.cfg.Batch, room))
			} else {
				go s.finish(ctx, group)
			}
		}
		if canClaim {
			claiming = true
			go s.claim(ctx, min(s.cfg.Batch, room))
		}
		if stopping && calling == 0 && len(waiting) == 0 && !claiming && finishing == 0 {
			return fatal
		}
		// Wake up for the next claim after a pause, or for answers that have waited long enough.
		var wake time.Time
		if !stopping && !claiming && room > 0 && now.Before(nextClaim) {
			wake = nextClaim
		}
		if len(waiting) > 0 && finishing < s.cfg.Finishers {
			if at := oldest.Add(s.cfg.FinishDelay); wake.IsZero() || at.Before(wake) {
				wake = at
			}
		}
		if !wake.IsZero() {
			timer.Reset(max(0, time.Until(wake)))
		}

		select {
		case <-done:
			done = nil // stop claiming; drain what is held
		case a := <-s.answers:
			calling--
			if len(waiting) == 0 {
				oldest = time.Now()
			}
			waiting = append(waiting, a)
		case c := <-s.claims:
			claiming = false
			if c.finish != nil {
				finishing--
				recording -= len(c.finish.answers)
				backoff = s.recorded(*c.finish, backoff)
			}
			if s.cfg.Hooks.Claimed != nil {
				s.cfg.Hooks.Claimed(c.took, len(c.attempts)+len(c.settled), c.err)
			}
			switch {
			case c.err != nil && ctx.Err() == nil:
				s.health.failed(c.err)
				backoff = s.longer(backoff)
				nextClaim = time.Now().Add(backoff)
				if errors.Is(c.err, service.ErrReadOnly) {
					if readOnlySince.IsZero() {
						readOnlySince = time.Now()
						s.cfg.Logger.Error("the database is read-only: reconnecting, to the primary if the URL names it (target_session_attrs=read-write)",
							"stop_after", s.cfg.ReadOnlyGrace.String(), "error", c.err)
					} else if time.Since(readOnlySince) >= s.cfg.ReadOnlyGrace && fatal == nil {
						fatal = fmt.Errorf("still read-only after %s: %w", s.cfg.ReadOnlyGrace, c.err)
						done = nil // stop claiming; drain what is held, then return fatal
					}
				}
			case c.err == nil:
				readOnlySince = time.Time{}
				s.health.ok()
				if c.finish == nil || c.finish.err == nil {
					backoff = 0
				}
				logSettled(s.cfg.Logger, c.settled)
				s.report(c.settled)
				calling += len(c.attempts)
				for _, a := range c.attempts {
					s.startCall(ctx, a)
				}
				if len(c.attempts)+len(c.settled) == 0 {
					nextClaim = time.Now().Add(s.cfg.Poll)
				}
			}
			// A claim that failed because the loop is stopping needs nothing: no new claim follows.
		case f := <-s.finishes:
			finishing--
			recording -= len(f.answers)
			backoff = s.recorded(f, backoff)
			if backoff > 0 {
				nextClaim = time.Now().Add(backoff)
			}
		case <-timer.C:
		}
	}
}

// startCall calls the attempt's channel on its own goroutine and hands the answer back. The call is
// bounded by the client timeout and not cancelled by ctx: a stopping worker records it.
func (s *stream) startCall(ctx context.Context, a *service.Attempt) {
	logClaimed(s.cfg.Logger, a)
	go func() {
		started := time.Now()
		obs := s.d.Call(ctx, a)
		took := time.Since(started)
		logCalled(s.cfg.Logger, a, obs, took)
		s.answers <- answer{attempt: a, obs: obs, took: took}
	}()
}

func (s *stream) claim(ctx context.Context, limit int) {
	started := time.Now()
	attempts, settled, err := s.d.ClaimBatch(ctx, limit)
	s.claims <- claimDone{attempts: attempts, settled: settled, err: err, took: time.Since(started)}
}

func (s *stream) finish(ctx context.Context, group []answer) {
	attempts, obs := split(group)
	started := time.Now()
	results, err := s.d.FinishBatch(ctx, attempts, obs)
	s.finishes <- finishDone{answers: group, results: results, err: err, took: time.Since(started)}
}

func (s *stream) finishThenClaim(ctx context.Context, group []answer, limit int) {
	attempts, obs := split(group)
	started := time.Now()
	h := s.d.FinishBatchThenClaim(ctx, attempts, obs, limit)
	took := time.Since(started)
	s.claims <- claimDone{attempts: h.Next, settled: h.Settled, err: h.ClaimErr, took: took,
		finish: &finishDone{answers: group, results: h.Finished, err: h.FinishErr, took: took}}
}

// recorded logs and reports a finish and returns the claim backoff: a failed finish backs off like a
// failed claim (the database is likely in trouble); a recorded one leaves it as it was.
func (s *stream) recorded(f finishDone, backoff time.Duration) time.Duration {
	if s.cfg.Hooks.Finished != nil {
		s.cfg.Hooks.Finished(f.took, len(f.answers), f.err)
	}
	if f.err != nil {
		logFinishFailed(s.cfg.Logger, len(f.answers), f.err)
		s.health.failed(f.err)
		return s.longer(backoff)
	}
	elapsed := make([]time.Duration, len(f.answers))
	for i, a := range f.answers {
		elapsed[i] = a.took
	}
	s.report(logFinished(s.cfg.Logger, f.results, elapsed))
	return backoff
}

// longer is the backoff after a failed claim or finish: double the last one, at least Poll, at most
// MaxBackoff.
func (s *stream) longer(backoff time.Duration) time.Duration {
	return min(max(2*backoff, s.cfg.Poll), s.cfg.MaxBackoff)
}

func (s *stream) report(results []service.Result) {
	if s.cfg.OnResult == nil {
		return
	}
	for _, res := range results {
		s.cfg.OnResult(res)
	}
}

func split(group []answer) ([]*service.Attempt, []service.Observation) {
	attempts := make([]*service.Attempt, len(group))
	obs := make([]service.Observation, len(group))
	for i, a := range group {
		attempts[i], obs[i] = a.attempt, a.obs
	}
	return attempts, obs
}
