-- migrate:up
-- Receipts: what a provider says about a message after it accepted it (accepted, delivered, bounced,
-- complained, undelivered), through a signed callback (notifier receipts). Any receipt is evidence that
-- the provider had the message, so it can end an uncertainty honestly: an UNKNOWN task (parked or
-- not), or one waiting for a retry, becomes SENT with the receipt as its evidence (a RECEIPT attempt).
-- A receipt never moves a final state (SENT, FAILED, SUPPRESSED: schema/010); on FAILED or SUPPRESSED
-- it is kept and shown (notifier review: LATE_ACCEPTED). Receipts are append-only, deduplicated by the
-- provider's event id.

-- One row per provider event about one of our tasks.
--   source      which signed callback format it came in (the receiver verified its signature)
--   event_id    the provider's id of this event (Standard Webhooks: webhook-id; Twilio: message sid and
--               status): a redelivered or replayed callback is the same event, recorded once
--   kind        what the provider says: ACCEPTED (it has the message, queued or sent), DELIVERED,
--               BOUNCED (hard_bounce: permanently), COMPLAINED, UNDELIVERED (it gave up after accepting)
--   effect      what recording it did to the task: SETTLED (made SENT), NOTED (the task was SENDING: its
--               holder finishes, then the receipt settles it), UNCHANGED (already SENT), CONTRADICTS
--               (FAILED or SUPPRESSED: the provider had it after all)
CREATE TABLE delivery_receipt (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id         bigint      NOT NULL REFERENCES delivery_task (id),
    source          text        NOT NULL CHECK (source IN ('standard-webhooks', 'twilio')),
    event_id        text        NOT NULL CHECK (event_id <> '' AND length(event_id) <= 500),
    kind            text        NOT NULL CHECK (kind IN ('ACCEPTED', 'DELIVERED', 'BOUNCED', 'COMPLAINED', 'UNDELIVERED')),
    hard_bounce     boolean     NOT NULL DEFAULT false,
    effect          text        NOT NULL CHECK (effect IN ('SETTLED', 'NOTED', 'UNCHANGED', 'CONTRADICTS')),
    provider_msg_id text        CHECK (length(provider_msg_id) <= 500),
    occurred_at     timestamptz,
    received_at     timestamptz NOT NULL DEFAULT now(),
    detail          text        CHECK (length(detail) <= 2000),
    CONSTRAINT delivery_receipt_event_key UNIQUE (source, event_id),
    CONSTRAINT delivery_receipt_hard_bounce_is_bounce CHECK (NOT hard_bounce OR kind = 'BOUNCED')
);

-- A task's receipts (status, review, retention).
CREATE INDEX delivery_receipt_task_idx ON delivery_receipt (task_id);
-- Final "not sent" tasks a receipt contradicts, for notifier review and status: rare, so small.
CREATE INDEX delivery_receipt_contradicts_idx ON delivery_receipt (task_id) WHERE effect = 'CONTRADICTS';

