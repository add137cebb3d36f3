package service_test

// A finish lost to a broken connection. The worker cannot know whether it committed; TaskFinish is
// idempotent and FinishBatch sends it again until the attempts' leases would run out. Without that, a
// NONE-channel task whose call was accepted is parked for a human when the database blinks.

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// Re-applying a finish whose first copy committed changes nothing and reports the result, not STALE.
func TestFinishIsIdempotent(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "none")
	e.create("u1", "e1", time.Hour, 3)
	d := e.dispatcher(dcfg{})
	attempts, _, err := d.ClaimBatch(e.ctx, 10)
	is.NoErr(err)
	is.Equal(len(attempts), 2)
	obs := callAll(e.ctx, d, attempts)
	first, err := d.FinishBatch(e.ctx, attempts, obs)
	is.NoErr(err)
	before := e.attempts(attempts[0].TaskID)
	again, err := d.FinishBatch(e.ctx, attempts, obs) // as if the first copy's answer had been lost
	is.NoErr(err)
	is.Equal(again, first) // recorded, not STALE
	for _, r := range again {
		is.Equal(r.Kind, service.ResultSent)
	}
	is.Equal(e.attempts(attempts[0].TaskID), before) // nothing changed: no late outcome, one row
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_attempt WHERE late_outcome IS NOT NULL`), int64(0))
}

// A finish whose connection the administrator terminates while it is being recorded is sent again, and
// the NONE-channel tasks whose calls were accepted end SENT, not parked. The negative control sends the
// finish once, as before: the tasks stay SENDING, and once their lease has run out the next claim parks
// every one of them (uncertain, on a channel that can neither dedupe nor be asked).
func TestFinishSurvivesATerminatedConnection(t *testing.T) {
	for _, retry := range []bool{true, false} {
		name := map[bool]string{true: "retried", false: "negative control: sent once"}[retry]
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			for _, u := range []string{"u1", "u2", "u3"} {
				e.w.User(u, "none")
				e.create(u, "e1", time.Hour, 3)
			}
			d := e.dispatcher(dcfg{lease: 20 * time.Second, timeout: 500 * time.Millisecond})
			attempts, _, err := d.ClaimBatch(e.ctx, 10)
			is.NoErr(err)
			is.Equal(len(attempts), 3)
			obs := callAll(e.ctx, d, attempts)
			for _, o := range obs {
				is.Equal(o.Outcome, delivery.OutcomeAccepted) // every call was accepted
			}

			results, err := e.finishWhileTerminated(d, attempts, obs, retry)
			if retry {
				is.NoErr(err) // sent again on a new connection
				for i, r := range results {
					is.Equal(r.Kind, service.ResultSent)
					is.Equal(e.outcomes(attempts[i].TaskID), []delivery.Outcome{delivery.OutcomeAccepted})
				}
				is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE needs_review`), int64(0)) // nothing for a human
				return
			}
			is.True(err != nil)            // the damage: the finish is lost...
			e.withoutStateMachine(func() { // ...the leases run out (sooner than waiting 20 s)...
				_, err = e.pool.Exec(e.ctx, `UPDATE delivery_task SET lease_until = now() - interval '1 second'`)
			})
			is.NoErr(err)
			for range attempts {
				is.Equal(runOnce(t, d).Kind, service.ResultParked) // ...and every accepted task parks
			}
			is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE needs_review`), int64(3))
		})
	}
}

// A finish that fails transiently every time is sent again after 100, 200, 400 ms (and a quarter more
// at most) for as long as the lease leaves a try its wait and minFinishTry (500 ms) before it runs out,
// and then given up with the reason, the tasks left to lease expiry. With a lease of 2 s the fourth
// retry would start with about 1.1 s left, less than its 0.8-1 s wait and 0.5 s: four sends in all.
// Each send waits for a lock on its task and is terminated there.
func TestFinishRetriesOnlyWhileTheLeaseLeavesTime(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "none")
	e.create("u1", "e1", time.Hour, 3)
	var retries []int
	d := e.dispatcher(dcfg{lease: 2 * time.Second, timeout: 500 * time.Millisecond,
		configure: func(c *service.DispatcherConfig) {
			c.Observer = testObserver{finishRetried: func(r service.FinishRetryEvent) { retries = append(retries, r.Try) }}
		}})
	attempts, _, err := d.ClaimBatch(e.ctx, 10)
	is.NoErr(err)
	is.Equal(len(attempts), 1)
	obs := callAll(e.ctx, d, attempts)

	blocker, err := e.pool.Begin(e.ctx)
	is.NoErr(err)
	defer func() { _ = blocker.Rollback(context.Background()) }()
	_, err = blocker.Exec(e.ctx, `SELECT 1 FROM delivery_task WHERE id = $1 FOR UPDATE`, attempts[0].TaskID)
	is.NoErr(err)
	stopSending := terminateEachWaiting(e.ctx, e.pool, `query LIKE '%recorded_before%'`)
	_, ferr := d.FinishBatch(e.ctx, attempts, obs)
	sends := stopSending()
	is.True(ferr != nil)
	is.True(strings.Contains(ferr.Error(), "sent 4 times; no time left before the lease runs out")) // given up, saying why
	is.Equal(sends, 4)                                                                              // the first send and three retries
	is.Equal(retries, []int{0, 1, 2})                                                               // each announced
	is.NoErr(blocker.Rollback(e.ctx))
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'SENDING'`), int64(1)) // left to lease expiry
}

