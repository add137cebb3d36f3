package service_test

// The seed's cases (docs/testing.md#seed-cases), each named after its id: go test ./service -run 'N1|T2'.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
)

const (
	clientTimeout = 400 * time.Millisecond  // the seed's client timeout
	fakeDelay     = 1200 * time.Millisecond // the seed's accept-then-delay
)

func TestN1ConcurrentCreateYieldsOneNotification(t *testing.T) {
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	if _, err := e.n.SetPreference(e.ctx, "u1", "none", "u1@none", false); err != nil {
		t.Fatal(err)
	}
	const callers, rounds = 16, 5
	for round := range rounds {
		is := is.New(t)
		key := "ord-1001-shipped-" + string(rune('a'+round))
		type reply struct {
			id      int64
			created bool
			tasks   []service.TaskRef
			err     error
		}
		replies := make([]reply, callers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				id, created, tasks, err := e.n.Create(e.ctx, service.CreateRequest{UserID: "u1", EventKey: key, Body: "shipped", TTL: time.Hour, MaxAttempts: 3})
				replies[i] = reply{id, created, tasks, err}
			}()
		}
		close(start)
		wg.Wait()
		createdCount := 0
		for _, r := range replies {
			is.NoErr(r.err)                     // every submission succeeds
			is.Equal(r.id, replies[0].id)       // every caller gets the same notification
			is.Equal(len(r.tasks), 2)           // the tasks of the enabled channels, for winner and losers alike
			is.Equal(r.tasks, replies[0].tasks) // the same tasks
			if r.created {
				createdCount++
			}
		}
		is.Equal(createdCount, 1)                                                                                                           // exactly one created=true
		is.Equal(e.scalar("SELECT count(*) FROM notification WHERE event_key = $1", key), int64(1))                                         // one logical notification
		is.Equal(e.scalar("SELECT count(*) FROM delivery_task WHERE notification_id = $1", replies[0].id), int64(2))                        // no task written by a loser
		is.Equal(e.scalar("SELECT count(*) FROM delivery_task t WHERE notification_id = $1 AND channel = 'none'", replies[0].id), int64(0)) // disabled channel: no task
	}
}

func TestN2NormalDelivery(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	tasks := e.create("u1", "ord-1001", time.Hour, 3)
	d := e.dispatcher(dcfg{})
	for range tasks {
		is.Equal(runOnce(t, d).Kind, service.ResultSent) // each channel accepts
	}
	is.Equal(runOnce(t, d).Kind, service.ResultNothing) // nothing left
	for _, tk := range tasks {
		task := e.task(tk.TaskID)
		is.Equal(task.State, delivery.StateSent)                            // SENT
		is.Equal(e.outcomes(tk.TaskID), outcomes(delivery.OutcomeAccepted)) // one attempt, ACCEPTED
		is.True(task.ProviderMsgID != "")                                   // provider id written back
	}
	is.Equal(e.push.TotalOutbound(), 1) // push sent once
	is.Equal(e.sms.TotalOutbound(), 1)  // sms sent once
}

