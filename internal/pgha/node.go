package pgha

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifierhq/notifier/internal/pgtest"
)

// monitorSettings lower the monitor's failover timeouts (pg_auto_failover's defaults in comments):
// the monitor checks every node each second and gives up on a primary 3 s after its last report
// (together ~3-4 s to notice a dead primary), then waits primary_demote_timeout for the old primary
// to demote itself before the standby takes writes. docs/operations.md#failover-timing.
var monitorSettings = [][2]string{
	{"pgautofailover.health_check_period", "1000"},               // 5000 ms between health checks
	{"pgautofailover.health_check_timeout", "1000"},              // 5000 ms connect timeout of a check
	{"pgautofailover.health_check_max_retries", "1"},             // 2 retries before a check fails
	{"pgautofailover.health_check_retry_delay", "500"},           // 2000 ms between retries
	{"pgautofailover.node_considered_unhealthy_timeout", "3000"}, // 20000 ms since the node's last report
	{"pgautofailover.primary_demote_timeout", "5000"},            // 30000 ms for the old primary to demote itself
	{"pgautofailover.startup_grace_period", "3000"},              // 10000 ms after the monitor starts
}

// keeperSettings go into each node's pg_autoctl.cfg. A primary that can reach neither the monitor
// nor its standby for network_partition_timeout demotes itself; it must do so before the monitor
// promotes the standby (node_considered_unhealthy_timeout + primary_demote_timeout later), or two
// primaries take writes at once.
var keeperSettings = [][2]string{
	{"timeout.network_partition_timeout", "3"}, // 20 s
}

// autoctlEnv is the environment of every pg_autoctl run: ours without libpq's and the server's
// variables, HOME and the XDG directories pg_autoctl keeps its configuration (XDG_CONFIG_HOME), state
// (XDG_DATA_HOME) and pid files (XDG_RUNTIME_DIR) in, all in the cluster's directory ("nobody" has
// no home), and the socket directory (PG_REGRESS_SOCK_DIR: pg_autoctl passes it to postgres as -k;
// Debian's default, /var/run/postgresql, is root's).
func autoctlEnv(home, sock string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "PG") || strings.HasPrefix(name, "XDG_") || name == "HOME" ||
			name == "DATABASE_URL" || name == "TEST_DATABASE_URL" || strings.HasPrefix(name, "LC_") || name == "LANG" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "HOME="+home,
		"XDG_CONFIG_HOME="+filepath.Join(home, "config"),
		"XDG_DATA_HOME="+filepath.Join(home, "share"),
		"XDG_RUNTIME_DIR="+filepath.Join(home, "run"),
		"PG_REGRESS_SOCK_DIR="+sock, "PGHOST="+sock,
		"LC_ALL=C.UTF-8") // initdb's encoding: UTF8
}

// writeBinDir fills dir with links to PostgreSQL's programs, except pg_basebackup, which becomes a
// wrapper adding --checkpoint=fast: pg_autoctl builds a standby with pg_basebackup from the
// directory of its pg_ctl and asks for no fast checkpoint, so a busy primary's spread checkpoint
// would hold the copy for up to checkpoint_timeout × checkpoint_completion_target (4.5 min).
func writeBinDir(dir, pgBin string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(pgBin)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() == "pg_basebackup" {
			continue
		}
		if err := os.Symlink(filepath.Join(pgBin, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	wrapper := "#!/bin/sh\n# pgha: a fast checkpoint for pg_autoctl's base backups\nexec " +
		shellQuote(filepath.Join(pgBin, "pg_basebackup")) + " --checkpoint=fast \"$@\"\n"
	return os.WriteFile(filepath.Join(dir, "pg_basebackup"), []byte(wrapper), 0o755)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (c *Cluster) newNode(name string) (*Node, error) {
	port, err := pgtest.ReservePort()
	if err != nil {
		return nil, err
	}
	return &Node{Name: name, Port: port.Number, c: c, port: port,
		pgdata: filepath.Join(c.dir, name), logPath: filepath.Join(c.dir, name+".log")}, nil
}

// autoctl runs one pg_autoctl command to completion (create, config set), its output appended to
// the node's log.
func (c *Cluster) autoctl(ctx context.Context, n *Node, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	logf, err := n.openLog()
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, c.autoctlBin, args...)
	cmd.Dir, cmd.Env, cmd.SysProcAttr = c.dir, c.env, c.attr()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pg_autoctl %s: %w; log %s:\n%s", strings.Join(args[:2], " "), err, n.logPath, n.logTail())
	}
	return nil
}

// run starts `pg_autoctl run` for n in the background: the node's supervisor, which starts and
// watches its postgres and follows the monitor's orders.
func (c *Cluster) run(n *Node) error {
	logf, err := n.openLog()
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(c.autoctlBin, "run", "--pgdata", n.pgdata)
	cmd.Dir, cmd.Env, cmd.SysProcAttr = c.dir, c.env, c.attr()
	cmd.Stdout, cmd.Stderr = logf, logf
	p, err := pgtest.Spawn(cmd)
	if err != nil {
		return fmt.Errorf("start pg_autoctl run for %s: %w", n.Name, err)
	}
	n.mu.Lock()
	n.proc = p
	n.mu.Unlock()
	return nil
}

func (c *Cluster) startMonitor(ctx context.Context) error {
	m := c.monitor
	if err := c.autoctl(ctx, m, "create", "monitor", "--pgdata", m.pgdata, "--pgport", strconv.Itoa(m.Port),
		"--listen", "127.0.0.1", "--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl",
		"--pgctl", filepath.Join(c.binDir, "pg_ctl")); err != nil {
		return err
	}
	if err := c.run(m); err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(c.MonitorURL() + "&connect_timeout=3")
	if err != nil {
		return err
	}
	cfg.MaxConns = 2
	c.mon, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	if err := c.poll(ctx, "the monitor", func(ctx context.Context) (bool, error) {
		_, err := c.mon.Exec(ctx, "SELECT FROM pgautofailover.node LIMIT 0")
		return err == nil, nil
	}); err != nil {
		return err
	}
	if c.opts.DefaultTimeouts {
		return nil
	}
	for _, s := range monitorSettings {
		if _, err := c.mon.Exec(ctx, fmt.Sprintf("ALTER SYSTEM SET %s = '%s'", s[0], s[1])); err != nil {
			return fmt.Errorf("monitor: set %s: %w", s[0], err)
		}
	}
	_, err = c.mon.Exec(ctx, "SELECT pg_reload_conf()")
	return err
}

// createNode registers n with the monitor (the first as the primary, the second as its standby,
// built by a base backup of the first), lowers its keeper's timeouts, and runs it.
func (c *Cluster) createNode(ctx context.Context, n *Node) error {
	quorum := strconv.FormatBool(!c.opts.Async)
	monitorURL := fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", c.monitor.Port)
	if err := c.autoctl(ctx, n, "create", "postgres", "--pgdata", n.pgdata, "--pgport", strconv.Itoa(n.Port),
		"--listen", "127.0.0.1", "--hostname", "127.0.0.1", "--name", n.Name, "--monitor", monitorURL,
		"--auth", "trust", "--no-ssl", "--dbname", Database, "--pgctl", filepath.Join(c.binDir, "pg_ctl"),
		"--replication-quorum", quorum); err != nil {
		return err
	}
	for _, s := range keeperSettings {
		if c.opts.DefaultTimeouts {
			break
		}
		if err := c.autoctl(ctx, n, "config", "set", "--pgdata", n.pgdata, s[0], s[1]); err != nil {
			return err
		}
	}
	return c.run(n)
}

// createAppUser creates the superuser the URLs name on the first primary (the standby copies it).
func (c *Cluster) createAppUser(ctx context.Context, n *Node) error {
	if c.osUser == appUser {
		return nil
	}
	u := fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=3", c.osUser, n.Port, Database)
	return c.poll(ctx, "the first node to take the user "+appUser, func(ctx context.Context) (bool, error) {
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			return false, nil
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, "CREATE ROLE "+appUser+" LOGIN SUPERUSER")
		return err == nil, nil
	})
}

