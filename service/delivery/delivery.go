// Package delivery is the vocabulary of the delivery protocol and its pure decisions, with no
// dependency beyond the standard library: what a channel call can observe (Outcome, Observation), what
// a channel is (Channel, Mode, Contract), what a task's states are, and the two functions that map facts
// to the next step (Decide at claim time, Next at finish). The channel adapters depend on this package
// only; the service package runs the protocol in PostgreSQL around it.
package delivery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// State is what the service knows about one delivery task.
type State string

const (
	StatePending    State = "PENDING"    // waiting for a claim; nothing was accepted yet
	StateSending    State = "SENDING"    // a holder with a lease and a token is calling the channel
	StateSent       State = "SENT"       // the channel accepted the request (not: the user saw it)
	StateUnknown    State = "UNKNOWN"    // an attempt may have been accepted; retried per channel mode or parked
	StateFailed     State = "FAILED"     // certainly never accepted, and will not be retried
	StateSuppressed State = "SUPPRESSED" // certainly never accepted; the user disabled the channel
)

// Mode is what a channel's contract lets the service do after a call whose outcome is unknown.
type Mode string

const (
	ModeIdempotent Mode = "IDEMPOTENT" // resend with the same idempotency key; the channel dedupes
	ModeQueryable  Mode = "QUERYABLE"  // ask the channel by reference first; resend only if not found
	ModeNone       Mode = "NONE"       // neither: an uncertain task is parked for a human
)

// ParseMode accepts idempotent, queryable or none (any case).
func ParseMode(s string) (Mode, error) {
	switch m := Mode(upper(s)); m {
	case ModeIdempotent, ModeQueryable, ModeNone:
		return m, nil
	}
	return "", fmt.Errorf("%w: channel mode %q: want idempotent, queryable or none", ErrInvalidInput, s)
}

// Recoverable reports whether an uncertain task on this channel can be settled without a human.
func (m Mode) Recoverable() bool { return m == ModeIdempotent || m == ModeQueryable }

// Action is what an attempt does with the channel.
type Action string

const (
	ActionSend        Action = "SEND"         // POST the message (with the task's idempotency key)
	ActionTopicResend Action = "TOPIC_RESEND" // resend that replaces the first copy only if still undelivered
	ActionQuery       Action = "QUERY"        // look the task's reference up at the channel
	ActionSkip        Action = "SKIP"         // decided at claim time not to call
	ActionManual      Action = "MANUAL"       // a human's resolution
	ActionReceipt     Action = "RECEIPT"      // settled by a provider's receipt (notifier receipts)
)

// Outcome is what one attempt observed. Attempt rows keep it verbatim.
type Outcome string

const (
	OutcomeAccepted       Outcome = "ACCEPTED"           // the channel accepted a new message
	OutcomeAcceptedReplay Outcome = "ACCEPTED_REPLAY"    // the channel returned the original acceptance for our key
	OutcomeQueryFound     Outcome = "QUERY_FOUND"        // the channel has a message for our reference
	OutcomeQueryNotFound  Outcome = "QUERY_NOT_FOUND"    // the channel has none (trusted for a consistent query)
	OutcomeQueryFailed    Outcome = "QUERY_FAILED"       // the query gave no usable answer
	OutcomeTimeout        Outcome = "TIMEOUT"            // no answer within the client timeout
	OutcomeIOError        Outcome = "IO_ERROR"           // the connection broke after the request may have gone out
	OutcomeConnectFailed  Outcome = "CONNECT_FAILED"     // no connection was made: the request certainly never left
	OutcomeInFlight       Outcome = "IN_FLIGHT"          // 409: the channel is still processing our key
	OutcomeMalformed      Outcome = "MALFORMED_RESPONSE" // a 2xx we cannot read: it may have been accepted
	OutcomeHTTP5xx        Outcome = "HTTP_5XX"           // refused before acceptance (the channel's promise)
	OutcomeGatewayError   Outcome = "GATEWAY_ERROR"      // 502/504, or a 5xx through a forward proxy: may have been passed on and accepted
	OutcomeThrottled      Outcome = "THROTTLED"          // 429: refused before acceptance, retry later
	OutcomeRejected       Outcome = "REJECTED"           // 4xx: the channel will never accept this request
	// OutcomeAccountRefused: the provider refused this request because of a state of our account that an
	// operator can fix (a rejected or expired credential, a paused sending account, a sender not allowed
	// to send). Certainly not accepted, and not the task's fault: the channel is paused for every worker
	// instead of the task being written off (docs/channels.md#account-states).
	OutcomeAccountRefused Outcome = "ACCOUNT_REFUSED"
	OutcomeLeaseExpired   Outcome = "LEASE_EXPIRED" // the holder vanished before recording anything

	OutcomePrefDisabled          Outcome = "PREF_DISABLED"
	OutcomeTTLExpired            Outcome = "TTL_EXPIRED"
	OutcomePrefDisabledUncertain Outcome = "PREF_DISABLED_UNCERTAIN"
	OutcomeTTLExpiredUncertain   Outcome = "TTL_EXPIRED_UNCERTAIN"

	// A cancel (notifier cancel, schema/005) settled the task without a call: CANCELLED when no attempt
	// may have been accepted (SUPPRESSED), CANCELLED_UNCERTAIN when one may have been (parked: the cancel
	// met an unknown outcome, and a human resolves it).
	OutcomeCancelled          Outcome = "CANCELLED"
	OutcomeCancelledUncertain Outcome = "CANCELLED_UNCERTAIN"

	// OutcomeFallbackNotNeeded: a later channel of a fallback chain was never called because an earlier
	// one was SENT (schema/005); the task is SUPPRESSED.
	OutcomeFallbackNotNeeded Outcome = "FALLBACK_NOT_NEEDED"

	OutcomeManualSent   Outcome = "MANUAL_SENT"
	OutcomeManualFailed Outcome = "MANUAL_FAILED"

	OutcomeReceiptAccepted Outcome = "RECEIPT_ACCEPTED" // a provider's receipt proved it had the message
)