func TestC1ConcurrentClaims(t *testing.T) {
	t.Run("8 claimers 1 task", func(t *testing.T) {
		is := is.New(t)
		e := newEnv(t)
		e.w.User("u1", "push")
		e.create("u1", "e1", time.Hour, 3)
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			claimed int
			start   = make(chan struct{})
		)
		for i := range 8 {
			d := e.dispatcher(dcfg{worker: "w" + string(rune('0'+i))})
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				a, _, err := claimOne(context.Background(), d)
				if err != nil {
					t.Error(err)
				}
				if a != nil {
					mu.Lock()
					claimed++
					mu.Unlock()
				}
			}()
		}
		close(start)
		wg.Wait()
		is.Equal(claimed, 1) // exactly one claimer holds the task
	})
	t.Run("4 workers drain 20 tasks", func(t *testing.T) {
		is := is.New(t)
		e := newEnv(t)
		e.w.User("u1", "push")
		for i := range 20 {
			e.create("u1", "drain-"+string(rune('a'+i)), time.Hour, 3)
		}
		var wg sync.WaitGroup
		for i := range 4 {
			d := e.dispatcher(dcfg{worker: "w" + string(rune('0'+i))})
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					results, err := runBatch(context.Background(), d, testBatch) // per task, or batched with NOTIFIER_TEST_BATCH
					if err != nil {
						t.Error(err)
						return
					}
					if len(results) == 0 {
						return
					}
				}
			}()
		}
		wg.Wait()
		is.Equal(e.scalar("SELECT count(*) FROM delivery_attempt"), int64(20))                      // 20 attempts
		is.Equal(e.push.TotalOutbound(), 20)                                                        // 20 new outbounds
		is.Equal(e.push.TotalSends(), 20)                                                           // from 20 sends: push dedupes by key, so outbounds alone would hide a second send of a task
		is.Equal(e.scalar("SELECT count(*) FROM delivery_task WHERE attempt_count <> 1"), int64(0)) // every task attempt_count = 1
		is.Equal(e.scalar("SELECT count(*) FROM delivery_task WHERE state <> 'SENT'"), int64(0))    // all SENT
	})
}

// TestNC1ClaimWithoutLock is a negative control: the claim without FOR UPDATE SKIP LOCKED (a plain
// SELECT, then UPDATE by id) lets two claimers take the same task, and it goes out twice. The lock is
// what keeps the second claimer away; the state machine (schema/003) now also refuses its update, which
// reaches the row the first claimer holds under a live lease. Both are shown: the refusal, and the
// damage once the state machine is switched off.
func TestNC1ClaimWithoutLock(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "sms")
	const unsafeSelect = `SELECT id FROM delivery_task WHERE state IN ('PENDING','UNKNOWN') AND next_attempt_at <= now() ORDER BY id LIMIT 1`
	const unsafeUpdate = `UPDATE delivery_task SET state = 'SENDING', attempt_token = gen_random_uuid(), lease_owner = $2,
		lease_until = now() + interval '30 seconds', next_attempt_at = NULL, attempt_count = attempt_count + 1 WHERE id = $1`
	// The same claim with the attempt row the database wants with every counted attempt, written by the
	// same statement (schema/003).
	const unsafeClaim = `WITH c AS (` + unsafeUpdate + ` RETURNING id, attempt_count, attempt_token, lease_owner)
		INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
		SELECT id, attempt_count, attempt_token, 'SEND', lease_owner FROM c`
	// Each claimer runs the unsafe claim in its own transaction; the second reads before the first commits.
	race := func(openAttempt bool) (ids [2]int64, tags [2]int64, errs [2]error) {
		t.Helper()
		txs := [2]pgx.Tx{}
		for i := range txs {
			tx, err := e.pool.Begin(e.ctx)
			is.NoErr(err)
			defer tx.Rollback(e.ctx)
			txs[i] = tx
			is.NoErr(tx.QueryRow(e.ctx, unsafeSelect).Scan(&ids[i]))
		}
		claim := unsafeUpdate
		if openAttempt {
			claim = unsafeClaim
		}
		for i, tx := range txs {
			tag, err := tx.Exec(e.ctx, claim, ids[i], fmt.Sprintf("w%d", i+1))
			if err == nil {
				err = tx.Commit(e.ctx)
			}
			tags[i], errs[i] = tag.RowsAffected(), err
		}
		return ids, tags, errs
	}

	guarded := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	ids, tags, errs := race(true)
	is.Equal(ids, [2]int64{guarded, guarded}) // both claimers read the same task
	is.NoErr(errs[0])                         // the first claims it
	is.Equal(tags[0], int64(1))
	pgErr := secPgErr(errs[1])
	is.True(pgErr != nil)                                                                       // the second claimer's update reaches the held row ...
	is.Equal(pgErr.Code, sqlIntegrity)                                                          // and the database refuses it
	is.Equal(pgErr.ConstraintName, "delivery_task_transition")                                  // a live lease is never taken over
	is.True(strings.Contains(pgErr.Message, fmt.Sprintf("delivery_task %d: SENDING", guarded))) // naming the row it matched
	is.Equal(e.task(guarded).LeaseOwner, "w1")                                                  // the first claimer holds it

	unguarded := e.create("u1", "e2", time.Hour, 3)[0].TaskID
	e.withoutStateMachine(func() {
		ids, tags, errs = race(false)
	})
	is.Equal(ids, [2]int64{unguarded, unguarded}) // both claimers read the same task
	is.NoErr(errs[0])
	is.NoErr(errs[1])
	is.Equal(tags[0]+tags[1], int64(2)) // damage: 2 rows updated, both think they hold it
	client, err := httpchannel.New(e.sms.URL(), httpchannel.Options{})
	is.NoErr(err)
	for range 2 { // each claimer calls the channel
		msg := delivery.Message{Ref: e.ref(unguarded), IdempotencyKey: delivery.IdempotencyKey(e.ref(unguarded)), To: "x", Body: "b"}
		is.Equal(client.Send(e.ctx, msg).Outcome, delivery.OutcomeAccepted)
	}
	is.Equal(e.sms.Outbound(e.ref(unguarded)), 2) // damage: the task went out twice
}

