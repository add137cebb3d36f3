package service_test

// The delivery state machine in the database (schema/003), proven to bite for every role: each move below
// starts from a task the protocol's own moves produced (smFixture) and is run as the owner and as each of
// the three roles, on a fresh task each time. A forbidden move must be refused with the expected SQLSTATE
// and constraint (or hidden by row-level security: 0 rows) and change nothing; the protocol's legitimate
// moves must pass. TestStateMachineAllCovered fails when a trigger's rule or a policy has no case.

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/pgtest"
)

const (
	smOwner    = "owner" // the tables' owner: the test database's user
	smWorker   = "notifier_worker"
	smOperator = "notifier_operator"
	smCreator  = "notifier_creator"
	smReceiver = "notifier_receiver"
	sqlBadArg  = "22023" // invalid_parameter_value
)

var smRoles = []string{smOwner, smWorker, smOperator, smCreator, smReceiver}

// smWant is what one role must get from a statement. code "" means it succeeds, changing rows rows (0:
// row-level security hides the row, and policy names the policy that does).
type smWant struct {
	code       string // SQLSTATE
	constraint string // ConstraintName, for 23000 and 23514
	column     string // ColumnName the trigger names
	rows       int64  // with code "": rows changed
	policy     string // the row-level security policy this outcome exercises
}

func smRefused(constraint, column string) smWant {
	return smWant{code: sqlIntegrity, constraint: constraint, column: column}
}

var (
	smDenied = smWant{code: sqlInsufficient} // no privilege (or a policy's WITH CHECK: set policy)
	smOne    = smWant{rows: 1}
)

// smMove is one statement on a fixture task ($1), and what each role gets. Roles not listed in others
// (the operator, the creator and the receiver, which may neither update tasks nor write attempts) get
// smDenied.
type smMove struct {
	name    string
	fixture string // smFixture kind
	sql     string
	owner   smWant
	worker  smWant
	others  map[string]smWant
}

func (m smMove) want(role string) smWant {
	switch role {
	case smOwner:
		return m.owner
	case smWorker:
		return m.worker
	}
	if w, ok := m.others[role]; ok {
		return w
	}
	return smDenied
}

// Statements the protocol's queries make, by hand (test-only SQL), on the task $1.
const (
	smClaim = `WITH c AS (
		UPDATE delivery_task SET state = 'SENDING', attempt_token = gen_random_uuid(), lease_owner = 'w-sm',
		       lease_until = now() + interval '30 seconds', next_attempt_at = NULL, attempt_count = attempt_count + 1,
		       outcome_uncertain = outcome_uncertain OR state = 'SENDING',
		       uncertain_since = CASE WHEN outcome_uncertain OR state = 'SENDING' THEN coalesce(uncertain_since, updated_at) END
		WHERE id = $1 RETURNING id, attempt_count, attempt_token)
	INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
	SELECT id, attempt_count, attempt_token, 'SEND', 'w-sm' FROM c`
	smClaimTaskOnly = `UPDATE delivery_task SET state = 'SENDING', attempt_token = gen_random_uuid(), lease_owner = 'w-sm',
		lease_until = now() + interval '30 seconds', next_attempt_at = NULL, attempt_count = attempt_count + 1 WHERE id = $1`
	smTakeover = `WITH closed AS (
		UPDATE delivery_attempt SET outcome = 'LEASE_EXPIRED', finished_at = now()
		WHERE attempt_token = (SELECT attempt_token FROM delivery_task WHERE id = $1) AND outcome IS NULL
	), c AS (
		UPDATE delivery_task SET attempt_token = gen_random_uuid(), lease_owner = 'w-sm', lease_until = now() + interval '30 seconds',
		       attempt_count = attempt_count + 1, outcome_uncertain = true, uncertain_since = coalesce(uncertain_since, updated_at)
		WHERE id = $1 RETURNING id, attempt_count, attempt_token)
	INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
	SELECT id, attempt_count, attempt_token, 'SEND', 'w-sm' FROM c`
	smSettleSuppressed = `WITH s AS (
		UPDATE delivery_task SET state = 'SUPPRESSED', next_attempt_at = NULL, lease_owner = NULL, lease_until = NULL,
		       attempt_count = attempt_count + 1
		WHERE id = $1 RETURNING id, attempt_count)
	INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome)
	SELECT id, attempt_count, gen_random_uuid(), 'SKIP', 'w-sm', now(), 'PREF_DISABLED' FROM s`
	smSettleCancelled = `WITH s AS (
		UPDATE delivery_task SET state = 'SUPPRESSED', next_attempt_at = NULL, lease_owner = NULL, lease_until = NULL,
		       attempt_count = attempt_count + 1
		WHERE id = $1 RETURNING id, attempt_count)
	INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome)
	SELECT id, attempt_count, gen_random_uuid(), 'SKIP', 'w-sm', now(), 'CANCELLED' FROM s`
	smParkCancelled = `WITH s AS (
		UPDATE delivery_task SET state = 'UNKNOWN', needs_review = true, next_attempt_at = NULL, attempt_count = attempt_count + 1
		WHERE id = $1 RETURNING id, attempt_count)
	INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome)
	SELECT id, attempt_count, gen_random_uuid(), 'SKIP', 'w-sm', now(), 'CANCELLED_UNCERTAIN' FROM s`
	smPark = `UPDATE delivery_task SET state = 'UNKNOWN', needs_review = true, outcome_uncertain = true,
		uncertain_since = coalesce(uncertain_since, updated_at), next_attempt_at = NULL, lease_owner = NULL, lease_until = NULL,
		last_error = 'parked' WHERE id = $1`
)

// The receipt's function, and a receipt settle by hand that skips noting the receipt first.
const (
	smApplyReceipt         = `SELECT * FROM notifier_apply_receipt($1, NULL, 'receipt seen by the test')`
	smReceiptSettleUnnoted = `WITH s AS (
		UPDATE delivery_task SET state = 'SENT', outcome_uncertain = false, uncertain_since = NULL, next_attempt_at = NULL,
		       attempt_count = attempt_count + 1
		WHERE id = $1 RETURNING id, attempt_count)
	INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome)
	SELECT id, attempt_count, gen_random_uuid(), 'RECEIPT', 'w-sm', now(), 'RECEIPT_ACCEPTED' FROM s`
)

// smFinish is TaskFinish by hand: the holder's attempt records outcome, the task becomes set (SQL SET
// list; the lease is cleared), in one statement.
func smFinish(outcome, set string) string {
	return `WITH a AS (
		UPDATE delivery_attempt SET outcome = '` + outcome + `', finished_at = now()
		WHERE attempt_token = (SELECT attempt_token FROM delivery_task WHERE id = $1) AND outcome IS NULL)
	UPDATE delivery_task SET ` + set + `, lease_owner = NULL, lease_until = NULL WHERE id = $1`
}

