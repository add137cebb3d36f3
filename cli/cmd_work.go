package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/channelconfig"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
	"github.com/notifierhq/notifier/service/redact"
	"github.com/notifierhq/notifier/worker"
)

// leaseMargin is how much longer than the client timeout a lease must be: the time from the claim's
// commit (when the database starts the lease) to the call, the client's own timer slack, and the
// finish transaction, so that a live holder records its result before anyone may take the task
// over. 2 s covers a commit on a busy database; half the timeout keeps the margin proportional for
// slow channels. Shorter leases let two holders call the channel at once (docs/protocol.md#known-boundaries) and are
// refused unless --allow-lease-overlap.
func leaseMargin(timeout time.Duration) time.Duration {
	return max(2*time.Second, timeout/2)
}

func workCommand(e *env) *cli.Command {
	return &cli.Command{
		Name:  "work",
		Usage: "run a delivery worker (claim, call the channel, record the outcome)",
		UsageText: "notifier work {--channel NAME=MODE,URL [--channel ...] | --channels-file FILE} [--worker-id W] [--once]\n" +
			"   [--max-in-flight 1024] [--batch 256] [--finishers 2] [--lease 30s] [--timeout 10s] [--backoff 2s] [--poll 200ms]\n" +
			"   [--allow-lease-overlap] [--disable-on-unregistered] [--metrics-addr 127.0.0.1:9464] [--ca-file F]\n" +
			"   [--wait-for-database 1m]",
		Description: helpText("work"),
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "channel", Usage: "NAME=MODE,URL with MODE idempotent|queryable|none (repeatable; this or --channels-file is required)"},
			&cli.StringFlag{Name: "channels-file", Usage: "TOML `FILE` of channels (kind = one of " + strings.Join(channelconfig.Kinds(), ", ") + "; see the description)"},
			&cli.StringFlag{Name: "channels", Hidden: true}, // renamed: parseWork says so
			&cli.IntFlag{Name: "concurrency", Hidden: true}, // replaced: parseWork says so
			&cli.StringFlag{Name: "worker-id", Usage: "recorded on every claim and attempt (default: hostname-pid)"},
			&cli.BoolFlag{Name: "once", Usage: "run one cycle, print its result as JSON and exit"},
			&cli.IntFlag{Name: "max-in-flight", Value: worker.DefaultMaxInFlight, Usage: fmt.Sprintf("calls in flight at once, each with its own lease (1-%d; see the description)", worker.MaxInFlightLimit)},
			&cli.IntFlag{Name: "batch", Value: worker.DefaultBatch, Usage: fmt.Sprintf("most tasks one claim takes (1-%d; not with --once)", service.MaxBatch)},
			&cli.IntFlag{Name: "finishers", Value: worker.DefaultFinishers, Usage: fmt.Sprintf("finish statements running at once (1-%d)", worker.MaxFinishersLimit)},
			&cli.DurationFlag{Name: "lease", Value: service.DefaultLease, Usage: "how long a claim holds a task"},
			&cli.DurationFlag{Name: "timeout", Value: service.DefaultCallTimeout, Usage: "client timeout of one channel call"},
			&cli.DurationFlag{Name: "backoff", Value: service.DefaultBackoff, Usage: "first retry delay, doubled per attempt (each wait lengthened by up to a quarter, at random)"},
			&cli.DurationFlag{Name: "poll", Value: worker.DefaultPoll, Usage: "wait after finding nothing to do (lengthened by up to a quarter, at random)"},
			&cli.BoolFlag{Name: "allow-lease-overlap", Usage: "accept a lease not longer than timeout + margin"},
			&cli.BoolFlag{Name: "disable-on-unregistered", Usage: "switch a user's preference off when the provider says the address is unregistered"},
			&cli.StringFlag{Name: "metrics-addr", Usage: "serve Prometheus metrics at http://ADDR/metrics"},
			&cli.StringFlag{Name: "ca-file", Usage: "extra PEM root certificates for https channels"},
			&cli.DurationFlag{Name: "wait-for-database", Value: time.Minute, Usage: "at start, how long to retry while no database server accepts a connection (a failover, a server starting); 0: fail at once (the default with --once)"},
		},
		Action: func(c *cli.Context) error { return work(c, e) },
	}
}