func TestT1IdempotentResendAfterTimeout(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	e.push.ScriptSend(e.ref(id), fakes.Step{Delay: fakeDelay})
	d := e.dispatcher(dcfg{timeout: clientTimeout})
	first := runOnce(t, d)
	is.Equal(first.Outcome, delivery.OutcomeTimeout) // the response did not come back in time
	is.Equal(first.Kind, service.ResultUnknown)      // outcome unknown, retried
	task := e.task(id)
	is.True(task.OutcomeUncertain) // recorded as uncertain
	second := runNext(t, d)
	is.Equal(second.Action, delivery.ActionSend) // IDEMPOTENT: resend
	is.Equal(second.Kind, service.ResultSent)    // SENT
	e.checkSeed("T1", id, e.push)                // [TIMEOUT, ACCEPTED_REPLAY]; the fake got 2 sends and sent 1 message; SENT
}

func TestT2QueryAfterTimeout(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "sms")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	e.sms.ScriptSend(e.ref(id), fakes.Step{Delay: fakeDelay})
	d := e.dispatcher(dcfg{timeout: clientTimeout})
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeTimeout) // first call times out
	second := runNext(t, d)
	is.Equal(second.Action, delivery.ActionQuery)      // QUERYABLE: query first
	e.checkSeed("T2", id, e.sms)                       // [TIMEOUT, QUERY_FOUND]; 1 outbound, no resend; SENT
	is.Equal(e.task(id).ProviderMsgID, "sms-msg-0001") // provider id written back from the query
}

func TestT3QueryFailsUntilBudgetThenManualResolve(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "sms")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	ref := e.ref(id)
	e.sms.ScriptSend(ref, fakes.Step{Delay: fakeDelay})
	e.sms.ScriptQuery(ref, fakes.Step{Status: 503}, fakes.Step{Status: 503})
	d := e.dispatcher(dcfg{timeout: clientTimeout})
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeTimeout) // accepted, then timed out
	is.Equal(runNext(t, d).Outcome, delivery.OutcomeQueryFailed)
	last := runNext(t, d)
	is.Equal(last.Kind, service.ResultParked) // budget used up: parked
	e.checkSeed("T3", id, e.sms)              // [TIMEOUT, QUERY_FAILED, QUERY_FAILED]; UNKNOWN, needs_review; 1 outbound
	task := e.task(id)
	is.True(task.NextAttemptAt == nil)                  // next_attempt_at NULL
	is.Equal(runOnce(t, d).Kind, service.ResultNothing) // no claim selects it again

	changed, err := e.n.ResolveManually(e.ctx, id, delivery.StateSent, "seen in the sms console", "ops-1")
	is.NoErr(err)
	is.True(changed) // the first resolution changes the task
	changed, err = e.n.ResolveManually(e.ctx, id, delivery.StateFailed, "second try", "ops-2")
	is.NoErr(err)
	is.True(!changed) // the second changes nothing (0 rows)
	task = e.task(id)
	is.Equal(task.State, delivery.StateSent) // the first word stands
	is.True(!task.NeedsReview)
	history := e.attempts(id)
	is.Equal(len(history), 4)                                // one MANUAL row appended, not two
	is.Equal(history[3].Outcome, delivery.OutcomeManualSent) // MANUAL_SENT
	is.Equal(history[3].Note, "seen in the sms console")     // with its note
	is.Equal(history[3].Worker, "ops-1")                     // and who decided
}