var smMoves = []smMove{
	// Fallback chains (schema/005): an unreleased task moves only by its release, its settle as not
	// needed, or a cancel, each only when its chain says so; the fixture's head (push) is still waiting.
	{name: "unreleased fallback task made due by hand", fixture: "unreleased",
		sql:   `UPDATE delivery_task SET next_attempt_at = now(), last_error = 'released by hand' WHERE id = $1`,
		owner: smRefused("delivery_task_transition", "next_attempt_at"), worker: smRefused("delivery_task_transition", "next_attempt_at")},
	{name: "unreleased fallback task claimed", fixture: "unreleased", sql: smClaim,
		owner: smRefused("delivery_task_transition", "attempt_token"), worker: smRefused("delivery_task_transition", "attempt_token")},
	{name: "unreleased fallback task set aside to a time", fixture: "unreleased",
		sql:   `UPDATE delivery_task SET next_attempt_at = now() + interval '1 minute', last_error = 'later' WHERE id = $1`,
		owner: smRefused("delivery_task_transition", "next_attempt_at"), worker: smRefused("delivery_task_transition", "next_attempt_at")},
	{name: "unreleased fallback task settled as not needed before its chain was sent", fixture: "unreleased",
		sql: `WITH s AS (
			UPDATE delivery_task SET state = 'SUPPRESSED', attempt_count = attempt_count + 1 WHERE id = $1 RETURNING id, attempt_count)
		INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome)
		SELECT id, attempt_count, gen_random_uuid(), 'SKIP', 'w-sm', now(), 'FALLBACK_NOT_NEEDED' FROM s`,
		owner: smRefused("delivery_task_transition", "next_attempt_at"), worker: smRefused("delivery_task_transition", "next_attempt_at")},
	{name: "unreleased fallback task parked", fixture: "unreleased", sql: smPark,
		owner: smRefused("delivery_task_transition", "state"), worker: smRefused("delivery_task_transition", "state")},
	{name: "unreleased fallback task settled by a receipt it cannot have", fixture: "unreleased", sql: smApplyReceipt,
		owner: smRefused("delivery_task_transition", "state"), worker: smRefused("delivery_task_transition", "state"),
		others: map[string]smWant{smReceiver: smRefused("delivery_task_transition", "state")}},
	{name: "unreleased fallback task moved in its chain", fixture: "unreleased",
		sql:   `UPDATE delivery_task SET fallback_position = 3 WHERE id = $1`,
		owner: smRefused("delivery_task_fixed", "fallback_position"), worker: smDenied},
	// The trigger's WHEN lets a claim and a finish through without calling the function: it must hold
	// the fixed columns too, or a claim-shaped or finish-shaped UPDATE by the owner moves a task in its
	// chain unchecked.
	{name: "claim that moves the task in a chain", fixture: "pending",
		sql:   strings.Replace(smClaim, "attempt_count = attempt_count + 1,", "attempt_count = attempt_count + 1, fallback_position = 2,", 1),
		owner: smRefused("delivery_task_fixed", "fallback_position"), worker: smDenied},
	{name: "finish that moves the task in a chain", fixture: "sending",
		sql:   smFinish("ACCEPTED", "state = 'SENT', provider_msg_id = 'p-sm', fallback_position = 2"),
		owner: smRefused("delivery_task_fixed", "fallback_position"), worker: smDenied},
	// What users found.
	{name: "SENT -> PENDING: sent again", fixture: "sent",
		sql:   `UPDATE delivery_task SET state = 'PENDING', next_attempt_at = now() WHERE id = $1`,
		owner: smRefused("delivery_task_final", "state"), worker: smRefused("delivery_task_final", "state")},
	{name: "UNKNOWN waiting -> FAILED, uncertainty written off by a settle", fixture: "waiting-uncertain",
		sql: `UPDATE delivery_task SET state = 'FAILED', outcome_uncertain = false, uncertain_since = NULL, next_attempt_at = NULL,
			attempt_count = attempt_count + 1 WHERE id = $1`,
		owner: smRefused("delivery_task_uncertainty", "outcome_uncertain"), worker: smRefused("delivery_task_uncertainty", "outcome_uncertain")},
	{name: "UNKNOWN waiting -> FAILED, uncertainty written off, nothing counted", fixture: "waiting-uncertain",
		sql:   `UPDATE delivery_task SET state = 'FAILED', outcome_uncertain = false, uncertain_since = NULL, next_attempt_at = NULL WHERE id = $1`,
		owner: smRefused("delivery_task_transition", "state"), worker: smRefused("delivery_task_transition", "state")},
	{name: "attempt for a task not held: forged QUERY_NOT_FOUND", fixture: "sending",
		sql: `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome)
			VALUES ($1, 2, gen_random_uuid(), 'QUERY', 'w-sm', now(), 'QUERY_NOT_FOUND')`,
		owner: smRefused("delivery_attempt_follows_task", "attempt_no"), worker: smRefused("delivery_attempt_follows_task", "attempt_no")},
	{name: "MANUAL_SENT under SEND", fixture: "sending",
		sql: `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome)
			VALUES ($1, 2, gen_random_uuid(), 'SEND', 'w-sm', now(), 'MANUAL_SENT')`,
		owner: smRefused("delivery_attempt_outcome_fits_action", "outcome"), worker: smRefused("delivery_attempt_outcome_fits_action", "outcome")},
	{name: "parked -> FAILED, review cleared, attempts uncounted", fixture: "parked",
		sql:    `UPDATE delivery_task SET state = 'FAILED', needs_review = false, attempt_count = 0 WHERE id = $1`,
		owner:  smRefused("delivery_task_attempt_count", "attempt_count"),
		worker: smWant{rows: 0, policy: "delivery_task_worker_update"}},
	{name: "parked -> SENT without its MANUAL row", fixture: "parked",
		sql:   `UPDATE delivery_task SET state = 'SENT', needs_review = false, attempt_count = attempt_count + 1 WHERE id = $1`,
		owner: smRefused("delivery_task_evidence", "attempt_count"), worker: smWant{rows: 0, policy: "delivery_task_worker_update"}},

	// Final states.
	{name: "SENT -> UNKNOWN: a late id-only finish (NC3)", fixture: "sent",
		sql:   `UPDATE delivery_task SET state = 'UNKNOWN', outcome_uncertain = true, uncertain_since = now(), next_attempt_at = now() WHERE id = $1`,
		owner: smRefused("delivery_task_final", "state"), worker: smRefused("delivery_task_final", "state")},
	{name: "SENT: message id rewritten", fixture: "sent", sql: `UPDATE delivery_task SET provider_msg_id = 'forged' WHERE id = $1`,
		owner: smRefused("delivery_task_final", "provider_msg_id"), worker: smRefused("delivery_task_final", "provider_msg_id")},
	{name: "FAILED -> PENDING", fixture: "failed", sql: `UPDATE delivery_task SET state = 'PENDING', next_attempt_at = now() WHERE id = $1`,
		owner: smRefused("delivery_task_final", "state"), worker: smRefused("delivery_task_final", "state")},
	{name: "FAILED -> SENT", fixture: "failed", sql: `UPDATE delivery_task SET state = 'SENT' WHERE id = $1`,
		owner: smRefused("delivery_task_final", "state"), worker: smRefused("delivery_task_final", "state")},
	{name: "SUPPRESSED -> PENDING", fixture: "suppressed", sql: `UPDATE delivery_task SET state = 'PENDING', next_attempt_at = now() WHERE id = $1`,
		owner: smRefused("delivery_task_final", "state"), worker: smRefused("delivery_task_final", "state")},

	// Uncertainty (R6).
	{name: "UNKNOWN waiting -> SUPPRESSED, still uncertain", fixture: "waiting-uncertain",
		sql:   `UPDATE delivery_task SET state = 'SUPPRESSED', next_attempt_at = NULL, attempt_count = attempt_count + 1 WHERE id = $1`,
		owner: smRefused("delivery_task_uncertainty", "outcome_uncertain"), worker: smRefused("delivery_task_uncertainty", "outcome_uncertain")},
	{name: "uncertain SENDING -> FAILED after TIMEOUT", fixture: "sending-uncertain",
		sql:   smFinish("TIMEOUT", `state = 'FAILED', outcome_uncertain = false, uncertain_since = NULL`),
		owner: smRefused("delivery_task_evidence", "attempt_count"), worker: smRefused("delivery_task_evidence", "attempt_count")},
	{name: "uncertain SENDING -> PENDING after QUERY_FAILED", fixture: "querying",
		sql:   smFinish("QUERY_FAILED", `state = 'PENDING', outcome_uncertain = false, uncertain_since = NULL, next_attempt_at = now()`),
		owner: smRefused("delivery_task_evidence", "attempt_count"), worker: smRefused("delivery_task_evidence", "attempt_count")},
	{name: "uncertain SENDING -> FAILED after REJECTED", fixture: "sending-uncertain",
		sql:   smFinish("REJECTED", `state = 'FAILED', outcome_uncertain = false, uncertain_since = NULL`),
		owner: smRefused("delivery_task_evidence", "attempt_count"), worker: smRefused("delivery_task_evidence", "attempt_count")},
	{name: "uncertain SENDING -> SENT after TIMEOUT", fixture: "sending-uncertain",
		sql:   smFinish("TIMEOUT", `state = 'SENT', outcome_uncertain = false, uncertain_since = NULL`),
		owner: smRefused("delivery_task_evidence", "attempt_count"), worker: smRefused("delivery_task_evidence", "attempt_count")},
	{name: "SENDING -> FAILED after TIMEOUT: this attempt's uncertainty dropped", fixture: "sending",
		sql:   smFinish("TIMEOUT", `state = 'FAILED'`),
		owner: smRefused("delivery_task_evidence", "attempt_count"), worker: smRefused("delivery_task_evidence", "attempt_count")},
	{name: "SENDING -> PENDING after TIMEOUT: resent blind", fixture: "sending",
		sql:   smFinish("TIMEOUT", `state = 'PENDING', next_attempt_at = now()`),
		owner: smRefused("delivery_task_evidence", "attempt_count"), worker: smRefused("delivery_task_evidence", "attempt_count")},
	{name: "SENDING -> FAILED, uncertain", fixture: "sending",
		sql:   smFinish("TIMEOUT", `state = 'FAILED', outcome_uncertain = true, uncertain_since = updated_at`),
		owner: smRefused("delivery_task_uncertainty", "outcome_uncertain"), worker: smRefused("delivery_task_uncertainty", "outcome_uncertain")},
	// Account states (schema/003): an ACCOUNT_REFUSED attempt is refunded and the task waits; nothing
	// else refunds one, and it never writes a task off.
	{name: "SENDING -> PENDING after ACCOUNT_REFUSED, refunded", fixture: "sending",
		sql:   smFinish("ACCOUNT_REFUSED", `state = 'PENDING', next_attempt_at = now(), account_refusals = account_refusals + 1`),
		owner: smOne, worker: smOne},
	{name: "uncertain SENDING -> UNKNOWN after ACCOUNT_REFUSED, refunded", fixture: "sending-uncertain",
		sql:   smFinish("ACCOUNT_REFUSED", `state = 'UNKNOWN', next_attempt_at = now(), account_refusals = account_refusals + 1`),
		owner: smOne, worker: smOne},
	{name: "SENDING -> FAILED after ACCOUNT_REFUSED: written off for an account state", fixture: "sending",
		sql:   smFinish("ACCOUNT_REFUSED", `state = 'FAILED'`),
		owner: smRefused("delivery_task_evidence", "attempt_count"), worker: smRefused("delivery_task_evidence", "attempt_count")},
	{name: "SENDING -> PENDING after REJECTED, refunded", fixture: "sending",
		sql:   smFinish("REJECTED", `state = 'PENDING', next_attempt_at = now(), account_refusals = account_refusals + 1`),
		owner: smRefused("delivery_task_account_refusals", "account_refusals"), worker: smRefused("delivery_task_account_refusals", "account_refusals")},
	{name: "SENDING -> PENDING after ACCOUNT_REFUSED, more refunded than attempted", fixture: "sending",
		sql:    smFinish("ACCOUNT_REFUSED", `state = 'PENDING', next_attempt_at = now(), account_refusals = account_refusals + 2`),
		owner:  smWant{code: schemaErrCheck, constraint: "delivery_task_account_refusals_check"},
		worker: smWant{code: schemaErrCheck, constraint: "delivery_task_account_refusals_check"}},
	{name: "SENDING -> UNKNOWN parked after ACCOUNT_REFUSED, refunded", fixture: "sending-uncertain",
		sql:   smFinish("ACCOUNT_REFUSED", `state = 'UNKNOWN', needs_review = true, account_refusals = account_refusals + 1`),
		owner: smRefused("delivery_task_account_refusals", "account_refusals"), worker: smRefused("delivery_task_account_refusals", "account_refusals")},
	{name: "uncertainty starts after its attempt began", fixture: "sending",
		sql:   smFinish("TIMEOUT", `state = 'UNKNOWN', outcome_uncertain = true, uncertain_since = now(), next_attempt_at = now()`),
		owner: smRefused("delivery_task_uncertainty", "uncertain_since"), worker: smRefused("delivery_task_uncertainty", "uncertain_since")},
	{name: "claim writes uncertainty off", fixture: "waiting-uncertain",
		sql: strings.Replace(strings.Replace(smClaim, "outcome_uncertain = outcome_uncertain OR state = 'SENDING'", "outcome_uncertain = false", 1),
			"uncertain_since = CASE WHEN outcome_uncertain OR state = 'SENDING' THEN coalesce(uncertain_since, updated_at) END", "uncertain_since = NULL", 1),
		owner: smRefused("delivery_task_uncertainty", "outcome_uncertain"), worker: smRefused("delivery_task_uncertainty", "outcome_uncertain")},
	{name: "takeover of an expired lease as certain", fixture: "expired",
		sql:   strings.Replace(smTakeover, "outcome_uncertain = true, uncertain_since = coalesce(uncertain_since, updated_at)", "outcome_uncertain = false", 1),
		owner: smRefused("delivery_task_uncertainty", "outcome_uncertain"), worker: smRefused("delivery_task_uncertainty", "outcome_uncertain")},
	{name: "uncertainty's start moved by a claim", fixture: "waiting-uncertain",
		sql:   strings.Replace(smClaim, "coalesce(uncertain_since, updated_at)", "now() + interval '1 hour'", 1),
		owner: smRefused("delivery_task_uncertainty", "uncertain_since"), worker: smRefused("delivery_task_uncertainty", "uncertain_since")},

	// Parked tasks: only the resolve.
	{name: "parked -> waiting without a resolution", fixture: "parked",
		sql:   `UPDATE delivery_task SET needs_review = false, next_attempt_at = now() WHERE id = $1`,
		owner: smRefused("delivery_task_transition", "state"), worker: smWant{rows: 0, policy: "delivery_task_worker_update"}},
	{name: "parked -> SENDING: claimed", fixture: "parked", sql: strings.Replace(smClaim, "lease_owner = 'w-sm',", "lease_owner = 'w-sm', needs_review = false,", 1),
		owner: smRefused("delivery_task_transition", "state"), worker: smWant{rows: 0, policy: "delivery_task_worker_update"}},

	// Counting.
	{name: "attempt_count decreases", fixture: "sending", sql: `UPDATE delivery_task SET attempt_count = 0 WHERE id = $1`,
		owner: smRefused("delivery_task_attempt_count", "attempt_count"), worker: smRefused("delivery_task_attempt_count", "attempt_count")},
	{name: "attempt_count jumps", fixture: "pending", sql: strings.Replace(smClaim, "attempt_count = attempt_count + 1", "attempt_count = attempt_count + 2", 1),
		owner: smRefused("delivery_task_attempt_count", "attempt_count"), worker: smRefused("delivery_task_attempt_count", "attempt_count")},
	{name: "a finish counts an attempt", fixture: "sending",
		sql:   smFinish("ACCEPTED", `state = 'SENT', attempt_count = attempt_count + 1`),
		owner: smRefused("delivery_task_attempt_count", "attempt_count"), worker: smRefused("delivery_task_attempt_count", "attempt_count")},
	{name: "a park counts an attempt: a settle without its SKIP row", fixture: "pending",
		sql:   strings.Replace(smPark, "last_error = 'parked'", "last_error = 'parked', attempt_count = attempt_count + 1", 1),
		owner: smRefused("delivery_task_evidence", "attempt_count"), worker: smRefused("delivery_task_evidence", "attempt_count")},

	// Claims.
	{name: "claim without its attempt row", fixture: "pending", sql: smClaimTaskOnly,
		owner: smRefused("delivery_task_evidence", "attempt_count"), worker: smRefused("delivery_task_evidence", "attempt_count")},
	{name: "takeover of a live lease", fixture: "sending", sql: smTakeover,
		owner: smRefused("delivery_task_transition", "lease_until"), worker: smRefused("delivery_task_transition", "lease_until")},
	{name: "claim before due", fixture: "scheduled", sql: smClaim,
		owner: smRefused("delivery_task_transition", "next_attempt_at"), worker: smRefused("delivery_task_transition", "next_attempt_at")},
	{name: "claim writes a message id", fixture: "waiting-uncertain",
		sql:   strings.Replace(smClaim, "lease_owner = 'w-sm',", "lease_owner = 'w-sm', provider_msg_id = 'forged',", 1),
		owner: smRefused("delivery_task_transition", "provider_msg_id"), worker: smRefused("delivery_task_transition", "provider_msg_id")},
	{name: "claim opens its attempt with another token", fixture: "pending",
		sql:   strings.Replace(smClaim, "SELECT id, attempt_count, attempt_token, 'SEND'", "SELECT id, attempt_count, gen_random_uuid(), 'SEND'", 1),
		owner: smRefused("delivery_attempt_follows_task", "attempt_token"), worker: smRefused("delivery_attempt_follows_task", "attempt_token")},
	{name: "claim opens its call closed", fixture: "pending",
		sql: strings.Replace(strings.Replace(smClaim, "(task_id, attempt_no, attempt_token, action, worker)",
			"(task_id, attempt_no, attempt_token, action, worker, finished_at, outcome)", 1), "'SEND', 'w-sm' FROM c", "'SEND', 'w-sm', now(), 'ACCEPTED' FROM c", 1),
		owner: smRefused("delivery_attempt_follows_task", "outcome"), worker: smRefused("delivery_attempt_follows_task", "outcome")},

	// Settles.
	{name: "settle without its SKIP row", fixture: "pending",
		sql:   `UPDATE delivery_task SET state = 'SUPPRESSED', next_attempt_at = NULL, attempt_count = attempt_count + 1 WHERE id = $1`,
		owner: smRefused("delivery_task_evidence", "attempt_count"), worker: smRefused("delivery_task_evidence", "attempt_count")},
	{name: "SENDING with an expired lease -> SUPPRESSED", fixture: "expired", sql: smSettleSuppressed,
		owner: smRefused("delivery_task_transition", "state"), worker: smRefused("delivery_task_transition", "state")},
	{name: "settle a task not due", fixture: "scheduled", sql: smSettleSuppressed,
		owner: smRefused("delivery_task_transition", "next_attempt_at"), worker: smRefused("delivery_task_transition", "next_attempt_at")},
	{name: "SKIP row that does not record the settlement", fixture: "pending",
		sql:   strings.Replace(smSettleSuppressed, "'PREF_DISABLED' FROM s", "'TTL_EXPIRED' FROM s", 1),
		owner: smRefused("delivery_attempt_follows_task", "outcome"), worker: smRefused("delivery_attempt_follows_task", "outcome")},

	// Cancels (schema/005): a waiting task of a cancelled notification is settled with the cancel's SKIP,
	// due or not, SUPPRESSED when certain and parked when not; nothing else settles a task before it is
	// due, and a notification that was not cancelled gives no task the cancel's outcome.
	{name: "cancel settles a task not due", fixture: "scheduled-cancelled", sql: smSettleCancelled, owner: smOne, worker: smOne},
	{name: "cancel parks an uncertain task", fixture: "waiting-uncertain-cancelled", sql: smParkCancelled, owner: smOne, worker: smOne},
	{name: "a task not due of a cancelled notification settled as disabled", fixture: "scheduled-cancelled", sql: smSettleSuppressed,
		owner: smRefused("delivery_task_evidence", "attempt_count"), worker: smRefused("delivery_task_evidence", "attempt_count")},
	{name: "cancel settles a task not due of a notification not cancelled", fixture: "scheduled", sql: smSettleCancelled,
		owner: smRefused("delivery_task_transition", "next_attempt_at"), worker: smRefused("delivery_task_transition", "next_attempt_at")},
	{name: "SKIP CANCELLED for a notification not cancelled", fixture: "pending", sql: smSettleCancelled,
		owner: smRefused("delivery_attempt_follows_task", "outcome"), worker: smRefused("delivery_attempt_follows_task", "outcome")},
	{name: "cancel writes an uncertain task off", fixture: "waiting-uncertain-cancelled",
		sql:   strings.Replace(smSettleCancelled, "attempt_count = attempt_count + 1", "attempt_count = attempt_count + 1, outcome_uncertain = false, uncertain_since = NULL", 1),
		owner: smRefused("delivery_task_uncertainty", "outcome_uncertain"), worker: smRefused("delivery_task_uncertainty", "outcome_uncertain")},
	{name: "cancel parks a certain task as uncertain with CANCELLED", fixture: "pending-cancelled",
		sql: strings.Replace(strings.Replace(smParkCancelled, "'CANCELLED_UNCERTAIN' FROM s", "'CANCELLED' FROM s", 1),
			"needs_review = true,", "needs_review = true, outcome_uncertain = true, uncertain_since = updated_at,", 1),
		owner: smRefused("delivery_attempt_follows_task", "outcome"), worker: smRefused("delivery_attempt_follows_task", "outcome")},
	{name: "a cancelled notification's held task settled under a live lease", fixture: "sending-cancelled",
		sql:   smSettleCancelled,
		owner: smRefused("delivery_task_transition", "state"), worker: smRefused("delivery_task_transition", "state")},

	// Setting aside (the claim's way past a row that makes it fail) moves one time later, nothing else.
	{name: "due task's next attempt moved earlier", fixture: "scheduled",
		sql:   `UPDATE delivery_task SET next_attempt_at = now() - interval '1 hour', last_error = 'x' WHERE id = $1`,
		owner: smRefused("delivery_task_transition", "next_attempt_at"), worker: smRefused("delivery_task_transition", "next_attempt_at")},
	{name: "set aside without a reason", fixture: "pending", sql: `UPDATE delivery_task SET next_attempt_at = now() + interval '1 minute' WHERE id = $1`,
		owner: smRefused("delivery_task_transition", "next_attempt_at"), worker: smRefused("delivery_task_transition", "next_attempt_at")},
	{name: "a live lease extended", fixture: "sending", sql: `UPDATE delivery_task SET lease_until = lease_until + interval '1 hour', last_error = 'x' WHERE id = $1`,
		owner: smRefused("delivery_task_transition", "lease_until"), worker: smRefused("delivery_task_transition", "lease_until")},
	{name: "an expired hold set aside moves its start", fixture: "expired",
		sql:   `UPDATE delivery_task SET lease_until = now() + interval '1 minute', last_error = 'x', updated_at = now() WHERE id = $1`,
		owner: smRefused("delivery_task_transition", "lease_until"), worker: smRefused("delivery_task_transition", "lease_until")},
	{name: "a waiting task edited by hand", fixture: "pending", sql: `UPDATE delivery_task SET last_error = 'edited' WHERE id = $1`,
		owner: smRefused("delivery_task_transition", "state"), worker: smRefused("delivery_task_transition", "state")},

	// Finishes.
	{name: "a finish changes the token", fixture: "sending",
		sql:   smFinish("ACCEPTED", `state = 'SENT', attempt_token = gen_random_uuid()`),
		owner: smRefused("delivery_task_transition", "attempt_token"), worker: smRefused("delivery_task_transition", "attempt_token")},
	{name: "a finish keeps the lease", fixture: "sending",
		sql:   `UPDATE delivery_task SET state = 'SENT' WHERE id = $1`,
		owner: smRefused("delivery_task_transition", "lease_until"), worker: smRefused("delivery_task_transition", "lease_until")},
	{name: "QUERY_NOT_FOUND under SEND", fixture: "sending",
		sql:   `UPDATE delivery_attempt SET outcome = 'QUERY_NOT_FOUND', finished_at = now() WHERE task_id = $1`,
		owner: smRefused("delivery_attempt_outcome_fits_action", "outcome"), worker: smRefused("delivery_attempt_outcome_fits_action", "outcome")},
	{name: "a live holder's attempt closed as LEASE_EXPIRED", fixture: "sending",
		sql:   `UPDATE delivery_attempt SET outcome = 'LEASE_EXPIRED', finished_at = now() WHERE task_id = $1`,
		owner: smRefused("delivery_attempt_follows_task", "outcome"), worker: smRefused("delivery_attempt_follows_task", "outcome")},
	{name: "ACCEPTED under QUERY", fixture: "querying",
		sql:   `UPDATE delivery_attempt SET outcome = 'ACCEPTED', finished_at = now() WHERE task_id = $1 AND outcome IS NULL`,
		owner: smRefused("delivery_attempt_outcome_fits_action", "outcome"), worker: smRefused("delivery_attempt_outcome_fits_action", "outcome")},
	{name: "late QUERY_NOT_FOUND of a SEND", fixture: "sent",
		sql:   `UPDATE delivery_attempt SET late_outcome = 'QUERY_NOT_FOUND', late_at = now() WHERE task_id = $1`,
		owner: smRefused("delivery_attempt_outcome_fits_action", "late_outcome"), worker: smRefused("delivery_attempt_outcome_fits_action", "late_outcome")},
	{name: "a recorded outcome rewritten", fixture: "sent", sql: `UPDATE delivery_attempt SET outcome = 'TIMEOUT' WHERE task_id = $1`,
		owner: smRefused("delivery_attempt_append_only", "outcome"), worker: smRefused("delivery_attempt_append_only", "outcome")},

	// What a task is for.
	{name: "channel re-targeted", fixture: "pending", sql: `UPDATE delivery_task SET channel = 'sms' WHERE id = $1`,
		owner: smRefused("delivery_task_fixed", "channel"), worker: smDenied},
	{name: "budget raised", fixture: "parked", sql: `UPDATE delivery_task SET max_attempts = 100 WHERE id = $1`,
		owner: smRefused("delivery_task_fixed", "max_attempts"), worker: smDenied},
	{name: "reference rewritten", fixture: "parked", sql: `UPDATE delivery_task SET ref = gen_random_uuid()::text WHERE id = $1`,
		owner: smRefused("delivery_task_fixed", "ref"), worker: smDenied},
	{name: "reference of a sent task reused", fixture: "sent", sql: `UPDATE delivery_task SET ref = 'task-' || id WHERE id = $1`,
		owner: smRefused("delivery_task_fixed", "ref"), worker: smDenied},

	// MANUAL rows are the resolve's.
	{name: "a MANUAL row forged", fixture: "parked",
		sql: `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome)
			VALUES ($1, 2, gen_random_uuid(), 'MANUAL', 'w-sm', now(), 'MANUAL_SENT')`,
		owner:  smWant{code: schemaErrCheck, constraint: "delivery_attempt_manual_has_note"},
		worker: smWant{code: sqlInsufficient, policy: "delivery_attempt_worker_insert"}},
	{name: "a MANUAL row forged, with its note", fixture: "parked",
		sql: `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome, note)
			VALUES ($1, 2, gen_random_uuid(), 'MANUAL', 'w-sm', now(), 'MANUAL_SENT', 'forged')`,
		owner: smRefused("delivery_attempt_follows_task", "attempt_no"), worker: smDenied}, // the worker may not write note
	{name: "a MANUAL row gets a late outcome", fixture: "resolved",
		sql:   `UPDATE delivery_attempt SET late_outcome = 'ACCEPTED', late_at = now() WHERE task_id = $1 AND action = 'MANUAL'`,
		owner: smRefused("delivery_attempt_outcome_fits_action", "late_outcome"), worker: smWant{rows: 0, policy: "delivery_attempt_worker_update"}},

	// Receipts (schema/004): a settle needs its receipt noted and its RECEIPT row, only
	// notifier_apply_receipt writes both, and a receipt is kept as it came.
	{name: "a receipt settle without its receipt noted", fixture: "waiting-uncertain", sql: smReceiptSettleUnnoted,
		owner:  smRefused("delivery_task_transition", "state"),
		worker: smWant{code: sqlInsufficient, policy: "delivery_attempt_worker_insert"}},
	{name: "a receipt noted with another change", fixture: "sending",
		sql:   `UPDATE delivery_task SET receipt_at = now(), last_error = 'noted' WHERE id = $1`,
		owner: smRefused("delivery_task_transition", "receipt_at"), worker: smDenied},
	{name: "a receipt rewritten", fixture: "noted", sql: `UPDATE delivery_receipt SET kind = 'BOUNCED' WHERE task_id = $1`,
		owner: smRefused("delivery_receipt_append_only", ""), worker: smDenied},
	{name: "a held task's receipt deleted", fixture: "noted", sql: `DELETE FROM delivery_receipt WHERE task_id = $1`,
		owner: smRefused("delivery_receipt_append_only", ""), worker: smDenied},
	{name: "legitimate: a receipt settles a waiting task", fixture: "waiting-uncertain", sql: smApplyReceipt,
		owner: smOne, worker: smOne, others: map[string]smWant{smReceiver: smOne}},
	{name: "legitimate: a receipt settles a task not due (only its settle without a call needs a cancel)", fixture: "scheduled",
		sql: smApplyReceipt, owner: smOne, worker: smOne, others: map[string]smWant{smReceiver: smOne}},
	{name: "legitimate: a receipt settles a cancelled notification's task not due", fixture: "scheduled-cancelled",
		sql: smApplyReceipt, owner: smOne, worker: smOne, others: map[string]smWant{smReceiver: smOne}},
	{name: "legitimate: a receipt settles a parked task", fixture: "parked", sql: smApplyReceipt,
		owner: smOne, worker: smOne, others: map[string]smWant{smReceiver: smOne}},
	{name: "legitimate: a receipt noted on a held task", fixture: "sending", sql: smApplyReceipt,
		owner: smOne, worker: smOne, others: map[string]smWant{smReceiver: smOne}},
	{name: "legitimate: a receipt on a FAILED task changes nothing", fixture: "failed", sql: smApplyReceipt,
		owner: smOne, worker: smOne, others: map[string]smWant{smReceiver: smOne}},

	// The protocol's own moves pass, for the owner and the worker.
	{name: "legitimate: claim", fixture: "pending", sql: smClaim, owner: smOne, worker: smOne},
	{name: "legitimate: claim of an uncertain task", fixture: "waiting-uncertain", sql: smClaim, owner: smOne, worker: smOne},
	{name: "legitimate: takeover of an expired lease", fixture: "expired", sql: smTakeover, owner: smOne, worker: smOne},
	{name: "legitimate: settle", fixture: "pending", sql: smSettleSuppressed, owner: smOne, worker: smOne},
	{name: "legitimate: park at claim", fixture: "expired", sql: smPark, owner: smOne, worker: smOne},
	{name: "legitimate: finish SENT", fixture: "sending",
		sql: smFinish("ACCEPTED", `state = 'SENT', provider_msg_id = 'm-1'`), owner: smOne, worker: smOne},
	{name: "legitimate: finish PENDING after a refusal", fixture: "sending",
		sql: smFinish("HTTP_5XX", `state = 'PENDING', next_attempt_at = now() + interval '1 minute'`), owner: smOne, worker: smOne},
	{name: "legitimate: uncertain -> FAILED by QUERY_NOT_FOUND", fixture: "querying",
		sql: smFinish("QUERY_NOT_FOUND", `state = 'FAILED', outcome_uncertain = false, uncertain_since = NULL`), owner: smOne, worker: smOne},
	{name: "legitimate: uncertain -> SENT by QUERY_FOUND", fixture: "querying",
		sql: smFinish("QUERY_FOUND", `state = 'SENT', outcome_uncertain = false, uncertain_since = NULL`), owner: smOne, worker: smOne},
	{name: "legitimate: finish parks", fixture: "sending",
		sql:   smFinish("TIMEOUT", `state = 'UNKNOWN', outcome_uncertain = true, uncertain_since = updated_at, needs_review = true`),
		owner: smOne, worker: smOne},
	{name: "legitimate: set aside a due task", fixture: "pending",
		sql:   `UPDATE delivery_task SET next_attempt_at = now() + interval '1 minute', last_error = 'set aside', updated_at = now() WHERE id = $1`,
		owner: smOne, worker: smOne},
	{name: "legitimate: set aside an expired hold", fixture: "expired",
		sql:   `UPDATE delivery_task SET lease_until = now() + interval '1 minute', last_error = 'set aside' WHERE id = $1`,
		owner: smOne, worker: smOne},
	{name: "legitimate: a row left as it was", fixture: "sent", sql: `UPDATE delivery_task SET state = state WHERE id = $1`,
		owner: smOne, worker: smOne},
}

