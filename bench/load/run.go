package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/httpchannel"
)

const benchDescription = `An end-to-end load run. It WRITES load data (users, notifications, tasks, attempts, and with
--history a million finished rows): use a throwaway database (sh internal/tools/just bench starts one).

In this one process it starts the fake push (idempotent) and sms (queryable) channels, which answer at
once, and --workers goroutines, each with its own dispatcher, over one connection pool:
  0. warm-up: --warmup notifications created and delivered, not measured (a new cluster is much slower
     for its first few thousand deliveries; without it the first side measured would pay for that);
  1. create: --notifications events for 1000 users with push and sms enabled, plus --duplicates x that
     many repeated submissions of random events, shuffled, from 8 concurrent submitters;
  2. deliver: the workers claim (--batch tasks per claim transaction), call and finish until every task
     is settled, as notifier work does: each finish travels with the next claim (--pipeline=false:
     apart; the claim-latency probes of --history always claim apart);
  3. with --history N: the claim latency on a fresh set of due tasks (--probe notifications) before and
     after N finished tasks are added in bulk, beside the same for the seed's claim query
     (queries/bench.sql BenchSeedClaim, run in a rolled-back transaction);
  4. pgbench (when found next to the server binaries, or with --pgbench): the claim and finish SQL of one
     task replayed by pgbench (testdata/bench/claim_finish.sql) with as many clients as workers, for as
     many deliveries, and the workers' plan_cache_mode; the Go side's deliveries/s is reported as a
     ratio of pgbench's. With --rounds R, R-1 more pairs follow (--notifications created and
     delivered, then as many replayed by pgbench), alternated, and the median of the R ratios is
     reported: on shared cores a single pair varies with the machine.
When PostgreSQL runs on this machine, the CPU its processes use per delivery is reported for the Go
side and for pgbench (read from /proc), beside the client's.
It prints a table (--json: one object) and fails (exit 1) if a task is not SENT, an event has more than
one notification, or a fake channel sent a message twice.

` + exitCodesHelp

func benchCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "load-test create and delivery end to end against in-process fakes (throwaway database!)",
		UsageText: "notifier bench [--notifications 20000] [--warmup 4000] [--workers 8] [--batch 1] [--duplicates 0.1]\n" +
			"   [--history N] [--probe N] [--pgbench[=false]] [--pgbench-scripts DIR] [--json] [--timeout 30m]\n" +
			"   [--rounds 1] [--pipeline[=false]] [--skip-calls] [--cpuprofile FILE]",
		Description: benchDescription,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "notifications", Value: 20000, Usage: "events to create (each gets a push and an sms task)"},
			&cli.IntFlag{Name: "workers", Value: 8, Usage: "worker goroutines, each with its own dispatcher (1-150)"},
			&cli.IntFlag{Name: "batch", Value: 1, Usage: fmt.Sprintf("tasks per claim and finish transaction (1-%d)", service.MaxBatch)},
			&cli.Float64Flag{Name: "duplicates", Value: 0.1, Usage: "extra submissions of already-submitted events, as a share of --notifications (0-10)"},
			&cli.IntFlag{Name: "warmup", Value: 4000, Usage: "notifications created and delivered, untimed, before anything is measured (0: none)"},
			&cli.IntFlag{Name: "history", Usage: "measure claim latency before and after adding this many finished tasks"},
			&cli.IntFlag{Name: "probe", Usage: "notifications of each claim-latency probe with --history (default min(--notifications, 2500))"},
			&cli.BoolFlag{Name: "pgbench", Usage: "compare with pgbench (default: when pgbench and the scripts are found; =false to skip)"},
			&cli.StringFlag{Name: "pgbench-scripts", Usage: "directory of setup.sql and claim_finish.sql (default: testdata/bench here or above)"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object instead of the table (and no progress bar)"},
			&cli.DurationFlag{Name: "timeout", Value: 30 * time.Minute, Usage: "give up after this long"},
			&cli.IntFlag{Name: "rounds", Value: 1, Usage: "with pgbench: alternate this many Go deliver phases (--notifications each) and pgbench runs, and report every ratio and their median (1-20); on a shared machine one pair says little"},
			&cli.BoolFlag{Name: "pipeline", Value: true, Usage: "send each finish with the next claim in one round trip, as notifier work does (=false: on their own, one round trip more per delivery)"},
			&cli.BoolFlag{Name: "skip-calls", Usage: "do not call the fakes: record ACCEPTED at once (the database side alone)"},
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a Go CPU profile of the deliver phase to this file (go tool pprof)"},
		},
		Action: func(c *cli.Context) error {
			cfg, err := parseBench(c)
			if err != nil {
				return err
			}
			return runBench(c.Context, e, cfg)
		},
	}
}

