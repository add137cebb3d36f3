package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifierhq/notifier/bench/dbgen"
	"github.com/notifierhq/notifier/bench/latency"
	"github.com/notifierhq/notifier/bench/pgbench"
	"github.com/notifierhq/notifier/bench/proc"
	"github.com/notifierhq/notifier/bench/workload"
	productdb "github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
)

// bench is one load run: the database, the fakes, the worker loops, and what was measured.
type bench struct {
	cfg       Config
	stderr    io.Writer
	log       *slog.Logger // the loops' logger: warnings and errors only (per-task events cost and say nothing here)
	pool      *pgxpool.Pool
	q         *dbgen.Queries
	n         *service.Notifier
	push, sms *fakes.Channel
	samplers  []*latency.Sampler // the fakes' answers of the phase running or last run (nil: instant, no errors)
	loops     []*loop
	run       string   // tag of this run in user ids and event keys
	users     []string // bench users, push and sms enabled
	bar       io.Writer
	delivered int          // tasks SENT by this run, all phases
	server    *proc.Server // nil when PostgreSQL does not run on this machine
}

// loop is one worker loop's own parts: what one `notifier work` process would have.
type loop struct {
	name string
	pool *pgxpool.Pool
	d    *service.Dispatcher
}

// Run runs the load run and prints its report; a failed final check is a *CheckError.
func Run(ctx context.Context, cfg Config, stdout, stderr io.Writer) (err error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	pool, err := newPool(cfg.DBURL, workload.Submitters+2)
	if err != nil {
		return err
	}
	defer pool.Close()
	b := &bench{cfg: cfg, stderr: stderr, pool: pool, q: dbgen.New(pool), n: service.NewNotifier(pool),
		log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		run: "bench-" + strconv.FormatInt(time.Now().UnixMilli(), 36) + fmt.Sprintf("%03d", rand.IntN(1000))}
	if !cfg.JSON && isTerminal(stderr) {
		b.bar = stderr
	}
	loopCfg := cfg.loop()
	rep := &Report{Peer: "notifier", Notifications: cfg.Notifications, Channels: len(workload.Channels),
		Workers: cfg.Workers, MaxInFlight: loopCfg.MaxInFlight, Batch: loopCfg.Batch, Finishers: loopCfg.Finishers,
		Window: cfg.Workers * loopCfg.MaxInFlight, Duplicates: cfg.Duplicates, SkipCalls: cfg.SkipCalls,
		CallLatency: cfg.Latency.Report(), RetryBackoffMS: ms(workload.RetryBackoff.Base), MaxAttempts: workload.MaxAttempts,
		CPUs: runtime.NumCPU(), LoadAvgStart: proc.LoadAvg()}

	dctx, dcancel := context.WithTimeout(ctx, cfg.DBTimeout)
	settings, err := b.q.BenchSettings(dctx)
	dcancel()
	if err != nil {
		return fmt.Errorf("read the server's settings: %w", err)
	}
	rep.Server = serverInfo{Version: settings.ServerVersion, Fsync: settings.Fsync, SynchronousCommit: settings.SynchronousCommit,
		SharedBuffers: settings.SharedBuffers, PlanCacheMode: settings.PlanCacheMode}
	b.server, rep.ServerCPUSkipped = b.findServer(ctx)
	if err := b.start(ctx, rep); err != nil {
		return err
	}
	defer b.stop()
	b.notef("bench %s: %d notifications x %d channels; %d worker loop(s): --max-in-flight %d --batch %d --finishers %d; %.0f%% duplicate creates; PostgreSQL %s, fsync=%s, synchronous_commit=%s",
		b.run, cfg.Notifications, len(workload.Channels), cfg.Workers, loopCfg.MaxInFlight, loopCfg.Batch, loopCfg.Finishers,
		100*cfg.Duplicates, settings.ServerVersion, settings.Fsync, settings.SynchronousCommit)
	if cfg.SkipCalls {
		b.notef("calls: skipped (--skip-calls), every call answered ACCEPTED at once")
	} else {
		b.notef("calls: %s", cfg.Latency)
	}

	if rep.WarmupDeliveries, err = b.warmupRun(ctx); err != nil {
		return err
	}
	var before *probeReport
	if cfg.History > 0 {
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
	if cfg.History > 0 {
		if rep.History, err = b.historyRun(ctx, before); err != nil {
			return err
		}
	}
	checkErr := b.finalCheck(ctx, rep)
	rep.PeakRSSMiB = pgbench.Round3(proc.PeakRSSMiB())
	rep.LoadAvgEnd = proc.LoadAvg()
	rep.Check = "ok"
	if checkErr != nil {
		rep.Check = "FAILED: " + checkErr.Error()
		checkErr = &CheckError{Err: checkErr}
	}
	if cfg.JSON {
		err = rep.printJSON(stdout)
	} else {
		err = rep.print(stdout)
	}
	return errors.Join(checkErr, err)
}

// newPool opens a pool whose connections are set up as a worker's (service.ConfigureWorkerConn) with at
// least maxConns connections, as `notifier work` opens its own.
func newPool(dbURL string, maxConns int) (*pgxpool.Pool, error) {
	cfg, err := service.ParsePoolConfig(dbURL)
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	cfg.MaxConns = max(cfg.MaxConns, int32(maxConns))
	service.ConfigureWorkerConn(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	return pool, nil
}

// findServer finds the PostgreSQL server's processes on this machine, or says why not.
func (b *bench) findServer(ctx context.Context) (*proc.Server, string) {
	dctx, cancel := context.WithTimeout(ctx, b.cfg.DBTimeout)
	defer cancel()
	pid, err := b.q.BenchBackendPID(dctx)
	return proc.Find(int(pid), err)
}

// start starts the fakes (each deliver phase applies the latency model to them), one dispatcher,
// channel clients and pool per worker loop, and the bench users' preferences.
func (b *bench) start(ctx context.Context, rep *Report) error {
	var err error
	if b.push, err = fakes.StartOn(fakes.Push, "127.0.0.1:0"); err != nil {
		return err
	}
	if b.sms, err = fakes.StartOn(fakes.SMS, "127.0.0.1:0"); err != nil {
		return err
	}
	conns := b.cfg.loop().Connections()
	rep.PoolMaxConns = int(b.pool.Config().MaxConns)
	for i := range b.cfg.Workers {
		l := &loop{name: fmt.Sprintf("%s-w%d", b.run, i+1)}
		if l.pool, err = newPool(b.cfg.DBURL, conns); err != nil {
			return err
		}
		b.loops = append(b.loops, l)
		rep.PoolMaxConns += int(l.pool.Config().MaxConns)
		routes, err := b.routes()
		if err != nil {
			return err
		}
		if l.d, err = service.NewDispatcher(ctx, l.pool, service.DispatcherConfig{
			Worker: l.name, Routes: routes, Lease: time.Minute, CallTimeout: workload.CallTimeout,
			DBTimeout: b.cfg.DBTimeout, Backoff: workload.RetryBackoff,
		}); err != nil {
			return err
		}
	}
	rep.WorkerPoolConns = conns
	if err := b.checkConnections(ctx, rep.PoolMaxConns); err != nil {
		return err
	}
	b.users = make([]string, min(workload.Users, b.cfg.Notifications))
	for i := range b.users {
		b.users[i] = fmt.Sprintf("%s-u%d", b.run, i)
	}
	return b.parallel(ctx, len(b.users), func(ctx context.Context, i int) error {
		for _, ch := range workload.Channels {
			if _, err := b.n.SetPreference(ctx, b.users[i], ch, b.users[i]+"@"+ch, true); err != nil {
				return err
			}
		}
		return nil
	})
}

// routes are one loop's channels: its own HTTP clients to the fakes (as a process of its own would
// have), or with --skip-calls a client that answers at once.
func (b *bench) routes() (map[string]delivery.Route, error) {
	modes := map[string]delivery.Mode{"push": delivery.ModeIdempotent, "sms": delivery.ModeQueryable}
	routes := map[string]delivery.Route{}
	for name, ch := range map[string]*fakes.Channel{"push": b.push, "sms": b.sms} {
		var client delivery.Channel = acceptAtOnce{}
		if !b.cfg.SkipCalls {
			c, err := httpchannel.New(ch.URL(), httpchannel.Options{})
			if err != nil {
				return nil, err
			}
			client = c
		}
		routes[name] = delivery.Route{Mode: modes[name], Client: client}
	}
	return routes, nil
}

// acceptAtOnce is the channel client of --skip-calls: every send is accepted, every query finds its
// message, at once and without a call, so a run measures the database side alone.
type acceptAtOnce struct{}

func (acceptAtOnce) Send(_ context.Context, msg delivery.Message) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: "bench-" + msg.Ref}
}

