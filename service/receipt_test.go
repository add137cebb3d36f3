package service_test

// Receipts (schema/004, service/receipt.go): a provider's receipt is evidence that it had the message.
// It settles an uncertain or retrying task as SENT when nobody holds it, is noted (and settles later)
// when a holder is calling, and never moves a final state. One test per moment a receipt can arrive.

import (
	"errors"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/fakes"
	"github.com/notifierhq/notifier/service"
	"github.com/notifierhq/notifier/service/delivery"
)

// delivered is a provider's delivery receipt for a task, carrying the task's reference back.
func (e *env) delivered(taskID int64, event string) delivery.Receipt {
	e.t.Helper()
	return deliveredRef(e.ref(taskID), event)
}

func deliveredRef(ref, event string) delivery.Receipt {
	return delivery.Receipt{Source: delivery.ReceiptSourceStandardWebhooks, EventID: event, Kind: delivery.ReceiptDelivered, Ref: ref}
}

func (e *env) record(r delivery.Receipt) delivery.ReceiptResult {
	e.t.Helper()
	res, err := e.n.RecordReceipt(e.ctx, r, false)
	if err != nil {
		e.t.Fatalf("record receipt: %v", err)
	}
	return res
}

func actions(history []service.AttemptRecord) []delivery.Action {
	var out []delivery.Action
	for _, a := range history {
		out = append(out, a.Action)
	}
	return out
}

// Before the timeout: the holder is still calling. The receipt is noted, the holder's own finish records
// the acceptance, and nothing else happens (no RECEIPT attempt: its finish was the evidence).
func TestReceiptWhileTheHolderCalls(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	d := e.dispatcher(dcfg{})
	a, _, err := claimOne(e.ctx, d)
	is.NoErr(err)
	is.True(a != nil) // the holder claimed; its call is under way
	res := e.record(e.delivered(id, "evt-1"))
	is.Equal(res.Effect, delivery.ReceiptNoted) // noted: the holder decides
	is.Equal(e.task(id).State, delivery.StateSending)
	fin, err := finishOne(e.ctx, d, a, d.Call(e.ctx, a))
	is.NoErr(err)
	is.Equal(fin.Kind, service.ResultSent) // the holder's acceptance
	settled, err := e.n.SweepReceipts(e.ctx, 10)
	is.NoErr(err)
	is.Equal(settled, 0)                                                      // nothing left to settle
	is.Equal(actions(e.attempts(id)), []delivery.Action{delivery.ActionSend}) // one attempt: the call
}

// After the timeout, with retries left: the task is UNKNOWN and due again. The receipt settles it SENT
// with a RECEIPT attempt, and the next claim finds nothing: the idempotent resend never happens.
func TestReceiptAfterTheTimeoutSettles(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	e.push.ScriptSend(e.ref(id), fakes.Step{Delay: fakeDelay})
	d := e.dispatcher(dcfg{timeout: clientTimeout})
	is.Equal(runOnce(t, d).Outcome, delivery.OutcomeTimeout) // accepted, answer lost
	is.Equal(e.task(id).State, delivery.StateUnknown)
	res := e.record(e.delivered(id, "evt-1"))
	is.Equal(res.Effect, delivery.ReceiptSettled) // settled by the receipt
	task := e.task(id)
	is.Equal(task.State, delivery.StateSent)
	is.True(!task.OutcomeUncertain) // the uncertainty is written off, with evidence
	history := e.attempts(id)
	is.Equal(actions(history), []delivery.Action{delivery.ActionSend, delivery.ActionReceipt})
	is.Equal(history[1].Outcome, delivery.OutcomeReceiptAccepted)
	held, none, err := claimOne(e.ctx, d)
	is.NoErr(err)
	is.True(held == nil) // no resend
	is.Equal(none.Kind, service.ResultNothing)
	is.Equal(e.push.Sends(e.ref(id)), 1) // one request on the wire
}

