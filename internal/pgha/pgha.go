// Package pgha runs a throwaway highly available PostgreSQL for tests and the failover soak:
// pg_auto_failover (Debian's postgresql-15-auto-failover and pg-auto-failover-cli, installed by
// `sh internal/tools/install-debs`), a monitor and two nodes on 127.0.0.1, with its timeouts lowered
// so that a failover takes seconds rather than the default ~50 s (docs/operations.md#failover-timing).
//
//	c, err := pgha.Start(ctx, pgha.Options{})   // synchronous replication; Async: true for none
//	defer c.Close()
//	c.URL()                  // postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/notifier?...&target_session_attrs=read-write
//	c.PrimaryURL(ctx)        // the current primary alone (dbmate reads one host)
//	old, _ := c.KillPrimary(ctx)   // SIGKILL pg_autoctl, the postmaster and every backend of the primary node
//	c.WaitPrimary(ctx, old)        // until the other node takes writes
//	c.Rejoin(ctx, old)             // restart the killed node; it comes back as the standby
//
// Like internal/pgtest, it runs the server programs as the unprivileged user "nobody" when run as
// root (PGTEST_USER overrides), with HOME and the XDG directories pg_autoctl keeps its configuration
// and state in under the cluster's temporary directory, listens on ports below the ephemeral range
// (pgtest.ReservePort), and gives each pg_autoctl a parent-death signal so that nothing outlives the
// process that started it. Linux only (it reads /proc to find a node's processes).
package pgha

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifierhq/notifier/internal/pgtest"
)

// Packages are the Debian packages that provide pg_auto_failover for PostgreSQL 15.
var Packages = []string{"postgresql-15-auto-failover", "pg-auto-failover-cli"}

// ErrNotInstalled is returned by Start when pg_autoctl is not installed.
var ErrNotInstalled = errors.New("pg_autoctl not found: install pg_auto_failover with `sh internal/tools/install-debs " +
	"postgresql-15-auto-failover pg-auto-failover-cli` (as root)")

// Database is the database the nodes serve (pg_autoctl create postgres --dbname).
const Database = "notifier"

// appUser is the superuser the URLs name (created on the first primary, replicated).
const appUser = "postgres"

// tempPrefix names the clusters' temporary directories (see sweepStale).
const tempPrefix = "notifier-pgha-"

// Options choose the replication mode.
type Options struct {
	// Async makes replication asynchronous (replication-quorum false on both nodes): a commit does
	// not wait for the standby, and a failover may lose the last acknowledged commits. The default is
	// pg_auto_failover's: the primary waits for its standby while it is healthy.
	Async bool
	// DefaultTimeouts keeps pg_auto_failover's own failover timeouts (a failover then takes ~50 s)
	// instead of the lowered ones (monitorSettings, keeperSettings).
	DefaultTimeouts bool
	// Logf receives one line per step (start, kill, promotion, rejoin); nil: silent.
	Logf func(format string, args ...any)
}

// Cluster is a running pg_auto_failover formation: a monitor and two nodes. Close it.
type Cluster struct {
	opts       Options
	dir        string // temporary root: bin/, home/, sock/, monitor/, node1/, node2/, *.log
	binDir     string // PostgreSQL's programs, pg_basebackup wrapped (see writeBinDir)
	autoctlBin string // the pg_autoctl binary
	attr       func() *syscall.SysProcAttr
	osUser     string // the user the programs run as: the clusters' initial superuser
	env        []string

	monitor *Node
	nodes   []*Node
	mon     *pgxpool.Pool // on the monitor's pg_auto_failover database

	mu     sync.Mutex
	closed bool
}

// Node is one pg_autoctl-managed PostgreSQL instance (a data node or the monitor).
type Node struct {
	Name string // node1, node2 (the monitor: monitor)
	Port int    // its PostgreSQL port on 127.0.0.1

	c       *Cluster
	pgdata  string
	logPath string
	port    *pgtest.Port

	mu   sync.Mutex
	proc *pgtest.Process // the running `pg_autoctl run`; nil when killed or stopped
}

