// Package pgtest runs tests against a real PostgreSQL.
//
// A package that needs a database adds
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
// and calls NewDB (or NewDBURL) in its tests. Each call returns a fresh
// database cloned from a template migrated once per test binary with dbmate
// (the migrations in <repo>/schema, exactly as deployed), dropped when the
// test ends; tests may run in parallel.
//
// The server is $TEST_DATABASE_URL, else $DATABASE_URL (a role allowed to
// CREATE DATABASE; sslmode=disable is assumed when the URL has no sslmode),
// else a throwaway cluster started on first use from the local PostgreSQL
// server binaries ($PG_BIN, `pg_config --bindir`, /usr/lib/postgresql/*/bin)
// and removed at the end of Main. The cluster lives in /dev/shm when that is a
// tmpfs with room, else in os.TempDir(). Environment knobs: DBMATE (dbmate
// binary), PGTEST_MIGRATIONS_DIR (instead of <repo>/schema), PGTEST_USER (user
// that runs postgres when we are root; default nobody), PGTEST_FSYNC (e.g. off;
// default on), PGTEST_TMPFS=off (the cluster in os.TempDir() even when a tmpfs
// has room), PGTEST_SKIP=1 (NewDB and NewDBURL skip their test instead: `just mutants` runs a
// package's tests once per mutant, and only those that need no database).
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifierhq/notifier/service/redact"
)

var (
	mainCalled atomic.Bool

	stateMu  sync.Mutex
	state    *harness // set by the first successful setup
	stateErr error    // sticky setup error
	isShut   bool
)

type harness struct {
	server   *Server  // nil when using an external server
	base     *url.URL // maintenance database, sslmode set
	admin    *pgxpool.Pool
	template string
}

// Main runs the tests of a package with a database available and stops any
// cluster it started afterwards. The database is set up lazily, on the first
// NewDB/NewDBURL/Cluster call, so test runs that need none start none.
//
// Should the test binary die without returning from Main (a panicking test,
// a timeout, SIGKILL), the postgres processes still stop (parent-death
// signal) and the next run removes the leftover directory.
func Main(m *testing.M) (code int) {
	mainCalled.Store(true)
	defer func() {
		if err := shutdown(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
			if code == 0 {
				code = 1
			}
		}
	}()
	return m.Run()
}

// NewDB returns a pool on a fresh, isolated, fully migrated database (CREATE
// DATABASE ... TEMPLATE <migrated template>), closed and dropped at t.Cleanup.
// Safe for t.Parallel().
func NewDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dbURL := NewDBURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", redact.URL(dbURL), err)
	}
	// Registered after the drop of NewDBURL, so it runs before it.
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("pgtest: connect to %s: %v", redact.URL(dbURL), err)
	}
	return pool
}

// NewDBURL is like NewDB but returns the connection URL of the fresh database
// (for subprocess tests). The database is dropped at cleanup, terminating any
// session still connected to it.
func NewDBURL(t testing.TB) string {
	t.Helper()
	return newDBURL(t, "")
}

