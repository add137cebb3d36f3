package delivery

import (
	"fmt"
	"testing"
	"time"

	"github.com/matryer/is"
)

// TestNextTable checks every observation x {certain, uncertain history} x {budget left, used up} on a
// recoverable channel against docs/protocol.md#finish, written out by hand.
func TestNextTable(t *testing.T) {
	type key struct {
		outcome   Outcome
		uncertain bool
		budget    bool
	}
	sent := Transition{State: StateSent}
	retryUnknown := Transition{State: StateUnknown, Uncertain: true, Retry: true}
	parked := Transition{State: StateUnknown, Uncertain: true, Park: true}
	retryPending := Transition{State: StatePending, Retry: true}
	failed := Transition{State: StateFailed}
	want := map[key]Transition{}
	for _, u := range []bool{false, true} {
		for _, b := range []bool{false, true} {
			for _, o := range []Outcome{OutcomeAccepted, OutcomeAcceptedReplay, OutcomeQueryFound} {
				want[key{o, u, b}] = sent
			}
			for _, o := range []Outcome{OutcomeTimeout, OutcomeIOError, OutcomeGatewayError, OutcomeQueryFailed, OutcomeInFlight, OutcomeMalformed} {
				want[key{o, u, b}] = map[bool]Transition{true: retryUnknown, false: parked}[b]
			}
			for _, o := range []Outcome{OutcomeHTTP5xx, OutcomeThrottled, OutcomeConnectFailed} {
				switch {
				case u && b:
					want[key{o, u, b}] = retryUnknown
				case u:
					want[key{o, u, b}] = parked
				case b:
					want[key{o, u, b}] = retryPending
				default:
					want[key{o, u, b}] = failed
				}
			}
			want[key{OutcomeRejected, u, b}] = map[bool]Transition{true: parked, false: failed}[u]
			// refunded whatever the budget: never FAILED, never parked for an account state
			want[key{OutcomeAccountRefused, u, b}] = map[bool]Transition{
				true:  {State: StateUnknown, Uncertain: true, Retry: true, Refund: true},
				false: {State: StatePending, Retry: true, Refund: true}}[u]
			want[key{OutcomeQueryNotFound, u, b}] = map[bool]Transition{true: retryPending, false: failed}[b]
		}
	}
	for k, w := range want {
		for _, mode := range []Mode{ModeIdempotent, ModeQueryable} {
			t.Run(fmt.Sprintf("%s/uncertain=%v/budget=%v/%s", k.outcome, k.uncertain, k.budget, mode), func(t *testing.T) {
				is := is.New(t)
				got := Next(Facts{Outcome: k.outcome, PriorUncertain: k.uncertain, BudgetLeft: k.budget, Mode: mode})
				is.Equal(got, w) // docs/protocol.md#finish
			})
		}
	}
	is.New(t).Equal(len(want), 15*4) // every observation a call can produce is in the table
}

// TestNextNoneModeParksOnUncertainty: a channel with neither key nor query cannot recover an
// uncertain attempt, so the first uncertain observation parks even with budget left.
func TestNextNoneModeParksOnUncertainty(t *testing.T) {
	is := is.New(t)
	for _, o := range []Outcome{OutcomeTimeout, OutcomeIOError, OutcomeGatewayError, OutcomeInFlight, OutcomeMalformed} {
		got := Next(Facts{Outcome: o, BudgetLeft: true, Mode: ModeNone})
		is.Equal(got, Transition{State: StateUnknown, Uncertain: true, Park: true}) // parked at once
	}
	got := Next(Facts{Outcome: OutcomeHTTP5xx, BudgetLeft: true, Mode: ModeNone})
	is.Equal(got.State, StatePending) // a refusal before acceptance is still retried
}

// TestNextNeverWritesOffUncertain is R6 over every outcome, including ones Next does not know.
func TestNextNeverWritesOffUncertain(t *testing.T) {
	is := is.New(t)
	outcomes := []Outcome{OutcomeAccepted, OutcomeAcceptedReplay, OutcomeQueryFound, OutcomeQueryNotFound,
		OutcomeQueryFailed, OutcomeTimeout, OutcomeIOError, OutcomeConnectFailed, OutcomeInFlight, OutcomeMalformed,
		OutcomeHTTP5xx, OutcomeGatewayError, OutcomeThrottled, OutcomeRejected, OutcomeLeaseExpired, "SOMETHING_NEW", ""}
	for _, o := range outcomes {
		for _, mode := range []Mode{ModeIdempotent, ModeQueryable, ModeNone, ""} {
			for _, b := range []bool{false, true} {
				got := Next(Facts{Outcome: o, PriorUncertain: true, BudgetLeft: b, Mode: mode})
				if o != OutcomeQueryNotFound {
					is.True(got.State != StateFailed && got.State != StateSuppressed) // uncertain history is never written off
				}
				is.True(!got.Park || got.State == StateUnknown) // only UNKNOWN parks
				is.True(!(got.Park && got.Retry))               // parked means no retry
			}
		}
	}
}