// URL is the node's own connection URL (one host) to the notifier database.
func (n *Node) URL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", appUser, n.Port, Database)
}

// Start creates and starts a monitor and two nodes, node1 the primary and node2 its standby, and
// returns once both report their state to the monitor as primary and secondary (with synchronous
// replication: once the primary waits for the standby).
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	autoctl, err := exec.LookPath("pg_autoctl")
	if err != nil {
		return nil, ErrNotInstalled
	}
	pgBin, looked, err := pgtest.FindBinDir()
	if err != nil {
		return nil, err
	}
	if pgBin == "" {
		return nil, fmt.Errorf("no PostgreSQL server binaries found (looked in %s)", strings.Join(looked, ", "))
	}
	attr, owner, err := pgtest.ServerUser()
	if err != nil {
		return nil, err
	}
	base, err := pgtest.TempBase(owner != nil)
	if err != nil {
		return nil, err
	}
	sweepStale(base)
	dir, err := os.MkdirTemp(base, tempPrefix)
	if err != nil {
		return nil, fmt.Errorf("create temporary directory: %w", err)
	}
	c := &Cluster{opts: opts, dir: dir, autoctlBin: autoctl, attr: attr, binDir: filepath.Join(dir, "bin")}
	defer func() {
		if err != nil {
			_ = c.Close()
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return nil, err
	}
	if c.osUser, err = osUserName(owner); err != nil {
		return nil, err
	}
	if err := writeBinDir(c.binDir, pgBin); err != nil {
		return nil, err
	}
	home := filepath.Join(dir, "home")
	for _, d := range []string{home, filepath.Join(home, "run"), filepath.Join(dir, "sock")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if owner != nil {
		if err := chownTree(dir, int(owner.Uid), int(owner.Gid)); err != nil {
			return nil, err
		}
	}
	c.env = autoctlEnv(home, filepath.Join(dir, "sock"))

	c.monitor, err = c.newNode("monitor")
	if err != nil {
		return nil, err
	}
	for _, name := range []string{"node1", "node2"} {
		n, err := c.newNode(name)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}

	if err := c.startMonitor(ctx); err != nil {
		return nil, err
	}
	for i, n := range c.nodes {
		if err := c.createNode(ctx, n); err != nil {
			return nil, err
		}
		if i == 0 {
			if err := c.waitState(ctx, "the first node to run alone", func(s []NodeState) bool {
				return len(s) == 1 && s[0].Reported == "single" && s[0].Goal == "single"
			}); err != nil {
				return nil, err
			}
			if err := c.createAppUser(ctx, n); err != nil {
				return nil, err
			}
		}
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return nil, err
	}
	c.logf("pgha: monitor on %d, %s primary on %d, %s standby on %d (%s replication)", c.monitor.Port,
		c.nodes[0].Name, c.nodes[0].Port, c.nodes[1].Name, c.nodes[1].Port, c.mode())
	return c, nil
}

func (c *Cluster) mode() string {
	if c.opts.Async {
		return "asynchronous"
	}
	return "synchronous"
}

func (c *Cluster) logf(format string, args ...any) {
	if c.opts.Logf != nil {
		c.opts.Logf(format, args...)
	}
}

// URL is the multi-host URL of the notifier database as a client of the cluster uses it: both nodes,
// target_session_attrs=read-write, so that a connection lands on whichever is the primary.
func (c *Cluster) URL() string {
	hosts := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", n.Port)
	}
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&target_session_attrs=read-write", appUser, strings.Join(hosts, ","), Database)
}

// MonitorURL is the monitor's pg_auto_failover database, as its superuser (pg_autoctl show state
// reads the same tables).
func (c *Cluster) MonitorURL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/pg_auto_failover?sslmode=disable", c.osUser, c.monitor.Port)
}

// Nodes are the two data nodes.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Dir is the cluster's temporary directory (logs: monitor.log, node1.log, node2.log).
func (c *Cluster) Dir() string { return c.dir }