-- When the first receipt arrived for a task that was not final yet. Written once (schema/010: "note a
-- receipt"). While set on a task that is not SENT, the task is settled by it as soon as nobody holds it:
-- at once when it is waiting or parked, by the receivers' sweep or the next claim when it was SENDING.
ALTER TABLE delivery_task ADD COLUMN receipt_at timestamptz;
-- Tasks with a receipt not settled yet: what the receivers' sweep looks for. Small by construction.
CREATE INDEX delivery_task_receipt_unsettled_idx ON delivery_task (id)
    WHERE receipt_at IS NOT NULL AND state IN ('PENDING', 'SENDING', 'UNKNOWN');

-- Tasks that a holder's finish made FAILED or SUPPRESSED after a receipt was noted on them: the provider
-- had the message; notifier review shows them (LATE_ACCEPTED). Rare, so small.
CREATE INDEX delivery_task_receipt_contradicted_idx ON delivery_task (id)
    WHERE receipt_at IS NOT NULL AND state IN ('FAILED', 'SUPPRESSED');

-- Matching a receipt by the provider's message id, when it does not carry our reference.
CREATE INDEX delivery_task_provider_msg_idx ON delivery_task (provider_msg_id) WHERE provider_msg_id IS NOT NULL;
CREATE INDEX delivery_attempt_provider_msg_idx ON delivery_attempt (provider_msg_id) WHERE provider_msg_id IS NOT NULL;

-- The settlement by receipt is an attempt of its own: action RECEIPT, outcome RECEIPT_ACCEPTED.
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_action_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_action_check
    CHECK (action IN ('SEND', 'QUERY', 'SKIP', 'MANUAL', 'TOPIC_RESEND', 'RECEIPT'));
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_outcome_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_outcome_check CHECK (outcome IN (
    'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
    'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
    'GATEWAY_ERROR',
    'REJECTED', 'LEASE_EXPIRED',
    'PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN',
    'MANUAL_SENT', 'MANUAL_FAILED',
    'RECEIPT_ACCEPTED'));

-- Guards UPDATE, DELETE and TRUNCATE of delivery_receipt: a receipt is kept as it came (R3's rule for
-- evidence); only retention deletes the receipts of a task in a final state, with the task.
CREATE FUNCTION delivery_receipt_append_only() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    task_state text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        SELECT t.state INTO task_state FROM public.delivery_task t WHERE t.id = OLD.task_id;
        IF task_state IN ('SENT', 'FAILED', 'SUPPRESSED') THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'delivery_receipt is append-only: % of receipt % (task %) refused',
            TG_OP, CASE WHEN TG_OP = 'TRUNCATE' THEN NULL ELSE OLD.id END,
            CASE WHEN TG_OP = 'TRUNCATE' THEN NULL ELSE OLD.task_id END
        USING ERRCODE = 'integrity_constraint_violation',
              TABLE = 'delivery_receipt',
              CONSTRAINT = 'delivery_receipt_append_only',
              HINT = 'a receipt is evidence, kept as it came; retention deletes those of a final task with it';
END
$$;

COMMENT ON FUNCTION delivery_receipt_append_only() IS
    'R3: receipts are kept as they came; deleted only as the finished history of a final task';

CREATE TRIGGER delivery_receipt_append_only_row
    BEFORE UPDATE OR DELETE ON delivery_receipt
    FOR EACH ROW
EXECUTE FUNCTION delivery_receipt_append_only();

CREATE TRIGGER delivery_receipt_append_only_truncate
    BEFORE TRUNCATE ON delivery_receipt
    FOR EACH STATEMENT
EXECUTE FUNCTION delivery_receipt_append_only();

-- A receipt's effect on its task, whole: notes the receipt on a task that is not final (receipt_at,
-- once), then settles it as SENT with its RECEIPT attempt when nobody holds it: waiting, parked, or
-- SENDING with an expired lease (then the lost holder's open attempt is closed LEASE_EXPIRED first, as
-- a takeover would). A task SENDING under a live lease is only noted: its holder finishes, and the
-- receivers' sweep (or the next claim) settles it. Returns the effect (SETTLED, NOTED, UNCHANGED for a
-- SENT task, CONTRADICTS for FAILED or SUPPRESSED, none when the task does not exist) and the task's
-- state after it. Idempotent: a second call on the same task changes nothing more. SECURITY DEFINER:
-- the receiver role writes tasks and attempts only through it, and the worker's claim calls it for a
-- noted task; search_path pinned, pg_temp last.
CREATE FUNCTION notifier_apply_receipt(task_id bigint, provider_msg_id text, note text)
    RETURNS TABLE (effect text, state text)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    t record;
BEGIN
    SELECT dt.state, dt.receipt_at, dt.attempt_token, dt.lease_until < now() AS expired INTO t
    FROM public.delivery_task dt WHERE dt.id = notifier_apply_receipt.task_id FOR UPDATE;
    IF t.state IS NULL THEN
        RETURN;
    END IF;
    IF t.state IN ('SENT', 'FAILED', 'SUPPRESSED') THEN
        RETURN QUERY SELECT CASE WHEN t.state = 'SENT' THEN 'UNCHANGED' ELSE 'CONTRADICTS' END, t.state;
        RETURN;
    END IF;
    IF t.receipt_at IS NULL THEN
        UPDATE public.delivery_task dt SET receipt_at = now() WHERE dt.id = notifier_apply_receipt.task_id;
    END IF;
    IF t.state = 'SENDING' AND NOT t.expired THEN
        RETURN QUERY SELECT 'NOTED'::text, t.state;
        RETURN;
    END IF;
    IF t.state = 'SENDING' THEN
        UPDATE public.delivery_attempt a
        SET outcome = 'LEASE_EXPIRED', finished_at = now(),
            error = 'lease expired before the holder recorded a result; a receipt settled the task'
        WHERE a.attempt_token = t.attempt_token AND a.outcome IS NULL;
    END IF;
    RETURN QUERY
    WITH settled AS (
        UPDATE public.delivery_task dt
        SET state             = 'SENT',
            needs_review      = false,
            outcome_uncertain = false,
            uncertain_since   = NULL,
            next_attempt_at   = NULL,
            lease_owner       = NULL,
            lease_until       = NULL,
            attempt_count     = dt.attempt_count + 1,
            provider_msg_id   = coalesce(dt.provider_msg_id, notifier_apply_receipt.provider_msg_id),
            last_error        = NULL,
            updated_at        = now()
        WHERE dt.id = notifier_apply_receipt.task_id
        RETURNING dt.id, dt.attempt_count
    ), recorded AS (
        INSERT INTO public.delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at,
                                             outcome, provider_msg_id, note)
        SELECT s.id, s.attempt_count, gen_random_uuid(), 'RECEIPT', 'receipt', now(), 'RECEIPT_ACCEPTED',
               notifier_apply_receipt.provider_msg_id, notifier_apply_receipt.note
        FROM settled s
        RETURNING attempt_no
    )
    SELECT 'SETTLED'::text, 'SENT'::text FROM recorded;
