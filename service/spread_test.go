package service_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
)

// Tasks refused together (a provider's 503 to a whole window) do not come back together: each retry
// waits its backoff, lengthened by up to a quarter at random, never less.
func TestRetriesAreSpread(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	for i := range 20 {
		user := fmt.Sprintf("u%d", i)
		e.w.User(user, "push")
		e.create(user, "e1", time.Hour, 3)
	}
	e.push.SetFallback(func() fakes.Step { return fakes.Step{Status: 503} }, nil)
	d := e.dispatcher(dcfg{backoff: 10 * time.Second})
	attempts, _, err := d.ClaimBatch(e.ctx, 20)
	is.NoErr(err)
	results, err := d.FinishBatch(e.ctx, attempts, callAll(e.ctx, d, attempts))
	is.NoErr(err)
	for _, r := range results {
		is.Equal(r.Kind, service.ResultPending) // refused before acceptance: retried
	}
	rows, err := e.pool.Query(e.ctx, `SELECT extract(epoch FROM next_attempt_at - updated_at)::float8 FROM delivery_task`)
	is.NoErr(err)
	waits := map[float64]bool{}
	for rows.Next() {
		var w float64
		is.NoErr(rows.Scan(&w))
		is.True(w >= 10 && w <= 12.5) // the backoff, and at most a quarter more
		waits[w] = true
	}
	is.NoErr(rows.Err())
	is.True(len(waits) >= 15) // not in lockstep
}
