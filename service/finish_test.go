package service_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/dbgen"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// answering is a channel that answers every call with the same observation.
type answering delivery.Observation

func (a answering) Send(context.Context, delivery.Message) delivery.Observation {
	return delivery.Observation(a)
}
func (a answering) Query(context.Context, string) delivery.Observation {
	return delivery.Observation(a)
}

// A channel's answer is stored whatever bytes it holds: PostgreSQL text refuses NUL and invalid UTF-8,
// and a refused write would lose every observation of the batch.
func TestFinishStoresAnyAnswer(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	hostile := answering{Outcome: delivery.OutcomeAccepted, ProviderMsgID: "id\x00with\xffbytes" + strings.Repeat("x", 600),
		Detail: "detail\x00\xfe" + strings.Repeat("é", 3000)}
	d, err := service.NewDispatcher(e.ctx, e.pool, service.DispatcherConfig{Worker: "w",
		Routes: map[string]delivery.Route{"push": {Mode: delivery.ModeIdempotent, Client: hostile}}})
	is.NoErr(err)
	res, err := runCycle(e.ctx, d)
	is.NoErr(err)                          // the finish does not fail
	is.Equal(res.Kind, service.ResultSent) // and records the acceptance
	task := e.task(id)
	is.True(strings.HasPrefix(task.ProviderMsgID, "id?with?bytes")) // NUL and invalid bytes replaced
	is.Equal(len([]rune(task.ProviderMsgID)), 500)                  // cut to the column's bound
}

// last_error is the outcome, then the channel's detail after a colon when it gave one.
func TestFinishWritesLastErrorWithItsDetail(t *testing.T) {
	for _, c := range []struct{ detail, want string }{
		{"HTTP 400: bad address", "REJECTED: HTTP 400: bad address"},
		{"", "REJECTED"},
	} {
		t.Run(c.want, func(t *testing.T) {
			is := is.New(t)
			e := newEnv(t)
			e.w.User("u1", "push")
			id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
			d, err := service.NewDispatcher(e.ctx, e.pool, service.DispatcherConfig{Worker: "w",
				Routes: map[string]delivery.Route{"push": {Mode: delivery.ModeIdempotent,
					Client: answering{Outcome: delivery.OutcomeRejected, Detail: c.detail}}}})
			is.NoErr(err)
			res, err := runCycle(e.ctx, d)
			is.NoErr(err)
			is.Equal(res.Kind, service.ResultFailed)
			is.Equal(e.task(id).LastError, c.want)
		})
	}
}