// smCall is a statement for one role only: the resolve function, and the creator's inserts.
type smCall struct {
	role    string
	name    string
	fixture string // smFixture kind; "own-notification": $1 is a notification this same transaction inserted;
	// "own-notification-in-savepoint": inserted in a released savepoint, the statement run in another one
	setup string // run by the owner first (e.g. a grant for this test database only)
	sql   string
	want  smWant
}

const (
	smResolveSent = `SELECT * FROM notifier_resolve($1, 'SENT', 'seen in the channel console', 'ops', NULL)`
	// smCancel cancels the event of the task $1.
	smCancel = `SELECT * FROM notifier_cancel('u1', (SELECT n.event_key FROM notification n JOIN delivery_task t
		ON t.notification_id = n.id WHERE t.id = $1), 'changed my mind')`
	smCreatorTask = `INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES ($1, 'push', 3)`
	smGrantState  = `GRANT INSERT (state, attempt_count) ON delivery_task TO notifier_creator`
)

var smCalls = []smCall{
	// notifier_cancel (schema/005): the creator's, and the owner's.
	{role: smCreator, name: "cancel a pending task", fixture: "pending", sql: smCancel, want: smOne},
	{role: smCreator, name: "cancel an event that does not exist", fixture: "pending",
		sql: `SELECT * FROM notifier_cancel('u1', 'no-such-event-' || $1::bigint)`, want: smWant{rows: 0}},
	{role: smCreator, name: "cancel with a note of 2001 characters", fixture: "pending",
		sql: strings.Replace(smCancel, "'changed my mind'", "repeat('n', 2001)", 1), want: smWant{code: sqlBadArg}},
	{role: smOwner, name: "owner cancels", fixture: "pending", sql: smCancel, want: smOne},
	{role: smWorker, name: "worker cancels", fixture: "pending", sql: smCancel, want: smDenied},
	{role: smOperator, name: "operator cancels", fixture: "pending", sql: smCancel, want: smDenied},
	{role: smReceiver, name: "receiver cancels", fixture: "pending", sql: smCancel, want: smDenied},
	{role: smCreator, name: "creator cancels by hand", fixture: "notification",
		sql: `UPDATE notification SET cancelled_at = now() WHERE id = $1`, want: smDenied},

	// notifier_resolve: the operator's only write.
	{role: smOperator, name: "resolve a parked task", fixture: "parked", sql: smResolveSent, want: smOne},
	{role: smOperator, name: "resolve a resolved task", fixture: "resolved", sql: smResolveSent, want: smWant{rows: 0}},
	{role: smOperator, name: "resolve a waiting task", fixture: "waiting-uncertain", sql: smResolveSent, want: smWant{rows: 0}},
	{role: smOperator, name: "resolve to PENDING", fixture: "parked", sql: `SELECT * FROM notifier_resolve($1, 'PENDING', 'n', 'ops', NULL)`,
		want: smWant{code: sqlBadArg}},
	{role: smOperator, name: "resolve without a note", fixture: "parked", sql: `SELECT * FROM notifier_resolve($1, 'FAILED', '', 'ops', NULL)`,
		want: smWant{code: schemaErrCheck, constraint: "delivery_attempt_manual_has_note"}},
	{role: smOperator, name: "operator updates a parked task", fixture: "parked",
		sql: `UPDATE delivery_task SET state = 'FAILED', needs_review = false, attempt_count = 0 WHERE id = $1`, want: smDenied},
	{role: smOperator, name: "operator inserts a MANUAL row", fixture: "parked",
		sql: `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome, note)
			VALUES ($1, 2, gen_random_uuid(), 'MANUAL', 'ops', now(), 'MANUAL_FAILED', 'n')`, want: smDenied},
	{role: smWorker, name: "worker resolves", fixture: "parked", sql: smResolveSent, want: smDenied},
	{role: smCreator, name: "creator resolves", fixture: "parked", sql: smResolveSent, want: smDenied},
	{role: smOwner, name: "owner resolves", fixture: "parked", sql: smResolveSent, want: smOne},

	// The creator's tasks: its own transaction's notification, an enabled channel, due now.
	{role: smCreator, name: "task for its own new notification", fixture: "own-notification", sql: smCreatorTask, want: smOne},
	{role: smCreator, name: "task for its own notification, both in savepoints (schema/005)", fixture: "own-notification-in-savepoint", sql: smCreatorTask, want: smOne},
	{role: smCreator, name: "task from a savepoint for an existing notification", fixture: "notification-from-savepoint", sql: smCreatorTask,
		want: smWant{code: sqlInsufficient, policy: "delivery_task_creator_insert"}},
	{role: smCreator, name: "task for an existing notification", fixture: "notification", sql: smCreatorTask,
		want: smWant{code: sqlInsufficient, policy: "delivery_task_creator_insert"}},
	{role: smCreator, name: "task on a disabled channel", fixture: "own-notification",
		sql:  `INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES ($1, 'none', 3)`,
		want: smWant{code: sqlInsufficient, policy: "delivery_task_creator_insert"}},
	{role: smCreator, name: "task dated ten years back", fixture: "own-notification",
		sql:  `INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at) VALUES ($1, 'push', 3, now() - interval '10 years')`,
		want: smWant{code: sqlInsufficient, policy: "delivery_task_creator_insert"}},
	{role: smCreator, name: "later fallback task due now (schema/005)", fixture: "own-notification",
		sql:  `INSERT INTO delivery_task (notification_id, channel, max_attempts, fallback_position, next_attempt_at) VALUES ($1, 'push', 3, 2, now())`,
		want: smWant{code: sqlInsufficient, policy: "delivery_task_creator_insert"}},
	{role: smCreator, name: "later fallback task unreleased (schema/005)", fixture: "own-notification",
		sql:  `INSERT INTO delivery_task (notification_id, channel, max_attempts, fallback_position, next_attempt_at) VALUES ($1, 'push', 3, 2, NULL)`,
		want: smOne},
	{role: smCreator, name: "first fallback task unreleased (schema/005)", fixture: "own-notification",
		sql:  `INSERT INTO delivery_task (notification_id, channel, max_attempts, fallback_position, next_attempt_at) VALUES ($1, 'push', 3, 1, NULL)`,
		want: smWant{code: sqlInsufficient, policy: "delivery_task_creator_insert"}},
	{role: smCreator, name: "task due now, as the previous TaskInsertForEnabledPrefs wrote it", fixture: "own-notification",
		sql:  `INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at) VALUES ($1, 'push', 3, now())`,
		want: smOne},
	{role: smCreator, name: "task for an existing notification, state granted", fixture: "notification", setup: smGrantState,
		sql:  `INSERT INTO delivery_task (notification_id, channel, max_attempts, state, attempt_count) VALUES ($1, 'push', 3, 'PENDING', 0)`,
		want: smWant{code: sqlInsufficient, policy: "delivery_task_creator_insert"}},
	{role: smCreator, name: "creator updates a task", fixture: "pending", sql: `UPDATE delivery_task SET last_error = 'x' WHERE id = $1`, want: smDenied},
}

