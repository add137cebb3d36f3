package service_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// refuseClaimOf makes the server refuse, with errcode, any claim of task id: an attempt row opened for
// it (TaskStartAttempts, AttemptRecordSkip), or, with onLeaseExpiry, the closing of its holder's attempt
// (AttemptMarkLeaseExpired). It stands for a row the claim cannot write, such as an attempt that clashes
// with the task's next attempt number.
func refuseClaimOf(t *testing.T, e *env, id int64, errcode string, onLeaseExpiry bool) {
	t.Helper()
	event := "INSERT"
	when := "NEW.task_id = " + strconv.FormatInt(id, 10)
	if onLeaseExpiry {
		event, when = "UPDATE", "OLD.task_id = "+strconv.FormatInt(id, 10)+" AND NEW.outcome = 'LEASE_EXPIRED'"
	}
	if _, err := e.pool.Exec(e.ctx, `
		CREATE FUNCTION refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			RAISE EXCEPTION 'refused by the test' USING ERRCODE = '`+errcode+`';
		END $$;
		CREATE TRIGGER refuse_claim BEFORE `+event+` ON delivery_attempt FOR EACH ROW
			WHEN (`+when+`) EXECUTE FUNCTION refuse_claim()`); err != nil {
		t.Fatal(err)
	}
}

// firstDue is the task the next claim takes first.
func (e *env) firstDue() int64 {
	return e.scalar(`SELECT id FROM delivery_task WHERE next_attempt_at IS NOT NULL ORDER BY next_attempt_at, id LIMIT 1`)
}

// One bad row costs only itself in the claim, as in the finish: the task the server refuses to claim
// is set aside (still PENDING, due again after the longest backoff, last_error says why, no attempt
// row), and the claim still returns a full batch of the others. Before this, every claim that locked the
// bad task failed, and it stood first in line: a worker delivered nothing at all.
func TestBadRowCostsOnlyItselfInTheClaim(t *testing.T) {
	for _, batch := range []int{1, 4} {
		t.Run("batch"+strconv.Itoa(batch), func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			e.dueTasks(6)
			bad := e.firstDue()
			refuseClaimOf(t, e, bad, "unique_violation", false)
			d := e.dispatcher(dcfg{backoff: time.Minute}) // set aside for the longest backoff: 10 minutes

			attempts, settled, err := d.ClaimBatch(e.ctx, batch)
			is.NoErr(err)             // the claim is not refused as a whole
			is.Equal(len(settled), 1) // the bad task is reported
			is.Equal(settled[0].Kind, service.ResultSetAside)
			is.Equal(settled[0].TaskID, bad)
			is.True(strings.Contains(settled[0].Detail, "refused by the test")) // with the server's reason
			is.Equal(len(attempts), batch-1)                                    // and the rest of the batch is claimed

			task := e.task(bad)
			is.Equal(task.State, delivery.StatePending)                                                                                        // nothing of its history changed
			is.Equal(task.AttemptCount, 0)                                                                                                     // no attempt was made
			is.Equal(len(e.attempts(bad)), 0)                                                                                                  // and none recorded
			is.True(strings.HasPrefix(task.LastError, "SET_ASIDE: "))                                                                          // why, for status and review
			is.Equal(e.scalar(`SELECT (next_attempt_at > now() + interval '9 minutes')::int FROM delivery_task WHERE id = $1`, bad), int64(1)) // no longer first in line

			// The queue flows: every other task is claimed, the bad one is not.
			claimed := len(attempts)
			for range 10 {
				more, again, err := d.ClaimBatch(e.ctx, batch)
				is.NoErr(err)           // later claims are not refused
				is.Equal(len(again), 0) // and the bad task is not locked again
				if len(more) == 0 {
					break
				}
				claimed += len(more)
			}
			is.Equal(claimed, 5) // all five others
		})
	}
}

// The task at fault need not be the first one the refused claim locked: the one-task claims find it,
// and only it is set aside; the task first in line is claimed as usual.
func TestBadRowSecondInLineCostsOnlyItself(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.dueTasks(6)
	first := e.firstDue()
	bad := e.scalar(`SELECT id FROM delivery_task WHERE next_attempt_at IS NOT NULL ORDER BY next_attempt_at, id OFFSET 1 LIMIT 1`)
	refuseClaimOf(t, e, bad, "unique_violation", false)
	d := e.dispatcher(dcfg{backoff: time.Minute})

	attempts, settled, err := d.ClaimBatch(e.ctx, 4)
	is.NoErr(err)
	is.Equal(len(settled), 1)
	is.Equal(settled[0].Kind, service.ResultSetAside)
	is.Equal(settled[0].TaskID, bad) // the one at fault
	is.Equal(len(attempts), 3)
	claimed := map[int64]bool{}
	for _, a := range attempts {
		claimed[a.TaskID] = true
	}
	is.True(claimed[first]) // the first in line was claimed, not set aside
}

