package service_test

// Retention (queries/retention.sql, Notifier.Prune): finished history older than the period goes, in
// batches; nothing unfinished or parked, no attempt of one, and no notification that still has a task.

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// backdate moves tasks' last change (and their notifications' creation) two days into the past: a
// rewrite of history no protocol move makes (a finished task is final), so outside the state machine.
func (e *env) backdate(taskIDs ...int64) {
	e.t.Helper()
	e.withoutStateMachine(func() {
		if _, err := e.pool.Exec(e.ctx, `UPDATE delivery_task SET updated_at = now() - interval '2 days' WHERE id = ANY ($1)`, taskIDs); err != nil {
			e.t.Fatal(err)
		}
	})
	if _, err := e.pool.Exec(e.ctx, `
		UPDATE notification SET created_at = now() - interval '3 days'
		WHERE id IN (SELECT notification_id FROM delivery_task WHERE id = ANY ($1))`, taskIDs); err != nil {
		e.t.Fatal(err)
	}
}

// backdateNotification moves a notification's creation three days into the past.
func (e *env) backdateNotification(id int64) {
	e.t.Helper()
	if _, err := e.pool.Exec(e.ctx, `UPDATE notification SET created_at = now() - interval '3 days' WHERE id = $1`, id); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) exists(table string, id int64) bool {
	e.t.Helper()
	return e.scalar(`SELECT count(*) FROM `+table+` WHERE id = $1`, id) == 1
}

func (e *env) attemptCount(taskID int64) int64 {
	e.t.Helper()
	return e.scalar(`SELECT count(*) FROM delivery_attempt WHERE task_id = $1`, taskID)
}

// drain runs cycles until nothing is due.
func drain(t *testing.T, d *dispatcher) {
	t.Helper()
	for runOnce(t, d).Kind != service.ResultNothing {
	}
}

