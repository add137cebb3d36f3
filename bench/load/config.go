// Package load is the end-to-end load bench: it creates events through service.Notifier and delivers
// them with the product's own worker loop (worker.Run), one or more loops, each with its own
// dispatcher, channel clients and connection pool, against the in-process fake channels answering by
// a latency model (bench/latency); it times the loop and counts its results through the loop's
// service.Observer (worker.Config.Observer), compares the per-task cycle with pgbench (bench/pgbench), measures
// the claim against a large finished history, and checks that every event was delivered exactly once.
//
// It writes load data: run it on a throwaway database.
package load

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/notifierhq/notifier/bench/latency"
	"github.com/notifierhq/notifier/bench/workload"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/worker"
)

// Config is a validated command line.
type Config struct {
	DBURL         string
	DBTimeout     time.Duration
	Notifications int
	Warmup        int
	Duplicates    float64
	// The worker loops: Workers of them, each worker.Run with these knobs (as `notifier work` has them).
	Workers     int
	MaxInFlight int
	Batch       int
	Finishers   int
	FinishDelay time.Duration // worker.Config.FinishDelay: how long an answer waits for others to share its finish
	SkipCalls   bool
	Latency     latency.Model
	History     int
	Probe       int
	Pgbench     string // auto, on, off
	Scripts     string
	Rounds      int
	JSON        bool
	Timeout     time.Duration
	CPUProfile  string
	// PhaseHook is called just before and just after the main deliver phase (--phase-hook; nil: none).
	PhaseHook workload.PhaseHook
}

// Limits of the flags.
const (
	maxWorkers   = 64
	maxInFlight  = worker.MaxInFlightLimit // as `notifier work --max-in-flight`
	maxFinishers = worker.MaxFinishersLimit
)

// loop is the worker.Config of each loop (Logger and Observer are set per phase).
func (c Config) loop() worker.Config {
	return worker.Config{MaxInFlight: c.MaxInFlight, Batch: c.Batch, Finishers: c.Finishers, FinishDelay: c.FinishDelay}.WithDefaults()
}

// UsageError is a command line the bench refuses (exit 2).
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

func usagef(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// CheckError is a run whose final check failed (exit 1): a task not SENT, an event with two
// notifications, a message sent twice.
type CheckError struct{ Err error }

func (e *CheckError) Error() string { return "check failed: " + e.Err.Error() }
func (e *CheckError) Unwrap() error { return e.Err }

const description = `bench is the end-to-end load run of notifier. It WRITES load data (users, notifications, tasks,
attempts, and with --history a million finished rows): use a throwaway database
(sh internal/tools/just bench starts one).

In this one process it starts the fake push (idempotent) and sms (queryable) channels and --workers
loops of the product's worker (worker.Run, as notifier work runs it), each with its own dispatcher,
channel clients and pool of 1 + --finishers connections, with --max-in-flight, --batch and
--finishers as notifier work has them. The fakes answer by --call-latency (a lognormal provider
latency, after acceptance) and refuse --call-errors of the sends with 503 before acceptance; the
draws are seeded (--seed) and both the table and the JSON report the model.
  0. warm-up: --warmup notifications created and delivered, not measured;
  1. create: --notifications events for 1000 users with push and sms enabled, plus --duplicates x that
     many repeated submissions of random events, shuffled, from 8 concurrent submitters;
  2. deliver: the loops run until every task is settled, timed through the loop's hooks (claim and
     finish latencies, tasks per claim and per finish) and counted through its results;
  3. with --history N: the claim latency on fresh due tasks (--probe notifications, drained per task:
     --max-in-flight 1 --batch 1) before and after N finished tasks are added in bulk, beside the
     seed's claim query (bench/queries BenchSeedClaim, in a rolled-back transaction);
  4. pgbench (when found, or with --pgbench): the per-task claim and finish SQL replayed by pgbench
     (bench/pgbench/claim_finish.sql) with one client per worker loop, for as many deliveries; the Go
     side's deliveries/s as a ratio of pgbench's tps (the per-task target: --max-in-flight 1 --batch 1).
     --rounds R alternates R deliver phases and pgbench runs and reports the median ratio.
It prints a table (--json: one object) and exits 1 if a task is not SENT, an event has more than one
notification, or a fake sent a message twice; 2 for a bad flag.

  bench [flags]                  the load run
  bench compare NAME=FILE ...    the deliveries/s of JSON reports (ours and bench/river's) and their ratios

Flags:
`

// Parse reads the command line (without the program name) into a Config.
func Parse(args []string, getenv func(string) string, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // a bad flag is one line (the caller's), not the whole help
	var cfg Config
	fs.StringVar(&cfg.DBURL, "database-url", "", "PostgreSQL URL, a throwaway database (default $DATABASE_URL)")
	fs.DurationVar(&cfg.DBTimeout, "db-timeout", 10*time.Second, "bound on each database call")
	fs.IntVar(&cfg.Notifications, "notifications", 20000, "events to create (each gets a push and an sms task)")
	fs.IntVar(&cfg.Warmup, "warmup", 4000, "notifications created and delivered, untimed, before anything is measured (0: none)")
	fs.Float64Var(&cfg.Duplicates, "duplicates", 0.1, "extra submissions of already-submitted events, as a share of --notifications (0-10)")
	fs.IntVar(&cfg.Workers, "workers", 1, fmt.Sprintf("worker loops (worker.Run), each with its own dispatcher, channel clients and pool, like separate notifier work processes (1-%d)", maxWorkers))
	fs.IntVar(&cfg.MaxInFlight, "max-in-flight", worker.DefaultMaxInFlight, fmt.Sprintf("calls in flight per loop, as notifier work --max-in-flight (1-%d)", maxInFlight))
	fs.IntVar(&cfg.Batch, "batch", worker.DefaultBatch, fmt.Sprintf("most tasks one claim takes, as notifier work --batch (1-%d)", service.MaxBatch))
	fs.DurationVar(&cfg.FinishDelay, "finish-delay", worker.DefaultFinishDelay, "how long an answer may wait for others to share its finish while calls are in flight, as the worker's FinishDelay (1ms-1s); to measure finish grouping")
	fs.IntVar(&cfg.Finishers, "finishers", worker.DefaultFinishers, fmt.Sprintf("finish statements at once per loop, as notifier work --finishers (1-%d)", maxFinishers))
	fs.BoolVar(&cfg.SkipCalls, "skip-calls", false, "do not call the fakes: a channel client answers ACCEPTED at once (the database side alone)")
	model := latency.Flags(fs)
	fs.IntVar(&cfg.History, "history", 0, "measure claim latency before and after adding this many finished tasks")
	fs.IntVar(&cfg.Probe, "probe", 0, "notifications of each claim-latency probe with --history (default min(--notifications, 2500))")
	pgbenchOn := fs.Bool("pgbench", false, "compare with pgbench (default: when pgbench and psql are found; =false to skip)")
	fs.StringVar(&cfg.Scripts, "pgbench-scripts", "", "directory of setup.sql and claim_finish.sql (default: the ones built in, from bench/pgbench)")
	fs.IntVar(&cfg.Rounds, "rounds", 1, "with pgbench: alternate this many deliver phases (--notifications each) and pgbench runs, and report every ratio and their median (1-20)")
	fs.BoolVar(&cfg.JSON, "json", false, "print one JSON object instead of the table (and no progress bar)")
	fs.DurationVar(&cfg.Timeout, "timeout", 30*time.Minute, "give up after this long")
	fs.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a Go CPU profile of the deliver phase to this file (go tool pprof)")
	phaseHook := fs.String("phase-hook", "", workload.PhaseHookUsage)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, description)
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return cfg, err
		}
		return cfg, &UsageError{Err: err}
	}
	if cfg.DBURL == "" {
		cfg.DBURL = getenv("DATABASE_URL")
	}
	if fs.NArg() > 0 {
		return cfg, usagef("unexpected argument %q", fs.Arg(0))
	}
	cfg.PhaseHook = workload.ShellHook(*phaseHook, stderr)
	cfg.Pgbench = "auto"
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "pgbench" {
			cfg.Pgbench = map[bool]string{true: "on", false: "off"}[*pgbenchOn]
		}
	})
	var err error
	if cfg.Latency, err = model(); err != nil {
		return cfg, &UsageError{Err: err}
	}
	return cfg, cfg.validate()
}