// benchConfig is the validated bench command line.
type benchConfig struct {
	notifications int
	warmup        int
	workers       int
	batch         int
	duplicates    float64
	history       int
	probe         int
	pgbench       string // auto, on, off
	scripts       string
	json          bool
	timeout       time.Duration
	cpuprofile    string
	skipCalls     bool
	pipeline      bool
	rounds        int
}

// benchCreators is how many goroutines submit creates at once.
const benchCreators = 8

func parseBench(c *cli.Context) (benchConfig, error) {
	cfg := benchConfig{
		notifications: c.Int("notifications"), warmup: c.Int("warmup"), workers: c.Int("workers"), batch: c.Int("batch"),
		duplicates: c.Float64("duplicates"), history: c.Int("history"), probe: c.Int("probe"),
		pgbench: "auto", scripts: c.String("pgbench-scripts"), json: c.Bool("json"), timeout: c.Duration("timeout"),
		cpuprofile: c.String("cpuprofile"), skipCalls: c.Bool("skip-calls"), pipeline: c.Bool("pipeline"),
		rounds: c.Int("rounds"),
	}
	if c.IsSet("pgbench") {
		cfg.pgbench = map[bool]string{true: "on", false: "off"}[c.Bool("pgbench")]
	}
	switch {
	case cfg.notifications < 1 || cfg.notifications > 10_000_000:
		return cfg, usagef("invalid --notifications %d: want 1 to 10000000", cfg.notifications)
	case cfg.warmup < 0 || cfg.warmup > 10_000_000:
		return cfg, usagef("invalid --warmup %d: want 0 to 10000000", cfg.warmup)
	case cfg.workers < 1 || cfg.workers > 150:
		return cfg, usagef("invalid --workers %d: want 1 to 150", cfg.workers)
	case cfg.batch < 1 || cfg.batch > service.MaxBatch:
		return cfg, usagef("invalid --batch %d: want 1 to %d", cfg.batch, service.MaxBatch)
	case !(cfg.duplicates >= 0 && cfg.duplicates <= 10):
		return cfg, usagef("invalid --duplicates %v: want a share from 0 to 10", cfg.duplicates)
	case cfg.history < 0 || cfg.history > 100_000_000:
		return cfg, usagef("invalid --history %d: want 0 to 100000000", cfg.history)
	case cfg.rounds < 1 || cfg.rounds > 20:
		return cfg, usagef("invalid --rounds %d: want 1 to 20", cfg.rounds)
	case cfg.rounds > 1 && cfg.pgbench == "off":
		return cfg, usagef("--rounds %d compares with pgbench: not with --pgbench=false", cfg.rounds)
	case cfg.probe < 0 || cfg.probe > 1_000_000:
		return cfg, usagef("invalid --probe %d: want 0 to 1000000", cfg.probe)
	case cfg.timeout <= 0:
		return cfg, usagef("invalid --timeout %s: must be more than 0", cfg.timeout)
	}
	if cfg.probe == 0 {
		cfg.probe = min(cfg.notifications, 2500)
	}
	return cfg, nil
}