// smFixture makes one task of u1 in the given state (test-only SQL, as the owner, by the protocol's
// moves) and returns its id; "notification" returns a notification without tasks.
func smFixture(t *testing.T, pool *pgxpool.Pool, kind string) int64 {
	t.Helper()
	ctx := context.Background()
	var n, id int64
	run := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("fixture %s: %s: %v", kind, sql, err)
		}
	}
	if base, ok := strings.CutSuffix(kind, "-cancelled"); ok { // the same task, its notification cancelled
		task := smFixture(t, pool, base)
		run(`UPDATE notification SET cancelled_at = now() WHERE id = (SELECT notification_id FROM delivery_task WHERE id = $1)`, task)
		return task
	}
	if err := pool.QueryRow(ctx, `INSERT INTO notification (user_id, event_key, body, expires_at)
		VALUES ('u1', 'fx-' || gen_random_uuid(), 'b', now() + interval '1 hour') RETURNING id`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	scan := func(sql string) int64 {
		t.Helper()
		var id int64
		if err := pool.QueryRow(ctx, sql, n).Scan(&id); err != nil {
			t.Fatalf("fixture %s: %s: %v", kind, sql, err)
		}
		return id
	}
	switch kind {
	case "notification":
		return n
	case "pending", "suppressed":
		id = scan(`INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES ($1, 'push', 3) RETURNING id`)
		if kind == "suppressed" {
			run(smSettleSuppressed, id)
		}
		return id
	case "unreleased": // the second task of a chain push, sms: the head is due, sms waits unreleased
		scan(`INSERT INTO delivery_task (notification_id, channel, max_attempts, fallback_position) VALUES ($1, 'push', 3, 1) RETURNING id`)
		return scan(`INSERT INTO delivery_task (notification_id, channel, max_attempts, fallback_position, next_attempt_at)
			VALUES ($1, 'sms', 3, 2, NULL) RETURNING id`)
	case "scheduled":
		return scan(`INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
			VALUES ($1, 'push', 3, now() + interval '1 hour') RETURNING id`)
	}
	// Every other kind starts held: claimed (by hand: inserted SENDING with its open attempt).
	lease, uncertain, action := "now() + interval '1 hour'", "false", "SEND"
	switch kind {
	case "expired":
		lease = "now() - interval '1 minute'"
	case "sending-uncertain":
		uncertain = "true"
	case "querying":
		uncertain, action = "true", "QUERY"
	}
	id = scan(`INSERT INTO delivery_task (notification_id, channel, state, attempt_count, max_attempts, next_attempt_at,
		attempt_token, lease_owner, lease_until, outcome_uncertain, uncertain_since)
		VALUES ($1, 'push', 'SENDING', 1, 3, NULL, gen_random_uuid(), 'w-fixture', ` + lease + `, ` + uncertain + `,
		        CASE WHEN ` + uncertain + ` THEN now() END) RETURNING id`)
	run(`INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
		SELECT id, 1, attempt_token, '`+action+`', 'w-fixture' FROM delivery_task WHERE id = $1`, id)
	switch kind {
	case "sent":
		run(smFinish("ACCEPTED", `state = 'SENT', provider_msg_id = 'm-fixture'`), id)
	case "failed":
		run(smFinish("REJECTED", `state = 'FAILED'`), id)
	case "waiting-uncertain":
		run(smFinish("TIMEOUT", `state = 'UNKNOWN', outcome_uncertain = true, uncertain_since = updated_at, next_attempt_at = now()`), id)
	case "parked", "resolved":
		run(smFinish("TIMEOUT", `state = 'UNKNOWN', outcome_uncertain = true, uncertain_since = updated_at, needs_review = true`), id)
		if kind == "resolved" {
			run(smResolveSent, id)
		}
	case "noted": // held, and a provider's receipt came meanwhile
		run(smApplyReceipt, id)
		run(`INSERT INTO delivery_receipt (task_id, source, event_id, kind, effect)
			VALUES ($1::bigint, 'standard-webhooks', 'evt-' || $1::bigint, 'DELIVERED', 'NOTED')`, id)
	case "sending", "sending-uncertain", "querying", "expired":
	default:
		t.Fatalf("unknown fixture %q", kind)
	}
	return id
}

