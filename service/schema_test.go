package service_test

// The schema's constraints, each proven to bite: every subtest starts from a fresh database holding one
// valid row per table (schemaBaseline), runs one statement that breaks exactly one constraint, and checks
// that PostgreSQL rejects it with that constraint's SQLSTATE and name. The statements run as the tables'
// owner: the state machine of schema/003 holds for it too, so the baseline reaches its states by the
// protocol's own moves.

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/matryer/is"

	"github.com/notifierhq/notifier/internal/pgtest"
	"github.com/notifierhq/notifier/service/delivery"
)

const (
	schemaErrIntegrity  = "23000" // raised by the triggers of schema/003
	schemaErrUnique     = "23505"
	schemaErrCheck      = "23514"
	schemaErrForeignKey = "23503"
	schemaErrNotNull    = "23502"
)

// Subqueries naming the baseline rows, so no test depends on identity values.
const (
	schemaBaseNotification = "(SELECT id FROM notification WHERE user_id = 'u1' AND event_key = 'ev-1')"
	schemaBaseTask         = "(SELECT id FROM delivery_task WHERE channel = 'push')" // SENDING, attempt 1 open
	schemaBaseWaitingTask  = "(SELECT id FROM delivery_task WHERE channel = 'sms')"  // PENDING, due, no attempt
	schemaBaseToken        = "'00000000-0000-0000-0000-000000000001'"
)

// schemaClaim is the claim of TaskStartAttempts by hand: the due task on channel ch becomes SENDING with
// token and opens its attempt, in one statement (the attempt row must exist when the claim commits).
func schemaClaim(ch, token, action string) string {
	return `WITH c AS (
		UPDATE delivery_task SET state = 'SENDING', attempt_token = ` + token + `, lease_owner = 'w1',
		       lease_until = now() + interval '30 seconds', next_attempt_at = NULL, attempt_count = attempt_count + 1
		WHERE channel = '` + ch + `' RETURNING id, attempt_count, attempt_token)
	INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
	SELECT id, attempt_count, attempt_token, '` + action + `', 'w1' FROM c`
}

// schemaSettle is TaskSettleWithoutCall and AttemptRecordSkip by hand, in one statement: the due task on
// channel ch becomes state (SUPPRESSED or FAILED) with its SKIP attempt.
func schemaSettle(ch, state, outcome string) string {
	return `WITH s AS (
		UPDATE delivery_task SET state = '` + state + `', next_attempt_at = NULL, lease_owner = NULL, lease_until = NULL,
		       attempt_count = attempt_count + 1
		WHERE channel = '` + ch + `' RETURNING id, attempt_count)
	INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome)
	SELECT id, attempt_count, gen_random_uuid(), 'SKIP', 'w1', now(), '` + outcome + `' FROM s`
}

// schemaBaseline is one valid row per table, and a second task: the push task claimed (SENDING, its
// attempt open), the sms task waiting (PENDING); every schemaViolation below differs from it in one
// respect.
var schemaBaseline = []string{
	`INSERT INTO channel_pref (user_id, channel, address) VALUES ('u1', 'push', 'u1@push')`,
	`INSERT INTO notification (user_id, event_key, body, expires_at) VALUES ('u1', 'ev-1', 'hello', now() + interval '1 hour')`,
	`INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES (` + schemaBaseNotification + `, 'push', 3)`,
	`INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES (` + schemaBaseNotification + `, 'sms', 3)`,
	schemaClaim("push", schemaBaseToken, "SEND"),
	`INSERT INTO channel_rate_limit (channel, rate, burst, tokens) VALUES ('push', 10, 10, 10)`,
}

// schemaPause pauses channel ch as a worker's finish does (queries/channel_pause.sql).
func schemaPause(ch string) string {
	return `INSERT INTO channel_pause (channel, cause, backoff_seconds, probe_after, probe_hold_seconds)
		VALUES ('` + ch + `', 'credential rejected', 2, now(), 30)`
}

// schemaProviderMsg records, as the owner, a provider message id of the baseline's held push task.
const schemaProviderMsg = `INSERT INTO delivery_task_provider_msg (provider_msg_id, task_id) VALUES ('pm-1', ` + schemaBaseTask + `)`

// schemaReceipt records one receipt for the baseline's held push task.
var schemaReceipt = schemaReceiptInsert(schemaBaseTask, "'standard-webhooks'", "'evt-1'", "'DELIVERED'", "false", "'NOTED'")

func schemaReceiptInsert(task, source, event, kind, hardBounce, effect string) string {
	return `INSERT INTO delivery_receipt (task_id, source, event_id, kind, hard_bounce, effect)
		VALUES (` + strings.Join([]string{task, source, event, kind, hardBounce, effect}, ", ") + `)`
}

func loadSchemaBaseline(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for _, stmt := range schemaBaseline {
		if _, err := pool.Exec(context.Background(), stmt); err != nil {
			t.Fatalf("baseline row rejected: %s: %v", stmt, err)
		}
	}
}

type schemaViolation struct {
	name       string
	sql        string
	code       string // SQLSTATE
	constraint string // ConstraintName; empty for NOT NULL (PostgreSQL names the column instead)
	column     string // ColumnName (NOT NULL names the column, not a constraint; so do the append-only triggers)
	setup      string // run after the baseline, before sql; must succeed
}

