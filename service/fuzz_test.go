package service_test

// Fuzz targets for the two pure halves of the protocol: Next (finish: observation -> task state) and
// Decide (claim: what to do with a locked task). Their properties are R6 and the table's CHECKs: a task
// that may have been accepted is never written off as SUPPRESSED or FAILED, and every transition they
// produce is one delivery_task accepts (a refused one would abort a whole batch's finish).
//
//	go test -run '^$' -fuzz '^FuzzNext$' -fuzztime 5m ./service/
//	go test -run '^$' -fuzz '^FuzzDecide$' -fuzztime 5m ./service/

import (
	"strings"
	"testing"

	"github.com/notifierhq/notifier/service/delivery"
)

// Observations of a call: every outcome a channel client may report, and then some.
var fuzzOutcomes = []delivery.Outcome{
	delivery.OutcomeAccepted, delivery.OutcomeAcceptedReplay, delivery.OutcomeQueryFound, delivery.OutcomeQueryNotFound,
	delivery.OutcomeQueryFailed, delivery.OutcomeTimeout, delivery.OutcomeIOError, delivery.OutcomeConnectFailed,
	delivery.OutcomeInFlight, delivery.OutcomeMalformed, delivery.OutcomeHTTP5xx, delivery.OutcomeGatewayError,
	delivery.OutcomeThrottled, delivery.OutcomeRejected, delivery.OutcomeLeaseExpired, delivery.OutcomePrefDisabled, delivery.OutcomeManualSent,
}

var fuzzModes = []delivery.Mode{delivery.ModeIdempotent, delivery.ModeQueryable, delivery.ModeNone}

// accepted are the observations that prove the channel took the message.
func accepted(o delivery.Outcome) bool {
	return o == delivery.OutcomeAccepted || o == delivery.OutcomeAcceptedReplay || o == delivery.OutcomeQueryFound
}

// certainlyNotAccepted are the observations that prove this attempt was not accepted: a refusal before
// acceptance, or a consistent query that found nothing.
func certainlyNotAccepted(o delivery.Outcome) bool {
	switch o {
	case delivery.OutcomeQueryNotFound, delivery.OutcomeHTTP5xx, delivery.OutcomeThrottled,
		delivery.OutcomeConnectFailed, delivery.OutcomeRejected:
		return true
	}
	return false
}

