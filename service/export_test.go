package service

// Cycles of the dispatcher that only the tests run: production drives ClaimBatch, Call, FinishBatch
// from the worker's loop (package worker). Compiled into this package's tests
// only, so service_test sees them and the binary does not.

import (
	"context"
	"github.com/notifierhq/notifier/service/delivery"
	"sync"
	"time"
)

// RunOnce claims one due task, calls its channel outside any transaction, and records the result.
func (d *Dispatcher) RunOnce(ctx context.Context) (Result, error) {
	a, settled, err := d.Claim(ctx)
	if err != nil || a == nil {
		return settled, err
	}
	return d.Finish(ctx, a, d.Call(ctx, a))
}

// RunBatch claims up to batch due tasks in one transaction, calls their
// channels concurrently outside any transaction, and records all observations in one transaction, each
// still guarded by its own token. It returns the results of claim-time decisions and of calls; none
// when nothing was due.
func (d *Dispatcher) RunBatch(ctx context.Context, batch int) ([]Result, error) {
	attempts, settled, err := d.ClaimBatch(ctx, batch)
	if err != nil || len(attempts) == 0 {
		return settled, err
	}
	finished, err := d.FinishBatch(ctx, attempts, d.CallAll(ctx, attempts))
	return append(settled, finished...), err
}

// CallAll calls the channels of a batch concurrently; the observations are in the order of attempts.
func (d *Dispatcher) CallAll(ctx context.Context, attempts []*Attempt) []delivery.Observation {
	obs := make([]delivery.Observation, len(attempts))
	var wg sync.WaitGroup
	for i, a := range attempts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			obs[i] = d.Call(ctx, a)
		}()
	}
	wg.Wait()
	return obs
}

// Claim claims one task: ClaimBatch with a batch of one. Without an Attempt, the Result says what was
// decided without a call (NOTHING, SUPPRESSED, FAILED, PARKED).
func (d *Dispatcher) Claim(ctx context.Context) (*Attempt, Result, error) {
	attempts, settled, err := d.ClaimBatch(ctx, 1)
	switch {
	case err != nil:
		return nil, Result{}, err
	case len(attempts) == 1:
		a := attempts[0]
		return a, Result{Kind: ResultKind(delivery.StateSending), TaskID: a.TaskID, Channel: a.Channel, Attempt: a.No,
			Action: a.Action, Token: a.Token}, nil
	case len(settled) == 1:
		return nil, settled[0], nil
	}
	return nil, Result{Kind: ResultNothing}, nil
}

// Finish records one observation: FinishBatch with a batch of one.
func (d *Dispatcher) Finish(ctx context.Context, a *Attempt, obs delivery.Observation) (Result, error) {
	results, err := d.FinishBatch(ctx, []*Attempt{a}, []delivery.Observation{obs})
	if err != nil {
		return Result{}, err
	}
	return results[0], nil
}

// FinishBatchOnce is FinishBatch without the retry of a finish lost to a broken connection: one try,
// as before the finish was idempotent. The negative control of that retry.
func (d *Dispatcher) FinishBatchOnce(ctx context.Context, attempts []*Attempt, obs []delivery.Observation) ([]Result, error) {
	params, results, err := d.finishParams(attempts, obs)
	if err != nil {
		return nil, err
	}
	rows, err := d.finishTry(ctx, params, time.Now().Add(d.cfg.DBTimeout))
	return finishResults(attempts, results, rows, err)
}

// ConfigureRateLimits writes this dispatcher's limits again, as a second worker starting would.
func (d *Dispatcher) ConfigureRateLimits(ctx context.Context) ([]Bucket, error) {
	return d.configureRateLimits(ctx)
}
