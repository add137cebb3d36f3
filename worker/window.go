package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// window is the streaming loop's state: the calls in flight, the answers waiting to be recorded, the
// claim and finishes running, and when to act next. Its methods decide and change nothing but the
// window; stream.run does the I/O they call for. Only run's goroutine uses it.
type window struct {
	cfg       Config
	calling   int      // calls in flight: the window's fill
	waiting   []answer // answered, not yet being recorded
	oldest    time.Time
	recording int // answers in finishes running now
	finishing int // finish statements running
	claiming  bool
	stopping  bool          // no more claims: drain what is held
	backoff   time.Duration // after a failed claim or finish; 0 while healthy
	nextClaim time.Time     // no claim before this
	// readOnlySince is when claims began meeting a read-only server; zero while they do not.
	readOnlySince time.Time
	fatal         error // why the loop stops by itself (the server stayed read-only, a pooler's configuration)
	jitter        func(d time.Duration) time.Duration
}

func newWindow(cfg Config) *window {
	return &window{cfg: cfg, jitter: delivery.Spread}
}

func (w *window) room() int { return w.cfg.MaxInFlight - w.calling }

// worthClaim is the least room a claim waits for while calls are in flight: an eighth of the window,
// or a whole Batch when that is less.
func (w *window) worthClaim() int { return min(w.cfg.Batch, max(1, w.cfg.MaxInFlight/8)) }

// claimDue says whether a claim should start now, and for how many tasks: not while stopping, while a
// claim runs or before nextClaim; only with room worth a claim (any room when nothing is in flight);
// and not while as many answers wait to be recorded as the window holds (the database is behind).
func (w *window) claimDue(now time.Time) (limit int, due bool) {
	// Ifs rather than a tagless switch, whose case expressions coverage profiles (and so
	// `just mutants`) do not count as statements.
	room := w.room()
	if w.stopping || w.claiming || now.Before(w.nextClaim) {
		return 0, false
	}
	// With nothing in flight the room is the whole window, never less than worthClaim: an idle worker
	// always claims.
	if room < w.worthClaim() {
		return 0, false
	}
	if len(w.waiting)+w.recording > w.cfg.MaxInFlight {
		return 0, false
	}
	return min(w.cfg.Batch, room), true
}

// flushDue says whether the waiting answers should be recorded now: a full group is waiting, or one
// answer has waited FinishDelay, or no other answer can come to share the finish (nothing in flight,
// or stopping).
func (w *window) flushDue(now time.Time) bool {
	if len(w.waiting) == 0 {
		return false
	}
	return len(w.waiting) >= w.cfg.FinishBatch || w.calling == 0 || w.stopping || now.Sub(w.oldest) >= w.cfg.FinishDelay
}

// takeGroups hands out, when a flush is due, the groups of waiting answers to record now: up to
// FinishBatch answers each, as many as there are free finishers.
func (w *window) takeGroups(now time.Time) [][]answer {
	if !w.flushDue(now) {
		return nil
	}
	var groups [][]answer
	for len(w.waiting) > 0 && w.finishing < w.cfg.Finishers {
		group := w.waiting[:min(len(w.waiting), w.cfg.FinishBatch)]
		w.waiting = w.waiting[len(group):]
		w.oldest = now
		w.finishing++
		w.recording += len(group)
		groups = append(groups, group)
	}
	return groups
}

// wake is when the loop must look again without an event: for the next claim after a pause, or for
// answers that will have waited FinishDelay. Zero: only an event can change anything.
func (w *window) wake(now time.Time) time.Time {
	var at time.Time
	if !w.stopping && !w.claiming && w.room() > 0 && now.Before(w.nextClaim) {
		at = w.nextClaim
	}
	if len(w.waiting) > 0 && w.finishing < w.cfg.Finishers {
		if due := w.oldest.Add(w.cfg.FinishDelay); at.IsZero() || due.Before(at) {
			at = due
		}
	}
	return at
}

// done says whether the loop may return: stopping, and nothing held, waiting or running.
func (w *window) done() bool {
	return w.stopping && w.calling == 0 && len(w.waiting) == 0 && !w.claiming && w.finishing == 0
}

// claimStarted notes a claim going out (alone, or behind the first of groups).
func (w *window) claimStarted() { w.claiming = true }

// answered notes an answer of a call in flight.
func (w *window) answered(a answer, now time.Time) {
	w.calling--
	if len(w.waiting) == 0 {
		w.oldest = now
	}
	w.waiting = append(w.waiting, a)
}

// finished notes the end of a finish of n answers; failed: it could not be recorded. A failed finish
// backs claims off like a failed claim: the database is likely in trouble.
func (w *window) finished(n int, failed bool, now time.Time) {
	w.finishing--
	w.recording -= n
	if failed {
		w.failed(now)
	}
}

// claimOutcome is what a claim's end means for the loop's log.
type claimOutcome int

const (
	claimOK       claimOutcome = iota
	claimFailed                // the database failed the claim: backing off
	claimReadOnly              // the first claim to meet a read-only server: backing off
	claimStopping              // the claim failed because the loop stops: nothing follows
	claimPooler                // the claim failed for a connection pooler's configuration: the loop stops
)

// claimed notes the end of a claim that started calls attempts and settled others without a call (err:
// it failed), with finishFailed when a finish rode ahead of it and failed. A failure backs off
// (doubling, from Poll to MaxBackoff); success clears the backoff unless the finish before it failed,
// and a claim that found nothing waits Poll. Claims meeting a read-only server for ReadOnlyGrace stop
// the loop (fatal), and so does the first that fails for a pooler's configuration (stopFor).
func (w *window) claimed(calls, settled int, err error, finishFailed, ctxDone bool, now time.Time) claimOutcome {
	w.claiming = false
	if err != nil && ctxDone {
		return claimStopping
	}
	if errors.Is(err, service.ErrPooler) {
		if w.stopFor(err) {
			return claimPooler
		}
		return claimStopping
	}
	if err != nil {
		w.failed(now)
		if !errors.Is(err, service.ErrReadOnly) {
			return claimFailed
		}
		if w.readOnlySince.IsZero() {
			w.readOnlySince = now
			return claimReadOnly
		}
		if now.Sub(w.readOnlySince) >= w.cfg.ReadOnlyGrace && w.fatal == nil {
			w.fatal = fmt.Errorf("still read-only after %s: %w", w.cfg.ReadOnlyGrace, err)
			w.stopping = true
		}
		return claimFailed
	}
	w.readOnlySince = time.Time{}
	if !finishFailed {
		w.backoff = 0
	}
	w.calling += calls
	if calls+settled == 0 {
		w.nextClaim = now.Add(w.jitter(w.cfg.Poll))
	}
	return claimOK
}

// stopFor stops the loop when err is one that only a connection pooler's configuration can fix
// (service.ErrPooler: prepared statements shared with other clients or dropped): no retry, since every
// later statement may fail alike and each failed finish leaves its tasks to lease expiry, as uncertain.
// It reports whether err is the one the loop stops for (the first such).
func (w *window) stopFor(err error) bool {
	if !errors.Is(err, service.ErrPooler) || w.fatal != nil {
		return false
	}
	w.fatal, w.stopping = err, true
	return true
}

// failed backs claims off: double the last wait, at least Poll, at most MaxBackoff, spread.
func (w *window) failed(now time.Time) {
	w.backoff = min(max(2*w.backoff, w.cfg.Poll), w.cfg.MaxBackoff)
	w.nextClaim = now.Add(w.jitter(w.backoff))
}
