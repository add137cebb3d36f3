package service_test

// "Pruning 1M rows does not stall workers": BenchmarkPruneWhileDelivering fills 1,000,000 finished tasks
// (with a notification and an attempt each), then measures the latency of workers' claim and finish
// transactions: delivering 2,000 fresh tasks with nothing else running, then waves of 2,000 fresh tasks
// while Prune deletes the whole history in batches of 1000. Run it alone, once:
//
//	go test ./service -run '^$' -bench PruneWhileDelivering -benchtime 1x -timeout 60m
//
// PRUNE_BENCH_TASKS overrides the history size (e.g. 100000 for a quick look).

import (
	"context"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/notifierhq/notifier/service"
)

const (
	pruneBenchHistory = 1_000_000
	pruneBenchFresh   = 2_000
	pruneBenchWorkers = 4
	pruneBenchBatch   = 1000
)

func BenchmarkPruneWhileDelivering(b *testing.B) {
	history := pruneBenchHistory
	if n, err := strconv.Atoi(os.Getenv("PRUNE_BENCH_TASKS")); err == nil && n > 0 {
		history = n
	}
	for range b.N {
		pruneWhileDelivering(b, history)
	}
}

// latencies are one phase's claim and finish transaction times.
type latencies struct {
	mu            sync.Mutex
	claim, finish []time.Duration // idle: every cycle; busy: those that ran while the prune did
	cycles        atomic.Int64
}

