package service

// Per-channel rate limits shared by every worker on every machine: one token bucket row per channel
// (schema/001_tables.sql, queries/channel_rate_limit.sql), taken in the claim's transaction, so a
// task whose channel has no token left is simply not claimed yet. See docs/operations.md#rate-limits.

import (
	"context"
	"fmt"
	"github.com/notifierhq/notifier/service/delivery"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/notifierhq/notifier/dbgen"
)

// Bounds of a pause after a 429.
const (
	// DefaultThrottlePause is how long a 429 without Retry-After pauses its channel.
	DefaultThrottlePause = time.Second
	// MaxThrottlePause caps a pause, as Retry-After is capped for a task (httpkit.MaxRetryAfter).
	MaxThrottlePause = time.Hour
)

// Bucket is a channel's rate limit as the database holds it now.
type Bucket struct {
	Channel   string  `json:"channel"`
	PerSecond float64 `json:"rate_per_second"`
	Burst     float64 `json:"burst"`
	Tokens    float64 `json:"tokens"`         // whole ones are calls that may go out now
	PausedFor float64 `json:"paused_seconds"` // after a 429; 0 when not paused
}

// configureRateLimits writes the rate limits of this worker's routes into their buckets
// (RateLimitConfigure: a new bucket starts full; for an existing one the last worker to start wins) and
// learns which of its channels have a bucket, its own or one another worker set: its claims consult
// exactly those, and a 429 pauses exactly those. NewDispatcher calls it, before the dispatcher can
// claim (the limits were checked by DispatcherConfig.Check, before anything is written). It returns
// those buckets.
func (d *Dispatcher) configureRateLimits(ctx context.Context) ([]Bucket, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.DBTimeout)
	defer cancel()
	q := dbgen.New(d.pool)
	var set []string
	for _, ch := range d.channels {
		if r := d.cfg.Routes[ch].RateLimit; r != (delivery.RateLimit{}) {
			set = append(set, ch)
		}
	}
	for _, ch := range set {
		r := d.cfg.Routes[ch].RateLimit
		if err := q.RateLimitConfigure(ctx, dbgen.RateLimitConfigureParams{Channel: ch, Rate: r.PerSecond, Burst: r.Burst}); err != nil {
			return nil, fmt.Errorf("configure the rate limit of %s: %w", ch, err)
		}
	}
	rows, err := q.RateLimitList(ctx)
	if err != nil {
		return nil, fmt.Errorf("read rate limits: %w", err)
	}
	var buckets []Bucket
	d.limited = nil
	for _, r := range rows {
		if _, mine := d.cfg.Routes[r.Channel]; mine {
			buckets = append(buckets, bucket(r))
			d.limited = append(d.limited, r.Channel)
		}
	}
	return buckets, nil
}

func bucket(r dbgen.RateLimitListRow) Bucket {
	return Bucket{Channel: r.Channel, PerSecond: r.Rate, Burst: r.Burst, Tokens: r.Tokens, PausedFor: r.PausedSeconds}
}

// RateLimits lists every channel's bucket (notifier status).
func (n *Notifier) RateLimits(ctx context.Context) ([]Bucket, error) {
	rows, err := n.q.RateLimitList(ctx)
	if err != nil {
		return nil, fmt.Errorf("read rate limits: %w", err)
	}
	buckets := make([]Bucket, len(rows))
	for i, r := range rows {
		buckets[i] = bucket(r)
	}
	return buckets, nil
}

// peekTokens is the claim's look at its limited channels' buckets, without a lock (RateLimitPeek): the
// whole tokens each could grant now. Channels absent from the result have no bucket (any more): no
// limit. nil when this worker consults no bucket, at no cost.
func (d *Dispatcher) peekTokens(ctx context.Context, q *dbgen.Queries) (map[string]int, error) {
	if len(d.limited) == 0 {
		return nil, nil
	}
	rows, err := q.RateLimitPeek(ctx, d.limited)
	if err != nil {
		return nil, fmt.Errorf("read rate limits: %w", err)
	}
	allowance := make(map[string]int, len(rows))
	for _, r := range rows {
		allowance[r.Channel] = int(min(math.Floor(r.Tokens), MaxBatch))
	}
	return allowance, nil
}

