// Package worker runs a Dispatcher's claim-call-finish cycle in a loop: polling when idle, backing off
// when the database is unreachable, and stopping cleanly. It makes no decisions of its own.
package worker

import (
	"context"
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
	for _, res := range settled {
		log.Info("RESULT", "result", res.Kind, "task", res.TaskID, "channel", res.Channel, "attempt", res.Attempt,
			"action", res.Action, "outcome", res.Outcome, "detail", res.Detail)
	}
	if len(attempts) == 0 {
		return settled, nil
	}
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
	results, err := d.FinishBatch(ctx, attempts, obs)
	if err != nil {
		// The tasks stay SENDING with these tokens; lease expiry recovers them, as uncertain.
		log.Error("finish failed; the tasks will be recovered after their lease", "tasks", len(attempts), "error", err)
		return settled, err
	}
	for i, res := range results {
		res.CallDuration = elapsed[i]
		results[i] = res
		log.Info("RESULT", "result", res.Kind, "task", res.TaskID, "attempt", res.Attempt, "action", res.Action,
			"outcome", res.Outcome, "token", prefix(res.Token))
	}
	return append(settled, results...), nil
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
	health := &dbHealth{log: cfg.Logger}
	var wg sync.WaitGroup
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loop(ctx, d, cfg, health)
		}()
	}
	wg.Wait()
}

func loop(ctx context.Context, d *service.Dispatcher, cfg Config, health *dbHealth) {
	wait := time.Duration(0)
	for {
		if !sleep(ctx, wait) {
			return
		}
		results, err := RunBatch(ctx, d, cfg.Batch, cfg.Logger)
		switch {
		case ctx.Err() != nil && err != nil:
			return
		case err != nil:
			health.failed(err)
			wait = min(max(2*wait, cfg.Poll), cfg.MaxBackoff)
			continue
		}
		health.ok()
		for _, res := range results {
			if cfg.OnResult != nil {
				cfg.OnResult(res)
			}
		}
		wait = 0
		if len(results) == 0 {
			wait = cfg.Poll
		}
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
