package service_test

// The database's own defences, proven to bite:
//   - delivery_attempt is append-only (schema/003_state_machine.sql, R3): whatever the writer, a
//     recorded observation is never rewritten, and only the finished history of a terminal task may be
//     deleted;
//   - least privilege (schema/002_roles_and_row_security.sql): notifier_creator, notifier_worker and notifier_operator
//     can each run their own commands and nothing else; row-level security keeps parked tasks away from
//     workers and everything but parked tasks away from operators.
// Role tests run the real service code on pools whose every connection did SET ROLE.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
)

const (
	sqlIntegrity    = "23000" // integrity_constraint_violation: raised by the append-only triggers
	sqlInsufficient = "42501" // insufficient_privilege: no grant, or a row-level security WITH CHECK
)

// secPgErr returns the PostgreSQL error in err, or nil.
func secPgErr(err error) *pgconn.PgError {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr
	}
	return nil
}

// secExec runs one statement on pool and returns its error, if any, as a *pgconn.PgError (nil when it
// succeeded; the test fails on any other kind of error).
func secExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) (int64, *pgconn.PgError) {
	t.Helper()
	tag, err := pool.Exec(context.Background(), sql, args...)
	if err == nil {
		return tag.RowsAffected(), nil
	}
	pgErr := secPgErr(err)
	if pgErr == nil {
		t.Fatalf("%s: not a PostgreSQL error: %v", sql, err)
	}
	return 0, pgErr
}

// secAppendOnly asserts that the statement is rejected by delivery_attempt_append_only on column col.
func secAppendOnly(t *testing.T, pool *pgxpool.Pool, col, sql string, args ...any) {
	t.Helper()
	is := is.NewRelaxed(t)
	_, pgErr := secExec(t, pool, sql, args...)
	if pgErr == nil {
		t.Errorf("%s: accepted, want rejected by delivery_attempt_append_only", sql)
		return
	}
	t.Logf("rejected: %s (%s) column=%s", pgErr.Message, pgErr.Code, pgErr.ColumnName)
	is.Equal(pgErr.Code, sqlIntegrity)                             // integrity_constraint_violation
	is.Equal(pgErr.ConstraintName, "delivery_attempt_append_only") // named after the trigger
	is.Equal(pgErr.ColumnName, col)                                // names the column it protects
	is.Equal(pgErr.TableName, "delivery_attempt")                  // and the table
}

// secRetentionOnly asserts that the statement is rejected by delivery_attempt_retention_only.
func secRetentionOnly(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	is := is.NewRelaxed(t)
	_, pgErr := secExec(t, pool, sql, args...)
	if pgErr == nil {
		t.Errorf("%s: accepted, want rejected by delivery_attempt_retention_only", sql)
		return
	}
	t.Logf("rejected: %s (%s)", pgErr.Message, pgErr.Code)
	is.Equal(pgErr.Code, sqlIntegrity)                                // integrity_constraint_violation
	is.Equal(pgErr.ConstraintName, "delivery_attempt_retention_only") // named after the trigger
}

// secDenied asserts that the statement fails with insufficient_privilege (no grant, or a row-level
// security policy's WITH CHECK).
func secDenied(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, pgErr := secExec(t, pool, sql, args...)
	if pgErr == nil {
		t.Errorf("%s: accepted, want insufficient_privilege", sql)
		return
	}
	if pgErr.Code != sqlInsufficient {
		t.Errorf("%s: %s (%s), want insufficient_privilege (42501)", sql, pgErr.Message, pgErr.Code)
		return
	}
	t.Logf("denied: %s", pgErr.Message)
}

// secNoRows asserts that the statement succeeds and changes nothing (row-level security hides the rows).
func secNoRows(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	n, pgErr := secExec(t, pool, sql, args...)
	if pgErr != nil {
		t.Errorf("%s: %s (%s), want 0 rows", sql, pgErr.Message, pgErr.Code)
		return
	}
	if n != 0 {
		t.Errorf("%s: %d rows changed, want 0", sql, n)
	}
}

// secCreatorDenied runs a task insert the way Create does, in the transaction that inserted its
// notification ($1, a fresh one of user u1), and asserts that it fails with insufficient_privilege.
// Nothing is kept.
func secCreatorDenied(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO notification (user_id, event_key, body, expires_at)
		VALUES ('u1', 'denied-' || gen_random_uuid(), 'b', now() + interval '1 hour') RETURNING id`).Scan(&id); err != nil {
		t.Fatalf("the notification of %s: %v", sql, err)
	}
	_, err = tx.Exec(ctx, sql, id)
	pgErr := secPgErr(err)
	switch {
	case pgErr == nil:
		t.Errorf("%s: %v, want insufficient_privilege", sql, err)
	case pgErr.Code != sqlInsufficient:
		t.Errorf("%s: %s (%s), want insufficient_privilege (42501)", sql, pgErr.Message, pgErr.Code)
	default:
		t.Logf("denied: %s", pgErr.Message)
	}
}

// secRolePool is a pool on e's database whose every connection runs as role (SET ROLE right after
// connecting, so every statement of the service code is checked against that role's privileges and
// policies). Closed before the database is dropped.
func secRolePool(t *testing.T, e *env, role string) *pgxpool.Pool {
	t.Helper()
	var canAssume bool
	if err := e.pool.QueryRow(e.ctx, `SELECT pg_has_role(current_user, $1, 'MEMBER')`, role).Scan(&canAssume); err != nil {
		t.Fatalf("role %s: %v (does schema/002_roles_and_row_security.sql create it?)", role, err)
	}
	if !canAssume {
		t.Skipf("the test database user may not SET ROLE %s (not a superuser nor a member of it)", role)
	}
	cfg := e.pool.Config()
	cfg.MaxConns = 4
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+pgx.Identifier{role}.Sanitize())
		return err
	}
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var user string
	var super bool
	if err := pool.QueryRow(e.ctx, `SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&user, &super); err != nil {
		t.Fatal(err)
	}
	if user != role || super {
		t.Fatalf("pool runs as %s (superuser %v), want %s without superuser", user, super, role)
	}
	return pool
}