// A holder's expired lease is taken over by closing its open attempt; when the server refuses that for
// the attempt's own row, the task keeps its holder's token (a live holder may still finish) and its
// lease is extended, so the claims behind it go on.
func TestBadRowOnLeaseTakeoverIsSetAside(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.dueTasks(3)
	holder := e.dispatcher(dcfg{worker: "w-old", lease: 200 * time.Millisecond, backoff: time.Minute})
	a, _, err := claimOne(e.ctx, holder)
	is.NoErr(err)
	is.True(a != nil) // a holder that will vanish
	e.waitDB("lease_until < now() FROM delivery_task WHERE id = $1", a.TaskID)
	refuseClaimOf(t, e, a.TaskID, "P0001", true)

	d := e.dispatcher(dcfg{backoff: time.Minute})
	attempts, settled, err := d.ClaimBatch(e.ctx, 2)
	is.NoErr(err) // not refused as a whole
	is.Equal(len(settled), 1)
	is.Equal(settled[0].Kind, service.ResultSetAside) // the expired lease is set aside
	is.Equal(settled[0].TaskID, a.TaskID)
	is.Equal(len(attempts), 1) // one other task claimed
	task := e.task(a.TaskID)
	is.Equal(task.State, delivery.StateSending) // still the old holder's
	is.Equal(task.LeaseOwner, "w-old")          // with its token: its finish below still counts
	is.Equal(e.scalar(`SELECT (lease_until > now() + interval '9 minutes')::int FROM delivery_task WHERE id = $1`, a.TaskID), int64(1))
	res, err := finishOne(e.ctx, holder, a, delivery.Observation{Outcome: delivery.OutcomeAccepted})
	is.NoErr(err)
	is.Equal(res.Kind, service.ResultSent) // the holder's late finish is still the valid one
}

// A claim that fails for a reason that is not one row's (here a deadlock, which retrying may cure) sets
// nothing aside: the claim reports the error and the task stays first in line.
func TestClaimFailureNotARowIsNotSetAside(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.dueTasks(2)
	first := e.firstDue()
	refuseClaimOf(t, e, first, "deadlock_detected", false)
	d := e.dispatcher(dcfg{})
	_, _, err := d.ClaimBatch(e.ctx, 2)
	is.True(err != nil) // the claim failed
	task := e.task(first)
	is.Equal(task.LastError, "")                                                               // not set aside
	is.Equal(e.firstDue(), first)                                                              // still first in line
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'SENDING'`), int64(0)) // nothing claimed
}

// A claim that fails inside its transaction rolls it back on its own connection before it returns:
// the tasks it had locked are free at once, and the connection goes back to the pool for the next
// claim. Left to the pool, a connection still inside the failed transaction is closed instead, so a
// worker whose claims keep failing would dial, authenticate and set up a new connection for each.
func TestFailedClaimRollsBackOnItsConnection(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.dueTasks(2)
	first := e.firstDue()
	refuseClaimOf(t, e, first, "disk_full", false) // the server's trouble, not a row's: the claim fails
	d := e.dispatcher(dcfg{})
	_, _, err := d.ClaimBatch(e.ctx, 2)
	is.True(err != nil)                                     // the claim failed, after TaskClaim locked both tasks
	is.Equal(e.workerPool.Stat().TotalConns(), int32(1))    // its connection is still the pool's
	is.Equal(e.workerPool.Stat().NewConnsCount(), int64(1)) // the one it dialled
	is.Equal(e.scalar(`SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%'`), int64(0)) // no transaction left open
	is.Equal(e.scalar(`SELECT count(*) FROM (SELECT id FROM delivery_task FOR UPDATE SKIP LOCKED) AS free`), int64(2)) // no lock left

	_, err = e.pool.Exec(e.ctx, `DROP TRIGGER refuse_claim ON delivery_attempt`)
	is.NoErr(err)
	attempts, _, err := d.ClaimBatch(e.ctx, 2)
	is.NoErr(err)
	is.Equal(len(attempts), 2)                              // the next claim takes both tasks
	is.Equal(e.workerPool.Stat().NewConnsCount(), int64(1)) // on the same connection
}
