package cli

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// A command pointed at a server that does not take writes (a standby, a demoted primary, or a database
// read-only by default) exits 1 within seconds with one line that says read-only and names
// target_session_attrs=read-write, and writes nothing. Before, work started and retried SQLSTATE 25006
// forever: under systemd, a healthy-looking worker that delivered nothing.
func TestCommandsRefuseAReadOnlyDatabase(t *testing.T) {
	is := is.New(t)
	c, pool := newCLI(t)
	c.ok("pref", "set", "--user", "u1", "--channel", "push", "--address", "d1")
	before := rowCounts(t, pool)
	readOnly(t, pool, true)
	push := startFake(t, fakes.Push)
	secret := filepath.Join(t.TempDir(), "secret")
	is.NoErr(os.WriteFile(secret, []byte("whsec_"+base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))), 0o600))
	for _, args := range [][]string{
		{"work", "--channel", "push=idempotent," + push.URL()},
		{"work", "--once", "--channel", "push=idempotent," + push.URL()},
		{"create", "--user", "u1", "--event-key", "e1", "--body", "hi"},
		{"pref", "set", "--user", "u2", "--channel", "push", "--address", "d2"},
		{"resolve", "--task", "1", "--state", "SENT", "--note", "checked"},
		{"cancel", "--user", "u1", "--event-key", "e1"},
		{"receipts", "--listen", "127.0.0.1:0", "--webhook-secret-file", secret},
	} {
		started := time.Now()
		r := c.run("", args...)
		is.Equal(r.code, 1)                                                    // a runtime error
		is.True(strings.Contains(r.stderr, "read-only"))                       // that says so
		is.True(strings.Contains(r.stderr, "target_session_attrs=read-write")) // and names the fix
		oneErrorLine(t, r)
		is.True(time.Since(started) < 10*time.Second) // at once, not after retrying
		t.Logf("%s: %s", args[0], strings.TrimSpace(r.stderr))
	}
	readOnly(t, pool, false)
	is.Equal(rowCounts(t, pool), before) // nothing written
}

// readOnly makes the test's database read-only by default for new sessions, as a standby is.
func readOnly(t *testing.T, pool *pgxpool.Pool, on bool) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// This session may write whatever the database's default says.
	if _, err := conn.Exec(ctx, `SET default_transaction_read_only = off`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %q SET default_transaction_read_only = %t`,
		pool.Config().ConnConfig.Database, on)); err != nil {
		t.Fatal(err)
	}
	pool.Reset() // the pool's sessions started with the old default
}

// A worker started while no server accepts connections (a failover in progress, a server starting)
// retries with backoff and comes up by itself once one does; with no server it gives up after
// --wait-for-database with one line.
func TestWorkWaitsForTheDatabaseAtStart(t *testing.T) {
	is := is.New(t)
	c, pool := newCLI(t)
	push := startFake(t, fakes.Push)
	taskID := oneTask(t, pool, "push")

	// A port nobody listens on yet, forwarded to the real server later.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	is.NoErr(err)
	addr := l.Addr().String()
	is.NoErr(l.Close())
	u, err := url.Parse(c.dbURL)
	is.NoErr(err)
	real := u.Host
	u.Host = addr
	late := c
	late.dbURL = u.String()

	r := late.run("", "work", "--wait-for-database", "1500ms", "--channel", "push=idempotent,"+push.URL())
	is.Equal(r.code, 1)                                                             // no server: given up
	is.True(strings.Contains(r.stderr, "no database server accepted a connection")) // said in one line
	is.True(strings.Count(r.stderr, "database not reachable yet; retrying") >= 2)   // after retrying

	w := late.start("work", "--wait-for-database", "30s", "--channel", "push=idempotent,"+push.URL(), "--poll", "50ms")
	testworld.Eventually(t, 10*time.Second, "the worker to retry", func() bool {
		return strings.Contains(w.stderr.String(), "database not reachable yet; retrying")
	})
	stop := forward(t, addr, real) // the server comes up
	defer stop()
	n := service.NewNotifier(pool)
	testworld.Eventually(t, 30*time.Second, "the task to be delivered", func() bool {
		task, err := n.Task(context.Background(), taskID)
		return err == nil && task.State == delivery.StateSent
	})
	is.Equal(w.stop(syscall.SIGTERM), 0)
}

// forward accepts connections on addr and relays each to target, until stop.
func forward(t *testing.T, addr, target string) (stop func()) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				in.Close()
				continue
			}
			go relay(in, out)
			go relay(out, in)
		}
	}()
	return func() { l.Close(); wg.Wait() }
}

func relay(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
}
