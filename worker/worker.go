// Package worker runs a Dispatcher's claim-call-finish cycle in a loop: polling when idle, backing off
// when the database is unreachable, and stopping cleanly. It makes no decisions of its own.
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

// Config of a worker loop.
type Config struct {
	Concurrency int           // cycles running at once (default 1)
	Batch       int           // tasks per cycle: claimed in one transaction, finished in one (default 1)
	Poll        time.Duration // wait after finding nothing to do (default 200ms)
	MaxBackoff  time.Duration // longest wait between retries while the database fails (default 10s)
	Logger      *slog.Logger  // default slog.Default()
	OnResult    func(service.Result)
}

// RunOnce performs one cycle on one task and logs its events: CLAIMED, CALLED and RESULT.
func RunOnce(ctx context.Context, d *service.Dispatcher, log *slog.Logger) (service.Result, error) {
	results, err := RunBatch(ctx, d, 1, log)
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

// RunBatch performs one cycle on up to batch tasks: one claim transaction, the calls concurrently, one
// finish transaction. It logs CLAIMED, CALLED and RESULT per task. No result means nothing was due.
func RunBatch(ctx context.Context, d *service.Dispatcher, batch int, log *slog.Logger) ([]service.Result, error) {
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
func call(ctx context.Context, d *service.Dispatcher, attempts []*service.Attempt, log *slog.Logger) ([]service.Observation, []time.Duration) {
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

// Run loops until ctx ends. On cancellation no new task is claimed; cycles already calling a channel
// finish their call (bounded by the client timeout) and record it before Run returns.
func Run(ctx context.Context, d *service.Dispatcher, cfg Config) {
	if cfg.Concurrency < 1 {
		cfg.Concurrency = 1
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 200 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	l := &loop{d: d, cfg: cfg, health: &dbHealth{log: cfg.Logger}}
	var wg sync.WaitGroup
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.run(ctx)
		}()
	}
	wg.Wait()
}

// loop is one worker's cycles. While tasks keep coming, each finish carries the next claim
// (FinishBatchThenClaim); after an empty claim or a failure it waits and claims on its own.
type loop struct {
	d      *service.Dispatcher
	cfg    Config
	health *dbHealth
}

func (l *loop) run(ctx context.Context) {
	log := l.cfg.Logger
	var (
		held []*service.Attempt // claimed, to call and finish
		wait time.Duration
	)
	for {
		if len(held) == 0 {
			if !sleep(ctx, wait) {
				return
			}
			attempts, settled, err := l.d.ClaimBatch(ctx, l.cfg.Batch)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				wait = l.failed(err, wait)
				continue
			}
			l.health.ok()
			logSettled(log, settled)
			l.report(settled)
			held, wait = attempts, l.idle(attempts, settled)
			continue
		}
		obs, elapsed := call(ctx, l.d, held, log)
		if ctx.Err() != nil { // stopping: record what was called, claim nothing more
			if results, err := l.d.FinishBatch(ctx, held, obs); err != nil {
				logFinishFailed(log, len(held), err)
			} else {
				l.report(logFinished(log, results, elapsed))
			}
			return
		}
		h := l.d.FinishBatchThenClaim(ctx, held, obs, l.cfg.Batch)
		if h.FinishErr != nil {
			logFinishFailed(log, len(held), h.FinishErr)
		} else {
			l.report(logFinished(log, h.Finished, elapsed))
		}
		held = nil
		switch {
		case h.ClaimErr != nil && ctx.Err() != nil:
			return
		case h.ClaimErr != nil:
			wait = l.failed(h.ClaimErr, wait)
		case h.FinishErr != nil:
			wait = l.failed(h.FinishErr, wait)
			held = h.Next // claimed all the same: this worker holds their tokens
			logSettled(log, h.Settled)
			l.report(h.Settled)
		default:
			l.health.ok()
			logSettled(log, h.Settled)
			l.report(h.Settled)
			held, wait = h.Next, l.idle(h.Next, h.Settled)
		}
	}
}

// failed records a failed cycle and returns the backoff before the next claim.
func (l *loop) failed(err error, wait time.Duration) time.Duration {
	l.health.failed(err)
	return min(max(2*wait, l.cfg.Poll), l.cfg.MaxBackoff)
}

// idle is the wait before the next claim: none while tasks come, the poll interval after an empty one.
func (l *loop) idle(attempts []*service.Attempt, settled []service.Result) time.Duration {
	if len(attempts)+len(settled) == 0 {
		return l.cfg.Poll
	}
	return 0
}

func (l *loop) report(results []service.Result) {
	if l.cfg.OnResult == nil {
		return
	}
	for _, res := range results {
		l.cfg.OnResult(res)
	}
}

// sleep waits d or until ctx ends; it reports whether to go on.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
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