func TestPruneDeletesOnlyOldFinishedHistory(t *testing.T) {
	e := newEnv(t)
	is := is.New(t)
	// A long backoff: a task waiting for a retry stays waiting while the test looks at it.
	d := e.dispatcher(dcfg{backoff: time.Hour})

	// A notification without any task (no channel enabled), created first: the oldest.
	emptyOld, created, tasks, err := e.n.Create(e.ctx, service.CreateRequest{UserID: "nobody", EventKey: "empty-old", Body: "b", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)           // created
	is.True(created)        // a new notification
	is.Equal(len(tasks), 0) // without any task
	e.backdateNotification(emptyOld)

	e.w.User("two", "push", "sms")
	e.w.User("p", "push")
	e.w.User("n", "none")
	e.w.User("mixed", "push", "none")
	sentA := e.create("two", "sent-a", time.Hour, 3) // push + sms, both SENT
	sentB := e.create("two", "sent-b", time.Hour, 3)
	failed := e.create("p", "failed", time.Hour, 3)[0]
	e.push.ScriptSend(e.ref(failed.TaskID), fakes.Step{Status: 400}) // REJECTED -> FAILED
	unknown := e.create("p", "unknown", time.Hour, 3)[0]
	e.push.ScriptSend(e.ref(unknown.TaskID), fakes.Step{Status: 409}) // IN_FLIGHT -> UNKNOWN, retry in an hour
	parked := e.create("n", "parked", time.Hour, 3)[0]
	e.none.ScriptSend(e.ref(parked.TaskID), fakes.Step{Status: 409}) // IN_FLIGHT on NONE -> parked
	mixed := e.create("mixed", "mixed", time.Hour, 3)                // push SENT, none parked
	if mixed[0].Channel == "none" {
		mixed[0], mixed[1] = mixed[1], mixed[0]
	}
	e.none.ScriptSend(e.ref(mixed[1].TaskID), fakes.Step{Status: 409})
	drain(t, d)

	e.w.User("s", "push")
	suppressed := e.create("s", "suppressed", time.Hour, 3)[0]
	_, err = e.n.SetPreference(e.ctx, "s", "push", "s@push", false)
	is.NoErr(err) // disabled before the claim
	drain(t, d)   // -> SUPPRESSED

	// Recent history: finished, but inside the period (not backdated below).
	recent := e.create("p", "recent", time.Hour, 3)[0]
	drain(t, d)
	is.Equal(e.task(recent.TaskID).State, delivery.StateSent) // finished just now

	sending := e.create("p", "sending", time.Hour, 3)[0]
	a, _, err := claimOne(e.ctx, d) // claimed and never finished: SENDING under a lease
	is.NoErr(err)                   // claimed
	is.True(a != nil)               // a task was claimed
	is.Equal(a.TaskID, sending.TaskID)
	pending := e.create("p", "pending", time.Hour, 3)[0] // never claimed

	states := map[int64]delivery.State{
		sentA[0].TaskID: delivery.StateSent, sentA[1].TaskID: delivery.StateSent,
		sentB[0].TaskID: delivery.StateSent, sentB[1].TaskID: delivery.StateSent,
		failed.TaskID: delivery.StateFailed, unknown.TaskID: delivery.StateUnknown, parked.TaskID: delivery.StateUnknown,
		mixed[0].TaskID: delivery.StateSent, mixed[1].TaskID: delivery.StateUnknown,
		suppressed.TaskID: delivery.StateSuppressed, sending.TaskID: delivery.StateSending, pending.TaskID: delivery.StatePending,
	}
	var all []int64
	for id, want := range states {
		is.Equal(e.task(id).State, want) // the mix is in place
		all = append(all, id)
	}
	is.True(e.task(parked.TaskID).NeedsReview)   // parked
	is.True(!e.task(unknown.TaskID).NeedsReview) // waiting for a retry, not parked
	e.backdate(all...)
	// An empty notification inside the period.

	emptyNew, _, _, err := e.n.Create(e.ctx, service.CreateRequest{UserID: "nobody", EventKey: "empty-new", Body: "b", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err) // created

	gone := []service.TaskRef{sentA[0], sentA[1], sentB[0], sentB[1], failed, suppressed, mixed[0]}
	kept := []service.TaskRef{unknown, parked, mixed[1], sending, pending, recent}
	var wantAttempts int64
	for _, tr := range gone {
		wantAttempts += e.attemptCount(tr.TaskID)
	}
	keptAttempts := map[int64]int64{}
	notificationOf := map[int64]int64{}
	for _, tr := range append(append([]service.TaskRef{}, gone...), kept...) {
		notificationOf[tr.TaskID] = e.task(tr.TaskID).NotificationID
	}
	for _, tr := range kept {
		keptAttempts[tr.TaskID] = e.attemptCount(tr.TaskID)
	}
	is.Equal(wantAttempts, int64(len(gone))) // one attempt each (SUPPRESSED: its SKIP row)
	is.Equal(keptAttempts[parked.TaskID], int64(1))
	is.Equal(keptAttempts[sending.TaskID], int64(1)) // the open attempt of the holder

	preview, err := e.n.PrunePreview(e.ctx, 24*time.Hour, 3)
	is.NoErr(err) // dry run
	is.Equal(preview, service.PruneStats{Tasks: 7, Attempts: wantAttempts, Notifications: 5, Batches: 3})
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task`), int64(13)) // the dry run deleted nothing

	// Batches of one task: the two tasks of sent-a go in different batches, so the first keeps the
	// notification and the second deletes it.
	st, err := e.n.Prune(e.ctx, 24*time.Hour, 1, 0)
	is.NoErr(err)                            // pruned
	is.Equal(st.Tasks, int64(len(gone)))     // every old finished task
	is.Equal(st.Attempts, wantAttempts)      // with all its attempts
	is.Equal(st.Notifications, int64(5))     // sent-a, sent-b, failed, suppressed, empty-old
	is.Equal(st.Batches, int64(len(gone)+1)) // one per task, and one for the empty notification
	for _, tr := range gone {
		is.True(!e.exists("delivery_task", tr.TaskID)) // old finished task deleted
		is.Equal(e.attemptCount(tr.TaskID), int64(0))  // and its attempts
	}
	states[recent.TaskID] = delivery.StateSent
	for _, tr := range kept {
		task := e.task(tr.TaskID)
		is.Equal(task.State, states[tr.TaskID])                      // unfinished, parked and recent tasks stay as they were
		is.Equal(e.attemptCount(tr.TaskID), keptAttempts[tr.TaskID]) // with every attempt
	}
	is.True(e.task(parked.TaskID).NeedsReview)                         // still parked for a human
	is.True(e.exists("notification", notificationOf[mixed[1].TaskID])) // kept by its parked task
	is.True(e.exists("notification", emptyNew))                        // empty, but inside the period
	is.True(!e.exists("notification", emptyOld))                       // empty and old: gone
	for _, tr := range []service.TaskRef{sentA[0], sentB[0], failed, suppressed} {
		is.True(!e.exists("notification", notificationOf[tr.TaskID])) // every task gone: the notification too
	}
	for _, tr := range kept {
		is.True(e.exists("notification", notificationOf[tr.TaskID])) // a notification with a task stays
	}

	// The history that stays is still usable: the parked task resolves, the held one finishes.
	changed, err := e.n.ResolveManually(e.ctx, parked.TaskID, delivery.StateFailed, "checked with the channel", "op")
	is.NoErr(err)    // resolved
	is.True(changed) // once
	res, err := finishOne(e.ctx, d, a, delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: "m-1"})
	is.NoErr(err)                          // the holder records its call
	is.Equal(res.Kind, service.ResultSent) // its token is still valid

	// A second run finds nothing: the parked task was just resolved (its updated_at is now), the rest
	// is unfinished or recent.
	again, err := e.n.Prune(e.ctx, 24*time.Hour, 1, 0)
	is.NoErr(err)                         // pruned again
	is.Equal(again, service.PruneStats{}) // nothing deleted
}

func TestPruneConcurrentRunsDeleteEverythingOnce(t *testing.T) {
	e := newEnv(t)
	is := is.New(t)
	e.w.User("u1", "push", "sms")
	const notifications = 40
	// Finished history made directly (test-only SQL): each notification with two SENT tasks and one
	// attempt per task, two days old.
	_, err := e.pool.Exec(e.ctx, `
		INSERT INTO notification (user_id, event_key, body, created_at, expires_at)
		SELECT 'u1', 'old-' || g, 'b', now() - interval '3 days', now() + interval '1 day'
		FROM generate_series(1, $1::int) AS g`, notifications)
	is.NoErr(err) // notifications
	_, err = e.pool.Exec(e.ctx, `
		INSERT INTO delivery_task (notification_id, channel, state, attempt_count, max_attempts, next_attempt_at,
		                           attempt_token, lease_owner, lease_until, updated_at)
		SELECT n.id, c, 'SENDING', 1, 3, NULL, gen_random_uuid(), 'w', now() + interval '1 hour', now() - interval '2 days'
		FROM notification n CROSS JOIN (VALUES ('push'), ('sms')) AS ch (c)`)
	is.NoErr(err) // tasks, claimed two days ago
	for _, stmt := range finishHistory {
		_, err = e.pool.Exec(e.ctx, stmt)
		is.NoErr(err) // their attempts, accepted: SENT
	}

	var (
		wg    sync.WaitGroup
		stats [3]service.PruneStats
		errs  [3]error
	)
	for i := range stats {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stats[i], errs[i] = e.n.Prune(e.ctx, time.Hour, 1, 0)
		}()
	}
	wg.Wait()
	var total service.PruneStats
	for i := range stats {
		is.NoErr(errs[i]) // each run succeeds (SKIP LOCKED: no run waits for or fails on another)
		total.Tasks += stats[i].Tasks
		total.Attempts += stats[i].Attempts
		total.Notifications += stats[i].Notifications
	}
	is.Equal(total.Tasks, int64(2*notifications))       // every task deleted exactly once
	is.Equal(total.Attempts, int64(2*notifications))    // every attempt
	is.Equal(total.Notifications, int64(notifications)) // every notification, also those whose two tasks went in two runs
	is.Equal(e.scalar(`SELECT count(*) FROM notification`)+e.scalar(`SELECT count(*) FROM delivery_task`)+
		e.scalar(`SELECT count(*) FROM delivery_attempt`), int64(0)) // nothing left
}

func TestPruneRefusesBadInput(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name      string
		olderThan time.Duration
		batch     int
		pause     time.Duration
	}{
		{"period under an hour", 59 * time.Minute, 100, 0},
		{"negative period", -time.Hour, 100, 0},
		{"zero batch", time.Hour, 0, 0},
		{"batch too large", time.Hour, service.MaxPruneBatch + 1, 0},
		{"negative pause", time.Hour, 100, -time.Second},
		{"pause too long", time.Hour, 100, service.MaxPrunePause + time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			_, err := e.n.Prune(e.ctx, tc.olderThan, tc.batch, tc.pause)
			is.True(errors.Is(err, delivery.ErrInvalidInput)) // refused before any row is touched
		})
	}
}
