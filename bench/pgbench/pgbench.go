// Package pgbench replays the worker's claim and finish SQL of one task with pgbench (claim_finish.sql,
// generated from queries/ by TestPgbenchScript) on due tasks made by setup.sql: the same statements as
// the Go worker at --max-in-flight 1 --batch 1, run by PostgreSQL's own C client, the yardstick of the
// bench's per-task figure. Both scripts are built into the binary; --pgbench-scripts DIR runs others.
package pgbench

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"math"
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

	"github.com/notifierhq/notifier/bench/proc"
)

//go:embed setup.sql claim_finish.sql
var builtIn embed.FS

// Script names in a scripts directory.
const (
	SetupScript  = "setup.sql"
	ReplayScript = "claim_finish.sql"
)

// Report is pgbench replaying ReplayScript with Clients clients for as many deliveries as the Go side
// made.
type Report struct {
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
	// GoVsPgbench is the Go side's deliveries/s divided by pgbench's tps (always per task); set by the
	// caller.
	GoVsPgbench float64 `json:"go_vs_pgbench"`
}

// Scripts returns dir after checking it holds both scripts; without dir, a temporary directory holding
// the built-in ones, removed by cleanup.
func Scripts(dir string) (path string, cleanup func(), err error) {
	if dir != "" {
		for _, f := range []string{SetupScript, ReplayScript} {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				return "", nil, fmt.Errorf("no %s and %s in %s", SetupScript, ReplayScript, dir)
			}
		}
		return dir, func() {}, nil
	}
	tmp, err := os.MkdirTemp("", "notifier-pgbench-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { _ = os.RemoveAll(tmp) }
	for _, f := range []string{SetupScript, ReplayScript} {
		data, err := builtIn.ReadFile(f)
		if err == nil {
			err = os.WriteFile(filepath.Join(tmp, f), data, 0o644)
		}
		if err != nil {
			cleanup()
			return "", nil, err
		}
	}
	return tmp, cleanup, nil
}

// Runner runs pgbench against one database.
type Runner struct {
	Bin           string // directory of pgbench and psql (FindBin)
	Scripts       string // directory of the scripts (Scripts)
	DBURL         string
	PlanCacheMode string // the Go workers' connections': the plans are part of what is replayed
	Clients       int
	// Server is the PostgreSQL server whose CPU is measured; nil when it is not.
	Server *proc.Server
	// Notef reports progress (may be nil).
	Notef func(format string, args ...any)
}

func (r Runner) notef(format string, args ...any) {
	if r.Notef != nil {
		r.Notef(format, args...)
	}
}

// Run prepares at least deliveries due tasks with setup.sql and replays as many with pgbench: Clients
// clients, each the same number of transactions.
func (r Runner) Run(ctx context.Context, deliveries int) (*Report, error) {
	clients := max(1, r.Clients)
	perClient := (deliveries + clients - 1) / clients
	g := &Report{Script: filepath.Join(r.Scripts, ReplayScript), Clients: clients,
		Threads: min(clients, runtime.NumCPU()), Transactions: perClient * clients}
	conn, env, err := libpqConn(r.DBURL)
	if err != nil {
		return nil, fmt.Errorf("pgbench: %w", err)
	}
	setupPath := filepath.Join(r.Scripts, SetupScript)
	r.notef("pgbench: preparing %d tasks (psql -f %s)", g.Transactions, setupPath)
	setup := exec.CommandContext(ctx, filepath.Join(r.Bin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
		"-v", "tasks="+strconv.Itoa(g.Transactions), "-f", setupPath, "-d", conn)
	setup.Env = env
	if out, err := setup.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgbench setup: %w: %s", err, bytes.TrimSpace(out))
	}
	r.notef("pgbench: %d clients x %d deliveries (PGOPTIONS='-c plan_cache_mode=%s' pgbench -n -M prepared -c %d -j %d -t %d -f %s)",
		clients, perClient, r.PlanCacheMode, clients, g.Threads, perClient, g.Script)
	cmd := exec.CommandContext(ctx, filepath.Join(r.Bin, "pgbench"), "-n", "-M", "prepared",
		"-c", strconv.Itoa(clients), "-j", strconv.Itoa(g.Threads), "-t", strconv.Itoa(perClient), "-f", g.Script, conn)
	cmd.Env = env
	if r.PlanCacheMode != "" {
		cmd.Env = withPGOption(env, "plan_cache_mode", r.PlanCacheMode)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	started, serverPhase := time.Now(), r.Server.Start()
	err = cmd.Run()
	srv := serverPhase.End()
	g.Seconds = Round3(time.Since(started).Seconds())
	if err != nil {
		return nil, fmt.Errorf("pgbench: %w: %s", err, lastLines(stderr.String()+stdout.String(), 5))
	}
	if err := parse(stdout.String(), g); err != nil {
		return nil, fmt.Errorf("pgbench: %w", err)
	}
	if st := cmd.ProcessState; st != nil && g.Transactions > 0 {
		g.ClientCPUMSPerDelivery = Round3(MSPer(st.UserTime()+st.SystemTime(), g.Transactions))
		if r.Server != nil {
			g.ServerCPUMSPerDelivery = Round3(MSPer(srv, g.Transactions))
		}
	}
	return g, nil
}

// MSPer is d in milliseconds per one of n (n > 0): the bench's CPU per delivery.
func MSPer(d time.Duration, n int) float64 { return d.Seconds() * 1000 / float64(n) }

// Round3 rounds f to 3 decimals, as the bench reports its figures.
func Round3(f float64) float64 { return math.Round(f*1000) / 1000 }

var (
	pgbenchTPS       = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \(without initial connection time\)`)
	pgbenchProcessed = regexp.MustCompile(`(?m)^number of transactions actually processed: (\d+)/(\d+)`)
	pgbenchFailed    = regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
	pgbenchLatency   = regexp.MustCompile(`(?m)^latency average = ([0-9.]+) ms`)
)

// parse reads tps and latency from pgbench's summary and checks that every transaction ran.
func parse(out string, g *Report) error {
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

// FindBin finds the PostgreSQL client binaries (pgbench, psql) as the test harness finds the server:
// $PG_BIN, `pg_config --bindir`, the newest /usr/lib/postgresql/*/bin.
func FindBin(getenv func(string) string) (string, error) {
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