// smSnapshot is everything the database holds about a task: its row and its attempts, as JSON.
func smSnapshot(t *testing.T, pool *pgxpool.Pool, id int64) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), `SELECT coalesce((SELECT to_jsonb(t)::text FROM delivery_task t WHERE t.id = $1), '')
		|| coalesce((SELECT jsonb_agg(to_jsonb(a) ORDER BY a.attempt_no)::text FROM delivery_attempt a WHERE a.task_id = $1), '')
		|| coalesce((SELECT count(*)::text FROM delivery_task t WHERE t.notification_id = $1), '')`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// smWorld is a fresh database with u1's preferences (push and sms enabled, none disabled) and a pool per
// role, each connection SET ROLE to it (the owner's is the test's own pool).
func smWorld(t *testing.T) (*pgxpool.Pool, map[string]*pgxpool.Pool) {
	t.Helper()
	pool := pgtest.NewDB(t)
	for _, p := range []string{`('u1', 'push', 'u1@push', true)`, `('u1', 'sms', 'u1@sms', true)`, `('u1', 'none', 'u1@none', false)`} {
		if _, err := pool.Exec(context.Background(), `INSERT INTO channel_pref (user_id, channel, address, enabled) VALUES `+p); err != nil {
			t.Fatal(err)
		}
	}
	e := &env{t: t, ctx: context.Background(), pool: pool}
	pools := map[string]*pgxpool.Pool{smOwner: pool}
	for _, role := range smRoles[1:] {
		pools[role] = secRolePool(t, e, role)
	}
	return pool, pools
}

