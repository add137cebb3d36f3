package pgtest

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// PgBouncer is a PgBouncer process in front of a PostgreSQL database, for tests that run the product
// through a connection pooler as deployments do. Start one with StartPgBouncer; it stops at the end of
// the test. As root it runs as the user that runs the throwaway cluster (nobody, or $PGTEST_USER).
type PgBouncer struct {
	port    int
	dir     string // the configuration and auth files
	db      string // the database name clients ask for: the served database's own
	ini     string // the configuration file's text
	version string
	log     *logBuffer
	proc    *process
}

// PgBouncerConfig is what a PgBouncer serves, and how.
type PgBouncerConfig struct {
	// Server is the URL of the database to serve (e.g. NewDBURL's): its host, port and database name.
	Server string
	// Users are the login roles clients may connect as, with their passwords (the auth_file): PgBouncer
	// logs in to the server as the same role with the same password.
	Users map[string]string
	// Settings are lines of the [pgbouncer] section, e.g. "pool_mode = transaction". The listen
	// address and port, the authentication and the log are set here.
	Settings []string
}

// FindPgBouncer returns the pgbouncer executable: pgbouncer in PATH, else Debian's /usr/sbin/pgbouncer
// (not in a user's PATH); "" when there is none (install it: sh internal/tools/install-debs pgbouncer).
func FindPgBouncer() string {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p
	}
	if fi, err := os.Stat("/usr/sbin/pgbouncer"); err == nil && fi.Mode().IsRegular() {
		return "/usr/sbin/pgbouncer"
	}
	return ""
}

// pgbouncerPorts is where a PgBouncer listens: below the ephemeral range (32768-60999 on Linux), where
// an outgoing connection could hold the port (a test node once failed to bind one that way).
const pgbouncerPortLow, pgbouncerPortHigh = 20000, 32767

// StartPgBouncer starts PgBouncer (FindPgBouncer) with cfg on 127.0.0.1 and returns once it accepts
// connections. It fails the test if there is no pgbouncer or it does not start; callers that may skip
// check FindPgBouncer first.
func StartPgBouncer(t testing.TB, cfg PgBouncerConfig) *PgBouncer {
	t.Helper()
	bin := FindPgBouncer()
	if bin == "" {
		t.Fatal("pgtest: no pgbouncer (install it: sh internal/tools/install-debs pgbouncer)")
	}
	b, err := startPgBouncer(bin, cfg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(b.stop)
	return b
}

func startPgBouncer(bin string, cfg PgBouncerConfig) (*PgBouncer, error) {
	server, err := url.Parse(cfg.Server)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: server URL: %w", err)
	}
	host, port := server.Hostname(), server.Port()
	if port == "" {
		port = "5432"
	}
	db := strings.TrimPrefix(server.Path, "/")
	if host == "" || db == "" || strings.ContainsAny(host+db, " ='") {
		return nil, fmt.Errorf("pgbouncer: server URL %s: want postgres://host:port/database", server.Redacted())
	}
	attr, owner, err := serverCredentials()
	if err != nil {
		return nil, err
	}
	base, err := tempBase(owner != nil)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(base, "notifier-pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{db: db, log: &logBuffer{}}
	if out, err := exec.Command(bin, "--version").Output(); err == nil {
		b.version, _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
	}
	b.dir = dir
	ok := false
	defer func() {
		if !ok {
			b.stop()
		}
	}()
	var users strings.Builder
	for _, name := range slices.Sorted(maps.Keys(cfg.Users)) {
		fmt.Fprintf(&users, "%s %s\n", authQuote(name), authQuote(cfg.Users[name]))
	}
	authFile := filepath.Join(dir, "userlist.txt")
	files := map[string]string{authFile: users.String()}
	for attempt := 1; ; attempt++ {
		b.port, err = freeLowPort()
		if err != nil {
			return nil, err
		}
		b.ini = fmt.Sprintf("[databases]\n%s = host=%s port=%s dbname=%s\n\n[pgbouncer]\n%s\n"+
			"listen_addr = 127.0.0.1\nlisten_port = %d\nunix_socket_dir =\nauth_type = scram-sha-256\nauth_file = %s\n",
			db, host, port, db, strings.Join(cfg.Settings, "\n"), b.port, authFile)
		iniPath := filepath.Join(dir, "pgbouncer.ini")
		files[iniPath] = b.ini
		for path, text := range files {
			if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
				return nil, err
			}
			if owner != nil {
				if err := os.Chown(path, int(owner.Uid), int(owner.Gid)); err != nil {
					return nil, err
				}
			}
		}
		if owner != nil {
			if err := os.Chown(dir, int(owner.Uid), int(owner.Gid)); err != nil {
				return nil, err
			}
		}
		cmd := exec.Command(bin, iniPath) // in the foreground, logging to stderr
		cmd.Dir = dir
		cmd.Env = serverEnv()
		cmd.Stdout, cmd.Stderr = b.log, b.log
		cmd.SysProcAttr = attr()
		b.proc, err = spawn(cmd)
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", bin, err)
		}
		err = b.waitReady()
		if err == nil {
			ok = true
			return b, nil
		}
		b.stopProcess()
		if attempt == 3 || !strings.Contains(b.log.String(), "bind") {
			return nil, err
		}
	}
}

