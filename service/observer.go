package service

import (
	"time"

	"github.com/notifierhq/notifier/service/delivery"
)

// Observer is told what a worker did: the one seam through which `work` logs and counts its events
// and the load bench times them. The dispatcher reports what only it sees (a rate limit holding a
// claim back, a pause, a retried finish, a recovered claim) on the goroutine of the claim or finish;
// the worker loop reports its claims, calls, finishes and results on its own goroutine, one at a
// time. Keep each method short; one Observer may serve a dispatcher and its loop at once, so it must
// be safe for concurrent use. Embed NopObserver to implement only what is needed.
type Observer interface {
	// Claimed: a claim returned (Tasks: its attempts and the tasks it settled without a call).
	Claimed(ClaimEvent)
	// Called: a channel call answered; Took is its duration, measured once, around the call.
	Called(CallEvent)
	// Finished: a finish returned (Tasks: the answers it recorded, or failed to).
	Finished(FinishEvent)
	// Completed: one task's cycle ended with this result (SENT, PENDING, UNKNOWN, PARKED, FAILED,
	// SUPPRESSED, STALE, UNRECORDED), whether settled at claim or by a finish.
	Completed(Result)
	// SetAside: the database refused to claim this task for what its own rows hold; it waits for the
	// longest backoff and the queue goes on.
	SetAside(Result)
	// ClaimRecovered: a claim whose commit's answer was lost (err) had committed, and its attempts
	// were recovered by their tokens.
	ClaimRecovered(attempts int, err error)
	// RateLimited: a claim of a channel was held back by the channel's rate limit (no token, or fewer
	// than the calls it could have made); once per claim and channel.
	RateLimited(channel string)
	// RatePaused: a 429 paused a rate-limited channel for every worker, or could not (Err).
	RatePaused(RatePauseEvent)
	// AccountPaused: an ACCOUNT_REFUSED answer paused a channel for every worker, or a probe of a
	// paused one was refused again, or the pause could not be written (Err).
	AccountPaused(AccountPauseEvent)
	// AccountResumed: a probe's answer ended a channel's account pause, or could not (Err).
	AccountResumed(AccountResumeEvent)
	// FinishRetried: a finish is about to be sent again after a broken connection or a failover.
	FinishRetried(FinishRetryEvent)
}

// ClaimEvent is one claim as the worker loop saw it.
type ClaimEvent struct {
	Took  time.Duration
	Tasks int // attempts to call and tasks settled at claim
	Err   error
}

// CallEvent is one channel call and its answer.
type CallEvent struct {
	Attempt     *Attempt
	Observation delivery.Observation
	Took        time.Duration
}

// Action is what the call was counted as: SEND, TOPIC_RESEND or QUERY (SEND when unset).
func (c CallEvent) Action() delivery.Action {
	if c.Attempt.Action == "" {
		return delivery.ActionSend
	}
	return c.Attempt.Action
}

// FinishEvent is one finish as the worker loop saw it.
type FinishEvent struct {
	Took  time.Duration
	Tasks int // answers it recorded, or failed to
	Err   error
}

// RatePauseEvent is a 429's pause of a channel for every worker (Err: it could not be written).
type RatePauseEvent struct {
	Channel string
	Pause   time.Duration
	Err     error
}

// AccountPauseEvent is an account refusal's pause of a channel for every worker.
type AccountPauseEvent struct {
	Channel, Cause string
	Began          bool          // this answer began the pause; else a probe was refused again
	Backoff        time.Duration // the wait before the next probe
	Err            error         // the pause could not be written
}

// AccountResumeEvent is the end of a channel's account pause by a probe's answer.
type AccountResumeEvent struct {
	Channel, Cause string
	Paused         time.Duration // how long the channel was paused
	Err            error         // the pause could not be ended
}

// FinishRetryEvent is a finish about to be sent again.
type FinishRetryEvent struct {
	Attempts int
	Try      int // counts from 0
	Err      error
}

// NopObserver ignores every event: embedded, it lets an Observer implement only what it needs.
type NopObserver struct{}

func (NopObserver) Claimed(ClaimEvent)                {}
func (NopObserver) Called(CallEvent)                  {}
func (NopObserver) Finished(FinishEvent)              {}
func (NopObserver) Completed(Result)                  {}
func (NopObserver) SetAside(Result)                   {}
func (NopObserver) ClaimRecovered(int, error)         {}
func (NopObserver) RateLimited(string)                {}
func (NopObserver) RatePaused(RatePauseEvent)         {}
func (NopObserver) AccountPaused(AccountPauseEvent)   {}
func (NopObserver) AccountResumed(AccountResumeEvent) {}
func (NopObserver) FinishRetried(FinishRetryEvent)    {}