// channelSpec is one parsed --channel value.
type channelSpec struct {
	Name string
	Mode delivery.Mode
	URL  string
}

// parseChannel parses NAME=MODE,URL. Errors quote the value with any URL password removed.
func parseChannel(value string) (channelSpec, error) {
	shown := redact.Text(value)
	name, rest, ok := strings.Cut(value, "=")
	if !ok {
		return channelSpec{}, usagef("invalid --channel %q: want NAME=MODE,URL, e.g. push=idempotent,http://127.0.0.1:8081", shown)
	}
	modeText, rawURL, ok := strings.Cut(rest, ",")
	if !ok {
		return channelSpec{}, usagef("invalid --channel %q: no URL: want NAME=MODE,URL, e.g. push=idempotent,http://127.0.0.1:8081", shown)
	}
	name, modeText, rawURL = strings.TrimSpace(name), strings.TrimSpace(modeText), strings.TrimSpace(rawURL)
	if name == "" {
		return channelSpec{}, usagef("invalid --channel %q: empty channel name", shown)
	}
	mode, err := delivery.ParseMode(modeText)
	if err != nil {
		return channelSpec{}, usagef("invalid --channel %q: unknown mode %q: want idempotent, queryable or none", shown, modeText)
	}
	if rawURL == "" {
		return channelSpec{}, usagef("invalid --channel %q: empty URL", shown)
	}
	return channelSpec{Name: name, Mode: mode, URL: rawURL}, nil
}

// workConfig is the validated work command line.
type workConfig struct {
	dispatcher service.DispatcherConfig
	specs      []channelSpec
	once       bool
	loop       worker.Config
	metrics    string
	// waitForDatabase bounds how long the worker waits at start for a server that accepts connections.
	waitForDatabase time.Duration
}