// waitReady waits until PgBouncer accepts TCP connections, or exits.
func (b *PgBouncer) waitReady() error {
	deadline := time.Now().Add(readyTimeout)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))
	for {
		select {
		case <-b.proc.done:
			return fmt.Errorf("pgbouncer exited during startup (%v):\n%s", b.proc.err, tail(b.log.String(), 3000))
		default:
		}
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgbouncer did not accept connections on %s within %v (%v):\n%s", addr, readyTimeout, err, tail(b.log.String(), 3000))
		}
		select {
		case <-b.proc.done:
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop ends PgBouncer and removes its files.
func (b *PgBouncer) stop() {
	b.stopProcess()
	_ = os.RemoveAll(b.dir)
}

// stopProcess ends PgBouncer at once (SIGTERM: immediate shutdown), then its process group.
func (b *PgBouncer) stopProcess() {
	p := b.proc
	if p == nil {
		return
	}
	b.proc = nil
	pid := p.cmd.Process.Pid
	for _, st := range []struct {
		sig syscall.Signal
		pid int
	}{{syscall.SIGTERM, pid}, {syscall.SIGKILL, -pid}} {
		_ = syscall.Kill(st.pid, st.sig)
		select {
		case <-p.done:
			return
		case <-time.After(10 * time.Second):
		}
	}
}

// URL is the connection URL of the served database through PgBouncer as user (sslmode=disable), with
// the query parameters params ("default_query_exec_mode=exec", ...).
func (b *PgBouncer) URL(user, password string, params ...string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(user, password), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)),
		Path: "/" + b.db, RawQuery: strings.Join(append([]string{"sslmode=disable"}, params...), "&")}
	return u.String()
}

// Port is the TCP port PgBouncer listens on (on 127.0.0.1).
func (b *PgBouncer) Port() int { return b.port }

// Config is the configuration file PgBouncer runs with.
func (b *PgBouncer) Config() string { return b.ini }

// Version is the first line of `pgbouncer --version` ("PgBouncer 1.18.0").
func (b *PgBouncer) Version() string { return b.version }

// Log is what PgBouncer has logged so far.
func (b *PgBouncer) Log() string { return b.log.String() }

// freeLowPort picks a port that is free now between pgbouncerPortLow and pgbouncerPortHigh.
func freeLowPort() (int, error) {
	var last error
	for range 50 {
		port := pgbouncerPortLow + rand.IntN(pgbouncerPortHigh-pgbouncerPortLow+1)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			_ = l.Close()
			return port, nil
		}
		last = err
	}
	return 0, fmt.Errorf("find a free TCP port below %d: %w", pgbouncerPortHigh+1, last)
}

// authQuote quotes a name or password for PgBouncer's auth_file: in double quotes, a double quote doubled.
func authQuote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// logBuffer collects a process's output while tests read it.
type logBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