var schemaViolations = []schemaViolation{
	// channel_pref
	{"pref/duplicate user and channel", `INSERT INTO channel_pref (user_id, channel, address) VALUES ('u1', 'push', 'other')`, schemaErrUnique, "channel_pref_pkey", "", ""},
	{"pref/empty user", `INSERT INTO channel_pref (user_id, channel, address) VALUES ('', 'push', 'a')`, schemaErrCheck, "channel_pref_user_id_check", "", ""},
	{"pref/user of 201 chars", `INSERT INTO channel_pref (user_id, channel, address) VALUES (repeat('u', 201), 'push', 'a')`, schemaErrCheck, "channel_pref_user_id_check", "", ""},
	{"pref/channel upper case", `INSERT INTO channel_pref (user_id, channel, address) VALUES ('u1', 'Push', 'a')`, schemaErrCheck, "notifier_channel_check", "", ""},
	{"pref/channel empty", `INSERT INTO channel_pref (user_id, channel, address) VALUES ('u1', '', 'a')`, schemaErrCheck, "notifier_channel_check", "", ""},
	{"pref/channel with space", `INSERT INTO channel_pref (user_id, channel, address) VALUES ('u1', 'a b', 'a')`, schemaErrCheck, "notifier_channel_check", "", ""},
	{"pref/channel of 33 chars", `INSERT INTO channel_pref (user_id, channel, address) VALUES ('u1', repeat('a', 33), 'a')`, schemaErrCheck, "notifier_channel_check", "", ""},
	{"pref/channel starting with digit", `INSERT INTO channel_pref (user_id, channel, address) VALUES ('u1', '1push', 'a')`, schemaErrCheck, "notifier_channel_check", "", ""},
	{"pref/address empty", `INSERT INTO channel_pref (user_id, channel, address) VALUES ('u1', 'sms', '')`, schemaErrCheck, "channel_pref_address_check", "", ""},
	{"pref/address of 1001 chars", `INSERT INTO channel_pref (user_id, channel, address) VALUES ('u1', 'sms', repeat('a', 1001))`, schemaErrCheck, "channel_pref_address_check", "", ""},
	{"pref/version 0", `UPDATE channel_pref SET version = 0`, schemaErrCheck, "channel_pref_version_check", "", ""},
	{"pref/address null", `INSERT INTO channel_pref (user_id, channel, address) VALUES ('u1', 'sms', NULL)`, schemaErrNotNull, "", "address", ""},
	{"pref/enabled null", `UPDATE channel_pref SET enabled = NULL`, schemaErrNotNull, "", "enabled", ""},

	// notification
	{"notification/duplicate id", `INSERT INTO notification (id, user_id, event_key, body, expires_at) OVERRIDING SYSTEM VALUE
		VALUES (` + schemaBaseNotification + `, 'u1', 'ev-2', 'b', now() + interval '1 hour')`, schemaErrUnique, "notification_pkey", "", ""},
	{"notification/duplicate user and event key", `INSERT INTO notification (user_id, event_key, body, expires_at)
		VALUES ('u1', 'ev-1', 'another body', now() + interval '2 hours')`, schemaErrUnique, "notification_user_event_key_key", "", ""},
	{"notification/empty user", `INSERT INTO notification (user_id, event_key, body, expires_at) VALUES ('', 'ev-2', 'b', now() + interval '1 hour')`, schemaErrCheck, "notification_user_id_check", "", ""},
	{"notification/user of 201 chars", `INSERT INTO notification (user_id, event_key, body, expires_at) VALUES (repeat('u', 201), 'ev-2', 'b', now() + interval '1 hour')`, schemaErrCheck, "notification_user_id_check", "", ""},
	{"notification/empty event key", `INSERT INTO notification (user_id, event_key, body, expires_at) VALUES ('u1', '', 'b', now() + interval '1 hour')`, schemaErrCheck, "notification_event_key_check", "", ""},
	{"notification/event key of 201 chars", `INSERT INTO notification (user_id, event_key, body, expires_at) VALUES ('u1', repeat('k', 201), 'b', now() + interval '1 hour')`, schemaErrCheck, "notification_event_key_check", "", ""},
	{"notification/body of 65537 bytes", `INSERT INTO notification (user_id, event_key, body, expires_at) VALUES ('u1', 'ev-2', repeat('x', 65537), now() + interval '1 hour')`, schemaErrCheck, "notification_body_check", "", ""},
	{"notification/body of 32769 two-byte chars", `INSERT INTO notification (user_id, event_key, body, expires_at) VALUES ('u1', 'ev-2', repeat('é', 32769), now() + interval '1 hour')`, schemaErrCheck, "notification_body_check", "", ""},
	{"notification/expires at creation", `INSERT INTO notification (user_id, event_key, body, expires_at) VALUES ('u1', 'ev-2', 'b', now())`, schemaErrCheck, "notification_expires_after_created", "", ""},
	{"notification/expires before creation", `INSERT INTO notification (user_id, event_key, body, expires_at) VALUES ('u1', 'ev-2', 'b', now() - interval '1 second')`, schemaErrCheck, "notification_expires_after_created", "", ""},
	{"notification/expires_at missing", `INSERT INTO notification (user_id, event_key, body) VALUES ('u1', 'ev-2', 'b')`, schemaErrNotNull, "", "expires_at", ""},
	{"notification/body null", `INSERT INTO notification (user_id, event_key, body, expires_at) VALUES ('u1', 'ev-2', NULL, now() + interval '1 hour')`, schemaErrNotNull, "", "body", ""},
	{"notification/cancel note of 2001 chars", `UPDATE notification SET cancelled_at = now(), cancel_note = repeat('n', 2001)`, schemaErrCheck, "notification_cancel_note_check", "", ""},
	{"notification/send time at the expiry", `INSERT INTO notification (user_id, event_key, body, expires_at, send_at) VALUES ('u1', 'ev-2', 'b', now() + interval '1 hour', now() + interval '1 hour')`, schemaErrCheck, "notification_send_before_expiry", "", ""},
	{"notification/send time after the expiry", `INSERT INTO notification (user_id, event_key, body, expires_at, send_at) VALUES ('u1', 'ev-2', 'b', now() + interval '1 hour', now() + interval '2 hours')`, schemaErrCheck, "notification_send_before_expiry", "", ""},
	{"notification/cancel note without a cancel", `UPDATE notification SET cancel_note = 'changed my mind'`, schemaErrCheck, "notification_cancel_note_needs_cancel", "", ""},
	{"notification/delete with a task", `DELETE FROM notification`, schemaErrForeignKey, "delivery_task_notification_id_fkey", "", ""},

	// delivery_task
	{"task/duplicate id", `INSERT INTO delivery_task (id, notification_id, channel, max_attempts) OVERRIDING SYSTEM VALUE
		VALUES (` + schemaBaseTask + `, ` + schemaBaseNotification + `, 'other', 3)`, schemaErrUnique, "delivery_task_pkey", "", ""},
	{"task/unknown notification", `INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES (999999999, 'push', 3)`, schemaErrForeignKey, "delivery_task_notification_id_fkey", "", ""},
	{"task/second task on a channel", `INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES (` + schemaBaseNotification + `, 'push', 5)`, schemaErrUnique, "delivery_task_notification_channel_key", "", ""},
	{"task/ref reused", `INSERT INTO delivery_task (notification_id, channel, max_attempts, ref) VALUES (` + schemaBaseNotification + `, 'other', 3,
		(SELECT ref FROM delivery_task WHERE channel = 'push'))`, schemaErrUnique, "delivery_task_ref_key", "", ""},
	// a task's keys live on its delivery_task_key row (schema/001), written by the statement that inserts it
	{"task/two tasks on a channel in one statement", `INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES (` + schemaBaseNotification + `, 'ch-a', 3), (` + schemaBaseNotification + `, 'ch-a', 3)`, schemaErrUnique, "delivery_task_notification_channel_key", "", ""},
	{"task/ref twice in one statement", `INSERT INTO delivery_task (notification_id, channel, max_attempts, ref) VALUES (` + schemaBaseNotification + `, 'ch-a', 3,
		'00000000-0000-4000-8000-000000000030'), (` + schemaBaseNotification + `, 'ch-b', 3, '00000000-0000-4000-8000-000000000030')`, schemaErrUnique, "delivery_task_ref_key", "", ""},
	{"task key/second key of a task", `INSERT INTO delivery_task_key (task_id, notification_id, channel, ref) VALUES (` + schemaBaseTask + `, ` + schemaBaseNotification + `, 'other',
		gen_random_uuid()::text)`, schemaErrUnique, "delivery_task_key_pkey", "", ""},
	{"task key/no such task", `INSERT INTO delivery_task_key (task_id, notification_id, channel, ref) VALUES (999999999, ` + schemaBaseNotification + `, 'other',
		gen_random_uuid()::text)`, schemaErrForeignKey, "delivery_task_key_task_id_fkey", "", ""},
	{"task key/channel changed", `UPDATE delivery_task_key SET channel = 'other'`, schemaErrIntegrity, "delivery_task_key_fixed", "", ""},
	{"task key/ref changed", `UPDATE delivery_task_key SET ref = gen_random_uuid()::text`, schemaErrIntegrity, "delivery_task_key_fixed", "", ""},
	{"task key/deleted while its task stays", `DELETE FROM delivery_task_key`, schemaErrIntegrity, "delivery_task_key_fixed", "", ""},
	{"task key/truncated", `TRUNCATE delivery_task_key`, schemaErrIntegrity, "delivery_task_key_fixed", "", ""},
	// a task's provider message ids that its row does not carry (schema/001), recorded by the triggers of 003
	{"task provider msg/twice", schemaProviderMsg, schemaErrUnique, "delivery_task_provider_msg_pkey", "", schemaProviderMsg},
	{"task provider msg/no such task", `INSERT INTO delivery_task_provider_msg (provider_msg_id, task_id) VALUES ('pm-1', 999999999)`,
		schemaErrForeignKey, "delivery_task_provider_msg_task_id_fkey", "", ""},
	{"task provider msg/id of 501 chars", `INSERT INTO delivery_task_provider_msg (provider_msg_id, task_id) VALUES (repeat('m', 501), ` + schemaBaseTask + `)`,
		schemaErrCheck, "delivery_task_provider_msg_provider_msg_id_check", "", ""},
	{"task provider msg/changed", `UPDATE delivery_task_provider_msg SET provider_msg_id = 'pm-2'`, schemaErrIntegrity, "delivery_task_provider_msg_fixed", "", schemaProviderMsg},
	{"task provider msg/deleted while its task stays", `DELETE FROM delivery_task_provider_msg`, schemaErrIntegrity, "delivery_task_provider_msg_fixed", "", schemaProviderMsg},
	{"task provider msg/truncated", `TRUNCATE delivery_task_provider_msg`, schemaErrIntegrity, "delivery_task_provider_msg_fixed", "", ""},
	{"task/ref not one of ours", `INSERT INTO delivery_task (notification_id, channel, max_attempts, ref) VALUES (` + schemaBaseNotification + `, 'other', 3,
		'order-1')`, schemaErrCheck, "notifier_task_ref_check", "", ""},
	{"task/ref upper-case uuid", `INSERT INTO delivery_task (notification_id, channel, max_attempts, ref) VALUES (` + schemaBaseNotification + `, 'other', 3,
		upper(gen_random_uuid()::text))`, schemaErrCheck, "notifier_task_ref_check", "", ""},
	{"task/channel upper case", `INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES (` + schemaBaseNotification + `, 'SMS', 3)`, schemaErrCheck, "notifier_channel_check", "", ""},
	{"task/state 7th value", `UPDATE delivery_task SET state = 'DELIVERED', next_attempt_at = NULL`, schemaErrCheck, "delivery_task_state_check", "", ""},
	{"task/state lower case", `UPDATE delivery_task SET state = 'pending', next_attempt_at = NULL`, schemaErrCheck, "delivery_task_state_check", "", ""},
	{"task/attempt_count negative", `UPDATE delivery_task SET attempt_count = -1`, schemaErrCheck, "delivery_task_attempt_count_check", "", ""},
	{"task/max_attempts 0", `INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES (` + schemaBaseNotification + `, 'sms', 0)`, schemaErrCheck, "delivery_task_max_attempts_check", "", ""},
	{"task/max_attempts 101", `INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES (` + schemaBaseNotification + `, 'sms', 101)`, schemaErrCheck, "delivery_task_max_attempts_check", "", ""},
	{"task/lease_owner of 201 chars", `UPDATE delivery_task SET lease_owner = repeat('w', 201)`, schemaErrCheck, "delivery_task_lease_owner_check", "", ""},
	{"task/provider_msg_id of 501 chars", `UPDATE delivery_task SET provider_msg_id = repeat('m', 501)`, schemaErrCheck, "delivery_task_provider_msg_id_check", "", ""},
	{"task/last_error of 2001 chars", `UPDATE delivery_task SET last_error = repeat('e', 2001)`, schemaErrCheck, "delivery_task_last_error_check", "", ""},
	{"task/SENDING without lease or token", `UPDATE delivery_task SET state = 'SENDING', next_attempt_at = NULL`, schemaErrCheck, "delivery_task_sending_has_lease", "", ""},
	{"task/SENDING without token", `UPDATE delivery_task SET state = 'SENDING', next_attempt_at = NULL,
		lease_owner = 'w1', lease_until = now() + interval '30 seconds'`, schemaErrCheck, "delivery_task_sending_has_lease", "", ""},
	{"task/SENDING without lease_until", `UPDATE delivery_task SET state = 'SENDING', next_attempt_at = NULL,
		lease_owner = 'w1', attempt_token = gen_random_uuid()`, schemaErrCheck, "delivery_task_sending_has_lease", "", ""},
	{"task/SENDING without lease_owner", `UPDATE delivery_task SET state = 'SENDING', next_attempt_at = NULL,
		lease_until = now() + interval '30 seconds', attempt_token = gen_random_uuid()`, schemaErrCheck, "delivery_task_sending_has_lease", "", ""},
	{"task/uncertain without uncertain_since", `UPDATE delivery_task SET outcome_uncertain = true`, schemaErrCheck, "delivery_task_uncertain_since_iff_uncertain", "", ""},
	{"task/uncertain_since on a certain task", `UPDATE delivery_task SET uncertain_since = now()`, schemaErrCheck, "delivery_task_uncertain_since_iff_uncertain", "", ""},
	{"attempt/unknown action", `UPDATE delivery_attempt SET action = 'RESEND'`, schemaErrCheck, "delivery_attempt_action_check", "", ""},
	{"task/FAILED parked for review", `UPDATE delivery_task SET state = 'FAILED', next_attempt_at = NULL, needs_review = true`, schemaErrCheck, "delivery_task_review_only_unknown", "", ""},
	{"task/PENDING parked for review", `UPDATE delivery_task SET next_attempt_at = NULL, needs_review = true`, schemaErrCheck, "delivery_task_review_only_unknown", "", ""},
	{"task/PENDING without next_attempt_at", `UPDATE delivery_task SET next_attempt_at = NULL`, schemaErrCheck, "delivery_task_scheduled_iff_waiting", "", ""},
	{"task/PENDING without next_attempt_at at the head of a chain", `UPDATE delivery_task SET fallback_position = 1, next_attempt_at = NULL`,
		schemaErrCheck, "delivery_task_scheduled_iff_waiting", "", ""},
	{"task/fallback position 0", `UPDATE delivery_task SET fallback_position = 0`, schemaErrCheck, "delivery_task_fallback_position_check", "", ""},
	{"task/SENT with next_attempt_at", `UPDATE delivery_task SET state = 'SENT'`, schemaErrCheck, "delivery_task_scheduled_iff_waiting", "", ""},
	{"task/UNKNOWN waiting without next_attempt_at", `UPDATE delivery_task SET state = 'UNKNOWN', next_attempt_at = NULL,
		outcome_uncertain = true, uncertain_since = now()`, schemaErrCheck, "delivery_task_scheduled_iff_waiting", "", ""},
	{"task/UNKNOWN parked with next_attempt_at", `UPDATE delivery_task SET state = 'UNKNOWN', needs_review = true,
		outcome_uncertain = true, uncertain_since = now()`, schemaErrCheck, "delivery_task_scheduled_iff_waiting", "", ""},
	{"task/UNKNOWN without uncertainty", `UPDATE delivery_task SET state = 'UNKNOWN' WHERE id = ` + schemaBaseWaitingTask,
		schemaErrCheck, "delivery_task_unknown_is_uncertain", "", ""},
	{"task/max_attempts missing", `INSERT INTO delivery_task (notification_id, channel) VALUES (` + schemaBaseNotification + `, 'sms')`, schemaErrNotNull, "", "max_attempts", ""},
	{"task/state null", `UPDATE delivery_task SET state = NULL`, schemaErrNotNull, "", "state", ""},
	{"task/delete with an attempt", `DELETE FROM delivery_task`, schemaErrForeignKey, "delivery_task_attempts_kept", "", ""},

	// delivery_attempt
	{"attempt/duplicate id", `INSERT INTO delivery_attempt (id, task_id, attempt_no, attempt_token, action, worker) OVERRIDING SYSTEM VALUE
		SELECT id, task_id, 2, gen_random_uuid(), 'SEND', 'w1' FROM delivery_attempt`, schemaErrUnique, "delivery_attempt_pkey", "", ""},
	{"attempt/unknown task", `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
		VALUES (999999999, 1, gen_random_uuid(), 'SEND', 'w1')`, schemaErrIntegrity, "delivery_attempt_follows_task", "task_id", ""},
	{"attempt/reused token", `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
		VALUES (` + schemaBaseTask + `, 2, ` + schemaBaseToken + `, 'SEND', 'w2')`, schemaErrUnique, "delivery_attempt_attempt_token_key", "", ""},
	{"attempt/reused attempt_no", `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
		VALUES (` + schemaBaseTask + `, 1, gen_random_uuid(), 'SEND', 'w2')`, schemaErrUnique, "delivery_attempt_task_attempt_no_key", "", ""},
	{"attempt/attempt_no 0", `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
		VALUES (` + schemaBaseTask + `, 0, gen_random_uuid(), 'SEND', 'w1')`, schemaErrCheck, "delivery_attempt_attempt_no_check", "", ""},
	{"attempt/unknown action", `UPDATE delivery_attempt SET action = 'RETRY'`, schemaErrCheck, "delivery_attempt_action_check", "", ""},
	{"attempt/empty worker", `UPDATE delivery_attempt SET worker = ''`, schemaErrCheck, "delivery_attempt_worker_check", "", ""},
	{"attempt/worker of 201 chars", `UPDATE delivery_attempt SET worker = repeat('w', 201)`, schemaErrCheck, "delivery_attempt_worker_check", "", ""},
	{"attempt/unknown outcome", `UPDATE delivery_attempt SET outcome = 'DELIVERED', finished_at = now()`, schemaErrCheck, "delivery_attempt_outcome_check", "", ""},
	{"attempt/provider_msg_id of 501 chars", `UPDATE delivery_attempt SET provider_msg_id = repeat('m', 501)`, schemaErrCheck, "delivery_attempt_provider_msg_id_check", "", ""},
	{"attempt/error of 2001 chars", `UPDATE delivery_attempt SET error = repeat('e', 2001)`, schemaErrCheck, "delivery_attempt_error_check", "", ""},
	{"attempt/late LEASE_EXPIRED", `UPDATE delivery_attempt SET late_outcome = 'LEASE_EXPIRED', late_at = now()`, schemaErrCheck, "delivery_attempt_late_outcome_check", "", ""},
	{"attempt/late MANUAL_SENT", `UPDATE delivery_attempt SET late_outcome = 'MANUAL_SENT', late_at = now()`, schemaErrCheck, "delivery_attempt_late_outcome_check", "", ""},
	{"attempt/note of 2001 chars", `UPDATE delivery_attempt SET note = repeat('n', 2001)`, schemaErrCheck, "delivery_attempt_note_check", "", ""},
	{"attempt/outcome without finished_at", `UPDATE delivery_attempt SET outcome = 'TIMEOUT'`, schemaErrCheck, "delivery_attempt_finished_iff_outcome", "", ""},
	{"attempt/finished_at without outcome", `UPDATE delivery_attempt SET finished_at = now()`, schemaErrCheck, "delivery_attempt_finished_iff_outcome", "", ""},
	{"attempt/late outcome without time", `UPDATE delivery_attempt SET late_outcome = 'TIMEOUT'`, schemaErrCheck, "delivery_attempt_late_has_time", "", ""},
	{"attempt/late time without outcome", `UPDATE delivery_attempt SET late_at = now()`, schemaErrCheck, "delivery_attempt_late_has_time", "", ""},
	{"attempt/manual without note", `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome)
		VALUES (` + schemaBaseTask + `, 2, gen_random_uuid(), 'MANUAL', 'op', now(), 'MANUAL_SENT')`, schemaErrCheck, "delivery_attempt_manual_has_note", "", ""},
	{"attempt/manual with empty note", `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome, note)
		VALUES (` + schemaBaseTask + `, 2, gen_random_uuid(), 'MANUAL', 'op', now(), 'MANUAL_SENT', '')`, schemaErrCheck, "delivery_attempt_manual_has_note", "", ""},
	{"attempt/token null", `UPDATE delivery_attempt SET attempt_token = NULL`, schemaErrNotNull, "", "attempt_token", ""},
	{"attempt/worker null", `UPDATE delivery_attempt SET worker = NULL`, schemaErrNotNull, "", "worker", ""},

	// delivery_receipt (schema/004)
	{"receipt/duplicate id", `INSERT INTO delivery_receipt (id, task_id, source, event_id, kind, effect) OVERRIDING SYSTEM VALUE
		SELECT id, task_id, source, 'evt-2', kind, effect FROM delivery_receipt`, schemaErrUnique, "delivery_receipt_pkey", "", schemaReceipt},
	{"receipt/unknown task", schemaReceiptInsert("999999999", "'twilio'", "'SM1:sent'", "'ACCEPTED'", "false", "'SETTLED'"), schemaErrForeignKey, "delivery_receipt_task_id_fkey", "", ""},
	{"receipt/the same event twice", schemaReceiptInsert(schemaBaseTask, "'standard-webhooks'", "'evt-1'", "'ACCEPTED'", "false", "'UNCHANGED'"),
		schemaErrUnique, "delivery_receipt_event_key", "", schemaReceipt},
	{"receipt/unknown source", schemaReceiptInsert(schemaBaseTask, "'mailgun'", "'evt-9'", "'ACCEPTED'", "false", "'NOTED'"), schemaErrCheck, "delivery_receipt_source_check", "", ""},
	{"receipt/empty event id", schemaReceiptInsert(schemaBaseTask, "'twilio'", "''", "'ACCEPTED'", "false", "'NOTED'"), schemaErrCheck, "delivery_receipt_event_id_check", "", ""},
	{"receipt/event id of 501 chars", schemaReceiptInsert(schemaBaseTask, "'twilio'", "repeat('e', 501)", "'ACCEPTED'", "false", "'NOTED'"), schemaErrCheck, "delivery_receipt_event_id_check", "", ""},
	{"receipt/unknown kind", schemaReceiptInsert(schemaBaseTask, "'twilio'", "'evt-9'", "'OPENED'", "false", "'NOTED'"), schemaErrCheck, "delivery_receipt_kind_check", "", ""},
	{"receipt/unknown effect", schemaReceiptInsert(schemaBaseTask, "'twilio'", "'evt-9'", "'ACCEPTED'", "false", "'IGNORED'"), schemaErrCheck, "delivery_receipt_effect_check", "", ""},
	{"receipt/hard bounce of a delivery", schemaReceiptInsert(schemaBaseTask, "'twilio'", "'evt-9'", "'DELIVERED'", "true", "'NOTED'"), schemaErrCheck, "delivery_receipt_hard_bounce_is_bounce", "", ""},
	{"receipt/provider_msg_id of 501 chars", `INSERT INTO delivery_receipt (task_id, source, event_id, kind, effect, provider_msg_id)
		VALUES (` + schemaBaseTask + `, 'twilio', 'evt-9', 'ACCEPTED', 'NOTED', repeat('m', 501))`, schemaErrCheck, "delivery_receipt_provider_msg_id_check", "", ""},
	{"receipt/detail of 2001 chars", `INSERT INTO delivery_receipt (task_id, source, event_id, kind, effect, detail)
		VALUES (` + schemaBaseTask + `, 'twilio', 'evt-9', 'ACCEPTED', 'NOTED', repeat('d', 2001))`, schemaErrCheck, "delivery_receipt_detail_check", "", ""},
	{"receipt/kind null", schemaReceiptInsert(schemaBaseTask, "'twilio'", "'evt-9'", "NULL", "false", "'NOTED'"), schemaErrNotNull, "", "kind", ""},
	{"task/delete with a receipt", `DELETE FROM delivery_task WHERE id = ` + schemaBaseWaitingTask,
		schemaErrForeignKey, "delivery_receipt_task_id_fkey", "", `INSERT INTO delivery_receipt (task_id, source, event_id, kind, effect)
		VALUES (` + schemaBaseWaitingTask + `, 'twilio', 'SM2:sent', 'ACCEPTED', 'NOTED')`},
	{name: "receipt/append-only: rewritten", setup: schemaReceipt, sql: `UPDATE delivery_receipt SET kind = 'BOUNCED'`,
		code: schemaErrIntegrity, constraint: "delivery_receipt_append_only"},
	{name: "receipt/append-only: deleted while its task is held", setup: schemaReceipt, sql: `DELETE FROM delivery_receipt`,
		code: schemaErrIntegrity, constraint: "delivery_receipt_append_only"},
	{name: "receipt/append-only: truncated", setup: schemaReceipt, sql: `TRUNCATE delivery_receipt`,
		code: schemaErrIntegrity, constraint: "delivery_receipt_append_only"},

	// channel_rate_limit (schema/001)
	{"rate/duplicate channel", `INSERT INTO channel_rate_limit (channel, rate, burst, tokens) VALUES ('push', 1, 1, 1)`, schemaErrUnique, "channel_rate_limit_pkey", "", ""},
	{"rate/channel upper case", `INSERT INTO channel_rate_limit (channel, rate, burst, tokens) VALUES ('SMS', 1, 1, 1)`, schemaErrCheck, "notifier_channel_check", "", ""},
	{"rate/channel of 33 chars", `INSERT INTO channel_rate_limit (channel, rate, burst, tokens) VALUES (repeat('a', 33), 1, 1, 1)`, schemaErrCheck, "notifier_channel_check", "", ""},
	{"rate/rate 0", `UPDATE channel_rate_limit SET rate = 0`, schemaErrCheck, "channel_rate_limit_rate_check", "", ""},
	{"rate/rate negative", `UPDATE channel_rate_limit SET rate = -1`, schemaErrCheck, "channel_rate_limit_rate_check", "", ""},
	{"rate/rate over a million a second", `UPDATE channel_rate_limit SET rate = 1000001`, schemaErrCheck, "channel_rate_limit_rate_check", "", ""},
	{"rate/rate infinite", `UPDATE channel_rate_limit SET rate = 'Infinity'`, schemaErrCheck, "channel_rate_limit_rate_check", "", ""},
	{"rate/rate NaN", `UPDATE channel_rate_limit SET rate = 'NaN'`, schemaErrCheck, "channel_rate_limit_rate_check", "", ""},
	{"rate/burst under one", `UPDATE channel_rate_limit SET burst = 0.99, tokens = 0`, schemaErrCheck, "channel_rate_limit_burst_check", "", ""},
	{"rate/burst over a million", `UPDATE channel_rate_limit SET burst = 1000001`, schemaErrCheck, "channel_rate_limit_burst_check", "", ""},
	{"rate/burst NaN", `UPDATE channel_rate_limit SET burst = 'NaN'`, schemaErrCheck, "channel_rate_limit_burst_check", "", ""},
	{"rate/tokens negative", `UPDATE channel_rate_limit SET tokens = -0.001`, schemaErrCheck, "channel_rate_limit_tokens_check", "", ""},
	{"rate/tokens above burst", `UPDATE channel_rate_limit SET tokens = 10.001`, schemaErrCheck, "channel_rate_limit_tokens_check", "", ""},
	{"rate/tokens NaN", `UPDATE channel_rate_limit SET tokens = 'NaN'`, schemaErrCheck, "channel_rate_limit_tokens_check", "", ""},
	{"rate/refilled_at infinite", `UPDATE channel_rate_limit SET refilled_at = 'infinity'`, schemaErrCheck, "channel_rate_limit_refilled_at_check", "", ""},
	{"rate/updated_at infinite", `UPDATE channel_rate_limit SET updated_at = '-infinity'`, schemaErrCheck, "channel_rate_limit_updated_at_check", "", ""},
	{"rate/paused over an hour", `UPDATE channel_rate_limit SET paused_until = updated_at + interval '1 hour 1 second'`, schemaErrCheck, "channel_rate_limit_pause_check", "", ""},
	{"rate/paused forever", `UPDATE channel_rate_limit SET paused_until = 'infinity'`, schemaErrCheck, "channel_rate_limit_pause_check", "", ""},
	{"rate/rate null", `UPDATE channel_rate_limit SET rate = NULL`, schemaErrNotNull, "", "rate", ""},
	{"rate/tokens missing", `INSERT INTO channel_rate_limit (channel, rate, burst) VALUES ('sms', 1, 1)`, schemaErrNotNull, "", "tokens", ""},

	// The account refund and channel_pause (schema/003, schema/001)
	{"task/account_refusals negative", `UPDATE delivery_task SET account_refusals = -1 WHERE id = ` + schemaBaseWaitingTask,
		schemaErrCheck, "delivery_task_account_refusals_check", "", ""},
	{"task/account_refusals above attempt_count", `UPDATE delivery_task SET account_refusals = 1 WHERE id = ` + schemaBaseWaitingTask,
		schemaErrCheck, "delivery_task_account_refusals_check", "", ""},
	{name: "task/account refund without an ACCOUNT_REFUSED attempt", setup: `UPDATE delivery_attempt SET outcome = 'REJECTED', finished_at = now()`,
		sql: `UPDATE delivery_task SET state = 'PENDING', next_attempt_at = now(), lease_owner = NULL, lease_until = NULL,
			account_refusals = 1 WHERE id = ` + schemaBaseTask,
		code: schemaErrIntegrity, constraint: "delivery_task_account_refusals", column: "account_refusals"},
	{name: "pause/duplicate channel", setup: schemaPause("push"), sql: schemaPause("push"), code: schemaErrUnique, constraint: "channel_pause_pkey"},
	{"pause/channel upper case", strings.Replace(schemaPause("push"), "'push'", "'Push'", 1), schemaErrCheck, "channel_pause_channel_check", "", ""},
	{"pause/cause of 2001 chars", strings.Replace(schemaPause("push"), "'credential rejected'", "repeat('c', 2001)", 1), schemaErrCheck, "channel_pause_cause_check", "", ""},
	{"pause/backoff 0", strings.Replace(schemaPause("push"), "2, now()", "0, now()", 1), schemaErrCheck, "channel_pause_backoff_check", "", ""},
	{"pause/backoff over an hour", strings.Replace(schemaPause("push"), "2, now()", "3601, now()", 1), schemaErrCheck, "channel_pause_backoff_check", "", ""},
	{"pause/hold 0", strings.Replace(schemaPause("push"), "now(), 30)", "now(), 0)", 1), schemaErrCheck, "channel_pause_hold_check", "", ""},
	{"pause/hold over a day", strings.Replace(schemaPause("push"), "now(), 30)", "now(), 86401)", 1), schemaErrCheck, "channel_pause_hold_check", "", ""},
	{"pause/cause null", strings.Replace(schemaPause("push"), "'credential rejected'", "NULL", 1), schemaErrNotNull, "", "cause", ""},

	// delivery_attempt is append-only (triggers, schema/003): the rules carry a constraint name too.
	{name: "attempt/append-only: rewrite worker", sql: `UPDATE delivery_attempt SET worker = 'w2'`,
		code: schemaErrIntegrity, constraint: "delivery_attempt_append_only", column: "worker"},
	{name: "attempt/append-only: overwrite outcome", setup: `UPDATE delivery_attempt SET outcome = 'TIMEOUT', finished_at = now()`,
		sql: `UPDATE delivery_attempt SET outcome = 'ACCEPTED'`, code: schemaErrIntegrity, constraint: "delivery_attempt_append_only", column: "outcome"},
	{name: "attempt/append-only: overwrite late outcome", setup: `UPDATE delivery_attempt SET outcome = 'TIMEOUT', finished_at = now(), late_outcome = 'ACCEPTED', late_at = now()`,
		sql: `UPDATE delivery_attempt SET late_outcome = 'REJECTED'`, code: schemaErrIntegrity, constraint: "delivery_attempt_append_only", column: "late_outcome"},
	{name: "attempt/retention: delete open attempt", sql: `DELETE FROM delivery_attempt`,
		code: schemaErrIntegrity, constraint: "delivery_attempt_retention_only"},
	{name: "attempt/retention: delete history of an unfinished task", setup: `UPDATE delivery_attempt SET outcome = 'HTTP_5XX', finished_at = now()`,
		sql: `DELETE FROM delivery_attempt`, code: schemaErrIntegrity, constraint: "delivery_attempt_retention_only"},
	{name: "attempt/retention: truncate", sql: `TRUNCATE delivery_attempt`,
		code: schemaErrIntegrity, constraint: "delivery_attempt_retention_only"},

	// The state machine (triggers, schema/003), as the owner: each rule once here; every forbidden move,
	// per role, in statemachine_test.go.
	{name: "task/state machine: fixed column", sql: `UPDATE delivery_task SET max_attempts = 5 WHERE id = ` + schemaBaseWaitingTask,
		code: schemaErrIntegrity, constraint: "delivery_task_fixed", column: "max_attempts"},
	{name: "task/state machine: ref rewritten", sql: `UPDATE delivery_task SET ref = gen_random_uuid()::text WHERE id = ` + schemaBaseWaitingTask,
		code: schemaErrIntegrity, constraint: "delivery_task_fixed", column: "ref"},
	{name: "task/state machine: final state", setup: schemaSettle("sms", "SUPPRESSED", "PREF_DISABLED"),
		sql:  `UPDATE delivery_task SET state = 'PENDING', next_attempt_at = now() WHERE id = ` + schemaBaseWaitingTask,
		code: schemaErrIntegrity, constraint: "delivery_task_final", column: "state"},
	{name: "task/state machine: not a move", sql: `UPDATE delivery_task SET last_error = 'edited by hand' WHERE id = ` + schemaBaseWaitingTask,
		code: schemaErrIntegrity, constraint: "delivery_task_transition", column: "state"},
	{name: "task/state machine: attempt_count jumps", sql: `UPDATE delivery_task SET attempt_count = 5 WHERE id = ` + schemaBaseWaitingTask,
		code: schemaErrIntegrity, constraint: "delivery_task_attempt_count", column: "attempt_count"},
	{name: "task/state machine: claim writes uncertainty off",
		setup: `WITH a AS (UPDATE delivery_attempt SET outcome = 'TIMEOUT', finished_at = now() RETURNING task_id)
			UPDATE delivery_task SET state = 'UNKNOWN', outcome_uncertain = true, uncertain_since = updated_at, lease_owner = NULL,
			       lease_until = NULL, next_attempt_at = now() WHERE id IN (SELECT task_id FROM a)`,
		sql: `UPDATE delivery_task SET state = 'SENDING', attempt_token = gen_random_uuid(), lease_owner = 'w2',
			lease_until = now() + interval '30 seconds', next_attempt_at = NULL, attempt_count = 2,
			outcome_uncertain = false, uncertain_since = NULL WHERE id = ` + schemaBaseTask,
		code: schemaErrIntegrity, constraint: "delivery_task_uncertainty", column: "outcome_uncertain"},
	{name: "task/state machine: claim without its attempt row", sql: `UPDATE delivery_task SET state = 'SENDING',
			attempt_token = gen_random_uuid(), lease_owner = 'w1', lease_until = now() + interval '30 seconds',
			next_attempt_at = NULL, attempt_count = 1 WHERE id = ` + schemaBaseWaitingTask,
		code: schemaErrIntegrity, constraint: "delivery_task_evidence", column: "attempt_count"},
	{name: "attempt/state machine: QUERY_NOT_FOUND under SEND", sql: `UPDATE delivery_attempt SET outcome = 'QUERY_NOT_FOUND', finished_at = now()`,
		code: schemaErrIntegrity, constraint: "delivery_attempt_outcome_fits_action", column: "outcome"},
	{name: "attempt/state machine: attempt the task did not count", sql: `INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
		VALUES (` + schemaBaseWaitingTask + `, 1, gen_random_uuid(), 'SEND', 'w1')`,
		code: schemaErrIntegrity, constraint: "delivery_attempt_follows_task", column: "attempt_no"},
}