func parseWork(c *cli.Context, e *env) (workConfig, error) {
	if c.IsSet("channels") {
		return workConfig{}, usagef("--channels was renamed --channels-file (it is easily mistaken for --channel)")
	}
	if c.IsSet("concurrency") {
		return workConfig{}, usagef("--concurrency was replaced by --max-in-flight (calls in flight at once; default %d)", worker.DefaultMaxInFlight)
	}
	values, channelsFile := c.StringSlice("channel"), c.String("channels-file")
	if len(values) == 0 && channelsFile == "" {
		return workConfig{}, usagef("%s: missing required flag --channel (NAME=MODE,URL) or --channels-file FILE", commandName(c))
	}
	cfg := workConfig{once: c.Bool("once"), metrics: c.String("metrics-addr"), waitForDatabase: c.Duration("wait-for-database")}
	if cfg.waitForDatabase < 0 {
		return workConfig{}, usagef("invalid --wait-for-database %s: must be 0 or more", cfg.waitForDatabase)
	}
	if cfg.once && !c.IsSet("wait-for-database") {
		cfg.waitForDatabase = 0 // one cycle, for a script: fail at once unless told to wait
	}
	d := &cfg.dispatcher
	d.Worker = c.String("worker-id")
	if !c.IsSet("worker-id") {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "worker"
		}
		d.Worker = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	d.Lease, d.CallTimeout, d.DBTimeout = c.Duration("lease"), c.Duration("timeout"), e.dbTimeout
	d.Backoff = delivery.Backoff{Base: c.Duration("backoff")}
	d.DisableUnregistered = c.Bool("disable-on-unregistered")
	for name, v := range map[string]time.Duration{"lease": d.Lease, "timeout": d.CallTimeout, "backoff": d.Backoff.Base, "poll": c.Duration("poll")} {
		if v <= 0 {
			return workConfig{}, usagef("invalid --%s %s: must be more than 0", name, v)
		}
	}
	if n := c.Int("max-in-flight"); n < 1 || n > worker.MaxInFlightLimit {
		return workConfig{}, usagef("invalid --max-in-flight %d: want 1 to %d", n, worker.MaxInFlightLimit)
	}
	if n := c.Int("batch"); n < 1 || n > service.MaxBatch {
		return workConfig{}, usagef("invalid --batch %d: want 1 to %d", n, service.MaxBatch)
	} else if c.IsSet("batch") && cfg.once {
		return workConfig{}, usagef("--batch %d with --once: --once runs one task and prints one result", n)
	}
	if n := c.Int("finishers"); n < 1 || n > worker.MaxFinishersLimit {
		return workConfig{}, usagef("invalid --finishers %d: want 1 to %d", n, worker.MaxFinishersLimit)
	}
	if need := d.CallTimeout + leaseMargin(d.CallTimeout); d.Lease <= need && !c.Bool("allow-lease-overlap") {
		return workConfig{}, usagef("--lease %s is not longer than --timeout %s plus a margin of %s: two workers could call the channel for one task at once; use a lease over %s, or --allow-lease-overlap",
			d.Lease, d.CallTimeout, leaseMargin(d.CallTimeout), need)
	}
	if cfg.metrics != "" {
		if _, _, err := net.SplitHostPort(cfg.metrics); err != nil {
			return workConfig{}, usagef("invalid --metrics-addr %q: want host:port, e.g. 127.0.0.1:9464", cfg.metrics)
		}
	}
	d.Routes = map[string]delivery.Route{}
	fromFile := map[string]bool{}
	if channelsFile != "" {
		routes, err := channelconfig.Load(channelsFile, e.getenv)
		if err != nil {
			return workConfig{}, usagef("invalid --channels-file: %v", err)
		}
		for _, name := range slices.Sorted(maps.Keys(routes)) {
			r := routes[name]
			d.Routes[name], fromFile[name] = r, true
			cfg.specs = append(cfg.specs, channelSpec{Name: name, Mode: r.Mode, URL: fmt.Sprint(r.Client)})
		}
	}
	for _, v := range values {
		spec, err := parseChannel(v)
		if err != nil {
			return workConfig{}, err
		}
		if fromFile[spec.Name] {
			return workConfig{}, usagef("invalid --channel %q: channel %q is also defined in --channels-file %s: a channel may be defined once",
				redact.Text(v), spec.Name, channelsFile)
		}
		if _, dup := d.Routes[spec.Name]; dup {
			return workConfig{}, usagef("invalid --channel %q: channel %q given twice", redact.Text(v), spec.Name)
		}
		client, err := httpchannel.New(spec.URL, httpchannel.Options{CAFile: c.String("ca-file")})
		if err != nil {
			if errors.Is(err, delivery.ErrInvalidInput) {
				// The adapter's error shows the URL (redacted) once; the whole value again would put two
				// userinfos in one line, and redaction would hide everything between them.
				return workConfig{}, usagef("invalid --channel %s: %v", spec.Name, err)
			}
			return workConfig{}, err // e.g. the CA file cannot be read
		}
		d.Routes[spec.Name] = delivery.Route{Mode: spec.Mode, Client: client}
		cfg.specs = append(cfg.specs, spec)
	}
	if !cfg.once {
		if err := checkBurstCoversPoll(d.Routes, c.Duration("poll")); err != nil {
			return workConfig{}, err
		}
	}
	if err := d.Check(); err != nil { // before the worker waits for a database
		return workConfig{}, err
	}
	cfg.loop = worker.Config{MaxInFlight: c.Int("max-in-flight"), Batch: c.Int("batch"), Finishers: c.Int("finishers"),
		Poll: c.Duration("poll"), Logger: e.log}
	return cfg, nil
}