// After parking: a NONE channel parked the task for a human; the receipt settles it instead.
func TestReceiptAfterParkingSettles(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	id := secParked(t, e, "u1", "e1")
	res := e.record(e.delivered(id, "evt-1"))
	is.Equal(res.Effect, delivery.ReceiptSettled)
	task := e.task(id)
	is.Equal(task.State, delivery.StateSent) // no longer waiting for a human
	is.True(!task.NeedsReview)
	list, err := e.n.Review(e.ctx, 0, 10)
	is.NoErr(err)
	is.Equal(len(list), 0) // review is empty
}

// After a manual resolution the state is final: a receipt for a task resolved FAILED is kept, changes
// nothing, and review shows the contradiction; for one resolved SENT it is simply kept.
func TestReceiptNeverMovesAFinalState(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	failed := secParked(t, e, "u1", "e1")
	sent := secParked(t, e, "u2", "e2")
	for id, state := range map[int64]delivery.State{failed: delivery.StateFailed, sent: delivery.StateSent} {
		changed, err := e.n.ResolveManually(e.ctx, id, state, "checked", "ops")
		is.NoErr(err)
		is.True(changed)
	}
	res := e.record(e.delivered(failed, "evt-f"))
	is.Equal(res.Effect, delivery.ReceiptContradicts)    // FAILED, but the provider had it
	is.Equal(e.task(failed).State, delivery.StateFailed) // final
	res = e.record(e.delivered(sent, "evt-s"))
	is.Equal(res.Effect, delivery.ReceiptUnchanged)  // SENT already
	is.Equal(e.task(sent).State, delivery.StateSent) // final
	is.Equal(len(e.attempts(failed)), 2)             // no attempt added to either
	list, err := e.n.Review(e.ctx, 0, 10)
	is.NoErr(err)
	is.Equal(len(list), 1) // the contradiction is shown
	is.Equal(list[0].ID, failed)
	is.Equal(list[0].Review, service.ReviewLateAccepted)
}

// The same event twice (a provider's redelivery, or a replay): recorded once, the second changes nothing.
// Events out of order (delivered before accepted): both kept, the first settles, the second is unchanged.
func TestReceiptTwiceAndOutOfOrder(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	id := secParked(t, e, "u1", "e1")
	first := e.record(e.delivered(id, "evt-1"))
	is.Equal(first.Effect, delivery.ReceiptSettled)
	again := e.record(e.delivered(id, "evt-1"))
	is.True(again.Duplicate) // the same event: nothing more
	accepted := e.delivered(id, "evt-0")
	accepted.Kind = delivery.ReceiptAccepted
	late := e.record(accepted)
	is.Equal(late.Effect, delivery.ReceiptUnchanged)                                             // the earlier event, arriving later
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_receipt WHERE task_id = $1`, id), int64(2)) // both kept, once each
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_attempt WHERE task_id = $1 AND action = 'RECEIPT'`, id), int64(1))
}

