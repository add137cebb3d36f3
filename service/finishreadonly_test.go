package service_test

import (
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
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
	s := newOwnServer(t, "", "u1")
	ctx, local := s.ctx, s.local
	var retried int
	d := s.dispatcher(t, "worker", service.DispatcherConfig{Worker: "w1", Lease: 5 * time.Second,
		DBTimeout: 2 * time.Second, Observer: testObserver{finishRetried: func(service.FinishRetryEvent) { retried++ }}})
	attempts, _, err := d.ClaimBatch(ctx, 10)
	is.NoErr(err)
	is.Equal(len(attempts), 1)
	obs := callAll(ctx, d, attempts)

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
	testworld.Eventually(t, 30*time.Second, "the reloaded configuration reaches an open session", func() bool {
		var ro string
		is.NoErr(open.QueryRow(ctx, `SHOW default_transaction_read_only`).Scan(&ro))
		return ro == "on"
	})

	results, err := d.FinishBatch(ctx, attempts, obs)
	is.NoErr(err) // recorded on a new connection
	is.Equal(results[0].Kind, service.ResultSent)
	is.True(retried >= 1) // after the read-only server refused it
}
