package cli

import (
	"log/slog"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/redact"
)

// workObserver is a worker's service.Observer, for its dispatcher and its loop alike: it logs what an
// operator acts on (pauses, retried finishes, recovered claims) and, with --metrics-addr, counts every
// event into the metrics (m; nil without). The loop logs CLAIMED, CALLED and RESULT, and a failed
// finish, itself.
type workObserver struct {
	service.NopObserver
	log *slog.Logger
	m   *metrics
}

// observe has the dispatcher and the loop of cfg report to one workObserver.
func (cfg *workConfig) observe(log *slog.Logger, m *metrics) {
	o := workObserver{log: log, m: m}
	cfg.dispatcher.Observer, cfg.loop.Observer = o, o
}

// Claimed notes a claim that succeeded, whatever it found: a worker whose claims stop is down for the
// queue even while its metrics are served.
func (o workObserver) Claimed(e service.ClaimEvent) {
	if o.m != nil && e.Err == nil {
		o.m.lastClaim.SetToCurrentTime()
	}
}

// Called counts the call under its action (SEND, TOPIC_RESEND: a Web Push resend that replaces an
// undelivered copy, or QUERY) and its outcome, and its duration, as the loop measured it.
func (o workObserver) Called(e service.CallEvent) {
	if o.m != nil {
		o.m.observeCall(e.Attempt.Channel, e.Action(), e.Observation.Outcome, e.Took)
	}
}

func (o workObserver) Completed(r service.Result) {
	if o.m != nil {
		o.m.onResult(r)
	}
}

// SetAside: the loop logs it as an error; it counts in notifier_set_aside_total.
func (o workObserver) SetAside(r service.Result) {
	if o.m != nil {
		o.m.onResult(r)
	}
}

// ClaimRecovered: the commit of a claim was lost in transit and its tasks found held by their tokens,
// so they are called now instead of after their lease; one line, as for a lost finish.
func (o workObserver) ClaimRecovered(attempts int, err error) {
	o.log.Warn("claim's answer lost but it had committed; its tasks were recovered by their tokens and are called now",
		"tasks", attempts, "error", redact.Error(err))
}

func (o workObserver) RateLimited(channel string) {
	if o.m != nil {
		o.m.rateLimited.WithLabelValues(channel).Inc()
	}
}

func (o workObserver) RatePaused(p service.RatePauseEvent) {
	if p.Err != nil {
		o.log.Error("a 429 could not pause the channel for the other workers", "channel", p.Channel, "error", p.Err)
		return
	}
	o.log.Info("channel answered 429: paused for every worker", "channel", p.Channel, "pause", p.Pause.String())
	if o.m != nil {
		o.m.ratePaused.WithLabelValues(p.Channel).Inc()
	}
}

func (o workObserver) AccountPaused(p service.AccountPauseEvent) {
	if p.Err != nil {
		o.log.Error("an account refusal could not pause the channel for the other workers", "channel", p.Channel, "cause", p.Cause, "error", p.Err)
		return
	}
	if p.Began {
		o.log.Warn("channel refused our account: paused for every worker until a probe succeeds (docs/channels.md#account-states)",
			"channel", p.Channel, "cause", p.Cause, "next_probe_in", p.Backoff.String())
		return
	}
	o.log.Info("paused channel's probe refused again", "channel", p.Channel, "cause", p.Cause, "next_probe_in", p.Backoff.String())
}

func (o workObserver) AccountResumed(r service.AccountResumeEvent) {
	if r.Err != nil {
		o.log.Error("a paused channel's successful probe could not end the pause", "channel", r.Channel, "error", r.Err)
		return
	}
	o.log.Info("paused channel resumed: its probe was not refused", "channel", r.Channel, "cause", r.Cause, "paused_for", r.Paused.String())
}

func (o workObserver) FinishRetried(r service.FinishRetryEvent) {
	if r.Try == 0 { // one line per lost finish, not per retry
		o.log.Warn("finish failed; sending it again until the lease would run out (it may have committed: a finish is idempotent)",
			"tasks", r.Attempts, "error", redact.Error(r.Err))
	}
	if o.m != nil {
		o.m.finishRetries.Inc()
	}
}
