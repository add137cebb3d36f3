package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/service"
)

// parallel runs fn for 0..n-1 on benchCreators goroutines and returns the first error (the others stop
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
	for range min(benchCreators, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				dctx, dcancel := b.e.dbContext(ctx)
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
// submissions of random ones among them, shuffled, from benchCreators goroutines. Each event must be
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
		id, created, tasks, err := b.n.Create(ctx, user, fmt.Sprintf("%s-%s-%d", b.run, label, i),
			fmt.Sprintf("Hello %s, bench notification %d", user, i), time.Hour, 3)
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
			if len(tasks) != len(benchChannels) {
				return fmt.Errorf("bench: event %d created with %d tasks, want %d", i, len(tasks), len(benchChannels))
			}
		}
		return nil
	})
	st.seconds = time.Since(started).Seconds()
	bar.Done()
	if err != nil {
		return st, fmt.Errorf("bench: create: %w", err)
	}
	if st.created != count {
		return st, fmt.Errorf("bench: %d submissions of %d events created %d notifications (R1)", len(ops), count, st.created)
	}
	return st, nil
}

// deliverStats is what a deliver phase did.
type deliverStats struct {
	sent, claims, emptyClaims int
	other                     map[string]int
	// Claims on their own, finishes on their own, and finishes carrying the next claim.
	claimLat, finishLat, handoffLat []time.Duration
	seconds                         float64
	clientCPU, serverCPU            time.Duration // this process's and the server's (0: not measured)
}

// cpuMSPerDelivery is the client's and the server's CPU milliseconds per task SENT (0 without any).
func (st deliverStats) cpuMSPerDelivery() (client, server float64) {
	if st.sent == 0 {
		return 0, 0
	}
	return msPer(st.clientCPU, st.sent), msPer(st.serverCPU, st.sent)
}

// deliver runs the workers until target tasks are settled (SENT, or finally not sent), each cycle
// driven here: a claim, the calls (concurrently for a batch), and a finish, all timed. With pipeline,
// each finish carries the next claim (FinishBatchThenClaim), as `notifier work` does; without, claims
// and finishes go on their own (the claim-latency probes measure the claim alone).
func (b *bench) deliver(ctx context.Context, label string, target int, pipeline bool) (deliverStats, error) {
	// Open every worker's connection first: connecting is not part of the figures.
	if err := b.warmPool(ctx, len(b.dispatchers)); err != nil {
		return deliverStats{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		settled atomic.Int64
		mu      sync.Mutex
		st      = deliverStats{other: map[string]int{}}
		wg      sync.WaitGroup
		errOnce sync.Once
		runErr  error
	)
	bar := startProgress(b.bar, label, target)
	started, cpu0, srv0 := time.Now(), processCPU(), b.serverUsed()
	for _, d := range b.dispatchers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := deliverStats{other: map[string]int{}}
			err := b.work(ctx, d, int64(target), pipeline, &settled, bar, &local)
			mu.Lock()
			st.sent += local.sent
			st.claims += local.claims
			st.emptyClaims += local.emptyClaims
			for k, v := range local.other {
				st.other[k] += v
			}
			st.claimLat = append(st.claimLat, local.claimLat...)
			st.finishLat = append(st.finishLat, local.finishLat...)
			st.handoffLat = append(st.handoffLat, local.handoffLat...)
			mu.Unlock()
			if err != nil {
				errOnce.Do(func() { runErr = err; cancel() })
			}
		}()
	}
	wg.Wait()
	st.seconds = time.Since(started).Seconds()
	st.clientCPU, st.serverCPU = processCPU()-cpu0, b.serverUsed()-srv0
	bar.Done()
	b.delivered += st.sent
	if runErr != nil {
		return st, fmt.Errorf("bench: deliver: %w", runErr)
	}
	return st, nil
}

