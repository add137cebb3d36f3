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

// A finish that meets a read-only server (SQLSTATE 25006: a primary demoted by a failover, its
// connections still open) drops the pool's connections and is sent again on a new one, which (with
// target_session_attrs=read-write) reaches the new primary. Played on a server of its own: every
// session turns read-only (default_transaction_read_only in the server's configuration, reloaded), while
// the worker's role starts new sessions writable (its own setting, which an open session does not
// read again), so only a new connection can record the finish. Kept on the connection that failed, the
// finish would be refused until the lease left no time.
func TestFinishMeetingAReadOnlyServerReconnects(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	srv, err := pgtest.StartServer(ctx)
	if err != nil {
		t.Skipf("needs a server of its own: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	is.NoErr(pgtest.Migrate(ctx, srv.URL()))
	local, err := pgxpool.New(ctx, srv.URL())
	is.NoErr(err)
	t.Cleanup(local.Close)
	n := service.NewNotifier(local)
	_, err = n.SetPreference(ctx, "u1", "none", "u1@none", true)
	is.NoErr(err)
	_, _, _, err = n.Create(ctx, service.CreateRequest{UserID: "u1", EventKey: "e1", Body: "hello", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)

	none := fakes.Start(fakes.None)
	t.Cleanup(none.Close)
	client, err := httpchannel.New(none.URL(), httpchannel.Options{})
	is.NoErr(err)
	cfg, err := pgxpool.ParseConfig(srv.URL())
	is.NoErr(err)
	service.ConfigureWorkerConn(cfg.ConnConfig)
	workerPool, err := pgxpool.NewWithConfig(ctx, cfg)
	is.NoErr(err)
	t.Cleanup(workerPool.Close)
	var retried int
	d, err := service.NewDispatcher(t.Context(), workerPool, service.DispatcherConfig{Worker: "w1",
		Routes: map[string]delivery.Route{"none": {Mode: delivery.ModeNone, Client: client}},
		Lease:  5 * time.Second, DBTimeout: 2 * time.Second,
		FinishRetried: func(_, _ int, _ error) { retried++ }})
	is.NoErr(err)
	attempts, _, err := d.ClaimBatch(ctx, 10)
	is.NoErr(err)
	is.Equal(len(attempts), 1)
	obs := d.CallAll(ctx, attempts)

	open, err := local.Acquire(ctx) // a session opened before the change: it sees what the worker's sees
	is.NoErr(err)
	defer open.Release()
	var role string
	is.NoErr(open.QueryRow(ctx, `SELECT current_user`).Scan(&role))
	_, err = local.Exec(ctx, `ALTER ROLE "`+role+`" SET default_transaction_read_only = off`) // new sessions
	is.NoErr(err)
	_, err = local.Exec(ctx, `ALTER SYSTEM SET default_transaction_read_only = on`) // open sessions
	is.NoErr(err)
	_, err = local.Exec(ctx, `SELECT pg_reload_conf()`)
	is.NoErr(err)
	for deadline := time.Now().Add(30 * time.Second); ; { // open sessions have read the new configuration
		var ro string
		is.NoErr(open.QueryRow(ctx, `SHOW default_transaction_read_only`).Scan(&ro))
		if ro == "on" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reloaded configuration never reached an open session")
		}
		time.Sleep(10 * time.Millisecond)
	}

	results, err := d.FinishBatch(ctx, attempts, obs)
	is.NoErr(err) // recorded on a new connection
	is.Equal(results[0].Kind, service.ResultSent)
	is.True(retried >= 1) // after the read-only server refused it
}