// TestDecide is Decide's whole table (docs/protocol.md#claim-time-decisions,
// docs/protocol.md#action-choice, docs/protocol.md#contract-keys): each row one branch, and each
// threshold (budget, max_in_flight_age, idempotency_window) on both sides of its edge.
func TestDecide(t *testing.T) {
	base := ClaimFacts{PrefEnabled: true, AttemptCount: 0, MaxAttempts: 3, Mode: ModeQueryable}
	callSend := ClaimDecision{Kind: ClaimCall, Action: ActionSend}
	resend := ClaimDecision{Kind: ClaimCall, Action: ActionSend, Uncertain: true}
	query := ClaimDecision{Kind: ClaimCall, Action: ActionQuery, Uncertain: true}
	park := ClaimDecision{Kind: ClaimPark, Uncertain: true}
	cases := []struct {
		name string
		edit func(*ClaimFacts)
		want ClaimDecision
	}{
		{"fresh send", func(*ClaimFacts) {}, callSend},
		{"fresh send on a none channel", func(f *ClaimFacts) { f.Mode = ModeNone }, callSend},
		{"fresh send with the last attempt of the budget", func(f *ClaimFacts) { f.AttemptCount = 2 }, callSend},
		{"uncertain queryable queries", func(f *ClaimFacts) { f.Uncertain = true }, query},
		{"lease expired queryable queries", func(f *ClaimFacts) { f.LeaseExpired = true }, query},
		{"uncertain queryable with the last attempt of the budget queries", func(f *ClaimFacts) { f.Uncertain, f.AttemptCount = true, 2 }, query},
		{"uncertain idempotent resends", func(f *ClaimFacts) { f.Uncertain, f.Mode = true, ModeIdempotent }, resend},
		{"uncertain none parks", func(f *ClaimFacts) { f.LeaseExpired, f.Mode = true, ModeNone }, park},
		{"uncertain unknown mode parks", func(f *ClaimFacts) { f.Uncertain, f.Mode = true, "" }, park},
		{"uncertain none with topic resends as TOPIC_RESEND", func(f *ClaimFacts) {
			f.Uncertain, f.Mode, f.Contract.ResendWithTopic = true, ModeNone, true
		}, ClaimDecision{Kind: ClaimCall, Action: ActionTopicResend, Uncertain: true}},
		{"topic resend is only for none channels", func(f *ClaimFacts) {
			f.Uncertain, f.Mode, f.Contract.ResendWithTopic = true, ModeIdempotent, true
		}, resend},
		{"budget used on takeover parks", func(f *ClaimFacts) { f.LeaseExpired, f.AttemptCount = true, 3 }, park},
		{"budget overrun parks", func(f *ClaimFacts) { f.Uncertain, f.AttemptCount = true, 4 }, park},

		{"younger than max_in_flight_age queries", func(f *ClaimFacts) {
			f.Uncertain, f.Contract.MaxInFlightAge, f.UncertainAge = true, time.Hour, time.Hour-time.Nanosecond
		}, query},
		{"as old as max_in_flight_age parks", func(f *ClaimFacts) {
			f.Uncertain, f.Contract.MaxInFlightAge, f.UncertainAge = true, time.Hour, time.Hour
		}, park},
		{"max_in_flight_age parks an idempotent channel too", func(f *ClaimFacts) {
			f.Uncertain, f.Mode, f.Contract.MaxInFlightAge, f.UncertainAge = true, ModeIdempotent, time.Hour, 2*time.Hour
		}, park},
		{"no max_in_flight_age: no age bound", func(f *ClaimFacts) { f.Uncertain, f.UncertainAge = true, 1000*time.Hour }, query},
		{"max_in_flight_age does not touch a certain task", func(f *ClaimFacts) {
			f.Contract.MaxInFlightAge, f.UncertainAge = time.Hour, 2*time.Hour
		}, callSend},

		{"inside the idempotency window resends", func(f *ClaimFacts) {
			f.Uncertain, f.Mode, f.Contract.IdempotencyWindow, f.UncertainAge = true, ModeIdempotent, time.Hour, time.Hour-time.Nanosecond
		}, resend},
		{"at the end of the idempotency window parks", func(f *ClaimFacts) {
			f.LeaseExpired, f.Mode, f.Contract.IdempotencyWindow, f.UncertainAge = true, ModeIdempotent, time.Hour, time.Hour
		}, park},
		{"no idempotency window: keys never expire", func(f *ClaimFacts) {
			f.Uncertain, f.Mode, f.UncertainAge = true, ModeIdempotent, 1000*time.Hour
		}, resend},
		{"the idempotency window is not a queryable channel's", func(f *ClaimFacts) {
			f.Uncertain, f.Contract.IdempotencyWindow, f.UncertainAge = true, time.Hour, 2*time.Hour
		}, query},

		{"disabled suppresses", func(f *ClaimFacts) { f.PrefEnabled = false },
			ClaimDecision{Kind: ClaimSettle, State: StateSuppressed, Outcome: OutcomePrefDisabled}},
		{"expired fails", func(f *ClaimFacts) { f.Expired = true },
			ClaimDecision{Kind: ClaimSettle, State: StateFailed, Outcome: OutcomeTTLExpired}},
		{"disabled and expired suppresses", func(f *ClaimFacts) { f.PrefEnabled, f.Expired = false, true },
			ClaimDecision{Kind: ClaimSettle, State: StateSuppressed, Outcome: OutcomePrefDisabled}},
		{"disabled with the budget used up still suppresses", func(f *ClaimFacts) { f.PrefEnabled, f.AttemptCount = false, 3 },
			ClaimDecision{Kind: ClaimSettle, State: StateSuppressed, Outcome: OutcomePrefDisabled}},
		{"disabled with uncertain history parks", func(f *ClaimFacts) { f.PrefEnabled, f.Uncertain = false, true },
			ClaimDecision{Kind: ClaimSettle, State: StateUnknown, Outcome: OutcomePrefDisabledUncertain, Uncertain: true}},
		{"expired with uncertain history parks", func(f *ClaimFacts) { f.Expired, f.LeaseExpired = true, true },
			ClaimDecision{Kind: ClaimSettle, State: StateUnknown, Outcome: OutcomeTTLExpiredUncertain, Uncertain: true}},

		{"cancelled suppresses", func(f *ClaimFacts) { f.Cancelled = true },
			ClaimDecision{Kind: ClaimSettle, State: StateSuppressed, Outcome: OutcomeCancelled}},
		{"cancelled with uncertain history parks", func(f *ClaimFacts) { f.Cancelled, f.Uncertain = true, true },
			ClaimDecision{Kind: ClaimSettle, State: StateUnknown, Outcome: OutcomeCancelledUncertain, Uncertain: true}},
		{"cancelled after a lease expired parks", func(f *ClaimFacts) { f.Cancelled, f.LeaseExpired = true, true },
			ClaimDecision{Kind: ClaimSettle, State: StateUnknown, Outcome: OutcomeCancelledUncertain, Uncertain: true}},
		{"cancelled before disabled and expired: the cancel names the settle", func(f *ClaimFacts) {
			f.Cancelled, f.PrefEnabled, f.Expired = true, false, true
		}, ClaimDecision{Kind: ClaimSettle, State: StateSuppressed, Outcome: OutcomeCancelled}},
		{"cancelled with the budget used up and an uncertain history parks with the cancel's outcome", func(f *ClaimFacts) {
			f.Cancelled, f.Uncertain, f.AttemptCount = true, true, 3
		}, ClaimDecision{Kind: ClaimSettle, State: StateUnknown, Outcome: OutcomeCancelledUncertain, Uncertain: true}},
		{"a receipt settles", func(f *ClaimFacts) { f.ReceiptNoted = true }, ClaimDecision{Kind: ClaimReceipt}},
		{"a receipt settles whatever else holds", func(f *ClaimFacts) {
			f.ReceiptNoted, f.PrefEnabled, f.Expired, f.Uncertain, f.AttemptCount, f.Mode, f.Cancelled = true, false, true, true, 3, ModeNone, true
		}, ClaimDecision{Kind: ClaimReceipt}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			f := base
			c.edit(&f)
			got := Decide(f)
			is.Equal(got.Reason == "", got.Kind == ClaimCall) // a decision not to call says why, for last_error
			got.Reason = ""
			is.Equal(got, c.want)
		})
	}
}

