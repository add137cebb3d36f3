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
	Poll        time.Duration // wait after finding nothing to do (default 200ms)
	MaxBackoff  time.Duration // longest wait between retries while the database fails (default 10s)
	Logger      *slog.Logger  // default slog.Default()
	OnResult    func(service.Result)
}

// RunOnce performs one cycle and logs its events: CLAIMED, CALLED and RESULT.
func RunOnce(ctx context.Context, d *service.Dispatcher, log *slog.Logger) (service.Result, error) {
	if log == nil {
		log = slog.Default()
	}
	a, res, err := d.Claim(ctx)
	if err != nil {
		return res, err
	}
	if a == nil {
		if res.Kind != service.ResultNothing {
			log.Info("RESULT", "result", res.Kind, "task", res.TaskID, "channel", res.Channel, "attempt", res.Attempt,
				"action", res.Action, "outcome", res.Outcome, "detail", res.Detail)
		}
		return res, nil
	}
	log.Info("CLAIMED", "task", a.TaskID, "channel", a.Channel, "attempt", a.No, "action", a.Action,
		"uncertain", a.PriorUncertain, "token", prefix(a.Token))
	started := time.Now()
	obs := d.Call(ctx, a)
	log.Info("CALLED", "task", a.TaskID, "attempt", a.No, "action", a.Action, "outcome", obs.Outcome,
		"msg", obs.ProviderMsgID, "ms", time.Since(started).Milliseconds(), "token", prefix(a.Token))
	res, err = d.Finish(ctx, a, obs)
	if err != nil {
		// The task stays SENDING with this token; lease expiry recovers it, as uncertain.
		log.Error("finish failed; the task will be recovered after its lease", "task", a.TaskID, "attempt", a.No,
			"outcome", obs.Outcome, "error", err)
		return res, err
	}
	log.Info("RESULT", "result", res.Kind, "task", a.TaskID, "attempt", a.No, "action", a.Action,
		"outcome", obs.Outcome, "token", prefix(a.Token))
	return res, nil
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
		res, err := RunOnce(ctx, d, cfg.Logger)
		switch {
		case ctx.Err() != nil && err != nil:
			return
		case err != nil:
			health.failed(err)
			wait = min(max(2*wait, cfg.Poll), cfg.MaxBackoff)
			continue
		}
		health.ok()
		if cfg.OnResult != nil {
			cfg.OnResult(res)
		}
		wait = 0
		if res.Kind == service.ResultNothing {
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