func (c *Config) validate() error {
	switch {
	case c.DBTimeout <= 0:
		return usagef("invalid --db-timeout %s: must be more than 0", c.DBTimeout)
	case c.Notifications < 1 || c.Notifications > 10_000_000:
		return usagef("invalid --notifications %d: want 1 to 10000000", c.Notifications)
	case c.Warmup < 0 || c.Warmup > 10_000_000:
		return usagef("invalid --warmup %d: want 0 to 10000000", c.Warmup)
	case !(c.Duplicates >= 0 && c.Duplicates <= 10):
		return usagef("invalid --duplicates %v: want a share from 0 to 10", c.Duplicates)
	case c.Workers < 1 || c.Workers > maxWorkers:
		return usagef("invalid --workers %d: want 1 to %d", c.Workers, maxWorkers)
	case c.MaxInFlight < 1 || c.MaxInFlight > maxInFlight:
		return usagef("invalid --max-in-flight %d: want 1 to %d", c.MaxInFlight, maxInFlight)
	case c.Batch < 1 || c.Batch > service.MaxBatch:
		return usagef("invalid --batch %d: want 1 to %d", c.Batch, service.MaxBatch)
	case c.FinishDelay < time.Millisecond || c.FinishDelay > time.Second:
		return usagef("invalid --finish-delay %s: want 1ms to 1s", c.FinishDelay)
	case c.Finishers < 1 || c.Finishers > maxFinishers:
		return usagef("invalid --finishers %d: want 1 to %d", c.Finishers, maxFinishers)
	case c.SkipCalls && (!c.Latency.Instant() || c.Latency.Errors > 0):
		return usagef("--skip-calls makes no calls: not with --call-latency %s or --call-errors %g", c.Latency.Spec(), c.Latency.Errors)
	case c.History < 0 || c.History > 100_000_000:
		return usagef("invalid --history %d: want 0 to 100000000", c.History)
	case c.Probe < 0 || c.Probe > 1_000_000:
		return usagef("invalid --probe %d: want 0 to 1000000", c.Probe)
	case c.Rounds < 1 || c.Rounds > 20:
		return usagef("invalid --rounds %d: want 1 to 20", c.Rounds)
	case c.Rounds > 1 && c.Pgbench == "off":
		return usagef("--rounds %d compares with pgbench: not with --pgbench=false", c.Rounds)
	case c.Timeout <= 0:
		return usagef("invalid --timeout %s: must be more than 0", c.Timeout)
	case c.DBURL == "":
		return usagef("no database: set --database-url or DATABASE_URL (sh internal/tools/just bench starts a throwaway one)")
	}
	if c.Probe == 0 {
		c.Probe = min(c.Notifications, 2500)
	}
	return nil
}

// Main runs the load run's command line. Errors: *UsageError (exit 2),
// flag.ErrHelp (exit 0), anything else exit 1.
func Main(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := Parse(args, getenv, stderr)
	if err != nil {
		return err
	}
	return Run(ctx, cfg, stdout, stderr)
}