// bench is one load run: the database, the fakes, the workers, and what was measured.
type bench struct {
	e           *env
	cfg         benchConfig
	pool        *pgxpool.Pool
	q           *dbgen.Queries
	n           *service.Notifier
	push, sms   *fakes.Channel
	dispatchers []*service.Dispatcher
	run         string   // tag of this run in user ids and event keys
	users       []string // bench users, push and sms enabled
	bar         io.Writer
	delivered   int        // tasks SENT through the fakes by this run, all phases
	server      *serverCPU // nil when PostgreSQL does not run on this machine
}

// benchChannels are the channels every bench notification goes out on.
var benchChannels = []string{"push", "sms"}

func runBench(ctx context.Context, e *env, cfg benchConfig) (err error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	poolSize := max(cfg.workers, benchCreators) + 2
	pool, err := e.workerPool(int32(poolSize))
	if err != nil {
		return err
	}
	defer pool.Close()
	b := &bench{e: e, cfg: cfg, pool: pool, q: dbgen.New(pool), n: service.NewNotifier(pool),
		run: "bench-" + strconv.FormatInt(time.Now().UnixMilli(), 36) + fmt.Sprintf("%03d", rand.IntN(1000))}
	if !cfg.json && isTerminal(e.stderr) {
		b.bar = e.stderr
	}
	rep := &benchReport{SkipCalls: cfg.skipCalls, Pipeline: cfg.pipeline, Notifications: cfg.notifications, Channels: len(benchChannels), Workers: cfg.workers,
		Batch: cfg.batch, Duplicates: cfg.duplicates, PoolMaxConns: poolSize, CPUs: runtime.NumCPU(),
		LoadAvgStart: loadAvg()}

	dctx, dcancel := e.dbContext(ctx)
	settings, err := b.q.BenchSettings(dctx)
	dcancel()
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	rep.Server = benchServer(settings)
	b.server, rep.ServerCPUSkipped = b.findServer(ctx)
	if err := b.start(ctx); err != nil {
		return err
	}
	defer b.push.Close()
	defer b.sms.Close()
	b.notef("bench %s: %d notifications x %d channels, %d workers, batch %d, %.0f%% duplicate creates; PostgreSQL %s, fsync=%s, synchronous_commit=%s",
		b.run, cfg.notifications, len(benchChannels), cfg.workers, cfg.batch, 100*cfg.duplicates,
		settings.ServerVersion, settings.Fsync, settings.SynchronousCommit)

	if rep.WarmupDeliveries, err = b.warmupRun(ctx); err != nil {
		return err
	}
	var before *probeReport
	if cfg.history > 0 {
		if before, err = b.probe(ctx, "p0"); err != nil {
			return err
		}
	}
	if err := b.mainRun(ctx, rep); err != nil {
		return err
	}
	if err := b.pgbenchCompare(ctx, rep); err != nil {
		return err
	}
	if cfg.history > 0 {
		if rep.History, err = b.historyRun(ctx, before); err != nil {
			return err
		}
	}
	checkErr := b.finalCheck(ctx, rep)
	rep.PeakRSSMiB = peakRSSMiB()
	rep.LoadAvgEnd = loadAvg()
	if checkErr != nil {
		rep.Check = "FAILED: " + checkErr.Error()
	} else {
		rep.Check = "ok"
	}
	if cfg.json {
		err = e.printJSON(rep)
	} else {
		err = rep.print(e.stdout)
	}
	return errors.Join(checkErr, err)
}

// findServer finds the PostgreSQL server's processes on this machine, or says why not.
func (b *bench) findServer(ctx context.Context) (*serverCPU, string) {
	dctx, cancel := b.e.dbContext(ctx)
	defer cancel()
	pid, err := b.q.BenchBackendPID(dctx)
	if err != nil {
		return nil, "not measured: " + err.Error()
	}
	s, err := newServerCPU(int(pid))
	if err != nil {
		return nil, "not measured: " + err.Error()
	}
	return s, ""
}

// msPer is d in milliseconds per one of n (deliveries); n > 0.
func msPer(d time.Duration, n int) float64 { return d.Seconds() * 1000 / float64(n) }