// TestNC2BlindResend is a negative control: a channel that does not dedupe (sms) configured as if it
// did, so a timeout is followed by a blind resend. The logical notification stays one; the user gets two.
func TestNC2BlindResend(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "sms")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	e.sms.ScriptSend(e.ref(id), fakes.Step{Delay: fakeDelay})
	d := e.dispatcher(dcfg{timeout: clientTimeout, modes: map[string]delivery.Mode{"sms": delivery.ModeIdempotent}})
	runOnce(t, d)
	is.Equal(runNext(t, d).Kind, service.ResultSent)
	is.Equal(e.scalar("SELECT count(*) FROM notification"), int64(1)) // 1 logical notification
	e.checkSeed("NC2", id, e.sms)                                     // [TIMEOUT, ACCEPTED]; SENT; damage: 2 outbounds
}

func TestF1RefusedBeforeAcceptance(t *testing.T) {
	t.Run("503 then retried", func(t *testing.T) {
		is := is.New(t)
		e := newEnv(t)
		e.w.User("u1", "push")
		id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
		e.push.ScriptSend(e.ref(id), fakes.Step{Status: 503})
		d := e.dispatcher(dcfg{})
		is.Equal(runOnce(t, d).Kind, service.ResultPending) // certainly not accepted: PENDING
		task := e.task(id)
		is.Equal(task.State, delivery.StatePending)
		is.True(task.NextAttemptAt != nil) // scheduled for a retry
		is.True(!task.OutcomeUncertain)    // nothing uncertain
		is.Equal(runNext(t, d).Kind, service.ResultSent)
		e.checkSeed("F1-503", id, e.push) // [HTTP_5XX, ACCEPTED]
	})
	t.Run("400 fails", func(t *testing.T) {
		is := is.New(t)
		e := newEnv(t)
		e.w.User("u1", "push")
		id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
		e.push.ScriptSend(e.ref(id), fakes.Step{Status: 400})
		d := e.dispatcher(dcfg{})
		is.Equal(runOnce(t, d).Kind, service.ResultFailed)  // FAILED
		e.checkSeed("F1-400", id, e.push)                   // [REJECTED]; nothing went out
		is.Equal(runOnce(t, d).Kind, service.ResultNothing) // not retried
	})
}

func TestB1NotSentWhenDisabledOrExpired(t *testing.T) {
	t.Run("preference disabled before claim", func(t *testing.T) {
		is := is.New(t)
		e := newEnv(t)
		e.w.User("u1", "push")
		id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
		_, err := e.n.SetPreference(e.ctx, "u1", "push", "u1@push", false)
		is.NoErr(err)
		res := runOnce(t, e.dispatcher(dcfg{}))
		is.Equal(res.Kind, service.ResultSuppressed) // SUPPRESSED
		e.checkSeed("B1-pref", id, e.push)           // [PREF_DISABLED]; no call made
		is.Equal(e.push.TotalSends(), 0)             // none at all
	})
	t.Run("expired before claim", func(t *testing.T) {
		is := is.New(t)
		e := newEnv(t)
		e.w.User("u1", "push")
		id := e.create("u1", "e1", 300*time.Millisecond, 3)[0].TaskID
		e.waitDB("(SELECT expires_at <= now() FROM notification)")
		res := runOnce(t, e.dispatcher(dcfg{}))
		is.Equal(res.Kind, service.ResultFailed) // FAILED
		e.checkSeed("B1-ttl", id, e.push)        // [TTL_EXPIRED]; no call made
		is.Equal(e.push.TotalSends(), 0)         // none at all
	})
}

