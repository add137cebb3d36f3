// Command river is notifier's delivery workload built on River (github.com/riverqueue/river), the peer
// that the load bench (bench/cmd/bench) is compared with. It lives in its own Go module so that the
// notifier module does not depend on River.
//
// On $DATABASE_URL (or --database-url) it runs River's migrations, starts the fake push and sms channels
// in this process (the same fakes/ as the bench), answering by the same provider model (bench/latency:
// --call-latency, --call-errors, --seed), delivers --warmup events with a River client of their own
// (not measured, as the bench's warm-up), inserts --notifications events for 1000 users (one job per
// channel, push and sms, inserted together per event, from 8 concurrent inserters, plus --duplicates x
// that many repeated submissions of random events), each job unique by (user, event, channel) through
// River's UniqueOpts ByArgs; then starts a River client with --workers workers (MaxWorkers) whose
// worker sends the job over HTTP exactly as notifier's worker does (the same service/httpchannel
// client: POST /send with an Idempotency-Key that is stable across the job's attempts), retries a
// refused send on the bench's schedule (bench/workload.RetryBackoff, not River's attempt^4 seconds),
// and waits until every job is completed. It prints one JSON object: inserts/s, deliveries/s, total
// time, the latency model, and a check that the fakes sent every message exactly once. --phase-hook CMD
// runs CMD just before the measured deliver phase and just after it, as the bench's --phase-hook
// (bench/cost-vs-river.sh counts the server's instructions between the two).
//
//	cd bench/river && DATABASE_URL=postgres://... go run . --notifications 20000 --workers 1000 --fetch-cooldown 1ms --call-latency 100ms,0.8
//	sh internal/tools/just bench-river --notifications 20000 --workers 1000 --fetch-cooldown 1ms   # on a throwaway cluster
//
// It writes River's tables and jobs: use a throwaway database.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/notifierhq/notifier/bench/dbgen"
	"github.com/notifierhq/notifier/bench/latency"
	"github.com/notifierhq/notifier/bench/proc"
	"github.com/notifierhq/notifier/bench/workload"
	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/cputime"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
)

const jobKind = "notifier_delivery"

// DeliveryArgs is one delivery: a notification (user, event) on one channel. Unique by those three
// (river:"unique" tags with UniqueOpts.ByArgs), like notifier's UNIQUE (user_id, event_key) and
// UNIQUE (notification_id, channel); the address and body do not count.
type DeliveryArgs struct {
	User    string `json:"user" river:"unique"`
	Event   string `json:"event" river:"unique"`
	Channel string `json:"channel" river:"unique"`
	To      string `json:"to"`
	Body    string `json:"body"`
}

func (DeliveryArgs) Kind() string { return jobKind }