func work(c *cli.Context, e *env) error {
	cfg, err := parseWork(c, e)
	if err != nil {
		return err
	}
	var m *metrics
	if cfg.metrics != "" {
		m = newMetrics()
		m.serving(slices.Sorted(maps.Keys(cfg.dispatcher.Routes)))
	}
	log := e.log.With("worker", cfg.dispatcher.Worker)
	cfg.observe(log, m)
	pool, err := e.workerPool(int32(cfg.loop.Connections()))
	if err != nil {
		return err
	}
	defer pool.Close()
	// A primary may be out of reach while a failover runs, or the server may still be starting.
	err = service.WaitForDatabase(c.Context, pool, cfg.waitForDatabase, func(err error, next time.Duration) {
		log.Warn("database not reachable yet; retrying", "retry_in", next.Round(time.Millisecond).String(),
			"gives_up_after", cfg.waitForDatabase.String(), "error", redact.Error(err))
	})
	n := service.NewNotifier(pool)
	var (
		standing    service.ServerStanding
		planWarning string
		d           *service.Dispatcher
	)
	if err == nil {
		ctx, cancel := e.dbContext(c.Context)
		err = runPreflight(ctx, []preflightCheck{
			// A standby would refuse every claim with SQLSTATE 25006, forever.
			{"writable server", func(ctx context.Context) (err error) { standing, err = n.RequireWritable(ctx, "work"); return err }},
			// A role that may not claim would see no task under row-level security, forever.
			{"worker role", func(ctx context.Context) error { return n.RequireRole(ctx, "work", service.RoleWorker) }},
			// Behind a pooler the startup parameter may be dropped: a warning, not a refusal.
			{"plan cache mode", func(ctx context.Context) (err error) {
				planWarning, err = service.PlanCacheModeWarning(ctx, pool)
				return err
			}},
			{"pool share", func(ctx context.Context) error { return service.CheckPoolShare(ctx, pool) }},
			// Writes this worker's rate limits into their buckets.
			{"rate limits", func(ctx context.Context) (err error) {
				d, err = service.NewDispatcher(ctx, pool, cfg.dispatcher)
				return err
			}},
		})
		cancel()
	}
	if err != nil {
		if c.Context.Err() != nil {
			return nil // stopped before starting
		}
		return err
	}
	if planWarning != "" {
		log.Warn(planWarning)
	}
	watchStanding(c.Context, e, n, standing, log, m)
	if m != nil {
		watchAlertGauges(c.Context, e, n, log, m)
		stop, err := serveMetrics(e, cfg.metrics, m)
		if err != nil {
			return err
		}
		defer stop()
	}
	channels := make([]string, len(cfg.specs))
	for i, s := range cfg.specs {
		channels[i] = fmt.Sprintf("%s=%s,%s", s.Name, strings.ToLower(string(s.Mode)), redact.URL(s.URL))
	}
	for _, b := range d.Buckets() {
		log.Info("rate limit", "channel", b.Channel, "per_second", b.PerSecond, "burst", b.Burst,
			"tokens", math.Floor(b.Tokens), "paused_seconds", math.Ceil(b.PausedFor))
	}

	if cfg.once {
		log.Debug("worker cycle", "channels", channels, "lease", cfg.dispatcher.Lease.String(), "timeout", cfg.dispatcher.CallTimeout.String())
		res, err := worker.RunOnce(c.Context, d, log, cfg.loop.Observer)
		if err != nil {
			return err
		}
		return e.printJSON(res)
	}

	log.Info("worker started", "channels", channels, "max_in_flight", cfg.loop.MaxInFlight, "batch", cfg.loop.Batch,
		"finishers", cfg.loop.Finishers,
		"lease", cfg.dispatcher.Lease.String(), "timeout", cfg.dispatcher.CallTimeout.String())
	stopLog := context.AfterFunc(c.Context, func() {
		log.Info("stopping: no new claims; calls in flight finish and are recorded")
	})
	defer stopLog()
	cfg.loop.Logger = log
	if err := worker.Run(c.Context, d, cfg.loop); err != nil {
		log.Error("worker stopped", "error", err)
		return err
	}
	log.Info("worker stopped")
	return nil
}

// preflightCheck is one thing work makes sure of, or sets up, before its first claim; name says which
// in the error when it fails.
type preflightCheck struct {
	name string
	run  func(ctx context.Context) error
}

// runPreflight runs checks in order, all bounded by ctx, and stops at the first that fails: its error,
// which says what it found and how to fix it, after the check's name ("preflight worker role: ...").
func runPreflight(ctx context.Context, checks []preflightCheck) error {
	for _, c := range checks {
		if err := c.run(ctx); err != nil {
			return fmt.Errorf("preflight %s: %w", c.name, err)
		}
	}
	return nil
}

// standingEvery is how often a running worker reads the server's standing again: a failover changes
// the server, and pg_auto_failover or Patroni turn synchronous replication off while a standby is gone.
const standingEvery = 30 * time.Second

