package service_test

import (
	"context"
	"sync"
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

// A claim whose commit succeeded while its answer was lost: the claimer finds its tasks again by the
// tokens it chose, calls them, and they end SENT on their first attempt. Before, each waited for its
// lease to run out and was then taken over as uncertain: on a NONE channel, parked for a human, with no
// call ever made. Played on a server of its own that waits for a standby that never comes
// (synchronous_standby_names): the claim's COMMIT is written locally and then waits, and terminating
// its backend then loses the answer of a commit that happened (PostgreSQL warns "the transaction has
// already committed locally").
func TestClaimWhoseCommitAnswerWasLostIsRecovered(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	srv, err := pgtest.StartServer(ctx)
	if err != nil {
		t.Skipf("needs a server of its own: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	is.NoErr(pgtest.Migrate(ctx, srv.URL()))
	// The test's own sessions commit locally; the worker's (synchronous_commit=on) wait for a standby.
	local, err := pgxpool.New(ctx, srv.URL()+"&options=-c%20synchronous_commit%3Dlocal")
	is.NoErr(err)
	t.Cleanup(local.Close)
	n := service.NewNotifier(local)
	for _, u := range []string{"u1", "u2", "u3"} {
		_, err := n.SetPreference(ctx, u, "none", u+"@none", true)
		is.NoErr(err)
		_, _, _, err = n.Create(ctx, service.CreateRequest{UserID: u, EventKey: "e1", Body: "hello", TTL: time.Hour, MaxAttempts: 3})
		is.NoErr(err)
	}
	_, err = local.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = 'phantom'`)
	is.NoErr(err)
	_, err = local.Exec(ctx, `SELECT pg_reload_conf()`)
	is.NoErr(err)
	t.Cleanup(func() {
		_, _ = local.Exec(ctx, `ALTER SYSTEM RESET synchronous_standby_names`)
		_, _ = local.Exec(ctx, `SELECT pg_reload_conf()`)
	})

	none := fakes.Start(fakes.None)
	t.Cleanup(none.Close)
	client, err := httpchannel.New(none.URL(), httpchannel.Options{})
	is.NoErr(err)
	cfg, err := pgxpool.ParseConfig(srv.URL())
	is.NoErr(err)
	service.ConfigureWorkerConn(cfg.ConnConfig)
	cfg.ConnConfig.RuntimeParams["application_name"] = "claimer"
	workerPool, err := pgxpool.NewWithConfig(ctx, cfg)
	is.NoErr(err)
	t.Cleanup(workerPool.Close)
	var recovered int
	d, err := service.NewDispatcher(t.Context(), workerPool, service.DispatcherConfig{Worker: "w1",
		Routes: map[string]delivery.Route{"none": {Mode: delivery.ModeNone, Client: client}}, Lease: 30 * time.Second,
		ClaimRecovered: func(n int, _ error) { recovered += n }})
	is.NoErr(err)

	var (
		wg       sync.WaitGroup
		attempts []*service.Attempt
		claimErr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		attempts, _, claimErr = d.ClaimBatch(ctx, 10)
	}()
	var pid int32
	deadline := time.Now().Add(30 * time.Second)
	for local.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = 'claimer' AND wait_event = 'SyncRep'`).Scan(&pid) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the claim's commit never waited for the standby")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The claim is written locally and waits; terminated, it stays committed, and its answer is lost.
	_, err = local.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	is.NoErr(err)
	_, err = local.Exec(ctx, `ALTER SYSTEM RESET synchronous_standby_names`)
	is.NoErr(err)
	_, err = local.Exec(ctx, `SELECT pg_reload_conf()`)
	is.NoErr(err)
	wg.Wait()

	is.NoErr(claimErr)         // the claim is recovered...
	is.Equal(len(attempts), 3) // ...with all its tasks
	is.Equal(recovered, 3)
	results, err := d.FinishBatch(ctx, attempts, d.CallAll(ctx, attempts))
	is.NoErr(err)
	for _, r := range results {
		is.Equal(r.Kind, service.ResultSent) // called and recorded as the claim would have been
		is.Equal(r.Attempt, 1)               // on its first attempt: no lease expiry, no park
	}
	is.Equal(none.TotalSends(), 3) // one request each
}
