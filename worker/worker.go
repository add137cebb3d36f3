// Package worker runs a Dispatcher's claim-call-finish cycle: one cycle (RunOnce, for
// `notifier work --once`), or a streaming loop (Run) that keeps a window of calls in flight, records
// answers as they come, polls when idle, backs off while the database is unreachable, and stops
// cleanly. It makes no decisions of its own: what a claim or an answer means is the service's.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/notifierhq/notifier/service"
)

// RunOnce performs one cycle on one task and logs its events: CLAIMED, CALLED and RESULT.
func RunOnce(ctx context.Context, d Dispatcher, log *slog.Logger) (service.Result, error) {
	results, err := runBatch(ctx, d, 1, log)
	if len(results) == 0 {
		return service.Result{Kind: service.ResultNothing}, err
	}
	if err == nil && results[0].Kind == service.ResultUnrecorded {
		err = errors.New(results[0].Detail) // a failed finish ("finish: ..."), as for a batch of one it always was
	}
	if err == nil && results[0].Kind == service.ResultSetAside {
		err = fmt.Errorf("claim: task %d set aside: %s", results[0].TaskID, results[0].Detail)
	}
	return results[0], err
}

// runBatch performs one cycle on up to batch tasks: one claim transaction, the calls concurrently, one
// finish transaction. It logs CLAIMED, CALLED and RESULT per task. No result means nothing was due.
func runBatch(ctx context.Context, d Dispatcher, batch int, log *slog.Logger) ([]service.Result, error) {
	if log == nil {
		log = slog.Default()
	}
	attempts, settled, err := d.ClaimBatch(ctx, batch)
	if err != nil {
		return nil, err
	}
	logSettled(log, settled)
	if len(attempts) == 0 {
		return settled, nil
	}
	obs, elapsed := call(ctx, d, attempts, log)
	results, err := d.FinishBatch(ctx, attempts, obs)
	if err != nil {
		logFinishFailed(log, len(attempts), err)
		return settled, err
	}
	return append(settled, logFinished(log, results, elapsed)...), nil
}

// call calls the attempts' channels concurrently and logs CLAIMED and CALLED per task.
func call(ctx context.Context, d Dispatcher, attempts []*service.Attempt, log *slog.Logger) ([]service.Observation, []time.Duration) {
	obs := make([]service.Observation, len(attempts))
	elapsed := make([]time.Duration, len(attempts))
	var wg sync.WaitGroup
	for i, a := range attempts {
		log.Info("CLAIMED", "task", a.TaskID, "channel", a.Channel, "attempt", a.No, "action", a.Action,
			"uncertain", a.PriorUncertain, "token", prefix(a.Token))
		wg.Add(1)
		go func() {
			defer wg.Done()
			started := time.Now()
			obs[i] = d.Call(ctx, a)
			elapsed[i] = time.Since(started)
			log.Info("CALLED", "task", a.TaskID, "attempt", a.No, "action", a.Action, "outcome", obs[i].Outcome,
				"msg", obs[i].ProviderMsgID, "ms", elapsed[i].Milliseconds(), "token", prefix(a.Token))
		}()
	}
	wg.Wait()
	return obs, elapsed
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

// logFinished logs RESULT per finished task and sets the results' call durations.
func logFinished(log *slog.Logger, results []service.Result, elapsed []time.Duration) []service.Result {
	for i, res := range results {
		res.CallDuration = elapsed[i]
		results[i] = res
		if res.Kind == service.ResultUnrecorded {
			log.Error("finish failed for this task; it will be recovered after its lease", "task", res.TaskID,
				"attempt", res.Attempt, "outcome", res.Outcome, "token", prefix(res.Token), "error", res.Detail)
			continue
		}
		log.Info("RESULT", "result", res.Kind, "task", res.TaskID, "attempt", res.Attempt, "action", res.Action,
			"outcome", res.Outcome, "token", prefix(res.Token))
	}
	return results
}

func logFinishFailed(log *slog.Logger, tasks int, err error) {
	// The tasks stay SENDING with these tokens; lease expiry recovers them, as uncertain.
	log.Error("finish failed; the tasks will be recovered after their lease", "tasks", tasks, "error", err)
}

// dbHealth logs one line when cycles start failing and one when they recover, not one per retry.
type dbHealth struct {
	mu      sync.Mutex
	failing bool
	since   time.Time
	log     *slog.Logger
}

func (h *dbHealth) failed(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.failing {
		h.failing, h.since = true, time.Now()
		h.log.Error("cycles failing; retrying with backoff", "error", err)
	}
}

func (h *dbHealth) ok() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failing {
		h.failing = false
		h.log.Info("cycles recovered", "after", time.Since(h.since).Round(time.Millisecond).String())
	}
}

func prefix(token string) string {
	if len(token) > 8 {
		return token[:8]
	}
	return token
}