// smCheck runs sql as one role on the fixture id and checks want; a refused or hidden statement must
// change nothing.
func smCheck(t *testing.T, owner, pool *pgxpool.Pool, id int64, ownTx bool, sql string, want smWant) {
	smCheckIn(t, owner, pool, id, ownTx, false, sql, want)
}

// smCheckIn is smCheck; inSavepoint runs the statement (and, with ownTx, the notification's insert)
// each in a savepoint of its own, as a caller of notifier_create may.
func smCheckIn(t *testing.T, owner, pool *pgxpool.Pool, id int64, ownTx, inSavepoint bool, sql string, want smWant) {
	t.Helper()
	is := is.NewRelaxed(t)
	before := smSnapshot(t, owner, id)
	var (
		rows int64
		err  error
	)
	// in runs f in tx, or in a savepoint of tx that is released when f succeeds.
	in := func(tx pgx.Tx, f func(pgx.Tx) error) error {
		if !inSavepoint {
			return f(tx)
		}
		return pgx.BeginFunc(context.Background(), tx, f)
	}
	if ownTx || inSavepoint { // the way Create runs: the notification and its tasks in one transaction
		err = pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
			if ownTx {
				if err := in(tx, func(tx pgx.Tx) error {
					return tx.QueryRow(context.Background(), `INSERT INTO notification (user_id, event_key, body, expires_at)
						VALUES ('u1', 'own-' || gen_random_uuid(), 'b', now() + interval '1 hour') RETURNING id`).Scan(&id)
				}); err != nil {
					return err
				}
			}
			return in(tx, func(tx pgx.Tx) error {
				tag, err := tx.Exec(context.Background(), sql, id)
				rows = tag.RowsAffected()
				return err
			})
		})
	} else {
		var tag pgconn.CommandTag
		tag, err = pool.Exec(context.Background(), sql, id)
		rows = tag.RowsAffected()
	}
	var pgErr *pgconn.PgError
	if err != nil && !errors.As(err, &pgErr) {
		t.Fatalf("not a PostgreSQL error: %v", err)
	}
	if want.code == "" {
		if pgErr != nil {
			t.Errorf("refused: %s (%s) constraint=%q, want %d rows changed", pgErr.Message, pgErr.Code, pgErr.ConstraintName, want.rows)
			return
		}
		is.Equal(rows, want.rows) // rows changed (0: hidden by row-level security)
		if want.rows == 0 && !ownTx {
			is.Equal(smSnapshot(t, owner, id), before) // nothing changed
		}
		return
	}
	if pgErr == nil {
		t.Errorf("accepted (%d rows), want %s %s", rows, want.code, want.constraint)
		return
	}
	t.Logf("refused: %s (%s) constraint=%q column=%q", pgErr.Message, pgErr.Code, pgErr.ConstraintName, pgErr.ColumnName)
	is.Equal(pgErr.Code, want.code) // the SQLSTATE
	if want.constraint != "" {
		is.Equal(pgErr.ConstraintName, want.constraint) // the rule that refused it
	}
	if want.column != "" {
		is.Equal(pgErr.ColumnName, want.column) // the column it names
	}
	if !ownTx {
		is.Equal(smSnapshot(t, owner, id), before) // nothing changed
	}
}