// Observation is what a channel call reported, before it is mapped to a task state.
type Observation struct {
	Outcome       Outcome
	ProviderMsgID string        // the channel's id for the message, when it told us
	RetryAfter    time.Duration // the channel's Retry-After, when it sent one
	Detail        string        // a short description for last_error; never contains secrets
	// Unregistered, with OutcomeRejected: the provider says the address is gone for good (FCM
	// UNREGISTERED, APNs 410 Unregistered, an inactive recipient). `work --disable-on-unregistered`
	// then switches the user's preference on the channel off, as a hard bounce receipt can.
	Unregistered bool
}

// Message is what a send carries. Ref and IdempotencyKey are bound to the task, identical on every
// attempt, and never name another task: Ref is the task's random reference, stored with it (tasks
// created before references were random keep task-<id>).
type Message struct {
	Ref            string // the task's reference (delivery_task.ref)
	IdempotencyKey string // IdempotencyKey(Ref): ntf-<ref>
	To             string // the user's address on the channel (channel_pref.address)
	Body           string
	ExpiresAt      time.Time // the notification's expiry: a channel should not deliver after it
	Action         Action    // SEND, or TOPIC_RESEND for a resend meant to replace an undelivered copy
}

// Channel is one external channel as the dispatcher calls it. Implementations never return an error:
// every failure is an Observation, because what matters is whether the request may have been accepted.
type Channel interface {
	Send(ctx context.Context, msg Message) Observation
	Query(ctx context.Context, ref string) Observation
}

// IdempotencyKey is a task's key for a channel that deduplicates: derived from the task's reference,
// so it is the same on every attempt and an idempotent channel can dedupe a resend.
func IdempotencyKey(ref string) string { return KeyPrefix + ref }

// KeyPrefix starts every idempotency key; a receipt may carry our reference with or without it.
const KeyPrefix = "ntf-"

// ParseRef reads our reference of a task as a provider carries it back: the reference itself, or the
// idempotency key (ntf-<ref>). ok is false for anything that cannot be one of ours.
func ParseRef(s string) (ref string, ok bool) {
	ref = strings.TrimPrefix(strings.TrimSpace(s), KeyPrefix)
	if !validRef(ref) {
		return "", false
	}
	return ref, true
}

// validRef is the schema's delivery_task_ref_check: a lowercase UUID (gen_random_uuid, every task since
// schema/001), or task-<id> (a task created before, which keeps the reference it was sent with).
func validRef(ref string) bool {
	if id, ok := strings.CutPrefix(ref, "task-"); ok {
		return id != "" && len(id) <= 19 && id[0] != '0' && strings.Trim(id, "0123456789") == ""
	}
	if len(ref) != 36 {
		return false
	}
	for i, c := range []byte(ref) {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
		}
	}
	return true
}

// Errors callers can test for with errors.Is.
var (
	ErrInvalidInput = errors.New("invalid input")
	ErrNotFound     = errors.New("not found")
)

// InputError says which input was rejected and why. It matches ErrInvalidInput.
type InputError struct {
	Field  string
	Reason string
}

func (e *InputError) Error() string        { return fmt.Sprintf("invalid %s: %s", e.Field, e.Reason) }
func (e *InputError) Is(target error) bool { return target == ErrInvalidInput }

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// Contract refines a channel's Mode with what its provider documents. The zero value is the fakes'
// contract: keys never expire, queries are immediately consistent, 5xx is answered before acceptance.
type Contract struct {
	// IdempotencyWindow is how long the channel remembers an idempotency key. A resend later than this
	// after the first uncertain attempt began would not be deduplicated, so the task is parked instead.
	// 0: forever.
	IdempotencyWindow time.Duration
	// QuerySettle is how long after an uncertain attempt began its query may still miss it. A
	// QUERY_NOT_FOUND before then proves nothing: the task stays uncertain and is queried again later.
	// 0: the query is immediately consistent.
	QuerySettle time.Duration
	// MaxInFlightAge bounds automatic recovery: once the first uncertain attempt began this long ago,
	// the task is parked rather than retried again. 0: no bound beyond the attempt budget.
	MaxInFlightAge time.Duration
	// ServerErrorsUncertain makes the provider's own 5xx and 429 (HTTP_5XX, THROTTLED) count as "may
	// have been accepted", for providers that do not promise to refuse before accepting. A gateway's
	// answer (GATEWAY_ERROR: 502, 504, a 5xx through a forward proxy) is uncertain either way.
	ServerErrorsUncertain bool
	// ThrottleRefuses keeps a 429 (THROTTLED) a refusal, retried after its Retry-After, where
	// ServerErrorsUncertain makes the provider's 5xx uncertain: for providers whose documentation says a
	// throttled request was not processed (Twilio's 20429, SES's throttling errors). A channels file
	// cannot set it: the kind does, from its provider's documentation.
	ThrottleRefuses bool
	// ResendWithTopic lets a NONE channel that supports replacement of undelivered messages (Web Push
	// Topic, RFC 8030 section 5.4) resend after an uncertain attempt (action TOPIC_RESEND) instead of
	// parking. It replaces the first message only if that one was not delivered yet.
	ResendWithTopic bool
}