// TestNextContract: the contract keys' rows of docs/protocol.md#contract-keys, at the finish.
func TestNextContract(t *testing.T) {
	retryUnknown := Transition{State: StateUnknown, Uncertain: true, Retry: true}
	parked := Transition{State: StateUnknown, Uncertain: true, Park: true}
	retryPending := Transition{State: StatePending, Retry: true}
	settle := Contract{QuerySettle: 10 * time.Second}
	cases := []struct {
		name  string
		facts Facts
		want  Transition
	}{
		{"not found before the settle time: asked again once it has passed",
			Facts{Outcome: OutcomeQueryNotFound, PriorUncertain: true, BudgetLeft: true, Mode: ModeQueryable, Contract: settle, UncertainAge: 3 * time.Second},
			Transition{State: StateUnknown, Uncertain: true, Retry: true, NotBefore: 7 * time.Second}},
		{"not found just before the settle time",
			Facts{Outcome: OutcomeQueryNotFound, PriorUncertain: true, BudgetLeft: true, Mode: ModeQueryable, Contract: settle, UncertainAge: 10*time.Second - time.Nanosecond},
			Transition{State: StateUnknown, Uncertain: true, Retry: true, NotBefore: time.Nanosecond}},
		{"not found at the settle time is trusted",
			Facts{Outcome: OutcomeQueryNotFound, PriorUncertain: true, BudgetLeft: true, Mode: ModeQueryable, Contract: settle, UncertainAge: 10 * time.Second},
			retryPending},
		{"not found before the settle time with the budget used up parks (not FAILED)",
			Facts{Outcome: OutcomeQueryNotFound, PriorUncertain: true, Mode: ModeQueryable, Contract: settle, UncertainAge: time.Second},
			parked},
		{"not found after the settle time with the budget used up fails",
			Facts{Outcome: OutcomeQueryNotFound, PriorUncertain: true, Mode: ModeQueryable, Contract: settle, UncertainAge: time.Minute},
			Transition{State: StateFailed}},
		{"the settle time concerns only an uncertain history",
			Facts{Outcome: OutcomeQueryNotFound, BudgetLeft: true, Mode: ModeQueryable, Contract: settle},
			retryPending},

		{"server_errors_uncertain: a 5xx is a timeout",
			Facts{Outcome: OutcomeHTTP5xx, BudgetLeft: true, Mode: ModeIdempotent, Contract: Contract{ServerErrorsUncertain: true}},
			retryUnknown},
		{"server_errors_uncertain: a 429 is a timeout",
			Facts{Outcome: OutcomeThrottled, BudgetLeft: true, Mode: ModeQueryable, Contract: Contract{ServerErrorsUncertain: true}},
			retryUnknown},
		{"throttle_refuses: a 429 is a refusal, retried, though 5xx are uncertain",
			Facts{Outcome: OutcomeThrottled, BudgetLeft: true, Mode: ModeNone, Contract: Contract{ServerErrorsUncertain: true, ThrottleRefuses: true}},
			retryPending},
		{"throttle_refuses: a 429 with the budget used up fails (nothing was accepted)",
			Facts{Outcome: OutcomeThrottled, Mode: ModeNone, Contract: Contract{ServerErrorsUncertain: true, ThrottleRefuses: true}},
			Transition{State: StateFailed}},
		{"throttle_refuses: a 429 after an uncertain attempt still parks a none channel",
			Facts{Outcome: OutcomeThrottled, PriorUncertain: true, BudgetLeft: true, Mode: ModeNone, Contract: Contract{ServerErrorsUncertain: true, ThrottleRefuses: true}},
			parked},
		{"throttle_refuses leaves a 5xx uncertain",
			Facts{Outcome: OutcomeHTTP5xx, BudgetLeft: true, Mode: ModeNone, Contract: Contract{ServerErrorsUncertain: true, ThrottleRefuses: true}},
			parked},
		{"server_errors_uncertain on a none channel parks",
			Facts{Outcome: OutcomeHTTP5xx, BudgetLeft: true, Mode: ModeNone, Contract: Contract{ServerErrorsUncertain: true}},
			parked},
		{"server_errors_uncertain leaves a refused connection certain",
			Facts{Outcome: OutcomeConnectFailed, BudgetLeft: true, Mode: ModeIdempotent, Contract: Contract{ServerErrorsUncertain: true}},
			retryPending},

		{"resend_with_topic: a none channel retries an uncertain outcome",
			Facts{Outcome: OutcomeTimeout, BudgetLeft: true, Mode: ModeNone, Contract: Contract{ResendWithTopic: true}},
			retryUnknown},
		{"resend_with_topic: the budget still parks",
			Facts{Outcome: OutcomeTimeout, Mode: ModeNone, Contract: Contract{ResendWithTopic: true}},
			parked},
		{"resend_with_topic: a refusal after uncertainty is retried",
			Facts{Outcome: OutcomeHTTP5xx, PriorUncertain: true, BudgetLeft: true, Mode: ModeNone, Contract: Contract{ResendWithTopic: true}},
			retryUnknown},
		{"without it a refusal after uncertainty parks a none channel",
			Facts{Outcome: OutcomeHTTP5xx, PriorUncertain: true, BudgetLeft: true, Mode: ModeNone},
			parked},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			is.Equal(Next(c.facts), c.want)
		})
	}
}