// The finish is one statement whose snapshot can predate a takeover: here it starts while a superseding
// claim holds the task's row lock, and that claim commits only after the finish waits on the lock. The
// token guard must see the new token (STALE), and the old attempt, closed as LEASE_EXPIRED by the claim
// after the finish's snapshot was taken, must still get the observation as late_outcome (R3).
func TestFinishWaitingOnTakeoverRecordsLate(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	holder := e.dispatcher(dcfg{worker: "w-old", lease: 300 * time.Millisecond})
	a, _, err := claimOne(e.ctx, holder)
	is.NoErr(err)
	is.True(a != nil)            // the first holder claimed the task
	obs := holder.Call(e.ctx, a) // and its call was accepted
	is.Equal(obs.Outcome, delivery.OutcomeAccepted)
	e.waitDB("lease_until < now() FROM delivery_task WHERE id = $1", id)

	// The superseding claim, statement for statement as Dispatcher.ClaimBatch runs it, left open.
	tx, err := e.pool.BeginTx(e.ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	is.NoErr(err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	q := dbgen.New(tx)
	rows, err := q.TaskClaim(e.ctx, dbgen.TaskClaimParams{Channel: "push", MaxTasks: 1})
	is.NoErr(err)
	is.Equal(len(rows), 1)        // the expired lease is taken over
	is.True(rows[0].LeaseExpired) // as an expired lease
	closed, err := q.AttemptMarkLeaseExpired(e.ctx, []string{*rows[0].HeldToken})
	is.NoErr(err)
	is.Equal(closed, int64(1)) // the old attempt is closed in the claim's transaction
	started, err := q.TaskStartAttempts(e.ctx, dbgen.TaskStartAttemptsParams{Worker: "w-new", LeaseSeconds: 60,
		IDs: []int64{id}, AttemptTokens: []string{"00000000-0000-4000-8000-00000000beef"}, OutcomeUncertain: []bool{true}, Actions: []string{string(delivery.ActionSend)}})
	is.NoErr(err)
	is.Equal(len(started), 1) // the new holder has its token

	finished := make(chan service.Result, 1)
	go func() {
		res, err := finishOne(context.Background(), holder, a, obs)
		if err != nil {
			t.Error(err)
		}
		finished <- res
	}()
	e.waitDB(`EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '-- name: TaskFinish %')`)
	is.NoErr(tx.Commit(e.ctx)) // the takeover commits while the finish waits for the row

	res := <-finished
	is.Equal(res.Kind, service.ResultStale) // the old holder's token no longer matches
	history := e.attempts(id)
	is.Equal(len(history), 2)                                  // the old attempt and the new one
	is.Equal(history[0].Outcome, delivery.OutcomeLeaseExpired) // closed by the takeover
	is.Equal(history[0].LateOutcome, delivery.OutcomeAccepted) // and the late observation kept
	is.Equal(history[1].Outcome, delivery.Outcome(""))         // the new attempt is untouched, still open
	task := e.task(id)
	is.Equal(task.State, delivery.StateSending) // the new holder's task, unchanged by the stale finish
	is.Equal(task.LeaseOwner, "w-new")          // held by the new holder
}

// refusingBatch claims three due push tasks in one batch, calls them (all accepted), and makes the
// server refuse any change of the middle task's row with errcode, as a trigger on bad data would.
func refusingBatch(t *testing.T, errcode string) (*env, *dispatcher, []*service.Attempt, []delivery.Observation) {
	is := is.New(t)
	is.Helper()
	e := newEnv(t)
	e.dueTasks(3)
	d := e.dispatcher(dcfg{})
	attempts, _, err := d.ClaimBatch(e.ctx, 3)
	is.NoErr(err)              // claim
	is.Equal(len(attempts), 3) // a batch of three
	_, err = e.pool.Exec(e.ctx, `
		CREATE FUNCTION refuse_row() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			RAISE EXCEPTION 'refused by the test' USING ERRCODE = '`+errcode+`';
		END $$;
		CREATE TRIGGER refuse_row BEFORE UPDATE ON delivery_task FOR EACH ROW
			WHEN (OLD.id = `+strconv.FormatInt(attempts[1].TaskID, 10)+` AND NEW.state <> 'SENDING')
			EXECUTE FUNCTION refuse_row()`)
	is.NoErr(err) // trigger installed
	obs := callAll(e.ctx, d, attempts)
	for _, o := range obs {
		is.Equal(o.Outcome, delivery.OutcomeAccepted) // every call accepted
	}
	return e, d, attempts, obs
}

// A row the server refuses costs its own observation only: the batch's finish is refused whole, then
// each attempt is finished alone. The refused one is UNRECORDED: still SENDING with an open attempt,
// recovered after its lease like a crashed holder's; the others are SENT. It holds for each SQLSTATE class that
// docs/reliability.md#a-bad-row-costs-only-itself names: 22, 23, P0, and 40 (a deadlock or a
// serialization failure rolled the statement back: nothing of it was written either).
func TestRefusedRowCostsOnlyItsOwnObservation(t *testing.T) {
	for _, refusal := range []struct{ errcode, sqlstate string }{
		{"invalid_text_representation", "22P02"},
		{"check_violation", "23514"},
		{"raise_exception", "P0001"},
		{"deadlock_detected", "40P01"},
		{"serialization_failure", "40001"},
	} {
		errcode := refusal.errcode
		t.Run(errcode, func(t *testing.T) {
			is := is.New(t)
			e, d, attempts, obs := refusingBatch(t, errcode)
			results, err := d.FinishBatch(e.ctx, attempts, obs)
			is.NoErr(err) // the rows not at fault are recorded
			kinds := []service.ResultKind{results[0].Kind, results[1].Kind, results[2].Kind}
			is.Equal(kinds, []service.ResultKind{service.ResultSent, service.ResultUnrecorded, service.ResultSent})
			is.True(strings.Contains(results[1].Detail, "refused by the test")) // the server's reason
			var pgErr *pgconn.PgError
			is.True(errors.As(results[1].Err, &pgErr)) // the refusal stays a value, not only its text
			is.Equal(pgErr.Code, refusal.sqlstate)     // the server's own
			is.Equal(e.task(attempts[0].TaskID).State, delivery.StateSent)
			is.Equal(e.task(attempts[2].TaskID).State, delivery.StateSent)
			is.Equal(e.task(attempts[1].TaskID).State, delivery.StateSending)            // left to lease expiry
			is.Equal(e.outcomes(attempts[1].TaskID), []delivery.Outcome{""})             // its attempt still open
			is.Equal(e.outcomes(attempts[0].TaskID), outcomes(delivery.OutcomeAccepted)) // the others' recorded
		})
	}
}

// A refusal that is the server's trouble, not a row's (here disk_full), fails the whole finish as
// before: finishing each row alone would only repeat it per row. Nothing of the batch is written.
func TestServerTroubleFailsTheWholeFinish(t *testing.T) {
	is := is.New(t)
	e, d, attempts, obs := refusingBatch(t, "disk_full")
	results, err := d.FinishBatch(e.ctx, attempts, obs)
	is.True(err != nil)       // the finish failed
	is.Equal(len(results), 0) // with no results
	for _, a := range attempts {
		is.Equal(e.task(a.TaskID).State, delivery.StateSending) // nothing written: every row waits for its lease
	}
}

// lateAcceptedFailedTask plays a lagging query: holder A's call is accepted but its answer comes late;
// after A's lease a taker queries, the channel's search does not see A's message yet (QUERY_NOT_FOUND),
// and with no attempt left the task is FAILED. Then A's answer arrives: ACCEPTED, kept as its attempt's
// late_outcome (A's token no longer holds). The task is final and "not sent"; the user got the message.
func lateAcceptedFailedTask(t *testing.T, e *env) int64 {
	is := is.New(t)
	is.Helper()
	e.w.User("u1", "sms")
	id := e.create("u1", "e1", time.Hour, 2)[0].TaskID
	route := func(answer delivery.Outcome) map[string]delivery.Route {
		return map[string]delivery.Route{"sms": {Mode: delivery.ModeQueryable, Client: answering{Outcome: answer}}}
	}
	holder, err := service.NewDispatcher(e.ctx, e.workerPool, service.DispatcherConfig{Worker: "w-a",
		Routes: route(delivery.OutcomeAccepted), Lease: 200 * time.Millisecond})
	is.NoErr(err)
	a, _, err := claimOne(e.ctx, holder)
	is.NoErr(err)
	is.True(a != nil) // A holds the task; its call is accepted, its answer late
	e.waitDB("lease_until < now() FROM delivery_task WHERE id = $1", id)
	taker, err := service.NewDispatcher(e.ctx, e.workerPool, service.DispatcherConfig{Worker: "w-b",
		Routes: route(delivery.OutcomeQueryNotFound)})
	is.NoErr(err)
	res, err := runCycle(e.ctx, taker)
	is.NoErr(err)
	is.Equal(res.Action, delivery.ActionQuery) // the taker asks first
	is.Equal(res.Kind, service.ResultFailed)   // the lagging search says not found; no attempt left
	res, err = finishOne(e.ctx, holder, a, delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: "sms-1"})
	is.NoErr(err)
	is.Equal(res.Kind, service.ResultStale) // A's answer comes too late to change the task
	return id
}

// A FAILED task that a late answer says was accepted is shown to operators: review lists it as
// LATE_ACCEPTED with its history, status counts it. Before, the late ACCEPTED was recorded but nothing
// ever showed it.
func TestLateAcceptanceOfAFailedTaskIsShown(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	id := lateAcceptedFailedTask(t, e)
	is.Equal(e.task(id).State, delivery.StateFailed) // final, and stays so

	list, err := e.n.Review(e.ctx, 0, 10)
	is.NoErr(err)
	is.Equal(len(list), 1) // the task is shown
	is.Equal(list[0].ID, id)
	is.Equal(list[0].Review, service.ReviewLateAccepted)                 // as contradicted by a late answer
	is.Equal(list[0].Attempts[0].LateOutcome, delivery.OutcomeAccepted)  // with the evidence
	is.Equal(list[0].Attempts[1].Outcome, delivery.OutcomeQueryNotFound) // and what made it FAILED
	st, err := e.n.Status(e.ctx)
	is.NoErr(err)
	is.Equal(st.LateAccepted, int64(1)) // status counts it
	is.Equal(st.Parked, int64(0))       // it is not parked: there is nothing to resolve

	parked := secParked(t, e, "u2", "e2") // a parked task beside it
	list, err = e.n.Review(e.ctx, 0, 10)
	is.NoErr(err)
	is.Equal(len(list), 2)                         // both kinds, in id order
	is.Equal(list[1].ID, parked)                   // the parked one
	is.Equal(list[1].Review, service.ReviewParked) // to resolve
	list, err = e.n.Review(e.ctx, id, 10)
	is.NoErr(err)
	is.Equal(len(list), 1) // paging by the last id printed covers both kinds
	list, err = e.n.Review(e.ctx, 0, 1)
	is.NoErr(err)
	is.Equal(len(list), 1)   // the limit holds across both kinds
	is.Equal(list[0].ID, id) // oldest first

	// The console's filters, in the statements (ReviewWhere): by state and channel.
	ids := func(f service.ReviewFilter) []int64 {
		f.Limit = 10
		list, err := e.n.ReviewWhere(e.ctx, f)
		is.NoErr(err)
		var out []int64
		for _, p := range list {
			out = append(out, p.ID)
		}
		return out
	}
	channel := e.task(id).Channel
	is.Equal(ids(service.ReviewFilter{State: delivery.StateFailed}), []int64{id})                   // the late-accepted FAILED one
	is.Equal(ids(service.ReviewFilter{State: delivery.StateUnknown}), []int64{parked})              // the parked one
	is.Equal(ids(service.ReviewFilter{State: delivery.StateSuppressed}), []int64(nil))              // none SUPPRESSED
	is.Equal(ids(service.ReviewFilter{Channel: channel, State: delivery.StateFailed}), []int64{id}) // its channel
	is.Equal(ids(service.ReviewFilter{Channel: "no-such-channel"}), []int64(nil))                   // another channel
	is.Equal(ids(service.ReviewFilter{AfterID: id, State: delivery.StateFailed}), []int64(nil))     // paged past it
	_, err = e.n.ReviewWhere(e.ctx, service.ReviewFilter{State: delivery.StateSent, Limit: 10})
	is.True(errors.Is(err, delivery.ErrInvalidInput)) // a state no listed task is in
}