func (acceptAtOnce) Query(_ context.Context, ref string) delivery.Observation {
	return delivery.Observation{Outcome: delivery.OutcomeQueryFound, ProviderMsgID: "bench-" + ref}
}

// checkConnections refuses a run whose pools could open more connections than the server accepts (it
// would stall on "too many clients" instead).
func (b *bench) checkConnections(ctx context.Context, want int) error {
	dctx, cancel := context.WithTimeout(ctx, b.cfg.DBTimeout)
	defer cancel()
	available, err := productdb.New(b.pool).ServerConnectionsAvailable(dctx)
	if err != nil {
		return fmt.Errorf("read the server's connection limit: %w", err)
	}
	if want > int(available) {
		return usagef("the bench's pools may open %d connections (%d for creates, 1 + --finishers per worker loop, at least the URL's pool_max_conns), more than the %d the server accepts: lower --workers or --finishers",
			want, b.pool.Config().MaxConns, available)
	}
	return nil
}

func (b *bench) stop() {
	for _, l := range b.loops {
		l.pool.Close()
	}
	if b.push != nil {
		b.push.Close()
	}
	if b.sms != nil {
		b.sms.Close()
	}
}

// notef writes a phase note on stderr (not with --json).
func (b *bench) notef(format string, args ...any) {
	if !b.cfg.JSON {
		fmt.Fprintf(b.stderr, "== "+format+"\n", args...)
	}
}