// Primary is the node that takes writes now: the one a read-write connection through URL lands on.
func (c *Cluster) Primary(ctx context.Context) (*Node, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL()+"&connect_timeout=3")
	if err != nil {
		return nil, fmt.Errorf("connect to the primary: %w", err)
	}
	defer conn.Close(context.Background())
	var port int
	if err := conn.QueryRow(ctx, "SELECT inet_server_port()").Scan(&port); err != nil {
		return nil, err
	}
	for _, n := range c.nodes {
		if n.Port == port {
			return n, nil
		}
	}
	return nil, fmt.Errorf("the primary answered on port %d, which is no node's", port)
}

// PrimaryURL is the single-host URL of the current primary (for dbmate, which reads one host).
func (c *Cluster) PrimaryURL(ctx context.Context) (string, error) {
	n, err := c.Primary(ctx)
	if err != nil {
		return "", err
	}
	return n.URL(), nil
}

// NodeState is one node as the monitor sees it.
type NodeState struct {
	Name, Reported, Goal string
	Port                 int
}

// State reads the nodes' states from the monitor, in node order.
func (c *Cluster) State(ctx context.Context) ([]NodeState, error) {
	rows, err := c.mon.Query(ctx, `SELECT nodename, nodeport, reportedstate::text, goalstate::text
		FROM pgautofailover.node ORDER BY nodeid`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (NodeState, error) {
		var s NodeState
		err := r.Scan(&s.Name, &s.Port, &s.Reported, &s.Goal)
		return s, err
	})
}

// WaitHealthy waits until one node is primary and the other its secondary, both having reached the
// state the monitor assigned, and the standby streams (with synchronous replication: the primary
// waits for it). A soak kills the primary only then: a kill while the standby is still catching up
// is a double failure, which no replication mode survives.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	var primary *Node
	err := c.waitState(ctx, "a primary and a secondary", func(s []NodeState) bool {
		var p, sec int
		primary = nil
		for _, n := range s {
			switch {
			case n.Reported == "primary" && n.Goal == "primary":
				p++
				primary = c.byName(n.Name)
			case n.Reported == "secondary" && n.Goal == "secondary":
				sec++
			}
		}
		return p == 1 && sec == len(c.nodes)-1 && primary != nil
	})
	if err != nil {
		return err
	}
	return c.poll(ctx, "the standby to stream", func(ctx context.Context) (bool, error) {
		conn, err := pgx.Connect(ctx, primary.URL()+"&connect_timeout=3")
		if err != nil {
			return false, nil
		}
		defer conn.Close(context.Background())
		var streaming, waits bool
		err = conn.QueryRow(ctx, `SELECT
			EXISTS (SELECT FROM pg_stat_replication WHERE state = 'streaming'
				AND (current_setting('synchronous_standby_names') = '' OR sync_state IN ('sync', 'quorum'))),
			current_setting('synchronous_standby_names') <> ''`).Scan(&streaming, &waits)
		if err != nil {
			return false, nil
		}
		return streaming && waits == !c.opts.Async, nil
	})
}

