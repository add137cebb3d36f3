package service

// Channels paused for an account state (schema/001_tables.sql, queries/channel_pause.sql): a
// provider's ACCOUNT_REFUSED (a rejected credential, a paused sending account) pauses its channel for
// every worker instead of failing tasks. While paused, claims lock none of its tasks but one probe at a
// time (TaskClaim), with backoff; the probe's answer ends the pause, or doubles the backoff. See
// docs/channels.md#account-states.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/service/delivery"
)

// Bounds of the wait between probes of a channel paused for an account state.
const (
	DefaultAccountPauseStart = 2 * time.Second // the first probe, after the pause began
	DefaultAccountPauseMax   = 5 * time.Minute // the backoff doubles per refused probe up to this
)

// ChannelPause is a channel paused for an account state, as the database holds it now.
type ChannelPause struct {
	Channel   string    `json:"channel"`
	Cause     string    `json:"cause"`
	Since     time.Time `json:"since"`
	PausedFor float64   `json:"paused_seconds"`     // since Since, by the database's clock
	Backoff   float64   `json:"backoff_seconds"`    // the current wait between probes
	NextProbe float64   `json:"next_probe_seconds"` // until the next probe may go; 0: now
}

// ChannelPauses lists every channel paused for an account state (notifier status, the console, and the
// worker's metrics through AlertGauges).
func (n *Notifier) ChannelPauses(ctx context.Context) ([]ChannelPause, error) {
	rows, err := n.q.ChannelPauseList(ctx)
	if err != nil {
		return nil, fmt.Errorf("read channel pauses: %w", err)
	}
	pauses := make([]ChannelPause, len(rows))
	for i, r := range rows {
		pauses[i] = ChannelPause{Channel: r.Channel, Cause: r.Cause, Since: r.PausedAt, PausedFor: r.PausedSeconds,
			Backoff: r.BackoffSeconds, NextProbe: r.NextProbeSeconds}
	}
	return pauses, nil
}

// accountAnswer is what a group of answers says about one channel's account: refused (with the cause of
// the last refusal, and whether a probe was refused), or a probe answered otherwise.
type accountAnswer struct {
	refused, probeRefused, probeAnswered bool
	cause                                string
}

// pauseRefused writes, before the finish that records the attempts (so that the claim riding with it
// sees the pause), what this group of answers says about each channel's account: an ACCOUNT_REFUSED
// pauses the channel for every worker, a refused probe doubles its backoff (ChannelPauseRefused), and a
// probe answered otherwise ends the pause (ChannelPauseEnd). One autocommit statement per such channel;
// most finishes have none and cost nothing. A failure is reported and changes nothing else: the refused
// tasks are refunded by their finish either way.
func (d *Dispatcher) pauseRefused(ctx context.Context, attempts []*Attempt, obs []delivery.Observation) {
	var answers map[string]*accountAnswer // made by the first refusal or probe
	for i, a := range attempts {
		if i >= len(obs) || (obs[i].Outcome != delivery.OutcomeAccountRefused && !a.Probe) {
			continue
		}
		if answers == nil {
			answers = map[string]*accountAnswer{}
		}
		ans := answers[a.Channel]
		if ans == nil {
			ans = &accountAnswer{}
			answers[a.Channel] = ans
		}
		switch {
		case obs[i].Outcome == delivery.OutcomeAccountRefused:
			ans.refused, ans.cause = true, delivery.Truncate(obs[i].Detail, MaxNoteLength)
			ans.probeRefused = ans.probeRefused || a.Probe
		default:
			ans.probeAnswered = true
		}
	}
	if len(answers) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.DBTimeout)
	defer cancel()
	q := dbgen.New(d.pool)
	for _, ch := range slices.Sorted(maps.Keys(answers)) {
		ans := answers[ch]
		if ans.refused {
			cause := ans.cause
			if cause == "" {
				cause = "the provider refused our account (no detail)"
			}
			row, err := q.ChannelPauseRefused(ctx, dbgen.ChannelPauseRefusedParams{Channel: ch, Cause: cause,
				StartSeconds: d.cfg.AccountPauseStart.Seconds(), HoldSeconds: d.cfg.Lease.Seconds(),
				Probe: ans.probeRefused, CapSeconds: d.cfg.AccountPauseMax.Seconds()})
			if err != nil {
				err = fmt.Errorf("pause %s for an account state: %w", ch, err)
			}
			if err != nil || row.Began || ans.probeRefused {
				d.cfg.Observer.AccountPaused(AccountPauseEvent{Channel: ch, Cause: cause, Began: row.Began,
					Backoff: seconds(row.BackoffSeconds), Err: err})
			}
			continue
		}
		ended, err := q.ChannelPauseEnd(ctx, ch)
		if err != nil {
			err = fmt.Errorf("end the account pause of %s: %w", ch, err)
		}
		if err != nil || len(ended) > 0 {
			var e dbgen.ChannelPauseEndRow
			if len(ended) > 0 {
				e = ended[0]
			}
			d.cfg.Observer.AccountResumed(AccountResumeEvent{Channel: ch, Cause: e.Cause,
				Paused: seconds(e.PausedSeconds), Err: err})
		}
	}
}

// releaseUnusedProbe frees a paused channel's probe slot when the claim that took it (rows, none of
// them called) settled its task without asking the provider, so that tasks expiring during a pause end
// one per claim, not one per probe hold, and the next live task is the probe.
func (d *Dispatcher) releaseUnusedProbe(ctx context.Context, q *dbgen.Queries, rows []dbgen.TaskClaimRow) error {
	if len(rows) == 0 || !rows[0].Probe {
		return nil
	}
	if err := q.ChannelPauseProbeRelease(ctx, rows[0].Channel); err != nil {
		return fmt.Errorf("free the probe slot of %s: %w", rows[0].Channel, err)
	}
	return nil
}
