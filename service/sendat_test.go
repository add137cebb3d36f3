package service_test

// Send at a time (schema/005, docs/protocol.md#send-at), through the real database, the creator's
// role and the strict fakes: a scheduled task is not claimed before its send time and is delivered
// after it; it is counted as scheduled, never as overdue; a send time at or after the expiry is refused
// with nothing written; the creator's insert policy refuses a task due at any other time; a cancel
// suppresses a scheduled task.

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// TestSendAtTaskWaitsForItsTime: created by the creator's role with a 2 s delay on the database clock,
// the task is due at its notification's send time; claims before then find nothing, status and the
// gauges count it as scheduled and not overdue, a duplicate with another send time changes nothing,
// and a claim polled until the database clock passes the send time delivers it, once.
func TestSendAtTaskWaitsForItsTime(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	creator := service.NewNotifier(secRolePool(t, e, "notifier_creator"))
	out, err := creator.CreateBatch(e.ctx, []service.CreateRequest{{UserID: "u1", EventKey: "later", Body: "b",
		TTL: time.Hour, MaxAttempts: 3, Delay: 2 * time.Second}})
	is.NoErr(err) // created by the creator's role: the insert policy takes a task due at the send time
	is.True(out[0].Created)
	is.Equal(len(out[0].Tasks), 1)
	id, task := out[0].NotificationID, out[0].Tasks[0].TaskID
	is.Equal(e.scalar(`SELECT count(*) FROM notification n JOIN delivery_task t ON t.notification_id = n.id
		WHERE t.id = $1 AND n.send_at = n.created_at + interval '2 seconds' AND t.next_attempt_at = n.send_at`, task), int64(1)) // due 2 s after the insert, on the database clock

	d := e.dispatcher(dcfg{})
	is.Equal(runOnce(t, d).Kind, service.ResultNothing) // not claimed before its time
	is.Equal(e.push.Sends(e.ref(task)), 0)
	st, err := e.n.Status(e.ctx)
	is.NoErr(err)
	is.Equal(st.Scheduled, int64(1))            // counted as scheduled
	is.Equal(st.OldestReadySeconds, float64(0)) // and not overdue
	g, err := e.n.AlertGauges(e.ctx)
	is.NoErr(err)
	is.Equal(g.Scheduled, int64(1))
	is.Equal(g.OldestDueSeconds, float64(0)) // no alert counts it either
	rep, err := e.n.Show(e.ctx, service.ShowRequest{NotificationID: id})
	is.NoErr(err)
	is.True(rep.SendAt != nil)                                    // show prints the send time
	is.True(rep.SendAt.Before(rep.ExpiresAt))                     // before the expiry
	is.Equal(e.task(task).NextAttemptAt.Equal(*rep.SendAt), true) // and the task is due then

	again, err := creator.CreateBatch(e.ctx, []service.CreateRequest{{UserID: "u1", EventKey: "later", Body: "b",
		TTL: time.Hour, MaxAttempts: 3, SendAt: time.Now().Add(-time.Minute)}})
	is.NoErr(err)
	is.True(!again[0].Created) // a duplicate
	rep2, err := e.n.Show(e.ctx, service.ShowRequest{NotificationID: id})
	is.NoErr(err)
	is.True(rep2.SendAt.Equal(*rep.SendAt))                       // changes no send time
	is.Equal(e.task(task).NextAttemptAt.Equal(*rep.SendAt), true) // and makes nothing due earlier
	is.Equal(runOnce(t, d).Kind, service.ResultNothing)           // still not claimed

	res := runNext(t, d) // polled until the database clock passes the send time
	is.Equal(res.Kind, service.ResultSent)
	is.Equal(res.TaskID, task)
	is.Equal(e.push.Sends(e.ref(task)), 1) // delivered once
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_attempt a JOIN delivery_task t ON t.id = a.task_id
		JOIN notification n ON n.id = t.notification_id WHERE t.id = $1 AND a.started_at >= n.send_at`, task), int64(1)) // after its time
	st, err = e.n.Status(e.ctx)
	is.NoErr(err)
	is.Equal(st.Scheduled, int64(0)) // no longer scheduled
}

// TestSendAtInCallersTx: notifier_create's send_at through CreateTx, by the creator's role: a send time
// ahead makes the task due then; one already past makes it due at once (not dated back).
func TestSendAtInCallersTx(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	creatorPool := secRolePool(t, e, "notifier_creator")
	creator := service.NewNotifier(creatorPool)
	ahead := time.Now().Add(30 * time.Minute).Truncate(time.Microsecond)
	tx, err := creatorPool.Begin(e.ctx)
	is.NoErr(err)
	defer func() { _ = tx.Rollback(e.ctx) }() // after the commit, a no-op
	later, err := creator.CreateTx(e.ctx, tx, service.CreateRequest{UserID: "u1", EventKey: "ahead", Body: "b",
		TTL: time.Hour, MaxAttempts: 3, SendAt: ahead})
	is.NoErr(err)
	past, err := creator.CreateTx(e.ctx, tx, service.CreateRequest{UserID: "u1", EventKey: "past", Body: "b",
		TTL: time.Hour, MaxAttempts: 3, SendAt: time.Now().Add(-time.Hour)})
	is.NoErr(err)
	is.NoErr(tx.Commit(e.ctx))
	is.True(e.task(later.Tasks[0].TaskID).NextAttemptAt.Equal(ahead)) // due at its send time
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task t JOIN notification n ON n.id = t.notification_id
		WHERE t.id = $1 AND n.send_at < n.created_at AND t.next_attempt_at = t.created_at`, past.Tasks[0].TaskID), int64(1)) // a past send time: due at once, not dated back
}

