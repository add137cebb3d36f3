package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// pgbenchReport is pgbench replaying the per-task claim and finish SQL (testdata/bench/claim_finish.sql)
// with as many clients as the bench had workers, for as many deliveries.
type pgbenchReport struct {
	Script       string  `json:"script"`
	Clients      int     `json:"clients"`
	Threads      int     `json:"threads"`
	Transactions int     `json:"transactions"` // one transaction of the script = one delivery
	TPS          float64 `json:"tps"`
	LatencyAvgMS float64 `json:"latency_avg_ms"`
	Seconds      float64 `json:"seconds"`
	// CPU per transaction: the pgbench process, and the PostgreSQL server when it runs here.
	ClientCPUMSPerDelivery float64 `json:"client_cpu_ms_per_delivery"`
	ServerCPUMSPerDelivery float64 `json:"server_cpu_ms_per_delivery,omitempty"`
	// GoVsPgbench is the Go side's deliveries/s (at --batch) divided by pgbench's tps (always per task).
	GoVsPgbench float64 `json:"go_vs_pgbench"`
}

// pgbenchCompare runs pgbench unless it is off, or auto and pgbench or the scripts are not found.
func (b *bench) pgbenchCompare(ctx context.Context, rep *benchReport) error {
	if b.cfg.pgbench == "off" {
		rep.PgbenchSkipped = "--pgbench=false"
		return nil
	}
	bin, binErr := findPGBin(b.e.getenv)
	scripts, scriptsErr := findBenchScripts(b.cfg.scripts)
	if err := errors.Join(binErr, scriptsErr); err != nil {
		if b.cfg.pgbench == "on" {
			return fmt.Errorf("bench: --pgbench: %w", err)
		}
		rep.PgbenchSkipped = err.Error()
		b.notef("pgbench skipped: %v", err)
		return nil
	}
	g, err := b.runPgbench(ctx, bin, scripts, rep.Deliveries, rep.Server.PlanCacheMode)
	if err != nil {
		return err
	}
	g.GoVsPgbench = ratio(rep.DeliveriesPerSec, g.TPS)
	rep.Pgbench = g
	b.notef("pgbench: %.0f tps; Go %.0f deliveries/s = %.2f x pgbench", g.TPS, rep.DeliveriesPerSec, g.GoVsPgbench)
	if b.cfg.rounds < 2 {
		return nil
	}
	rep.Rounds = []roundReport{{Round: 1, Deliveries: rep.Deliveries, DeliveriesPerSec: round3(rep.DeliveriesPerSec),
		PgbenchTPS: g.TPS, GoVsPgbench: g.GoVsPgbench, CPUMSPerDelivery: round3(rep.CPUMSPerDelivery),
		ServerCPUMSPerDelivery: round3(rep.ServerCPUMSPerDelivery), PgbenchCPUMSPerDelivery: g.ClientCPUMSPerDelivery,
		PgbenchServerCPUMSPerDelivery: g.ServerCPUMSPerDelivery}}
	for n := 2; n <= b.cfg.rounds; n++ {
		r, err := b.compareRound(ctx, n, bin, scripts, rep.Server.PlanCacheMode)
		if err != nil {
			return err
		}
		rep.Rounds = append(rep.Rounds, r)
	}
	ratios := make([]float64, len(rep.Rounds))
	for i, r := range rep.Rounds {
		ratios[i] = r.GoVsPgbench
	}
	rep.MedianGoVsPgbench = round3(median(ratios))
	b.notef("rounds: Go / pgbench %v, median %.2f", ratios, rep.MedianGoVsPgbench)
	return nil
}

// roundReport is one Go deliver phase and the pgbench run after it (--rounds).
type roundReport struct {
	Round                         int     `json:"round"`
	Deliveries                    int     `json:"deliveries"`
	DeliveriesPerSec              float64 `json:"deliveries_per_sec"`
	PgbenchTPS                    float64 `json:"pgbench_tps"`
	GoVsPgbench                   float64 `json:"go_vs_pgbench"`
	CPUMSPerDelivery              float64 `json:"cpu_ms_per_delivery"`
	ServerCPUMSPerDelivery        float64 `json:"server_cpu_ms_per_delivery,omitempty"`
	PgbenchCPUMSPerDelivery       float64 `json:"pgbench_cpu_ms_per_delivery"`
	PgbenchServerCPUMSPerDelivery float64 `json:"pgbench_server_cpu_ms_per_delivery,omitempty"`
}