// takeTokens takes one token per call the claim decided to make on a limited channel (RateLimitTake,
// which keeps the buckets locked until the claim commits) and returns rows without the calls that got
// none: the claim leaves those tasks as they are, due again at once. Rows settled or parked at claim
// time need no token.
func (d *Dispatcher) takeTokens(ctx context.Context, q *dbgen.Queries, rows []dbgen.TaskClaimRow,
	decisions map[int64]delivery.ClaimDecision, run *claimRun) ([]dbgen.TaskClaimRow, error) {
	calls := map[string]int32{}
	for _, row := range rows {
		if _, limited := run.allowance[row.Channel]; limited && decisions[row.ID].Kind == delivery.ClaimCall {
			calls[row.Channel]++
		}
	}
	if len(calls) == 0 {
		return rows, nil
	}
	take := dbgen.RateLimitTakeParams{}
	for _, ch := range slices.Sorted(maps.Keys(calls)) {
		take.Channels = append(take.Channels, ch)
		take.Calls = append(take.Calls, calls[ch])
	}
	granted, err := q.RateLimitTake(ctx, take)
	if err != nil {
		return nil, fmt.Errorf("take rate-limit tokens: %w", err)
	}
	left := make(map[string]int32, len(granted))
	for _, g := range granted {
		left[g.Channel] = g.Granted
	}
	kept := rows[:0:0] // a new slice: the claim keeps rows as locked, to set a task aside (claimEach)
	for _, row := range rows {
		n, limited := left[row.Channel] // a bucket deleted since the peek: no limit
		if limited && decisions[row.ID].Kind == delivery.ClaimCall {
			if n == 0 {
				d.rateLimited(run, row.Channel)
				continue
			}
			left[row.Channel] = n - 1
		}
		kept = append(kept, row)
	}
	return kept, nil
}

// pauseThrottled pauses, for every worker, each limited channel that answered 429 (THROTTLED) in this
// group of answers: for its longest Retry-After, DefaultThrottlePause without one, at most
// MaxThrottlePause (RateLimitPause, one autocommit statement per channel). A 429 is the channel's word
// whether or not its task's finish is recorded, so the pause does not depend on it; it goes before the
// claim that may ride with the finish, so that claim already sees it. A failed pause is reported and
// changes nothing else: the throttled task itself waits for its Retry-After anyway.
func (d *Dispatcher) pauseThrottled(ctx context.Context, attempts []*Attempt, obs []delivery.Observation) {
	if len(d.limited) == 0 {
		return
	}
	var pauses map[string]time.Duration // made by the first 429: most finishes have none
	for i, a := range attempts {
		if i >= len(obs) || obs[i].Outcome != delivery.OutcomeThrottled || !slices.Contains(d.limited, a.Channel) {
			continue
		}
		pause := obs[i].RetryAfter
		if pause <= 0 {
			pause = DefaultThrottlePause
		}
		if pauses == nil {
			pauses = map[string]time.Duration{}
		}
		pauses[a.Channel] = max(pauses[a.Channel], min(pause, MaxThrottlePause))
	}
	if len(pauses) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.DBTimeout)
	defer cancel()
	q := dbgen.New(d.pool)
	for _, ch := range slices.Sorted(maps.Keys(pauses)) {
		_, err := q.RateLimitPause(ctx, dbgen.RateLimitPauseParams{Channel: ch, PauseSeconds: pauses[ch].Seconds()})
		if err != nil {
			err = fmt.Errorf("pause the rate limit of %s: %w", ch, err)
		}
		d.cfg.Observer.RatePaused(RatePauseEvent{Channel: ch, Pause: pauses[ch], Err: err})
	}
}
