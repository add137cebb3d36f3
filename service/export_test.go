package service

// What the tests of service_test need to see inside the package: compiled into this package's tests
// only, so the binary does not carry them. The cycle itself is the production one (worker.RunOnce, or
// ClaimBatch, Call and FinishBatch); only what touches unexported names is here.

import (
	"context"
	"time"

	"github.com/notifierhq/notifier/service/delivery"
)

// FinishBatchOnce is FinishBatch without the retry of a finish lost to a broken connection: one try,
// as before the finish was idempotent. The negative control of that retry; it reaches the unexported
// finishParams, finishTry and finishResults, which production reaches only through the retry.
func (d *Dispatcher) FinishBatchOnce(ctx context.Context, attempts []*Attempt, obs []delivery.Observation) ([]Result, error) {
	params, results, err := d.finishParams(attempts, obs)
	if err != nil {
		return nil, err
	}
	rows, err := d.finishTry(ctx, params, time.Now().Add(d.cfg.DBTimeout))
	return finishResults(attempts, results, rows, err)
}

// ConfigureRateLimits writes this dispatcher's limits again, as a second worker starting would:
// production writes them once, in NewDispatcher (the unexported configureRateLimits).
func (d *Dispatcher) ConfigureRateLimits(ctx context.Context) ([]Bucket, error) {
	return d.configureRateLimits(ctx)
}
