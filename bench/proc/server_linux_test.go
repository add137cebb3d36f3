package proc

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/bench/dbgen"
	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/internal/testworld"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// A phase counts what the server's processes used in it, and nothing a process used before: a backend
// that worked before the mark and exits in the phase has its whole life in the postmaster's reaped
// time, and one that lives through the phase has its earlier time in its own. Counted whole, a bench's
// connections closed as its deliver phase begins would add the creation's work to the phase.
func TestServerPhaseCountsOnlyItsOwnTime(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	url := pgtest.NewDBURL(t)
	exiting, exitingPID := backend(t, url)
	through, throughPID := backend(t, url)
	before := 300 * time.Millisecond
	burn(t, exiting, exitingPID, before)
	burn(t, through, throughPID, before)
	s, err := NewServer(throughPID)
	is.NoErr(err)

	phase := s.Start()
	throughAtMark := cpu(t, throughPID)
	is.NoErr(exiting.Close(ctx))
	testworld.Eventually(t, 30*time.Second, "the exiting backend reaped", func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", exitingPID))
		return os.IsNotExist(err)
	})
	born, bornPID := backend(t, url)
	during := 200 * time.Millisecond
	burn(t, born, bornPID, during)
	burn(t, through, throughPID, cpu(t, throughPID)+during)
	phaseWork := cpu(t, bornPID) + cpu(t, throughPID) - throughAtMark
	used := phase.End()

	tick := time.Second / clockTicks
	is.True(used >= phaseWork-2*tick)  // the born backend's life and the living one's time since the mark
	is.True(used < phaseWork+before/2) // no backend's time before the mark, of the one that exited nor of the one that lived on
}

// backend opens a connection and returns it with its server process's pid.
func backend(t *testing.T, url string) (*pgx.Conn, int) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	pid, err := dbgen.New(conn).BenchBackendPID(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return conn, int(pid)
}

// burn has the backend work until its process has used at least total CPU.
func burn(t *testing.T, conn *pgx.Conn, pid int, total time.Duration) {
	t.Helper()
	for cpu(t, pid) < total {
		if _, err := conn.Exec(context.Background(), "SELECT count(*) FROM generate_series(1, 200000)"); err != nil {
			t.Fatal(err)
		}
	}
}

func cpu(t *testing.T, pid int) time.Duration {
	t.Helper()
	d, err := ProcessCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