func TestBackoffDelay(t *testing.T) {
	is := is.New(t)
	b := Backoff{Base: time.Second, Max: 5 * time.Second}
	is.Equal(b.Delay(0, 0), time.Second)                    // no attempt made yet: the base
	is.Equal(b.Delay(1, 0), time.Second)                    // first retry waits the base
	is.Equal(b.Delay(2, 0), 2*time.Second)                  // doubles
	is.Equal(b.Delay(3, 0), 4*time.Second)                  // doubles per attempt made
	is.Equal(b.Delay(4, 0), 5*time.Second)                  // capped
	is.Equal(b.Delay(10, 0), 5*time.Second)                 // stays capped
	is.Equal(b.Delay(1, 3*time.Second), 3*time.Second)      // a longer Retry-After wins
	is.Equal(b.Delay(1, 100*time.Millisecond), time.Second) // a shorter one does not
	is.Equal(b.Delay(4, time.Minute), time.Minute)          // a Retry-After beyond the cap is honoured
	is.Equal(b.Delay(3, 4*time.Second), 4*time.Second)      // an equal one changes nothing

	exact := Backoff{Base: time.Second, Max: 4 * time.Second}
	is.Equal(exact.Delay(3, 0), 4*time.Second)  // reaches the cap exactly
	is.Equal(exact.Delay(20, 0), 4*time.Second) // and stays there

	// A zero Max (the Dispatcher fills in DefaultMaxBackoff; a Backoff used directly may not) never
	// turns into no wait at all: the base, undoubled.
	is.Equal(Backoff{Base: time.Second}.Delay(1, 0), time.Second)
	is.Equal(Backoff{Base: time.Second}.Delay(3, 0), time.Second)
}