func FuzzNext(f *testing.F) {
	for _, o := range fuzzOutcomes {
		for _, m := range fuzzModes {
			for _, prior := range []bool{false, true} {
				for _, budget := range []bool{false, true} {
					f.Add(string(o), prior, budget, string(m))
				}
			}
		}
	}
	f.Add("", false, true, "IDEMPOTENT")                  // no outcome at all
	f.Add("accepted", false, true, "IDEMPOTENT")          // wrong case: not an acceptance
	f.Add("ACCEPTED ", false, true, "QUERYABLE")          // trailing space
	f.Add("REJECTED", true, true, "idempotent")           // unknown mode spelling
	f.Add("HTTP_5XX", false, true, "")                    // no mode
	f.Add("QUERY_NOT_FOUND", true, false, "NONE")         // the one way from uncertain to FAILED
	f.Add("TTL_EXPIRED_UNCERTAIN", true, true, "NONE")    // a claim-time outcome at finish
	f.Add("\x00\xff", true, true, "QUERYABLE\x00")        // bytes that are no text
	f.Add(strings.Repeat("A", 300), false, false, "NONE") // long garbage

	f.Fuzz(func(t *testing.T, outcome string, priorUncertain, budgetLeft bool, mode string) {
		o, m := delivery.Outcome(outcome), delivery.Mode(mode)
		tr := delivery.Next(delivery.Facts{Outcome: o, PriorUncertain: priorUncertain, BudgetLeft: budgetLeft, Mode: m})
		fail := func(why string) {
			t.Helper()
			t.Fatalf("Next(outcome=%q prior=%v budget=%v mode=%q) = %+v: %s", outcome, priorUncertain, budgetLeft, mode, tr, why)
		}

		switch tr.State {
		case delivery.StatePending, delivery.StateSent, delivery.StateUnknown, delivery.StateFailed:
		default:
			fail("a finish writes PENDING, SENT, UNKNOWN or FAILED only") // SENDING, SUPPRESSED, junk
		}
		// R6: with a history that may have been accepted, nothing is written off ...
		if priorUncertain || !(accepted(o) || certainlyNotAccepted(o)) {
			if tr.State == delivery.StateSuppressed {
				fail("SUPPRESSED with an uncertain history")
			}
			if tr.State == delivery.StateFailed && o != delivery.OutcomeQueryNotFound {
				fail("FAILED with an uncertain history, and not by a query that found nothing")
			}
		}
		// ... and the uncertainty is kept until an acceptance or a query that found nothing settles it.
		if priorUncertain && !accepted(o) && o != delivery.OutcomeQueryNotFound && !(tr.State == delivery.StateUnknown && tr.Uncertain) {
			fail("an uncertain history lost its uncertainty")
		}
		if tr.Park && (tr.State != delivery.StateUnknown || tr.Retry || !tr.Uncertain) {
			fail("park must be UNKNOWN, uncertain, and not scheduled")
		}
		if (tr.State == delivery.StateSent) != accepted(o) {
			fail("SENT exactly for ACCEPTED, ACCEPTED_REPLAY and QUERY_FOUND")
		}
		if tr.Uncertain != (tr.State == delivery.StateUnknown) {
			fail("outcome_uncertain exactly for UNKNOWN")
		}
		// delivery_task_scheduled_iff_waiting: next_attempt_at (Retry) exactly for PENDING/UNKNOWN not parked.
		if tr.Retry != ((tr.State == delivery.StatePending || tr.State == delivery.StateUnknown) && !tr.Park) {
			fail("scheduled exactly when waiting (CHECK delivery_task_scheduled_iff_waiting)")
		}
		if tr.Retry && !budgetLeft {
			fail("retry without attempt budget")
		}
		if tr.State == delivery.StateUnknown && !m.Recoverable() && !tr.Park {
			fail("an uncertain task on a channel that cannot recover is not parked")
		}
	})
}

