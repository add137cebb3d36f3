-- migrate:up
-- Cancel (notifier cancel, notifier_cancel below): the submitter takes an event back. What the cancel
-- may do to each task of the notification depends on what the task may already have done:
--   * waiting (PENDING, or UNKNOWN not parked), due or not, and certain (no attempt may have been
--     accepted): SUPPRESSED at once, with a SKIP attempt CANCELLED. Final, never called.
--   * waiting with an uncertain history: parked for review at once, with a SKIP attempt
--     CANCELLED_UNCERTAIN. Never written off (R6), never called again; a human resolves it.
--   * SENDING: its call may be on the wire and cannot be recalled. The cancel is recorded on the
--     notification (cancelled_at), the holder's finish proceeds as usual, and a task it leaves waiting
--     (a certain refusal, an unknown outcome to retry) is settled by its next claim, as above, with 0
--     further calls (TaskClaim reads cancelled_at; delivery.Decide settles it).
--   * parked or final: unchanged.
-- The notification row stays: a later create of the same (user_id, event_key) answers created=false.

-- When the notification was cancelled, and the submitter's note. Written only by notifier_cancel (the
-- creator has no UPDATE on notification).
ALTER TABLE notification ADD COLUMN cancelled_at timestamptz;
ALTER TABLE notification ADD COLUMN cancel_note text;
ALTER TABLE notification ADD CONSTRAINT notification_cancel_note_check CHECK (length(cancel_note) <= 2000);
ALTER TABLE notification ADD CONSTRAINT notification_cancel_note_needs_cancel
    CHECK (cancel_note IS NULL OR cancelled_at IS NOT NULL);

-- A cancel's SKIP attempt: CANCELLED (the task is SUPPRESSED) or CANCELLED_UNCERTAIN (parked). Not late
-- observations: no channel reports them.
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_outcome_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_outcome_check CHECK (outcome IN (
    'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
    'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
    'GATEWAY_ERROR',
    'REJECTED', 'ACCOUNT_REFUSED', 'LEASE_EXPIRED',
    'PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN',
    'CANCELLED', 'CANCELLED_UNCERTAIN',
    'MANUAL_SENT', 'MANUAL_FAILED',
    'RECEIPT_ACCEPTED'));

-- Rewrites a function of the state machine from its own definition, each edit's text found exactly
-- once (a definition that no longer holds it stops the migration), so nothing else of it moves.
CREATE FUNCTION pg_temp.notifier_rewrite(fn regprocedure, edits text[]) RETURNS void
    LANGUAGE plpgsql
AS $$
DECLARE
    def text := pg_get_functiondef(fn);
BEGIN
    FOR i IN 1 .. array_length(edits, 1) BY 2 LOOP
        IF (length(def) - length(replace(def, edits[i], ''))) / length(edits[i]) <> 1 THEN
            RAISE EXCEPTION '027: % does not hold exactly once: %', fn, edits[i];
        END IF;
        def := replace(def, edits[i], edits[i + 1]);
    END LOOP;
    EXECUTE def;
END
$$;

-- The moves (schema/010's table gains two rows):
--   waiting (due or not)  SUPPRESSED      cancel, certain                 +1  SKIP CANCELLED
--   waiting (due or not)  UNKNOWN parked  cancel, uncertain history       +1  SKIP CANCELLED_UNCERTAIN
-- both only for a notification whose cancelled_at is set; the claim's settle of a cancelled task (due,
-- or held under an expired lease) is the settle of 010 with the same attempts. A task that is not due
-- yet is settled by nothing else.

-- The state machine: a settle needs a task its claim may take (due, or expired), or, for a waiting task
-- of a cancelled notification, nothing more: the cancel settles it before it is due. Read only on that
-- path (the settle of a task not due), never by a claim or a finish.
SELECT pg_temp.notifier_rewrite('delivery_task_state_machine()', ARRAY[
    $e$ELSIF move IN ('settle', 'park') AND NOT (due OR expired) THEN$e$,
    $e$ELSIF move IN ('settle', 'park') AND NOT (due OR expired
                OR (move = 'settle' AND waiting
                    AND EXISTS (SELECT FROM public.notification n
                                WHERE n.id = NEW.notification_id AND n.cancelled_at IS NOT NULL))) THEN$e$,
    $e$'settles or parks only a task its claim may take: due, or SENDING with an expired lease'$e$,
    $e$'settles or parks only a task its claim may take: due, or SENDING with an expired lease '
                   '(or, for a cancelled notification, settles any waiting task: schema/027)'$e$]);

-- The evidence: CANCELLED is a SUPPRESSED task's SKIP, CANCELLED_UNCERTAIN a parked one's; and a task
-- settled before it was due needs one of them (only a cancel may settle it then).
SELECT pg_temp.notifier_rewrite('delivery_task_evidence()', ARRAY[
    $e$WHEN 'SUPPRESSED' THEN 'a SKIP attempt PREF_DISABLED'$e$,
    $e$WHEN 'SUPPRESSED' THEN 'a SKIP attempt PREF_DISABLED or CANCELLED'$e$,
    $e$WHEN 'UNKNOWN' THEN 'a SKIP attempt PREF_DISABLED_UNCERTAIN or TTL_EXPIRED_UNCERTAIN'$e$,
    $e$WHEN 'UNKNOWN' THEN 'a SKIP attempt PREF_DISABLED_UNCERTAIN, TTL_EXPIRED_UNCERTAIN or CANCELLED_UNCERTAIN'$e$,
    $e$WHEN 'SUPPRESSED' THEN a.action = 'SKIP' AND a.outcome = 'PREF_DISABLED'$e$,
    $e$WHEN 'SUPPRESSED' THEN a.action = 'SKIP' AND a.outcome IN ('PREF_DISABLED', 'CANCELLED')$e$,
    $e$WHEN 'UNKNOWN' THEN a.action = 'SKIP' AND a.outcome IN ('PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN')$e$,
    $e$WHEN 'UNKNOWN' THEN a.action = 'SKIP' AND a.outcome IN ('PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN', 'CANCELLED_UNCERTAIN')$e$,
    $e$            ELSE false
        END;
    ELSIF OLD.state = 'SENDING'$e$,
    $e$            ELSE false
        END;
        -- Before it is due, a waiting task is settled without a call only by a cancel (schema/027); a
        -- receipt's SENT is evidence of its own.
        IF ok AND OLD.state IN ('PENDING', 'UNKNOWN') AND NOT OLD.needs_review AND OLD.next_attempt_at > now()
           AND NEW.state IN ('SUPPRESSED', 'FAILED', 'UNKNOWN') AND a.outcome NOT IN ('CANCELLED', 'CANCELLED_UNCERTAIN') THEN
            want := 'a SKIP attempt CANCELLED or CANCELLED_UNCERTAIN (the task was not due: only a cancel settles it)';
            ok := false;
        END IF;
    ELSIF OLD.state = 'SENDING'$e$]);

-- The attempt: CANCELLED and CANCELLED_UNCERTAIN are SKIP outcomes, each recording its settlement, and
-- only for a notification that was cancelled (looked up only for such an attempt).
SELECT pg_temp.notifier_rewrite('delivery_attempt_fits()', ARRAY[
    $e$WHEN 'SKIP' THEN ARRAY['PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN']$e$,
    $e$WHEN 'SKIP' THEN ARRAY['PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN',
                               'CANCELLED', 'CANCELLED_UNCERTAIN']$e$,
    $e$OR (NEW.outcome IN ('PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN') AND t.state = 'UNKNOWN' AND t.needs_review)) THEN$e$,
    $e$OR (NEW.outcome IN ('PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN', 'CANCELLED_UNCERTAIN')
                AND t.state = 'UNKNOWN' AND t.needs_review)
            OR (NEW.outcome = 'CANCELLED' AND t.state = 'SUPPRESSED')) THEN$e$,
    $e$    ELSIF NEW.action = 'SKIP' AND NOT ($e$,
    $e$    ELSIF NEW.action = 'SKIP' AND NEW.outcome IN ('CANCELLED', 'CANCELLED_UNCERTAIN')
          AND NOT EXISTS (SELECT FROM public.delivery_task dt JOIN public.notification n ON n.id = dt.notification_id
                          WHERE dt.id = NEW.task_id AND n.cancelled_at IS NOT NULL) THEN
        col := 'outcome';
        why := format('a SKIP %s for a notification that was not cancelled', NEW.outcome);
    ELSIF NEW.action = 'SKIP' AND NOT ($e$]);

DROP FUNCTION pg_temp.notifier_rewrite(regprocedure, text[]);

-- The cancel, whole, in one call: records the cancel on the notification (once: a second cancel keeps
-- the first time and note) and settles each task it may settle now, as the owner, so that the state
-- machine's triggers check every move as they check a worker's. One row per task, in task order:
--   effect CANCELLED       it was waiting and certain: now SUPPRESSED (SKIP CANCELLED)
--          PARKED          it was waiting with an uncertain history: now parked (SKIP CANCELLED_UNCERTAIN)
--          AT_NEXT_CLAIM   SENDING: its holder's finish proceeds; a task it leaves waiting is settled by
--                          its next claim. changed is true when this call recorded the cancel.
--          ALREADY_PARKED  parked before: a human resolves it; unchanged
--          FINAL           SENT, FAILED or SUPPRESSED before; unchanged
-- No row: no such notification, or one without tasks (no channel was enabled). The tasks are locked
-- (FOR UPDATE, in id order, after the notification row): a claim in progress commits first, and the
-- cancel then sees its task SENDING; a claim that comes later skips the locked rows, then reads
-- cancelled_at. SECURITY DEFINER: the creator role writes notification, delivery_task and
-- delivery_attempt only through it. search_path pinned, pg_temp last.
CREATE FUNCTION notifier_cancel(user_id text, event_key text, note text DEFAULT NULL)
    RETURNS TABLE (notification_id bigint, task_id bigint, channel text, state_before text, state_after text,
                   effect text, changed boolean)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    nid    bigint;
    newly  boolean;
    t      record;
    attempt integer;
    reason constant text := 'notification cancelled before the call';
BEGIN
    IF length(notifier_cancel.note) > 2000 THEN
        RAISE EXCEPTION 'notifier_cancel: note of % characters: at most 2000', length(notifier_cancel.note)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT nt.id, nt.cancelled_at IS NULL INTO nid, newly
    FROM notification nt
    WHERE nt.user_id = notifier_cancel.user_id AND nt.event_key = notifier_cancel.event_key
    FOR NO KEY UPDATE;
    IF nid IS NULL THEN
        RETURN;
    END IF;
    IF newly THEN
        UPDATE notification nt SET cancelled_at = now(), cancel_note = notifier_cancel.note WHERE nt.id = nid;
    END IF;
    FOR t IN
        SELECT dt.id, dt.channel::text AS channel, dt.state, dt.needs_review, dt.outcome_uncertain
        FROM delivery_task dt
        WHERE dt.notification_id = nid
        ORDER BY dt.id
        FOR UPDATE
    LOOP
        notification_id := nid;
        task_id := t.id;
        channel := t.channel;
        state_before := t.state;
        state_after := t.state;
        changed := false;
        IF t.state IN ('PENDING', 'UNKNOWN') AND NOT t.needs_review THEN
            UPDATE delivery_task dt
            SET state           = CASE WHEN t.outcome_uncertain THEN 'UNKNOWN' ELSE 'SUPPRESSED' END,
                needs_review    = t.outcome_uncertain,
                next_attempt_at = NULL,
                attempt_count   = dt.attempt_count + 1,
                last_error      = CASE WHEN t.outcome_uncertain THEN reason || '; an earlier attempt may have been accepted'
                                       ELSE reason END,
                updated_at      = now()
            WHERE dt.id = t.id
            RETURNING dt.attempt_count, dt.state INTO attempt, state_after;
            INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome, error, note)
            VALUES (t.id, attempt, gen_random_uuid(), 'SKIP', session_user, now(),
                    CASE WHEN t.outcome_uncertain THEN 'CANCELLED_UNCERTAIN' ELSE 'CANCELLED' END,
                    reason, notifier_cancel.note);
            effect := CASE WHEN t.outcome_uncertain THEN 'PARKED' ELSE 'CANCELLED' END;
            changed := true;
        ELSIF t.state = 'SENDING' THEN
            effect := 'AT_NEXT_CLAIM';
            changed := newly;
        ELSIF t.needs_review THEN
            effect := 'ALREADY_PARKED';
        ELSE
            effect := 'FINAL';
        END IF;
        RETURN NEXT;
    END LOOP;
    -- The evidence of each move (delivery_task_evidence, a constraint trigger deferred to the commit)
    -- is checked here, as the owner: at the caller's commit it would run as the caller, and the creator
    -- may not read delivery_attempt. Deferred again afterwards, for what the caller's transaction does
    -- next.
    SET CONSTRAINTS delivery_task_evidence IMMEDIATE;
    SET CONSTRAINTS delivery_task_evidence DEFERRED;
END
$$;

COMMENT ON FUNCTION notifier_cancel(text, text, text) IS
    'The submitter takes an event back: waiting tasks end now (SUPPRESSED, or parked when uncertain), held ones at their next claim (schema/027)';

REVOKE EXECUTE ON FUNCTION notifier_cancel(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION notifier_cancel(text, text, text) TO notifier_creator;

-- migrate:down
DO $$
BEGIN
    IF EXISTS (SELECT FROM delivery_attempt WHERE outcome IN ('CANCELLED', 'CANCELLED_UNCERTAIN')) THEN
        RAISE EXCEPTION 'cannot roll back 027_cancel: delivery_attempt holds CANCELLED or CANCELLED_UNCERTAIN attempts, which the earlier schema does not allow'
            USING ERRCODE = 'check_violation';
    END IF;
END
$$;
DROP FUNCTION notifier_cancel(text, text, text);
CREATE FUNCTION pg_temp.notifier_rewrite(fn regprocedure, edits text[]) RETURNS void
    LANGUAGE plpgsql
AS $$
DECLARE
    def text := pg_get_functiondef(fn);
BEGIN
    FOR i IN 1 .. array_length(edits, 1) BY 2 LOOP
        IF (length(def) - length(replace(def, edits[i], ''))) / length(edits[i]) <> 1 THEN
            RAISE EXCEPTION '027 down: % does not hold exactly once: %', fn, edits[i];
        END IF;
        def := replace(def, edits[i], edits[i + 1]);
    END LOOP;
    EXECUTE def;
END
$$;
SELECT pg_temp.notifier_rewrite('delivery_attempt_fits()', ARRAY[
    $e$    ELSIF NEW.action = 'SKIP' AND NEW.outcome IN ('CANCELLED', 'CANCELLED_UNCERTAIN')
          AND NOT EXISTS (SELECT FROM public.delivery_task dt JOIN public.notification n ON n.id = dt.notification_id
                          WHERE dt.id = NEW.task_id AND n.cancelled_at IS NOT NULL) THEN
        col := 'outcome';
        why := format('a SKIP %s for a notification that was not cancelled', NEW.outcome);
    ELSIF NEW.action = 'SKIP' AND NOT ($e$,
    $e$    ELSIF NEW.action = 'SKIP' AND NOT ($e$,
    $e$OR (NEW.outcome IN ('PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN', 'CANCELLED_UNCERTAIN')
                AND t.state = 'UNKNOWN' AND t.needs_review)
            OR (NEW.outcome = 'CANCELLED' AND t.state = 'SUPPRESSED')) THEN$e$,
    $e$OR (NEW.outcome IN ('PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN') AND t.state = 'UNKNOWN' AND t.needs_review)) THEN$e$,
    $e$WHEN 'SKIP' THEN ARRAY['PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN',
                               'CANCELLED', 'CANCELLED_UNCERTAIN']$e$,
    $e$WHEN 'SKIP' THEN ARRAY['PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN']$e$]);
SELECT pg_temp.notifier_rewrite('delivery_task_evidence()', ARRAY[
    $e$            ELSE false
        END;
        -- Before it is due, a waiting task is settled without a call only by a cancel (schema/027); a
        -- receipt's SENT is evidence of its own.
        IF ok AND OLD.state IN ('PENDING', 'UNKNOWN') AND NOT OLD.needs_review AND OLD.next_attempt_at > now()
           AND NEW.state IN ('SUPPRESSED', 'FAILED', 'UNKNOWN') AND a.outcome NOT IN ('CANCELLED', 'CANCELLED_UNCERTAIN') THEN
            want := 'a SKIP attempt CANCELLED or CANCELLED_UNCERTAIN (the task was not due: only a cancel settles it)';
            ok := false;
        END IF;
    ELSIF OLD.state = 'SENDING'$e$,
    $e$            ELSE false
        END;
    ELSIF OLD.state = 'SENDING'$e$,
    $e$WHEN 'UNKNOWN' THEN a.action = 'SKIP' AND a.outcome IN ('PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN', 'CANCELLED_UNCERTAIN')$e$,
    $e$WHEN 'UNKNOWN' THEN a.action = 'SKIP' AND a.outcome IN ('PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN')$e$,
    $e$WHEN 'SUPPRESSED' THEN a.action = 'SKIP' AND a.outcome IN ('PREF_DISABLED', 'CANCELLED')$e$,
    $e$WHEN 'SUPPRESSED' THEN a.action = 'SKIP' AND a.outcome = 'PREF_DISABLED'$e$,
    $e$WHEN 'UNKNOWN' THEN 'a SKIP attempt PREF_DISABLED_UNCERTAIN, TTL_EXPIRED_UNCERTAIN or CANCELLED_UNCERTAIN'$e$,
    $e$WHEN 'UNKNOWN' THEN 'a SKIP attempt PREF_DISABLED_UNCERTAIN or TTL_EXPIRED_UNCERTAIN'$e$,
    $e$WHEN 'SUPPRESSED' THEN 'a SKIP attempt PREF_DISABLED or CANCELLED'$e$,
    $e$WHEN 'SUPPRESSED' THEN 'a SKIP attempt PREF_DISABLED'$e$]);
SELECT pg_temp.notifier_rewrite('delivery_task_state_machine()', ARRAY[
    $e$'settles or parks only a task its claim may take: due, or SENDING with an expired lease '
                   '(or, for a cancelled notification, settles any waiting task: schema/027)'$e$,
    $e$'settles or parks only a task its claim may take: due, or SENDING with an expired lease'$e$,
    $e$ELSIF move IN ('settle', 'park') AND NOT (due OR expired
                OR (move = 'settle' AND waiting
                    AND EXISTS (SELECT FROM public.notification n
                                WHERE n.id = NEW.notification_id AND n.cancelled_at IS NOT NULL))) THEN$e$,
    $e$ELSIF move IN ('settle', 'park') AND NOT (due OR expired) THEN$e$]);
DROP FUNCTION pg_temp.notifier_rewrite(regprocedure, text[]);
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_outcome_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_outcome_check CHECK (outcome IN (
    'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
    'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
    'GATEWAY_ERROR',
    'REJECTED', 'ACCOUNT_REFUSED', 'LEASE_EXPIRED',
    'PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN',
    'MANUAL_SENT', 'MANUAL_FAILED',
    'RECEIPT_ACCEPTED'));
ALTER TABLE notification DROP COLUMN cancel_note;
ALTER TABLE notification DROP COLUMN cancelled_at;