func TestB2ExpiryAfterUncertainParks(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "sms")
	id := e.create("u1", "e1", 2*time.Second, 3)[0].TaskID
	ref := e.ref(id)
	e.sms.ScriptSend(ref, fakes.Step{Delay: fakeDelay})
	d := e.dispatcher(dcfg{timeout: clientTimeout, backoff: 2500 * time.Millisecond})
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeTimeout) // accepted, then timed out
	res := runNext(t, d)                                     // after the 2.5 s backoff the notification has expired
	is.Equal(res.Kind, service.ResultParked)
	e.checkSeed("B2", id, e.sms) // [TIMEOUT, TTL_EXPIRED_UNCERTAIN]; UNKNOWN (not FAILED), parked; no query or send after expiry
}

func TestB3RefusalAfterUncertainParks(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 2)[0].TaskID
	ref := e.ref(id)
	e.push.ScriptSend(ref, fakes.Step{Delay: fakeDelay}, fakes.Step{Status: 503})
	d := e.dispatcher(dcfg{timeout: clientTimeout})
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeTimeout)
	res := runNext(t, d)
	is.Equal(res.Outcome, delivery.OutcomeHTTP5xx)
	is.Equal(res.Kind, service.ResultParked) // budget used up with an uncertain history
	e.checkSeed("B3", id, e.push)            // UNKNOWN (not FAILED), parked; the first attempt did go out
}

// TestLeaseTakeover is P1's protocol in one process: a holder that never finishes is taken over after
// its lease; the new attempt is uncertain, resends with the same key, and the first attempt reads
// LEASE_EXPIRED.
func TestLeaseTakeover(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	a := e.dispatcher(dcfg{worker: "w-a", lease: time.Second})
	held, _, err := claimOne(e.ctx, a)
	is.NoErr(err)
	is.True(held != nil)
	is.Equal(a.Call(e.ctx, held).Outcome, delivery.OutcomeAccepted) // accepted; then the holder "dies"
	b := e.dispatcher(dcfg{worker: "w-b"})
	is.Equal(runOnce(t, b).Kind, service.ResultNothing) // during the lease, nobody else claims it
	e.waitDB("(SELECT lease_until < now() FROM delivery_task WHERE id = $1)", id)
	res := runOnce(t, b)
	is.Equal(res.Attempt, 2)                  // attempt 2
	is.Equal(res.Action, delivery.ActionSend) // IDEMPOTENT: resend with the same key
	is.Equal(res.Outcome, delivery.OutcomeAcceptedReplay)
	is.Equal(res.Kind, service.ResultSent)
	is.Equal(e.outcomes(id), outcomes(delivery.OutcomeLeaseExpired, delivery.OutcomeAcceptedReplay)) // attempt 1 reads LEASE_EXPIRED
	is.Equal(e.push.Outbound(e.ref(id)), 1)                                                          // one message
}

// TestNC3LateFinish is P2's protocol in one process, then the negative control: the late observation
// of a superseded holder is refused by the token guard (STALE, late_outcome); written with an id-only
// UPDATE it turns SENT back into UNKNOWN.
// supersededHolder plays P2's first half in one process: holder A claims a push task with a 1 s lease,
// its call is accepted and then times out after 1.5 s, past the lease; the lease has expired when it
// returns. A's attempt, observation and dispatcher are returned with the task and a dispatcher B.
func supersededHolder(t *testing.T) (e *env, id int64, a *dispatcher, held *service.Attempt, obs delivery.Observation, b *dispatcher) {
	is := is.New(t)
	is.Helper()
	e = newEnv(t)
	e.w.User("u1", "push")
	id = e.create("u1", "e1", time.Hour, 3)[0].TaskID
	e.push.ScriptSend(e.ref(id), fakes.Step{Hang: true})
	a = e.dispatcher(dcfg{worker: "w-p2-a", lease: time.Second, timeout: 1500 * time.Millisecond})
	held, _, err := claimOne(e.ctx, a)
	is.NoErr(err)
	obs = a.Call(e.ctx, held) // accepted, then no answer: times out after the lease ran out
	is.Equal(obs.Outcome, delivery.OutcomeTimeout)
	e.waitDB("(SELECT lease_until < now() FROM delivery_task WHERE id = $1)", id)
	return e, id, a, held, obs, e.dispatcher(dcfg{worker: "w-p2-b"})
}