func TestSchemaConstraints(t *testing.T) {
	for _, v := range schemaViolations {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			is := is.New(t)
			pool := pgtest.NewDB(t)
			loadSchemaBaseline(t, pool)
			if v.setup != "" {
				_, err := pool.Exec(context.Background(), v.setup)
				is.NoErr(err) // the setup is valid
			}
			_, err := pool.Exec(context.Background(), v.sql)
			var pgErr *pgconn.PgError
			is.True(errors.As(err, &pgErr)) // PostgreSQL rejects the statement with a *pgconn.PgError
			t.Logf("rejected: %s (%s) constraint=%q column=%q", pgErr.Message, pgErr.Code, pgErr.ConstraintName, pgErr.ColumnName)
			is.Equal(pgErr.Code, v.code) // the SQLSTATE of the constraint kind
			if v.constraint != "" {
				is.Equal(pgErr.ConstraintName, v.constraint) // the expected constraint, not another one
			}
			if v.column != "" {
				is.Equal(pgErr.ColumnName, v.column) // the column the error names
			}
		})
	}
}

// TestSchemaConstraintsAllCovered fails when a constraint is added to schema/ without a schemaViolation case
// in schemaViolations.
func TestSchemaConstraintsAllCovered(t *testing.T) {
	is := is.New(t)
	pool := pgtest.NewDB(t)
	covered := map[string]bool{}
	for _, v := range schemaViolations {
		if v.constraint != "" {
			covered[v.constraint] = true
		}
	}
	rows, err := pool.Query(context.Background(), `
		SELECT c.conname
		FROM pg_constraint c
		JOIN pg_class r ON r.oid = c.conrelid
		JOIN pg_namespace s ON s.oid = r.relnamespace
		WHERE s.nspname = 'public'
		  AND r.relkind = 'r' AND r.relname <> 'schema_migrations' -- every table of ours (dbmate's is not)
		  AND c.contype IN ('p', 'u', 'f', 'c')
		UNION ALL -- and every domain's CHECK (schema/001)
		SELECT c.conname
		FROM pg_constraint c
		JOIN pg_type d ON d.oid = c.contypid
		JOIN pg_namespace s ON s.oid = d.typnamespace
		WHERE s.nspname = 'public' AND c.contype = 'c'
		ORDER BY 1`)
	is.NoErr(err) // list the schema's constraints
	var names []string
	for rows.Next() {
		var name string
		is.NoErr(rows.Scan(&name)) // read a constraint name
		names = append(names, name)
	}
	is.NoErr(rows.Err())      // the list is complete
	is.True(len(names) >= 39) // the schema's constraints were listed (39 when this test was written)
	// Constraint names raised by the schema's trigger functions (RAISE ... USING CONSTRAINT = '...').
	rows, err = pool.Query(context.Background(), `
		SELECT DISTINCT m[1]
		FROM pg_proc p
		JOIN pg_namespace s ON s.oid = p.pronamespace
		CROSS JOIN LATERAL regexp_matches(p.prosrc, 'CONSTRAINT\s*=\s*''([a-z0-9_]+)''', 'g') AS m
		WHERE s.nspname = 'public'`)
	is.NoErr(err) // list the constraint names raised by triggers
	for rows.Next() {
		var name string
		is.NoErr(rows.Scan(&name)) // read a constraint name
		names = append(names, name)
	}
	is.NoErr(rows.Err()) // the list is complete
	for _, name := range names {
		if !covered[name] {
			t.Errorf("constraint %s has no schemaViolation case in schemaViolations", name)
		}
	}
}