// newDBURL creates a database from template (the migrated template when empty), dropped at cleanup.
func newDBURL(t testing.TB, template string) string {
	t.Helper()
	h := get(t)
	if template == "" {
		template = h.template
	}
	name := "notifier_test_" + randomSuffix()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := h.createDB(ctx, name, template); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := h.dropDB(ctx, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return h.urlFor(name)
}

// NewEmptyDBURL is like NewDBURL but the database is empty (created from
// template0, no migration applied), for a test that migrates it itself
// (MigrateDir).
func NewEmptyDBURL(t testing.TB) string {
	t.Helper()
	return newDBURL(t, "template0")
}

// Cluster gives access to the throwaway cluster when the harness started one
// (nil when using an external URL), e.g. to stop or restart the database in
// chaos tests. It sets the harness up if needed and panics if that fails.
func Cluster() *Server {
	if !mainCalled.Load() {
		panic(errNoMain)
	}
	h, err := ensure()
	if err != nil {
		panic("pgtest: " + err.Error())
	}
	return h.server
}

var errNoMain = errors.New("pgtest: the package's tests must run through pgtest.Main: add `func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }`")

func get(t testing.TB) *harness {
	t.Helper()
	if os.Getenv("PGTEST_SKIP") == "1" {
		t.Skip("pgtest: PGTEST_SKIP=1: this test needs a database")
	}
	if !mainCalled.Load() {
		t.Fatal(errNoMain)
	}
	h, err := ensure()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return h
}

func ensure() (*harness, error) {
	stateMu.Lock()
	defer stateMu.Unlock()
	if state != nil || stateErr != nil {
		return state, stateErr
	}
	if isShut {
		return nil, errors.New("pgtest: used after Main returned")
	}
	state, stateErr = setup(context.Background())
	return state, stateErr
}

func shutdown() error {
	stateMu.Lock()
	defer stateMu.Unlock()
	isShut = true
	h := state
	state = nil
	if h == nil {
		return nil
	}
	return h.close()
}

func setup(ctx context.Context) (_ *harness, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	h := &harness{}
	defer func() {
		if err != nil {
			_ = h.close()
		}
	}()

	raw, src := os.Getenv("TEST_DATABASE_URL"), "TEST_DATABASE_URL"
	if raw == "" {
		raw, src = os.Getenv("DATABASE_URL"), "DATABASE_URL"
	}
	if raw == "" {
		binDir, looked, err := FindBinDir()
		if err != nil {
			return nil, fmt.Errorf("no TEST_DATABASE_URL/DATABASE_URL set and %w", err)
		}
		if binDir == "" {
			return nil, fmt.Errorf("no TEST_DATABASE_URL/DATABASE_URL set and no PostgreSQL server binaries found (looked in %s); install postgresql or set TEST_DATABASE_URL", strings.Join(looked, ", "))
		}
		if _, err := Dbmate(); err != nil { // fail fast, before initdb
			return nil, err
		}
		h.server, err = startServer(ctx, binDir, true)
		if err != nil {
			return nil, fmt.Errorf("start a throwaway PostgreSQL from %s: %w", binDir, err)
		}
		raw, src = h.server.URL(), "throwaway cluster"
	} else if _, err := Dbmate(); err != nil {
		return nil, err
	}

	withSSL, err := withDefaultSSLMode(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src, err)
	}
	h.base, _ = url.Parse(withSSL)
	cfg, err := pgxpool.ParseConfig(withSSL)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %s", src, redact.URL(withSSL), redact.Scrub(err.Error(), withSSL))
	}
	cfg.MaxConns = 4
	h.admin, err = pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = h.admin.Ping(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to %s (%s): %s", redact.URL(withSSL), src, redact.Scrub(err.Error(), withSSL))
	}

	tmpl := "notifier_tmpl_" + randomSuffix()
	if _, err := h.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{tmpl}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create template database %s on %s: %w", tmpl, redact.URL(withSSL), err)
	}
	h.template = tmpl
	if err := Migrate(ctx, h.urlFor(tmpl)); err != nil {
		return nil, err
	}
	// Nobody may connect to the template: CREATE DATABASE ... TEMPLATE fails while anyone is.
	if _, err := h.admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{tmpl}.Sanitize()+" WITH ALLOW_CONNECTIONS false"); err != nil {
		return nil, fmt.Errorf("lock template database %s: %w", tmpl, err)
	}
	return h, nil
}

func (h *harness) close() error {
	var errs []error
	if h.server == nil && h.admin != nil && h.template != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		errs = append(errs, h.dropDB(ctx, h.template))
		cancel()
	}
	if h.admin != nil {
		h.admin.Close()
	}
	if h.server != nil {
		errs = append(errs, h.server.Close())
	}
	return errors.Join(errs...)
}

func (h *harness) urlFor(db string) string {
	u := *h.base
	u.Path = "/" + db
	u.RawPath = ""
	return u.String()
}

// exec runs an admin statement. After a test restarts the cluster, the pool's idle connections are
// dead and it hands each out once before noticing: an error that is not the server's answer to the
// statement (no answer, or the shutdown's FATAL the dead connection still held: class 57) is retried.
func (h *harness) exec(ctx context.Context, sql string) error {
	for attempt := 1; ; attempt++ {
		_, err := h.admin.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		answered := errors.As(err, &pgErr) && !strings.HasPrefix(pgErr.Code, "57")
		if err == nil || answered || attempt == 10 || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (h *harness) createDB(ctx context.Context, name, template string) error {
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	for attempt := 1; ; attempt++ {
		err := h.exec(ctx, sql)
		var pgErr *pgconn.PgError
		// 55006 object_in_use: someone is connected to the template; retry briefly.
		if err != nil && errors.As(err, &pgErr) && pgErr.Code == "55006" && attempt < 20 {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		// 42P04 duplicate_database: the name is random, so a retried CREATE that had run already.
		if err != nil && errors.As(err, &pgErr) && pgErr.Code == "42P04" {
			return nil
		}
		if err != nil {
			return fmt.Errorf("create database %s from template %s: %w", name, template, err)
		}
		return nil
	}
}

func (h *harness) dropDB(ctx context.Context, name string) error {
	id := pgx.Identifier{name}.Sanitize()
	err := h.exec(ctx, "DROP DATABASE IF EXISTS "+id+" WITH (FORCE)")
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) && pgErr.Code == "42601" { // before PostgreSQL 13: no FORCE
		err = h.exec(ctx, "DROP DATABASE IF EXISTS "+id)
	}
	if err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

func randomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