func (DeliveryArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: workload.MaxAttempts, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// DeliveryWorker sends a job's message on its channel. Any outcome but an acceptance is an error, so
// River retries the job (with its attempt history in the job's errors column); River has no notion of
// an outcome that may or may not have been accepted.
type DeliveryWorker struct {
	river.WorkerDefaults[DeliveryArgs]
	channels map[string]*httpchannel.Client
	timeout  time.Duration
}

func (w *DeliveryWorker) Work(ctx context.Context, job *river.Job[DeliveryArgs]) error {
	client, ok := w.channels[job.Args.Channel]
	if !ok {
		return river.JobCancel(fmt.Errorf("unknown channel %q", job.Args.Channel))
	}
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	ref := "job-" + strconv.FormatInt(job.ID, 10)
	obs := client.Send(ctx, delivery.Message{Ref: ref, IdempotencyKey: "ntf-" + ref, To: job.Args.To, Body: job.Args.Body})
	switch obs.Outcome {
	case delivery.OutcomeAccepted, delivery.OutcomeAcceptedReplay:
		return nil
	}
	return fmt.Errorf("%s: %s", obs.Outcome, obs.Detail)
}

// NextRetry spaces a failed job's retries as the bench spaces ours (River's default waits attempt^4
// seconds: 1 s, 16 s, 81 s, which would measure its patience, not its throughput). A retry due within
// River's scheduler interval is made available at once.
func (w *DeliveryWorker) NextRetry(job *river.Job[DeliveryArgs]) time.Time {
	return time.Now().Add(workload.RetryBackoff.Delay(job.Attempt, 0))
}

type config struct {
	dbURL         string
	notifications int
	workers       int
	duplicates    float64
	fetchCooldown time.Duration
	pollInterval  time.Duration
	timeout       time.Duration
	latency       latency.Model
	insertBatch   int  // events per InsertMany from one inserter; 0: one event per call from workload.Submitters
	insertOnly    bool // stop after the insert phase (the bulk-create comparison)
	warmup        int  // events delivered by a client of their own before the measured phases
	phaseHook     workload.PhaseHook
}

// report is the one JSON object printed on stdout.
type report struct {
	Peer               string         `json:"peer"`
	RiverVersion       string         `json:"river_version"`
	Notifications      int            `json:"notifications"`
	Channels           int            `json:"channels"`
	Jobs               int            `json:"jobs"`
	Workers            int            `json:"workers"` // MaxWorkers
	Window             int            `json:"window"`  // jobs worked at once at most: MaxWorkers
	FetchCooldownMS    float64        `json:"fetch_cooldown_ms"`
	FetchPollMS        float64        `json:"fetch_poll_interval_ms"`
	Duplicates         float64        `json:"duplicates"`
	CallLatency        latency.Report `json:"call_latency"`
	RetryBackoffMS     float64        `json:"retry_backoff_ms"`
	MaxAttempts        int            `json:"max_attempts"`
	PoolMaxConns       int            `json:"pool_max_conns"`
	CPUs               int            `json:"cpus"`
	MigrateSeconds     float64        `json:"migrate_seconds"`
	InsertBatch        int            `json:"insert_batch,omitempty"` // events per InsertMany, from one inserter
	InsertCalls        int            `json:"insert_calls"`
	Inserted           int            `json:"inserted"`
	DuplicatesSkipped  int            `json:"duplicates_skipped"`
	InsertSeconds      float64        `json:"insert_seconds"`
	InsertsPerSec      float64        `json:"inserts_per_sec"`       // insert calls (events, 2 jobs each) per second
	JobsInsertedPerSec float64        `json:"jobs_inserted_per_sec"` // jobs written per second
	WarmupDeliveries   int            `json:"warmup_deliveries"`     // jobs completed by the warm-up, not measured
	Deliveries         int            `json:"deliveries"`
	DeliverSeconds     float64        `json:"deliver_seconds"`
	DeliveriesPerSec   float64        `json:"deliveries_per_sec"`
	// The answers the deliver phase drew from the latency model, and the deliveries/s of Window calls
	// in flight refilled the moment each answers against as many of the model's first answers as there
	// were jobs (latency.WindowBound, as the bench reports ours; 0 for a model with refused sends or
	// answers at once).
	CallSteps         int     `json:"call_steps,omitempty"`
	WindowBoundPerSec float64 `json:"window_bound_per_sec,omitempty"`
	// CPU of the deliver phase per job completed: this process's (River, the HTTP client and the fakes,
	// as the bench's figure counts ours) and the PostgreSQL server's, from /proc when it runs here.
	CPUMSPerDelivery       float64 `json:"cpu_ms_per_delivery"`
	ServerCPUMSPerDelivery float64 `json:"server_cpu_ms_per_delivery,omitempty"`
	ServerCPUSkipped       string  `json:"server_cpu_skipped,omitempty"`
	// Committed transactions and rows written (inserted, updated, deleted) per job completed, and the
	// share of updates that were HOT, over the deliver phase (as the bench reports ours).
	DBXactsPerDelivery     float64        `json:"db_xacts_per_delivery"`
	RowsWrittenPerDelivery float64        `json:"db_rows_written_per_delivery"`
	HOTUpdateShare         float64        `json:"hot_update_share"`
	Autovacuums            int64          `json:"autovacuums"` // autovacuum and autoanalyze runs finished in the phase
	PeakRSSMiB             float64        `json:"peak_rss_mib"`
	TotalSeconds           float64        `json:"total_seconds"`
	JobStates              map[string]int `json:"job_states"`
	Errors                 int            `json:"job_errors"` // failed attempts River recorded (then retried)
	Sends                  int            `json:"sends"`
	Outbound               int            `json:"outbound"`
	Check                  string         `json:"check"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-river:", err)
		os.Exit(2)
	}
	rep, err := run(ctx, cfg)
	if rep != nil {
		out, _ := json.Marshal(rep)
		fmt.Println(string(out))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-river:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("bench-river", flag.ContinueOnError)
	cfg := config{}
	// Not os.Getenv("DATABASE_URL") as the default: the usage text of a bad flag would print it, password and all.
	fs.StringVar(&cfg.dbURL, "database-url", "", "PostgreSQL URL (default $DATABASE_URL); River's tables are created there")
	fs.IntVar(&cfg.notifications, "notifications", 20000, "events to insert (each gets a push and an sms job)")
	fs.IntVar(&cfg.workers, "workers", 1000, "River MaxWorkers of the queue: jobs worked at once (1-100000)")
	fs.Float64Var(&cfg.duplicates, "duplicates", 0.1, "extra submissions of already-submitted events, as a share of --notifications (0-10)")
	fs.DurationVar(&cfg.fetchCooldown, "fetch-cooldown", river.FetchCooldownDefault, "River FetchCooldown (its default; at least 1ms)")
	fs.DurationVar(&cfg.pollInterval, "fetch-poll-interval", river.FetchPollIntervalDefault, "River FetchPollInterval (its default)")
	fs.IntVar(&cfg.insertBatch, "insert-batch", 0, "insert from one goroutine, this many events (2 unique jobs each) per InsertMany (0: one event per InsertMany from several inserters)")
	fs.BoolVar(&cfg.insertOnly, "insert-only", false, "stop after the insert phase: the bulk-insert figure alone (no warm-up)")
	fs.IntVar(&cfg.warmup, "warmup", 4000, "events inserted and delivered before anything is measured, by a River client of their own, as the bench's --warmup: the HTTP connections to the fakes, the pool's statements and River's tables are warm when the measured phases start (0: none)")
	fs.DurationVar(&cfg.timeout, "timeout", 30*time.Minute, "give up after this long")
	phaseHook := fs.String("phase-hook", "", workload.PhaseHookUsage)
	model := latency.Flags(fs)
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if cfg.dbURL == "" {
		cfg.dbURL = os.Getenv("DATABASE_URL")
	}
	cfg.phaseHook = workload.ShellHook(*phaseHook, os.Stderr)
	var err error
	if cfg.latency, err = model(); err != nil {
		return cfg, err
	}
	switch {
	case fs.NArg() > 0:
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case cfg.dbURL == "":
		return cfg, errors.New("no database: set --database-url or DATABASE_URL")
	case cfg.notifications < 1 || cfg.notifications > 10_000_000:
		return cfg, fmt.Errorf("invalid --notifications %d: want 1 to 10000000", cfg.notifications)
	case cfg.workers < 1 || cfg.workers > 100_000:
		return cfg, fmt.Errorf("invalid --workers %d: want 1 to 100000", cfg.workers)
	case !(cfg.duplicates >= 0 && cfg.duplicates <= 10):
		return cfg, fmt.Errorf("invalid --duplicates %v: want 0 to 10", cfg.duplicates)
	case cfg.fetchCooldown < river.FetchCooldownMin || cfg.pollInterval < cfg.fetchCooldown:
		return cfg, fmt.Errorf("invalid --fetch-cooldown %s / --fetch-poll-interval %s", cfg.fetchCooldown, cfg.pollInterval)
	case cfg.warmup < 0 || cfg.warmup > 1_000_000:
		return cfg, fmt.Errorf("invalid --warmup %d: want 0 to 1000000", cfg.warmup)
	case cfg.insertBatch < 0 || cfg.insertBatch > 10_000:
		return cfg, fmt.Errorf("invalid --insert-batch %d: want 0 to 10000", cfg.insertBatch)
	case cfg.timeout <= 0:
		return cfg, fmt.Errorf("invalid --timeout %s", cfg.timeout)
	}
	return cfg, nil
}

func run(ctx context.Context, cfg config) (*report, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	started := time.Now()
	// No connection is held while a job is worked (the call makes none): the pool serves the inserters,
	// the fetches and the completions, whatever MaxWorkers is, as the bench's pool for creates does.
	poolSize := workload.Submitters + 2
	pcfg, err := service.ParsePoolConfig(cfg.dbURL)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = int32(poolSize)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	rep := &report{Peer: "river", RiverVersion: riverVersion(), Notifications: cfg.notifications, Channels: len(workload.Channels),
		Workers: cfg.workers, Window: cfg.workers, Duplicates: cfg.duplicates, PoolMaxConns: poolSize, CPUs: runtime.NumCPU(),
		FetchCooldownMS: ms(cfg.fetchCooldown), FetchPollMS: ms(cfg.pollInterval), CallLatency: cfg.latency.Report(),
		RetryBackoffMS: ms(workload.RetryBackoff.Base), MaxAttempts: workload.MaxAttempts}

	// River's schema: its own migrations, into the same database.
	t0 := time.Now()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return nil, fmt.Errorf("river migrate: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("river migrate: %w", err)
	}
	rep.MigrateSeconds = time.Since(t0).Seconds()

	push, err := fakes.StartOn(fakes.Push, "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer push.Close()
	sms, err := fakes.StartOn(fakes.SMS, "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer sms.Close()
	channels := map[string]*httpchannel.Client{}
	for name, ch := range map[string]*fakes.Channel{"push": push, "sms": sms} {
		if channels[name], err = httpchannel.New(ch.URL(), httpchannel.Options{}); err != nil {
			return nil, err
		}
	}

	workers := river.NewWorkers()
	river.AddWorker(workers, &DeliveryWorker{channels: channels, timeout: workload.CallTimeout})
	riverConfig := &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.workers}},
		Workers:           workers,
		FetchCooldown:     cfg.fetchCooldown,
		FetchPollInterval: cfg.pollInterval,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	client, err := river.NewClient(driver, riverConfig)
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}

	// 0. Warm-up, not measured.
	if cfg.warmup > 0 && !cfg.insertOnly {
		if rep.WarmupDeliveries, err = warmUp(ctx, driver, riverConfig, cfg, push, sms); err != nil {
			return rep, fmt.Errorf("warm-up: %w", err)
		}
	}

	// 1. Insert: each event's two jobs in one InsertMany (one transaction), from 8 inserters, duplicates
	// shuffled in.
	run := "river-" + strconv.FormatInt(time.Now().UnixMilli(), 36) + fmt.Sprintf("%03d", rand.IntN(1000))
	events := make([]int, 0, cfg.notifications+int(cfg.duplicates*float64(cfg.notifications)))
	for i := range cfg.notifications {
		events = append(events, i)
	}
	for range int(cfg.duplicates * float64(cfg.notifications)) {
		events = append(events, rand.IntN(cfg.notifications))
	}
	rand.Shuffle(len(events), func(i, j int) { events[i], events[j] = events[j], events[i] })
	var (
		next, inserted, skipped atomic.Int64
		wg                      sync.WaitGroup
		insertErr               error
		errOnce                 sync.Once
	)
	inserters, perCall := workload.Submitters, 1
	if cfg.insertBatch > 0 {
		inserters, perCall = 1, cfg.insertBatch
	}
	t0 = time.Now()
	for range inserters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(int64(perCall))) - perCall
				if i >= len(events) || ctx.Err() != nil {
					return
				}
				var params []river.InsertManyParams
				for _, ev := range events[i:min(i+perCall, len(events))] {
					params = append(params, eventJobs(run, ev, "bench event ")...)
				}
				res, err := client.InsertMany(ctx, params)
				if err != nil {
					errOnce.Do(func() { insertErr = err; cancel() })
					return
				}
				for _, r := range res {
					if r.UniqueSkippedAsDuplicate {
						skipped.Add(1)
					} else {
						inserted.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	if insertErr != nil {
		return rep, fmt.Errorf("insert: %w", insertErr)
	}
	insertTook := time.Since(t0)
	rep.InsertBatch = cfg.insertBatch
	rep.InsertCalls, rep.Inserted, rep.DuplicatesSkipped = len(events), int(inserted.Load()), int(skipped.Load())
	rep.Jobs = rep.Inserted
	rep.InsertSeconds = insertTook.Seconds()
	rep.InsertsPerSec = float64(len(events)) / insertTook.Seconds()
	rep.JobsInsertedPerSec = float64(rep.Inserted) / insertTook.Seconds()
	if want := len(workload.Channels) * cfg.notifications; rep.Inserted != want {
		return rep, fmt.Errorf("inserted %d jobs, want %d (unique by user, event, channel)", rep.Inserted, want)
	}
	if cfg.insertOnly {
		rep.TotalSeconds = time.Since(started).Seconds()
		rep.Check = "ok"
		return rep, nil
	}

	// 2. Deliver: start the workers, wait for a completion event per job. The warm-up's sends and
	// messages are not the phase's.
	sends0, outbound0 := push.TotalSends()+sms.TotalSends(), push.TotalOutbound()+sms.TotalOutbound()
	// Push then sms, the order of the bench's. Each deliver phase, the warm-up's and this one, applies
	// the model again and so meets each channel's answers from the first draw of its stream, as each of
	// the bench's phases does.
	samplers, err := cfg.latency.Apply(push, sms)
	if err != nil {
		return rep, err
	}
	events2, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: rep.Jobs + 1000, Kinds: []river.EventKind{river.EventKindJobCompleted},
	})
	defer unsubscribe()
	pid, err := dbgen.New(pool).BenchBackendPID(ctx)
	server, notMeasured := proc.Find(int(pid), err) // the server's processes on this machine, or why not (as the bench)
	rep.ServerCPUSkipped = notMeasured
	db0, err := dbCounters(ctx, pool)
	if err != nil {
		return rep, err
	}
	// With a hook, the start mark with the pool empty, as the bench's with its loops' pools empty:
	// every backend the phase works on starts after it (bench/cost-vs-river.sh counts those backends'
	// lives), and the pool's connections are opened again before the phase, as the bench opens its
	// loops'. Without one the phase keeps the pool as it was, as bench-vs-river has measured it.
	if cfg.phaseHook != nil {
		pool.Reset()
		if err := cfg.phaseHook(ctx, "start"); err != nil {
			return rep, err
		}
		if err := workload.WarmPool(ctx, pool, poolSize); err != nil {
			return rep, err
		}
	}
	t0 = time.Now()
	cpu0, serverPhase := cputime.Process(), server.Start()
	if err := client.Start(ctx); err != nil {
		return rep, fmt.Errorf("river start: %w", err)
	}
	if completed := awaitCompleted(ctx, events2, rep.Jobs); completed < rep.Jobs {
		_ = client.StopAndCancel(context.Background())
		return rep, fmt.Errorf("deliver: %d of %d jobs completed: %w", completed, rep.Jobs, ctx.Err())
	}
	completed := rep.Jobs
	deliverTook := time.Since(t0)
	cpu, srv := cputime.Process()-cpu0, serverPhase.End()
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer stopCancel()
	if err := client.Stop(stopCtx); err != nil {
		return rep, fmt.Errorf("river stop: %w", err)
	}
	// The end mark after River stopped, as the bench's after its loops returned: both sides' stopping
	// falls between the marks.
	if cfg.phaseHook != nil {
		if err := cfg.phaseHook(ctx, "end"); err != nil {
			return rep, err
		}
	}
	db1, err := dbCounters(ctx, pool)
	if err != nil {
		return rep, err
	}
	if completed > 0 {
		per := func(a, b int64) float64 { return math.Round(1000*float64(b-a)/float64(completed)) / 1000 }
		rep.DBXactsPerDelivery, rep.RowsWrittenPerDelivery = per(db0.XactCommit, db1.XactCommit), per(db0.RowsWritten, db1.RowsWritten)
		if upd := db1.Updates - db0.Updates; upd > 0 {
			rep.HOTUpdateShare = math.Round(1000*float64(db1.HotUpdates-db0.HotUpdates)/float64(upd)) / 1000
		}
	}
	rep.Autovacuums = db1.Autovacuums - db0.Autovacuums
	rep.Deliveries = completed
	rep.DeliverSeconds = deliverTook.Seconds()
	rep.DeliveriesPerSec = float64(completed) / deliverTook.Seconds()
	rep.CallSteps = latency.Steps(samplers)
	rep.WindowBoundPerSec = math.Round(cfg.latency.Bound(len(workload.Channels), rep.Jobs/len(workload.Channels), rep.Window))
	rep.CPUMSPerDelivery = msPer(cpu, completed)
	if server != nil {
		rep.ServerCPUMSPerDelivery = msPer(srv, completed)
	}
	rep.PeakRSSMiB = proc.PeakRSSMiB()
	rep.TotalSeconds = time.Since(started).Seconds()

	// 3. Check: every job completed once, every message sent once.
	rep.JobStates = map[string]int{}
	rows, err := pool.Query(ctx, `SELECT state::text, count(*), coalesce(sum(cardinality(errors)), 0)
		FROM river_job WHERE kind = $1 AND args->>'user' LIKE $2 || '-%' GROUP BY state`, jobKind, run)
	if err != nil {
		return rep, fmt.Errorf("count jobs: %w", err)
	}
	for rows.Next() {
		var (
			state        string
			n, jobErrors int
		)
		if err := rows.Scan(&state, &n, &jobErrors); err != nil {
			return rep, err
		}
		rep.JobStates[state] = n
		rep.Errors += jobErrors
	}
	if err := rows.Err(); err != nil {
		return rep, err
	}
	rep.Sends = push.TotalSends() + sms.TotalSends() - sends0
	rep.Outbound = push.TotalOutbound() + sms.TotalOutbound() - outbound0
	rep.Check = "ok"
	perJob := max(push.MaxOutboundPerRef(), sms.MaxOutboundPerRef())
	if rep.JobStates["completed"] != rep.Jobs || rep.Outbound != rep.Jobs || perJob > 1 {
		rep.Check = fmt.Sprintf("FAILED: %d jobs, %d completed, %d messages sent, at most %d for one job",
			rep.Jobs, rep.JobStates["completed"], rep.Outbound, perJob)
		return rep, errors.New(rep.Check)
	}
	return rep, nil
}

// warmUp inserts cfg.warmup events (a push and an sms job each) and delivers them with a River client
// of their own, configured as the measured one, which it stops before returning: the measured client
// then starts on warm HTTP connections to the fakes (its workers share their channel clients), warm
// pool connections with their statements prepared, and River's tables already used, as the bench's
// warm-up leaves ours. It returns how many jobs completed.
func warmUp(ctx context.Context, driver *riverpgxv5.Driver, riverConfig *river.Config, cfg config, push, sms *fakes.Channel) (int, error) {
	client, err := river.NewClient(driver, riverConfig)
	if err != nil {
		return 0, err
	}
	if _, err := cfg.latency.Apply(push, sms); err != nil {
		return 0, err
	}
	run := "river-warmup-" + strconv.FormatInt(time.Now().UnixMilli(), 36)
	const perCall = 500
	for i := 0; i < cfg.warmup; i += perCall {
		var params []river.InsertManyParams
		for ev := i; ev < min(i+perCall, cfg.warmup); ev++ {
			params = append(params, eventJobs(run, ev, "bench warm-up ")...)
		}
		if _, err := client.InsertMany(ctx, params); err != nil {
			return 0, err
		}
	}
	jobs := cfg.warmup * len(workload.Channels)
	completedEvents, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: jobs + 1000, Kinds: []river.EventKind{river.EventKindJobCompleted},
	})
	defer unsubscribe()
	if err := client.Start(ctx); err != nil {
		return 0, err
	}
	completed := awaitCompleted(ctx, completedEvents, jobs)
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		return completed, fmt.Errorf("stop: %w", err)
	}
	if completed < jobs {
		return completed, fmt.Errorf("%d of %d jobs completed: %w", completed, jobs, ctx.Err())
	}
	return completed, nil
}

// eventJobs is event ev's jobs, one per channel, for a user of the run's; body prefixes the event key
// in their bodies.
func eventJobs(run string, ev int, body string) []river.InsertManyParams {
	user := fmt.Sprintf("%s-u%d", run, ev%workload.Users)
	key := fmt.Sprintf("%s-ev%d", run, ev)
	params := make([]river.InsertManyParams, 0, len(workload.Channels))
	for _, ch := range workload.Channels {
		params = append(params, river.InsertManyParams{Args: DeliveryArgs{
			User: user, Event: key, Channel: ch, To: user + "@" + ch, Body: body + key,
		}})
	}
	return params
}

// awaitCompleted counts the completion events of this workload's jobs until jobs have come or ctx is
// done, and returns how many came.
func awaitCompleted(ctx context.Context, events <-chan *river.Event, jobs int) int {
	completed := 0
	for completed < jobs {
		select {
		case ev := <-events:
			if ev != nil && ev.Job != nil && ev.Job.Kind == jobKind {
				completed++
			}
		case <-ctx.Done():
			return completed
		}
	}
	return completed
}

func msPer(d time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return math.Round(float64(d.Microseconds())/float64(n)) / 1000
}

// riverVersion is the River module version this program was built with.
func riverVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == "github.com/riverqueue/river" {
				return d.Version
			}
		}
	}
	return "unknown"
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// dbCounters reads the database's cumulative statistics, the report's per-delivery figures, with the
// bench's own query (BenchXactCommit), after closing the pool's connections, so that every backend has
// flushed its statistics (an idle one may hold them for seconds); the pool reconnects on its next use.
func dbCounters(ctx context.Context, pool *pgxpool.Pool) (dbgen.BenchXactCommitRow, error) {
	pool.Reset()
	time.Sleep(300 * time.Millisecond) // the closed backends exit and flush their statistics
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := dbgen.New(pool).BenchXactCommit(ctx)
	if err != nil {
		return c, fmt.Errorf("read the database's statistics: %w", err)
	}
	return c, nil
}