// TestSchemaBaselineAndBoundariesAreValid proves the rows the violations start from are accepted, and
// so are the values at the very edge of each bound: a schemaViolation is rejected because of the one thing it
// changes, and no bound is off by one.
func TestSchemaBaselineAndBoundariesAreValid(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	for _, stmt := range schemaBaseline {
		tag, err := pool.Exec(ctx, stmt)
		is.NoErr(err)                          // the baseline row is valid
		is.Equal(tag.RowsAffected(), int64(1)) // and was inserted
	}
	valid := []string{
		`INSERT INTO channel_pref (user_id, channel, address, enabled) VALUES (repeat('u', 200), repeat('a', 32), repeat('a', 1000), false)`,
		`INSERT INTO channel_pref (user_id, channel, address) VALUES ('u1', 'a_b-9', 'x')`,
		`UPDATE channel_pref SET version = 1000 WHERE user_id = 'u1' AND channel = 'push'`,
		`INSERT INTO notification (user_id, event_key, body, expires_at) VALUES (repeat('u', 200), repeat('k', 200), repeat('x', 65536), now() + interval '1 microsecond')`,
		`INSERT INTO notification (user_id, event_key, body, expires_at) VALUES ('u1', 'ev-2', repeat('é', 32768), now() + interval '1 hour')`,
		`INSERT INTO notification (user_id, event_key, body, expires_at) VALUES ('u2', 'ev-1', '', now() + interval '1 hour')`,
		`UPDATE notification SET cancelled_at = now(), cancel_note = repeat('n', 2000) WHERE user_id = 'u2'`,
		`INSERT INTO delivery_task (notification_id, channel, max_attempts) VALUES (` + schemaBaseNotification + `, 'other', 1)`,
		`INSERT INTO delivery_task (notification_id, channel, max_attempts, lease_owner, provider_msg_id, last_error)
		 VALUES (` + schemaBaseNotification + `, 'none', 100, repeat('w', 200), repeat('m', 500), repeat('e', 2000))`,
		// Every state, reached by the protocol's moves. push (SENDING): its call times out, with the
		// longest values an attempt keeps; UNKNOWN, waiting for a retry.
		`UPDATE delivery_attempt SET outcome = 'TIMEOUT', finished_at = now(), late_outcome = 'ACCEPTED', late_at = now(),
		 provider_msg_id = repeat('m', 500), error = repeat('e', 2000), note = repeat('n', 2000) WHERE task_id = ` + schemaBaseTask,
		`UPDATE delivery_task SET state = 'UNKNOWN', outcome_uncertain = true, uncertain_since = updated_at, next_attempt_at = now(),
		 lease_owner = NULL, lease_until = NULL WHERE channel = 'push'`,
		// Claimed again to query (the longest lease owner and worker); the query fails: parked.
		`WITH c AS (
		   UPDATE delivery_task SET state = 'SENDING', attempt_token = gen_random_uuid(), lease_owner = repeat('w', 200),
		          lease_until = now() + interval '30 seconds', next_attempt_at = NULL, attempt_count = attempt_count + 1
		   WHERE channel = 'push' RETURNING id, attempt_count, attempt_token)
		 INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
		 SELECT id, attempt_count, attempt_token, 'QUERY', repeat('w', 200) FROM c`,
		`UPDATE delivery_attempt SET outcome = 'QUERY_FAILED', finished_at = now() WHERE action = 'QUERY'`,
		`UPDATE delivery_task SET state = 'UNKNOWN', needs_review = true, lease_owner = NULL, lease_until = NULL WHERE channel = 'push'`,
		// A human resolves it, with the longest note and message id: SENT.
		`SELECT * FROM notifier_resolve(` + schemaBaseTask + `, 'SENT', repeat('n', 2000), 'op', repeat('m', 500))`,
		// other: claimed, timed out, then expired before the next call: parked with its SKIP attempt.
		schemaClaim("other", "gen_random_uuid()", "SEND"),
		`UPDATE delivery_attempt SET outcome = 'TIMEOUT', finished_at = now() WHERE outcome IS NULL`,
		`UPDATE delivery_task SET state = 'UNKNOWN', outcome_uncertain = true, uncertain_since = updated_at, next_attempt_at = now(),
		 lease_owner = NULL, lease_until = NULL WHERE channel = 'other'`,
		`WITH s AS (
		   UPDATE delivery_task SET needs_review = true, next_attempt_at = NULL, attempt_count = attempt_count + 1
		   WHERE channel = 'other' RETURNING id, attempt_count)
		 INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome)
		 SELECT id, attempt_count, gen_random_uuid(), 'SKIP', 'w1', now(), 'TTL_EXPIRED_UNCERTAIN' FROM s`,
		// sms and none: settled at claim time, FAILED (expired) and SUPPRESSED (disabled).
		schemaSettle("sms", "FAILED", "TTL_EXPIRED"),
		schemaSettle("none", "SUPPRESSED", "PREF_DISABLED"),
		// Rate limits at their bounds: the largest and smallest rate and burst, empty and full, and
		// paused for exactly an hour.
		`INSERT INTO channel_rate_limit (channel, rate, burst, tokens) VALUES (repeat('a', 32), 1000000, 1000000, 1000000)`,
		`INSERT INTO channel_rate_limit (channel, rate, burst, tokens) VALUES ('a_b-9', 1e-9, 1, 0)`,
		`UPDATE channel_rate_limit SET paused_until = updated_at + interval '1 hour', tokens = 0 WHERE channel = 'push'`,
		// Pauses at their bounds: the longest channel and cause, the shortest and longest backoff and hold.
		`INSERT INTO channel_pause (channel, cause, backoff_seconds, probe_after, probe_hold_seconds)
		 VALUES (repeat('a', 32), repeat('c', 2000), 3600, now(), 86400)`,
		`INSERT INTO channel_pause (channel, cause, backoff_seconds, probe_after, probe_hold_seconds)
		 VALUES ('a_b-9', '', 1e-9, now(), 1e-9)`,
	}
	for _, stmt := range valid {
		tag, err := pool.Exec(ctx, stmt)
		if err != nil {
			t.Logf("statement: %s", stmt)
		}
		is.NoErr(err)                          // a value at the edge of a bound is accepted
		is.Equal(tag.RowsAffected(), int64(1)) // the statement touched its one row
	}
}