func FuzzDecide(f *testing.F) {
	for _, m := range append(fuzzModes, "", "bogus") {
		for bits := range 32 {
			f.Add(bits&1 != 0, bits&2 != 0, bits&4 != 0, bits&8 != 0, bits&16 != 0, 1, 3, string(m))
		}
		f.Add(false, false, true, false, false, 3, 3, string(m))  // budget used up, nothing uncertain
		f.Add(true, false, true, false, false, 3, 3, string(m))   // budget used up, uncertain
		f.Add(false, true, true, false, false, 100, 1, string(m)) // lease expired, budget overspent
		f.Add(true, false, true, false, true, 3, 3, string(m))    // cancelled, uncertain, budget used up
	}
	f.Add(false, false, true, false, false, -1, 0, "IDEMPOTENT")             // nonsense counts
	f.Add(true, true, false, true, true, 1<<31-1, -1<<31, "QUERYABLE")       // extremes
	f.Add(false, false, true, false, false, 0, 1, "QUERYABLE\x00")           // a mode with junk
	f.Add(true, false, false, false, false, 1, 3, strings.Repeat("N", 1000)) // long junk mode

	f.Fuzz(func(t *testing.T, uncertain, leaseExpired, prefEnabled, expired, cancelled bool, attemptCount, maxAttempts int, mode string) {
		facts := delivery.ClaimFacts{Uncertain: uncertain, LeaseExpired: leaseExpired, PrefEnabled: prefEnabled,
			Expired: expired, Cancelled: cancelled, AttemptCount: attemptCount, MaxAttempts: maxAttempts, Mode: delivery.Mode(mode)}
		d := delivery.Decide(facts)
		fail := func(why string) {
			t.Helper()
			t.Fatalf("Decide(%+v) = %+v: %s", facts, d, why)
		}
		mayBeAccepted := uncertain || leaseExpired

		// R6: an uncertain or lease-expired task never settles SUPPRESSED or FAILED.
		if mayBeAccepted && (d.State == delivery.StateSuppressed || d.State == delivery.StateFailed) {
			fail("written off with an uncertain history")
		}
		if mayBeAccepted && !d.Uncertain {
			fail("an uncertain history lost its uncertainty")
		}
		// R5: a disabled preference, an expired or a cancelled notification is never called.
		if (!prefEnabled || expired || cancelled) && d.Kind == delivery.ClaimCall {
			fail("called although the preference is disabled or the notification expired or was cancelled")
		}
		// A cancel names the settle of a cancelled notification's task (schema/005 accepts no other SKIP
		// for a task settled before it is due), whatever else holds.
		if cancelled && (d.Kind != delivery.ClaimSettle ||
			d.Outcome != map[bool]delivery.Outcome{false: delivery.OutcomeCancelled, true: delivery.OutcomeCancelledUncertain}[mayBeAccepted]) {
			fail("a cancelled notification's task is not settled as cancelled")
		}
		switch d.Kind {
		case delivery.ClaimCall:
			if d.Action != delivery.ActionSend && d.Action != delivery.ActionQuery {
				fail("a call sends or queries")
			}
			if d.Action == delivery.ActionQuery && !(mayBeAccepted && delivery.Mode(mode) == delivery.ModeQueryable) {
				fail("a query only for an uncertain task on a QUERYABLE channel")
			}
			if mayBeAccepted && delivery.Mode(mode) == delivery.ModeQueryable && d.Action != delivery.ActionQuery {
				fail("an uncertain task on a QUERYABLE channel is queried before any resend")
			}
			if mayBeAccepted && !delivery.Mode(mode).Recoverable() {
				fail("R4: a channel that can neither dedupe nor be queried is called again after uncertainty")
			}
			if attemptCount >= maxAttempts {
				fail("called beyond the attempt budget")
			}
			if d.Uncertain != mayBeAccepted {
				fail("the attempt's uncertainty differs from the task's history")
			}
		case delivery.ClaimSettle:
			if prefEnabled && !expired && !cancelled {
				fail("settled without a reason")
			}
			want := map[delivery.State][]delivery.Outcome{
				delivery.StateSuppressed: {delivery.OutcomePrefDisabled, delivery.OutcomeCancelled},
				delivery.StateFailed:     {delivery.OutcomeTTLExpired},
				delivery.StateUnknown: {delivery.OutcomePrefDisabledUncertain, delivery.OutcomeTTLExpiredUncertain,
					delivery.OutcomeCancelledUncertain},
			}[d.State]
			if !containsOutcome(want, d.Outcome) {
				fail("settle state and attempt outcome do not match (or the outcome is not one the table accepts)")
			}
			if (d.State == delivery.StateUnknown) != mayBeAccepted {
				fail("UNKNOWN (parked) exactly for an uncertain history")
			}
			if d.State == delivery.StateSuppressed && prefEnabled && !cancelled || d.State == delivery.StateFailed && !(prefEnabled && expired) {
				fail("the settle reason does not match the facts")
			}
			if d.Reason == "" {
				fail("no reason for last_error")
			}
		case delivery.ClaimPark:
			if !d.Uncertain || !mayBeAccepted && attemptCount < maxAttempts {
				fail("parked without an uncertain history or a spent budget")
			}
			if d.Reason == "" {
				fail("no reason for last_error")
			}
		default:
			fail("unknown kind")
		}
	})
}

func containsOutcome(list []delivery.Outcome, o delivery.Outcome) bool {
	for _, x := range list {
		if x == o {
			return true
		}
	}
	return false
}