// secDispatcher is e.dispatcher on another pool (e.g. one running as notifier_worker); runOnce runs it
// per task or batched, as the seed tests run.
func secDispatcher(t *testing.T, e *env, pool *pgxpool.Pool, c dcfg) *dispatcher {
	t.Helper()
	if c.worker == "" {
		c.worker = "w-sec"
	}
	return e.dispatcherOn(pool, c)
}

// secParked makes a task parked for review: the none channel answers 409 (still in flight), which is
// uncertain, and a channel without idempotency key or query parks at the first uncertain attempt.
func secParked(t *testing.T, e *env, user, key string) int64 {
	t.Helper()
	is := is.New(t)
	if _, err := e.n.SetPreference(e.ctx, user, "none", user+"@none", true); err != nil {
		t.Fatal(err)
	}
	id := e.create(user, key, time.Hour, 3)[0].TaskID
	e.none.ScriptSend(e.ref(id), fakes.Step{Status: 409})
	is.Equal(runOnce(t, e.dispatcher(dcfg{})).Kind, service.ResultParked) // 409 on a NONE channel: parked
	task := e.task(id)
	is.True(task.State == delivery.StateUnknown && task.NeedsReview) // UNKNOWN, waiting for a human
	return id
}

// ---- append-only attempts (R3) ----

func TestAttemptOutcomeCannotBeRewritten(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	is.Equal(runOnce(t, e.dispatcher(dcfg{})).Kind, service.ResultSent) // a real delivery
	before := e.attempts(id)
	is.Equal(len(before), 1)
	is.Equal(before[0].Outcome, delivery.OutcomeAccepted) // recorded by AttemptFinish through the trigger
	is.True(before[0].ProviderMsgID != "")

	const where = ` WHERE task_id = $1`
	secAppendOnly(t, e.pool, "outcome", `UPDATE delivery_attempt SET outcome = 'TIMEOUT'`+where, id)
	secAppendOnly(t, e.pool, "outcome", `UPDATE delivery_attempt SET outcome = NULL, finished_at = NULL`+where, id)
	secAppendOnly(t, e.pool, "finished_at", `UPDATE delivery_attempt SET finished_at = now() + interval '1 hour'`+where, id)
	secAppendOnly(t, e.pool, "provider_msg_id", `UPDATE delivery_attempt SET provider_msg_id = 'forged'`+where, id)
	secAppendOnly(t, e.pool, "provider_msg_id", `UPDATE delivery_attempt SET provider_msg_id = NULL`+where, id)
	secAppendOnly(t, e.pool, "error", `UPDATE delivery_attempt SET error = 'added afterwards'`+where, id)
	other := e.create("u1", "e2", time.Hour, 3)[0].TaskID // an existing task to move the attempt to
	secAppendOnly(t, e.pool, "task_id", `UPDATE delivery_attempt SET task_id = $2`+where, id, other)
	for col, set := range map[string]string{
		"attempt_no":    `attempt_no = 2`,
		"attempt_token": `attempt_token = gen_random_uuid()`,
		"action":        `action = 'QUERY'`,
		"worker":        `worker = 'someone-else'`,
		"started_at":    `started_at = started_at - interval '1 second'`,
	} {
		secAppendOnly(t, e.pool, col, `UPDATE delivery_attempt SET `+set+where, id)
	}
	// id is GENERATED ALWAYS: PostgreSQL itself refuses to change it, before any trigger.
	_, pgErr := secExec(t, e.pool, `UPDATE delivery_attempt SET id = id + 1000`+where, id)
	is.True(pgErr != nil)            // the attempt's id never changes either
	is.Equal(e.attempts(id), before) // nothing changed

	// A note may be added once (an audit remark), never rewritten.
	n, pgErr := secExec(t, e.pool, `UPDATE delivery_attempt SET note = 'audited'`+where, id)
	is.True(pgErr == nil)                                                                                 // the first note is accepted
	is.Equal(n, int64(1))                                                                                 // on the one attempt
	secAppendOnly(t, e.pool, "note", `UPDATE delivery_attempt SET note = 'rewritten'`+where, id)          // a second is not
	secAppendOnly(t, e.pool, "note", `UPDATE delivery_attempt SET note = NULL`+where, id)                 // nor is erasing it
	n, pgErr = secExec(t, e.pool, `UPDATE delivery_attempt SET note = note, outcome = outcome`+where, id) // a no-op update
	is.True(pgErr == nil)                                                                                 // changes nothing and is allowed
	is.Equal(n, int64(1))
}