// watchStanding logs what commits survive on this server (service.ServerStanding) and every warning
// about it, exports it as metrics, and reads it again every standingEvery until ctx ends, logging when
// it changes.
func watchStanding(ctx context.Context, e *env, n *service.Notifier, s service.ServerStanding, log *slog.Logger, m *metrics) {
	report := func(s service.ServerStanding) {
		args := []any{"durability", s.Durability(), "synchronous_commit", s.SynchronousCommit,
			"synchronous_standby_names", s.SynchronousStandbyNames, "standbys", s.Standbys}
		if s.SyncStandbys != nil {
			args = append(args, "sync_standbys", *s.SyncStandbys)
		}
		log.Info("database", args...)
		for _, w := range s.Warnings() {
			log.Warn(w)
		}
		if m != nil {
			m.standbys.Set(float64(s.Standbys))
			m.waitsOnStandby.Set(map[bool]float64{true: 1}[s.CommitsWaitForStandby()])
		}
	}
	report(s)
	go func() {
		t := time.NewTicker(standingEvery)
		defer t.Stop()
		last := s
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, cancel := e.dbContext(ctx)
			now, err := n.Standing(rctx)
			cancel()
			if err == nil && !sameStanding(now, last) {
				report(now)
				last = now
			}
		}
	}()
}

// gaugesEvery is how often a worker with --metrics-addr reads the fleet-wide gauges (service.
// AlertGauges): fresh enough for alerts that wait minutes, and two cheap statements per interval per
// worker.
const gaugesEvery = 15 * time.Second

// watchAlertGauges reads the fleet-wide gauges now and every gaugesEvery until ctx ends. A failed read
// keeps the previous values and is logged; notifier_fleet_gauges_refreshed_timestamp_seconds then shows
// how old they are.
func watchAlertGauges(ctx context.Context, e *env, n *service.Notifier, log *slog.Logger, m *metrics) {
	read := func() {
		rctx, cancel := e.dbContext(ctx)
		g, err := n.AlertGauges(rctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("could not read the fleet-wide gauges; the metrics keep their previous values", "error", redact.Error(err))
			}
			return
		}
		m.onAlertGauges(g, time.Now())
	}
	read()
	go func() {
		t := time.NewTicker(gaugesEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				read()
			}
		}
	}()
}

func sameStanding(a, b service.ServerStanding) bool {
	return a.Durability() == b.Durability() && a.Standbys == b.Standbys && a.SynchronousCommit == b.SynchronousCommit &&
		a.SynchronousStandbyNames == b.SynchronousStandbyNames && fmt.Sprint(a.SyncStandbys) == fmt.Sprint(b.SyncStandbys)
}

// checkBurstCoversPoll refuses a rate limit whose burst holds less than one --poll's worth of calls: a
// worker whose claim found no token waits --poll before it claims again, and a bucket that fills up
// sooner stops filling, so the channel would run below its limit (at most burst per poll).
func checkBurstCoversPoll(routes map[string]delivery.Route, poll time.Duration) error {
	for _, name := range slices.Sorted(maps.Keys(routes)) {
		r := routes[name].RateLimit
		if need := r.PerSecond * poll.Seconds(); r.Burst > 0 && r.Burst < need {
			return usagef("invalid --channels-file: channel %q: burst %g is less than one --poll %s of rate_limit (%.4g calls): a worker that found no token waits --poll, so the channel would run below its limit; raise burst to at least %d or lower --poll",
				name, r.Burst, poll, need, int(math.Ceil(need)))
		}
	}
	return nil
}

// serveMetrics serves m at http://addr/metrics until the returned stop is called.
func serveMetrics(e *env, addr string, m *metrics) (stop func(), err error) {
	return serveRegistry(e, addr, m.registry)
}

// serveRegistry serves registry at http://addr/metrics until the returned stop is called (work's and
// console's --metrics-addr).
func serveRegistry(e *env, addr string, registry *prometheus.Registry) (stop func(), err error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	e.log.Info("serving metrics", "addr", l.Addr().String(), "url", "http://"+l.Addr().String()+"/metrics")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