// serverUsed is the server's CPU time so far (0 when it is not measured).
func (b *bench) serverUsed() time.Duration {
	if b.server == nil {
		return 0
	}
	d, err := b.server.used()
	if err != nil {
		return 0
	}
	return d
}

// start starts the fakes, one dispatcher per worker, and the bench users' preferences.
func (b *bench) start(ctx context.Context) error {
	var err error
	if b.push, err = fakes.StartOn(fakes.Push, "127.0.0.1:0"); err != nil {
		return err
	}
	if b.sms, err = fakes.StartOn(fakes.SMS, "127.0.0.1:0"); err != nil {
		b.push.Close()
		return err
	}
	routes := map[string]service.Route{}
	for name, ch := range map[string]*fakes.Channel{"push": b.push, "sms": b.sms} {
		client, err := httpchannel.New(ch.URL(), httpchannel.Options{})
		if err != nil {
			return err
		}
		mode := map[string]service.Mode{"push": service.ModeIdempotent, "sms": service.ModeQueryable}[name]
		routes[name] = service.Route{Mode: mode, Client: client}
	}
	for i := range b.cfg.workers {
		d, err := service.NewDispatcher(b.pool, service.DispatcherConfig{
			Worker: fmt.Sprintf("%s-w%d", b.run, i+1), Routes: routes,
			Lease: time.Minute, CallTimeout: 10 * time.Second, DBTimeout: b.e.dbTimeout,
			Backoff: service.Backoff{Base: 200 * time.Millisecond}, Batch: b.cfg.batch,
		})
		if err != nil {
			return err
		}
		b.dispatchers = append(b.dispatchers, d)
	}
	b.users = make([]string, min(1000, b.cfg.notifications))
	for i := range b.users {
		b.users[i] = fmt.Sprintf("%s-u%d", b.run, i)
	}
	return b.parallel(ctx, len(b.users), func(ctx context.Context, i int) error {
		for _, ch := range benchChannels {
			if _, err := b.n.SetPreference(ctx, b.users[i], ch, b.users[i]+"@"+ch, true); err != nil {
				return err
			}
		}
		return nil
	})
}

// notef writes a phase note on stderr (not with --json).
func (b *bench) notef(format string, args ...any) {
	if !b.cfg.json {
		fmt.Fprintf(b.e.stderr, "== "+format+"\n", args...)
	}
}

// warmupRun creates and delivers --warmup notifications before anything is measured. A new cluster is
// much slower for its first few thousand deliveries (measured: pgbench at 310 tps first, 760 tps right
// after), so without it whichever side ran first, the Go workers, would be measured against a warm pgbench.
func (b *bench) warmupRun(ctx context.Context) (int, error) {
	if b.cfg.warmup == 0 {
		return 0, nil
	}
	cs, err := b.createAll(ctx, "warmup", b.cfg.warmup, 0)
	if err != nil {
		return 0, err
	}
	ds, err := b.deliver(ctx, "warmup", cs.tasks, b.cfg.pipeline)
	if err != nil {
		return ds.sent, err
	}
	b.notef("warm-up: created %d, delivered %d (%.0f/s, not reported)", cs.created, ds.sent, float64(ds.sent)/ds.seconds)
	return ds.sent, nil
}