func TestStateMachineMovesPerRole(t *testing.T) {
	for _, m := range smMoves {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			owner, pools := smWorld(t)
			for _, role := range smRoles {
				t.Run(role, func(t *testing.T) {
					smCheck(t, owner, pools[role], smFixture(t, owner, m.fixture), false, m.sql, m.want(role))
				})
			}
		})
	}
}

func TestStateMachineRoleCalls(t *testing.T) {
	for _, c := range smCalls {
		t.Run(c.role+"/"+c.name, func(t *testing.T) {
			t.Parallel()
			owner, pools := smWorld(t)
			if c.setup != "" {
				_, err := owner.Exec(context.Background(), c.setup)
				is.New(t).NoErr(err) // the setup is valid
			}
			var id int64
			own, inSavepoint := strings.HasPrefix(c.fixture, "own-notification"), strings.HasSuffix(c.fixture, "savepoint")
			if !own {
				id = smFixture(t, owner, strings.TrimSuffix(c.fixture, "-from-savepoint"))
			}
			smCheckIn(t, owner, pools[c.role], id, own, inSavepoint, c.sql, c.want)
		})
	}
}

// TestStateMachineAllCovered fails when a rule has no case: every constraint name a trigger function of
// the schema raises needs a case run as the owner (here or in schemaViolations) and one run as the
// worker, unless the worker cannot reach it for want of a privilege, which is checked in the catalog;
// every row-level security policy that restricts anything needs a case that it decides.
func TestStateMachineAllCovered(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	pool := pgtest.NewDB(t)

	byOwner, byWorker, policies := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, v := range schemaViolations {
		byOwner[v.constraint] = true
	}
	for _, m := range smMoves {
		byOwner[m.owner.constraint], byWorker[m.worker.constraint] = true, true
		for _, role := range smRoles {
			policies[m.want(role).policy] = true
		}
	}
	for _, c := range smCalls {
		policies[c.want.policy] = true
	}

	// The worker has no privilege that could reach these rules (schema/002, schema/003).
	unreachable := map[string]string{
		"delivery_task_fixed": `SELECT bool_or(has_column_privilege('notifier_worker', 'delivery_task', c, 'UPDATE'))
			FROM unnest(ARRAY['id', 'notification_id', 'channel', 'ref', 'max_attempts', 'created_at', 'fallback_position']) AS c`,
		"delivery_receipt_append_only": `SELECT has_table_privilege('notifier_worker', 'delivery_receipt', 'UPDATE')
			OR has_table_privilege('notifier_worker', 'delivery_receipt', 'DELETE')
			OR has_table_privilege('notifier_worker', 'delivery_receipt', 'TRUNCATE')`,
		"delivery_task_attempts_kept": `SELECT has_table_privilege('notifier_worker', 'delivery_task', 'DELETE')`,
		"delivery_task_key_fixed": `SELECT has_table_privilege('notifier_worker', 'delivery_task_key', 'UPDATE')
			OR has_table_privilege('notifier_worker', 'delivery_task_key', 'DELETE')
			OR has_table_privilege('notifier_worker', 'delivery_task_key', 'TRUNCATE')`,
		"delivery_task_provider_msg_fixed": `SELECT has_table_privilege('notifier_worker', 'delivery_task_provider_msg', 'INSERT')
			OR has_table_privilege('notifier_worker', 'delivery_task_provider_msg', 'UPDATE')
			OR has_table_privilege('notifier_worker', 'delivery_task_provider_msg', 'DELETE')
			OR has_table_privilege('notifier_worker', 'delivery_task_provider_msg', 'TRUNCATE')`,
		"delivery_attempt_retention_only": `SELECT has_table_privilege('notifier_worker', 'delivery_attempt', 'DELETE')
			OR has_table_privilege('notifier_worker', 'delivery_attempt', 'TRUNCATE')
			OR has_table_privilege('notifier_worker', 'delivery_task', 'TRUNCATE')`,
	}
	rows, err := pool.Query(ctx, `
		SELECT DISTINCT m[1]
		FROM pg_proc p
		JOIN pg_namespace s ON s.oid = p.pronamespace
		CROSS JOIN LATERAL regexp_matches(p.prosrc, 'CONSTRAINT\s*=\s*''([a-z0-9_]+)''', 'g') AS m
		WHERE s.nspname = 'public'
		ORDER BY 1`)
	is.NoErr(err) // list the constraint names raised by triggers
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	is.NoErr(err)             // read them
	is.True(len(names) >= 10) // 005's two and 010's eight when this test was written
	for _, name := range names {
		if !byOwner[name] {
			t.Errorf("rule %s has no case run as the owner", name)
		}
		if byWorker[name] {
			continue
		}
		check, ok := unreachable[name]
		if !ok {
			t.Errorf("rule %s has no case run as notifier_worker (smMoves)", name)
			continue
		}
		var can bool
		is.NoErr(pool.QueryRow(ctx, check).Scan(&can))
		if can {
			t.Errorf("rule %s: notifier_worker now has a privilege that reaches it, and no case", name)
		}
	}

	rows, err = pool.Query(ctx, `
		SELECT policyname FROM pg_policies
		WHERE schemaname = 'public' AND (coalesce(qual, 'true') <> 'true' OR coalesce(with_check, 'true') <> 'true')
		ORDER BY 1`)
	is.NoErr(err) // list the policies that restrict something
	restricting, err := pgx.CollectRows(rows, pgx.RowTo[string])
	is.NoErr(err)                  // read them
	is.True(len(restricting) >= 4) // creator insert, worker task update, worker attempt insert and update
	for _, name := range restricting {
		if !policies[name] {
			t.Errorf("policy %s has no case that it decides", name)
		}
	}
	for name := range policies {
		if name != "" && !strings.HasPrefix(name, "delivery_") {
			t.Errorf("case names policy %q, not one of the schema's", name)
		}
	}
}