// work is one worker's loop.
func (b *bench) work(ctx context.Context, d *service.Dispatcher, target int64, pipeline bool, settled *atomic.Int64, bar *progress, st *deliverStats) error {
	batch := b.cfg.batch
	count := func(results []service.Result) {
		for _, r := range results {
			if r.Kind == service.ResultSent {
				st.sent++
			} else {
				st.other[string(r.Kind)]++ // settled at claim time, stale or retried: never expected here
			}
			if terminal(r.Kind) {
				settled.Add(1)
				bar.Add(1)
			}
		}
	}
	var held []*service.Attempt // claimed, to call and finish
	for settled.Load() < target || len(held) > 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%d of %d tasks settled: %w", settled.Load(), target, err)
		}
		if len(held) == 0 {
			t0 := time.Now()
			attempts, decided, err := d.ClaimBatch(ctx, batch)
			claimed := time.Since(t0)
			if err != nil {
				return err
			}
			count(decided)
			if len(attempts) == 0 {
				st.emptyClaims++
				time.Sleep(2 * time.Millisecond) // the last tasks are held by other workers, or retrying
				continue
			}
			st.claims++
			st.claimLat = append(st.claimLat, claimed)
			held = attempts
		}
		obs := b.call(ctx, d, held)
		t1 := time.Now()
		if !pipeline {
			results, err := d.FinishBatch(ctx, held, obs)
			st.finishLat = append(st.finishLat, time.Since(t1))
			if err != nil {
				return err
			}
			count(results)
			held = nil
			continue
		}
		h := d.FinishBatchThenClaim(ctx, held, obs, batch)
		st.handoffLat = append(st.handoffLat, time.Since(t1))
		if err := cmp.Or(h.FinishErr, h.ClaimErr); err != nil {
			return err
		}
		count(h.Finished)
		count(h.Settled)
		held = h.Next
		if len(held) > 0 {
			st.claims++
		} else {
			st.emptyClaims++
		}
	}
	return nil
}

// call calls the channels of the attempts, or with --skip-calls records ACCEPTED at once.
func (b *bench) call(ctx context.Context, d *service.Dispatcher, attempts []*service.Attempt) []service.Observation {
	if !b.cfg.skipCalls {
		return d.CallAll(ctx, attempts)
	}
	obs := make([]service.Observation, len(attempts))
	for i, a := range attempts {
		obs[i] = service.Observation{Outcome: service.OutcomeAccepted, ProviderMsgID: "bench-" + a.Message.Ref}
	}
	return obs
}

// terminal reports whether a result settles a task for good (or for a human).
func terminal(k service.ResultKind) bool {
	switch k {
	case service.ResultSent, service.ResultFailed, service.ResultSuppressed, service.ResultParked:
		return true
	}
	return false
}

// warmPool opens n connections at once and returns them to the pool.
func (b *bench) warmPool(ctx context.Context, n int) error {
	conns := make([]interface{ Release() }, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := b.pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("bench: connect: %w", err)
		}
		conns = append(conns, c)
	}
	return nil
}

// probeReport is one claim-latency probe: a fresh set of due tasks drained by the workers.
type probeReport struct {
	FinishedTasks int64     `json:"finished_tasks"` // history in the table when the probe ran
	LoadAvg       []float64 `json:"load_avg"`       // at the end of the probe: the machine is shared
	Tasks         int       `json:"tasks"`
	ClaimMS       latency   `json:"claim_ms"`
	SeedClaimMS   latency   `json:"seed_claim_ms"`
	SeedRuns      int       `json:"seed_runs"`
	SeedFound     int       `json:"seed_found"` // seed runs that found a due task (all of them, normally)
	// The seed's claim planned without bitmap scans: as on the seed's schema (no partial claim index).
	SeedClaimSeedIndexesMS latency `json:"seed_claim_seed_indexes_ms"`
	SeedSeedIndexesFound   int     `json:"seed_seed_indexes_found"`
}

// historyReport compares the claim latency before and after adding finished history.
type historyReport struct {
	Rows              int          `json:"rows"` // finished tasks added
	FillSeconds       float64      `json:"fill_seconds"`
	Before            *probeReport `json:"before"`
	After             *probeReport `json:"after"`
	ClaimP50Ratio     float64      `json:"claim_p50_ratio"`
	SeedClaimP50Ratio float64      `json:"seed_claim_p50_ratio"`
	// The same for the seed's claim planned as on the seed's schema.
	SeedClaimSeedIndexesP50Ratio float64 `json:"seed_claim_seed_indexes_p50_ratio"`
}

// probe vacuums and analyzes the tables, creates cfg.probe notifications (2 due tasks each), runs the seed's claim query workers times
// (plus one unmeasured warm-up) in rolled-back transactions while they are all due, then drains them
// with the workers and reports the claim latency.
func (b *bench) probe(ctx context.Context, label string) (*probeReport, error) {
	if err := b.q.BenchVacuumAnalyze(ctx); err != nil { // bounded by --timeout: a million rows take a while
		return nil, fmt.Errorf("bench: vacuum analyze: %w", err)
	}
	dctx, cancel := b.e.dbContext(ctx)
	finished, err := b.q.BenchFinishedTasks(dctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("bench: count history: %w", err)
	}
	cs, err := b.createAll(ctx, label, b.cfg.probe, 0)
	if err != nil {
		return nil, err
	}
	seed, found, err := b.seedClaim(ctx, b.cfg.workers, false)
	if err != nil {
		return nil, err
	}
	seedOld, foundOld, err := b.seedClaim(ctx, b.cfg.workers, true)
	if err != nil {
		return nil, err
	}
	ds, err := b.deliver(ctx, label+" deliver", cs.tasks, false)
	if err != nil {
		return nil, err
	}
	p := &probeReport{LoadAvg: loadAvg(), FinishedTasks: finished, Tasks: cs.tasks, ClaimMS: percentiles(ds.claimLat),
		SeedClaimMS: percentiles(seed), SeedRuns: len(seed), SeedFound: found,
		SeedClaimSeedIndexesMS: percentiles(seedOld), SeedSeedIndexesFound: foundOld}
	b.notef("probe %s: %d finished tasks in the table; claim p50 %.3f ms; seed claim p50 %.3f ms, on the seed's indexes %.3f ms",
		label, finished, p.ClaimMS.P50, p.SeedClaimMS.P50, p.SeedClaimSeedIndexesMS.P50)
	return p, nil
}

