package worker

import (
	"context"
	"time"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// Dispatcher is what the loop needs of a *service.Dispatcher: claim, call, finish. The loop's own tests
// drive it with an in-memory one.
type Dispatcher interface {
	ClaimBatch(ctx context.Context, limit int) ([]*service.Attempt, []service.Result, error)
	Call(ctx context.Context, a *service.Attempt) delivery.Observation
	FinishBatch(ctx context.Context, attempts []*service.Attempt, obs []delivery.Observation) ([]service.Result, error)
}

// answer is one call's observation, waiting to be recorded.
type answer struct {
	attempt *service.Attempt
	obs     delivery.Observation
	took    time.Duration
}

// claimDone is what a claim (alone, or behind a finish) brought back.
type claimDone struct {
	attempts []*service.Attempt
	settled  []service.Result
	err      error
	took     time.Duration
	finish   *finishDone // set when the claim went behind a finish
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
// When a group is ready and a claim is due, the claim goes right behind that finish on the same
// goroutine, so that it sees what the finish released and paused (a 429). After an empty claim the
// loop waits Poll; while the
// database fails it backs off up to MaxBackoff and logs once when that starts and once when it ends.
//
// On cancellation no new task is claimed; calls in flight end (bounded by the client timeout) and are
// recorded before Run returns nil. Run stops the same way, and returns the error, when the database has
// answered read-only for longer than ReadOnlyGrace (the worker is pointed at a standby), or as soon as a
// claim or finish fails for a connection pooler's configuration (service.ErrPooler).
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

func (s *stream) run(ctx context.Context) error {
	w := newWindow(s.cfg)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	done := ctx.Done()
	for {
		now := time.Now()
		limit, claimDue := w.claimDue(now)
		for _, group := range w.takeGroups(now) {
			if claimDue { // the finish, then the claim
				claimDue = false
				w.claimStarted()
				go s.finishThenClaim(ctx, group, limit)
			} else {
				go s.finish(ctx, group)
			}
		}
		if claimDue {
			w.claimStarted()
			go s.claim(ctx, limit)
		}
		if w.done() {
			return w.fatal
		}
		if at := w.wake(now); !at.IsZero() {
			timer.Reset(max(0, at.Sub(now)))
		}

		select {
		case <-done:
			done = nil // stop claiming; drain what is held
			w.stopping = true
		case a := <-s.answers:
			s.cfg.Observer.Called(service.CallEvent{Attempt: a.attempt, Observation: a.obs, Took: a.took})
			w.answered(a, time.Now())
		case c := <-s.claims:
			finishFailed := false
			if c.finish != nil {
				finishFailed = c.finish.err != nil
				s.recorded(*c.finish)
				w.finished(len(c.finish.answers), finishFailed, time.Now())
				if w.stopFor(c.finish.err) {
					s.stoppingForPooler(c.finish.err)
				}
			}
			s.cfg.Observer.Claimed(service.ClaimEvent{Took: c.took, Tasks: len(c.attempts) + len(c.settled), Err: c.err})
			switch w.claimed(len(c.attempts), len(c.settled), c.err, finishFailed, ctx.Err() != nil, time.Now()) {
			case claimReadOnly:
				s.health.failed(c.err)
				s.cfg.Logger.Error("the database is read-only: reconnecting, to the primary if the URL names it (target_session_attrs=read-write)",
					"stop_after", s.cfg.ReadOnlyGrace.String(), "error", c.err)
			case claimPooler:
				s.stoppingForPooler(c.err)
			case claimFailed:
				s.health.failed(c.err)
			case claimOK:
				s.health.ok()
				logSettled(s.cfg.Logger, c.settled)
				report(s.cfg.Observer, c.settled)
				for _, a := range c.attempts {
					s.startCall(ctx, a)
				}
			}
		case f := <-s.finishes:
			s.recorded(f)
			w.finished(len(f.answers), f.err != nil, time.Now())
			if w.stopFor(f.err) {
				s.stoppingForPooler(f.err)
			}
		case <-timer.C:
		}
	}
}

// stoppingForPooler says why the loop stops by itself for a connection pooler's configuration (the
// error names the fix).
func (s *stream) stoppingForPooler(err error) {
	s.cfg.Logger.Error("stopping: the connection pooler's configuration breaks the worker's statements; calls in flight finish",
		"error", err)
}

// startCall calls the attempt's channel on its own goroutine and hands the answer back. The call is
// bounded by the client timeout and not cancelled by ctx: a stopping worker records it.
func (s *stream) startCall(ctx context.Context, a *service.Attempt) {
	logClaimed(s.cfg.Logger, a)
	go func() {
		obs, took := timedCall(ctx, s.d, a, s.cfg.Logger)
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

// finishThenClaim records group, then claims; each is timed on its own.
func (s *stream) finishThenClaim(ctx context.Context, group []answer, limit int) {
	attempts, obs := split(group)
	started := time.Now()
	results, ferr := s.d.FinishBatch(ctx, attempts, obs)
	finished := time.Now()
	next, settled, err := s.d.ClaimBatch(ctx, limit)
	s.claims <- claimDone{attempts: next, settled: settled, err: err, took: time.Since(finished),
		finish: &finishDone{answers: group, results: results, err: ferr, took: finished.Sub(started)}}
}

// recorded logs and reports a finish (one that failed: once, as the database failing).
func (s *stream) recorded(f finishDone) {
	s.cfg.Observer.Finished(service.FinishEvent{Took: f.took, Tasks: len(f.answers), Err: f.err})
	if f.err != nil {
		logFinishFailed(s.cfg.Logger, len(f.answers), f.err)
		s.health.failed(f.err)
		return
	}
	logFinished(s.cfg.Logger, f.results)
	report(s.cfg.Observer, f.results)
}

func split(group []answer) ([]*service.Attempt, []delivery.Observation) {
	attempts := make([]*service.Attempt, len(group))
	obs := make([]delivery.Observation, len(group))
	for i, a := range group {
		attempts[i], obs[i] = a.attempt, a.obs
	}
	return attempts, obs
}