// TestStateMachineEveryOutcomeOfAnOpenCall records each outcome the CHECK constraint allows (read from
// the catalog, so that a new outcome is covered when it is added) on an open SEND and an open QUERY
// attempt of a live holder, as the owner and as the worker. Only a call's own outcomes pass (schema/003
// lets them through by the trigger's WHEN, schema/003's function decides the rest); LEASE_EXPIRED is
// refused because the holder's lease is live, every other outcome because it does not fit the action.
func TestStateMachineEveryOutcomeOfAnOpenCall(t *testing.T) {
	t.Parallel()
	owner, pools := smWorld(t)
	var def string
	is.New(t).NoErr(owner.QueryRow(context.Background(), `SELECT pg_get_constraintdef(oid) FROM pg_constraint
		WHERE conname = 'delivery_attempt_outcome_check'`).Scan(&def)) // the outcomes the schema allows
	var outcomes []string
	for _, m := range regexp.MustCompile(`'([A-Z0-9_]+)'`).FindAllStringSubmatch(def, -1) {
		outcomes = append(outcomes, m[1])
	}
	is.New(t).True(len(outcomes) >= 22) // 015's list when this test was written

	fits := map[string][]string{ // fixture -> the outcomes of its open attempt's action
		"sending": {"ACCEPTED", "ACCEPTED_REPLAY", "TIMEOUT", "IO_ERROR", "IN_FLIGHT", "MALFORMED_RESPONSE",
			"HTTP_5XX", "THROTTLED", "CONNECT_FAILED", "REJECTED", "GATEWAY_ERROR", "ACCOUNT_REFUSED"},
		"querying": {"QUERY_FOUND", "QUERY_NOT_FOUND", "QUERY_FAILED"},
	}
	for fixture, own := range fits {
		for _, outcome := range outcomes {
			want := smRefused("delivery_attempt_outcome_fits_action", "outcome")
			switch {
			case slices.Contains(own, outcome):
				want = smOne
			case outcome == "LEASE_EXPIRED":
				want = smRefused("delivery_attempt_follows_task", "outcome")
			}
			for _, role := range []string{smOwner, smWorker} {
				t.Run(fixture+"/"+outcome+"/"+role, func(t *testing.T) {
					smCheck(t, owner, pools[role], smFixture(t, owner, fixture), false,
						`UPDATE delivery_attempt SET outcome = '`+outcome+`', finished_at = now() WHERE task_id = $1 AND outcome IS NULL`, want)
				})
			}
		}
	}
}