// TestSchemaAcceptsEveryCallOutcome: every observation a channel adapter can report fits both
// delivery_attempt.outcome and late_outcome; one the CHECK refused would fail a whole batch's finish.
func TestSchemaAcceptsEveryCallOutcome(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	loadSchemaBaseline(t, pool)
	outcomes := []delivery.Outcome{
		delivery.OutcomeAccepted, delivery.OutcomeAcceptedReplay, delivery.OutcomeQueryFound, delivery.OutcomeQueryNotFound,
		delivery.OutcomeQueryFailed, delivery.OutcomeTimeout, delivery.OutcomeIOError, delivery.OutcomeConnectFailed,
		delivery.OutcomeInFlight, delivery.OutcomeMalformed, delivery.OutcomeHTTP5xx, delivery.OutcomeGatewayError,
		delivery.OutcomeThrottled, delivery.OutcomeRejected,
	}
	// Only the columns' CHECKs are under test here: the state machine (schema/003), which would refuse
	// these rows for following no move, is off for the statement.
	for i, o := range outcomes {
		_, err := pool.Exec(ctx, `ALTER TABLE delivery_attempt DISABLE TRIGGER delivery_attempt_fits_insert;
			INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker,
			finished_at, outcome, late_outcome, late_at)
			VALUES (`+schemaBaseTask+`, `+strconv.Itoa(i+2)+`, gen_random_uuid(), 'SEND', 'w1', now(), '`+string(o)+`', '`+string(o)+`', now());
			ALTER TABLE delivery_attempt ENABLE TRIGGER delivery_attempt_fits_insert`)
		if err != nil {
			t.Logf("outcome %s", o)
		}
		is.NoErr(err) // the outcome is accepted as outcome and as late_outcome
	}
	var rows int
	is.NoErr(pool.QueryRow(ctx, `SELECT count(*) FROM delivery_attempt`).Scan(&rows))
	is.Equal(rows, len(outcomes)+1) // one attempt row each, beside the baseline's
}

