package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// readyTimeout bounds how long a freshly started postgres may take to accept connections.
const readyTimeout = 30 * time.Second

// tempPrefix names the temporary directories of throwaway clusters (see sweepStale).
const tempPrefix = "notifier-pgtest-"

// Server is a throwaway PostgreSQL cluster in a temporary directory, listening
// on 127.0.0.1 with trust authentication for the superuser "postgres".
//
// Create one with StartServer and always Close it. Stop/Start/Restart exist
// for tests that need the database to go away and come back.
type Server struct {
	binDir  string
	dir     string // temporary root: socket, log, owner.pid
	dataDir string // dir/data
	logPath string
	port    int
	portRes *Port                       // the reservation of port, released by Close
	attr    func() *syscall.SysProcAttr // how to run server processes (credentials when root)
	version string

	mu     sync.Mutex
	proc   *process // nil when not running
	closed bool
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has been waited for
	err  error         // Wait's result, valid after done is closed
}

// Process is a server process started by Spawn.
type Process struct{ p *process }

// Spawn starts cmd so that a parent-death signal set in its SysProcAttr (ServerUser's) fires only
// when this process dies, not when the goroutine's thread happens to exit, and waits for it in the
// background.
func Spawn(cmd *exec.Cmd) (*Process, error) {
	p, err := spawn(cmd)
	if err != nil {
		return nil, err
	}
	return &Process{p}, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.p.cmd.Process.Pid }

// Done is closed once the process has exited and been waited for.
func (p *Process) Done() <-chan struct{} { return p.p.done }

// Err is the process's exit (Wait's error), valid once Done is closed.
func (p *Process) Err() error { return p.p.err }

// ServerUser says how to run PostgreSQL's programs (postgres, initdb, pg_autoctl), which refuse
// root: as root, as the unprivileged user "nobody" (or $PGTEST_USER, or "postgres"), with owner its
// credentials; otherwise as ourselves, owner nil. attr gives each process its own process group and
// SIGQUIT (immediate shutdown) should this process die first.
func ServerUser() (attr func() *syscall.SysProcAttr, owner *syscall.Credential, err error) {
	return serverCredentials()
}

// TempBase returns a directory for throwaway clusters' directories; with otherUser (ServerUser's
// owner is not nil), one whose every ancestor that user can traverse.
func TempBase(otherUser bool) (string, error) { return tempBase(otherUser) }

// StartServer creates and starts a throwaway cluster with the server binaries
// found by FindBinDir. It returns once the server accepts connections.
// As root, the server runs as the unprivileged user "nobody" (or $PGTEST_USER,
// or "postgres"); the postgres processes receive SIGQUIT if the calling
// process dies, so they never outlive it.
func StartServer(ctx context.Context) (*Server, error) { return startFound(ctx, false) }

// StartTestServer is StartServer for a cluster that tests use, as the harness's own: on a tmpfs
// when there is one with room (see startServer), else where StartServer puts it.
func StartTestServer(ctx context.Context) (*Server, error) { return startFound(ctx, true) }

func startFound(ctx context.Context, inMemory bool) (*Server, error) {
	binDir, looked, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	if binDir == "" {
		return nil, fmt.Errorf("no PostgreSQL server binaries found (looked in %s); install postgresql (Debian: apt-get install postgresql) or set PG_BIN", strings.Join(looked, ", "))
	}
	return startServer(ctx, binDir, inMemory)
}

// minMemoryFree is the room a tmpfs must have to hold the tests' cluster: the largest test seeds a
// million tasks (a few hundred MB), and a full tmpfs would fail tests with "No space left on device".
const minMemoryFree = 2 << 30

