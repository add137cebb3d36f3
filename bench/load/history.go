package load

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/notifierhq/notifier/bench/dbgen"
	"github.com/notifierhq/notifier/bench/pgbench"
	"github.com/notifierhq/notifier/bench/proc"
	"github.com/notifierhq/notifier/bench/workload"
	"github.com/notifierhq/notifier/worker"
)

// probeReport is one claim-latency probe: a fresh set of due tasks drained by the workers.
type probeReport struct {
	FinishedTasks int64     `json:"finished_tasks"` // history in the table when the probe ran
	LoadAvg       []float64 `json:"load_avg"`       // at the end of the probe: the machine is shared
	Tasks         int       `json:"tasks"`
	ClaimMS       Latency   `json:"claim_ms"`
	SeedClaimMS   Latency   `json:"seed_claim_ms"`
	SeedRuns      int       `json:"seed_runs"`
	SeedFound     int       `json:"seed_found"` // seed runs that found a due task (all of them, normally)
	// The seed's claim planned without bitmap scans: as on the seed's schema (no partial claim index).
	SeedClaimSeedIndexesMS Latency `json:"seed_claim_seed_indexes_ms"`
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

// perTask is the loop of the probes: one task in flight, one per claim, so that each claim times one
// task's claim (the worker times a claim behind a finish apart from the finish). Its short Poll keeps
// an empty claim from pausing the probe.
var perTask = worker.Config{MaxInFlight: 1, Batch: 1, Finishers: 1, Poll: 100 * time.Microsecond}

// seedRuns is how many times each probe times the seed's claim query.
const seedRuns = 8

// probe vacuums and analyzes the tables, creates cfg.Probe notifications (2 due tasks each), runs the
// seed's claim query seedRuns times (plus one unmeasured warm-up) in rolled-back transactions
// while they are all due, then drains them with the loops per task and reports the claim latency.
func (b *bench) probe(ctx context.Context, label string) (*probeReport, error) {
	if err := b.q.BenchVacuumAnalyze(ctx); err != nil { // bounded by --timeout: a million rows take a while
		return nil, fmt.Errorf("vacuum analyze: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, b.cfg.DBTimeout)
	finished, err := b.q.BenchFinishedTasks(dctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("count history: %w", err)
	}
	cs, err := b.createAll(ctx, label, b.cfg.Probe, 0)
	if err != nil {
		return nil, err
	}
	seed, found, err := b.seedClaim(ctx, seedRuns, false)
	if err != nil {
		return nil, err
	}
	seedOld, foundOld, err := b.seedClaim(ctx, seedRuns, true)
	if err != nil {
		return nil, err
	}
	ds, err := b.deliver(ctx, label+" deliver", cs.tasks, perTask, nil)
	if err != nil {
		return nil, err
	}
	p := &probeReport{LoadAvg: proc.LoadAvg(), FinishedTasks: finished, Tasks: cs.tasks, ClaimMS: percentiles(ds.claimLat),
		SeedClaimMS: percentiles(seed), SeedRuns: len(seed), SeedFound: found,
		SeedClaimSeedIndexesMS: percentiles(seedOld), SeedSeedIndexesFound: foundOld}
	b.notef("probe %s: %d finished tasks in the table; claim p50 %.3f ms; seed claim p50 %.3f ms, on the seed's indexes %.3f ms",
		label, finished, p.ClaimMS.P50, p.SeedClaimMS.P50, p.SeedClaimSeedIndexesMS.P50)
	return p, nil
}

// seedClaim times the seed's claim query (bench/queries/bench.sql) runs times after one warm-up, each in a
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
			return nil, 0, fmt.Errorf("seed claim: %w", err)
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
	ctx, cancel := context.WithTimeout(ctx, max(b.cfg.DBTimeout, time.Minute))
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

// historyRun fills cfg.History finished tasks (rounded up to whole notifications) and probes again.
func (b *bench) historyRun(ctx context.Context, before *probeReport) (*historyReport, error) {
	notifications := (b.cfg.History + len(workload.Channels) - 1) / len(workload.Channels)
	bar := startProgress(b.bar, "history", notifications*len(workload.Channels))
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
			return nil, fmt.Errorf("fill history: %w", err)
		}
		rows += int(inserted)
		bar.Add(int(inserted))
	}
	bar.Done()
	h := &historyReport{Rows: rows, FillSeconds: pgbench.Round3(time.Since(started).Seconds()), Before: before}
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