func (c *Cluster) byName(name string) *Node {
	for _, n := range c.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// KillPrimary kills the current primary node outright, as a crash would: pg_autoctl, the
// postmaster and every backend (walsender included) are frozen with SIGSTOP, so that none reacts to
// another's death, then SIGKILLed. It returns once all of them are gone.
func (c *Cluster) KillPrimary(ctx context.Context) (*Node, error) {
	n, err := c.Primary(ctx)
	if err != nil {
		return nil, err
	}
	killed, err := n.kill(ctx)
	if err != nil {
		return nil, err
	}
	c.logf("pgha: %s (primary, port %d) killed: %d processes", n.Name, n.Port, killed)
	return n, nil
}

// WaitPrimary waits until a node other than old is primary in the monitor's eyes and takes writes.
func (c *Cluster) WaitPrimary(ctx context.Context, old *Node) (*Node, error) {
	var found *Node
	err := c.poll(ctx, "a new primary", func(ctx context.Context) (bool, error) {
		states, err := c.State(ctx)
		if err != nil {
			return false, nil
		}
		for _, s := range states {
			if s.Name == old.Name || (s.Reported != "primary" && s.Reported != "wait_primary") {
				continue
			}
			n := c.byName(s.Name)
			if writable(ctx, n) {
				found = n
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	c.logf("pgha: %s is the primary", found.Name)
	return found, nil
}

// commitWait bounds writable's commit: a node that is not in recovery but whose commits wait for a
// synchronous standby that is not connected (pg_auto_failover's stop_replication) does not take writes.
const commitWait = 2 * time.Second

// writable tells whether n takes writes now: a transaction that writes (takes a transaction id)
// commits within commitWait. Not being in recovery is not enough: a promoted node whose commits wait
// for a standby answers every create only after that standby is back.
func writable(ctx context.Context, n *Node) bool {
	ctx, cancel := context.WithTimeout(ctx, commitWait)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.URL()+"&connect_timeout=2")
	if err != nil {
		return false
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var ok bool
	if err := tx.QueryRow(ctx, `SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off' AND txid_current() > 0`).Scan(&ok); err != nil || !ok {
		return false
	}
	return tx.Commit(ctx) == nil
}

// Rejoin starts a killed node's pg_autoctl again and waits until the cluster is healthy, the node
// back as the standby (pg_autoctl rewinds it, or takes a new base backup, from the new primary).
func (c *Cluster) Rejoin(ctx context.Context, n *Node) error {
	if err := c.run(n); err != nil {
		return err
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return fmt.Errorf("%s rejoining: %w", n.Name, err)
	}
	c.logf("pgha: %s rejoined as the standby", n.Name)
	return nil
}

// StallWalsender freezes (SIGSTOP) the primary's walsender, so that the standby stops receiving WAL
// while the primary goes on committing: with asynchronous replication, commits acknowledged from
// now on exist only on the primary. resume thaws it (when it still exists).
func (c *Cluster) StallWalsender(ctx context.Context) (resume func(), err error) {
	p, err := c.Primary(ctx)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, p.URL()+"&connect_timeout=3")
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_replication`)
	if err != nil {
		return nil, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, err
	}
	if len(pids) == 0 {
		return nil, errors.New("the primary has no walsender")
	}
	for _, pid := range pids {
		if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
			return nil, fmt.Errorf("stop walsender %d: %w", pid, err)
		}
	}
	c.logf("pgha: walsender of %s stopped (pid %v)", p.Name, pids)
	return func() {
		for _, pid := range pids {
			_ = syscall.Kill(int(pid), syscall.SIGCONT)
		}
	}, nil
}

// Close stops the nodes and the monitor (fast shutdown, then SIGKILL of whatever is left), kills any
// process still naming the cluster's directory, and removes it. Idempotent.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.mon != nil {
		c.mon.Close()
	}
	var errs []error
	for _, n := range append(append([]*Node(nil), c.nodes...), c.monitor) {
		if n == nil {
			continue
		}
		errs = append(errs, n.stop())
		n.port.Release()
	}
	if left := killProcessesNaming(c.dir); left > 0 {
		errs = append(errs, fmt.Errorf("pgha: %d processes of %s were still running after the stop (killed)", left, c.dir))
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// poll calls ok every 200 ms until it says true, returns an error, or ctx ends (or 2 minutes pass).
func (c *Cluster) poll(ctx context.Context, what string, ok func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
		done, err := ok(qctx)
		qcancel()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			states, _ := c.State(context.Background())
			return fmt.Errorf("pgha: waiting for %s: %w (monitor: %v); logs in %s", what, ctx.Err(), states, c.dir)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitState polls the monitor until ok holds for the nodes' states.
func (c *Cluster) waitState(ctx context.Context, what string, ok func([]NodeState) bool) error {
	return c.poll(ctx, what, func(ctx context.Context) (bool, error) {
		s, err := c.State(ctx)
		return err == nil && ok(s), nil
	})
}

func osUserName(owner *syscall.Credential) (string, error) {
	if owner == nil {
		u, err := user.Current()
		if err != nil {
			return "", err
		}
		return u.Username, nil
	}
	u, err := user.LookupId(strconv.Itoa(int(owner.Uid)))
	if err != nil {
		return "", err
	}
	return u.Username, nil
}

func chownTree(dir string, uid, gid int) error {
	return filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}
