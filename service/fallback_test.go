package service_test

// Fallback chains (create --fallback, schema/005), through the real database and the strict fakes: only
// the first channel is called; the next is released only when the one before ends certainly not sent;
// nothing further is called while one is uncertain or parked; once one is SENT the rest are never
// called and end SUPPRESSED with FALLBACK_NOT_NEEDED.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// createChain creates (user, key) with the fallback chain and returns its tasks by channel.
func (e *env) createChain(user, key string, chain ...string) map[string]int64 {
	e.t.Helper()
	_, created, tasks, err := e.n.Create(e.ctx, service.CreateRequest{UserID: user, EventKey: key, Body: "body of " + key,
		TTL: time.Hour, MaxAttempts: 3, Fallback: chain})
	if err != nil || !created {
		e.t.Fatalf("create %s/%s with fallback %v: created=%v err=%v", user, key, chain, created, err)
	}
	byChannel := map[string]int64{}
	for _, t := range tasks {
		byChannel[t.Channel] = t.TaskID
	}
	return byChannel
}

// calls is every call a fake received for the task: sends and queries.
func (e *env) calls(fake *fakes.Channel, id int64) int {
	e.t.Helper()
	return fake.Sends(e.ref(id)) + fake.Queries(e.ref(id))
}

// TestFallbackCreatesOnlyTheFirstDue: one task per chain channel with an enabled preference (R2), in
// chain order, only the first due; a channel without preference is skipped and named.
func TestFallbackCreatesOnlyTheFirstDue(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	_, _, tasks, err := e.n.Create(e.ctx, service.CreateRequest{UserID: "u1", EventKey: "e1", Body: "b", TTL: time.Hour,
		MaxAttempts: 3, Fallback: []string{"sms", "email", "push"}})
	is.NoErr(err)
	is.Equal(len(tasks), 2) // email has no preference: no task
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE channel = 'sms' AND fallback_position = 1 AND next_attempt_at IS NOT NULL`), int64(1))
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE channel = 'push' AND fallback_position = 2 AND next_attempt_at IS NULL`), int64(1))

	for _, bad := range []service.CreateRequest{
		{Fallback: []string{"push", "push"}},
		{Fallback: []string{"push"}, Channels: []string{"sms"}},
		{Fallback: []string{"Push"}},
	} {
		bad.UserID, bad.EventKey, bad.Body, bad.TTL, bad.MaxAttempts = "u1", "e2", "b", time.Hour, 3
		_, _, _, err := e.n.Create(e.ctx, bad)
		is.True(errors.Is(err, delivery.ErrInvalidInput)) // refused before the database
	}
	is.Equal(e.scalar(`SELECT count(*) FROM notification`), int64(1)) // nothing written
}

// TestFallbackFirstSentRestNotCalled: push accepts; sms and none are never called and end SUPPRESSED
// with FALLBACK_NOT_NEEDED, in the finish's transaction.
func TestFallbackFirstSentRestNotCalled(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms", "none")
	tasks := e.createChain("u1", "e1", "push", "sms", "none")
	d := e.dispatcher(dcfg{})
	is.Equal(runOnce(t, d).Kind, service.ResultSent)
	for _, ch := range []string{"sms", "none"} {
		is.Equal(e.task(tasks[ch]).State, delivery.StateSuppressed)
		is.Equal(e.outcomes(tasks[ch]), outcomes(delivery.OutcomeFallbackNotNeeded))
	}
	is.Equal(runOnce(t, d).Kind, service.ResultNothing)
	is.Equal(e.calls(e.sms, tasks["sms"]), 0)
	is.Equal(e.calls(e.none, tasks["none"]), 0)
}

