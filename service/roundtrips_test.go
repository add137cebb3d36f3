package service_test

import (
	"context"
	"net"
	"strconv"
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

// Per delivery a worker waits on the database three times: a claim costs two round trips (BEGIN with
// TaskClaim, TaskStartAttempts with COMMIT, plain pgx batches) and a finish one (TaskFinish,
// autocommit); an idle claim two. The same holds on connections told not to prepare statements (for
// poolers that drop them). Round trips are what a worker's throughput pays for on a busy machine
// (docs/benchmarks.md#what-limits-throughput-here).
func TestDeliveryRoundTrips(t *testing.T) {
	for name, mode := range map[string]pgx.QueryExecMode{
		"prepared":   pgx.QueryExecModeCacheStatement, // pgx's default
		"unprepared": pgx.QueryExecModeExec,           // as default_query_exec_mode=exec in the URL
	} {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			e.w.User("u1", "push")
			d, trips := countedDispatcher(t, e, mode)
			counted := func(f func()) int64 {
				start := trips.n.Load()
				f()
				return trips.n.Load() - start
			}
			deliver := func() (claim, finish int64) {
				var attempts []*service.Attempt
				claim = counted(func() {
					var (
						settled []service.Result
						err     error
					)
					attempts, settled, err = d.ClaimBatch(e.ctx, 1)
					is.NoErr(err)              // claim
					is.Equal(len(settled), 0)  // nothing settled without a call
					is.Equal(len(attempts), 1) // one task claimed
				})
				obs := callAll(e.ctx, d, attempts)
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
		})
	}
}

// Review reads a page's histories in one statement: its round trips do not grow with the tasks it
// shows (it read each task's attempts with a statement of its own), and each task gets its own
// history, as Attempts reads it.
func TestReviewRoundTripsDoNotGrowWithThePage(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	const tasks = 6
	for i := range tasks {
		e.create("u1", "e"+strconv.Itoa(i), time.Hour, 3)
	}
	parker, err := service.NewDispatcher(e.ctx, e.workerPool, service.DispatcherConfig{Worker: "w-park",
		Routes: map[string]delivery.Route{"push": {Mode: delivery.ModeNone, Client: answering{Outcome: delivery.OutcomeTimeout}}}})
	is.NoErr(err)
	for range tasks {
		res, err := runCycle(e.ctx, parker)
		is.NoErr(err)
		is.Equal(res.Kind, service.ResultParked) // a NONE channel's timeout parks at once
	}

	cfg, err := pgxpool.ParseConfig(e.pool.Config().ConnString())
	is.NoErr(err)
	trips := &roundTrips{}
	cfg.ConnConfig.DialFunc = trips.dial
	cfg.MaxConns = 1 // one connection, whose prepared statements every Review reuses
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	is.NoErr(err)
	t.Cleanup(pool.Close)
	n := service.NewNotifier(pool)
	review := func(limit int) ([]service.ReviewTask, int64) {
		start := trips.n.Load()
		list, err := n.Review(e.ctx, 0, limit)
		is.NoErr(err)
		return list, trips.n.Load() - start
	}
	review(tasks) // connects and prepares
	one, tripsForOne := review(1)
	all, tripsForAll := review(tasks)
	is.Equal(len(one), 1)              // a page of one
	is.Equal(len(all), tasks)          // a page of all
	is.Equal(tripsForAll, tripsForOne) // the same round trips
	for _, p := range all {
		is.Equal(p.Attempts, e.attempts(p.ID)) // each task's own history
		is.Equal(len(p.Attempts), 1)           // its one timed-out attempt
	}
}