// TestSchemaIdentifiersCompareInByteOrder: the keys the protocol only ever compares for equality, and
// every index key on them, compare in byte order (COLLATE "C"), whatever collation the database has: a
// task's ref and the providers' message ids (schema/001), which every claim and finish indexes again, and
// the submission's user and event key (schema/001), which every create indexes and every claim looks up.
// Under a language's collation each comparison in those indexes is a strcoll()
// (docs/benchmarks/2026-12-05-byte-order-keys.md). The lookups by these columns, as generic plans, still
// go through their indexes: an index whose collation differed from its column's would leave them
// scanning the tables.
func TestSchemaIdentifiersCompareInByteOrder(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	pool := pgtest.NewDB(t)
	columns := []string{"delivery_task.ref", "delivery_task_key.ref", "delivery_task.provider_msg_id", "delivery_attempt.provider_msg_id",
		"delivery_task_provider_msg.provider_msg_id",
		"notification.user_id", "notification.event_key", "channel_pref.user_id"}
	rows, err := pool.Query(ctx, `
		SELECT a.attrelid::regclass::text || '.' || a.attname, coalesce(c.collname, '')
		FROM pg_attribute a LEFT JOIN pg_collation c ON c.oid = a.attcollation
		WHERE a.attrelid::regclass::text || '.' || a.attname = ANY ($1)`, columns)
	is.NoErr(err)
	seen := 0
	for rows.Next() {
		var column, collation string
		is.NoErr(rows.Scan(&column, &collation))
		t.Logf("%s: collation %q", column, collation)
		is.Equal(collation, "C") // the column compares in byte order
		seen++
	}
	is.NoErr(rows.Err())
	is.Equal(seen, len(columns)) // every identifier column was found and checked

	// Each index key on one of those columns: (index, column, the key's collation).
	rows, err = pool.Query(ctx, `
		SELECT i.indexrelid::regclass::text, a.attname, coalesce(c.collname, '')
		FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey::int2[], i.indcollation::oid[]) AS k(attnum, coll)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		LEFT JOIN pg_collation c ON c.oid = k.coll
		WHERE a.attrelid::regclass::text || '.' || a.attname = ANY ($1)`, columns)
	is.NoErr(err)
	indexes := map[string]bool{}
	for rows.Next() {
		var index, column, collation string
		is.NoErr(rows.Scan(&index, &column, &collation))
		t.Logf("%s (%s): collation %q", index, column, collation)
		is.Equal(collation, "C") // the index key compares in byte order
		indexes[index] = true
	}
	is.NoErr(rows.Err())
	// delivery_task_ref_key (on delivery_task_key.ref, schema/001), delivery_task_provider_msg_idx,
	// delivery_task_provider_msg_pkey, notification_user_event_key_key, channel_pref_pkey
	is.Equal(len(indexes), 5)

	tx, err := pool.Begin(ctx)
	is.NoErr(err)
	defer func() { _ = tx.Rollback(ctx) }()
	for name, lookup := range map[string]string{
		"by_ref": `SELECT task_id FROM delivery_task_key WHERE ref = $1::text`,
		"by_msg": `SELECT t.id FROM delivery_task t WHERE t.provider_msg_id = $1::text
		           UNION SELECT p.task_id FROM delivery_task_provider_msg p WHERE p.provider_msg_id = $1::text`,
		"by_event": `SELECT id FROM notification WHERE user_id = $1::text AND event_key = $1::text`,
		"by_pref":  `SELECT enabled FROM channel_pref WHERE user_id = $1::text AND channel = $1::text`,
	} {
		p := explainGenericAs(t, tx, "text", lookup, "'x'")
		t.Logf("%s:\n%s", name, p.json)
		is.Equal(len(p.seqScans), 0) // the lookup goes through the indexes
	}
}