// warmupRun creates and delivers --warmup notifications before anything is measured. A new cluster is
// much slower for its first few thousand deliveries (measured: pgbench at 310 tps first, 760 tps right
// after), so without it whichever side ran first would be measured against a warm other.
func (b *bench) warmupRun(ctx context.Context) (int, error) {
	if b.cfg.Warmup == 0 {
		return 0, nil
	}
	cs, err := b.createAll(ctx, "warmup", b.cfg.Warmup, 0)
	if err != nil {
		return 0, err
	}
	ds, err := b.deliver(ctx, "warmup", cs.tasks, b.cfg.loop(), nil)
	if err != nil {
		return ds.sent, err
	}
	b.notef("warm-up: created %d, delivered %d (%.0f/s, not reported)", cs.created, ds.sent, float64(ds.sent)/ds.seconds)
	return ds.sent, nil
}

// mainRun is the create phase and the deliver phase, and the figures taken from them.
func (b *bench) mainRun(ctx context.Context, rep *Report) error {
	cs, err := b.createAll(ctx, "main", b.cfg.Notifications, b.cfg.Duplicates)
	if err != nil {
		return err
	}
	rep.CreateCalls, rep.Created, rep.DuplicateAnswers = cs.calls, cs.created, cs.calls-cs.created
	rep.Tasks, rep.CreateSeconds = cs.tasks, pgbench.Round3(cs.seconds)
	rep.CreatesPerSec = pgbench.Round3(float64(cs.calls) / cs.seconds)
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
	stopProfile, err := startCPUProfile(b.cfg.CPUProfile)
	if err != nil {
		return err
	}
	ds, err := b.deliver(ctx, "deliver", cs.tasks, b.cfg.loop(), b.cfg.PhaseHook)
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
	ds.fill(rep)
	rep.CallSteps = latency.Steps(b.samplers)
	if !b.cfg.SkipCalls {
		rep.WindowBoundPerSec = math.Round(b.cfg.Latency.Bound(len(workload.Channels), cs.tasks/len(workload.Channels), rep.Window))
	}
	if ds.sent > 0 {
		per := func(a, b int64) float64 { return pgbench.Round3(float64(b-a) / float64(ds.sent)) }
		rep.DBXactsPerDelivery = per(commits0.XactCommit, commits1.XactCommit)
		rep.RowsWrittenPerDelivery = per(commits0.RowsWritten, commits1.RowsWritten)
		if upd := commits1.Updates - commits0.Updates; upd > 0 {
			rep.HOTUpdateShare = pgbench.Round3(float64(commits1.HotUpdates-commits0.HotUpdates) / float64(upd))
		}
	}
	rep.Autovacuums = commits1.Autovacuums - commits0.Autovacuums
	dctx, cancel := context.WithTimeout(ctx, b.cfg.DBTimeout)
	defer cancel()
	lat, err := b.q.BenchSentLatency(dctx, dbgen.BenchSentLatencyParams{MinID: cs.minID, MaxID: cs.maxID})
	if err != nil {
		return fmt.Errorf("create -> SENT latency: %w", err)
	}
	rep.CreateToSentMS = Latency{P50: pgbench.Round3(lat.P50MS), P99: pgbench.Round3(lat.P99MS)}
	b.notef("created %d (%d calls, %.0f/s), delivered %d (%.0f/s)", cs.created, cs.calls, rep.CreatesPerSec, ds.sent, rep.DeliveriesPerSec)
	return nil
}