// A receipt for a task we do not have, or by a message id nobody stored, is refused and writes nothing.
func TestReceiptForAnUnknownTask(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	_, err := e.n.RecordReceipt(e.ctx, deliveredRef("task-424242", "evt-1"), false)
	is.True(errors.Is(err, delivery.ErrUnknownReference)) // unknown reference
	byID := delivery.Receipt{Source: delivery.ReceiptSourceTwilio, EventID: "SM1:delivered", Kind: delivery.ReceiptDelivered, ProviderMsgID: "SM1"}
	_, err = e.n.RecordReceipt(e.ctx, byID, false)
	is.True(errors.Is(err, delivery.ErrUnknownReference))                 // unknown message id
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_receipt`), int64(0)) // nothing written
}

// A receipt noted while the holder called, whose finish then left the task to retry (a timeout): the
// next claim settles it by the receipt instead of calling again. One whose finish parked it (a NONE
// channel): the receivers' sweep settles it.
func TestNotedReceiptSettlesAfterTheHolder(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push", "none")
	tasks := e.create("u1", "e1", time.Hour, 3)
	byChannel := map[string]int64{}
	for _, tr := range tasks {
		byChannel[tr.Channel] = tr.TaskID
	}
	for _, ch := range []string{"none", "push"} {
		id := byChannel[ch]
		fake := map[string]*fakes.Channel{"push": e.push, "none": e.none}[ch]
		fake.ScriptSend(e.ref(id), fakes.Step{Delay: fakeDelay})
	}
	d := e.dispatcher(dcfg{timeout: clientTimeout})
	attempts, _, err := d.ClaimBatch(e.ctx, 2)
	is.NoErr(err)
	is.Equal(len(attempts), 2) // both held
	for _, tr := range tasks {
		is.Equal(e.record(e.delivered(tr.TaskID, "evt-"+tr.Channel)).Effect, delivery.ReceiptNoted)
	}
	results, err := d.FinishBatch(e.ctx, attempts, callAll(e.ctx, d, attempts))
	is.NoErr(err)
	for _, r := range results {
		is.Equal(r.Outcome, delivery.OutcomeTimeout) // both answers lost
	}
	is.True(e.task(byChannel["none"]).NeedsReview)                   // NONE: parked
	is.Equal(e.task(byChannel["push"]).State, delivery.StateUnknown) // push: to resend

	claim := runNext(t, d)
	is.Equal(claim.TaskID, byChannel["push"])
	is.Equal(claim.Kind, service.ResultSent)       // settled at claim
	is.Equal(claim.Action, delivery.ActionReceipt) // by the receipt
	is.Equal(e.push.Sends(e.ref(claim.TaskID)), 1) // not resent
	settled, err := e.n.SweepReceipts(e.ctx, 10)
	is.NoErr(err)
	is.Equal(settled, 1)                                          // the parked one
	is.Equal(e.task(byChannel["none"]).State, delivery.StateSent) // settled by the sweep
}

// A hard bounce switches the user's preference on that channel off, when asked to.
func TestHardBounceDisablesThePreference(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	id := secParked(t, e, "u1", "e1")
	bounce := delivery.Receipt{Source: delivery.ReceiptSourceStandardWebhooks, EventID: "evt-b", Kind: delivery.ReceiptBounced,
		HardBounce: true, Ref: e.ref(id)}
	res, err := e.n.RecordReceipt(e.ctx, bounce, true)
	is.NoErr(err)
	is.True(res.PrefDisabled) // switched off
	is.Equal(e.scalar(`SELECT count(*) FROM channel_pref WHERE user_id = 'u1' AND channel = 'none' AND NOT enabled`), int64(1))
}

// Retention takes a finished task's receipts with it (they are evidence while the task may change,
// history once it is final), and never those of a task still held.
func TestPruneTakesReceiptsWithTheirTask(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	settled := secParked(t, e, "u1", "e1")
	e.record(e.delivered(settled, "evt-settled"))
	e.w.User("u2", "push")
	held := e.create("u2", "e2", time.Hour, 3)[0].TaskID
	a, _, err := claimOne(e.ctx, e.dispatcher(dcfg{}))
	is.NoErr(err)
	is.Equal(a.TaskID, held)
	e.record(e.delivered(held, "evt-held")) // noted: the task is still SENDING
	e.backdate(settled, held)
	st, err := e.n.Prune(e.ctx, 24*time.Hour, 100, 0)
	is.NoErr(err)
	is.Equal(st.Tasks, int64(1))    // the finished task
	is.Equal(st.Receipts, int64(1)) // with its receipt
	is.True(!e.exists("delivery_task", settled))
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_receipt WHERE task_id = $1`, held), int64(1)) // the held one's stays
}

// byMsgID is a provider's delivery receipt that names the message only by the provider's id.
func byMsgID(msgID, event string) delivery.Receipt {
	return delivery.Receipt{Source: delivery.ReceiptSourceTwilio, EventID: event, Kind: delivery.ReceiptDelivered, ProviderMsgID: msgID}
}