END
$$;

COMMENT ON FUNCTION notifier_apply_receipt(bigint, text, text) IS
    'A provider''s receipt settles its task as SENT with a RECEIPT attempt when nobody holds it; never moves a final state';

REVOKE EXECUTE ON FUNCTION notifier_apply_receipt(bigint, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION notifier_apply_receipt(bigint, text, text) TO notifier_worker;

-- The receiver role: notifier receipts. It reads what matching a receipt needs, records receipts,
-- writes tasks only through notifier_apply_receipt, and may switch a preference off after a hard
-- bounce (--disable-on-bounce). Created like 006's roles (cluster-wide, only when missing, never a
-- superuser or BYPASSRLS).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'notifier_receiver') THEN
        BEGIN
            CREATE ROLE notifier_receiver NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL; -- created meanwhile by the same migration in another database of this cluster
        END;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'notifier_receiver' AND (rolsuper OR rolbypassrls)) THEN
        RAISE EXCEPTION 'role notifier_receiver exists and is a superuser or has BYPASSRLS: its row-level security would be void'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'ALTER ROLE notifier_receiver NOSUPERUSER NOBYPASSRLS, then migrate again';
    END IF;
END
$$;
GRANT USAGE ON SCHEMA public TO notifier_receiver;
GRANT SELECT ON notification, channel_pref, delivery_task, delivery_attempt, delivery_receipt TO notifier_receiver;
GRANT INSERT (task_id, source, event_id, kind, hard_bounce, effect, provider_msg_id, occurred_at, detail)
    ON delivery_receipt TO notifier_receiver;
GRANT UPDATE (enabled, version, updated_at) ON channel_pref TO notifier_receiver;
GRANT EXECUTE ON FUNCTION notifier_apply_receipt(bigint, text, text) TO notifier_receiver;
-- Operators read receipts (review, status).
GRANT SELECT ON delivery_receipt TO notifier_operator;
-- Row-level security on tasks and attempts (006): the receiver reads every row, writes none directly.
CREATE POLICY delivery_task_receiver_select ON delivery_task FOR SELECT TO notifier_receiver USING (true);
CREATE POLICY delivery_attempt_receiver_select ON delivery_attempt FOR SELECT TO notifier_receiver USING (true);

-- migrate:down
DROP POLICY delivery_attempt_receiver_select ON delivery_attempt;
DROP POLICY delivery_task_receiver_select ON delivery_task;
REVOKE SELECT ON delivery_receipt FROM notifier_operator;
REVOKE ALL ON notification, channel_pref, delivery_task, delivery_attempt FROM notifier_receiver;
REVOKE USAGE ON SCHEMA public FROM notifier_receiver;
DROP FUNCTION notifier_apply_receipt(bigint, text, text);
DROP TRIGGER delivery_receipt_append_only_truncate ON delivery_receipt;
DROP TRIGGER delivery_receipt_append_only_row ON delivery_receipt;
DROP FUNCTION delivery_receipt_append_only();
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_outcome_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_outcome_check CHECK (outcome IN (
    'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
    'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
    'GATEWAY_ERROR',
    'REJECTED', 'LEASE_EXPIRED',
    'PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN',
    'MANUAL_SENT', 'MANUAL_FAILED'));
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_action_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_action_check
    CHECK (action IN ('SEND', 'QUERY', 'SKIP', 'MANUAL', 'TOPIC_RESEND'));
DROP INDEX delivery_attempt_provider_msg_idx;
DROP INDEX delivery_task_provider_msg_idx;
DROP INDEX delivery_task_receipt_contradicted_idx;
DROP INDEX delivery_task_receipt_unsettled_idx;
ALTER TABLE delivery_task DROP COLUMN receipt_at;
DROP TABLE delivery_receipt;
