package pgtest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/redact"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

func currentDB(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var name string
	if err := pool.QueryRow(context.Background(), "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

// Two databases obtained in parallel tests are distinct and see nothing of each other.
func TestParallelDatabasesAreIsolated(t *testing.T) {
	var mu sync.Mutex
	names := map[string]string{}
	t.Cleanup(func() {
		if len(names) == 2 && names["a"] == names["b"] {
			t.Errorf("both parallel tests got database %s", names["a"])
		}
	})
	for _, marker := range []string{"a", "b"} {
		t.Run(marker, func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			ctx := context.Background()
			pool := NewDB(t)
			mu.Lock()
			names[marker] = currentDB(t, pool)
			mu.Unlock()
			// Would fail with "already exists" in a shared database, whatever the timing.
			_, err := pool.Exec(ctx, "CREATE TABLE isolation_probe (marker text)")
			is.NoErr(err)
			_, err = pool.Exec(ctx, "INSERT INTO isolation_probe VALUES ($1)", marker)
			is.NoErr(err)
			time.Sleep(50 * time.Millisecond) // let the other one write too
			var n int
			var seen string
			is.NoErr(pool.QueryRow(ctx, "SELECT count(*), min(marker) FROM isolation_probe").Scan(&n, &seen))
			is.Equal(n, 1)
			is.Equal(seen, marker)
		})
	}
}

func TestDatabasesDoNotShareData(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	a, b := NewDB(t), NewDB(t)
	is.True(currentDB(t, a) != currentDB(t, b))
	_, err := a.Exec(ctx, "CREATE TABLE only_in_a (x int)")
	is.NoErr(err)
	var found *string
	is.NoErr(b.QueryRow(ctx, "SELECT to_regclass('only_in_a')::text").Scan(&found))
	is.True(found == nil) // table created in a is visible in b
}

func TestSchemaIsMigrated(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	pool := NewDB(t)

	dir, err := MigrationsDir()
	is.NoErr(err)
	files, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	is.NoErr(err)
	if len(files) == 0 {
		t.Fatalf("no migrations in %s", dir)
	}
	var applied int
	is.NoErr(pool.QueryRow(ctx, "SELECT count(*) FROM schema_migrations").Scan(&applied))
	is.Equal(applied, len(files)) // every migration file is applied

	for _, table := range []string{"channel_pref", "notification", "delivery_task", "delivery_attempt"} {
		var found *string
		is.NoErr(pool.QueryRow(ctx, "SELECT to_regclass($1)::text", "public."+table).Scan(&found))
		if found == nil {
			t.Errorf("table %s missing after migration", table)
		}
	}
}

func TestNewDBURLIsDroppedAtCleanup(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	var dbURL string
	t.Run("use", func(t *testing.T) {
		is := is.New(t)
		dbURL = NewDBURL(t)
		conn, err := pgx.Connect(ctx, dbURL)
		is.NoErr(err)
		// Left open on purpose: the drop must terminate it.
		_ = conn
	})
	u, err := parsePostgresURL(dbURL)
	is.NoErr(err)
	name := strings.TrimPrefix(u.Path, "/")
	is.True(strings.HasPrefix(name, "notifier_test_"))

	other := NewDB(t)
	var n int
	is.NoErr(other.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n))
	is.Equal(n, 0) // database still exists after its test ended
}

func TestRedaction(t *testing.T) {
	is := is.New(t)
	const secret = "s3cr#t-pw"
	for _, raw := range []string{
		"postgres://app:s3cr%23t-pw@db.example:5432/notifier?sslmode=require",
		"postgres://app@db.example/notifier?password=s3cr%23t-pw",
		"host=db.example user=app password=s3cr#t-pw dbname=notifier",
		"host=db.example user=app password='s3cr#t-pw' dbname=notifier",
	} {
		got := redact.URL(raw)
		is.True(!strings.Contains(got, secret) && !strings.Contains(got, "s3cr%23t-pw")) // password leaked
		is.True(strings.Contains(got, "xxxxx"))
		is.True(strings.Contains(got, "db.example")) // redaction keeps the rest
	}
	is.Equal(redact.URL("postgres://app@h/db"), "postgres://app@h/db")

	out := redact.Scrub(`Error: pq: password authentication failed, url postgres://app:s3cr%23t-pw@h/db, raw s3cr#t-pw`,
		"postgres://app:s3cr%23t-pw@h/db")
	is.True(!strings.Contains(out, "s3cr")) // free text keeps a password
}

// Errors of a failing migration (unreachable server) do not reveal the password.
func TestMigrateErrorHidesPassword(t *testing.T) {
	is := is.New(t)
	if _, err := Dbmate(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := Migrate(ctx, "postgres://app:topsecret123@127.0.0.1:1/nowhere?connect_timeout=2")
	is.True(err != nil)
	is.True(!strings.Contains(err.Error(), "topsecret123")) // password in error
	is.True(strings.Contains(err.Error(), "127.0.0.1:1"))
}

func TestFindBinDirHonoursPGBIN(t *testing.T) {
	is := is.New(t)
	t.Setenv("PG_BIN", t.TempDir())
	_, _, err := FindBinDir()
	is.True(err != nil)
	is.True(strings.Contains(err.Error(), "PG_BIN="))
}

// TestServerHonoursPGTESTLocale: a cluster started with PGTEST_LOCALE set is initialised with that locale
// (the default would be C.UTF-8), so the suite and the benches can run under a language's collation.
func TestServerHonoursPGTESTLocale(t *testing.T) {
	if os.Getenv("PGTEST_SKIP") == "1" {
		t.Skip("PGTEST_SKIP=1: this test starts a server")
	}
	if dir, _, err := FindBinDir(); err != nil || dir == "" {
		t.Skip("no local PostgreSQL server binaries")
	}
	is := is.New(t)
	ctx := context.Background()
	t.Setenv("PGTEST_LOCALE", "C")
	srv, err := StartServer(ctx)
	is.NoErr(err)
	t.Cleanup(func() { _ = srv.Close() })
	conn, err := pgx.Connect(ctx, srv.URL())
	is.NoErr(err)
	defer conn.Close(ctx)
	var collate string
	is.NoErr(conn.QueryRow(ctx, "SELECT datcollate FROM pg_database WHERE datname = current_database()").Scan(&collate))
	is.Equal(collate, "C") // the locale PGTEST_LOCALE named, not C.UTF-8
}
