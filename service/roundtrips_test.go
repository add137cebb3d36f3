package service_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
)

// roundTrips counts what connections write: pgx writes a query, a batch or a pipeline at once and
// then waits for the answer, so each write is a round trip.
type roundTrips struct{ n atomic.Int64 }

type countingConn struct {
	net.Conn
	trips *roundTrips
}

func (c countingConn) Write(b []byte) (int, error) {
	c.trips.n.Add(1)
	return c.Conn.Write(b)
}

func (r *roundTrips) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: conn, trips: r}, nil
}

// countedDispatcher is a push dispatcher on a pool of one connection (so statements prepared by one
// delivery are reused by the next) whose writes are counted; mode sets the pool's query exec mode.
func countedDispatcher(t *testing.T, e *env, mode pgx.QueryExecMode) (*service.Dispatcher, *roundTrips) {
	is := is.New(t)
	is.Helper()
	cfg, err := pgxpool.ParseConfig(e.pool.Config().ConnString())
	is.NoErr(err) // pool config
	cfg.ConnConfig.DefaultQueryExecMode = mode
	trips := &roundTrips{}
	cfg.ConnConfig.DialFunc = trips.dial
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	is.NoErr(err) // counted pool
	t.Cleanup(pool.Close)
	client, err := httpchannel.New(e.push.URL(), httpchannel.Options{})
	is.NoErr(err) // push client
	d, err := service.NewDispatcher(t.Context(), pool, service.DispatcherConfig{
		Worker: "w-trips", Routes: map[string]delivery.Route{"push": {Mode: delivery.ModeIdempotent, Client: client}},
	})
	is.NoErr(err) // dispatcher
	return d, trips
}

// Per delivery a worker waits on the database twice: TaskFinish of the previous batch with BEGIN and
// TaskClaim (FinishBatchThenClaim), then TaskStartAttempts with COMMIT. Alone, a claim costs two
// round trips (BEGIN with TaskClaim, TaskStartAttempts with COMMIT) and a finish one; an idle claim
// two. Round trips are what a worker's throughput pays for on a busy machine (docs/benchmarks.md#what-limits-throughput-here).
func TestDeliveryRoundTrips(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.user("u1", "push")
	d, trips := countedDispatcher(t, e, pgx.QueryExecModeCacheStatement) // pgx's default
	var err error
	counted := func(f func()) int64 {
		start := trips.n.Load()
		f()
		return trips.n.Load() - start
	}

	// Claim and finish on their own.
	deliver := func() (claim, finish int64) {
		var attempts []*service.Attempt
		claim = counted(func() {
			var settled []service.Result
			attempts, settled, err = d.ClaimBatch(e.ctx, 1)
			is.NoErr(err)              // claim
			is.Equal(len(settled), 0)  // nothing settled without a call
			is.Equal(len(attempts), 1) // one task claimed
		})
		obs := d.CallAll(e.ctx, attempts)
		finish = counted(func() {
			results, err := d.FinishBatch(e.ctx, attempts, obs)
			is.NoErr(err)                                 // finish
			is.Equal(results[0].Kind, service.ResultSent) // delivered
		})
		return claim, finish
	}
	e.create("u1", "warm-up", time.Hour, 3)
	deliver() // prepares every statement on the connection
	e.create("u1", "counted", time.Hour, 3)
	claim, finish := deliver()
	is.Equal(claim, int64(2))  // BEGIN+TaskClaim, TaskStartAttempts+COMMIT
	is.Equal(finish, int64(1)) // TaskFinish, autocommit

	idle := counted(func() {
		attempts, settled, err := d.ClaimBatch(e.ctx, 1)
		is.NoErr(err)                           // idle claim
		is.Equal(len(attempts)+len(settled), 0) // nothing due
	})
	is.Equal(idle, int64(2)) // BEGIN+TaskClaim, COMMIT

	// A worker's cycle: each finish carries the next claim.
	for _, event := range []string{"p1", "p2", "p3"} {
		e.create("u1", event, time.Hour, 3)
	}
	attempts, _, err := d.ClaimBatch(e.ctx, 1)
	is.NoErr(err) // first claim
	cycle := func(wantNext int) int64 {
		return counted(func() {
			h := d.FinishBatchThenClaim(e.ctx, attempts, d.CallAll(e.ctx, attempts), 1)
			is.NoErr(h.FinishErr)                            // finish
			is.NoErr(h.ClaimErr)                             // next claim
			is.Equal(h.Finished[0].Kind, service.ResultSent) // delivered
			is.Equal(len(h.Next), wantNext)                  // claimed in the same cycle
			attempts = h.Next
		})
	}
	cycle(1)                     // prepares the pipelined statements
	is.Equal(cycle(1), int64(2)) // TaskFinish+BEGIN+TaskClaim, TaskStartAttempts+COMMIT
	is.Equal(cycle(0), int64(2)) // TaskFinish+BEGIN+TaskClaim, COMMIT: nothing left
}

// Connections told not to prepare statements (for poolers that drop them) finish and claim on their own:
// the same results, one round trip more.
func TestFinishThenClaimWithoutPreparedStatements(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.user("u1", "push")
	d, trips := countedDispatcher(t, e, pgx.QueryExecModeExec) // as default_query_exec_mode=exec in the URL
	for _, event := range []string{"x1", "x2"} {
		e.create("u1", event, time.Hour, 3)
	}
	attempts, _, err := d.ClaimBatch(e.ctx, 1)
	is.NoErr(err)              // first claim
	is.Equal(len(attempts), 1) // one task
	start := trips.n.Load()
	h := d.FinishBatchThenClaim(e.ctx, attempts, d.CallAll(e.ctx, attempts), 1)
	is.NoErr(h.FinishErr)                            // finish
	is.NoErr(h.ClaimErr)                             // next claim
	is.Equal(h.Finished[0].Kind, service.ResultSent) // delivered
	is.Equal(len(h.Next), 1)                         // the second task claimed
	is.Equal(trips.n.Load()-start, int64(3))         // TaskFinish; BEGIN+TaskClaim; TaskStartAttempts+COMMIT
	results, err := d.FinishBatch(e.ctx, h.Next, d.CallAll(e.ctx, h.Next))
	is.NoErr(err)                                 // last finish
	is.Equal(results[0].Kind, service.ResultSent) // delivered too
}