// compareRound is one more pair after the first: --notifications created (no duplicates: only the
// deliveries are compared), delivered by the workers, then as many replayed by pgbench. Alternating
// the two sides makes a machine whose speed drifts (shared cores) weigh on both alike.
func (b *bench) compareRound(ctx context.Context, n int, bin, scripts, planCacheMode string) (roundReport, error) {
	label := fmt.Sprintf("round%d", n)
	cs, err := b.createAll(ctx, label, b.cfg.notifications, 0)
	if err != nil {
		return roundReport{}, err
	}
	if err := b.analyze(ctx); err != nil {
		return roundReport{}, err
	}
	ds, err := b.deliver(ctx, label+" deliver", cs.tasks, b.cfg.pipeline)
	if err != nil {
		return roundReport{}, err
	}
	client, server := ds.cpuMSPerDelivery()
	r := roundReport{Round: n, Deliveries: ds.sent, DeliveriesPerSec: round3(float64(ds.sent) / ds.seconds),
		CPUMSPerDelivery: round3(client), ServerCPUMSPerDelivery: round3(server)}
	g, err := b.runPgbench(ctx, bin, scripts, ds.sent, planCacheMode)
	if err != nil {
		return roundReport{}, err
	}
	r.PgbenchTPS, r.GoVsPgbench = g.TPS, ratio(r.DeliveriesPerSec, g.TPS)
	r.PgbenchCPUMSPerDelivery, r.PgbenchServerCPUMSPerDelivery = g.ClientCPUMSPerDelivery, g.ServerCPUMSPerDelivery
	b.notef("round %d: Go %.0f deliveries/s, pgbench %.0f tps = %.2f", n, r.DeliveriesPerSec, r.PgbenchTPS, r.GoVsPgbench)
	return r, nil
}

