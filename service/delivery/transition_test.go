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
	is.New(t).Equal(len(want), 14*4) // every observation a call can produce is in the table
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

func TestDecide(t *testing.T) {
	base := ClaimFacts{PrefEnabled: true, AttemptCount: 0, MaxAttempts: 3, Mode: ModeQueryable}
	cases := []struct {
		name string
		edit func(*ClaimFacts)
		want ClaimDecision
	}{
		{"fresh send", func(*ClaimFacts) {}, ClaimDecision{Kind: ClaimCall, Action: ActionSend}},
		{"uncertain queryable queries", func(f *ClaimFacts) { f.Uncertain = true },
			ClaimDecision{Kind: ClaimCall, Action: ActionQuery, Uncertain: true}},
		{"lease expired queryable queries", func(f *ClaimFacts) { f.LeaseExpired = true },
			ClaimDecision{Kind: ClaimCall, Action: ActionQuery, Uncertain: true}},
		{"uncertain idempotent resends", func(f *ClaimFacts) { f.Uncertain, f.Mode = true, ModeIdempotent },
			ClaimDecision{Kind: ClaimCall, Action: ActionSend, Uncertain: true}},
		{"uncertain none parks", func(f *ClaimFacts) { f.LeaseExpired, f.Mode = true, ModeNone },
			ClaimDecision{Kind: ClaimPark, Uncertain: true}},
		{"budget used on takeover parks", func(f *ClaimFacts) { f.LeaseExpired, f.AttemptCount = true, 3 },
			ClaimDecision{Kind: ClaimPark, Uncertain: true}},
		{"disabled suppresses", func(f *ClaimFacts) { f.PrefEnabled = false },
			ClaimDecision{Kind: ClaimSettle, State: StateSuppressed, Outcome: OutcomePrefDisabled}},
		{"expired fails", func(f *ClaimFacts) { f.Expired = true },
			ClaimDecision{Kind: ClaimSettle, State: StateFailed, Outcome: OutcomeTTLExpired}},
		{"disabled with uncertain history parks", func(f *ClaimFacts) { f.PrefEnabled, f.Uncertain = false, true },
			ClaimDecision{Kind: ClaimSettle, State: StateUnknown, Outcome: OutcomePrefDisabledUncertain, Uncertain: true}},
		{"expired with uncertain history parks", func(f *ClaimFacts) { f.Expired, f.LeaseExpired = true, true },
			ClaimDecision{Kind: ClaimSettle, State: StateUnknown, Outcome: OutcomeTTLExpiredUncertain, Uncertain: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			f := base
			c.edit(&f)
			got := Decide(f)
			got.Reason = ""
			is.Equal(got, c.want)
		})
	}
}

func TestBackoffDelay(t *testing.T) {
	is := is.New(t)
	b := Backoff{Base: time.Second, Max: 5 * time.Second}
	is.Equal(b.Delay(1, 0), time.Second)                    // first retry waits the base
	is.Equal(b.Delay(2, 0), 2*time.Second)                  // doubles
	is.Equal(b.Delay(10, 0), 5*time.Second)                 // capped
	is.Equal(b.Delay(1, 3*time.Second), 3*time.Second)      // a longer Retry-After wins
	is.Equal(b.Delay(1, 100*time.Millisecond), time.Second) // a shorter one does not
}