// The protocol's own updates (AttemptMarkLeaseExpired, AttemptRecordLate) pass the trigger; the late
// observation they keep cannot be rewritten afterwards.
func TestAttemptLateOutcomeIsWrittenOnce(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	a := e.dispatcher(dcfg{worker: "w-a", lease: 500 * time.Millisecond})
	held, _, err := claimOne(e.ctx, a)
	is.NoErr(err)
	is.True(held != nil) // A holds the task and stalls
	e.waitDB("(SELECT lease_until < now() FROM delivery_task WHERE id = $1)", id)
	is.Equal(runOnce(t, e.dispatcher(dcfg{worker: "w-b"})).Kind, service.ResultSent) // B takes over and sends
	late, err := finishOne(e.ctx, a, held, delivery.Observation{Outcome: delivery.OutcomeTimeout, ProviderMsgID: "late-id", Detail: "late"})
	is.NoErr(err)
	is.Equal(late.Kind, service.ResultStale) // A's observation goes to late_outcome
	history := e.attempts(id)
	is.Equal(history[0].Outcome, delivery.OutcomeLeaseExpired) // written by AttemptMarkLeaseExpired
	is.Equal(history[0].LateOutcome, delivery.OutcomeTimeout)  // written by AttemptRecordLate
	is.Equal(history[0].ProviderMsgID, "late-id")              // filled from NULL with the late outcome

	const where = ` WHERE task_id = $1 AND attempt_no = 1`
	secAppendOnly(t, e.pool, "late_outcome", `UPDATE delivery_attempt SET late_outcome = 'ACCEPTED'`+where, id)
	secAppendOnly(t, e.pool, "late_outcome", `UPDATE delivery_attempt SET late_outcome = NULL, late_at = NULL`+where, id)
	secAppendOnly(t, e.pool, "late_at", `UPDATE delivery_attempt SET late_at = now()`+where, id)
	secAppendOnly(t, e.pool, "outcome", `UPDATE delivery_attempt SET outcome = 'ACCEPTED'`+where, id)
	secAppendOnly(t, e.pool, "error", `UPDATE delivery_attempt SET error = 'other'`+where, id) // set by the lease expiry
	is.Equal(e.attempts(id), history)                                                          // nothing changed

	// The token-guarded queries themselves still refuse a second write (0 rows, not an error).
	late, err = finishOne(e.ctx, a, held, delivery.Observation{Outcome: delivery.OutcomeAccepted})
	is.NoErr(err)
	is.Equal(late.Kind, service.ResultStale) // STALE again
	is.Equal(e.attempts(id), history)        // and the first late observation stands
}

