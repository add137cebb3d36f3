package delivery

import "time"

// Facts are what the finish step knows when it maps an observation to a task state.
type Facts struct {
	Outcome        Outcome
	PriorUncertain bool // an earlier attempt of this task may have been accepted (incl. an expired lease)
	BudgetLeft     bool // attempts counted against the budget (attempt_count - account_refusals) < max_attempts after this attempt
	Mode           Mode
	Contract       Contract
	UncertainAge   time.Duration // with PriorUncertain: how long ago the uncertain attempt began
}

// Transition is the task's next state after an observation.
type Transition struct {
	State     State
	Uncertain bool          // outcome_uncertain after this attempt
	Park      bool          // needs_review: stop automatic processing
	Retry     bool          // schedule another attempt after a backoff
	NotBefore time.Duration // with Retry: wait at least this long, whatever the backoff
	Refund    bool          // the attempt does not count against the budget (ACCOUNT_REFUSED)
}

// recoverable reports whether an uncertain task on this channel may be retried without a human.
func recoverable(m Mode, c Contract) bool {
	return m.Recoverable() || (m == ModeNone && c.ResendWithTopic)
}

// Next maps one observation to the task's next state: docs/protocol.md#finish, plus two rules of this project:
// a channel that cannot recover from uncertainty (ModeNone) parks at the first uncertain observation,
// and an outcome it does not know is treated as uncertain. The invariant it keeps (R6): with an
// uncertain history the only way to FAILED is a query that found nothing.
func Next(f Facts) Transition {
	switch f.Outcome {
	case OutcomeAccepted, OutcomeAcceptedReplay, OutcomeQueryFound:
		return Transition{State: StateSent}

	case OutcomeQueryNotFound:
		// Proof that nothing was accepted only once the query has had time to see the uncertain attempt
		// (immediately, for a consistent query). Before that, ask again when it has.
		if settle := f.Contract.QuerySettle; f.PriorUncertain && f.UncertainAge < settle {
			t := uncertain(f)
			if t.Retry {
				t.NotBefore = settle - f.UncertainAge
			}
			return t
		}
		if f.BudgetLeft {
			return Transition{State: StatePending, Retry: true}
		}
		return Transition{State: StateFailed}

	case OutcomeHTTP5xx, OutcomeThrottled:
		// The provider may refuse after accepting, unless it documents its 429 as "not processed".
		if f.Contract.ServerErrorsUncertain && !(f.Outcome == OutcomeThrottled && f.Contract.ThrottleRefuses) {
			return uncertain(f)
		}
		fallthrough
	case OutcomeConnectFailed:
		// Refused before acceptance: this attempt was not accepted, an earlier one still may have been.
		if f.PriorUncertain {
			return uncertain(f)
		}
		if f.BudgetLeft {
			return Transition{State: StatePending, Retry: true}
		}
		return Transition{State: StateFailed}

	case OutcomeAccountRefused:
		// Certainly not accepted, and not the task's fault: the attempt is refunded (Refund: it does not
		// count against the budget) and the task waits for its channel's pause to end. Never FAILED,
		// never parked for it; an earlier attempt that may have been accepted keeps the task uncertain.
		if f.PriorUncertain {
			return Transition{State: StateUnknown, Uncertain: true, Retry: true, Refund: true}
		}
		return Transition{State: StatePending, Retry: true, Refund: true}

	case OutcomeRejected:
		if f.PriorUncertain {
			return Transition{State: StateUnknown, Uncertain: true, Park: true}
		}
		return Transition{State: StateFailed}

	default:
		// TIMEOUT, IO_ERROR, GATEWAY_ERROR, QUERY_FAILED, IN_FLIGHT, MALFORMED_RESPONSE, and anything
		// unforeseen. GATEWAY_ERROR is here, never with HTTP_5XX: the promise that a 5xx comes before
		// acceptance is the provider's, and a gateway (a forward proxy, the provider's load balancer)
		// that may have passed the request on makes none, whatever the Contract says.
		return uncertain(f)
	}
}

func uncertain(f Facts) Transition {
	if !f.BudgetLeft || !recoverable(f.Mode, f.Contract) {
		return Transition{State: StateUnknown, Uncertain: true, Park: true}
	}
	return Transition{State: StateUnknown, Uncertain: true, Retry: true}
}

// ClaimFacts are what a claim reads, in its transaction, about the task it locked.
type ClaimFacts struct {
	Uncertain    bool // outcome_uncertain on the task
	LeaseExpired bool // taken over from a holder whose lease ran out
	PrefEnabled  bool
	Expired      bool
	Cancelled    bool // the notification was cancelled (notifier cancel) while the task was held or waiting
	AttemptCount int
	// AccountRefusals are the attempts refused for an account state (ACCOUNT_REFUSED): refunded, they
	// do not count against MaxAttempts.
	AccountRefusals int
	MaxAttempts     int
	Mode            Mode
	Contract        Contract
	UncertainAge    time.Duration // how long ago the uncertain attempt began (with Uncertain or LeaseExpired)
	ReceiptNoted    bool          // a provider's receipt arrived while the task was held: it had the message
}