// startServer starts a throwaway cluster. inMemory puts it on a tmpfs when there is one (memoryBase):
// the tests create and drop a database each, hundreds of files every time, and on ext4 the inode
// allocator's search for a free inode (recently_deleted) was half of postgres's kernel time
// (docs/testing.md#how-the-tests-run). A benchmark's cluster stays on disk, where production's is.
func startServer(ctx context.Context, binDir string, inMemory bool) (*Server, error) {
	attr, owner, err := serverCredentials()
	if err != nil {
		return nil, err
	}
	base, err := tempBase(owner != nil)
	if err != nil {
		return nil, err
	}
	if inMemory {
		if m := memoryBase(owner != nil); m != "" {
			base = m
		}
	}
	sweepStale(base)
	dir, err := os.MkdirTemp(base, tempPrefix)
	if err != nil {
		return nil, fmt.Errorf("create temporary directory: %w", err)
	}
	s := &Server{
		binDir:  binDir,
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, "postgres.log"),
		attr:    attr,
	}
	ok := false
	defer func() {
		if !ok {
			_ = s.Close()
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return nil, err
	}
	if owner != nil {
		if err := os.Chown(dir, int(owner.Uid), int(owner.Gid)); err != nil {
			return nil, fmt.Errorf("chown %s to uid %d: %w", dir, owner.Uid, err)
		}
	}
	if out, err := exec.Command(filepath.Join(binDir, "postgres"), "--version").Output(); err == nil {
		s.version = strings.TrimSpace(string(out))
	}
	if err := s.initdb(ctx); err != nil {
		return nil, err
	}
	// The port is picked before postgres binds it; retry if something else took it meanwhile.
	for attempt := 1; ; attempt++ {
		s.portRes.Release()
		s.portRes, err = ReservePort()
		if err != nil {
			return nil, err
		}
		s.port = s.portRes.Number
		err = s.Start(ctx)
		if err == nil {
			break
		}
		if attempt == 3 || !strings.Contains(s.logTail(), "could not bind") {
			return nil, err
		}
	}
	ok = true
	return s, nil
}

// URL returns the connection URL of the "postgres" database as the superuser
// "postgres" (no password, sslmode=disable).
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Port returns the TCP port the server listens on (on 127.0.0.1).
func (s *Server) Port() int { return s.port }

// BinDir returns the directory of the PostgreSQL binaries in use (initdb, postgres, psql, ...).
func (s *Server) BinDir() string { return s.binDir }

// DataDir returns the cluster's data directory.
func (s *Server) DataDir() string { return s.dataDir }

// LogFile returns the path of the server log.
func (s *Server) LogFile() string { return s.logPath }

// Version returns the output of `postgres --version`.
func (s *Server) Version() string { return s.version }

func (s *Server) initdb(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last error
	for _, locale := range initdbLocales(os.Getenv("PGTEST_LOCALE")) {
		_ = os.RemoveAll(s.dataDir)
		cmd := exec.CommandContext(ctx, filepath.Join(s.binDir, "initdb"),
			"-D", s.dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale="+locale, "--no-sync")
		cmd.Dir = s.dir
		cmd.Env = serverEnv()
		cmd.SysProcAttr = s.attr()
		out, err := cmd.CombinedOutput()
		if err == nil {
			return nil
		}
		last = fmt.Errorf("initdb (%s) failed: %w\n%s", cmd.Path, err, tail(string(out), 2000))
	}
	return last
}

// initdbLocales is the locales initdb tries, in order: the one PGTEST_LOCALE names alone (a
// language's collation, e.g. en_US.UTF-8, the default of many installations, makes text keys dearer
// to compare: docs/benchmarks/2026-12-05-byte-order-keys.md), else C.UTF-8, which gives sensible
// character classification, then C where C.UTF-8 does not exist.
func initdbLocales(env string) []string {
	if env != "" {
		return []string{env}
	}
	return []string{"C.UTF-8", "C"}
}

// Start starts a stopped server again (same data directory and port) and
// waits until it accepts connections. It does nothing if the server is running.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startLocked(ctx)
}

