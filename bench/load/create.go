package load

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/notifierhq/notifier/bench/workload"
	"github.com/notifierhq/notifier/service"
)

// parallel runs fn for 0..n-1 on workload.Submitters goroutines and returns the first error (the others stop
// taking work then).
func (b *bench) parallel(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		once sync.Once
		err  error
	)
	for range min(workload.Submitters, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				dctx, dcancel := context.WithTimeout(ctx, b.cfg.DBTimeout)
				e := fn(dctx, i)
				dcancel()
				if e != nil {
					once.Do(func() { err = e; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return err
}

// createStats is what a create phase did.
type createStats struct {
	calls, created, tasks int
	minID, maxID          int64
	seconds               float64
	latencies             []time.Duration
}

// createAll submits count events (keys <run>-<label>-<i>) plus round(count*dupShare) repeated
// submissions of random ones among them, shuffled, from workload.Submitters goroutines. Each event must be
// created exactly once, with one task per bench channel.
func (b *bench) createAll(ctx context.Context, label string, count int, dupShare float64) (createStats, error) {
	ops := make([]int32, 0, count+int(math.Round(float64(count)*dupShare)))
	for i := range count {
		ops = append(ops, int32(i))
	}
	rng := rand.New(rand.NewPCG(uint64(count), 2))
	for range int(math.Round(float64(count) * dupShare)) {
		ops = append(ops, int32(rng.IntN(count)))
	}
	rng.Shuffle(len(ops), func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })

	var (
		mu sync.Mutex
		st = createStats{calls: len(ops), minID: math.MaxInt64, latencies: make([]time.Duration, 0, len(ops))}
	)
	bar := startProgress(b.bar, label+" create", len(ops))
	started := time.Now()
	err := b.parallel(ctx, len(ops), func(ctx context.Context, k int) error {
		i := int(ops[k])
		user := b.users[i%len(b.users)]
		t0 := time.Now()
		id, created, tasks, err := b.n.Create(ctx, service.CreateRequest{UserID: user, EventKey: fmt.Sprintf("%s-%s-%d", b.run, label, i), Body: fmt.Sprintf("Hello %s, bench notification %d", user, i), TTL: time.Hour, MaxAttempts: workload.MaxAttempts})
		took := time.Since(t0)
		if err != nil {
			return err
		}
		bar.Add(1)
		mu.Lock()
		defer mu.Unlock()
		st.latencies = append(st.latencies, took)
		if created {
			st.created++
			st.tasks += len(tasks)
			st.minID, st.maxID = min(st.minID, id), max(st.maxID, id)
			if len(tasks) != len(workload.Channels) {
				return fmt.Errorf("event %d created with %d tasks, want %d", i, len(tasks), len(workload.Channels))
			}
		}
		return nil
	})
	st.seconds = time.Since(started).Seconds()
	bar.Done()
	if err != nil {
		return st, fmt.Errorf("create: %w", err)
	}
	if st.created != count {
		return st, fmt.Errorf("%d submissions of %d events created %d notifications (R1)", len(ops), count, st.created)
	}
	return st, nil
}