// ACCOUNT_REFUSED is refunded at both ends: Next neither writes the task off nor parks it, on any
// channel, and Decide does not count refused attempts against the budget.
func TestAccountRefusedIsRefunded(t *testing.T) {
	is := is.New(t)
	for _, mode := range []Mode{ModeIdempotent, ModeQueryable, ModeNone} {
		for _, u := range []bool{false, true} {
			got := Next(Facts{Outcome: OutcomeAccountRefused, PriorUncertain: u, BudgetLeft: false, Mode: mode})
			is.True(got.Refund)               // not counted against the budget
			is.True(got.Retry)                // tried again once the channel resumes
			is.True(!got.Park)                // never parked for an account state
			is.True(got.State != StateFailed) // never written off
			is.Equal(got.Uncertain, u)        // an uncertain history stays uncertain
		}
	}
	for _, o := range []Outcome{OutcomeRejected, OutcomeHTTP5xx, OutcomeTimeout, OutcomeAccepted} {
		is.True(!Next(Facts{Outcome: o, BudgetLeft: true, Mode: ModeIdempotent}).Refund) // only ACCOUNT_REFUSED is refunded
	}
	// 3 attempts made, 2 of them refused for the account: one counted, budget of 2 left.
	d := Decide(ClaimFacts{PrefEnabled: true, Uncertain: true, AttemptCount: 3, AccountRefusals: 2, MaxAttempts: 2, Mode: ModeIdempotent})
	is.Equal(d, ClaimDecision{Kind: ClaimCall, Action: ActionSend, Uncertain: true}) // still within budget
	d = Decide(ClaimFacts{PrefEnabled: true, Uncertain: true, AttemptCount: 3, AccountRefusals: 1, MaxAttempts: 2, Mode: ModeIdempotent})
	is.Equal(d.Kind, ClaimPark) // two counted attempts: the budget of 2 is used up
}
