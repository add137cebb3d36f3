package service_test

// Go benchmarks of the database side of delivery, one task per b.N iteration against a real database
// (a fresh one per run, see newEnv): claim, finish, create, and a batched claim-call-finish cycle. CI
// runs them once each to keep them compiling and working:
//
//	go test -run '^$' -bench . -benchtime=1x ./service/
//
// For figures, give them time (and read docs/benchmarks.md#the-load-bench for the end-to-end numbers):
//
//	go test -run '^$' -bench . -benchtime=2000x ./service/

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/notifierhq/notifier/internal/cputime"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// dueTasks inserts n due PENDING push tasks for user u1 (push enabled) in bulk, outside the timer.
func (e *env) dueTasks(n int) {
	e.t.Helper()
	e.w.User("u1", "push")
	if _, err := e.pool.Exec(e.ctx, `
		INSERT INTO notification (user_id, event_key, body, expires_at)
		SELECT 'u1', 'bench-' || g, 'body ' || g, now() + interval '1 hour' FROM generate_series(1, $1::int) AS g`, n); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.pool.Exec(e.ctx, `
		INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
		SELECT id, 'push', 3, now() FROM notification WHERE user_id = 'u1' AND event_key LIKE 'bench-%'`); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.pool.Exec(e.ctx, `ANALYZE`); err != nil {
		e.t.Fatal(err)
	}
	if got := e.scalar(`SELECT count(*) FROM delivery_task WHERE next_attempt_at <= now()`); got != int64(n) {
		e.t.Fatalf("%d due tasks, want %d", got, n)
	}
}

// claimAll claims n tasks (in batches, outside the timer) and returns their attempts.
func claimAll(b *testing.B, d *dispatcher, n int) []*service.Attempt {
	b.Helper()
	var all []*service.Attempt
	for len(all) < n {
		attempts, _, err := d.ClaimBatch(context.Background(), min(service.MaxBatch, n-len(all)))
		if err != nil {
			b.Fatal(err)
		}
		if len(attempts) == 0 {
			b.Fatalf("claimed %d of %d tasks", len(all), n)
		}
		all = append(all, attempts...)
	}
	return all
}

// BenchmarkClaim: one claim transaction (TaskClaim, TaskStartAttempts) per iteration, one task each.
func BenchmarkClaim(b *testing.B) {
	e := newEnv(b)
	e.dueTasks(b.N)
	d := e.dispatcher(dcfg{})
	ctx := context.Background()
	cpu := cputime.Process()
	b.ResetTimer()
	for range b.N {
		attempts, _, err := d.ClaimBatch(ctx, 1)
		if err != nil {
			b.Fatal(err)
		}
		if len(attempts) != 1 {
			b.Fatalf("claimed %d tasks, want 1", len(attempts))
		}
	}
	b.StopTimer()
	cputime.ReportPerOp(b, cpu)
	if got := e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'SENDING'`); got != int64(b.N) {
		b.Fatalf("%d tasks SENDING, want %d", got, b.N)
	}
}

// BenchmarkFinish: one finish statement (TaskFinish, with its attempt updates) per iteration, recording
// an acceptance for one claimed task.
func BenchmarkFinish(b *testing.B) {
	e := newEnv(b)
	e.dueTasks(b.N)
	d := e.dispatcher(dcfg{})
	attempts := claimAll(b, d, b.N)
	ctx := context.Background()
	cpu := cputime.Process()
	b.ResetTimer()
	for i := range b.N {
		res, err := finishOne(ctx, d, attempts[i], delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: "m-1"})
		if err != nil {
			b.Fatal(err)
		}
		if res.Kind != service.ResultSent {
			b.Fatalf("finish: %+v", res)
		}
	}
	b.StopTimer()
	cputime.ReportPerOp(b, cpu)
	if got := e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'SENT'`); got != int64(b.N) {
		b.Fatalf("%d tasks SENT, want %d", got, b.N)
	}
}

// BenchmarkCreate: one create (notification and a push and an sms task, one transaction) per iteration.
func BenchmarkCreate(b *testing.B) {
	e := newEnv(b)
	e.w.User("u1", "push", "sms")
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		_, created, tasks, err := e.n.Create(ctx, service.CreateRequest{UserID: "u1", EventKey: fmt.Sprintf("ev-%d", i), Body: "body", TTL: time.Hour, MaxAttempts: 3})
		if err != nil {
			b.Fatal(err)
		}
		if !created || len(tasks) != 2 {
			b.Fatalf("create %d: created=%v, %d tasks", i, created, len(tasks))
		}
	}
}