func TestNC3LateFinish(t *testing.T) {
	is := is.New(t)
	e, id, a, held, obs, b := supersededHolder(t)
	is.Equal(runOnce(t, b).Kind, service.ResultSent) // B takes over and completes (ACCEPTED_REPLAY)

	late, err := finishOne(e.ctx, a, held, obs)
	is.NoErr(err)
	is.Equal(late.Kind, service.ResultStale)       // A's finish matches 0 rows: STALE
	is.Equal(e.task(id).State, delivery.StateSent) // the task stays SENT
	history := e.attempts(id)
	is.Equal(history[0].Outcome, delivery.OutcomeLeaseExpired) // A's attempt keeps its outcome
	is.Equal(history[0].LateOutcome, delivery.OutcomeTimeout)  // and the late observation is kept beside it

	// The unsafe finish, by id only: the token guard is what keeps it off the task. The state machine
	// (schema/003) refuses it too, SENT being final; the refusal names the row the UPDATE matched.
	const unsafeFinish = `UPDATE delivery_task SET state = 'UNKNOWN', outcome_uncertain = true, uncertain_since = now(),
		next_attempt_at = now() WHERE id = $1`
	_, err = e.pool.Exec(e.ctx, unsafeFinish, id)
	pgErr := secPgErr(err)
	is.True(pgErr != nil)                                                               // the id-only UPDATE matches the row ...
	is.True(strings.Contains(pgErr.Message, fmt.Sprintf("delivery_task %d: SENT", id))) // (the refusal names it)
	is.Equal(pgErr.ConstraintName, "delivery_task_final")                               // and the database refuses it
	is.Equal(e.task(id).State, delivery.StateSent)                                      // the task stays SENT

	e.withoutStateMachine(func() { // with the token guard alone in the way, and the guard left out
		tag, err := e.pool.Exec(e.ctx, unsafeFinish, id)
		is.NoErr(err)
		is.Equal(tag.RowsAffected(), int64(1)) // damage: 1 row
	})
	is.Equal(e.task(id).State, delivery.StateUnknown) // damage: SENT -> UNKNOWN
}