// ClaimKind says what a claim does with the task it locked.
type ClaimKind int

const (
	ClaimCall    ClaimKind = iota // call the channel with Action
	ClaimSettle                   // no call: write State with Outcome (suppression, expiry or cancel)
	ClaimPark                     // no call, no attempt: park for review
	ClaimReceipt                  // no call: a provider's receipt settles the task as SENT
)

// ClaimDecision is the outcome of Decide.
type ClaimDecision struct {
	Kind      ClaimKind
	Action    Action  // ClaimCall
	Uncertain bool    // the attempt starts with an uncertain history
	State     State   // ClaimSettle
	Outcome   Outcome // ClaimSettle
	Reason    string  // ClaimSettle, ClaimPark: for last_error
}

// Decide is the claim-time half of the protocol (docs/protocol.md#claim-time-decisions, docs/protocol.md#action-choice). A "not sent" state is chosen
// only without uncertain history (R6); a channel that can neither dedupe nor be queried is never
// called again once uncertain.
func Decide(f ClaimFacts) ClaimDecision {
	if f.ReceiptNoted { // the provider had it: whatever else holds now, nothing more may be sent
		return ClaimDecision{Kind: ClaimReceipt, Reason: "a provider's receipt arrived while the task was held"}
	}
	uncertain := f.Uncertain || f.LeaseExpired
	if f.Cancelled { // the submitter took the event back: never called again, never written off if uncertain
		if uncertain {
			return ClaimDecision{Kind: ClaimSettle, Uncertain: true, State: StateUnknown, Outcome: OutcomeCancelledUncertain,
				Reason: "notification cancelled before the call; an earlier attempt may have been accepted"}
		}
		return ClaimDecision{Kind: ClaimSettle, State: StateSuppressed, Outcome: OutcomeCancelled,
			Reason: "notification cancelled before the call"}
	}
	if !f.PrefEnabled || f.Expired {
		outcome, uncertainOutcome, state, reason := OutcomePrefDisabled, OutcomePrefDisabledUncertain, StateSuppressed,
			"channel disabled by the user before the call"
		if f.PrefEnabled {
			outcome, uncertainOutcome, state, reason = OutcomeTTLExpired, OutcomeTTLExpiredUncertain, StateFailed,
				"notification expired before the call"
		}
		if uncertain {
			return ClaimDecision{Kind: ClaimSettle, Uncertain: true, State: StateUnknown,
				Outcome: uncertainOutcome, Reason: reason + "; an earlier attempt may have been accepted"}
		}
		return ClaimDecision{Kind: ClaimSettle, State: state, Outcome: outcome, Reason: reason}
	}
	if f.AttemptCount-f.AccountRefusals >= f.MaxAttempts {
		return ClaimDecision{Kind: ClaimPark, Uncertain: true,
			Reason: "attempt budget used up while the last attempt's outcome is unknown"}
	}
	if !uncertain {
		return ClaimDecision{Kind: ClaimCall, Action: ActionSend}
	}
	// The conditions are if statements rather than the cases of a switch: coverage profiles (and so
	// `just mutants`) count a tagless switch's case expressions as no statement, never covered.
	c := f.Contract
	if c.MaxInFlightAge > 0 && f.UncertainAge >= c.MaxInFlightAge {
		return ClaimDecision{Kind: ClaimPark, Uncertain: true,
			Reason: "outcome unknown for longer than the channel's max_in_flight_age"}
	}
	switch f.Mode {
	case ModeQueryable:
		return ClaimDecision{Kind: ClaimCall, Action: ActionQuery, Uncertain: true}
	case ModeIdempotent:
		if c.IdempotencyWindow > 0 && f.UncertainAge >= c.IdempotencyWindow {
			return ClaimDecision{Kind: ClaimPark, Uncertain: true,
				Reason: "the channel's idempotency window has passed: a resend would not be deduplicated"}
		}
		return ClaimDecision{Kind: ClaimCall, Action: ActionSend, Uncertain: true}
	case ModeNone:
		if c.ResendWithTopic {
			return ClaimDecision{Kind: ClaimCall, Action: ActionTopicResend, Uncertain: true}
		}
	}
	return ClaimDecision{Kind: ClaimPark, Uncertain: true,
		Reason: "an earlier attempt may have been accepted and the channel offers neither idempotency key nor query"}
}

// Backoff spaces retries: Base doubled per attempt already made, at most Max.
type Backoff struct {
	Base time.Duration
	Max  time.Duration
}

// Delay is the wait before attempt number attempt+1, honouring a longer Retry-After from the channel.
func (b Backoff) Delay(attempt int, retryAfter time.Duration) time.Duration {
	d := b.Base
	for i := 1; i < attempt && d < b.Max; i++ {
		d *= 2
	}
	if b.Max > 0 && d > b.Max {
		d = b.Max
	}
	if retryAfter > d {
		d = retryAfter
	}
	return d
}