func (s *Server) startLocked(ctx context.Context) error {
	if s.closed {
		return errors.New("pgtest: server already closed")
	}
	if s.proc != nil {
		select {
		case <-s.proc.done:
			s.proc = nil
		default:
			return nil
		}
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(s.binDir, "postgres"),
		"-D", s.dataDir,
		"-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories="+s.dir,
		"-c", "max_connections=200",
		"-c", "shared_buffers=128MB",
	)
	if v := os.Getenv("PGTEST_FSYNC"); v != "" { // e.g. PGTEST_FSYNC=off for speed; default on
		cmd.Args = append(cmd.Args, "-c", "fsync="+v)
	}
	cmd.Dir = s.dir
	cmd.Env = serverEnv()
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = s.attr()
	p, err := spawn(cmd)
	if err != nil {
		return fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	s.proc = p
	if err := s.waitReady(ctx, p); err != nil {
		_ = s.stopLocked(syscall.SIGQUIT, 10*time.Second)
		return err
	}
	return nil
}

// spawn starts cmd from a goroutine locked to its OS thread, which stays
// alive until the process has exited: Linux delivers the parent-death signal
// when the creating *thread* exits, not the process.
func spawn(cmd *exec.Cmd) (*process, error) {
	p := &process{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

func (s *Server) waitReady(ctx context.Context, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	connURL := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", s.port)
	var lastErr error
	for {
		select {
		case <-p.done:
			return fmt.Errorf("postgres exited during startup (%v); log %s:\n%s", p.err, s.logPath, s.logTail())
		default:
		}
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgconn.Connect(cctx, connURL)
		ccancel()
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("postgres did not accept connections on 127.0.0.1:%d within %v (last error: %v); log %s:\n%s",
				s.port, readyTimeout, lastErr, s.logPath, s.logTail())
		case <-p.done:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop shuts the server down (fast shutdown: sessions are terminated) and
// keeps its data, so that Start can bring it back. Stopping a stopped server
// does nothing.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked(syscall.SIGINT, 30*time.Second)
}

// Restart stops the server and starts it again on the same port. With
// immediate, the server is stopped with an immediate shutdown (like a crash:
// no checkpoint, crash recovery at start); otherwise with a fast shutdown.
func (s *Server) Restart(ctx context.Context, immediate bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("pgtest: server already closed")
	}
	sig := syscall.SIGINT
	if immediate {
		sig = syscall.SIGQUIT
	}
	if err := s.stopLocked(sig, 30*time.Second); err != nil {
		return err
	}
	return s.startLocked(ctx)
}

// Close stops the server (fast shutdown) and removes its directory. It is
// idempotent and safe to call concurrently.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.stopLocked(syscall.SIGINT, 30*time.Second)
	s.portRes.Release()
	if rmErr := os.RemoveAll(s.dir); rmErr != nil {
		err = errors.Join(err, rmErr)
	}
	return err
}

// stopLocked sends sig to the postmaster and waits up to timeout for it to
// exit, escalating to an immediate shutdown and then SIGKILL of its process group.
func (s *Server) stopLocked(sig syscall.Signal, timeout time.Duration) error {
	p := s.proc
	if p == nil {
		return nil
	}
	s.proc = nil
	pid := p.cmd.Process.Pid
	steps := []struct {
		sig     syscall.Signal
		pid     int
		timeout time.Duration
	}{
		{sig, pid, timeout},
		{syscall.SIGQUIT, pid, 10 * time.Second},
		{syscall.SIGKILL, -pid, 10 * time.Second}, // the whole process group (Setpgid)
	}
	for _, st := range steps {
		select {
		case <-p.done:
			return nil
		default:
		}
		_ = syscall.Kill(st.pid, st.sig)
		select {
		case <-p.done:
			return nil
		case <-time.After(st.timeout):
		}
	}
	return fmt.Errorf("postgres (pid %d) did not exit after SIGKILL", pid)
}

func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return ""
	}
	return tail(string(b), 3000)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// serverEnv is the environment of initdb/postgres: ours, minus libpq/server
// variables that could redirect them.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PGDATA=") || strings.HasPrefix(kv, "PGPORT=") || strings.HasPrefix(kv, "PGHOST=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// serverCredentials decides which user runs the server processes. PostgreSQL
// refuses to run as root, so as root they run as $PGTEST_USER, "nobody" or
// "postgres" (the first that exists); otherwise as ourselves (owner is nil).
func serverCredentials() (attr func() *syscall.SysProcAttr, owner *syscall.Credential, err error) {
	if os.Geteuid() != 0 {
		return func() *syscall.SysProcAttr { return sysProcAttr(nil) }, nil, nil
	}
	names := []string{"nobody", "postgres"}
	if u := os.Getenv("PGTEST_USER"); u != "" {
		names = []string{u}
	}
	for _, name := range names {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
		return func() *syscall.SysProcAttr { return sysProcAttr(cred) }, cred, nil
	}
	return nil, nil, fmt.Errorf("running as root and none of the users %v exists to run postgres as (PostgreSQL refuses root); create one (useradd --system pgtest) and set PGTEST_USER", names)
}

// tempBase returns the directory for the cluster's temporary directory; when
// the server runs as another user, every ancestor must be traversable by it.
func tempBase(otherUser bool) (string, error) {
	base := os.TempDir()
	if !otherUser || traversable(base) {
		return base, nil
	}
	if traversable("/tmp") {
		return "/tmp", nil
	}
	return "", fmt.Errorf("neither %s nor /tmp is accessible to the unprivileged user running postgres; set TMPDIR", base)
}

func traversable(dir string) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		fi, err := os.Stat(dir)
		if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}

