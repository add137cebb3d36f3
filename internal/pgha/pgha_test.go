package pgha

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/internal/primary"
	"github.com/notifierhq/notifier/internal/testworld"
)

// harness runs the tests that start clusters: each takes 20-45 s, for the failover soak's harness,
// not the product, so they run with the soak in just test-long (which passes -pgha), not in just test.
var harness = flag.Bool("pgha", false, "run the tests that start pg_auto_failover clusters (just test-long does)")

// needHarness skips t unless -pgha was given.
func needHarness(t *testing.T) {
	t.Helper()
	if !*harness {
		t.Skip("pgha: the cluster tests run with -pgha (sh internal/tools/just test-long)")
	}
}

// start starts a cluster for t, closed at cleanup. Without pg_auto_failover installed the test is
// skipped, unless PGHA_REQUIRE is set (CI installs it, and sets it so that a skip cannot hide).
func start(t *testing.T, opts Options) *Cluster {
	t.Helper()
	needHarness(t)
	opts.Logf = t.Logf
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	if errors.Is(err, ErrNotInstalled) && os.Getenv("PGHA_REQUIRE") == "" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

func connect(t *testing.T, dbURL string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var conn *pgx.Conn
	testworld.Eventually(t, 30*time.Second, "a connection to the cluster", func() bool {
		var err error
		conn, err = pgx.Connect(ctx, dbURL)
		if err != nil && ctx.Err() != nil {
			t.Fatalf("connect: %v", err) // the last error says why
		}
		return err == nil
	})
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// A synchronous cluster: the URL reaches the primary, a commit waits for the standby, a killed
// primary's node leaves no process behind, the standby takes over with every acknowledged commit,
// the killed node rejoins as the standby, and Close leaves nothing running.
func TestFailoverAndRejoin(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	c := start(t, Options{})
	node1, node2 := c.Nodes()[0], c.Nodes()[1]

	u, err := url.Parse(c.URL())
	is.NoErr(err)
	is.Equal(u.Query().Get("target_session_attrs"), "read-write") // the multi-host URL asks for the primary
	is.Equal(u.Host, fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d", node1.Port, node2.Port))
	for _, n := range []*Node{c.monitor, node1, node2} {
		is.True(n.Port >= pgtest.PortLow && n.Port <= pgtest.PortHigh) // listen ports below the ephemeral range
	}
	primaryURL, err := c.PrimaryURL(ctx)
	is.NoErr(err)
	is.Equal(primaryURL, node1.URL()) // node1 starts as the primary, by one host

	conn := connect(t, c.URL())
	_, err = conn.Exec(ctx, "CREATE TABLE acknowledged (id int PRIMARY KEY)")
	is.NoErr(err)
	var names string
	is.NoErr(conn.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&names))
	is.True(names != "") // pg_auto_failover's default: the primary waits for its standby

	// The base backup that built the standby asked for a fast checkpoint (the wrapper's job).
	logs, _ := filepath.Glob(filepath.Join(node1.pgdata, "log", "*.log"))
	var serverLog strings.Builder
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		serverLog.Write(b)
	}
	is.True(strings.Contains(serverLog.String(), "checkpoint starting: immediate force wait")) // pg_basebackup --checkpoint=fast

	// A stalled walsender holds every commit: it is acknowledged only once the standby has it.
	resume, err := c.StallWalsender(ctx)
	is.NoErr(err)
	committed := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, "INSERT INTO acknowledged VALUES (1)")
		committed <- err
	}()
	select {
	case err := <-committed:
		t.Fatalf("a commit was acknowledged while the standby received nothing (err %v)", err)
	case <-time.After(1500 * time.Millisecond):
	}
	resume()
	is.NoErr(<-committed) // acknowledged once the standby has it

	old, err := c.KillPrimary(ctx)
	is.NoErr(err)
	is.Equal(old, node1)
	is.Equal(len(processesNaming(node1.pgdata)), 0) // nothing of the killed node runs on
	is.True(!writable(ctx, node1))                  // and its postgres is gone

	killedAt := time.Now()
	promoted, err := c.WaitPrimary(ctx, old)
	is.NoErr(err)
	is.Equal(promoted, node2)
	t.Logf("failover: %s took writes %v after the kill", promoted.Name, time.Since(killedAt).Round(100*time.Millisecond))
	conn2 := connect(t, c.URL())
	var n int
	is.NoErr(conn2.QueryRow(ctx, "SELECT count(*) FROM acknowledged").Scan(&n))
	is.Equal(n, 1) // the acknowledged commit survived the failover
	_, err = conn2.Exec(ctx, "INSERT INTO acknowledged VALUES (2)")
	is.NoErr(err) // the new primary takes writes through the same URL

	is.NoErr(c.Rejoin(ctx, old))
	states, err := c.State(ctx)
	is.NoErr(err)
	is.Equal(states[0], NodeState{Name: "node1", Port: node1.Port, Reported: "secondary", Goal: "secondary"}) // the killed node is the standby now
	primaryURL, err = c.PrimaryURL(ctx)
	is.NoErr(err)
	is.Equal(primaryURL, node2.URL())
	migrateURL, err := primary.URL(ctx, c.URL(), 3*time.Second) // what `just migrate` picks from the multi-host URL
	is.NoErr(err)
	mu, err := url.Parse(migrateURL)
	is.NoErr(err)
	is.Equal(mu.Host, fmt.Sprintf("127.0.0.1:%d", node2.Port)) // the new primary, the rejoined standby passed over

	dir := c.Dir()
	is.NoErr(c.Close())
	is.Equal(len(processesNaming(dir)), 0) // Close leaves no process
	_, err = os.Stat(dir)
	is.True(errors.Is(err, os.ErrNotExist)) // and no directory
}