// mainRun is the create phase and the deliver phase, and the figures taken from them.
func (b *bench) mainRun(ctx context.Context, rep *benchReport) error {
	cs, err := b.createAll(ctx, "main", b.cfg.notifications, b.cfg.duplicates)
	if err != nil {
		return err
	}
	rep.CreateCalls, rep.Created, rep.DuplicateAnswers = cs.calls, cs.created, cs.calls-cs.created
	rep.Tasks, rep.CreateSeconds = cs.tasks, cs.seconds
	rep.CreatesPerSec = float64(cs.calls) / cs.seconds
	rep.CreateCallMS = percentiles(cs.latencies)
	if err := b.analyze(ctx); err != nil {
		return err
	}

	// Every connection closed flushes its backend's statistics (an idle backend may hold them ~10 s),
	// so the xact_commit delta covers exactly the deliver phase.
	commits0, err := b.commits(ctx)
	if err != nil {
		return err
	}
	stopProfile, err := startCPUProfile(b.cfg.cpuprofile)
	if err != nil {
		return err
	}
	ds, err := b.deliver(ctx, "deliver", cs.tasks, b.cfg.pipeline)
	if perr := stopProfile(); err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	commits1, err := b.commits(ctx)
	if err != nil {
		return err
	}
	rep.Deliveries, rep.DeliverSeconds = ds.sent, ds.seconds
	rep.DeliveriesPerSec = float64(ds.sent) / ds.seconds
	rep.OtherResults = ds.other
	rep.Claims, rep.EmptyClaims = ds.claims, ds.emptyClaims
	rep.ClaimMS, rep.FinishMS = percentiles(ds.claimLat), percentiles(ds.finishLat)
	rep.FinishThenClaimMS, rep.ClaimsAlone = percentiles(ds.handoffLat), len(ds.claimLat)
	if ds.sent > 0 {
		rep.DBXactsPerDelivery = float64(commits1-commits0) / float64(ds.sent)
	}
	rep.CPUMSPerDelivery, rep.ServerCPUMSPerDelivery = ds.cpuMSPerDelivery()
	dctx, cancel := b.e.dbContext(ctx)
	defer cancel()
	lat, err := b.q.BenchSentLatency(dctx, dbgen.BenchSentLatencyParams{MinID: cs.minID, MaxID: cs.maxID})
	if err != nil {
		return fmt.Errorf("bench: create -> SENT latency: %w", err)
	}
	rep.CreateToSentMS = latency{P50: round3(lat.P50Ms), P99: round3(lat.P99Ms)}
	b.notef("created %d (%d calls, %.0f/s), delivered %d (%.0f/s)", cs.created, cs.calls, rep.CreatesPerSec, ds.sent, rep.DeliveriesPerSec)
	return nil
}

// analyze refreshes the planner's statistics before a deliver phase, as setup.sql does before pgbench.
func (b *bench) analyze(ctx context.Context) error {
	dctx, cancel := b.e.dbContext(ctx)
	defer cancel()
	if err := b.q.BenchAnalyze(dctx); err != nil {
		return fmt.Errorf("bench: analyze: %w", err)
	}
	return nil
}