// sweepStale removes directories of throwaway clusters whose owning process
// died without cleaning up (panicking test binary, SIGKILL, ...) and whose
// postmaster is gone too (the parent-death signal stops it).
func sweepStale(base string) {
	dirs, _ := filepath.Glob(filepath.Join(base, tempPrefix+"*"))
	for _, d := range dirs {
		if owner := readPid(filepath.Join(d, "owner.pid")); owner == 0 {
			fi, err := os.Stat(d)
			if err != nil || time.Since(fi.ModTime()) < time.Minute {
				continue // possibly being created right now
			}
		} else if pidAlive(owner) {
			continue
		}
		if pidAlive(readPid(filepath.Join(d, "data", "postmaster.pid"))) {
			continue
		}
		_ = os.RemoveAll(d)
	}
}

func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// FindBinDir locates a directory holding the PostgreSQL server binaries
// (initdb and postgres): $PG_BIN, else `pg_config --bindir`, else initdb in
// PATH, else the newest of /usr/lib/postgresql/*/bin, /usr/pgsql-*/bin,
// /usr/local/pgsql/bin. It returns "" and the places looked at if none is found.
func FindBinDir() (dir string, looked []string, err error) {
	if d := os.Getenv("PG_BIN"); d != "" {
		if hasServer(d) {
			return d, nil, nil
		}
		return "", nil, fmt.Errorf("PG_BIN=%s does not contain initdb and postgres", d)
	}
	looked = append(looked, "$PG_BIN (unset)")
	if pgConfig, err := exec.LookPath("pg_config"); err == nil {
		out, err := exec.Command(pgConfig, "--bindir").Output()
		d := strings.TrimSpace(string(out))
		looked = append(looked, "`pg_config --bindir` ("+d+")")
		if err == nil && hasServer(d) {
			return d, looked, nil
		}
	} else {
		looked = append(looked, "pg_config (not in PATH)")
	}
	looked = append(looked, "initdb in PATH")
	if p, err := exec.LookPath("initdb"); err == nil {
		if d := filepath.Dir(p); hasServer(d) {
			return d, looked, nil
		}
	}
	patterns := []string{"/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/usr/local/pgsql/bin"}
	looked = append(looked, patterns...)
	var found []string
	for _, pat := range patterns {
		ms, _ := filepath.Glob(pat)
		for _, m := range ms {
			if hasServer(m) {
				found = append(found, m)
			}
		}
	}
	if len(found) == 0 {
		return "", looked, nil
	}
	sort.Slice(found, func(i, j int) bool { return versionOf(found[i]) > versionOf(found[j]) })
	return found[0], looked, nil
}

// versionOf extracts the major version from paths like /usr/lib/postgresql/15/bin.
func versionOf(binDir string) float64 {
	for _, part := range strings.Split(binDir, string(filepath.Separator)) {
		part = strings.TrimPrefix(part, "pgsql-")
		if v, err := strconv.ParseFloat(part, 64); err == nil {
			return v
		}
	}
	return 0
}

func hasServer(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}