// A receipt that names a message only by the provider's id finds its task by every id an attempt of it
// held, although delivery_attempt has no index on that id (schema/001: delivery_task_provider_msg).
// An accepted finish writes its id on the task and the attempt in one statement and records no other
// row; a superseded holder's late acceptance, whose id its FAILED task does not carry, is recorded.
func TestReceiptFindsALateAcceptanceByItsProviderID(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u2", "push")
	sent := e.create("u2", "e2", time.Hour, 3)[0].TaskID
	is.Equal(runOnce(t, e.dispatcher(dcfg{})).Kind, service.ResultSent)             // an ordinary delivery
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task_provider_msg`), int64(0)) // its id is the task's: nothing recorded

	id := lateAcceptedFailedTask(t, e) // FAILED; holder A's late ACCEPTED kept "sms-1" on its attempt only
	is.Equal(e.task(id).ProviderMsgID, "")
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task_provider_msg WHERE provider_msg_id = 'sms-1' AND task_id = $1`, id), int64(1))
	res := e.record(byMsgID("sms-1", "sms-1:delivered"))
	is.Equal(res.TaskID, id)                                                               // found by the late attempt's id
	is.Equal(res.Effect, delivery.ReceiptContradicts)                                      // the provider had it after all: shown, not settled
	is.Equal(e.task(sent).State, delivery.StateSent)                                       // the other task is untouched
	is.Equal(e.record(byMsgID(e.task(sent).ProviderMsgID, "sent:delivered")).TaskID, sent) // and found by the task's own id
}

// A task whose provider id a later attempt replaced keeps the first one findable: the first attempt
// timed out after the provider had given an id, the resend was accepted under another.
func TestReceiptFindsAReplacedProviderID(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	answer := func(o delivery.Observation) *service.Dispatcher {
		d, err := service.NewDispatcher(e.ctx, e.pool, service.DispatcherConfig{Worker: "w",
			Routes: map[string]delivery.Route{"push": {Mode: delivery.ModeIdempotent, Client: answering(o)}}})
		is.NoErr(err)
		return d
	}
	res, err := runCycle(e.ctx, answer(delivery.Observation{Outcome: delivery.OutcomeTimeout, ProviderMsgID: "p-1"}))
	is.NoErr(err)
	is.Equal(res.Kind, service.ResultUnknown) // the answer was lost after an id was given
	is.Equal(e.task(id).ProviderMsgID, "p-1")
	e.makeDue(id)
	res, err = runCycle(e.ctx, answer(delivery.Observation{Outcome: delivery.OutcomeAccepted, ProviderMsgID: "p-2"}))
	is.NoErr(err)
	is.Equal(res.Kind, service.ResultSent) // the resend is accepted under another id
	is.Equal(e.task(id).ProviderMsgID, "p-2")
	is.Equal(e.record(byMsgID("p-1", "p-1:delivered")).TaskID, id) // the replaced id still finds the task
	is.Equal(e.record(byMsgID("p-2", "p-2:delivered")).TaskID, id) // and so does the task's own
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task_provider_msg`), int64(1))

	e.backdate(id) // retention's DELETE of the task takes its recorded id with it
	_, err = e.n.Prune(e.ctx, 24*time.Hour, 10, 0)
	is.NoErr(err)
	is.True(!e.exists("delivery_task", id))
	is.Equal(e.scalar(`SELECT count(*) FROM delivery_task_provider_msg`), int64(0))
}

// A receipt that settles a task by our reference and names another provider id than the one the task
// carries keeps that id on its RECEIPT attempt; a later receipt naming only that id finds the task.
func TestReceiptFindsTheIDAnEarlierReceiptNamed(t *testing.T) {
	is := is.New(t)
	e := newEnv(t)
	e.w.User("u1", "push")
	id := e.create("u1", "e1", time.Hour, 3)[0].TaskID
	d, err := service.NewDispatcher(e.ctx, e.pool, service.DispatcherConfig{Worker: "w",
		Routes: map[string]delivery.Route{"push": {Mode: delivery.ModeIdempotent,
			Client: answering{Outcome: delivery.OutcomeTimeout, ProviderMsgID: "p-1"}}}})
	is.NoErr(err)
	res, err := runCycle(e.ctx, d)
	is.NoErr(err)
	is.Equal(res.Kind, service.ResultUnknown) // uncertain, under the id "p-1"
	r := e.delivered(id, "evt-1")
	r.ProviderMsgID = "p-9"
	is.Equal(e.record(r).Effect, delivery.ReceiptSettled)          // settled by our reference
	is.Equal(e.task(id).ProviderMsgID, "p-1")                      // the task keeps its id
	is.Equal(e.record(byMsgID("p-9", "p-9:delivered")).TaskID, id) // the receipt's id finds it too
}