func TestAttemptDeleteOnlyForTerminalTasks(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	const del = `DELETE FROM delivery_attempt WHERE task_id = $1`

	// Parked (UNKNOWN, needs_review): its history is the operator's only evidence.
	parked := secParked(t, e, "u2", "e2")
	secRetentionOnly(t, e.pool, del, parked)

	e.w.User("u1", "push", "sms")
	byChannel := map[string]int64{}
	for _, tk := range e.create("u1", "e1", time.Hour, 3) {
		byChannel[tk.Channel] = tk.TaskID
	}

	// UNKNOWN waiting for a retry: push answers 409 (in flight) and has budget left.
	e.push.ScriptSend(e.ref(byChannel["push"]), fakes.Step{Status: 409})
	e.sms.ScriptSend(e.ref(byChannel["sms"]), fakes.Step{Status: 503})
	d := e.dispatcher(dcfg{backoff: time.Hour})
	kinds := map[service.ResultKind]bool{runOnce(t, d).Kind: true, runOnce(t, d).Kind: true}
	is.Equal(kinds, map[service.ResultKind]bool{service.ResultUnknown: true, service.ResultPending: true}) // one UNKNOWN, one PENDING
	secRetentionOnly(t, e.pool, del, byChannel["push"])                                                    // UNKNOWN: uncertain history kept
	secRetentionOnly(t, e.pool, del, byChannel["sms"])                                                     // PENDING: not finished

	// SENDING: a holder's open attempt.
	e.w.User("u3", "push")
	sending := e.create("u3", "e3", time.Hour, 3)[0].TaskID
	held, _, err := claimOne(e.ctx, e.dispatcher(dcfg{}))
	is.NoErr(err)
	is.Equal(held.TaskID, sending) // the new task is claimed
	secRetentionOnly(t, e.pool, del, sending)

	// TRUNCATE fires no row trigger: it is refused as a whole.
	secRetentionOnly(t, e.pool, `TRUNCATE delivery_attempt`)
	secRetentionOnly(t, e.pool, `TRUNCATE delivery_attempt, delivery_task, delivery_receipt, delivery_task_key, delivery_task_provider_msg`) // (these reference tasks)
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_attempt`), int64(4))                                                                    // every attempt still there

	// SENT: retention may prune the finished history.
	e.w.User("u4", "push")
	sent := e.create("u4", "e4", time.Hour, 3)[0].TaskID
	is.Equal(runOnce(t, e.dispatcher(dcfg{})).Kind, service.ResultSent)
	n, pgErr := secExec(t, e.pool, del, sent)
	is.True(pgErr == nil) // the attempts of a SENT task can be deleted
	is.Equal(n, int64(1))

	// FAILED after a resolution: the parked task's history, MANUAL row included, may go now.
	changed, err := e.n.ResolveManually(e.ctx, parked, delivery.StateFailed, "the channel never saw it", "ops")
	is.NoErr(err)
	is.True(changed)
	n, pgErr = secExec(t, e.pool, del, parked)
	is.True(pgErr == nil) // a resolved task's attempts can be deleted
	is.Equal(n, int64(2)) // the 409 attempt and the MANUAL row
}

// ---- least privilege (roles and row-level security) ----

var secTables = []string{"channel_pref", "notification", "delivery_task", "delivery_attempt", "channel_rate_limit", "delivery_task_key",
	"delivery_task_provider_msg"}

// Every role: no DELETE nor TRUNCATE anywhere (retention will get a role of its own).
func TestRolesCannotDelete(t *testing.T) {
	e := newEnv(t)
	secParked(t, e, "u1", "e1") // one row in every table
	_, err := e.pool.Exec(e.ctx, `INSERT INTO channel_rate_limit (channel, rate, burst, tokens) VALUES ('none', 1, 1, 1)`)
	is.New(t).NoErr(err) // and a rate limit
	for _, role := range []string{"notifier_creator", "notifier_worker", "notifier_operator"} {
		pool := secRolePool(t, e, role)
		for _, table := range secTables {
			secDenied(t, pool, `DELETE FROM `+table)
			secDenied(t, pool, `TRUNCATE `+table)
		}
	}
	is.New(t).Equal(e.scalar(`SELECT count(*) FROM delivery_attempt`), int64(1))   // nothing was deleted
	is.New(t).Equal(e.scalar(`SELECT count(*) FROM channel_rate_limit`), int64(1)) // not even a rate limit
}

// Rate limits (schema/001): the worker runs every move on the buckets (configure, peek, take, pause) and
// nothing else: it cannot rename one, set a column the moves do not set, or delete one (lifting a limit
// is the owner's); the operator reads them (status) and cannot write; the creator cannot even read.
func TestRateLimitRoles(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	worker := secRolePool(t, e, "notifier_worker")
	e.w.User("u1", "push")
	for i := range 3 {
		e.create("u1", fmt.Sprintf("e%d", i), time.Hour, 3)
	}
	client, err := httpchannel.New(e.push.URL(), httpchannel.Options{})
	is.NoErr(err)
	var paused []error
	d, err := service.NewDispatcher(e.ctx, worker, service.DispatcherConfig{Worker: "w-rate",
		Routes: map[string]delivery.Route{"push": {Mode: delivery.ModeIdempotent, Client: client,
			RateLimit: delivery.RateLimit{PerSecond: delivery.MaxRate, Burst: 2}}},
		Observer: testObserver{ratePaused: func(p service.RatePauseEvent) { paused = append(paused, p.Err) }}})
	is.NoErr(err)                 // NewDispatcher: RateLimitConfigure (insert) and RateLimitList as the worker
	is.Equal(len(d.Buckets()), 1) // its bucket
	buckets, err := d.ConfigureRateLimits(e.ctx)
	is.NoErr(err)             // and again: the ON CONFLICT update
	is.Equal(len(buckets), 1) // the same bucket
	e.push.ScriptAll(fakes.Step{Status: 429, RetryAfter: "1"})
	attempts, _, err := d.ClaimBatch(e.ctx, 10)
	is.NoErr(err)              // RateLimitPeek and RateLimitTake as the worker
	is.Equal(len(attempts), 2) // the burst
	_, err = d.FinishBatch(e.ctx, attempts, callAll(e.ctx, d, attempts))
	is.NoErr(err)
	is.Equal(paused, []error{nil})          // RateLimitPause as the worker
	is.True(e.bucket("push").pausedFor > 0) // paused

	secDenied(t, worker, `UPDATE channel_rate_limit SET channel = 'sms'`)                                                              // no renaming
	secDenied(t, worker, `INSERT INTO channel_rate_limit (channel, rate, burst, tokens, paused_until) VALUES ('sms', 1, 1, 1, now())`) // only the columns RateLimitConfigure sets
	secDenied(t, worker, `DELETE FROM channel_rate_limit`)                                                                             // no lifting a limit
	operator := secRolePool(t, e, "notifier_operator")
	st, err := service.NewNotifier(operator).Status(e.ctx)
	is.NoErr(err)                   // status as the operator
	is.Equal(len(st.RateLimits), 1) // shows the bucket
	is.Equal(st.RateLimits[0].Channel, "push")
	is.True(st.RateLimits[0].PausedFor > 0)
	secDenied(t, operator, `UPDATE channel_rate_limit SET tokens = 0`)
	secDenied(t, operator, `INSERT INTO channel_rate_limit (channel, rate, burst, tokens) VALUES ('sms', 1, 1, 1)`)
	creator := secRolePool(t, e, "notifier_creator")
	secDenied(t, creator, `SELECT * FROM channel_rate_limit`)
	secDenied(t, creator, `INSERT INTO channel_rate_limit (channel, rate, burst, tokens) VALUES ('sms', 1, 1, 1)`)
	is.Equal(e.scalar(`SELECT count(*) FROM channel_rate_limit`), int64(1)) // nothing else was written
}

// The worker runs claim/call/finish in every variant: send, lease takeover, stale finish, claim-time
// settle (SUPPRESSED), claim-time park and finish-time park.
func TestWorkerRoleRunsTheProtocol(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	worker := secRolePool(t, e, "notifier_worker")
	e.w.User("u1", "push")

	// A plain delivery.
	sent := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	d := secDispatcher(t, e, worker, dcfg{})
	is.Equal(runOnce(t, d).Kind, service.ResultSent) // the worker role delivers
	is.Equal(e.task(sent).State, delivery.StateSent) // SENT

	// Lease takeover and a superseded holder's late finish.
	taken := e.create("u1", "e2", time.Hour, 3)[0].TaskID
	a := secDispatcher(t, e, worker, dcfg{worker: "w-a", lease: 500 * time.Millisecond})
	held, _, err := claimOne(e.ctx, a)
	is.NoErr(err)
	is.Equal(held.TaskID, taken)
	e.waitDB("(SELECT lease_until < now() FROM delivery_task WHERE id = $1)", taken)
	is.Equal(runOnce(t, secDispatcher(t, e, worker, dcfg{worker: "w-b"})).Kind, service.ResultSent) // AttemptMarkLeaseExpired
	res, err := finishOne(e.ctx, a, held, delivery.Observation{Outcome: delivery.OutcomeTimeout})
	is.NoErr(err)
	is.Equal(res.Kind, service.ResultStale) // AttemptRecordLate
	history := e.attempts(taken)
	is.Equal(history[0].Outcome, delivery.OutcomeLeaseExpired)
	is.Equal(history[0].LateOutcome, delivery.OutcomeTimeout)

	// Claim-time park: the lease of the last budgeted attempt expired (TaskPark).
	parkedAtClaim := e.create("u1", "e3", time.Hour, 1)[0].TaskID
	held, _, err = claimOne(e.ctx, a)
	is.NoErr(err)
	is.Equal(held.TaskID, parkedAtClaim)
	e.waitDB("(SELECT lease_until < now() FROM delivery_task WHERE id = $1)", parkedAtClaim)
	is.Equal(runOnce(t, d).Kind, service.ResultParked) // budget used up, outcome unknown: parked at claim
	is.True(e.task(parkedAtClaim).NeedsReview)

	// Finish-time park: a 409 on a NONE channel (TaskFinish with needs_review).
	e.w.User("u2", "none")
	parkedAtFinish := e.create("u2", "e4", time.Hour, 3)[0].TaskID
	e.none.ScriptSend(e.ref(parkedAtFinish), fakes.Step{Status: 409})
	is.Equal(runOnce(t, d).Kind, service.ResultParked)
	is.True(e.task(parkedAtFinish).NeedsReview)

	// Claim-time settle: the user disabled the channel (TaskSettleWithoutCall, AttemptRecordSkip).
	suppressed := e.create("u1", "e5", time.Hour, 3)[0].TaskID
	_, err = e.n.SetPreference(e.ctx, "u1", "push", "u1@push", false)
	is.NoErr(err)
	is.Equal(runOnce(t, d).Kind, service.ResultSuppressed)
	is.Equal(e.outcomes(suppressed), outcomes(delivery.OutcomePrefDisabled))
	is.Equal(runOnce(t, d).Kind, service.ResultNothing) // parked tasks are never claimed again
}

// The worker cannot resolve a parked task, nor forge a resolution by hand.
func TestWorkerRoleCannotResolve(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	id := secParked(t, e, "u1", "e1")
	worker := secRolePool(t, e, "notifier_worker")
	before := e.task(id)

	changed, err := service.NewNotifier(worker).ResolveManually(e.ctx, id, delivery.StateSent, "I think it went out", "w-1")
	is.True(errors.Is(err, service.ErrPermission)) // resolving is the operator's: notifier_resolve (schema/003)
	is.True(secPgErr(err) != nil)                  // the database refused it
	is.Equal(secPgErr(err).Code, sqlInsufficient)  // permission denied for function notifier_resolve
	is.True(!changed)                              // so nothing is resolved
	task := e.task(id)
	is.Equal(task.State, delivery.StateUnknown) // still UNKNOWN
	is.True(task.NeedsReview)                   // still parked
	is.Equal(task.UpdatedAt, before.UpdatedAt)  // untouched
	is.Equal(len(e.attempts(id)), 1)            // no MANUAL row

	secNoRows(t, worker, `UPDATE delivery_task SET state = 'SENT', needs_review = false WHERE id = $1`, id)
	secNoRows(t, worker, `UPDATE delivery_task SET state = 'UNKNOWN', needs_review = false, next_attempt_at = now() WHERE id = $1`, id)
	secNoRows(t, worker, `SELECT id FROM delivery_task WHERE id = $1 FOR UPDATE`, id) // cannot even lock it
	secDenied(t, worker, `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome, note)
		VALUES ($1, 2, gen_random_uuid(), 'MANUAL', 'w-1', now(), 'MANUAL_SENT', 'forged')`, id) // no note column, no MANUAL row
	secDenied(t, worker, `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome)
		VALUES ($1, 2, gen_random_uuid(), 'MANUAL', 'w-1', now(), 'MANUAL_SENT')`, id) // policy: SEND, QUERY, SKIP only
	// Column privileges: a worker cannot re-target a task or raise its budget.
	secDenied(t, worker, `UPDATE delivery_task SET max_attempts = 100 WHERE id = $1`, id)
	secDenied(t, worker, `UPDATE delivery_task SET channel = 'push' WHERE id = $1`, id)
	secDenied(t, worker, `UPDATE notification SET expires_at = now() + interval '1 day'`)
	secDenied(t, worker, `UPDATE channel_pref SET enabled = true`)
	is.Equal(e.task(id), task) // the parked task is exactly as it was
}

func TestCreatorRoleCreatesOnly(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	creator := secRolePool(t, e, "notifier_creator")
	n := service.NewNotifier(creator)

	pref, err := n.SetPreference(e.ctx, "u1", "push", "u1@push", true)
	is.NoErr(err) // notifier pref set
	is.Equal(pref.Version, int64(1))
	_, err = n.SetPreference(e.ctx, "u1", "sms", "u1@sms", true)
	is.NoErr(err)
	pref, err = n.SetPreference(e.ctx, "u1", "sms", "u1@sms2", true)
	is.NoErr(err)                    // the upsert's DO UPDATE path
	is.Equal(pref.Version, int64(2)) // version counted up

	id, created, tasks, err := n.Create(e.ctx, service.CreateRequest{UserID: "u1", EventKey: "e1", Body: "hello", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)    // notifier create
	is.True(created) // the first submission creates
	is.Equal(len(tasks), 2)
	id2, created, tasks2, err := n.Create(e.ctx, service.CreateRequest{UserID: "u1", EventKey: "e1", Body: "hello again", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)           // a duplicate reads the winner back
	is.True(!created)       // and creates nothing
	is.Equal(id2, id)       // same notification
	is.Equal(tasks2, tasks) // same tasks
	for _, tk := range tasks {
		is.Equal(e.task(tk.TaskID).State, delivery.StatePending) // created PENDING
	}
	task := tasks[0].TaskID

	// delivery_task: insert through TaskInsertForEnabledPrefs only; no update, no delete, no settled task.
	secDenied(t, creator, `UPDATE delivery_task SET state = 'SENT', next_attempt_at = NULL WHERE id = $1`, task)
	secDenied(t, creator, `UPDATE delivery_task SET max_attempts = 100 WHERE id = $1`, task)
	secDenied(t, creator, `DELETE FROM delivery_task WHERE id = $1`, task)
	// Each insert below runs, as it must (schema/003), in the transaction that inserted its notification.
	secCreatorDenied(t, creator, `INSERT INTO delivery_task (notification_id, channel, max_attempts, state, next_attempt_at)
		VALUES ($1, 'push', 3, 'SENT', NULL)`)
	secCreatorDenied(t, creator, `INSERT INTO delivery_task (notification_id, channel, max_attempts, attempt_count)
		VALUES ($1, 'push', 3, 2)`)
	// Behind the column privileges, row-level security holds on its own: even a creator that was granted
	// the state and attempt_count columns (in this test database only) creates PENDING tasks only.
	_, err = e.pool.Exec(e.ctx, `GRANT INSERT (state, attempt_count) ON delivery_task TO notifier_creator`)
	is.NoErr(err)
	secCreatorDenied(t, creator, `INSERT INTO delivery_task (notification_id, channel, max_attempts, state)
		VALUES ($1, 'push', 3, 'SENT')`)
	secCreatorDenied(t, creator, `INSERT INTO delivery_task (notification_id, channel, max_attempts, attempt_count)
		VALUES ($1, 'push', 3, 2)`)
	tx, err := creator.Begin(e.ctx)
	is.NoErr(err)
	var fresh int64
	is.NoErr(tx.QueryRow(e.ctx, `INSERT INTO notification (user_id, event_key, body, expires_at)
		VALUES ('u1', 'e-own', 'b', now() + interval '1 hour') RETURNING id`).Scan(&fresh)) // this transaction's notification
	tag, err := tx.Exec(e.ctx, `INSERT INTO delivery_task (notification_id, channel, max_attempts, state, attempt_count)
		VALUES ($1, 'push', 3, 'PENDING', 0)`, fresh)
	is.NoErr(err)                          // a PENDING task with no attempt passes the policy
	is.Equal(tag.RowsAffected(), int64(1)) // one task
	is.NoErr(tx.Commit(e.ctx))
	_, err = e.pool.Exec(e.ctx, `REVOKE INSERT (state, attempt_count) ON delivery_task FROM notifier_creator`)
	is.NoErr(err)

	// delivery_attempt: no access at all.
	secDenied(t, creator, `SELECT count(*) FROM delivery_attempt`)
	secDenied(t, creator, `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
		VALUES ($1, 1, gen_random_uuid(), 'SEND', 'c')`, task)
	secDenied(t, creator, `UPDATE delivery_attempt SET note = 'x'`)
	secDenied(t, creator, `DELETE FROM delivery_attempt`)
	// notification: created, never rewritten.
	secDenied(t, creator, `UPDATE notification SET body = 'changed' WHERE id = $1`, id)
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_attempt`), int64(0)) // nothing was written by the denied statements
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task`), int64(3))    // the two of Create and the PENDING one above
}

func TestOperatorRoleResolvesParkedOnly(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	parked := secParked(t, e, "u1", "e1")
	e.w.User("u2", "push")
	pending := e.create("u2", "e2", time.Hour, 3)[0].TaskID
	operator := secRolePool(t, e, "notifier_operator")
	n := service.NewNotifier(operator)

	// notifier review and status.
	list, err := n.Review(e.ctx, 0, 10)
	is.NoErr(err)                      // notifier review
	is.Equal(len(list), 1)             // the parked task
	is.Equal(list[0].ID, parked)       // with its id
	is.Equal(len(list[0].Attempts), 1) // and its history
	st, err := n.Status(e.ctx)
	is.NoErr(err) // notifier status
	is.Equal(st.Parked, int64(1))

	// A task that is not parked is out of reach.
	changed, err := n.ResolveManually(e.ctx, pending, delivery.StateFailed, "not mine", "ops")
	is.NoErr(err)
	is.True(!changed)                                                                          // a PENDING task is not resolved
	secDenied(t, operator, `UPDATE delivery_task SET state = 'FAILED' WHERE id = $1`, pending) // no UPDATE at all (schema/003)
	is.Equal(e.task(pending).State, delivery.StatePending)

	// A parked task may only be resolved to SENT or FAILED.
	secDenied(t, operator, `UPDATE delivery_task SET attempt_count = attempt_count + 1 WHERE id = $1`, parked) // stays parked: WITH CHECK
	secDenied(t, operator, `UPDATE delivery_task SET needs_review = false, state = 'PENDING' WHERE id = $1`, parked)
	secDenied(t, operator, `UPDATE delivery_task SET next_attempt_at = now() WHERE id = $1`, parked) // no such column privilege
	// Attempts: MANUAL rows only, and never an update.
	secDenied(t, operator, `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
		VALUES ($1, 2, gen_random_uuid(), 'SEND', 'ops')`, parked)
	secDenied(t, operator, `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome, note)
		VALUES ($1, 2, gen_random_uuid(), 'SKIP', 'ops', now(), 'PREF_DISABLED', 'x')`, parked)
	secDenied(t, operator, `UPDATE delivery_attempt SET note = 'x' WHERE task_id = $1`, parked)
	secDenied(t, operator, `DELETE FROM delivery_attempt WHERE task_id = $1`, parked)
	secDenied(t, operator, `DELETE FROM delivery_task WHERE id = $1`, parked)
	is.True(e.task(parked).NeedsReview) // still parked after all that

	// notifier resolve.
	changed, err = n.ResolveManually(e.ctx, parked, delivery.StateSent, "seen in the channel's console", "ops-1")
	is.NoErr(err)    // the operator role resolves
	is.True(changed) // the parked task
	task, err := n.Task(e.ctx, parked)
	is.NoErr(err)
	is.Equal(task.State, delivery.StateSent) // SENT
	is.True(!task.NeedsReview)
	history, err := n.Attempts(e.ctx, parked)
	is.NoErr(err)
	is.Equal(len(history), 2)
	is.Equal(history[1].Outcome, delivery.OutcomeManualSent) // with its MANUAL row
	is.Equal(history[1].Worker, "ops-1")
	changed, err = n.ResolveManually(e.ctx, parked, delivery.StateFailed, "again", "ops-2")
	is.NoErr(err)
	is.True(!changed) // once
}

// Each role does its part of one notification's life, and nothing in between needs the owner.
func TestRolesEndToEnd(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	creator := service.NewNotifier(secRolePool(t, e, "notifier_creator"))
	worker := secRolePool(t, e, "notifier_worker")
	operator := service.NewNotifier(secRolePool(t, e, "notifier_operator"))

	for _, ch := range []string{"push", "sms", "none"} {
		_, err := creator.SetPreference(e.ctx, "u1", ch, "u1@"+ch, true)
		is.NoErr(err)
	}
	_, created, tasks, err := creator.Create(e.ctx, service.CreateRequest{UserID: "u1", EventKey: "ord-1", Body: "shipped", TTL: time.Hour, MaxAttempts: 3})
	is.NoErr(err)
	is.True(created)
	is.Equal(len(tasks), 3)
	for _, tk := range tasks {
		if tk.Channel == "none" {
			e.none.ScriptSend(e.ref(tk.TaskID), fakes.Step{Status: 409})
		}
	}
	d := secDispatcher(t, e, worker, dcfg{})
	results := map[service.ResultKind]int{}
	for range tasks {
		results[runOnce(t, d).Kind]++
	}
	is.Equal(results, map[service.ResultKind]int{service.ResultSent: 2, service.ResultParked: 1}) // push, sms sent; none parked
	parked, err := operator.Review(e.ctx, 0, 10)
	is.NoErr(err)
	is.Equal(len(parked), 1)
	changed, err := operator.ResolveManually(e.ctx, parked[0].ID, delivery.StateFailed, "the channel has no record", "ops")
	is.NoErr(err)
	is.True(changed)
	st, err := operator.Status(e.ctx)
	is.NoErr(err)
	is.Equal(st.Parked, int64(0)) // nothing left for a human
}

// secCreatorRefused runs sqls as the creator in the transaction that inserted their notification ($1, a
// fresh one of user u1), the way Create does: every statement but the last succeeds, the last fails with
// code and, when given, constraint. Nothing is kept.
func secCreatorRefused(t *testing.T, pool *pgxpool.Pool, code, constraint string, sqls ...string) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO notification (user_id, event_key, body, expires_at)
		VALUES ('u1', 'refused-' || gen_random_uuid(), 'b', now() + interval '1 hour') RETURNING id`).Scan(&id); err != nil {
		t.Fatalf("the notification of %s: %v", sqls, err)
	}
	for i, sql := range sqls {
		_, err := tx.Exec(ctx, sql, id)
		if i < len(sqls)-1 {
			if err != nil {
				t.Fatalf("%s: %v, want it accepted", sql, err)
			}
			continue
		}
		pgErr := secPgErr(err)
		switch {
		case pgErr == nil:
			t.Errorf("%s: %v, want %s %s", sql, err, code, constraint)
		case pgErr.Code != code || (constraint != "" && pgErr.ConstraintName != constraint):
			t.Errorf("%s: %s (%s, constraint %q), want %s %s", sql, pgErr.Message, pgErr.Code, pgErr.ConstraintName, code, constraint)
		default:
			t.Logf("refused: %s", pgErr.Message)
		}
	}
}