// TestSendAtAtOrAfterExpiryRefused: a send time at or after the expiry is refused before anything is
// written: by Validate (an *InputError naming the field), by notifier_create (22023 naming send_at) and
// by the notification's CHECK, whatever writes it.
func TestSendAtAtOrAfterExpiryRefused(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	creatorPool := secRolePool(t, e, "notifier_creator")
	creator := service.NewNotifier(creatorPool)
	for _, c := range []struct {
		name  string
		req   service.CreateRequest
		field string
	}{
		{"delay equal to the ttl", service.CreateRequest{Delay: time.Hour}, "delay"},
		{"delay after the ttl", service.CreateRequest{Delay: 2 * time.Hour}, "delay"},
		{"send time after the expiry", service.CreateRequest{SendAt: time.Now().Add(2 * time.Hour)}, "send_at"},
		{"negative delay", service.CreateRequest{Delay: -time.Second}, "delay"},
		{"both", service.CreateRequest{Delay: time.Second, SendAt: time.Now().Add(time.Minute)}, "send_at"},
	} {
		r := c.req
		r.UserID, r.EventKey, r.Body, r.TTL, r.MaxAttempts = "u1", "refused", "b", time.Hour, 3
		_, err := creator.CreateBatch(e.ctx, []service.CreateRequest{r})
		var in *delivery.InputError
		is.True(errors.As(err, &in)) // refused as bad input
		is.Equal(in.Field, c.field)  // naming the field
		tx, err := creatorPool.Begin(e.ctx)
		is.NoErr(err)
		_, err = creator.CreateTx(e.ctx, tx, r)
		_ = tx.Rollback(e.ctx)
		is.True(errors.As(err, &in)) // CreateTx too
		t.Logf("%s: %v", c.name, err)
	}
	// A send time this host's clock cannot judge: exactly the expiry on the clock of a transaction that
	// began before it. Validate passes it (its now is later); notifier_create refuses it, and CreateTx
	// answers the same *InputError.
	tx, err := creatorPool.Begin(e.ctx)
	is.NoErr(err)
	defer func() { _ = tx.Rollback(e.ctx) }() // on failure too: the pool's close waits for its connection
	var txStart time.Time
	is.NoErr(tx.QueryRow(e.ctx, `SELECT now()`).Scan(&txStart))
	late := service.CreateRequest{UserID: "u1", EventKey: "late", Body: "b", TTL: time.Hour, MaxAttempts: 3, SendAt: txStart.Add(time.Hour)}
	is.NoErr(late.Validate()) // past the client's check
	_, err = creator.CreateTx(e.ctx, tx, late)
	var in *delivery.InputError
	is.True(errors.As(err, &in)) // refused by the database, as bad input
	is.Equal(in.Field, "send_at")
	is.NoErr(tx.Rollback(e.ctx))
	t.Logf("at the database's expiry: %v", err)
	for _, sendAt := range []string{"now() + interval '1 hour'", "now() + interval '2 hours'"} {
		_, err := creatorPool.Exec(e.ctx, `SELECT * FROM notifier_create(user_id => 'u1', event_key => 'sql', body => 'b',
			ttl => interval '1 hour', send_at => `+sendAt+`)`)
		pgErr := secPgErr(err)
		is.True(pgErr != nil)
		is.Equal(pgErr.Code, "22023")                          // invalid_parameter_value
		is.True(strings.Contains(pgErr.Message, "send_at"))    // naming send_at
		is.True(strings.Contains(pgErr.Message, "the expiry")) // and why
	}
	_, err = creatorPool.Exec(e.ctx, `INSERT INTO notification (user_id, event_key, body, expires_at, send_at)
		VALUES ('u1', 'check', 'b', now() + interval '1 hour', now() + interval '1 hour')`)
	pgErr := secPgErr(err)
	is.True(pgErr != nil)
	is.Equal(pgErr.ConstraintName, "notification_send_before_expiry") // the CHECK holds for any writer
	is.Equal(e.scalar(`SELECT count(*) FROM notification`), int64(0)) // nothing written
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task`), int64(0))
}

// TestSendAtCreatorPolicy: the creator's insert policy (schema/005) takes a task due exactly at
// greatest(send_at, now()) of its notification, and refuses one dated back or dated to any other time.
func TestSendAtCreatorPolicy(t *testing.T) {
	e := newEnv(t)
	e.w.User("u1", "push")
	creator := secRolePool(t, e, "notifier_creator")
	for _, c := range []struct {
		name     string
		sendAt   string // the notification's send time
		nextAt   string // the task's next_attempt_at; empty: its default, now()
		accepted bool
	}{
		{"no send time, due now", "NULL", "", true},
		{"no send time, dated back", "NULL", "now() - interval '1 second'", false},
		{"no send time, dated ahead", "NULL", "now() + interval '1 hour'", false},
		{"send time ahead, due then", "now() + interval '10 minutes'", "now() + interval '10 minutes'", true},
		{"send time ahead, due now", "now() + interval '10 minutes'", "", false},
		{"send time ahead, due later", "now() + interval '10 minutes'", "now() + interval '20 minutes'", false},
		{"send time past, due now", "now() - interval '10 minutes'", "", true},
		{"send time past, dated back to it", "now() - interval '10 minutes'", "now() - interval '10 minutes'", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			tx, err := creator.Begin(e.ctx)
			is.NoErr(err)
			defer func() { _ = tx.Rollback(e.ctx) }()
			var id int64
			is.NoErr(tx.QueryRow(e.ctx, `INSERT INTO notification (user_id, event_key, body, expires_at, send_at)
				VALUES ('u1', 'policy', 'b', now() + interval '1 hour', `+c.sendAt+`) RETURNING id`).Scan(&id))
			sql := `INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES ($1, 'push', 3)`
			if c.nextAt != "" {
				sql = `INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at) VALUES ($1, 'push', 3, ` + c.nextAt + `)`
			}
			_, err = tx.Exec(e.ctx, sql, id)
			if c.accepted {
				is.NoErr(err) // the policy takes it
				return
			}
			pgErr := secPgErr(err)
			is.True(pgErr != nil)
			is.Equal(pgErr.Code, sqlInsufficient) // refused by row-level security
		})
	}
}

// TestCancelScheduledTaskIsSuppressed: a cancel before the send time suppresses the scheduled task at
// once (it was certainly never attempted); it is never called and no longer counted as scheduled.
func TestCancelScheduledTaskIsSuppressed(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	out, err := e.n.CreateBatch(e.ctx, []service.CreateRequest{{UserID: "u1", EventKey: "promo", Body: "b",
		TTL: 2 * time.Hour, MaxAttempts: 3, Delay: time.Hour}})
	is.NoErr(err)
	task := out[0].Tasks[0].TaskID
	c := e.cancel("u1", "promo", "campaign called off")
	is.True(c.Changed)
	is.Equal(len(c.Tasks), 1)
	is.Equal(c.Tasks[0].Effect, service.CancelSuppressed) // waiting, not due, certain: suppressed now
	is.Equal(e.task(task).State, delivery.StateSuppressed)
	is.Equal(e.outcomes(task), outcomes(delivery.OutcomeCancelled))
	st, err := e.n.Status(e.ctx)
	is.NoErr(err)
	is.Equal(st.Scheduled, int64(0))
	is.Equal(e.push.Sends(e.ref(task)), 0) // never called
}