// startCPUProfile starts a Go CPU profile into path ("" for none); the returned func stops it.
func startCPUProfile(path string) (func() error, error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("bench: --cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("bench: --cpuprofile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// commits reads xact_commit of this database after closing the pool's connections, so that every
// transaction so far is counted.
func (b *bench) commits(ctx context.Context) (int64, error) {
	b.pool.Reset()
	time.Sleep(300 * time.Millisecond) // the closed backends exit and flush their statistics
	dctx, cancel := b.e.dbContext(ctx)
	defer cancel()
	n, err := b.q.BenchXactCommit(dctx)
	if err != nil {
		return 0, fmt.Errorf("bench: read xact_commit: %w", err)
	}
	return n, nil
}

// finalCheck checks every task of this run is SENT, no event has two notifications, and the fakes sent
// each message once.
func (b *bench) finalCheck(ctx context.Context, rep *benchReport) error {
	dctx, cancel := b.e.dbContext(ctx)
	defer cancel()
	row, err := b.q.BenchRunCheck(dctx, b.run+"-")
	if err != nil {
		return fmt.Errorf("bench: final check: %w", err)
	}
	outbound := b.push.TotalOutbound() + b.sms.TotalOutbound()
	rep.Outbound = outbound
	var errs []error
	if row.NotSent > 0 {
		errs = append(errs, fmt.Errorf("%d of %d tasks not SENT", row.NotSent, row.Tasks))
	}
	if row.DuplicateEvents > 0 {
		errs = append(errs, fmt.Errorf("%d (user, event_key) pairs with more than one notification", row.DuplicateEvents))
	}
	if int(row.Tasks) != b.delivered {
		errs = append(errs, fmt.Errorf("%d tasks in the database, %d delivered", row.Tasks, b.delivered))
	}
	if !b.cfg.skipCalls && outbound != b.delivered {
		errs = append(errs, fmt.Errorf("the fakes sent %d messages for %d delivered tasks", outbound, b.delivered))
	}
	return errors.Join(errs...)
}

// latency is a pair of percentiles in milliseconds.
type latency struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

type serverInfo struct {
	Version           string `json:"version"`
	Fsync             string `json:"fsync"`
	SynchronousCommit string `json:"synchronous_commit"`
	SharedBuffers     string `json:"shared_buffers"`
	PlanCacheMode     string `json:"plan_cache_mode"` // of the workers' connections, and pgbench's
}

func benchServer(s dbgen.BenchSettingsRow) serverInfo {
	return serverInfo{Version: s.ServerVersion, Fsync: s.Fsync, SynchronousCommit: s.SynchronousCommit, SharedBuffers: s.SharedBuffers,
		PlanCacheMode: s.PlanCacheMode}
}

// benchReport is what bench prints: the table, or with --json this object.
type benchReport struct {
	Notifications    int            `json:"notifications"`
	Channels         int            `json:"channels"`
	Tasks            int            `json:"tasks"`
	Workers          int            `json:"workers"`
	Batch            int            `json:"batch"`
	Duplicates       float64        `json:"duplicates"`
	PoolMaxConns     int            `json:"pool_max_conns"`
	Server           serverInfo     `json:"server"`
	CPUs             int            `json:"cpus"`
	LoadAvgStart     []float64      `json:"load_avg_start"`
	LoadAvgEnd       []float64      `json:"load_avg_end"`
	CreateCalls      int            `json:"create_calls"`
	Created          int            `json:"created"`
	DuplicateAnswers int            `json:"duplicate_answers"`
	CreateSeconds    float64        `json:"create_seconds"`
	CreatesPerSec    float64        `json:"creates_per_sec"`
	CreateCallMS     latency        `json:"create_call_ms"`
	WarmupDeliveries int            `json:"warmup_deliveries"` // before anything was measured, not in the figures
	Deliveries       int            `json:"deliveries"`
	DeliverSeconds   float64        `json:"deliver_seconds"`
	DeliveriesPerSec float64        `json:"deliveries_per_sec"`
	OtherResults     map[string]int `json:"other_results"`
	Claims           int            `json:"claims"`
	EmptyClaims      int            `json:"empty_claims"`
	CreateToSentMS   latency        `json:"create_to_sent_ms"`
	ClaimMS          latency        `json:"claim_ms"`
	FinishMS         latency        `json:"finish_ms"`
	// Finishes that carried the next claim (--pipeline): TaskFinish, the claim, and its start.
	FinishThenClaimMS  latency `json:"finish_then_claim_ms"`
	Pipeline           bool    `json:"pipeline"`
	ClaimsAlone        int     `json:"claims_alone"` // claims with tasks not carried by a finish
	DBXactsPerDelivery float64 `json:"db_xacts_per_delivery"`
	CPUMSPerDelivery   float64 `json:"cpu_ms_per_delivery"`
	// The PostgreSQL server's CPU (all its processes) over the deliver phase, when it runs here.
	ServerCPUMSPerDelivery float64        `json:"server_cpu_ms_per_delivery,omitempty"`
	ServerCPUSkipped       string         `json:"server_cpu_skipped,omitempty"`
	PeakRSSMiB             float64        `json:"peak_rss_mib"`
	Outbound               int            `json:"outbound"`
	SkipCalls              bool           `json:"skip_calls,omitempty"`
	History                *historyReport `json:"history,omitempty"`
	Pgbench                *pgbenchReport `json:"pgbench,omitempty"`
	// --rounds: every pair of a Go deliver phase and pgbench (the first is the main run's), and the
	// median of their ratios.
	Rounds            []roundReport `json:"rounds,omitempty"`
	MedianGoVsPgbench float64       `json:"median_go_vs_pgbench,omitempty"`
	PgbenchSkipped    string        `json:"pgbench_skipped,omitempty"`
	Check             string        `json:"check"`
}

func (r *benchReport) print(w io.Writer) error {
	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	p("notifier bench: %d notifications x %d channels (push idempotent, sms queryable), %d workers, batch %d, %.0f%% duplicate creates\n",
		r.Notifications, r.Channels, r.Workers, r.Batch, 100*r.Duplicates)
	if r.SkipCalls {
		p("--skip-calls: the channels were not called; every attempt recorded ACCEPTED at once (the database side alone)\n")
	}
	p("PostgreSQL %s, fsync=%s, synchronous_commit=%s, shared_buffers=%s, plan_cache_mode=%s; pool of %d connections; %d CPUs, load average %s at start, %s at end\n\n",
		r.Server.Version, r.Server.Fsync, r.Server.SynchronousCommit, r.Server.SharedBuffers, r.Server.PlanCacheMode, r.PoolMaxConns, r.CPUs,
		fmtLoad(r.LoadAvgStart), fmtLoad(r.LoadAvgEnd))
	p("%-32s %10s %9s %11s\n", "phase", "count", "seconds", "per second")
	p("%-32s %10d %9.2f %11.0f   (%d created, %d answered created=false)\n", "create (calls)", r.CreateCalls, r.CreateSeconds, r.CreatesPerSec, r.Created, r.DuplicateAnswers)
	p("%-32s %10d %9.2f %11.0f\n", "deliver (tasks SENT)", r.Deliveries, r.DeliverSeconds, r.DeliveriesPerSec)
	if r.WarmupDeliveries > 0 {
		p("%-32s %10d   (created and delivered before these phases, not measured)\n", "warm-up (tasks SENT)", r.WarmupDeliveries)
	}
	if len(r.OtherResults) > 0 {
		p("  other results on the way: %v\n", r.OtherResults)
	}
	p("\n%-32s %10s %9s\n", "latency (ms)", "p50", "p99")
	p("%-32s %10.2f %9.2f\n", "create -> SENT", r.CreateToSentMS.P50, r.CreateToSentMS.P99)
	p("%-32s %10.2f %9.2f\n", "create call", r.CreateCallMS.P50, r.CreateCallMS.P99)
	if r.Pipeline {
		p("%-32s %10.2f %9.2f   (%d of %d claims with tasks; %d empty)\n", "claim transaction alone", r.ClaimMS.P50, r.ClaimMS.P99, r.ClaimsAlone, r.Claims, r.EmptyClaims)
		p("%-32s %10.2f %9.2f   (TaskFinish in the claim's first round trip, until the claim committed)\n", "finish + next claim", r.FinishThenClaimMS.P50, r.FinishThenClaimMS.P99)
	} else {
		p("%-32s %10.2f %9.2f   (%d claims with tasks, %d empty)\n", "claim transaction", r.ClaimMS.P50, r.ClaimMS.P99, r.Claims, r.EmptyClaims)
		p("%-32s %10.2f %9.2f\n", "finish transaction", r.FinishMS.P50, r.FinishMS.P99)
	}
	p("\n%-32s %10.2f   (xact_commit delta over the deliver phase / deliveries)\n", "db transactions per delivery", r.DBXactsPerDelivery)
	p("%-32s %10.3f   (this process: workers, fakes and HTTP on both sides)\n", "client CPU ms per delivery", r.CPUMSPerDelivery)
	if r.ServerCPUSkipped == "" {
		p("%-32s %10.3f   (all PostgreSQL processes, from /proc)\n", "server CPU ms per delivery", r.ServerCPUMSPerDelivery)
	} else {
		p("%-32s %10s   (%s)\n", "server CPU ms per delivery", "-", r.ServerCPUSkipped)
	}
	p("%-32s %10.1f   (VmHWM of this process; the workers and the fakes run in it)\n", "peak RSS MiB", r.PeakRSSMiB)
	if h := r.History; h != nil {
		p("\nclaim latency vs history (a fresh probe of %d due tasks each time, %d workers, batch %d; the seed's claim\n", h.Before.Tasks, r.Workers, r.Batch)
		p("query %d times in a rolled-back transaction, as planned here and as on the seed's indexes)\n", h.Before.SeedRuns)
		p("%-24s %14s %14s %18s %18s\n", "p50 ms", "finished tasks", "claim", "seed claim", "seed on its indexes")
		p("%-24s %14d %14.3f %18.3f %18.3f\n", "before", h.Before.FinishedTasks, h.Before.ClaimMS.P50, h.Before.SeedClaimMS.P50, h.Before.SeedClaimSeedIndexesMS.P50)
		p("%-24s %14d %14.3f %18.3f %18.3f\n", fmt.Sprintf("after +%d", h.Rows), h.After.FinishedTasks, h.After.ClaimMS.P50, h.After.SeedClaimMS.P50, h.After.SeedClaimSeedIndexesMS.P50)
		p("%-24s %14s %14.2f %18.2f %18.2f\n", "ratio after / before", "", h.ClaimP50Ratio, h.SeedClaimP50Ratio, h.SeedClaimSeedIndexesP50Ratio)
		p("(history of %d finished tasks filled in %.1fs; VACUUM (ANALYZE) before each probe; load average %s, then %s)\n",
			h.Rows, h.FillSeconds, fmtLoad(h.Before.LoadAvg), fmtLoad(h.After.LoadAvg))
	}
	if g := r.Pgbench; g != nil {
		p("\npgbench %s (-M prepared, plan_cache_mode=%s): %d clients, %d threads, %d deliveries: %.0f tps, latency avg %.2f ms\n",
			g.Script, r.Server.PlanCacheMode, g.Clients, g.Threads, g.Transactions, g.TPS, g.LatencyAvgMS)
		p("CPU ms per delivery: pgbench %.3f", g.ClientCPUMSPerDelivery)
		if r.ServerCPUSkipped == "" {
			p(", server %.3f (Go side: client %.3f, server %.3f)", g.ServerCPUMSPerDelivery, r.CPUMSPerDelivery, r.ServerCPUMSPerDelivery)
		}
		p("\n")
		p("Go deliveries/s (batch %d) / pgbench tps (per task) = %.0f / %.0f = %.2f\n", r.Batch, r.DeliveriesPerSec, g.TPS, g.GoVsPgbench)
		if len(r.Rounds) > 0 {
			p("\n%-6s %16s %12s %13s %22s %22s\n", "round", "Go deliveries/s", "pgbench tps", "Go / pgbench", "Go CPU ms client/srv", "pgbench CPU ms cl/srv")
			for _, x := range r.Rounds {
				p("%-6d %16.0f %12.0f %13.2f %15.3f/%.3f %15.3f/%.3f\n", x.Round, x.DeliveriesPerSec, x.PgbenchTPS, x.GoVsPgbench,
					x.CPUMSPerDelivery, x.ServerCPUMSPerDelivery, x.PgbenchCPUMSPerDelivery, x.PgbenchServerCPUMSPerDelivery)
			}
			p("median Go / pgbench over %d rounds = %.2f\n", len(r.Rounds), r.MedianGoVsPgbench)
		}
	} else if r.PgbenchSkipped != "" {
		p("\npgbench: skipped (%s)\n", r.PgbenchSkipped)
	}
	p("\ncheck: %s\n", r.Check)
	_, err := io.WriteString(w, sb.String())
	return err
}

func fmtLoad(l []float64) string {
	if len(l) == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", l[0])
}

// loadAvg is /proc/loadavg (1, 5, 15 minutes); nil where there is none.
func loadAvg() []float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return nil
	}
	var out []float64
	for _, f := range strings.Fields(string(data))[:3] {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil
		}
		out = append(out, v)
	}
	return out
}

// peakRSSMiB is VmHWM from /proc/self/status in MiB (0 where there is none).
func peakRSSMiB() float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseFloat(f[0], 64)
				if err == nil {
					return round3(kb / 1024)
				}
			}
		}
	}
	return 0
}