// A task's keys live on its delivery_task_key row (schema/001), off the row the claim and the finish
// update. Whoever inserts tasks (the creator, or the owner: TestSchemaConstraints) still cannot give a
// notification a second task on a channel nor reuse a ref, in one statement or in two; the roles that
// cannot insert tasks cannot insert keys either; every role reads the keys and none may write, change or
// delete one; the owner's delete of a task (retention) takes its key row with it.
func TestTaskKeysHoldForEveryRole(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "sms")
	created := e.create("u1", "e1", time.Hour, 3)
	is.Equal(len(created), 2) // push and sms

	creator := secRolePool(t, e, "notifier_creator")
	const insert = `INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES `
	secCreatorRefused(t, creator, schemaErrUnique, "delivery_task_notification_channel_key",
		insert+`($1, 'push', 3)`, insert+`($1, 'push', 3)`)
	secCreatorRefused(t, creator, schemaErrUnique, "delivery_task_notification_channel_key",
		insert+`($1, 'push', 3), ($1, 'push', 3)`)
	// the database draws every ref: the creator cannot name one, new or reused
	secCreatorDenied(t, creator, `INSERT INTO delivery_task (notification_id, channel, max_attempts, ref)
		VALUES ($1, 'sms', 3, (SELECT ref FROM delivery_task_key LIMIT 1))`)

	ref := e.ref(created[0].TaskID)
	for _, role := range []string{"notifier_creator", "notifier_worker", "notifier_operator", "notifier_receiver"} {
		pool := secRolePool(t, e, role)
		var keys int64
		is.NoErr(pool.QueryRow(e.ctx, `SELECT count(*) FROM delivery_task_key`).Scan(&keys))
		is.Equal(keys, int64(2)) // every role reads the keys
		secDenied(t, pool, `INSERT INTO delivery_task_key (task_id, notification_id, channel, ref)
			VALUES ($1, 1, 'other', gen_random_uuid()::text)`, created[0].TaskID)
		secDenied(t, pool, `UPDATE delivery_task_key SET ref = gen_random_uuid()::text WHERE ref = $1`, ref)
		secDenied(t, pool, `UPDATE delivery_task_key SET channel = 'other'`)
		secDenied(t, pool, `DELETE FROM delivery_task_key WHERE ref = $1`, ref)
		secDenied(t, pool, `TRUNCATE delivery_task_key`)
		if role != "notifier_creator" {
			secDenied(t, pool, `INSERT INTO delivery_task (notification_id, channel, max_attempts)
				SELECT k.notification_id, 'other', 3 FROM delivery_task_key k LIMIT 1`)
		}
	}
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task_key WHERE ref = $1`, ref), int64(1)) // untouched

	// retention's path: the owner deletes a task (it has no attempt yet) and its key row goes with it
	_, err := e.pool.Exec(e.ctx, `DELETE FROM delivery_task WHERE id = $1`, created[0].TaskID)
	is.NoErr(err)
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task_key`), int64(1)) // only the other task's keys stay
}

