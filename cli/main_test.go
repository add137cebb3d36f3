package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/service"
)

// binary is the notifier command built once for all tests: they run it as a user or a script would.
var binary string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "notifier-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "notifier")
	build := exec.Command("go", "build", "-o", binary, "./notifier")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build notifier:", err)
		return 1
	}
	return pgtest.Main(m)
}

// result is what one run of the binary did.
type result struct {
	code   int
	stdout string
	stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
}

// notifierCLI runs the binary against one database.
type notifierCLI struct {
	t     *testing.T
	dbURL string // "" runs without DATABASE_URL
}

// newCLI gives a CLI on a fresh migrated database, and a pool on it for checks.
func newCLI(t *testing.T) (notifierCLI, *pgxpool.Pool) {
	t.Helper()
	dbURL := pgtest.NewDBURL(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return notifierCLI{t: t, dbURL: dbURL}, pool
}

// in is the same CLI reporting to t (a subtest).
func (c notifierCLI) in(t *testing.T) notifierCLI {
	c.t = t
	return c
}

// environ is the test process's environment without any database URL, plus ours.
func (c notifierCLI) environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "DATABASE_URL=") || strings.HasPrefix(kv, "TEST_DATABASE_URL=") || strings.HasPrefix(kv, "USER=") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "USER=tester")
	if c.dbURL != "" {
		env = append(env, "DATABASE_URL="+c.dbURL)
	}
	return env
}

// command prepares a run of the binary.
func (c notifierCLI) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = c.environ()
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// run runs the binary to completion with stdin.
func (c notifierCLI) run(stdin string, args ...string) result {
	c.t.Helper()
	r, err := c.runErr(stdin, args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return r
}

// runErr is run for any goroutine: it reports a binary that could not run as an error.
func (c notifierCLI) runErr(stdin string, args ...string) (result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := c.command(ctx, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		return result{}, fmt.Errorf("notifier %s: %w", strings.Join(args, " "), err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}, nil
}

// ok runs the binary and requires exit 0.
func (c notifierCLI) ok(args ...string) result {
	c.t.Helper()
	r := c.run("", args...)
	if r.code != 0 {
		c.t.Fatalf("notifier %s: want exit 0, got %s", strings.Join(args, " "), r)
	}
	return r
}

// decode parses one JSON value (a whole stdout) into v, strictly.
func decode(t *testing.T, s string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	if dec.More() {
		t.Fatalf("more than one JSON value in %q", s)
	}
}

// oneErrorLine checks the failure contract: exactly one line on stderr, starting with "notifier: ".
func oneErrorLine(t *testing.T, r result) {
	t.Helper()
	is := is.New(t)
	is.Helper()
	is.True(strings.HasPrefix(r.stderr, "notifier: "))      // the error line starts with the program name
	is.Equal(strings.Count(r.stderr, "\n"), 1)              // exactly one line
	is.True(!strings.Contains(r.stderr, "goroutine "))      // no stack trace
	is.True(!strings.Contains(r.stderr, "Incorrect Usage")) // no help dump
}

// rowCounts counts every table's rows (SQL is fine in tests).
func rowCounts(t *testing.T, pool *pgxpool.Pool) [4]int64 {
	t.Helper()
	var n [4]int64
	err := pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM channel_pref), (SELECT count(*) FROM notification),
		(SELECT count(*) FROM delivery_task), (SELECT count(*) FROM delivery_attempt)`).Scan(&n[0], &n[1], &n[2], &n[3])
	if err != nil {
		t.Fatalf("count rows: %v", err)
	}
	return n
}

func startFake(t *testing.T, kind fakes.Kind) *fakes.Channel {
	t.Helper()
	c := fakes.Start(kind)
	t.Cleanup(c.Close)
	return c
}

// refOf is a task's channel reference (random, stored with the task: schema/001), what the fakes file
// its requests under.
func refOf(t *testing.T, pool *pgxpool.Pool, taskID int64) string {
	t.Helper()
	task, err := service.NewNotifier(pool).Task(context.Background(), taskID)
	if err != nil {
		t.Fatal(err)
	}
	return task.Ref
}