// median of xs (not empty); xs is sorted in place.
func median(xs []float64) float64 {
	slices.Sort(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

// runPgbench prepares deliveries due tasks with setup.sql and replays them with pgbench: as many clients
// as workers, the workers' plan_cache_mode.
func (b *bench) runPgbench(ctx context.Context, bin, scripts string, deliveries int, planCacheMode string) (*pgbenchReport, error) {
	clients := b.cfg.workers
	perClient := (deliveries + clients - 1) / clients
	g := &pgbenchReport{Script: filepath.Join(scripts, "claim_finish.sql"), Clients: clients,
		Threads: min(clients, runtime.NumCPU()), Transactions: perClient * clients}
	conn, env, err := libpqConn(b.e.dbURL)
	if err != nil {
		return nil, fmt.Errorf("bench: pgbench: %w", err)
	}
	b.notef("pgbench: preparing %d tasks (psql -f %s)", g.Transactions, filepath.Join(scripts, "setup.sql"))
	setup := exec.CommandContext(ctx, filepath.Join(bin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
		"-v", "tasks="+strconv.Itoa(g.Transactions), "-f", filepath.Join(scripts, "setup.sql"), "-d", conn)
	setup.Env = env
	if out, err := setup.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("bench: pgbench setup: %w: %s", err, bytes.TrimSpace(out))
	}
	b.notef("pgbench: %d clients x %d deliveries (PGOPTIONS='-c plan_cache_mode=%s' pgbench -n -M prepared -c %d -j %d -t %d -f %s)",
		clients, perClient, planCacheMode, clients, g.Threads, perClient, g.Script)
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pgbench"), "-n", "-M", "prepared",
		"-c", strconv.Itoa(clients), "-j", strconv.Itoa(g.Threads), "-t", strconv.Itoa(perClient), "-f", g.Script, conn)
	// The same session setting as the workers' connections: the plans are part of what is replayed.
	cmd.Env = withPGOption(env, "plan_cache_mode", planCacheMode)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	started, srv0 := time.Now(), b.serverUsed()
	err = cmd.Run()
	srv := b.serverUsed() - srv0
	g.Seconds = round3(time.Since(started).Seconds())
	if err != nil {
		return nil, fmt.Errorf("bench: pgbench: %w: %s", err, lastLines(stderr.String()+stdout.String(), 5))
	}
	if err := parsePgbench(stdout.String(), g); err != nil {
		return nil, fmt.Errorf("bench: pgbench: %w", err)
	}
	if st := cmd.ProcessState; st != nil && g.Transactions > 0 {
		g.ClientCPUMSPerDelivery = round3(msPer(st.UserTime()+st.SystemTime(), g.Transactions))
		if b.server != nil {
			g.ServerCPUMSPerDelivery = round3(msPer(srv, g.Transactions))
		}
	}
	return g, nil
}

var (
	pgbenchTPS       = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \(without initial connection time\)`)
	pgbenchProcessed = regexp.MustCompile(`(?m)^number of transactions actually processed: (\d+)/(\d+)`)
	pgbenchFailed    = regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
	pgbenchLatency   = regexp.MustCompile(`(?m)^latency average = ([0-9.]+) ms`)
)

// parsePgbench reads tps and latency from pgbench's summary and checks that every transaction ran.
func parsePgbench(out string, g *pgbenchReport) error {
	m := pgbenchTPS.FindStringSubmatch(out)
	if m == nil {
		return fmt.Errorf("no tps in its output: %s", lastLines(out, 5))
	}
	g.TPS, _ = strconv.ParseFloat(m[1], 64)
	if m := pgbenchLatency.FindStringSubmatch(out); m != nil {
		g.LatencyAvgMS, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := pgbenchProcessed.FindStringSubmatch(out); m == nil || m[1] != m[2] {
		return fmt.Errorf("not every transaction ran: %s", lastLines(out, 8))
	}
	if m := pgbenchFailed.FindStringSubmatch(out); m != nil && m[1] != "0" {
		return fmt.Errorf("%s transactions failed", m[1])
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// findPGBin finds the PostgreSQL client binaries (pgbench, psql) as the test harness finds the server:
// $PG_BIN, `pg_config --bindir`, the newest /usr/lib/postgresql/*/bin.
func findPGBin(getenv func(string) string) (string, error) {
	var candidates []string
	if d := getenv("PG_BIN"); d != "" {
		candidates = append(candidates, d)
	}
	if pgConfig, err := exec.LookPath("pg_config"); err == nil {
		if out, err := exec.Command(pgConfig, "--bindir").Output(); err == nil {
			candidates = append(candidates, strings.TrimSpace(string(out)))
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return versionOf(b) - versionOf(a) })
	candidates = append(candidates, dirs...)
	for _, d := range candidates {
		if isExecutable(filepath.Join(d, "pgbench")) && isExecutable(filepath.Join(d, "psql")) {
			return d, nil
		}
	}
	return "", fmt.Errorf("pgbench and psql not found in %s", strings.Join(append(candidates, "$PG_BIN, pg_config --bindir"), ", "))
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// findBenchScripts returns dir if given, else testdata/bench in the current directory or above.
func findBenchScripts(dir string) (string, error) {
	has := func(d string) bool {
		for _, f := range []string{"setup.sql", "claim_finish.sql"} {
			if _, err := os.Stat(filepath.Join(d, f)); err != nil {
				return false
			}
		}
		return true
	}
	if dir != "" {
		if !has(dir) {
			return "", fmt.Errorf("no setup.sql and claim_finish.sql in --pgbench-scripts %s", dir)
		}
		return dir, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if cand := filepath.Join(d, "testdata", "bench"); has(cand) {
			return cand, nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("testdata/bench/claim_finish.sql not found here or above (run from the repository, or --pgbench-scripts DIR)")
		}
	}
}

// withPGOption returns env with "-c name=value" added to PGOPTIONS (libpq's options for the server).
func withPGOption(env []string, name, value string) []string {
	opt := "-c " + name + "=" + value
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if old, ok := strings.CutPrefix(kv, "PGOPTIONS="); ok {
			opt = strings.TrimSpace(old + " " + opt)
			continue
		}
		out = append(out, kv)
	}
	return append(out, "PGOPTIONS="+opt)
}

// libpqConn turns the database URL into one psql and pgbench accept: the password moves to PGPASSWORD
// (not on a command line, where ps shows it) and pgx-only parameters are dropped.
func libpqConn(dbURL string) (string, []string, error) {
	env := os.Environ()
	if !strings.Contains(dbURL, "://") {
		return dbURL, env, nil // key=value form: passed as is
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", nil, errors.New("invalid database URL")
	}
	if pw, ok := u.User.Password(); ok {
		env = append(env, "PGPASSWORD="+pw)
		u.User = url.User(u.User.Username())
	}
	q := u.Query()
	for k := range q {
		if strings.HasPrefix(k, "pool_") || k == "statement_cache_capacity" || k == "description_cache_capacity" || k == "default_query_exec_mode" {
			q.Del(k)
		}
	}
	u.RawQuery = q.Encode()
	return u.String(), env, nil
}