// TestFallbackFirstRejectedNextSentOnce: push refuses for good (REJECTED, FAILED): sms is released in
// the same transaction and sent once; none, after it, is never called.
func TestFallbackFirstRejectedNextSentOnce(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms", "none")
	tasks := e.createChain("u1", "e1", "push", "sms", "none")
	e.push.ScriptSend(e.ref(tasks["push"]), fakes.Step{Status: 400})
	d := e.dispatcher(dcfg{})
	is.Equal(runOnce(t, d).Kind, service.ResultFailed)
	is.True(e.task(tasks["sms"]).NextAttemptAt != nil) // released with the push's FAILED
	is.Equal(runNext(t, d).Kind, service.ResultSent)
	is.Equal(e.sms.Sends(e.ref(tasks["sms"])), 1)
	is.Equal(e.task(tasks["none"]).State, delivery.StateSuppressed)
	is.Equal(runOnce(t, d).Kind, service.ResultNothing)
	is.Equal(e.calls(e.none, tasks["none"]), 0)
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE state = 'SENT'`), int64(1)) // one SENT in the chain
}

// TestFallbackParkedHeadHoldsTheChain: the first channel (none: it cannot dedupe or be asked) times out
// and is parked. Nothing further is called while it is parked; resolved FAILED, the next is sent;
// resolved SENT, the next is never called.
func TestFallbackParkedHeadHoldsTheChain(t *testing.T) {
	for _, c := range []struct {
		resolved delivery.State
		pushSent bool
	}{{delivery.StateFailed, true}, {delivery.StateSent, false}} {
		t.Run(string(c.resolved), func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			e.w.User("u1", "none", "push")
			tasks := e.createChain("u1", "e1", "none", "push")
			e.none.ScriptSend(e.ref(tasks["none"]), fakes.Step{Delay: fakeDelay})
			d := e.dispatcher(dcfg{timeout: clientTimeout})
			is.Equal(runOnce(t, d).Outcome, delivery.OutcomeTimeout)
			head := e.task(tasks["none"])
			is.True(head.NeedsReview) // parked
			is.Equal(runOnce(t, d).Kind, service.ResultNothing)
			is.Equal(e.calls(e.push, tasks["push"]), 0) // not called while the one before is parked
			is.True(e.task(tasks["push"]).NextAttemptAt == nil)

			changed, err := e.n.ResolveManually(e.ctx, tasks["none"], c.resolved, "checked with the provider", "ops")
			is.NoErr(err)
			is.True(changed)
			if c.pushSent {
				is.Equal(runNext(t, d).Kind, service.ResultSent)
				is.Equal(e.push.Sends(e.ref(tasks["push"])), 1)
			} else {
				is.Equal(e.task(tasks["push"]).State, delivery.StateSuppressed)
				is.Equal(e.outcomes(tasks["push"]), outcomes(delivery.OutcomeFallbackNotNeeded))
				is.Equal(runOnce(t, d).Kind, service.ResultNothing)
				is.Equal(e.calls(e.push, tasks["push"]), 0)
			}
		})
	}
}

// TestFallbackUncertainHeadHoldsTheChain: push times out (UNKNOWN, waiting for its resend): sms is not
// released; the resend is accepted, and sms is never called.
func TestFallbackUncertainHeadHoldsTheChain(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	tasks := e.createChain("u1", "e1", "push", "sms")
	e.push.ScriptSend(e.ref(tasks["push"]), fakes.Step{Delay: fakeDelay})
	d := e.dispatcher(dcfg{timeout: clientTimeout})
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeTimeout)
	is.Equal(e.task(tasks["push"]).State, delivery.StateUnknown)
	is.True(e.task(tasks["sms"]).NextAttemptAt == nil) // uncertain: not released
	is.Equal(runNext(t, d).Kind, service.ResultSent)   // the resend, same key
	is.Equal(e.task(tasks["sms"]).State, delivery.StateSuppressed)
	is.Equal(e.calls(e.sms, tasks["sms"]), 0)
}

// TestFallbackCancel: a cancel suppresses the unreleased tasks with the head; a head being called when
// the cancel comes and then refused for good releases nothing: the next is already SUPPRESSED.
func TestFallbackCancel(t *testing.T) {
	t.Run("waiting", func(t *testing.T) {
		is := is.New(t)
		e := newEnv(t)
		e.w.User("u1", "push", "sms")
		tasks := e.createChain("u1", "e1", "push", "sms")
		e.cancel("u1", "e1", "")
		for _, ch := range []string{"push", "sms"} {
			is.Equal(e.task(tasks[ch]).State, delivery.StateSuppressed)
			is.Equal(e.outcomes(tasks[ch]), outcomes(delivery.OutcomeCancelled))
		}
		is.Equal(runOnce(t, e.dispatcher(dcfg{})).Kind, service.ResultNothing)
		is.Equal(e.calls(e.push, tasks["push"])+e.calls(e.sms, tasks["sms"]), 0)
	})
	t.Run("head sending, then rejected", func(t *testing.T) {
		is := is.New(t)
		e := newEnv(t)
		e.w.User("u1", "push", "sms")
		tasks := e.createChain("u1", "e1", "push", "sms")
		e.push.ScriptSend(e.ref(tasks["push"]), fakes.Step{Status: 400})
		d := e.dispatcher(dcfg{})
		a, _, err := claimOne(e.ctx, d)
		is.NoErr(err)
		e.cancel("u1", "e1", "")
		is.Equal(e.task(tasks["sms"]).State, delivery.StateSuppressed) // suppressed by the cancel at once
		res, err := finishOne(e.ctx, d, a, d.Call(e.ctx, a))
		is.NoErr(err)
		is.Equal(res.Kind, service.ResultFailed)
		is.Equal(runOnce(t, d).Kind, service.ResultNothing)
		is.Equal(e.calls(e.sms, tasks["sms"]), 0)
		is.Equal(e.outcomes(tasks["sms"]), outcomes(delivery.OutcomeCancelled))
	})
}

// TestFallbackDisabledHeadReleasesTheNext: a head whose preference was switched off after create is
// settled SUPPRESSED (PREF_DISABLED) by its claim, which releases the next.
func TestFallbackDisabledHeadReleasesTheNext(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	tasks := e.createChain("u1", "e1", "push", "sms")
	_, err := e.n.SetPreference(e.ctx, "u1", "push", "u1@push", false)
	is.NoErr(err)
	d := e.dispatcher(dcfg{})
	is.Equal(runOnce(t, d).Kind, service.ResultSuppressed)
	is.Equal(runNext(t, d).Kind, service.ResultSent)
	is.Equal(e.sms.Sends(e.ref(tasks["sms"])), 1)
}

// TestFallbackReleaseIsTheDatabases: the release is part of the statement that makes the head final,
// whoever writes it. A finish by hand (the owner, no service code) that writes the head FAILED finds
// the next task due before its transaction commits; rolled back, neither happened. The unsafe variant
// (the release as a separate step after the head's commit, shown with the trigger disabled) loses the
// release when the process dies between the two: the next task waits forever and is never called.
func TestFallbackReleaseIsTheDatabases(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	tasks := e.createChain("u1", "e1", "push", "sms")
	d := e.dispatcher(dcfg{})
	a, _, err := claimOne(e.ctx, d)
	is.NoErr(err)
	is.True(a != nil)
	finishFailed := `WITH f AS (
		UPDATE delivery_attempt SET outcome = 'REJECTED', finished_at = now()
		WHERE task_id = $1 AND attempt_token = (SELECT attempt_token FROM delivery_task WHERE id = $1) AND outcome IS NULL)
	UPDATE delivery_task SET state = 'FAILED', lease_owner = NULL, lease_until = NULL, last_error = 'rejected'
	WHERE id = $1`
	due := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) bool {
		var b bool
		is.NoErr(q.QueryRow(e.ctx, `SELECT next_attempt_at IS NOT NULL FROM delivery_task WHERE id = $1`, tasks["sms"]).Scan(&b))
		return b
	}
	tx, err := e.pool.Begin(e.ctx)
	is.NoErr(err)
	_, err = tx.Exec(e.ctx, finishFailed, tasks["push"])
	is.NoErr(err)
	is.True(due(tx)) // released in the head's own statement
	is.NoErr(tx.Rollback(e.ctx))
	is.True(!due(e.pool)) // rolled back together

	// The unsafe variant: the head's final state commits alone; the release would have been the next step.
	_, err = e.pool.Exec(e.ctx, `ALTER TABLE delivery_task DISABLE TRIGGER delivery_task_fallback`)
	is.NoErr(err)
	_, err = e.pool.Exec(e.ctx, finishFailed, tasks["push"])
	is.NoErr(err)
	_, err = e.pool.Exec(e.ctx, `ALTER TABLE delivery_task ENABLE TRIGGER delivery_task_fallback`)
	is.NoErr(err)
	// ... and the process dies here. The release is lost: sms is never due, never called.
	is.True(!due(e.pool))
	is.Equal(runOnce(t, d).Kind, service.ResultNothing)
	is.Equal(e.calls(e.sms, tasks["sms"]), 0)
}

// TestFallbackCreateTx: notifier_create(fallback => ...), in the creator's own transaction, makes the
// same chain as Create (the creator's insert policy lets a later task in only unreleased), and the
// database refuses a channel named twice or fallback with channels, naming the parameter.
func TestFallbackCreateTx(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	creator := secRolePool(t, e, "notifier_creator")
	n := service.NewNotifier(creator)
	tx, err := creator.Begin(e.ctx)
	is.NoErr(err)
	c, err := n.CreateTx(e.ctx, tx, service.CreateRequest{UserID: "u1", EventKey: "tx-chain", Body: "b", TTL: time.Hour,
		MaxAttempts: 3, Fallback: []string{"sms", "push"}})
	is.NoErr(err)
	is.NoErr(tx.Commit(e.ctx))
	is.True(c.Created)
	is.Equal(len(c.Tasks), 2)
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE channel = 'sms' AND fallback_position = 1 AND next_attempt_at IS NOT NULL`), int64(1))
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE channel = 'push' AND fallback_position = 2 AND next_attempt_at IS NULL`), int64(1))

	for sql, want := range map[string]string{
		`SELECT * FROM notifier_create(user_id => 'u1', event_key => 'x1', body => 'b', fallback => ARRAY['sms', 'sms'])`:                     "named twice",
		`SELECT * FROM notifier_create(user_id => 'u1', event_key => 'x2', body => 'b', fallback => ARRAY['sms'], channels => ARRAY['push'])`: "channels and fallback together",
	} {
		_, err := creator.Exec(e.ctx, sql)
		var pgErr *pgconn.PgError
		is.True(errors.As(err, &pgErr))
		is.Equal(pgErr.Code, sqlBadArg)
		is.True(strings.Contains(pgErr.Message, want))
	}
	is.Equal(e.scalar(`SELECT count(*) FROM notification`), int64(1)) // nothing else written
}

// TestFallbackScheduledChain: chains with a send time, created by the creator's role in Go and in SQL
// (notifier_create with both send_at and fallback): each head is due at its send time, not before, and
// the rest wait unreleased. Once its time has come, a head refused for good releases the next at once.
func TestFallbackScheduledChain(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	creatorPool := secRolePool(t, e, "notifier_creator")
	out, err := service.NewNotifier(creatorPool).CreateBatch(e.ctx, []service.CreateRequest{{UserID: "u1", EventKey: "go",
		Body: "b", TTL: time.Hour, MaxAttempts: 3, Delay: 30 * time.Minute, Fallback: []string{"push", "sms"}}})
	is.NoErr(err) // the creator's insert policy takes a scheduled head and an unreleased next
	is.True(out[0].Created)
	var sqlID int64
	is.NoErr(creatorPool.QueryRow(e.ctx, `SELECT notification_id FROM notifier_create(user_id => 'u1', event_key => 'sql',
		body => 'b', send_at => now() + interval '2 seconds', fallback => ARRAY['sms', 'push'])`).Scan(&sqlID))
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task t JOIN notification n ON n.id = t.notification_id
		WHERE t.fallback_position = 1 AND n.send_at > n.created_at AND t.next_attempt_at = n.send_at`), int64(2)) // each head due at its send time
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task WHERE fallback_position = 2 AND next_attempt_at IS NULL`), int64(2)) // each next unreleased
	d := e.dispatcher(dcfg{})
	is.Equal(runOnce(t, d).Kind, service.ResultNothing) // nothing due yet

	var head, next int64
	is.NoErr(e.pool.QueryRow(e.ctx, `SELECT min(id) FILTER (WHERE fallback_position = 1), min(id) FILTER (WHERE fallback_position = 2)
		FROM delivery_task WHERE notification_id = $1`, sqlID).Scan(&head, &next))
	e.sms.ScriptSend(e.ref(head), fakes.Step{Status: 400})
	res := runNext(t, d) // polled until the database clock passes the SQL chain's send time
	is.Equal(res.TaskID, head)
	is.Equal(res.Kind, service.ResultFailed)
	is.True(e.task(next).NextAttemptAt != nil) // released with the head's FAILED
	res = runNext(t, d)
	is.Equal(res.TaskID, next)
	is.Equal(res.Kind, service.ResultSent)
	is.Equal(runOnce(t, d).Kind, service.ResultNothing) // the Go chain still waits for its time
}