func (l *latencies) add(claim, finish time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.claim, l.finish = append(l.claim, claim), append(l.finish, finish)
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func pruneWhileDelivering(b *testing.B, history int) {
	b.StopTimer()
	e := newEnv(b)
	ctx := e.ctx
	e.w.User("u1", "push")
	d := e.dispatcher(dcfg{})
	exec := func(sql string, args ...any) {
		b.Helper()
		if _, err := e.pool.Exec(ctx, sql, args...); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}

	// History (test-only SQL): a notification, a SENT task and its ACCEPTED attempt per row, two days old.
	filled := time.Now()
	exec(`INSERT INTO notification (user_id, event_key, body, created_at, expires_at)
	      SELECT 'u1', 'hist-' || g, 'body ' || g, now() - interval '3 days', now() - interval '2 days'
	      FROM generate_series(1, $1::int) AS g`, history)
	exec(`INSERT INTO delivery_task (notification_id, channel, state, attempt_count, max_attempts, next_attempt_at,
	                                 attempt_token, lease_owner, lease_until, updated_at)
	      SELECT n.id, 'push', 'SENDING', 1, 3, NULL, gen_random_uuid(), 'w-hist', now() + interval '1 hour',
	             n.created_at + interval '1 day'
	      FROM notification n`)
	for _, stmt := range finishHistory { // the way workers would have: attempt, acceptance, SENT
		exec(stmt)
	}
	for _, table := range []string{"notification", "delivery_task", "delivery_attempt"} {
		exec(`VACUUM ANALYZE ` + table)
	}
	b.Logf("history: %d notifications, tasks and attempts in %s", history, time.Since(filled).Round(time.Second))

	fresh := 0
	deliver := func(l *latencies, pruning *atomic.Bool) time.Duration {
		b.Helper()
		exec(`INSERT INTO notification (user_id, event_key, body, expires_at)
		      SELECT 'u1', 'fresh-' || g, 'body', now() + interval '1 hour'
		      FROM generate_series($1::int + 1, $1::int + $2::int) AS g`, fresh, pruneBenchFresh)
		exec(`INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
		      SELECT n.id, 'push', 3, now() FROM notification n
		      WHERE n.event_key LIKE 'fresh-%' AND NOT EXISTS (SELECT FROM delivery_task t WHERE t.notification_id = n.id)`)
		fresh += pruneBenchFresh
		started := time.Now()
		var wg sync.WaitGroup
		for range pruneBenchWorkers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					during := pruning != nil && pruning.Load()
					t0 := time.Now()
					a, res, err := claimOne(ctx, d)
					claim := time.Since(t0)
					if err != nil {
						b.Error(err)
						return
					}
					if a == nil {
						if res.Kind != service.ResultNothing {
							b.Errorf("claim settled a task without a call: %+v", res)
						}
						return
					}
					obs := d.Call(ctx, a)
					t1 := time.Now()
					res, err = finishOne(ctx, d, a, obs)
					finish := time.Since(t1)
					if err != nil || res.Kind != service.ResultSent {
						b.Errorf("finish: %+v %v", res, err)
						return
					}
					l.cycles.Add(1)
					if pruning == nil || during && pruning.Load() {
						l.add(claim, finish) // a busy cycle counts only if the prune ran all along
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(started)
	}

	b.StartTimer()
	var idle latencies
	idleTook := deliver(&idle, nil)

	var (
		busy    latencies
		pruning atomic.Bool
		st      service.PruneStats
		pruneMu sync.Mutex
		pErr    error
		done    = make(chan struct{})
	)
	pruning.Store(true)
	pruneStarted := time.Now()
	var pruneTook time.Duration
	go func() {
		defer close(done)
		s, err := e.n.Prune(context.Background(), 24*time.Hour, pruneBenchBatch, 0)
		pruneMu.Lock()
		st, pErr, pruneTook = s, err, time.Since(pruneStarted)
		pruneMu.Unlock()
		pruning.Store(false)
	}()
	// Deliveries start once the prune's first batch has committed, so that they overlap its work, not
	// its start.
	for pruning.Load() && e.scalar(`SELECT count(*) FROM delivery_task`) == int64(history+fresh) {
	}
	// Waves of 2,000 fresh tasks until the prune is over, so that deliveries overlap all of it.
	var busyTook time.Duration
	for waves := 0; pruning.Load() && waves < 200; waves++ {
		busyTook += deliver(&busy, &pruning)
	}
	<-done
	b.StopTimer()
	if pErr != nil {
		b.Fatal(pErr)
	}
	if st.Tasks != int64(history) || st.Attempts != int64(history) || st.Notifications != int64(history) {
		b.Fatalf("pruned %+v, want %d of each", st, history)
	}
	if n := e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'SENT'`); n != int64(fresh) {
		b.Fatalf("%d SENT tasks left, want the %d fresh ones", n, fresh)
	}

	b.ReportMetric(ms(quantile(idle.claim, 0.99)), "idle-claim-p99-ms")
	b.ReportMetric(ms(quantile(idle.finish, 0.99)), "idle-finish-p99-ms")
	b.ReportMetric(ms(quantile(busy.claim, 0.99)), "prune-claim-p99-ms")
	b.ReportMetric(ms(quantile(busy.finish, 0.99)), "prune-finish-p99-ms")
	b.ReportMetric(ms(slices.Max(busy.claim)), "prune-claim-max-ms")
	b.ReportMetric(ms(slices.Max(busy.finish)), "prune-finish-max-ms")
	b.ReportMetric(float64(st.Tasks+st.Attempts+st.Notifications)/pruneTook.Seconds(), "pruned-rows/s")
	b.Logf("idle:    %d deliveries in %s; claim p50/p99/max %.1f/%.1f/%.1f ms, finish p50/p99/max %.1f/%.1f/%.1f ms",
		len(idle.claim), idleTook.Round(time.Millisecond),
		ms(quantile(idle.claim, 0.5)), ms(quantile(idle.claim, 0.99)), ms(slices.Max(idle.claim)),
		ms(quantile(idle.finish, 0.5)), ms(quantile(idle.finish, 0.99)), ms(slices.Max(idle.finish)))
	b.Logf("pruning: %d deliveries in %s (%d started and ended while the prune ran); claim p50/p99/max %.1f/%.1f/%.1f ms, finish p50/p99/max %.1f/%.1f/%.1f ms",
		busy.cycles.Load(), busyTook.Round(time.Millisecond), len(busy.claim),
		ms(quantile(busy.claim, 0.5)), ms(quantile(busy.claim, 0.99)), ms(slices.Max(busy.claim)),
		ms(quantile(busy.finish, 0.5)), ms(quantile(busy.finish, 0.99)), ms(slices.Max(busy.finish)))
	b.Logf("prune:   %+v in %s (%.0f ms per batch, %.0f rows/s)", st, pruneTook.Round(time.Millisecond),
		ms(pruneTook)/float64(st.Batches), float64(st.Tasks+st.Attempts+st.Notifications)/pruneTook.Seconds())
}
