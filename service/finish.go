package service

// The finish, the second correctness check, in one place: FinishBatch maps each observation to its
// task's next state (delivery.Next) and writes it in one token-guarded statement (TaskFinish), sent
// again while the leases allow when a connection breaks (it is idempotent), and attempt by attempt
// when the server refuses one row (finishEach), so one bad row costs only its own observation.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/service/delivery"
)

// FinishBatch is the second correctness check: it maps each observation to the task's next state
// (Next) and, in one statement (TaskFinish), writes it only where the attempt's token is still the
// task's valid one; those attempts get their outcome. Superseded attempts keep their observation as late_outcome and
// their result is STALE. The results are in the order of attempts. When the server refuses the statement
// for what a row holds (rowFault), each attempt is finished on its own, so one bad row costs only its own
// observation: that attempt's result is UNRECORDED. A 429 on a rate-limited channel first pauses that
// channel for every worker (pauseThrottled).
func (d *Dispatcher) FinishBatch(ctx context.Context, attempts []*Attempt, obs []delivery.Observation) ([]Result, error) {
	d.pauseThrottled(ctx, attempts, obs)
	d.pauseRefused(ctx, attempts, obs)
	results, err := d.finishBatch(ctx, attempts, obs)
	d.disableUnregistered(ctx, results, obs)
	return results, err
}

// disableUnregistered switches off the preferences whose address a provider said is gone
// (DisableUnregistered), for the attempts whose rejection was recorded (FAILED): one short statement
// each, after the finish, because such answers are rare. A failure to switch one off is said in its
// result's Detail; the task's outcome stands either way.
func (d *Dispatcher) disableUnregistered(ctx context.Context, results []Result, obs []delivery.Observation) {
	if !d.cfg.DisableUnregistered || len(results) != len(obs) {
		return
	}
	for i := range results {
		r := &results[i]
		if !obs[i].Unregistered || r.Kind != ResultFailed || r.Outcome != delivery.OutcomeRejected {
			continue
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.DBTimeout)
		_, err := dbgen.New(d.pool).PrefDisableByTask(dctx, r.TaskID)
		cancel()
		switch {
		case err == nil:
			r.PrefDisabled = true
		case !errors.Is(err, pgx.ErrNoRows): // no row: the preference is off already
			r.Detail += "; the preference could not be switched off: " + err.Error()
		}
	}
}

// finishBatch is FinishBatch without the pause.
func (d *Dispatcher) finishBatch(ctx context.Context, attempts []*Attempt, obs []delivery.Observation) ([]Result, error) {
	params, results, err := d.finishParams(attempts, obs)
	if err != nil {
		return nil, err
	}
	rows, err := d.finish(ctx, attempts, params)
	if rowFault(err) {
		return d.finishEach(ctx, attempts, params, results), nil
	}
	return finishResults(attempts, results, rows, err)
}

// finish runs TaskFinish, one autocommit statement: the token-guarded task updates and the attempt rows
// they decide. A finish that failed transiently (a broken connection, a server restarting or failed
// over: transient) may or may not have committed; TaskFinish is idempotent, so it is sent again, with
// backoff, for as long as the attempts' leases leave time for it (finishDeadline). Only then are the
// tasks left to lease expiry, as uncertain: without the retry a NONE-channel task whose call was
// accepted would be parked for a human because the database blinked. The retries are not cancelled
// with ctx: a stopping worker still records its answers.
func (d *Dispatcher) finish(ctx context.Context, attempts []*Attempt, params dbgen.TaskFinishParams) ([]dbgen.TaskFinishRow, error) {
	deadline := finishDeadline(attempts, d.cfg.Lease)
	// The first try goes whatever the lease: a superseded holder's finish keeps its late outcome.
	rows, err := d.finishTry(ctx, params, time.Now().Add(d.cfg.DBTimeout))
	for try := 0; transient(err); try++ {
		if sqlState(err) == sqlStateReadOnly {
			d.pool.Reset() // a standby now: reconnect, to the new primary
		}
		wait := finishRetryDelay(try)
		if time.Until(deadline) < wait+minFinishTry {
			return nil, fmt.Errorf("%w (sent %d times; no time left before the lease runs out)", err, try+1)
		}
		d.cfg.Observer.FinishRetried(FinishRetryEvent{Attempts: len(attempts), Try: try, Err: err})
		time.Sleep(wait)
		rows, err = d.finishTry(ctx, params, deadline)
	}
	return rows, err
}

// finishTry sends TaskFinish once, bounded by DBTimeout and the deadline.
func (d *Dispatcher) finishTry(ctx context.Context, params dbgen.TaskFinishParams, deadline time.Time) ([]dbgen.TaskFinishRow, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(d.cfg.DBTimeout, time.Until(deadline)))
	defer cancel()
	return dbgen.New(d.pool).TaskFinish(ctx, params)
}

// minFinishTry is the least time worth a finish's try: less than this before the lease ends and the
// tasks are left to lease expiry.
const minFinishTry = 500 * time.Millisecond

// finishDeadline is when the earliest lease of attempts ends, on this process's clock: the lease
// started on the database clock during the claim, before the claim returned (claimed), so this is no
// earlier than the real end, and a finish sent after it is fenced by the token (it reads STALE).
func finishDeadline(attempts []*Attempt, lease time.Duration) time.Time {
	var deadline time.Time
	for _, a := range attempts {
		if end := a.claimed.Add(lease); deadline.IsZero() || end.Before(deadline) {
			deadline = end
		}
	}
	return deadline
}

