package service_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
)

// ownServer is a PostgreSQL server of the test's own, whose configuration the test may change (ALTER
// SYSTEM), migrated, with one due task on the none channel (a fake) per user, created through local:
// the test's own pool.
type ownServer struct {
	ctx   context.Context
	url   string
	local *pgxpool.Pool
	none  *fakes.Channel
}

// newOwnServer starts the server, or skips the test. localParams is added to the URL of the test's own
// pool ("&options=..."), empty for none.
func newOwnServer(t *testing.T, localParams string, users ...string) *ownServer {
	is := is.New(t)
	ctx := context.Background()
	srv, err := pgtest.StartServer(ctx)
	if err != nil {
		t.Skipf("needs a server of its own: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	is.NoErr(pgtest.Migrate(ctx, srv.URL()))
	s := &ownServer{ctx: ctx, url: srv.URL(), none: fakes.Start(fakes.None)}
	t.Cleanup(s.none.Close)
	s.local, err = pgxpool.New(ctx, s.url+localParams)
	is.NoErr(err)
	t.Cleanup(s.local.Close)
	n := service.NewNotifier(s.local)
	for _, u := range users {
		_, err := n.SetPreference(ctx, u, "none", u+"@none", true)
		is.NoErr(err)
		_, _, _, err = n.Create(ctx, service.CreateRequest{UserID: u, EventKey: "e1", Body: "hello", TTL: time.Hour, MaxAttempts: 3})
		is.NoErr(err)
	}
	return s
}

// dispatcher is a worker's Dispatcher on a pool of its own (service.ConfigureWorkerConn), whose
// sessions are named app (application_name), with the none channel routed to the fake; cfg holds the
// other settings.
func (s *ownServer) dispatcher(t *testing.T, app string, cfg service.DispatcherConfig) *service.Dispatcher {
	is := is.New(t)
	client, err := httpchannel.New(s.none.URL(), httpchannel.Options{})
	is.NoErr(err)
	poolCfg, err := pgxpool.ParseConfig(s.url)
	is.NoErr(err)
	service.ConfigureWorkerConn(poolCfg.ConnConfig)
	poolCfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(s.ctx, poolCfg)
	is.NoErr(err)
	t.Cleanup(pool.Close)
	cfg.Routes = map[string]delivery.Route{"none": {Mode: delivery.ModeNone, Client: client}}
	d, err := service.NewDispatcher(t.Context(), pool, cfg)
	is.NoErr(err)
	return d
}

// terminateEachWaiting terminates, every 5 ms, the sessions of pool's database that wait for a lock
// and match where (a condition on pg_stat_activity), as a failover or a restart breaks connections, until stop is called;
// stop returns how many sessions it terminated. A session is counted once: pg_terminate_backend only
// signals it, and on a loaded machine it may still wait there at the next look.
func terminateEachWaiting(ctx context.Context, pool *pgxpool.Pool, where string) (stop func() int) {
	var (
		terminated = map[int32]bool{}
		quit       = make(chan struct{})
		stopped    = make(chan struct{})
	)
	go func() {
		defer close(stopped)
		for {
			select {
			case <-quit:
				return
			case <-time.After(5 * time.Millisecond):
			}
			var pid int32
			var signalled bool
			// Only this test's database: the package's tests run in parallel on one server.
			err := pool.QueryRow(ctx, `SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND `+where).Scan(&pid, &signalled)
			if err == nil && signalled {
				terminated[pid] = true
			}
		}
	}()
	return func() int {
		close(quit)
		<-stopped
		return len(terminated)
	}
}