// Asynchronous replication with a stalled walsender loses an acknowledged commit in a failover: the
// damage the soak's negative control relies on, shown on the harness alone.
func TestAsyncFailoverLosesAcknowledgedCommit(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	c := start(t, Options{Async: true})
	conn := connect(t, c.URL())
	var names string
	is.NoErr(conn.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&names))
	is.Equal(names, "") // no commit waits for the standby
	_, err := conn.Exec(ctx, "CREATE TABLE acknowledged (id int PRIMARY KEY); INSERT INTO acknowledged VALUES (1)")
	is.NoErr(err)
	is.NoErr(c.WaitHealthy(ctx)) // the standby has the table

	resume, err := c.StallWalsender(ctx)
	is.NoErr(err)
	defer resume()
	_, err = conn.Exec(ctx, "INSERT INTO acknowledged VALUES (2)")
	is.NoErr(err) // acknowledged at once, the standby having received nothing
	old, err := c.KillPrimary(ctx)
	is.NoErr(err)
	_, err = c.WaitPrimary(ctx, old)
	is.NoErr(err)
	var ids []int
	rows, err := connect(t, c.URL()).Query(ctx, "SELECT id FROM acknowledged ORDER BY id")
	is.NoErr(err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[int])
	is.NoErr(err)
	is.Equal(ids, []int{1})      // the acknowledged row 2 is lost
	is.NoErr(c.Rejoin(ctx, old)) // the old primary, ahead of the new one, is rewound and follows it
}

// A test binary that dies without closing its cluster leaves nothing running: each pg_autoctl gets
// a parent-death signal, and stops its postgres.
func TestParentDeathStopsCluster(t *testing.T) {
	if os.Getenv("PGHA_HELPER") != "" {
		return
	}
	needHarness(t)
	if _, err := exec.LookPath("pg_autoctl"); err != nil && os.Getenv("PGHA_REQUIRE") == "" {
		t.Skip(ErrNotInstalled)
	}
	is := is.New(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestParentDeathHelper$", "-test.v")
	cmd.Env = append(os.Environ(), "PGHA_HELPER=1")
	out, err := cmd.StdoutPipe()
	is.NoErr(err)
	cmd.Stderr = os.Stderr
	is.NoErr(cmd.Start())
	var dir string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "pgha-dir "); ok {
			dir = d
			break
		}
	}
	if dir == "" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("the helper did not start a cluster")
	}
	is.True(len(processesNaming(dir)) > 0) // the cluster runs
	is.NoErr(cmd.Process.Kill())
	_ = cmd.Wait()
	testworld.Eventually(t, 60*time.Second, "no process of "+dir+" left after its test binary died", func() bool {
		return len(processesNaming(dir)) == 0
	})
	_ = os.RemoveAll(dir) // the next Start would sweep it
}

// TestParentDeathHelper is TestParentDeathStopsCluster's child: it starts a cluster, prints its
// directory and waits to be killed.
func TestParentDeathHelper(t *testing.T) {
	if os.Getenv("PGHA_HELPER") == "" {
		t.Skip("helper process of TestParentDeathStopsCluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("pgha-dir " + c.Dir())
	time.Sleep(5 * time.Minute)
}
