// Package worker runs a Dispatcher's claim-call-finish cycle: one cycle (RunOnce, for
// `notifier work --once`), or a streaming loop (Run) that keeps a window of calls in flight, records
// answers as they come, polls when idle, backs off while the database is unreachable, and stops
// cleanly. It makes no decisions of its own: what a claim or an answer means is the service's.
package worker

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// RunOnce performs one cycle on one task, logs its events (CLAIMED, CALLED and RESULT) and reports its
// call and result to obs (nil: none). It claims one task in one transaction, calls its channel, and
// records the answer in one finish transaction.
func RunOnce(ctx context.Context, d Dispatcher, log *slog.Logger, obs service.Observer) (service.Result, error) {
	if log == nil {
		log = slog.Default()
	}
	if obs == nil {
		obs = service.NopObserver{}
	}
	attempts, settled, err := d.ClaimBatch(ctx, 1)
	if err != nil {
		return service.Result{Kind: service.ResultNothing}, err
	}
	logSettled(log, settled)
	results := settled
	if len(attempts) > 0 { // a claim of one: one attempt, called here
		answers := make([]delivery.Observation, len(attempts))
		for i, a := range attempts {
			logClaimed(log, a)
			var took time.Duration
			answers[i], took = timedCall(ctx, d, a, log)
			obs.Called(service.CallEvent{Attempt: a, Observation: answers[i], Took: took})
		}
		finished, ferr := d.FinishBatch(ctx, attempts, answers)
		if ferr != nil {
			logFinishFailed(log, len(attempts), ferr)
			err = ferr
		} else {
			logFinished(log, finished)
			results = append(settled, finished...)
		}
	}
	report(obs, results)
	if len(results) == 0 {
		return service.Result{Kind: service.ResultNothing}, err
	}
	if err == nil && results[0].Kind == service.ResultUnrecorded {
		err = results[0].Err // a failed finish ("finish: ..."), as for a batch of one it always was
	}
	if err == nil && results[0].Kind == service.ResultSetAside {
		err = fmt.Errorf("claim: task %d set aside until the longest backoff has passed: %w", results[0].TaskID, results[0].Err)
	}
	return results[0], err
}

// timedCall calls the attempt's channel and logs CALLED: the one place a call is timed, for the log
// and the Observer.
func timedCall(ctx context.Context, d Dispatcher, a *service.Attempt, log *slog.Logger) (delivery.Observation, time.Duration) {
	started := time.Now()
	answer := d.Call(ctx, a)
	took := time.Since(started)
	logCalled(log, a, answer, took)
	return answer, took
}

// report hands each result to obs: a set-aside task as SetAside, any other as Completed.
func report(obs service.Observer, results []service.Result) {
	for _, res := range results {
		if res.Kind == service.ResultSetAside {
			obs.SetAside(res)
			continue
		}
		obs.Completed(res)
	}
}

// logClaimed logs CLAIMED for an attempt, before its call.
func logClaimed(log *slog.Logger, a *service.Attempt) {
	log.Info("CLAIMED", "task", a.TaskID, "channel", a.Channel, "attempt", a.No, "action", a.Action,
		"uncertain", a.PriorUncertain, "token", prefix(a.Token))
}

// logCalled logs CALLED for an attempt whose call answered obs after took.
func logCalled(log *slog.Logger, a *service.Attempt, obs delivery.Observation, took time.Duration) {
	log.Info("CALLED", "task", a.TaskID, "attempt", a.No, "action", a.Action, "outcome", obs.Outcome,
		"provider_msg_id", obs.ProviderMsgID, "ms", took.Milliseconds(), "token", prefix(a.Token))
}

func logSettled(log *slog.Logger, settled []service.Result) {
	for _, res := range settled {
		if res.Kind == service.ResultSetAside {
			log.Error("claim refused by the database for this task's own rows; set aside, the queue goes on",
				"task", res.TaskID, "channel", res.Channel, "error", res.Detail)
			continue
		}
		log.Info("RESULT", "result", res.Kind, "task", res.TaskID, "channel", res.Channel, "attempt", res.Attempt,
			"action", res.Action, "outcome", res.Outcome, "detail", res.Detail)
	}
}

// logFinished logs RESULT per finished task.
func logFinished(log *slog.Logger, results []service.Result) {
	for _, res := range results {
		if res.Kind == service.ResultUnrecorded {
			log.Error("finish failed for this task; it will be recovered after its lease", "task", res.TaskID,
				"attempt", res.Attempt, "outcome", res.Outcome, "token", prefix(res.Token), "error", res.Detail)
			continue
		}
		if res.PrefDisabled {
			log.Info("RESULT", "result", res.Kind, "task", res.TaskID, "attempt", res.Attempt, "action", res.Action,
				"outcome", res.Outcome, "token", prefix(res.Token), "pref_disabled", true, "detail", res.Detail)
			continue
		}
		log.Info("RESULT", "result", res.Kind, "task", res.TaskID, "attempt", res.Attempt, "action", res.Action,
			"outcome", res.Outcome, "token", prefix(res.Token))
	}
}

func logFinishFailed(log *slog.Logger, tasks int, err error) {
	// The tasks stay SENDING with these tokens; lease expiry recovers them, as uncertain.
	log.Error("finish failed; the tasks will be recovered after their lease", "tasks", tasks, "error", err)
}

// dbHealth logs one line when cycles start failing and one when they recover, not one per retry. Only
// the loop's own goroutine uses it (claims and finishes report back to it over channels).
type dbHealth struct {
	failing bool
	since   time.Time
	log     *slog.Logger
}

func (h *dbHealth) failed(err error) {
	if !h.failing {
		h.failing, h.since = true, time.Now()
		h.log.Error("cycles failing; retrying with backoff", "error", err)
	}
}

func (h *dbHealth) ok() {
	if h.failing {
		h.failing = false
		h.log.Info("cycles recovered", "after", time.Since(h.since).Round(time.Millisecond).String())
	}
}

// prefix is a token's first 8 characters, enough to tell attempts apart in a log line.
func prefix(token string) string { return token[:min(8, len(token))] }
