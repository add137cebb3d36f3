package worker_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
	"github.com/notifierhq/notifier/worker"
)

// The streaming worker's connections are terminated by the administrator again and again (every
// 250-750 ms, each time all of them) while it delivers on a NONE channel (neither key nor query: a lost
// answer parks the task for a human). Every finish lost that way is sent again, so no task whose call
// reached the channel is parked: a task may park only when its claim committed unseen and could not be
// found again before any call was made (the fake saw no request for it).
func TestStreamingFinishesSurviveTerminatedConnections(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	n := service.NewNotifier(pool)
	none := fakes.Start(fakes.None)
	t.Cleanup(none.Close)
	none.SetFallback(func() fakes.Step { return fakes.Step{Delay: 150 * time.Millisecond} }, nil) // a provider's latency

	const tasks = 800
	for i := range tasks {
		user := fmt.Sprintf("u%d", i)
		_, err := n.SetPreference(ctx, user, "none", user+"@none", true)
		is.NoErr(err)
		_, _, _, err = n.Create(ctx, service.CreateRequest{UserID: user, EventKey: "ev", Body: "hello " + user, TTL: time.Hour, MaxAttempts: 3})
		is.NoErr(err)
	}

	cfg, err := pgxpool.ParseConfig(pool.Config().ConnString())
	is.NoErr(err)
	cfg.ConnConfig.RuntimeParams["application_name"] = "notifier-worker-under-fire"
	service.ConfigureWorkerConn(cfg.ConnConfig)
	workerPool, err := pgxpool.NewWithConfig(ctx, cfg)
	is.NoErr(err)
	t.Cleanup(workerPool.Close)
	client, err := httpchannel.New(none.URL(), httpchannel.Options{})
	is.NoErr(err)
	counts := &lostCommitCounts{}
	d, err := service.NewDispatcher(t.Context(), workerPool, service.DispatcherConfig{
		Worker: "w-under-fire", Routes: map[string]delivery.Route{"none": {Mode: delivery.ModeNone, Client: client}},
		Lease: 10 * time.Second, CallTimeout: time.Second, Backoff: delivery.Backoff{Base: 50 * time.Millisecond},
		Observer: counts,
	})
	is.NoErr(err)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = worker.Run(runCtx, d, worker.Config{MaxInFlight: 24, Batch: 8, Poll: 20 * time.Millisecond,
			MaxBackoff: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	var terminated, rounds atomic.Int64
	go func() { // the administrator, every 250-750 ms, until the tasks are settled
		defer wg.Done()
		for runCtx.Err() == nil {
			var killed int64
			if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE application_name = 'notifier-worker-under-fire'`).Scan(&killed); err == nil {
				terminated.Add(killed)
				if killed > 0 {
					rounds.Add(1)
				}
			}
			select {
			case <-runCtx.Done():
			case <-time.After(time.Duration(250+rand.IntN(500)) * time.Millisecond):
			}
		}
	}()
	var open int64
	testworld.Eventually(t, 90*time.Second, "every task SENT or parked", func() bool {
		is.NoErr(pool.QueryRow(ctx, `SELECT count(*) FROM delivery_task WHERE state NOT IN ('SENT') AND NOT needs_review`).Scan(&open))
		return open == 0
	})
	stop()
	wg.Wait()

	rows, err := pool.Query(ctx, `SELECT t.ref, t.state, t.needs_review,
		(SELECT string_agg(a.action || ':' || coalesce(a.outcome, '-') || coalesce('/late ' || a.late_outcome, ''), ' '
		        ORDER BY a.attempt_no) FROM delivery_attempt a WHERE a.task_id = t.id)
		FROM delivery_task t`)
	is.NoErr(err)
	var sent, parked, parkedCalled int
	for rows.Next() {
		var (
			ref, state, history string
			needsReview         bool
		)
		is.NoErr(rows.Scan(&ref, &state, &needsReview, &history))
		switch {
		case state == "SENT":
			sent++
			is.Equal(none.Outbound(ref), 1) // once
		case needsReview:
			parked++
			if none.Sends(ref) > 0 {
				parkedCalled++
				t.Errorf("task %s parked although its call reached the channel (%d requests; attempts %s)", ref, none.Sends(ref), history)
			}
		}
	}
	is.NoErr(rows.Err())
	t.Logf("%d connections terminated in %d rounds, %d finishes sent again, %d claims recovered: %d SENT, %d parked (no call made: a claim's commit lost unseen)",
		terminated.Load(), rounds.Load(), counts.retried.Load(), counts.recovered.Load(), sent, parked)
	is.Equal(sent+parked, tasks)
	is.Equal(parkedCalled, 0)           // no task whose call was answered waits for a human
	is.True(rounds.Load() >= 5)         // the connections were terminated again and again
	is.True(counts.retried.Load() >= 1) // and finishes were lost, and sent again
}

// lostCommitCounts counts the finishes sent again and the claims recovered, from any goroutine.
type lostCommitCounts struct {
	service.NopObserver
	retried, recovered atomic.Int64
}

func (c *lostCommitCounts) FinishRetried(service.FinishRetryEvent) { c.retried.Add(1) }
func (c *lostCommitCounts) ClaimRecovered(int, error)              { c.recovered.Add(1) }