func (n *Node) openLog() (*os.File, error) {
	return os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
}

func (n *Node) logTail() string {
	b, err := os.ReadFile(n.logPath)
	if err != nil {
		return ""
	}
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// kill freezes every process of the node (pg_autoctl's supervisor and services, the postmaster,
// its backends: the descendants of the supervisor, whatever their session), then SIGKILLs them and
// waits until they are gone. It returns how many there were.
func (n *Node) kill(ctx context.Context) (int, error) {
	n.mu.Lock()
	p := n.proc
	n.proc = nil
	n.mu.Unlock()
	if p == nil {
		return 0, fmt.Errorf("%s is not running", n.Name)
	}
	frozen := map[int]bool{}
	// A process forked before its parent froze appears in the next walk: walk until none is new.
	for range 10 {
		fresh := 0
		for _, pid := range append([]int{p.Pid()}, descendants(p.Pid())...) {
			if !frozen[pid] {
				_ = syscall.Kill(pid, syscall.SIGSTOP)
				frozen[pid] = true
				fresh++
			}
		}
		if fresh == 0 {
			break
		}
	}
	for pid := range frozen {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	// The others were its descendants; init reaps them once they are orphans.
	deadline := time.Now().Add(30 * time.Second)
	for pid := range frozen {
		for alive(pid) {
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("%s: process %d still alive after SIGKILL", n.Name, pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return len(frozen), nil
}

// stop shuts the node down as pg_autoctl does on SIGINT (postgres with a fast shutdown), and kills
// what is left after 30 s.
func (n *Node) stop() error {
	n.mu.Lock()
	p := n.proc
	n.proc = nil
	n.mu.Unlock()
	if p == nil {
		return nil
	}
	_ = syscall.Kill(p.Pid(), syscall.SIGINT)
	select {
	case <-p.Done():
		return nil
	case <-time.After(30 * time.Second):
	}
	for _, pid := range append([]int{p.Pid()}, descendants(p.Pid())...) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	<-p.Done()
	return errors.New("pgha: " + n.Name + " did not stop within 30 s of SIGINT (killed)")
}

// sweepStale removes the directories of clusters whose owning process died without cleaning up
// and of which no process is left (the parent-death signal stops pg_autoctl).
func sweepStale(base string) {
	dirs, _ := filepath.Glob(filepath.Join(base, tempPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			if fi, err := os.Stat(d); err != nil || time.Since(fi.ModTime()) < time.Minute {
				continue // possibly being created right now
			}
		} else if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); alive(pid) {
			continue
		}
		if len(processesNaming(d)) > 0 {
			continue
		}
		_ = os.RemoveAll(d)
	}
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return (err == nil || errors.Is(err, syscall.EPERM)) && !zombie(pid)
}

// killProcessesNaming SIGKILLs every process whose command line names dir, and says how many.
func killProcessesNaming(dir string) int {
	pids := processesNaming(dir)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return len(pids)
}
