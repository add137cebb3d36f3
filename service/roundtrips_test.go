package service_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/httpchannel"
)

// roundTrips counts what a connection sends and waits for: a query, or a batch of them.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// Per delivery a worker waits on the database three times: BEGIN with TaskClaim, TaskStartAttempts
// with COMMIT, and TaskFinish. An idle claim costs two. Round trips are what a worker's throughput pays
// for on a busy machine (README "What limits throughput here").
func TestDeliveryRoundTrips(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.user("u1", "push")
	cfg, err := pgxpool.ParseConfig(e.pool.Config().ConnString())
	is.NoErr(err) // pool config
	trips := &roundTrips{}
	cfg.ConnConfig.Tracer = trips
	cfg.MaxConns = 1 // one connection, so statements prepared by the first delivery are reused
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	is.NoErr(err) // traced pool
	t.Cleanup(pool.Close)
	client, err := httpchannel.New(e.push.URL(), httpchannel.Options{})
	is.NoErr(err) // push client
	d, err := service.NewDispatcher(pool, service.DispatcherConfig{
		Worker: "w-trips", Routes: map[string]service.Route{"push": {Mode: service.ModeIdempotent, Client: client}},
	})
	is.NoErr(err) // dispatcher

	deliver := func() (claim, finish int64) {
		start := trips.n.Load()
		attempts, settled, err := d.ClaimBatch(e.ctx, 1)
		is.NoErr(err)              // claim
		is.Equal(len(settled), 0)  // nothing settled without a call
		is.Equal(len(attempts), 1) // one task claimed
		claim = trips.n.Load() - start
		obs := d.CallAll(e.ctx, attempts)
		start = trips.n.Load()
		results, err := d.FinishBatch(e.ctx, attempts, obs)
		is.NoErr(err)                                 // finish
		is.Equal(results[0].Kind, service.ResultSent) // delivered
		return claim, trips.n.Load() - start
	}
	e.create("u1", "warm-up", time.Hour, 3)
	deliver() // prepares every statement on the connection
	e.create("u1", "counted", time.Hour, 3)
	claim, finish := deliver()
	is.Equal(claim, int64(2))  // BEGIN+TaskClaim, TaskStartAttempts+COMMIT
	is.Equal(finish, int64(1)) // TaskFinish, autocommit

	start := trips.n.Load()
	attempts, settled, err := d.ClaimBatch(e.ctx, 1)
	is.NoErr(err)                            // idle claim
	is.Equal(len(attempts)+len(settled), 0)  // nothing due
	is.Equal(trips.n.Load()-start, int64(2)) // BEGIN+TaskClaim, COMMIT
}