// TestNC3LateFinishWhileNewHolderSends is P2's harder variant: the superseded holder's finish lands
// while the new holder is still calling (the task is SENDING again, with the new holder's token). The
// state alone cannot tell the two holders apart here; only the token guard refuses the old one (STALE,
// late_outcome), and the new holder's finish then counts. Negative control: the finish guarded by state
// only (no token) matches the row, writes the old holder's TIMEOUT over the new holder's attempt, and the
// new holder's real acceptance is then the one refused.
func TestNC3LateFinishWhileNewHolderSends(t *testing.T) {
	for _, guarded := range []bool{true, false} {
		t.Run(map[bool]string{true: "token guard", false: "negative control: state only"}[guarded], func(t *testing.T) {
			is := is.New(t)
			e, id, a, heldA, obsA, b := supersededHolder(t)
			heldB, _, err := claimOne(e.ctx, b)
			is.NoErr(err)
			is.True(heldB != nil) // B holds the task now, and has not called yet

			if guarded {
				late, err := finishOne(e.ctx, a, heldA, obsA)
				is.NoErr(err)
				is.Equal(late.Kind, service.ResultStale) // A's token no longer holds: STALE
				task := e.task(id)
				is.Equal(task.State, delivery.StateSending) // still B's
				is.Equal(task.LeaseOwner, "w-p2-b")         // with B's lease
				is.Equal(e.attempts(id)[0].LateOutcome, delivery.OutcomeTimeout)
				res, err := finishOne(e.ctx, b, heldB, b.Call(e.ctx, heldB))
				is.NoErr(err)
				is.Equal(res.Kind, service.ResultSent) // B's finish counts
				is.Equal(res.Outcome, delivery.OutcomeAcceptedReplay)
				is.Equal(e.task(id).State, delivery.StateSent)
				return
			}
			// The finish without its token: the state check alone, as River fences its finish, writing A's
			// TIMEOUT as TaskFinish would. The database's state machine (schema/003) lets it pass: SENDING ->
			// UNKNOWN is a finish, and nothing in the row says which holder speaks. Only the token can.
			tag, err := e.pool.Exec(e.ctx, `UPDATE delivery_task SET state = 'UNKNOWN', outcome_uncertain = true,
				uncertain_since = coalesce(uncertain_since, updated_at), next_attempt_at = now() + interval '1 hour',
				lease_owner = NULL, lease_until = NULL
				WHERE id = $1 AND state = 'SENDING'`, id)
			is.NoErr(err)
			is.Equal(tag.RowsAffected(), int64(1))            // damage: A's stale observation matches B's row
			is.Equal(e.task(id).State, delivery.StateUnknown) // damage: B's holding is overwritten
			res, err := finishOne(e.ctx, b, heldB, b.Call(e.ctx, heldB))
			is.NoErr(err)
			is.Equal(res.Outcome, delivery.OutcomeAcceptedReplay) // B's call was accepted
			is.Equal(res.Kind, service.ResultStale)               // damage: yet B's finish is the one refused
			is.Equal(e.task(id).State, delivery.StateUnknown)     // and the task does not say SENT
		})
	}
}

func TestNoneChannelTimeoutParksAtOnce(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "none")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	e.none.ScriptSend(e.ref(id), fakes.Step{Delay: fakeDelay})
	d := e.dispatcher(dcfg{timeout: clientTimeout})
	res := runOnce(t, d)
	is.Equal(res.Kind, service.ResultParked) // parked on the first uncertain attempt, budget left or not
	task := e.task(id)
	is.True(task.NeedsReview && task.State == delivery.StateUnknown)
	is.Equal(runOnce(t, d).Kind, service.ResultNothing) // never called again automatically
	is.Equal(e.none.Outbound(e.ref(id)), 1)             // 1 outbound
}

func TestUncertainResponsesNeverFail(t *testing.T) {
	for name, step := range map[string]fakes.Step{
		"409 in flight": {Status: 409},
		"malformed 2xx": {Malformed: true},
		"broken body":   {SlowBody: 2 * time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			e.w.User("u1", "push")
			id := e.create("u1", "e1", time.Hour, 1)
			e.push.ScriptSend(e.ref(id[0].TaskID), step)
			res := runOnce(t, e.dispatcher(dcfg{timeout: clientTimeout}))
			is.Equal(res.Kind, service.ResultParked) // budget of 1 used up, outcome unknown: parked, never FAILED
			task := e.task(id[0].TaskID)
			is.Equal(task.State, delivery.StateUnknown) // UNKNOWN
			is.True(task.OutcomeUncertain)
		})
	}
}

func TestConcurrentResolveHasOneWinner(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "none")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	e.none.ScriptSend(e.ref(id), fakes.Step{Delay: fakeDelay})
	is.Equal(runOnce(t, e.dispatcher(dcfg{timeout: clientTimeout})).Kind, service.ResultParked)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		wins  int
		start = make(chan struct{})
	)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			state := []delivery.State{delivery.StateSent, delivery.StateFailed}[i%2]
			changed, err := e.n.ResolveManually(e.ctx, id, state, "checked", "ops")
			if err != nil {
				t.Error(err)
			}
			if changed {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	is.Equal(wins, 1)                                                                             // exactly one resolution wins
	is.Equal(e.scalar("SELECT count(*) FROM delivery_attempt WHERE action = 'MANUAL'"), int64(1)) // one MANUAL row
}
