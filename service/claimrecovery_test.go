package service_test

import (
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/testworld"
	"github.com/notifierhq/notifier/service"
)

// A claim whose commit succeeded while its answer was lost: the claimer finds its tasks again by the
// tokens it chose, calls them, and they end SENT on their first attempt. Before, each waited for its
// lease to run out and was then taken over as uncertain: on a NONE channel, parked for a human, with no
// call ever made. Played on a server of its own that waits for a standby that never comes
// (synchronous_standby_names): the claim's COMMIT is written locally and then waits, and terminating
// its backend then loses the answer of a commit that happened (PostgreSQL warns "the transaction has
// already committed locally").
func TestClaimWhoseCommitAnswerWasLostIsRecovered(t *testing.T) {
	is := is.New(t)
	lc := newLostCommit(t)
	attempts, claimErr := lc.claim(t, func() {})

	is.NoErr(claimErr)         // the claim is recovered...
	is.Equal(len(attempts), 3) // ...with all its tasks
	is.Equal(lc.recovered, 3)
	results, err := lc.d.FinishBatch(lc.ctx, attempts, callAll(lc.ctx, lc.d, attempts))
	is.NoErr(err)
	for _, r := range results {
		is.Equal(r.Kind, service.ResultSent) // called and recorded as the claim would have been
		is.Equal(r.Attempt, 1)               // on its first attempt: no lease expiry, no park
	}
	is.Equal(lc.none.TotalSends(), 3) // one request each
}

// A claim whose commit's answer was lost, while the server fails every question after it (each asking
// connection is terminated, as a failover or a restart breaks them): the claimer asks four times (once,
// then three retries, finishRetryDelay apart), then gives up with the claim's error and calls nothing.
// The tasks stay held under the claim's lease, to be taken over when it runs out, like a crash's. The
// table lock that holds each question until its backend is terminated is taken while the claim's
// COMMIT still waits, so the first question already meets it.
func TestLostClaimRecoveryGivesUpAfterThreeRetries(t *testing.T) {
	is := is.New(t)
	lc := newLostCommit(t)
	var release func()
	stopAsking := func() int { return 0 }
	attempts, claimErr := lc.claim(t, func() {
		release = lockAttemptsBehindClaim(t, lc)
		// Each question of the claimer is terminated as it waits for the lock.
		stopAsking = terminateEachWaiting(lc.ctx, lc.local, `application_name = 'claimer'`)
	})
	asks := stopAsking()
	release()

	is.True(claimErr != nil) // given up: the claim's own error
	is.Equal(len(attempts), 0)
	is.Equal(lc.recovered, 0)
	is.Equal(asks, 4) // the first question and three retries, no more
	var held int
	is.NoErr(lc.local.QueryRow(lc.ctx, `SELECT count(*) FROM delivery_task
		WHERE state = 'SENDING' AND lease_until > now() AND attempt_count = 1`).Scan(&held))
	is.Equal(held, 3)                 // the claim committed: its tasks wait for their lease
	is.Equal(lc.none.TotalSends(), 0) // and none was called
}

// lostCommit is a claim of three tasks on a NONE channel whose COMMIT is written but whose answer is
// lost. Played on a server of its own that waits for a standby that never comes
// (synchronous_standby_names): the claim's COMMIT is written locally and then waits, and terminating
// its backend then loses the answer of a commit that happened (PostgreSQL warns "the transaction has
// already committed locally").
type lostCommit struct {
	*ownServer // its own sessions commit locally
	d          *service.Dispatcher
	recovered  int // tasks reported by Observer.ClaimRecovered
}

func newLostCommit(t *testing.T) *lostCommit {
	is := is.New(t)
	// The test's own sessions commit locally; the worker's (synchronous_commit=on) wait for a standby.
	lc := &lostCommit{ownServer: newOwnServer(t, "&options=-c%20synchronous_commit%3Dlocal", "u1", "u2", "u3")}
	_, err := lc.local.Exec(lc.ctx, `ALTER SYSTEM SET synchronous_standby_names = 'phantom'`)
	is.NoErr(err)
	_, err = lc.local.Exec(lc.ctx, `SELECT pg_reload_conf()`)
	is.NoErr(err)
	t.Cleanup(func() {
		_, _ = lc.local.Exec(lc.ctx, `ALTER SYSTEM RESET synchronous_standby_names`)
		_, _ = lc.local.Exec(lc.ctx, `SELECT pg_reload_conf()`)
	})
	lc.d = lc.dispatcher(t, "claimer", service.DispatcherConfig{Worker: "w1", Lease: 30 * time.Second,
		DBTimeout: 5 * time.Second, Observer: testObserver{claimRecovered: func(n int, _ error) { lc.recovered += n }}})
	return lc
}

// claim runs ClaimBatch; once its COMMIT waits for the standby, it runs beforeLoss, then terminates the
// claim's backend (the commit stays, its answer is lost) and lets commits go on without the standby.
func (lc *lostCommit) claim(t *testing.T, beforeLoss func()) ([]*service.Attempt, error) {
	var (
		wg       sync.WaitGroup
		attempts []*service.Attempt
		claimErr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		attempts, _, claimErr = lc.d.ClaimBatch(lc.ctx, 10)
	}()
	var pid int32
	testworld.Eventually(t, 30*time.Second, "the claim's commit waits for the standby", func() bool {
		return lc.local.QueryRow(lc.ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = 'claimer' AND wait_event = 'SyncRep'`).Scan(&pid) == nil
	})
	beforeLoss()
	// The claim is written locally and waits; terminated, it stays committed, and its answer is lost.
	_, err := lc.local.Exec(lc.ctx, `SELECT pg_terminate_backend($1)`, pid)
	if err == nil {
		_, err = lc.local.Exec(lc.ctx, `ALTER SYSTEM RESET synchronous_standby_names`)
	}
	if err == nil {
		_, err = lc.local.Exec(lc.ctx, `SELECT pg_reload_conf()`)
	}
	wg.Wait()
	if err != nil {
		t.Fatalf("lose the claim's commit answer: %v", err)
	}
	return attempts, claimErr
}

// lockAttemptsBehindClaim queues an ACCESS EXCLUSIVE lock on delivery_attempt behind the locks of the
// claim whose COMMIT waits, so that it is granted as the claim's backend ends and every later statement
// of the claimer on that table waits for it. release rolls it back.
func lockAttemptsBehindClaim(t *testing.T, lc *lostCommit) (release func()) {
	conn, err := lc.local.Acquire(lc.ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(lc.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pid int32
	if err := tx.QueryRow(lc.ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	locked := make(chan error, 1)
	go func() {
		_, err := tx.Exec(lc.ctx, `LOCK TABLE delivery_attempt IN ACCESS EXCLUSIVE MODE`)
		locked <- err
	}()
	testworld.Eventually(t, 30*time.Second, "the lock queued behind the claim", func() bool {
		var queued bool
		if err := lc.local.QueryRow(lc.ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted)`, pid).Scan(&queued); err != nil {
			t.Fatalf("the lock was never queued behind the claim: %v", err)
		}
		return queued
	})
	return func() {
		if err := <-locked; err != nil {
			t.Errorf("lock delivery_attempt: %v", err)
		}
		_ = tx.Rollback(lc.ctx)
		conn.Release()
	}
}
