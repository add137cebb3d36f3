package worker

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
)

var errStandby = &service.ReadOnlyError{Op: "claim", Reason: "SQLSTATE 25006: cannot execute SELECT FOR UPDATE in a read-only transaction"}

// A worker whose claims keep meeting a read-only server (pointed at a standby) stops after
// ReadOnlyGrace and returns why, instead of delivering nothing forever. On synctest's clock.
func TestReadOnlyDatabaseStopsTheWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := is.New(t)
		var buf syncBuf
		m := newMem(3, accepted)
		m.claimErr = errStandby
		ctx, cancel := context.WithCancel(context.Background()) // never cancelled: only the database stops it
		defer cancel()
		start := time.Now()
		err := Run(ctx, m, Config{Logger: slog.New(slog.NewTextHandler(&buf, nil)),
			ReadOnlyGrace: time.Minute, MaxBackoff: 5 * time.Second})
		took := time.Since(start)
		is.True(errors.Is(err, service.ErrReadOnly))                          // it says why
		is.True(strings.Contains(err.Error(), "still read-only after 1m0s"))  // and for how long
		is.True(took >= time.Minute && took <= time.Minute+5*time.Second*5/4) // after the grace, not before (a backoff of 5 s, spread by up to a quarter)
		is.Equal(strings.Count(buf.String(), "the database is read-only"), 1) // said once when it began
		is.Equal(len(m.finishedIDs()), 0)                                     // nothing was claimed
		is.True(len(m.claims) >= 10)                                          // it kept trying meanwhile (backoff up to 5 s)
	})
}

// A read-only spell shorter than the grace (a failover: the old primary demoted, the new one found on
// reconnecting) is ridden out: the worker goes on and delivers, and the grace starts over.
func TestReadOnlySpellIsRiddenOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		is := is.New(t)
		m := newMem(3, accepted)
		m.claimErr = errStandby
		ctx, cancel := context.WithCancel(context.Background())
		result := make(chan error, 1)
		go func() {
			result <- Run(ctx, m, Config{Logger: quiet, ReadOnlyGrace: time.Minute, MaxBackoff: 5 * time.Second})
		}()
		time.Sleep(50 * time.Second) // read-only, not for a whole grace
		m.mu.Lock()
		m.claimErr = nil // the new primary
		m.mu.Unlock()
		time.Sleep(20 * time.Second)
		is.Equal(len(m.finishedIDs()), 3) // delivered
		m.mu.Lock()
		m.claimErr = errStandby // a second spell: the grace starts over
		m.mu.Unlock()
		time.Sleep(50 * time.Second)
		select {
		case err := <-result:
			t.Fatalf("Run returned during a read-only spell shorter than the grace: %v", err)
		default:
		}
		cancel()
		is.NoErr(<-result) // stopped by its context: no error
	})
}

// A claim or a finish that fails for a connection pooler's configuration (prepared statements shared or
// dropped: service.ErrPooler) stops the worker at once, with the error, instead of retrying: every
// later statement may fail alike, and each failed finish leaves its tasks to lease expiry. On
// synctest's clock: a worker that retried instead would stop at the minute's end without the error.
func TestPoolerErrorStopsTheWorker(t *testing.T) {
	errPooler := &service.PoolerError{Fix: "add default_query_exec_mode=exec to the database URL",
		Err: errors.New(`ERROR: prepared statement "stmtcache_1" does not exist (SQLSTATE 26000)`)}
	run := func(m *memDispatcher, cfg Config) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cfg.Logger = quiet
		return Run(ctx, m, cfg)
	}
	t.Run("claim", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			is := is.New(t)
			m := newMem(3, accepted)
			m.claimErr = errPooler
			err := run(m, Config{})
			is.True(errors.Is(err, service.ErrPooler)) // it says why
			is.Equal(len(m.claims), 1)                 // without a retry
		})
	})
	t.Run("finish", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			is := is.New(t)
			m := newMem(20, accepted)
			m.finishErr = errPooler
			err := run(m, Config{Batch: 5, MaxInFlight: 5, Finishers: 1})
			is.True(errors.Is(err, service.ErrPooler)) // it stopped by itself, and says why
			is.Equal(m.held, 0)                        // what it held was called and sent to be finished
		})
	})
}