// seedClaim times the seed's claim query (queries/bench.sql) runs times after one warm-up, each in a
// transaction that is rolled back, so nothing is claimed. onSeedIndexes runs it with bitmap scans off:
// as planned on the seed's schema, which had no partial claim index.
func (b *bench) seedClaim(ctx context.Context, runs int, onSeedIndexes bool) ([]time.Duration, int, error) {
	var (
		out   []time.Duration
		found int
	)
	for i := range runs + 1 {
		took, ok, err := b.seedClaimOnce(ctx, onSeedIndexes)
		if err != nil {
			return nil, 0, fmt.Errorf("bench: seed claim: %w", err)
		}
		if i > 0 {
			out = append(out, took)
			if ok {
				found++
			}
		}
	}
	return out, found, nil
}

func (b *bench) seedClaimOnce(ctx context.Context, onSeedIndexes bool) (time.Duration, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, max(b.e.dbTimeout, time.Minute))
	defer cancel()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	q := dbgen.New(tx)
	var took time.Duration
	if onSeedIndexes {
		if err := q.BenchPlanWithoutBitmapScans(ctx); err != nil {
			return 0, false, err
		}
		t0 := time.Now()
		_, err = q.BenchSeedClaimOnSeedIndexes(ctx)
		took = time.Since(t0)
	} else {
		t0 := time.Now()
		_, err = q.BenchSeedClaim(ctx)
		took = time.Since(t0)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return took, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return took, true, tx.Rollback(ctx)
}

// historyChunk is how many notifications (two finished tasks each) one BenchFillHistory inserts.
const historyChunk = 50_000

// historyRun fills cfg.history finished tasks (rounded up to whole notifications) and probes again.
func (b *bench) historyRun(ctx context.Context, before *probeReport) (*historyReport, error) {
	notifications := (b.cfg.history + len(benchChannels) - 1) / len(benchChannels)
	bar := startProgress(b.bar, "history", notifications*len(benchChannels))
	started := time.Now()
	rows := 0
	for first := 0; first < notifications; first += historyChunk {
		n := min(historyChunk, notifications-first)
		// A chunk of a million rows takes a while on a small machine: bounded by --timeout, not --db-timeout.
		inserted, err := b.q.BenchFillHistory(ctx, dbgen.BenchFillHistoryParams{Tag: b.run + "-history", First: int64(first), Notifications: int64(n)})
		if err == nil {
			_, err = b.q.BenchFinishHistory(ctx)
		}
		if err != nil {
			bar.Done()
			return nil, fmt.Errorf("bench: fill history: %w", err)
		}
		rows += int(inserted)
		bar.Add(int(inserted))
	}
	bar.Done()
	h := &historyReport{Rows: rows, FillSeconds: round3(time.Since(started).Seconds()), Before: before}
	b.notef("history: %d finished tasks added in %.1fs", rows, h.FillSeconds)
	after, err := b.probe(ctx, "p1")
	if err != nil {
		return nil, err
	}
	h.After = after
	h.ClaimP50Ratio = ratio(after.ClaimMS.P50, before.ClaimMS.P50)
	h.SeedClaimP50Ratio = ratio(after.SeedClaimMS.P50, before.SeedClaimMS.P50)
	h.SeedClaimSeedIndexesP50Ratio = ratio(after.SeedClaimSeedIndexesMS.P50, before.SeedClaimSeedIndexesMS.P50)
	return h, nil
}

// percentiles gives p50 and p99 (nearest rank) in milliseconds.
func percentiles(ds []time.Duration) latency {
	if len(ds) == 0 {
		return latency{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return round3(float64(s[max(0, min(i, len(s)-1))]) / float64(time.Millisecond))
	}
	return latency{P50: at(0.50), P99: at(0.99)}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return round3(a / b)
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }
