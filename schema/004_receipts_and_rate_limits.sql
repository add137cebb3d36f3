-- migrate:up
-- Receipts and rate limits: the functions beside the tables of 001 (delivery_receipt,
-- channel_rate_limit) that enforce their rules.

-- Receipts: what a provider says about a message after it accepted it (accepted, delivered, bounced,
-- complained, undelivered), through a signed callback (notifier receipts). Any receipt is evidence that
-- the provider had the message, so it can end an uncertainty honestly: an UNKNOWN task (parked or
-- not), or one waiting for a retry, becomes SENT with the receipt as its evidence (a RECEIPT attempt).
-- A receipt never moves a final state (SENT, FAILED, SUPPRESSED: 003); on FAILED or SUPPRESSED it is
-- kept and shown (notifier review: LATE_ACCEPTED). Receipts are append-only, deduplicated by the
-- provider's event id (delivery_receipt_event_key).

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

-- Guards UPDATE and DELETE of delivery_receipt, row by row, with delivery_receipt_append_only().
CREATE TRIGGER delivery_receipt_append_only_row
    BEFORE UPDATE OR DELETE ON delivery_receipt
    FOR EACH ROW
EXECUTE FUNCTION delivery_receipt_append_only();

-- Guards TRUNCATE of delivery_receipt, which fires no row trigger, with delivery_receipt_append_only().
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
-- noted task; search_path pinned, pg_temp last. The state machine (003) checks its moves as any other.
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
GRANT EXECUTE ON FUNCTION notifier_apply_receipt(bigint, text, text) TO notifier_receiver;

-- How many final "not sent" tasks (FAILED, SUPPRESSED) later evidence says were accepted after all: a
-- superseded holder's late_outcome ACCEPTED, ACCEPTED_REPLAY or QUERY_FOUND, a provider's receipt that
-- contradicts the write-off, or a receipt noted while the task was held and then written off (the tasks
-- TaskListLateAccepted lists). notifier status shows it, and `notifier work --metrics-addr` exports it
-- for the alert rules (TaskAlertGauges). A function so that the worker role learns this one number and
-- nothing of delivery_receipt: a grant on the table would also let it run `notifier review`, which is
-- the operator's. SECURITY DEFINER, search_path pinned, pg_temp last; STABLE, it writes nothing.
--
-- Found from the evidence, each part by its partial index (delivery_attempt_late_accepted_idx,
-- delivery_receipt_contradicts_idx, delivery_task_receipt_contradicted_idx), then the tasks by id: a
-- cost that grows with the late acceptances, not with the FAILED and SUPPRESSED tasks kept (the OR of
-- the three tests over the tasks read all of those: 110 ms for 200,000 of them; this, 0.6 ms).
CREATE FUNCTION notifier_late_accepted_count()
    RETURNS bigint
    LANGUAGE sql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, public, pg_temp
AS $$
    SELECT count(*)
    FROM public.delivery_task t
    WHERE t.id IN (SELECT a.task_id FROM public.delivery_attempt a
                   WHERE a.late_outcome IN ('ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND')
                   UNION
                   SELECT r.task_id FROM public.delivery_receipt r WHERE r.effect = 'CONTRADICTS'
                   UNION
                   SELECT c.id FROM public.delivery_task c
                   WHERE c.receipt_at IS NOT NULL AND c.state IN ('FAILED', 'SUPPRESSED'))
      AND t.state IN ('FAILED', 'SUPPRESSED')
$$;

COMMENT ON FUNCTION notifier_late_accepted_count() IS
    'How many FAILED or SUPPRESSED tasks a late answer or a receipt says were accepted (status, the alert gauges)';

REVOKE EXECUTE ON FUNCTION notifier_late_accepted_count() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION notifier_late_accepted_count() TO notifier_worker, notifier_operator;

-- A channel's token bucket (channel_rate_limit, 001): the whole tokens a bucket could grant now are
-- floor() of this: what it held at refilled_at plus what it gained since (never from before a pause's
-- end), at most burst; nothing while paused. now() is the transaction's clock, as for every lease; a
-- statement that moves refilled_at takes greatest() of the two, so a claim whose transaction began
-- before another's take never counts that interval twice.
CREATE FUNCTION rate_limit_tokens(tokens float8, rate float8, burst float8, refilled_at timestamptz,
                                  paused_until timestamptz) RETURNS float8
    LANGUAGE sql STABLE -- no SET clause, not STRICT: inlined into the statements that call it
AS $$
    SELECT CASE WHEN paused_until > now() THEN 0::float8
                ELSE least(burst, tokens + rate * greatest(0::float8,
                         extract(epoch FROM now() - greatest(refilled_at, paused_until))::float8))
           END
$$;

-- migrate:down
DROP FUNCTION rate_limit_tokens(float8, float8, float8, timestamptz, timestamptz);
DROP FUNCTION notifier_late_accepted_count();
DROP FUNCTION notifier_apply_receipt(bigint, text, text);
DROP TRIGGER delivery_receipt_append_only_truncate ON delivery_receipt;
DROP TRIGGER delivery_receipt_append_only_row ON delivery_receipt;
DROP FUNCTION delivery_receipt_append_only();