// finishWhileTerminated runs FinishBatch (FinishBatchOnce without retry) while the connection running its statement is terminated by
// the administrator (pg_terminate_backend): a lock on one task holds the statement until its backend
// is found and terminated, then is let go.
func (e *env) finishWhileTerminated(d *dispatcher, attempts []*service.Attempt, obs []delivery.Observation, retry bool) ([]service.Result, error) {
	e.t.Helper()
	blocker, err := e.pool.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(context.Background()) }()
	if _, err := blocker.Exec(e.ctx, `SELECT 1 FROM delivery_task WHERE id = $1 FOR UPDATE`, attempts[0].TaskID); err != nil {
		e.t.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		results []service.Result
		ferr    error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if retry {
			results, ferr = d.FinishBatch(e.ctx, attempts, obs)
		} else {
			results, ferr = d.FinishBatchOnce(e.ctx, attempts, obs)
		}
	}()
	var pid int32
	e.waitDB(`EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%recorded_before%')`)
	err = e.pool.QueryRow(e.ctx, `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%recorded_before%'`).Scan(&pid)
	if err != nil {
		e.t.Fatal(err)
	}
	var terminated bool
	if err := e.pool.QueryRow(e.ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&terminated); err != nil || !terminated {
		e.t.Fatalf("terminate the finish's backend %d: %v %v", pid, terminated, err)
	}
	if err := blocker.Rollback(e.ctx); err != nil && err != pgx.ErrTxClosed {
		e.t.Fatal(err)
	}
	wg.Wait()
	if ferr != nil && !strings.Contains(ferr.Error(), "57P01") {
		e.t.Fatalf("the finish failed otherwise than by the termination: %v", ferr)
	}
	return results, ferr
}

// A statement that times out closes its connection (pgx's default): the server is never sent a cancel
// request. A cancelled wait for synchronous replication would commit locally and answer with a WARNING,
// which a worker would take for a finish recorded on the standby too; a closed connection is an error,
// and the finish is sent again (docs/operations.md#high-availability).
func TestTimedOutStatementClosesItsConnection(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	conn, err := e.workerPool.Acquire(e.ctx)
	is.NoErr(err)
	defer conn.Release()
	ctx, cancel := context.WithTimeout(e.ctx, 200*time.Millisecond)
	defer cancel()
	_, err = conn.Exec(ctx, `SELECT pg_sleep(30)`)
	is.True(err != nil)                              // timed out
	is.True(conn.Conn().IsClosed())                  // by closing the connection
	is.True(!strings.Contains(err.Error(), "57014")) // not by a cancel request (query_canceled)
}
