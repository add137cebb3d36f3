package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/notifierhq/notifier/service/redact"
)

// RepoRoot returns the directory of the module's go.mod, searched upwards
// from the working directory (go test runs in the package directory), then
// from this source file's directory.
func RepoRoot() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		for {
			if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/notifierhq/notifier\n") {
				return dir, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("cannot find the repository root (go.mod of github.com/notifierhq/notifier) above %v", starts)
}

// MigrationsDir is <repo>/schema, or $PGTEST_MIGRATIONS_DIR when set.
func MigrationsDir() (string, error) {
	if d := os.Getenv("PGTEST_MIGRATIONS_DIR"); d != "" {
		return d, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "schema"), nil
}

// errNoDbmate is the advice given when dbmate cannot be found.
var errNoDbmate = errors.New("dbmate not found: run `sh internal/tools/just test` (it installs the pinned tools)")

// Dbmate returns the dbmate executable: $DBMATE, else the pinned one in
// <repo>/.tools (native binary, else the npm wrapper), else dbmate in PATH.
func Dbmate() (string, error) {
	if p := os.Getenv("DBMATE"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("DBMATE=%s: %w", p, err)
		}
		return p, nil
	}
	if root, err := RepoRoot(); err == nil {
		nm := filepath.Join(root, ".tools", "node_modules")
		native, _ := filepath.Glob(filepath.Join(nm, "@dbmate", "*", "bin", "dbmate"))
		for _, p := range append(native, filepath.Join(nm, ".bin", "dbmate")) {
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
				if p == filepath.Join(nm, ".bin", "dbmate") || runsHere(p) {
					return p, nil
				}
			}
		}
	}
	if p, err := exec.LookPath("dbmate"); err == nil {
		return p, nil
	}
	return "", errNoDbmate
}

// runsHere tells whether a native binary of some platform runs on this one.
func runsHere(p string) bool {
	return exec.Command(p, "--version").Run() == nil
}

// Migrate applies the migrations of MigrationsDir to the database at dbURL
// with dbmate (`dbmate up`, which also creates the database if missing).
// sslmode=disable is added to the URL when it has no sslmode.
func Migrate(ctx context.Context, dbURL string) error {
	dir, err := MigrationsDir()
	if err != nil {
		return err
	}
	return MigrateDir(ctx, dbURL, dir)
}

// MigrateDir is Migrate with the migrations of dir, e.g. the reference
// migrations of testdata/schema-v0 that internal/schemacheck compares with
// schema/.
func MigrateDir(ctx context.Context, dbURL, dir string) error {
	dbmate, err := Dbmate()
	if err != nil {
		return err
	}
	u, err := withDefaultSSLMode(dbURL)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, dbmate, "--url", u, "--migrations-dir", dir, "--no-dump-schema", "up")
	cmd.Dir = dir
	cmd.Env = withoutEnv(os.Environ(), "DATABASE_URL") // --url wins anyway; keep it out of output
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("dbmate up on %s (migrations %s) failed: %v\n%s", redact.URL(u), dir, err, redact.Scrub(string(out), u))
	}
	return nil
}

// withDefaultSSLMode parses a postgres:// URL and adds sslmode=disable when it
// has no sslmode (dbmate's driver would otherwise require TLS).
func withDefaultSSLMode(raw string) (string, error) {
	u, err := parsePostgresURL(raw)
	if err != nil {
		return "", err
	}
	q := u.Query()
	if q.Get("sslmode") == "" {
		q.Set("sslmode", "disable")
		u.RawQuery = q.Encode()
	}
	return u.String(), nil
}

func parsePostgresURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		// url.Parse errors quote the input: do not wrap them.
		return nil, fmt.Errorf("not a postgres://user@host:port/db URL: %s", redact.URL(raw))
	}
	return u, nil
}

func withoutEnv(env []string, names ...string) []string {
	var out []string
outer:
	for _, kv := range env {
		for _, n := range names {
			if strings.HasPrefix(kv, n+"=") {
				continue outer
			}
		}
		out = append(out, kv)
	}
	return out
}