// analyze refreshes the planner's statistics before a deliver phase, as setup.sql does before pgbench.
func (b *bench) analyze(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, b.cfg.DBTimeout)
	defer cancel()
	if err := b.q.BenchAnalyze(dctx); err != nil {
		return fmt.Errorf("analyze: %w", err)
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
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// commits reads xact_commit of this database after closing every pool's connections, so that every
// transaction so far is counted.
func (b *bench) commits(ctx context.Context) (dbgen.BenchXactCommitRow, error) {
	b.pool.Reset()
	for _, l := range b.loops {
		l.pool.Reset()
	}
	time.Sleep(300 * time.Millisecond) // the closed backends exit and flush their statistics
	dctx, cancel := context.WithTimeout(ctx, b.cfg.DBTimeout)
	defer cancel()
	n, err := b.q.BenchXactCommit(dctx)
	if err != nil {
		return n, fmt.Errorf("read xact_commit: %w", err)
	}
	return n, nil
}

// finalCheck checks every task of this run is SENT, no event has two notifications, and the fakes sent
// each message once (a 503 before acceptance is no message; a resend with the same key is a replay).
func (b *bench) finalCheck(ctx context.Context, rep *Report) error {
	dctx, cancel := context.WithTimeout(ctx, b.cfg.DBTimeout)
	defer cancel()
	row, err := b.q.BenchRunCheck(dctx, b.run+"-")
	if err != nil {
		return fmt.Errorf("final check: %w", err)
	}
	rep.Sends = b.push.TotalSends() + b.sms.TotalSends()
	rep.Outbound = b.push.TotalOutbound() + b.sms.TotalOutbound()
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
	if !b.cfg.SkipCalls {
		if rep.Outbound != b.delivered {
			errs = append(errs, fmt.Errorf("the fakes sent %d messages for %d delivered tasks", rep.Outbound, b.delivered))
		}
		if n := max(b.push.MaxOutboundPerRef(), b.sms.MaxOutboundPerRef()); n > 1 {
			errs = append(errs, fmt.Errorf("a task's message was sent %d times", n))
		}
	}
	return errors.Join(errs...)
}

func ms(d time.Duration) float64 { return pgbench.Round3(float64(d) / float64(time.Millisecond)) }