// BenchmarkDeliverBatch8: one whole cycle per iteration on 8 tasks: a claim transaction, 8 calls to the
// fake push channel at once, a finish transaction. tasks/s is the figure to compare with 1/(claim+finish).
func BenchmarkDeliverBatch8(b *testing.B) {
	const batch = 8
	e := newEnv(b)
	e.dueTasks(batch * b.N)
	d := e.dispatcher(dcfg{})
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		attempts, _, err := d.ClaimBatch(ctx, batch)
		if err != nil {
			b.Fatal(err)
		}
		if len(attempts) != batch {
			b.Fatalf("claimed %d tasks, want %d", len(attempts), batch)
		}
		results, err := d.FinishBatch(ctx, attempts, callAll(ctx, d, attempts))
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range results {
			if r.Kind != service.ResultSent {
				b.Fatalf("result %+v", r)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "tasks/s")
	if got := e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'SENT'`); got != int64(batch*b.N) {
		b.Fatalf("%d tasks SENT, want %d", got, batch*b.N)
	}
}

// BenchmarkDeliver: one task per iteration through a worker's cycle: claim (2 round trips when a task
// is started), call, finish (1). One worker, so the figure is the round trips, not contention.
// cpu-us/op includes the HTTP call, both ends (the fake push channel runs in this process).
func BenchmarkDeliver(b *testing.B) {
	e := newEnv(b)
	e.dueTasks(b.N)
	d := e.dispatcher(dcfg{})
	ctx := context.Background()
	cpu := cputime.Process()
	b.ResetTimer()
	attempts, _, err := d.ClaimBatch(ctx, 1)
	for i := range b.N {
		if err != nil {
			b.Fatal(err)
		}
		if len(attempts) != 1 {
			b.Fatalf("delivery %d: claimed %d tasks, want 1", i, len(attempts))
		}
		obs := callAll(ctx, d, attempts)
		var results []service.Result
		if results, err = d.FinishBatch(ctx, attempts, obs); err == nil && i < b.N-1 {
			attempts, _, err = d.ClaimBatch(ctx, 1)
		}
		if err == nil && results[0].Kind != service.ResultSent {
			b.Fatalf("delivery %d: %+v", i, results[0])
		}
	}
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	cputime.ReportPerOp(b, cpu)
	if got := e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'SENT'`); got != int64(b.N) {
		b.Fatalf("%d tasks SENT, want %d", got, b.N)
	}
}

// BenchmarkCreateBatch1000: 1000 new events (a push and an sms task each) per iteration, in one
// transaction, through the set-based CreateBatch (three statements) and through CreateBatchTx (one
// notifier_create call per event, schema/005): the figure behind keeping both create paths.
func BenchmarkCreateBatch1000(b *testing.B) {
	const batch = 1000
	paths := map[string]func(e *env, reqs []service.CreateRequest) ([]service.Created, error){
		"CreateBatch": func(e *env, reqs []service.CreateRequest) ([]service.Created, error) {
			return e.n.CreateBatch(e.ctx, reqs)
		},
		"CreateBatchTx": func(e *env, reqs []service.CreateRequest) (out []service.Created, err error) {
			err = pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
				out, err = e.n.CreateBatchTx(e.ctx, tx, reqs)
				return err
			})
			return out, err
		},
	}
	for _, name := range []string{"CreateBatch", "CreateBatchTx"} {
		b.Run(name, func(b *testing.B) {
			e := newEnv(b)
			e.w.User("u1", "push", "sms")
			b.ResetTimer()
			for i := range b.N {
				reqs := make([]service.CreateRequest, batch)
				for j := range reqs {
					reqs[j] = service.CreateRequest{UserID: "u1", EventKey: fmt.Sprintf("ev-%d-%d", i, j), Body: "body", TTL: time.Hour, MaxAttempts: 3}
				}
				out, err := paths[name](e, reqs)
				if err != nil {
					b.Fatal(err)
				}
				if !out[batch-1].Created || len(out[batch-1].Tasks) != 2 {
					b.Fatalf("batch %d: %+v", i, out[batch-1])
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