// A task's provider message ids that its row does not carry (delivery_task_provider_msg, schema/001)
// are written by the triggers of schema/003 whatever role finishes (here the worker, a superseded
// holder's late acceptance), read by the roles that read attempts, and written by no role.
func TestTaskProviderMsgIDsHoldForEveryRole(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	id := lateAcceptedFailedTask(t, e) // the worker's finish recorded "sms-1" for the FAILED task
	for _, role := range []string{"notifier_creator", "notifier_worker", "notifier_operator", "notifier_receiver"} {
		pool := secRolePool(t, e, role)
		if role == "notifier_creator" {
			secDenied(t, pool, `SELECT count(*) FROM delivery_task_provider_msg`) // as on attempts: no read
		} else {
			var ids int64
			is.NoErr(pool.QueryRow(e.ctx, `SELECT count(*) FROM delivery_task_provider_msg WHERE task_id = $1`, id).Scan(&ids))
			is.Equal(ids, int64(1)) // the roles that read attempts read the ids
		}
		secDenied(t, pool, `INSERT INTO delivery_task_provider_msg (provider_msg_id, task_id) VALUES ('forged', $1)`, id)
		secDenied(t, pool, `UPDATE delivery_task_provider_msg SET provider_msg_id = 'forged'`)
		secDenied(t, pool, `DELETE FROM delivery_task_provider_msg`)
		secDenied(t, pool, `TRUNCATE delivery_task_provider_msg`)
	}
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task_provider_msg WHERE task_id = $1 AND provider_msg_id = 'sms-1'`, id), int64(1)) // untouched
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task_provider_msg`), int64(1))                                                      // and nothing forged
}
