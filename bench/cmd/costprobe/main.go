// Command costprobe replays the worker's claim and finish in fixed shapes over one connection, so
// that what one delivery costs the server can be counted exactly: bench/cost.sh runs it against a
// PostgreSQL under callgrind and subtracts two runs of different sizes (instructions per delivery,
// repeatable to 0.5% whatever else the machine does). On its own it reports the backend's CPU time per
// delivery from /proc, which is as noisy as the machine.
//
// Each round adds --notifications events with a push (idempotent) and an sms (queryable) task each,
// analyzes, then claims --batch tasks at a time with the product's service.Dispatcher and finishes
// them in groups of --group, every call answered ACCEPTED at once. It WRITES load data: use a
// throwaway database.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifierhq/notifier/bench/dbgen"
	"github.com/notifierhq/notifier/bench/proc"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "costprobe:", err)
		var usage usageError
		if errors.As(err, &usage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type usageError struct{ error }

type config struct {
	notifications, batch, group, rounds int
	printPID                            bool
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	var cfg config
	fs := flag.NewFlagSet("costprobe", flag.ContinueOnError)
	fs.IntVar(&cfg.notifications, "notifications", 20000, "events per round, each with a push and an sms task")
	fs.IntVar(&cfg.batch, "batch", 200, "tasks one claim takes (1-1000), as notifier work --batch")
	fs.IntVar(&cfg.group, "group", 25, "answers one finish records (1-1000)")
	fs.IntVar(&cfg.rounds, "rounds", 1, "rounds, each on new tasks; the median is printed last")
	fs.BoolVar(&cfg.printPID, "print-pid", false, "print the claiming backend's pid (pid N) before the deliveries, and skip /proc")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	switch {
	case cfg.notifications < 1, cfg.rounds < 1:
		return usageError{errors.New("--notifications and --rounds must be at least 1")}
	case cfg.batch < 1 || cfg.batch > service.MaxBatch, cfg.group < 1 || cfg.group > service.MaxBatch:
		return usageError{fmt.Errorf("--batch and --group must be 1-%d", service.MaxBatch)}
	}
	url := getenv("DATABASE_URL")
	if url == "" {
		return usageError{errors.New("set DATABASE_URL to a throwaway database")}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	poolCfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return usageError{err}
	}
	poolCfg.MaxConns = 1                            // every claim and finish on one backend, the one measured
	service.ConfigureWorkerConn(poolCfg.ConnConfig) // the generic plans notifier work runs
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	admin, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer admin.Close()
	// Under callgrind the server runs some fifty times slower, more on a loaded machine: a claim of 200
	// took over the default DBTimeout of 10 s. A lease and a bound that nothing here reaches keep every
	// delivery on the path measured (no timeout, no takeover); they change no statement.
	d, err := service.NewDispatcher(ctx, pool, service.DispatcherConfig{Worker: "costprobe", Routes: map[string]delivery.Route{
		"push": {Mode: delivery.ModeIdempotent, Client: acceptAtOnce{}},
		"sms":  {Mode: delivery.ModeQueryable, Client: acceptAtOnce{}},
	}, Lease: time.Hour, DBTimeout: 10 * time.Minute})
	if err != nil {
		return err
	}
	var perDelivery []float64
	for round := range cfg.rounds {
		if err := addTasks(ctx, admin, fmt.Sprintf("costprobe-%d-%d", time.Now().UnixNano(), round), cfg.notifications); err != nil {
			return err
		}
		pid, err := dbgen.New(pool).BenchBackendPID(ctx)
		if err != nil {
			return err
		}
		if cfg.printPID {
			fmt.Fprintf(stdout, "pid %d\n", pid)
		}
		before, err := backendCPU(int(pid), cfg.printPID)
		if err != nil {
			return err
		}
		started := time.Now()
		n, err := deliverAll(ctx, d, cfg.batch, cfg.group)
		if err != nil {
			return err
		}
		took := time.Since(started)
		after, err := backendCPU(int(pid), cfg.printPID)
		if err != nil {
			return err
		}
		ms := float64(after-before) / float64(time.Millisecond) / float64(n)
		perDelivery = append(perDelivery, ms)
		fmt.Fprintf(stdout, "round %d: %d deliveries in %.2f s (%.0f/s), backend CPU %.4f ms per delivery\n",
			round+1, n, took.Seconds(), float64(n)/took.Seconds(), ms)
	}
	slices.Sort(perDelivery)
	fmt.Fprintf(stdout, "median backend CPU %.4f ms per delivery\n", perDelivery[len(perDelivery)/2])
	return nil
}

// addTasks inserts count events (keys run-i) for 1000 users who have push and sms enabled, a task per
// channel each, as the table owner, and analyzes, as the bench does before a deliver phase.
func addTasks(ctx context.Context, admin *pgxpool.Pool, run string, count int) error {
	q := dbgen.New(admin)
	if err := q.BenchProbePrefs(ctx); err != nil {
		return fmt.Errorf("add preferences: %w", err)
	}
	if err := q.BenchProbeTasks(ctx, dbgen.BenchProbeTasksParams{Run: run, Events: int32(count)}); err != nil {
		return fmt.Errorf("add tasks: %w", err)
	}
	if err := q.BenchAnalyze(ctx); err != nil {
		return fmt.Errorf("analyze: %w", err)
	}
	return nil
}

// deliverAll claims batch tasks at a time and finishes each claim's attempts in groups of group until
// a claim finds nothing; every task must end SENT.
func deliverAll(ctx context.Context, d *service.Dispatcher, batch, group int) (int, error) {
	delivered := 0
	for {
		attempts, settled, err := d.ClaimBatch(ctx, batch)
		if err != nil {
			return delivered, err
		}
		if len(attempts)+len(settled) == 0 {
			return delivered, nil
		}
		for part := range slices.Chunk(attempts, group) {
			obs := make([]delivery.Observation, len(part))
			for i, a := range part {
				obs[i] = d.Call(ctx, a)
			}
			results, err := d.FinishBatch(ctx, part, obs)
			if err != nil {
				return delivered, err
			}
			for _, r := range results {
				if r.Kind != service.ResultSent {
					return delivered, fmt.Errorf("task %d: %s, want SENT", r.TaskID, r.Kind)
				}
			}
			delivered += len(part)
		}
	}
}

// backendCPU is the CPU time the measured backend has used (0 when skip: under callgrind the probe
// reads nothing from /proc).
func backendCPU(pid int, skip bool) (time.Duration, error) {
	if skip {
		return 0, nil
	}
	return proc.ProcessCPU(pid)
}

// acceptAtOnce is a channel that accepts every message at once.
type acceptAtOnce struct{}

func (acceptAtOnce) Send(_ context.Context, msg delivery.Message) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: "probe-" + msg.Ref}
}

func (acceptAtOnce) Query(_ context.Context, ref string) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeQueryFound, ProviderMsgID: "probe-" + ref}
}