// finishRetryDelay is the wait before retry number try+1 of a finish: 100 ms doubled per retry, at most
// 2 s, spread.
func finishRetryDelay(try int) time.Duration {
	d := 100 * time.Millisecond << min(try, 5)
	return delivery.Spread(min(d, 2*time.Second))
}

// finishParams maps each observation to its task's next state: TaskFinish's arguments, and the results
// to report if the token guard holds.
func (d *Dispatcher) finishParams(attempts []*Attempt, obs []delivery.Observation) (dbgen.TaskFinishParams, []Result, error) {
	finish := dbgen.TaskFinishParams{}
	if len(attempts) != len(obs) {
		return finish, nil, fmt.Errorf("finish: %d attempts but %d observations", len(attempts), len(obs))
	}
	results := make([]Result, len(attempts))
	for i, a := range attempts {
		o := obs[i]
		t := delivery.Next(delivery.Facts{Outcome: o.Outcome, PriorUncertain: a.PriorUncertain,
			BudgetLeft: a.No-a.AccountRefusals < a.MaxAttempts,
			Mode:       a.Mode, Contract: a.Contract, UncertainAge: a.UncertainAge + time.Since(a.claimed)})
		results[i] = Result{Kind: resultKind(t), TaskID: a.TaskID, Channel: a.Channel, Attempt: a.No, Action: a.Action,
			Outcome: o.Outcome, Token: a.Token, Detail: o.Detail}
		retry := -1.0
		switch {
		case t.Retry && t.Refund:
			// the channel's pause paces it: due again at once when the channel resumes
			retry = delivery.Spread(d.cfg.Backoff.Base).Seconds()
		case t.Retry:
			retry = delivery.Spread(max(d.cfg.Backoff.Delay(a.No-a.AccountRefusals, o.RetryAfter), t.NotBefore)).Seconds()
		}
		finish.IDs = append(finish.IDs, a.TaskID)
		finish.AttemptTokens = append(finish.AttemptTokens, a.Token)
		finish.States = append(finish.States, string(t.State))
		finish.OutcomeUncertain = append(finish.OutcomeUncertain, t.Uncertain)
		finish.NeedsReview = append(finish.NeedsReview, t.Park)
		finish.ProviderMsgIDs = append(finish.ProviderMsgIDs, delivery.Truncate(o.ProviderMsgID, 500))
		finish.LastErrors = append(finish.LastErrors, errorText(o))
		finish.RetryAfterSeconds = append(finish.RetryAfterSeconds, retry)
		finish.Outcomes = append(finish.Outcomes, string(o.Outcome))
		finish.Errors = append(finish.Errors, delivery.Truncate(o.Detail, MaxNoteLength))
	}
	return finish, results, nil
}

// finishResults checks TaskFinish's rows against the attempts: an attempt whose token no longer held
// is STALE. A failure that a connection pooler's configuration caused says so (ExplainPooler).
func finishResults(attempts []*Attempt, results []Result, rows []dbgen.TaskFinishRow, err error) ([]Result, error) {
	if err == nil && len(rows) != len(attempts) {
		err = fmt.Errorf("%d rows for %d attempts", len(rows), len(attempts))
	}
	if err != nil {
		return nil, ExplainPooler(fmt.Errorf("finish: %w", err), "")
	}
	current := make(map[int64]bool, len(rows))
	for _, r := range rows {
		current[r.ID] = r.Current
	}
	for i, a := range attempts {
		if !current[a.TaskID] {
			results[i].Kind = ResultStale
		}
	}
	return results, nil
}

func resultKind(t delivery.Transition) ResultKind {
	if t.Park {
		return ResultParked
	}
	return ResultKind(t.State)
}

// finishEach finishes each attempt of a batch whose finish the server refused, one TaskFinish per
// attempt under one DBTimeout. An attempt whose own finish fails is UNRECORDED: it stays SENDING with
// its token and is recovered after its lease, as after a crash.
func (d *Dispatcher) finishEach(ctx context.Context, attempts []*Attempt, params dbgen.TaskFinishParams, results []Result) []Result {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.DBTimeout)
	defer cancel()
	q := dbgen.New(d.pool)
	for i := range attempts {
		one := i + 1
		rows, err := q.TaskFinish(ctx, dbgen.TaskFinishParams{
			IDs:               params.IDs[i:one],
			AttemptTokens:     params.AttemptTokens[i:one],
			States:            params.States[i:one],
			OutcomeUncertain:  params.OutcomeUncertain[i:one],
			NeedsReview:       params.NeedsReview[i:one],
			ProviderMsgIDs:    params.ProviderMsgIDs[i:one],
			LastErrors:        params.LastErrors[i:one],
			RetryAfterSeconds: params.RetryAfterSeconds[i:one],
			Outcomes:          params.Outcomes[i:one],
			Errors:            params.Errors[i:one],
		})
		if _, err := finishResults(attempts[i:one], results[i:one], rows, err); err != nil {
			results[i].Kind, results[i].Err = ResultUnrecorded, err
			results[i].Detail = delivery.Truncate(err.Error(), MaxNoteLength)
		}
	}
	return results
}
