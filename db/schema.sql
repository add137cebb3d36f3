-- The current schema of notifier, as the migrations of schema/ leave it: read each table here, change
-- it there. Written by `sh internal/tools/just schema-dump` (dbmate dump, without privileges: the
-- grants are in schema/002_roles_and_row_security.sql); CI checks it (`just schema-check`).
\restrict dbmate


SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: notifier_channel; Type: DOMAIN; Schema: public; Owner: -
--

CREATE DOMAIN public.notifier_channel AS text
	CONSTRAINT notifier_channel_check CHECK ((VALUE ~ '^[a-z][a-z0-9_-]{0,31}$'::text));


--
-- Name: DOMAIN notifier_channel; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON DOMAIN public.notifier_channel IS 'A channel''s name: lowercase, from a letter, at most 32 characters (schema/001)';


--
-- Name: notifier_task_ref; Type: DOMAIN; Schema: public; Owner: -
--

CREATE DOMAIN public.notifier_task_ref AS text
	CONSTRAINT notifier_task_ref_check CHECK (((VALUE ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'::text) OR (VALUE ~ '^task-[1-9][0-9]{0,18}$'::text)));


--
-- Name: DOMAIN notifier_task_ref; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON DOMAIN public.notifier_task_ref IS 'What the service sends a channel to name a task: a random lowercase UUID, or task-<id> for tasks created before refs were random';


--
-- Name: delivery_attempt_append_only(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_attempt_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    col text;
    why text;
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id THEN
        col := 'id';
    ELSIF NEW.task_id IS DISTINCT FROM OLD.task_id THEN
        col := 'task_id';
    ELSIF NEW.attempt_no IS DISTINCT FROM OLD.attempt_no THEN
        col := 'attempt_no';
    ELSIF NEW.attempt_token IS DISTINCT FROM OLD.attempt_token THEN
        col := 'attempt_token';
    ELSIF NEW.action IS DISTINCT FROM OLD.action THEN
        col := 'action';
    ELSIF NEW.worker IS DISTINCT FROM OLD.worker THEN
        col := 'worker';
    ELSIF NEW.started_at IS DISTINCT FROM OLD.started_at THEN
        col := 'started_at';
    END IF;
    IF col IS NOT NULL THEN
        why := 'is fixed when the attempt is opened';
    ELSIF (OLD.outcome IS NOT NULL OR OLD.finished_at IS NOT NULL)
        AND (NEW.outcome IS DISTINCT FROM OLD.outcome OR NEW.finished_at IS DISTINCT FROM OLD.finished_at) THEN
        col := CASE WHEN NEW.outcome IS DISTINCT FROM OLD.outcome THEN 'outcome' ELSE 'finished_at' END;
        why := 'is written once; a later observation goes to late_outcome';
    ELSIF (OLD.late_outcome IS NOT NULL OR OLD.late_at IS NOT NULL)
        AND (NEW.late_outcome IS DISTINCT FROM OLD.late_outcome OR NEW.late_at IS DISTINCT FROM OLD.late_at) THEN
        col := CASE WHEN NEW.late_outcome IS DISTINCT FROM OLD.late_outcome THEN 'late_outcome' ELSE 'late_at' END;
        why := 'is written once';
    ELSIF OLD.note IS NOT NULL AND NEW.note IS DISTINCT FROM OLD.note THEN
        col := 'note';
        why := 'is written once';
    ELSIF (NEW.provider_msg_id IS DISTINCT FROM OLD.provider_msg_id OR NEW.error IS DISTINCT FROM OLD.error)
        AND NOT (
            -- only from NULL ...
            (OLD.provider_msg_id IS NULL OR NEW.provider_msg_id IS NOT DISTINCT FROM OLD.provider_msg_id)
            AND (OLD.error IS NULL OR NEW.error IS NOT DISTINCT FROM OLD.error)
            -- ... and only by the update that records the outcome or the late outcome
            AND ((OLD.outcome IS NULL AND NEW.outcome IS NOT NULL)
                 OR (OLD.late_outcome IS NULL AND NEW.late_outcome IS NOT NULL))) THEN
        col := CASE WHEN NEW.provider_msg_id IS DISTINCT FROM OLD.provider_msg_id THEN 'provider_msg_id' ELSE 'error' END;
        why := 'is written once, with the outcome or late_outcome it explains';
    END IF;
    IF col IS NOT NULL THEN
        RAISE EXCEPTION 'delivery_attempt is append-only: % of attempt % (task %, attempt %) %',
                col, OLD.id, OLD.task_id, OLD.attempt_no, why
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  COLUMN = col,
                  CONSTRAINT = 'delivery_attempt_append_only',
                  HINT = 'an attempt keeps what it observed verbatim (R3); record a new attempt instead';
    END IF;
    RETURN NULL; -- AFTER trigger: the return value is ignored
END
$$;


--
-- Name: FUNCTION delivery_attempt_append_only(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_attempt_append_only() IS 'R3: delivery_attempt is append-only; only the protocol''s own write-once updates pass';


--
-- Name: delivery_attempt_call_misfit(text, integer, boolean, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_attempt_call_misfit(task_state text, task_count integer, task_token_held boolean, attempt_no integer) RETURNS text[]
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE
        WHEN task_state IS NULL THEN ARRAY['task_id', 'its task is not visible']
        WHEN attempt_no <> task_count THEN ARRAY['attempt_no',
            format('the task has counted %s attempts; a new attempt is the one its move just counted', task_count)]
        WHEN NOT coalesce(task_state = 'SENDING' AND task_token_held, false) THEN ARRAY['attempt_token',
            format('a call is opened only by the task''s holder, with its token (the task is %s)', task_state)]
    END
$$;


--
-- Name: delivery_attempt_calls_follow_tasks(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_attempt_calls_follow_tasks() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    a      record;
    misfit text[];
BEGIN
    SELECT n.id, n.task_id, n.attempt_no, t.state, t.attempt_count, t.attempt_token = n.attempt_token AS held INTO a
    FROM inserted_attempts n
    LEFT JOIN public.delivery_task t ON t.id = n.task_id
    WHERE n.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND n.outcome IS NULL AND n.late_outcome IS NULL
      AND NOT coalesce(t.state = 'SENDING' AND t.attempt_token = n.attempt_token AND t.attempt_count = n.attempt_no, false)
    ORDER BY n.id
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    misfit := delivery_attempt_call_misfit(a.state, a.attempt_count, a.held, a.attempt_no);
    RAISE EXCEPTION 'delivery_attempt % (task %, attempt %): %', a.id, a.task_id, a.attempt_no, misfit[2]
        USING ERRCODE = 'integrity_constraint_violation',
              TABLE = 'delivery_attempt',
              COLUMN = misfit[1],
              CONSTRAINT = 'delivery_attempt_follows_task',
              HINT = 'attempts are opened by the move that counts them (schema/003_state_machine.sql)';
END
$$;


--
-- Name: FUNCTION delivery_attempt_calls_follow_tasks(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_attempt_calls_follow_tasks() IS 'R3: an open call attempt a statement inserts is the one its task''s claim counted, under the task''s token (schema/003)';


--
-- Name: delivery_attempt_fits(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_attempt_fits() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    -- the outcomes of a call, by action
    call_outcomes constant text[] := CASE NEW.action
        WHEN 'SEND' THEN ARRAY['ACCEPTED', 'ACCEPTED_REPLAY', 'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE',
                               'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED', 'REJECTED', 'GATEWAY_ERROR', 'ACCOUNT_REFUSED']
        WHEN 'TOPIC_RESEND' THEN ARRAY['ACCEPTED', 'ACCEPTED_REPLAY', 'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE',
                               'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED', 'REJECTED', 'GATEWAY_ERROR', 'ACCOUNT_REFUSED']
        WHEN 'QUERY' THEN ARRAY['QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED']
        ELSE ARRAY[]::text[]
    END;
    outcomes constant text[] := CASE NEW.action
        WHEN 'SKIP' THEN ARRAY['PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN',
                               'CANCELLED', 'CANCELLED_UNCERTAIN', 'FALLBACK_NOT_NEEDED']
        WHEN 'MANUAL' THEN ARRAY['MANUAL_SENT', 'MANUAL_FAILED']
        WHEN 'RECEIPT' THEN ARRAY['RECEIPT_ACCEPTED']
        ELSE call_outcomes || 'LEASE_EXPIRED'::text
    END;
    t   record;
    col text;
    why text;
BEGIN
    -- What every finish writes, a call's outcome or late observation that fits it, passes at once.
    IF TG_OP = 'UPDATE' AND coalesce(
           (NEW.outcome IS NOT DISTINCT FROM OLD.outcome
            OR NEW.outcome = ANY (call_outcomes))
           AND (NEW.late_outcome IS NOT DISTINCT FROM OLD.late_outcome OR NEW.late_outcome = ANY (call_outcomes)),
           false) THEN
        RETURN NULL;
    END IF;
    IF NEW.outcome IS NOT NULL AND (TG_OP = 'INSERT' OR NEW.outcome IS DISTINCT FROM OLD.outcome)
       AND NOT NEW.outcome = ANY (outcomes) THEN
        col := 'outcome';
        why := format('%s is not an outcome of a %s attempt', NEW.outcome, NEW.action);
    ELSIF NEW.late_outcome IS NOT NULL AND (TG_OP = 'INSERT' OR NEW.late_outcome IS DISTINCT FROM OLD.late_outcome)
       AND NOT NEW.late_outcome = ANY (call_outcomes) THEN
        col := 'late_outcome';
        why := format('%s is not a late observation of a %s attempt', NEW.late_outcome, NEW.action);
    END IF;
    IF col IS NOT NULL THEN
        RAISE EXCEPTION 'delivery_attempt % (task %, attempt %): %', NEW.id, NEW.task_id, NEW.attempt_no, why
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  COLUMN = col,
                  CONSTRAINT = 'delivery_attempt_outcome_fits_action',
                  HINT = 'see the outcomes by action in schema/003_state_machine.sql';
    END IF;
    IF TG_OP <> 'INSERT' AND NOT (NEW.outcome = 'LEASE_EXPIRED' AND OLD.outcome IS NULL) THEN
        RETURN NULL;
    END IF;

    SELECT dt.state, dt.needs_review, dt.attempt_count, dt.attempt_token, dt.lease_until < now() AS expired INTO t
    FROM public.delivery_task dt WHERE dt.id = NEW.task_id;
    IF TG_OP <> 'INSERT' THEN
        -- LEASE_EXPIRED closes the attempt of a holder that is gone: superseded, or its lease ran out.
        IF t.state = 'SENDING' AND t.attempt_token = NEW.attempt_token AND NOT t.expired THEN
            RAISE EXCEPTION 'delivery_attempt % (task %, attempt %): LEASE_EXPIRED, but its holder''s lease has not expired',
                    NEW.id, NEW.task_id, NEW.attempt_no
                USING ERRCODE = 'integrity_constraint_violation',
                      TABLE = 'delivery_attempt',
                      COLUMN = 'outcome',
                      CONSTRAINT = 'delivery_attempt_follows_task',
                      HINT = 'a live holder records its own outcome when its call ends';
        END IF;
        RETURN NULL;
    END IF;
    IF t.state IS NULL THEN
        col := 'task_id';
        why := 'its task is not visible';
    ELSIF NEW.attempt_no <> t.attempt_count THEN
        col := 'attempt_no';
        why := format('the task has counted %s attempts; a new attempt is the one its move just counted', t.attempt_count);
    ELSIF NEW.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND NOT (t.state = 'SENDING' AND t.attempt_token = NEW.attempt_token) THEN
        col := 'attempt_token';
        why := format('a call is opened only by the task''s holder, with its token (the task is %s)', t.state);
    ELSIF NEW.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND (NEW.outcome IS NOT NULL OR NEW.late_outcome IS NOT NULL) THEN
        col := 'outcome';
        why := 'a call is opened before it is made; its outcome is recorded when it ends';
    ELSIF NEW.action = 'SKIP' AND NEW.outcome = 'FALLBACK_NOT_NEEDED'
          AND NOT EXISTS (SELECT FROM public.delivery_task dt
                          WHERE dt.id = NEW.task_id AND dt.fallback_position IS NOT NULL
                            AND public.delivery_task_fallback_turn(dt.notification_id, dt.fallback_position) = 'NOT_NEEDED') THEN
        col := 'outcome';
        why := 'a SKIP FALLBACK_NOT_NEEDED for a task whose fallback chain has no earlier task SENT';
    ELSIF NEW.action = 'SKIP' AND NEW.outcome IN ('CANCELLED', 'CANCELLED_UNCERTAIN')
          AND NOT EXISTS (SELECT FROM public.delivery_task dt JOIN public.notification n ON n.id = dt.notification_id
                          WHERE dt.id = NEW.task_id AND n.cancelled_at IS NOT NULL) THEN
        col := 'outcome';
        why := format('a SKIP %s for a notification that was not cancelled', NEW.outcome);
    ELSIF NEW.action = 'SKIP' AND NOT (
            (NEW.outcome = 'PREF_DISABLED' AND t.state = 'SUPPRESSED')
            OR (NEW.outcome = 'TTL_EXPIRED' AND t.state = 'FAILED')
            OR (NEW.outcome IN ('PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN', 'CANCELLED_UNCERTAIN')
                AND t.state = 'UNKNOWN' AND t.needs_review)
            OR (NEW.outcome IN ('CANCELLED', 'FALLBACK_NOT_NEEDED') AND t.state = 'SUPPRESSED')) THEN
        col := 'outcome';
        why := format('a SKIP %s does not record the task''s settlement (the task is %s)', coalesce(NEW.outcome, 'without outcome'), t.state);
    ELSIF NEW.action = 'MANUAL' AND NOT (
            (NEW.outcome = 'MANUAL_SENT' AND t.state = 'SENT') OR (NEW.outcome = 'MANUAL_FAILED' AND t.state = 'FAILED')) THEN
        col := 'outcome';
        why := format('a MANUAL %s does not record the task''s resolution (the task is %s)', coalesce(NEW.outcome, 'without outcome'), t.state);
    ELSIF NEW.action = 'RECEIPT' AND NOT (NEW.outcome = 'RECEIPT_ACCEPTED' AND t.state = 'SENT') THEN
        col := 'outcome';
        why := format('a RECEIPT %s does not record the task''s settlement by receipt (the task is %s)', coalesce(NEW.outcome, 'without outcome'), t.state);
    END IF;
    IF col IS NOT NULL THEN
        RAISE EXCEPTION 'delivery_attempt % (task %, attempt %): %', NEW.id, NEW.task_id, NEW.attempt_no, why
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  COLUMN = col,
                  CONSTRAINT = 'delivery_attempt_follows_task',
                  HINT = 'attempts are opened by the move that counts them (schema/003_state_machine.sql)';
    END IF;
    RETURN NULL;
END
$$;


--
-- Name: FUNCTION delivery_attempt_fits(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_attempt_fits() IS 'R3: an attempt''s outcome fits its action, and a new attempt is the one its task''s move just counted';


--
-- Name: delivery_attempt_no_truncate(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_attempt_no_truncate() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'delivery_attempt is append-only and cannot be truncated'
        USING ERRCODE = 'integrity_constraint_violation',
              TABLE = 'delivery_attempt',
              CONSTRAINT = 'delivery_attempt_retention_only',
              HINT = 'prune finished history with DELETE; the rows of open, uncertain and parked tasks stay';
END
$$;


--
-- Name: FUNCTION delivery_attempt_no_truncate(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_attempt_no_truncate() IS 'R3: TRUNCATE would bypass the row-level DELETE rule of delivery_attempt';


--
-- Name: delivery_attempt_provider_msg_record(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_attempt_provider_msg_record() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
BEGIN
    IF TG_LEVEL = 'ROW' THEN
        INSERT INTO public.delivery_task_provider_msg (provider_msg_id, task_id)
        SELECT NEW.provider_msg_id, NEW.task_id
        WHERE NOT EXISTS (SELECT FROM public.delivery_task t
                          WHERE t.id = NEW.task_id AND t.provider_msg_id = NEW.provider_msg_id)
        ON CONFLICT DO NOTHING;
        RETURN NULL;
    END IF;
    INSERT INTO public.delivery_task_provider_msg (provider_msg_id, task_id)
    SELECT DISTINCT a.provider_msg_id, a.task_id
    FROM new_attempts a
    WHERE a.provider_msg_id IS NOT NULL
      AND NOT EXISTS (SELECT FROM public.delivery_task t
                      WHERE t.id = a.task_id AND t.provider_msg_id = a.provider_msg_id)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;


--
-- Name: FUNCTION delivery_attempt_provider_msg_record(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_attempt_provider_msg_record() IS 'Receipts match by provider id: an attempt''s id its task does not carry is recorded (schema/003)';


--
-- Name: delivery_attempt_retention_only(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_attempt_retention_only() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO '$user', 'public'
    AS $$
DECLARE
    task_state text;
BEGIN
    IF OLD.outcome IS NULL THEN
        RAISE EXCEPTION 'delivery_attempt % (task %, attempt %) is open and cannot be deleted',
                OLD.id, OLD.task_id, OLD.attempt_no
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  CONSTRAINT = 'delivery_attempt_retention_only',
                  HINT = 'its holder may still record what the channel said; only finished history is pruned';
    END IF;
    SELECT t.state INTO task_state FROM delivery_task t WHERE t.id = OLD.task_id;
    IF task_state IS NULL OR task_state NOT IN ('SENT', 'FAILED', 'SUPPRESSED') THEN
        RAISE EXCEPTION 'delivery_attempt % cannot be deleted: its task % is %, not in a terminal state',
                OLD.id, OLD.task_id, coalesce(task_state, 'not visible')
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  CONSTRAINT = 'delivery_attempt_retention_only',
                  HINT = 'only the history of a SENT, FAILED or SUPPRESSED task may be pruned (R3, R6)';
    END IF;
    RETURN OLD;
END
$$;


--
-- Name: FUNCTION delivery_attempt_retention_only(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_attempt_retention_only() IS 'R3: attempts are deleted only as finished history of a SENT, FAILED or SUPPRESSED task';


--
-- Name: delivery_receipt_append_only(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_receipt_append_only() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
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


--
-- Name: FUNCTION delivery_receipt_append_only(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_receipt_append_only() IS 'R3: receipts are kept as they came; deleted only as the finished history of a final task';


--
-- Name: delivery_task_account_refusals(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_task_account_refusals() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    a   record;
    why text;
BEGIN
    SELECT at.outcome, at.attempt_token INTO a
    FROM public.delivery_attempt at
    WHERE at.task_id = NEW.id AND at.attempt_no = NEW.attempt_count;
    why := CASE
        WHEN NEW.account_refusals <> OLD.account_refusals + 1 THEN
            format('account_refusals goes from %s to %s; it grows by one per attempt refused for an account state',
                   OLD.account_refusals, NEW.account_refusals)
        WHEN NOT (OLD.state = 'SENDING' AND NEW.state IN ('PENDING', 'UNKNOWN') AND NOT NEW.needs_review
                  AND NEW.attempt_count = OLD.attempt_count AND NEW.attempt_token IS NOT DISTINCT FROM OLD.attempt_token) THEN
            format('account_refusals grows in a move %s -> %s that is not the finish of a refused call', OLD.state, NEW.state)
        WHEN NOT coalesce(a.outcome = 'ACCOUNT_REFUSED' AND a.attempt_token = OLD.attempt_token, false) THEN
            format('account_refusals grows but attempt %s records %s, not ACCOUNT_REFUSED', NEW.attempt_count,
                   coalesce(a.outcome, 'nothing'))
    END;
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'delivery_task %: %', NEW.id, why
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_task',
                  COLUMN = 'account_refusals',
                  CONSTRAINT = 'delivery_task_account_refusals',
                  HINT = 'only a finish with an ACCOUNT_REFUSED attempt refunds it; see schema/003_state_machine.sql';
    END IF;
    RETURN NULL;
END
$$;


--
-- Name: FUNCTION delivery_task_account_refusals(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_task_account_refusals() IS 'An attempt is refunded from the budget only by the finish of a call refused for an account state (schema/003)';


--
-- Name: delivery_task_attempts_kept(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_task_attempts_kept() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    kept record;
BEGIN
    SELECT a.task_id, a.attempt_no INTO kept
    FROM deleted_tasks d
    JOIN public.delivery_attempt a ON a.task_id = d.id
    ORDER BY a.task_id, a.attempt_no
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'delivery_task % cannot be deleted: its attempt % is kept', kept.task_id, kept.attempt_no
            USING ERRCODE = 'foreign_key_violation',
                  TABLE = 'delivery_task',
                  CONSTRAINT = 'delivery_task_attempts_kept',
                  HINT = 'a task goes with all its attempts, in one statement (notifier prune)';
    END IF;
    RETURN NULL;
END
$$;


--
-- Name: FUNCTION delivery_task_attempts_kept(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_task_attempts_kept() IS 'R3: no attempt outlives its task (schema/003, in place of a foreign key)';


--
-- Name: delivery_task_evidence(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_task_evidence() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    a    record;
    ok   boolean := true;
    want text;
BEGIN
    SELECT at.action, at.outcome, at.attempt_token INTO a
    FROM public.delivery_attempt at
    WHERE at.task_id = NEW.id AND at.attempt_no = NEW.attempt_count;

    IF NEW.attempt_count <> OLD.attempt_count THEN
        want := CASE NEW.state
            WHEN 'SENDING' THEN 'an open SEND, QUERY or TOPIC_RESEND attempt with the task''s token'
            WHEN 'SUPPRESSED' THEN 'a SKIP attempt PREF_DISABLED, CANCELLED or FALLBACK_NOT_NEEDED'
            WHEN 'FAILED' THEN 'a SKIP attempt TTL_EXPIRED or a MANUAL attempt MANUAL_FAILED'
            WHEN 'UNKNOWN' THEN 'a SKIP attempt PREF_DISABLED_UNCERTAIN, TTL_EXPIRED_UNCERTAIN or CANCELLED_UNCERTAIN'
            WHEN 'SENT' THEN 'a MANUAL attempt MANUAL_SENT or a RECEIPT attempt RECEIPT_ACCEPTED'
            ELSE 'no attempt (no move counts one into this state)'
        END;
        ok := CASE NEW.state
            WHEN 'SENDING' THEN a.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND a.attempt_token = NEW.attempt_token
            WHEN 'SUPPRESSED' THEN a.action = 'SKIP' AND a.outcome IN ('PREF_DISABLED', 'CANCELLED', 'FALLBACK_NOT_NEEDED')
            WHEN 'FAILED' THEN (a.action = 'SKIP' AND a.outcome = 'TTL_EXPIRED')
                            OR (a.action = 'MANUAL' AND a.outcome = 'MANUAL_FAILED')
            WHEN 'UNKNOWN' THEN a.action = 'SKIP' AND a.outcome IN ('PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN', 'CANCELLED_UNCERTAIN')
            WHEN 'SENT' THEN (a.action = 'MANUAL' AND a.outcome = 'MANUAL_SENT')
                          OR (a.action = 'RECEIPT' AND a.outcome = 'RECEIPT_ACCEPTED')
            ELSE false
        END;
        -- Before it is due, a waiting task is settled without a call only by a cancel (schema/005); a
        -- receipt's SENT is evidence of its own.
        IF ok AND OLD.state IN ('PENDING', 'UNKNOWN') AND NOT OLD.needs_review AND coalesce(OLD.next_attempt_at > now(), true)
           AND NEW.state IN ('SUPPRESSED', 'FAILED', 'UNKNOWN') AND a.outcome NOT IN ('CANCELLED', 'CANCELLED_UNCERTAIN', 'FALLBACK_NOT_NEEDED') THEN
            want := 'a SKIP attempt CANCELLED, CANCELLED_UNCERTAIN or FALLBACK_NOT_NEEDED (the task was not due: '
                    'only a cancel, or a fallback chain that no longer needs it, settles it)';
            ok := false;
        END IF;
    ELSIF OLD.state = 'SENDING' AND NEW.state IN ('PENDING', 'FAILED') AND NOT NEW.outcome_uncertain THEN
        IF OLD.outcome_uncertain THEN
            want := 'this attempt''s QUERY_NOT_FOUND (the only proof that an uncertain history was not accepted)';
            ok := a.attempt_token = OLD.attempt_token AND a.outcome = 'QUERY_NOT_FOUND';
        ELSE
            want := 'this attempt''s refusal: REJECTED, HTTP_5XX, THROTTLED, CONNECT_FAILED, QUERY_NOT_FOUND (or, for PENDING, ACCOUNT_REFUSED)';
            ok := a.attempt_token = OLD.attempt_token
                  AND (a.outcome IN ('REJECTED', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED', 'QUERY_NOT_FOUND')
                       OR (a.outcome = 'ACCOUNT_REFUSED' AND NEW.state = 'PENDING'));
        END IF;
    ELSIF OLD.outcome_uncertain AND NOT NEW.outcome_uncertain AND NEW.state = 'SENT' THEN
        want := 'this attempt''s acceptance: ACCEPTED, ACCEPTED_REPLAY or QUERY_FOUND';
        ok := a.attempt_token = OLD.attempt_token AND a.outcome IN ('ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND');
    END IF;

    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION 'delivery_task % (% -> %, attempt %) has no evidence: it needs % as attempt %, found %',
                NEW.id, OLD.state, NEW.state, NEW.attempt_count, want, NEW.attempt_count,
                CASE WHEN a.action IS NULL THEN 'none' ELSE a.action || ' ' || coalesce(a.outcome, '(open)') END
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_task',
                  COLUMN = 'attempt_count',
                  CONSTRAINT = 'delivery_task_evidence',
                  HINT = 'a move and its attempt row are written in one transaction; see schema/003_state_machine.sql';
    END IF;
    RETURN NULL;
END
$$;


--
-- Name: FUNCTION delivery_task_evidence(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_task_evidence() IS 'R3, R6: at commit, a counted attempt has its row, and a task written off as not accepted has the observation that proves it';


--
-- Name: delivery_task_fallback(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_task_fallback() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    IF NEW.state = 'SENT' THEN
        WITH not_needed AS (
            UPDATE public.delivery_task t
            SET state         = 'SUPPRESSED',
                attempt_count = t.attempt_count + 1,
                last_error    = format('fallback not needed: %s was sent', NEW.channel),
                updated_at    = now()
            WHERE t.notification_id = NEW.notification_id AND t.fallback_position > NEW.fallback_position
              AND t.state = 'PENDING' AND t.next_attempt_at IS NULL
            RETURNING t.id, t.attempt_count
        )
        INSERT INTO public.delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome, error)
        SELECT nn.id, nn.attempt_count, gen_random_uuid(), 'SKIP', session_user, now(), 'FALLBACK_NOT_NEEDED',
               format('fallback not needed: %s was sent', NEW.channel)
        FROM not_needed nn;
    ELSIF NEW.state IN ('FAILED', 'SUPPRESSED')
          AND public.delivery_task_fallback_turn(NEW.notification_id, (NEW.fallback_position + 1)::smallint) = 'RELEASE' THEN
        UPDATE public.delivery_task t
        SET next_attempt_at = now(),
            last_error      = format('released: %s ended %s', NEW.channel, NEW.state),
            updated_at      = now()
        WHERE t.notification_id = NEW.notification_id AND t.fallback_position = NEW.fallback_position + 1
          AND t.state = 'PENDING' AND t.next_attempt_at IS NULL;
    END IF;
    RETURN NULL;
END
$$;


--
-- Name: FUNCTION delivery_task_fallback(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_task_fallback() IS 'A fallback chain moves on in the statement that makes one of its tasks final: the next released, or the rest not needed (schema/005)';


--
-- Name: delivery_task_fallback_turn(bigint, smallint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_task_fallback_turn(notification_id bigint, fallback_position smallint) RETURNS text
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $_$
    SELECT CASE
        WHEN EXISTS (SELECT FROM public.delivery_task e
                     WHERE e.notification_id = $1 AND e.fallback_position < $2 AND e.state = 'SENT') THEN 'NOT_NEEDED'
        WHEN EXISTS (SELECT FROM public.notification n WHERE n.id = $1 AND n.cancelled_at IS NOT NULL) THEN 'WAIT'
        WHEN EXISTS (SELECT FROM public.delivery_task b
                     WHERE b.notification_id = $1 AND b.fallback_position = $2 - 1
                       AND b.state IN ('FAILED', 'SUPPRESSED')) THEN 'RELEASE'
        ELSE 'WAIT'
    END
$_$;


--
-- Name: FUNCTION delivery_task_fallback_turn(notification_id bigint, fallback_position smallint); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_task_fallback_turn(notification_id bigint, fallback_position smallint) IS 'A fallback chain''s verdict on its task at a position: RELEASE, NOT_NEEDED or WAIT (schema/005)';


--
-- Name: delivery_task_holders_have_attempts(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_task_holders_have_attempts() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    t      record;
    opened record;
    misfit text[];
BEGIN
    SELECT n.id, n.attempt_count, n.attempt_token, a.action, a.outcome INTO t
    FROM updated_tasks n
    LEFT JOIN public.delivery_attempt a ON a.task_id = n.id AND a.attempt_no = n.attempt_count
    WHERE n.state = 'SENDING'
      AND NOT coalesce(a.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND a.attempt_token = n.attempt_token, false)
    ORDER BY n.id
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT a.id, a.attempt_no, a.attempt_token = t.attempt_token AS held INTO opened
    FROM public.delivery_attempt a
    WHERE a.task_id = t.id AND a.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND a.outcome IS NULL
      AND a.xmin = pg_current_xact_id()::xid
    ORDER BY a.attempt_no DESC
    LIMIT 1;
    misfit := delivery_attempt_call_misfit('SENDING', t.attempt_count, opened.held, opened.attempt_no);
    IF FOUND AND misfit IS NOT NULL THEN
        RAISE EXCEPTION 'delivery_attempt % (task %, attempt %): %', opened.id, t.id, opened.attempt_no, misfit[2]
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  COLUMN = misfit[1],
                  CONSTRAINT = 'delivery_attempt_follows_task',
                  HINT = 'attempts are opened by the move that counts them (schema/003_state_machine.sql)';
    END IF;
    RAISE EXCEPTION 'delivery_task % (SENDING, attempt %) has no evidence: it needs an open SEND, QUERY or TOPIC_RESEND attempt with the task''s token as attempt %, written by the same statement, found %',
            t.id, t.attempt_count, t.attempt_count,
            CASE WHEN t.action IS NULL THEN 'none' ELSE t.action || ' ' || coalesce(t.outcome, '(open)') END
        USING ERRCODE = 'integrity_constraint_violation',
              TABLE = 'delivery_task',
              COLUMN = 'attempt_count',
              CONSTRAINT = 'delivery_task_evidence',
              HINT = 'a claim and its attempt row are written in one statement (TaskStartAttempts); see schema/003_state_machine.sql';
END
$$;


--
-- Name: FUNCTION delivery_task_holders_have_attempts(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_task_holders_have_attempts() IS 'R3: a task a statement leaves SENDING holds the open call attempt of its token (schema/003)';


--
-- Name: delivery_task_key_fixed(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_task_key_fixed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    IF TG_OP = 'DELETE' AND NOT EXISTS (SELECT FROM public.delivery_task t WHERE t.id = OLD.task_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION USING
        MESSAGE = CASE WHEN TG_OP = 'TRUNCATE' THEN 'delivery_task_key cannot be truncated'
                       ELSE format('delivery_task_key of task %s: a task''s keys are fixed while the task exists', OLD.task_id) END,
        ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task_key',
        CONSTRAINT = 'delivery_task_key_fixed',
        HINT = 'a task''s keys are written with it and deleted with it (notifier prune)';
END
$$;


--
-- Name: FUNCTION delivery_task_key_fixed(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_task_key_fixed() IS 'R2, R3: a task''s keys neither change nor go while it exists (schema/003)';


--
-- Name: delivery_task_key_insert(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_task_key_insert() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO public.delivery_task_key (task_id, notification_id, channel, ref)
    SELECT n.id, n.notification_id, n.channel, n.ref FROM new_tasks n;
    RETURN NULL;
END
$$;


--
-- Name: FUNCTION delivery_task_key_insert(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_task_key_insert() IS 'R2: a task''s unique keys are written by the statement that inserts it (schema/003)';


--
-- Name: delivery_task_provider_msg_fixed(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_task_provider_msg_fixed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    IF TG_OP = 'DELETE' AND NOT EXISTS (SELECT FROM public.delivery_task t WHERE t.id = OLD.task_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION USING
        MESSAGE = CASE WHEN TG_OP = 'TRUNCATE' THEN 'delivery_task_provider_msg cannot be truncated'
                       ELSE format('delivery_task_provider_msg of task %s: a task''s provider message ids stay while the task exists', OLD.task_id) END,
        ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task_provider_msg',
        CONSTRAINT = 'delivery_task_provider_msg_fixed',
        HINT = 'they are recorded by the triggers of schema/003 and deleted with their task (notifier prune)';
END
$$;


--
-- Name: FUNCTION delivery_task_provider_msg_fixed(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_task_provider_msg_fixed() IS 'Receipts match by provider id: a task''s recorded ids neither change nor go while it exists (schema/003)';


--
-- Name: delivery_task_provider_msg_replaced(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_task_provider_msg_replaced() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO public.delivery_task_provider_msg (provider_msg_id, task_id)
    VALUES (OLD.provider_msg_id, OLD.id)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;


--
-- Name: FUNCTION delivery_task_provider_msg_replaced(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_task_provider_msg_replaced() IS 'Receipts match by provider id: a task''s replaced id is recorded (schema/003)';


--
-- Name: delivery_task_ref_fixed(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_task_ref_fixed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = format('delivery_task %s: ref is fixed when the task is created (a channel may have seen it)', OLD.id),
        ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task', COLUMN = 'ref',
        CONSTRAINT = 'delivery_task_fixed',
        HINT = 'see the moves in schema/003_state_machine.sql; a parked task is settled with notifier_resolve()';
END
$$;


--
-- Name: FUNCTION delivery_task_ref_fixed(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_task_ref_fixed() IS 'R2, R3: what was sent to a channel names one task forever (schema/001_tables.sql)';


--
-- Name: delivery_task_state_machine(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.delivery_task_state_machine() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
DECLARE
    waiting  boolean; -- PENDING, or UNKNOWN not parked
    due      boolean; -- waiting, and next_attempt_at has come
    expired  boolean; -- SENDING, and the lease ran out
    parked   boolean; -- UNKNOWN, needs_review
    unreleased boolean; -- PENDING in a fallback chain, not released yet (schema/005)
    counted  boolean; -- attempt_count up by one
    set_aside_columns text[]; -- what a set-aside may change: the time it moves, why, (waiting) when
    move     text;    -- the protocol's move this update makes, NULL when it makes none
    col      text;
    why      text;
    rule     text;
    msg      text;
    hint     constant text := 'see the moves in schema/003_state_machine.sql; a parked task is settled with notifier_resolve()';
    old_desc text;
    new_desc text;
BEGIN
    -- The two moves every delivery makes, recognised first, in one expression (PL/pgSQL keeps its plan
    -- for the session): a claim of a due waiting task or a takeover of an expired hold (counted, a new
    -- token, a lease in the future, uncertain if taken over), and a finish (the holder's token stays, its
    -- lease goes, nothing counted, FAILED only when certain, a message id written or kept, never
    -- erased); for both, what the task is for stays and no uncertainty is written off, moved, or
    -- started after its attempt. Every condition here is also checked below; any other update, every
    -- refused one included, takes the long way. coalesce: an unknown comparison never lets one pass.
    IF coalesce(
        NEW.id = OLD.id AND NEW.notification_id = OLD.notification_id AND NEW.channel = OLD.channel
        AND NEW.max_attempts = OLD.max_attempts AND NEW.created_at = OLD.created_at
        AND NEW.fallback_position IS NOT DISTINCT FROM OLD.fallback_position
        AND (NEW.outcome_uncertain OR NOT OLD.outcome_uncertain)
        AND (NOT OLD.outcome_uncertain OR NEW.uncertain_since = OLD.uncertain_since)
        AND (OLD.outcome_uncertain OR NOT NEW.outcome_uncertain OR NEW.uncertain_since <= OLD.updated_at)
        AND ((NEW.state = 'SENDING' AND NEW.attempt_count = OLD.attempt_count + 1
              AND NEW.attempt_token IS DISTINCT FROM OLD.attempt_token AND NEW.lease_until > now()
              AND NEW.provider_msg_id IS NOT DISTINCT FROM OLD.provider_msg_id
              AND ((OLD.state IN ('PENDING', 'UNKNOWN') AND NOT OLD.needs_review AND OLD.next_attempt_at <= now())
                   OR (OLD.state = 'SENDING' AND OLD.lease_until < now() AND NEW.outcome_uncertain)))
             OR (OLD.state = 'SENDING' AND NEW.state IN ('SENT', 'PENDING', 'UNKNOWN', 'FAILED')
                 AND NEW.attempt_count = OLD.attempt_count AND NEW.attempt_token IS NOT DISTINCT FROM OLD.attempt_token
                 AND NEW.lease_until IS NULL AND NEW.lease_owner IS NULL
                 AND NOT (NEW.state = 'FAILED' AND NEW.outcome_uncertain)
                 AND (NEW.provider_msg_id IS NOT NULL OR OLD.provider_msg_id IS NULL))),
        false) THEN
        RETURN NULL; -- AFTER trigger: the return value is ignored
    END IF;

    waiting := OLD.state IN ('PENDING', 'UNKNOWN') AND NOT OLD.needs_review;
    due := waiting AND coalesce(OLD.next_attempt_at <= now(), false);
    unreleased := OLD.state = 'PENDING' AND OLD.next_attempt_at IS NULL;
    expired := OLD.state = 'SENDING' AND OLD.lease_until < now();
    parked := OLD.state = 'UNKNOWN' AND OLD.needs_review;
    counted := NEW.attempt_count = OLD.attempt_count + 1;
    set_aside_columns := CASE WHEN OLD.state = 'SENDING' THEN ARRAY['lease_until', 'last_error']
                              ELSE ARRAY['next_attempt_at', 'last_error', 'updated_at'] END;
    old_desc := OLD.state || CASE WHEN OLD.needs_review THEN ' (parked)' ELSE '' END;
    new_desc := NEW.state || CASE WHEN NEW.needs_review THEN ' (parked)' ELSE '' END;

    -- What a task is for never changes.
    col := CASE
        WHEN NEW.id IS DISTINCT FROM OLD.id THEN 'id'
        WHEN NEW.notification_id IS DISTINCT FROM OLD.notification_id THEN 'notification_id'
        WHEN NEW.channel IS DISTINCT FROM OLD.channel THEN 'channel'
        WHEN NEW.max_attempts IS DISTINCT FROM OLD.max_attempts THEN 'max_attempts'
        WHEN NEW.created_at IS DISTINCT FROM OLD.created_at THEN 'created_at'
        WHEN NEW.fallback_position IS DISTINCT FROM OLD.fallback_position THEN 'fallback_position'
    END;
    IF col IS NOT NULL THEN
        rule := 'delivery_task_fixed';
        why := col || ' is fixed when the task is created';
    ELSIF OLD.state IN ('SENT', 'FAILED', 'SUPPRESSED') THEN
        rule := 'delivery_task_final';
        SELECT n.key INTO col
        FROM jsonb_each(to_jsonb(NEW)) n JOIN jsonb_each(to_jsonb(OLD)) o USING (key)
        WHERE n.value IS DISTINCT FROM o.value ORDER BY n.key = 'state' DESC, n.key LIMIT 1;
        why := format('%s changes, but %s is final', col, OLD.state);
    ELSIF NEW.attempt_count < OLD.attempt_count THEN
        rule := 'delivery_task_attempt_count';
        col := 'attempt_count';
        why := format('attempt_count goes down from %s to %s; attempts are never uncounted', OLD.attempt_count, NEW.attempt_count);
    ELSIF NEW.attempt_count > OLD.attempt_count + 1 THEN
        rule := 'delivery_task_attempt_count';
        col := 'attempt_count';
        why := format('attempt_count jumps from %s to %s; it grows by one per attempt', OLD.attempt_count, NEW.attempt_count);
    END IF;

    IF rule IS NULL THEN
        -- Which move is it? Decided by the states and the token; the conditions each move must meet follow.
        move := CASE
            WHEN unreleased AND NEW.state = 'PENDING' AND NEW.next_attempt_at IS NOT NULL THEN 'release'
            WHEN unreleased AND NEW.state = 'SUPPRESSED' AND counted THEN 'settle'
            WHEN unreleased THEN NULL
            WHEN (to_jsonb(OLD) ->> 'receipt_at') IS NULL AND (to_jsonb(NEW) ->> 'receipt_at') IS NOT NULL
                 THEN 'note receipt'
            WHEN NEW.state = 'SENT' AND counted AND NOT NEW.needs_review AND (waiting OR parked OR expired)
                 AND (to_jsonb(NEW) ->> 'receipt_at') IS NOT NULL THEN 'receipt'
            WHEN NEW.state = 'SENDING' AND (waiting OR OLD.state = 'SENDING')
                 AND NEW.attempt_token IS DISTINCT FROM OLD.attempt_token THEN 'claim'
            WHEN waiting AND NEW.state = OLD.state AND NOT NEW.needs_review
                 AND NEW.next_attempt_at IS DISTINCT FROM OLD.next_attempt_at THEN 'set aside'
            WHEN OLD.state = 'SENDING' AND NEW.state = 'SENDING'
                 AND NEW.lease_until IS DISTINCT FROM OLD.lease_until THEN 'set aside'
            WHEN waiting AND counted
                 AND (NEW.state IN ('SUPPRESSED', 'FAILED') OR (NEW.state = 'UNKNOWN' AND NEW.needs_review)) THEN 'settle'
            WHEN OLD.state = 'SENDING' AND counted AND NEW.state = 'UNKNOWN' AND NEW.needs_review THEN 'settle'
            WHEN waiting AND NEW.state = 'UNKNOWN' AND NEW.needs_review THEN 'park'
            WHEN OLD.state = 'SENDING' AND NEW.state IN ('SENT', 'PENDING', 'UNKNOWN', 'FAILED') THEN 'finish'
            WHEN parked AND NEW.state IN ('SENT', 'FAILED') AND NOT NEW.needs_review THEN 'resolve'
        END;
        rule := 'delivery_task_transition';
        col := 'state';
        IF move IS NULL THEN
            why := CASE
                WHEN unreleased THEN 'a fallback task not released yet changes only by its release, its settle as '
                                     'not needed, or a cancel (schema/005)'
                WHEN parked THEN 'a parked task changes only by its resolution (notifier_resolve)'
                WHEN NEW.attempt_token IS DISTINCT FROM OLD.attempt_token THEN 'the attempt token changes only at a claim'
                ELSE 'not a move of the delivery protocol'
            END;
            IF NEW.attempt_token IS DISTINCT FROM OLD.attempt_token AND NOT parked THEN
                col := 'attempt_token';
            END IF;
        ELSIF move = 'note receipt' AND to_jsonb(NEW) - 'receipt_at' <> to_jsonb(OLD) - 'receipt_at' THEN
            why := 'notes a receipt and changes something else; a receipt is noted alone (the settle follows)';
            col := 'receipt_at';
        ELSIF move = 'release' AND NOT (
                to_jsonb(NEW) - ARRAY['next_attempt_at', 'updated_at', 'last_error']
                    = to_jsonb(OLD) - ARRAY['next_attempt_at', 'updated_at', 'last_error']
                AND NEW.next_attempt_at = now()) THEN
            why := 'a release makes the task due now and changes nothing else (but updated_at and last_error)';
            col := 'next_attempt_at';
        ELSIF move = 'release'
              AND public.delivery_task_fallback_turn(NEW.notification_id, NEW.fallback_position) <> 'RELEASE' THEN
            why := 'releases a fallback task before the one before it ended certainly not sent (FAILED or '
                   'SUPPRESSED), or after its chain was sent or cancelled';
            col := 'next_attempt_at';
        ELSIF move = 'claim' AND OLD.state = 'SENDING' AND NOT expired THEN
            why := 'takes over a lease that has not expired on the database clock';
            col := 'lease_until';
        ELSIF move = 'claim' AND NOT due AND OLD.state <> 'SENDING' THEN
            why := 'claims a task that is not due yet';
            col := 'next_attempt_at';
        ELSIF move = 'claim' AND NOT NEW.lease_until > now() THEN
            why := 'claims without a lease in the future';
            col := 'lease_until';
        ELSIF move <> 'claim' AND NEW.attempt_token IS DISTINCT FROM OLD.attempt_token THEN
            why := format('changes the attempt token in a %s; only a claim does', move);
            col := 'attempt_token';
        ELSIF move = 'set aside' AND NOT (
                to_jsonb(NEW) - set_aside_columns = to_jsonb(OLD) - set_aside_columns
                AND NEW.last_error IS NOT NULL
                AND CASE WHEN waiting
                         THEN due AND NEW.next_attempt_at > OLD.next_attempt_at
                         ELSE expired AND NEW.lease_until > OLD.lease_until END) THEN
            why := 'sets aside only a due or expired task: its next_attempt_at or lease_until later, last_error '
                   'set, nothing else changed (a holder''s updated_at marks when its attempt began)';
            col := CASE WHEN waiting THEN 'next_attempt_at' ELSE 'lease_until' END;
        ELSIF move IN ('settle', 'park') AND NOT (due OR expired
                OR (move = 'settle' AND waiting
                    AND EXISTS (SELECT FROM public.notification n
                                WHERE n.id = NEW.notification_id AND n.cancelled_at IS NOT NULL))
                OR (move = 'settle' AND unreleased
                    AND public.delivery_task_fallback_turn(NEW.notification_id, NEW.fallback_position) = 'NOT_NEEDED')) THEN
            why := 'settles or parks only a task its claim may take: due, or SENDING with an expired lease '
                   '(or, for a cancelled notification, settles any waiting task: schema/005)';
            col := CASE WHEN waiting THEN 'next_attempt_at' ELSE 'lease_until' END;
        ELSIF NEW.state <> 'SENDING' AND (NEW.lease_until IS NOT NULL OR NEW.lease_owner IS NOT NULL) THEN
            why := 'leaves a lease on a task nobody holds';
            col := 'lease_until';
        ELSE
            -- The move is one of the protocol's. Now its counting, its uncertainty and its evidence.
            rule := NULL;
            IF counted <> (move IN ('claim', 'settle', 'resolve', 'receipt')) THEN
                rule := 'delivery_task_attempt_count';
                col := 'attempt_count';
                why := CASE WHEN counted THEN format('attempt_count is counted up by a %s, which starts no attempt', move)
                            ELSE format('attempt_count is not counted up by a %s, which starts an attempt', move) END;
            ELSIF OLD.outcome_uncertain AND NOT NEW.outcome_uncertain
                  AND NOT (move = 'finish' AND NEW.state IN ('SENT', 'PENDING', 'FAILED')) AND move NOT IN ('resolve', 'receipt') THEN
                rule := 'delivery_task_uncertainty';
                col := 'outcome_uncertain';
                why := 'writes uncertainty off; only an acceptance, a query that found nothing, a receipt or a resolution may';
            ELSIF OLD.outcome_uncertain AND NEW.outcome_uncertain
                  AND NEW.uncertain_since IS DISTINCT FROM OLD.uncertain_since THEN
                rule := 'delivery_task_uncertainty';
                col := 'uncertain_since';
                why := 'moves the start of an uncertainty that goes on (channel contracts are measured from it)';
            ELSIF expired AND move IN ('claim', 'settle', 'park') AND NOT NEW.outcome_uncertain THEN
                rule := 'delivery_task_uncertainty';
                col := 'outcome_uncertain';
                why := 'takes a task over from an expired lease as certain; the lost call may have been accepted';
            ELSIF NEW.state IN ('FAILED', 'SUPPRESSED') AND NEW.outcome_uncertain AND move <> 'resolve' THEN
                rule := 'delivery_task_uncertainty';
                col := 'outcome_uncertain';
                why := 'writes off a task that may have been accepted (R6); park it for review instead';
            ELSIF NOT OLD.outcome_uncertain AND NEW.outcome_uncertain AND NEW.uncertain_since > OLD.updated_at THEN
                rule := 'delivery_task_uncertainty';
                col := 'uncertain_since';
                why := 'starts an uncertainty after the attempt that caused it began (the row''s updated_at): '
                       'channel contracts would be measured from too late';
            ELSIF NEW.provider_msg_id IS DISTINCT FROM OLD.provider_msg_id
                  AND (move NOT IN ('finish', 'resolve', 'receipt') OR NEW.provider_msg_id IS NULL) THEN
                rule := 'delivery_task_transition';
                col := 'provider_msg_id';
                why := 'provider_msg_id is written only by a finish, a resolution or a receipt, and never erased';
            END IF;
        END IF;
    END IF;

    IF rule IS NULL THEN
        RETURN NULL; -- AFTER trigger: the return value is ignored
    END IF;
    msg := format('delivery_task %s: %s -> %s: %s', OLD.id, old_desc, new_desc, why);
    col := coalesce(col, '');
    -- One RAISE per rule, so that each constraint name this function can raise is written out here.
    CASE rule
    WHEN 'delivery_task_fixed' THEN
        RAISE EXCEPTION USING MESSAGE = msg, ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task',
            COLUMN = col, CONSTRAINT = 'delivery_task_fixed', HINT = hint;
    WHEN 'delivery_task_final' THEN
        RAISE EXCEPTION USING MESSAGE = msg, ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task',
            COLUMN = col, CONSTRAINT = 'delivery_task_final', HINT = hint;
    WHEN 'delivery_task_attempt_count' THEN
        RAISE EXCEPTION USING MESSAGE = msg, ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task',
            COLUMN = col, CONSTRAINT = 'delivery_task_attempt_count', HINT = hint;
    WHEN 'delivery_task_uncertainty' THEN
        RAISE EXCEPTION USING MESSAGE = msg, ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task',
            COLUMN = col, CONSTRAINT = 'delivery_task_uncertainty', HINT = hint;
    ELSE
        RAISE EXCEPTION USING MESSAGE = msg, ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task',
            COLUMN = col, CONSTRAINT = 'delivery_task_transition', HINT = hint;
    END CASE;
END
$$;


--
-- Name: FUNCTION delivery_task_state_machine(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.delivery_task_state_machine() IS 'R2, R6: an update of delivery_task must be one of the protocol''s moves (schema/003_state_machine.sql)';


--
-- Name: notifier_apply_receipt(bigint, text, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.notifier_apply_receipt(task_id bigint, provider_msg_id text, note text) RETURNS TABLE(effect text, state text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
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


--
-- Name: FUNCTION notifier_apply_receipt(task_id bigint, provider_msg_id text, note text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.notifier_apply_receipt(task_id bigint, provider_msg_id text, note text) IS 'A provider''s receipt settles its task as SENT with a RECEIPT attempt when nobody holds it; never moves a final state';


--
-- Name: notifier_cancel(text, text, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.notifier_cancel(user_id text, event_key text, note text DEFAULT NULL::text) RETURNS TABLE(notification_id bigint, task_id bigint, channel text, state_before text, state_after text, effect text, changed boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
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
    -- The notification's tasks are found through their key rows (delivery_task has no index on
    -- notification_id alone, 001); only the tasks are locked.
    FOR t IN
        SELECT dt.id, dt.channel::text AS channel, dt.state, dt.needs_review, dt.outcome_uncertain
        FROM delivery_task_key k
        JOIN delivery_task dt ON dt.id = k.task_id
        WHERE k.notification_id = nid
        ORDER BY dt.id
        FOR UPDATE OF dt
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


--
-- Name: FUNCTION notifier_cancel(user_id text, event_key text, note text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.notifier_cancel(user_id text, event_key text, note text) IS 'The submitter takes an event back: waiting tasks end now (SUPPRESSED, or parked when uncertain), held ones at their next claim (schema/005)';


--
-- Name: notifier_create(text, text, text, interval, integer, text[], timestamp with time zone, text[]); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.notifier_create(user_id text, event_key text, body text, ttl interval DEFAULT '24:00:00'::interval, max_attempts integer DEFAULT 3, channels text[] DEFAULT NULL::text[], send_at timestamp with time zone DEFAULT NULL::timestamp with time zone, fallback text[] DEFAULT NULL::text[]) RETURNS TABLE(notification_id bigint, created boolean)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $_$
#variable_conflict use_column
DECLARE
    isolation constant text := current_setting('transaction_isolation');
    ttl_seconds numeric;
    bad_channel text;
    new_id bigint;
    existing_id bigint;
BEGIN
    IF notifier_create.user_id IS NULL OR notifier_create.user_id !~ '\S' OR char_length(notifier_create.user_id) > 200 THEN
        RAISE EXCEPTION 'notifier_create: user_id must not be empty or blank, and at most 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF notifier_create.event_key IS NULL OR notifier_create.event_key !~ '\S' OR char_length(notifier_create.event_key) > 200 THEN
        RAISE EXCEPTION 'notifier_create: event_key must not be empty or blank, and at most 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF notifier_create.body IS NULL OR notifier_create.body !~ '\S' THEN
        RAISE EXCEPTION 'notifier_create: body must not be empty or only white space: a notification needs a message'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(notifier_create.body) > 65536 THEN
        RAISE EXCEPTION 'notifier_create: body is % bytes, more than the limit of 65536', octet_length(notifier_create.body)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The time the notification really lives, as a timestamp difference: '1 month' or '1 day' across a
    -- daylight-saving change count as what they add to now().
    ttl_seconds := extract(epoch FROM (now() + notifier_create.ttl) - now());
    IF ttl_seconds IS NULL OR ttl_seconds < 0.001 OR ttl_seconds > 365 * 86400 THEN
        RAISE EXCEPTION 'notifier_create: ttl %: must be at least 1 millisecond and at most 365 days', notifier_create.ttl
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF notifier_create.max_attempts IS NULL OR notifier_create.max_attempts NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'notifier_create: max_attempts %: must be between 1 and 100', notifier_create.max_attempts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF notifier_create.channels IS NOT NULL THEN
        IF cardinality(notifier_create.channels) = 0 THEN
            RAISE EXCEPTION 'notifier_create: channels is empty: name at least one channel, or pass NULL for every enabled channel'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- The rule of the domain notifier_channel (schema/001).
        SELECT c INTO bad_channel FROM unnest(notifier_create.channels) AS c
        WHERE c IS NULL OR c !~ '^[a-z][a-z0-9_-]{0,31}$' LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'notifier_create: channels: % is not a channel name (1-32 of a-z, 0-9, _ or -, starting with a letter)',
                    coalesce(quote_literal(bad_channel), 'NULL')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    -- The send time must come before the expiry, on the database clock, as the notification's CHECK
    -- (notification_send_before_expiry) has it: a notification that expires before its tasks are due
    -- would only ever be written off. A send time already past is due at once.
    IF notifier_create.send_at IS NOT NULL AND notifier_create.send_at >= now() + notifier_create.ttl THEN
        RAISE EXCEPTION 'notifier_create: send_at % is at or after the expiry % (now() + ttl): it would expire before it is due',
                notifier_create.send_at, now() + notifier_create.ttl
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF notifier_create.fallback IS NOT NULL THEN
        IF notifier_create.channels IS NOT NULL THEN
            RAISE EXCEPTION 'notifier_create: channels and fallback together: a fallback chain names its channels itself'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF cardinality(notifier_create.fallback) NOT BETWEEN 1 AND 32 THEN
            RAISE EXCEPTION 'notifier_create: fallback names % channels: a chain has 1 to 32', cardinality(notifier_create.fallback)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT c INTO bad_channel FROM unnest(notifier_create.fallback) AS c
        WHERE c IS NULL OR c !~ '^[a-z][a-z0-9_-]{0,31}$' LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'notifier_create: fallback: % is not a channel name (1-32 of a-z, 0-9, _ or -, starting with a letter)',
                    coalesce(quote_literal(bad_channel), 'NULL')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT c INTO bad_channel FROM unnest(notifier_create.fallback) AS c GROUP BY c HAVING count(*) > 1 LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'notifier_create: fallback: % is named twice: a chain calls each channel at most once', bad_channel
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;

    -- Twice at most: a winner read back as missing was deleted (retention) between the two statements.
    FOR try IN 1..2 LOOP
        new_id := NULL;
        IF isolation = 'read committed' THEN
            INSERT INTO notification (user_id, event_key, body, expires_at, send_at)
            VALUES (notifier_create.user_id, notifier_create.event_key, notifier_create.body, now() + notifier_create.ttl,
                    notifier_create.send_at)
            ON CONFLICT (user_id, event_key) DO NOTHING
            RETURNING id INTO new_id;
        ELSE
            BEGIN
                INSERT INTO notification (user_id, event_key, body, expires_at, send_at)
                VALUES (notifier_create.user_id, notifier_create.event_key, notifier_create.body, now() + notifier_create.ttl,
                    notifier_create.send_at)
                ON CONFLICT (user_id, event_key) DO NOTHING
                RETURNING id INTO new_id;
            EXCEPTION WHEN serialization_failure THEN
                RAISE EXCEPTION 'notifier_create: (%, %) was created by a transaction that committed after this % transaction began: it cannot be read back here',
                        notifier_create.user_id, notifier_create.event_key, upper(isolation)
                    USING ERRCODE = 'serialization_failure',
                          HINT = 'retry the whole transaction (it then answers created = false), or create at READ COMMITTED';
            END;
        END IF;
        IF new_id IS NOT NULL THEN
            -- A fallback chain: its channels with an enabled preference, numbered in chain order from 1;
            -- only the first is due (at the send time, or now: schema/005), the others wait unreleased
            -- (schema/005).
            INSERT INTO delivery_task (notification_id, channel, max_attempts, fallback_position, next_attempt_at)
            SELECT new_id, c.channel, notifier_create.max_attempts, c.position,
                   CASE WHEN c.position > 1 THEN NULL ELSE greatest(notifier_create.send_at, now()) END
            FROM (SELECT p.channel,
                         CASE WHEN notifier_create.fallback IS NOT NULL
                              THEN row_number() OVER (ORDER BY array_position(notifier_create.fallback, p.channel::text))
                         END::smallint AS position
                  FROM channel_pref p
                  WHERE p.user_id = notifier_create.user_id AND p.enabled
                    AND (notifier_create.channels IS NULL OR p.channel = ANY (notifier_create.channels))
                    AND (notifier_create.fallback IS NULL OR p.channel = ANY (notifier_create.fallback))) AS c
            ORDER BY c.channel;
            notification_id := new_id;
            created := true;
            RETURN NEXT;
            RETURN;
        END IF;
        SELECT n.id INTO existing_id FROM notification n
        WHERE n.user_id = notifier_create.user_id AND n.event_key = notifier_create.event_key;
        IF existing_id IS NOT NULL THEN
            notification_id := existing_id;
            created := false;
            RETURN NEXT;
            RETURN;
        END IF;
        IF isolation <> 'read committed' THEN
            RAISE EXCEPTION 'notifier_create: (%, %) exists but this % transaction cannot see it',
                    notifier_create.user_id, notifier_create.event_key, upper(isolation)
                USING ERRCODE = 'serialization_failure',
                      HINT = 'retry the whole transaction, or create at READ COMMITTED';
        END IF;
    END LOOP;
    RAISE EXCEPTION 'notifier_create: (%, %) conflicted but could not be read back: it was deleted meanwhile',
            notifier_create.user_id, notifier_create.event_key
        USING ERRCODE = 'serialization_failure', HINT = 'retry the transaction';
END
$_$;


--
-- Name: FUNCTION notifier_create(user_id text, event_key text, body text, ttl interval, max_attempts integer, channels text[], send_at timestamp with time zone, fallback text[]); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.notifier_create(user_id text, event_key text, body text, ttl interval, max_attempts integer, channels text[], send_at timestamp with time zone, fallback text[]) IS 'Submits one event in the caller''s transaction: (notification_id, created); schema/005, docs/protocol.md#create';


--
-- Name: notifier_late_accepted_count(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.notifier_late_accepted_count() RETURNS bigint
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
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


--
-- Name: FUNCTION notifier_late_accepted_count(); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.notifier_late_accepted_count() IS 'How many FAILED or SUPPRESSED tasks a late answer or a receipt says were accepted (status, the alert gauges)';


--
-- Name: notifier_resolve(bigint, text, text, text, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.notifier_resolve(task_id bigint, final_state text, note text, operator text, provider_msg_id text) RETURNS TABLE(attempt_no integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_column
BEGIN
    IF final_state IS NULL OR final_state NOT IN ('SENT', 'FAILED') THEN
        RAISE EXCEPTION 'notifier_resolve: final state %: a parked task resolves to SENT or FAILED', coalesce(final_state, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH resolved AS (
        UPDATE delivery_task t
        SET state           = notifier_resolve.final_state,
            needs_review    = false,
            attempt_count   = t.attempt_count + 1,
            provider_msg_id = coalesce(notifier_resolve.provider_msg_id, t.provider_msg_id),
            last_error      = NULL,
            updated_at      = now()
        WHERE t.id = notifier_resolve.task_id
          AND t.state = 'UNKNOWN'
          AND t.needs_review
        RETURNING t.id, t.attempt_count
    ), recorded AS (
        INSERT INTO delivery_attempt AS a (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome,
                                           provider_msg_id, note)
        SELECT r.id, r.attempt_count, gen_random_uuid(), 'MANUAL', notifier_resolve.operator, now(),
               'MANUAL_' || notifier_resolve.final_state, notifier_resolve.provider_msg_id, notifier_resolve.note
        FROM resolved r
        RETURNING a.attempt_no
    )
    SELECT r.attempt_no FROM recorded r;
END
$$;


--
-- Name: FUNCTION notifier_resolve(task_id bigint, final_state text, note text, operator text, provider_msg_id text); Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON FUNCTION public.notifier_resolve(task_id bigint, final_state text, note text, operator text, provider_msg_id text) IS 'A human''s final word on a parked task: SENT or FAILED with its MANUAL attempt, together or not at all';


--
-- Name: rate_limit_tokens(double precision, double precision, double precision, timestamp with time zone, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.rate_limit_tokens(tokens double precision, rate double precision, burst double precision, refilled_at timestamp with time zone, paused_until timestamp with time zone) RETURNS double precision
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE WHEN paused_until > now() THEN 0::float8
                ELSE least(burst, tokens + rate * greatest(0::float8,
                         extract(epoch FROM now() - greatest(refilled_at, paused_until))::float8))
           END
$$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: channel_pause; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.channel_pause (
    channel text NOT NULL,
    cause text NOT NULL,
    paused_at timestamp with time zone DEFAULT now() NOT NULL,
    backoff_seconds double precision NOT NULL,
    probe_after timestamp with time zone NOT NULL,
    probe_hold_seconds double precision NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT channel_pause_backoff_check CHECK (((backoff_seconds > (0)::double precision) AND (backoff_seconds <= (3600)::double precision))),
    CONSTRAINT channel_pause_cause_check CHECK ((length(cause) <= 2000)),
    CONSTRAINT channel_pause_channel_check CHECK ((channel ~ '^[a-z][a-z0-9_-]{0,31}$'::text)),
    CONSTRAINT channel_pause_hold_check CHECK (((probe_hold_seconds > (0)::double precision) AND (probe_hold_seconds <= (86400)::double precision)))
);


--
-- Name: channel_pref; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.channel_pref (
    user_id text NOT NULL COLLATE pg_catalog."C",
    channel public.notifier_channel NOT NULL,
    address text NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    version bigint DEFAULT 1 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT channel_pref_address_check CHECK (((address <> ''::text) AND (length(address) <= 1000))),
    CONSTRAINT channel_pref_user_id_check CHECK (((user_id <> ''::text) AND (length(user_id) <= 200))),
    CONSTRAINT channel_pref_version_check CHECK ((version >= 1))
);


--
-- Name: channel_rate_limit; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.channel_rate_limit (
    channel public.notifier_channel NOT NULL,
    rate double precision NOT NULL,
    burst double precision NOT NULL,
    tokens double precision NOT NULL,
    refilled_at timestamp with time zone DEFAULT now() NOT NULL,
    paused_until timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT channel_rate_limit_burst_check CHECK (((burst >= (1)::double precision) AND (burst <= (1000000)::double precision))),
    CONSTRAINT channel_rate_limit_pause_check CHECK ((paused_until <= (updated_at + '01:00:00'::interval))),
    CONSTRAINT channel_rate_limit_rate_check CHECK (((rate > (0)::double precision) AND (rate <= (1000000)::double precision))),
    CONSTRAINT channel_rate_limit_refilled_at_check CHECK (isfinite(refilled_at)),
    CONSTRAINT channel_rate_limit_tokens_check CHECK (((tokens >= (0)::double precision) AND (tokens <= burst))),
    CONSTRAINT channel_rate_limit_updated_at_check CHECK (isfinite(updated_at))
);


--
-- Name: delivery_attempt; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.delivery_attempt (
    id bigint NOT NULL,
    task_id bigint NOT NULL,
    attempt_no integer NOT NULL,
    attempt_token uuid NOT NULL,
    action text NOT NULL,
    worker text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    outcome text,
    provider_msg_id text COLLATE pg_catalog."C",
    error text,
    late_outcome text,
    late_at timestamp with time zone,
    note text,
    CONSTRAINT delivery_attempt_action_check CHECK ((action = ANY (ARRAY['SEND'::text, 'QUERY'::text, 'SKIP'::text, 'MANUAL'::text, 'TOPIC_RESEND'::text, 'RECEIPT'::text]))),
    CONSTRAINT delivery_attempt_attempt_no_check CHECK ((attempt_no >= 1)),
    CONSTRAINT delivery_attempt_error_check CHECK ((length(error) <= 2000)),
    CONSTRAINT delivery_attempt_finished_iff_outcome CHECK (((outcome IS NULL) = (finished_at IS NULL))),
    CONSTRAINT delivery_attempt_late_has_time CHECK (((late_outcome IS NULL) = (late_at IS NULL))),
    CONSTRAINT delivery_attempt_late_outcome_check CHECK ((late_outcome = ANY (ARRAY['ACCEPTED'::text, 'ACCEPTED_REPLAY'::text, 'QUERY_FOUND'::text, 'QUERY_NOT_FOUND'::text, 'QUERY_FAILED'::text, 'TIMEOUT'::text, 'IO_ERROR'::text, 'IN_FLIGHT'::text, 'MALFORMED_RESPONSE'::text, 'HTTP_5XX'::text, 'THROTTLED'::text, 'CONNECT_FAILED'::text, 'GATEWAY_ERROR'::text, 'REJECTED'::text, 'ACCOUNT_REFUSED'::text]))),
    CONSTRAINT delivery_attempt_manual_has_note CHECK (((action <> 'MANUAL'::text) OR ((note IS NOT NULL) AND (note <> ''::text)))),
    CONSTRAINT delivery_attempt_note_check CHECK ((length(note) <= 2000)),
    CONSTRAINT delivery_attempt_outcome_check CHECK ((outcome = ANY (ARRAY['ACCEPTED'::text, 'ACCEPTED_REPLAY'::text, 'QUERY_FOUND'::text, 'QUERY_NOT_FOUND'::text, 'QUERY_FAILED'::text, 'TIMEOUT'::text, 'IO_ERROR'::text, 'IN_FLIGHT'::text, 'MALFORMED_RESPONSE'::text, 'HTTP_5XX'::text, 'THROTTLED'::text, 'CONNECT_FAILED'::text, 'GATEWAY_ERROR'::text, 'REJECTED'::text, 'ACCOUNT_REFUSED'::text, 'LEASE_EXPIRED'::text, 'PREF_DISABLED'::text, 'TTL_EXPIRED'::text, 'PREF_DISABLED_UNCERTAIN'::text, 'TTL_EXPIRED_UNCERTAIN'::text, 'CANCELLED'::text, 'CANCELLED_UNCERTAIN'::text, 'FALLBACK_NOT_NEEDED'::text, 'MANUAL_SENT'::text, 'MANUAL_FAILED'::text, 'RECEIPT_ACCEPTED'::text]))),
    CONSTRAINT delivery_attempt_provider_msg_id_check CHECK ((length(provider_msg_id) <= 500)),
    CONSTRAINT delivery_attempt_worker_check CHECK (((worker <> ''::text) AND (length(worker) <= 200)))
)
WITH (fillfactor='50');


--
-- Name: delivery_attempt_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.delivery_attempt ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.delivery_attempt_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: delivery_receipt; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.delivery_receipt (
    id bigint NOT NULL,
    task_id bigint NOT NULL,
    source text NOT NULL,
    event_id text NOT NULL,
    kind text NOT NULL,
    hard_bounce boolean DEFAULT false NOT NULL,
    effect text NOT NULL,
    provider_msg_id text,
    occurred_at timestamp with time zone,
    received_at timestamp with time zone DEFAULT now() NOT NULL,
    detail text,
    CONSTRAINT delivery_receipt_detail_check CHECK ((length(detail) <= 2000)),
    CONSTRAINT delivery_receipt_effect_check CHECK ((effect = ANY (ARRAY['SETTLED'::text, 'NOTED'::text, 'UNCHANGED'::text, 'CONTRADICTS'::text]))),
    CONSTRAINT delivery_receipt_event_id_check CHECK (((event_id <> ''::text) AND (length(event_id) <= 500))),
    CONSTRAINT delivery_receipt_hard_bounce_is_bounce CHECK (((NOT hard_bounce) OR (kind = 'BOUNCED'::text))),
    CONSTRAINT delivery_receipt_kind_check CHECK ((kind = ANY (ARRAY['ACCEPTED'::text, 'DELIVERED'::text, 'BOUNCED'::text, 'COMPLAINED'::text, 'UNDELIVERED'::text]))),
    CONSTRAINT delivery_receipt_provider_msg_id_check CHECK ((length(provider_msg_id) <= 500)),
    CONSTRAINT delivery_receipt_source_check CHECK ((source = ANY (ARRAY['standard-webhooks'::text, 'twilio'::text, 'postmark'::text, 'ses'::text])))
);


--
-- Name: delivery_receipt_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.delivery_receipt ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.delivery_receipt_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: delivery_task; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.delivery_task (
    id bigint NOT NULL,
    notification_id bigint NOT NULL,
    channel public.notifier_channel NOT NULL,
    state text DEFAULT 'PENDING'::text NOT NULL,
    attempt_count integer DEFAULT 0 NOT NULL,
    max_attempts integer NOT NULL,
    attempt_token uuid,
    lease_owner text,
    lease_until timestamp with time zone,
    next_attempt_at timestamp with time zone DEFAULT now(),
    outcome_uncertain boolean DEFAULT false NOT NULL,
    needs_review boolean DEFAULT false NOT NULL,
    provider_msg_id text COLLATE pg_catalog."C",
    last_error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    uncertain_since timestamp with time zone,
    receipt_at timestamp with time zone,
    ref public.notifier_task_ref DEFAULT (gen_random_uuid())::text NOT NULL COLLATE pg_catalog."C",
    account_refusals integer DEFAULT 0 NOT NULL,
    fallback_position smallint,
    CONSTRAINT delivery_task_account_refusals_check CHECK (((account_refusals >= 0) AND (account_refusals <= GREATEST(attempt_count, 0)))),
    CONSTRAINT delivery_task_attempt_count_check CHECK ((attempt_count >= 0)),
    CONSTRAINT delivery_task_fallback_position_check CHECK (((fallback_position >= 1) AND (fallback_position <= 32))),
    CONSTRAINT delivery_task_last_error_check CHECK ((length(last_error) <= 2000)),
    CONSTRAINT delivery_task_lease_owner_check CHECK ((length(lease_owner) <= 200)),
    CONSTRAINT delivery_task_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 100))),
    CONSTRAINT delivery_task_provider_msg_id_check CHECK ((length(provider_msg_id) <= 500)),
    CONSTRAINT delivery_task_review_only_unknown CHECK (((NOT needs_review) OR (state = 'UNKNOWN'::text))),
    CONSTRAINT delivery_task_scheduled_iff_waiting CHECK ((((next_attempt_at IS NOT NULL) = ((state = ANY (ARRAY['PENDING'::text, 'UNKNOWN'::text])) AND (NOT needs_review))) OR ((state = 'PENDING'::text) AND (next_attempt_at IS NULL) AND (fallback_position IS NOT NULL) AND (fallback_position > 1) AND (attempt_count = 0)))),
    CONSTRAINT delivery_task_sending_has_lease CHECK (((state <> 'SENDING'::text) OR ((lease_until IS NOT NULL) AND (attempt_token IS NOT NULL) AND (lease_owner IS NOT NULL)))),
    CONSTRAINT delivery_task_state_check CHECK ((state = ANY (ARRAY['PENDING'::text, 'SENDING'::text, 'SENT'::text, 'UNKNOWN'::text, 'FAILED'::text, 'SUPPRESSED'::text]))),
    CONSTRAINT delivery_task_uncertain_since_iff_uncertain CHECK (((uncertain_since IS NOT NULL) = outcome_uncertain)),
    CONSTRAINT delivery_task_unknown_is_uncertain CHECK (((state <> 'UNKNOWN'::text) OR outcome_uncertain))
);


--
-- Name: delivery_task_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.delivery_task ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.delivery_task_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: delivery_task_key; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.delivery_task_key (
    task_id bigint NOT NULL,
    notification_id bigint NOT NULL,
    channel public.notifier_channel NOT NULL,
    ref public.notifier_task_ref NOT NULL COLLATE pg_catalog."C"
);


--
-- Name: TABLE delivery_task_key; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.delivery_task_key IS 'A task''s unique keys, off the row the claim and the finish update (schema/001)';


--
-- Name: delivery_task_provider_msg; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.delivery_task_provider_msg (
    provider_msg_id text NOT NULL COLLATE pg_catalog."C",
    task_id bigint NOT NULL,
    CONSTRAINT delivery_task_provider_msg_provider_msg_id_check CHECK ((length(provider_msg_id) <= 500))
);


--
-- Name: TABLE delivery_task_provider_msg; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TABLE public.delivery_task_provider_msg IS 'The provider message ids of a task that delivery_task.provider_msg_id does not carry (schema/001)';


--
-- Name: notification; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.notification (
    id bigint NOT NULL,
    user_id text NOT NULL COLLATE pg_catalog."C",
    event_key text NOT NULL COLLATE pg_catalog."C",
    body text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    cancelled_at timestamp with time zone,
    cancel_note text,
    send_at timestamp with time zone,
    CONSTRAINT notification_body_check CHECK ((octet_length(body) <= 65536)),
    CONSTRAINT notification_cancel_note_check CHECK ((length(cancel_note) <= 2000)),
    CONSTRAINT notification_cancel_note_needs_cancel CHECK (((cancel_note IS NULL) OR (cancelled_at IS NOT NULL))),
    CONSTRAINT notification_event_key_check CHECK (((event_key <> ''::text) AND (length(event_key) <= 200))),
    CONSTRAINT notification_expires_after_created CHECK ((expires_at > created_at)),
    CONSTRAINT notification_send_before_expiry CHECK ((send_at < expires_at)),
    CONSTRAINT notification_user_id_check CHECK (((user_id <> ''::text) AND (length(user_id) <= 200)))
);


--
-- Name: notification_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.notification ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.notification_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: schema_migrations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.schema_migrations (
    version character varying NOT NULL
);


--
-- Name: channel_pause channel_pause_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.channel_pause
    ADD CONSTRAINT channel_pause_pkey PRIMARY KEY (channel);


--
-- Name: channel_pref channel_pref_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.channel_pref
    ADD CONSTRAINT channel_pref_pkey PRIMARY KEY (user_id, channel);


--
-- Name: channel_rate_limit channel_rate_limit_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.channel_rate_limit
    ADD CONSTRAINT channel_rate_limit_pkey PRIMARY KEY (channel);


--
-- Name: delivery_attempt delivery_attempt_attempt_token_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.delivery_attempt
    ADD CONSTRAINT delivery_attempt_attempt_token_key UNIQUE (attempt_token);


--
-- Name: delivery_attempt delivery_attempt_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.delivery_attempt
    ADD CONSTRAINT delivery_attempt_pkey PRIMARY KEY (id);


--
-- Name: delivery_attempt delivery_attempt_task_attempt_no_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.delivery_attempt
    ADD CONSTRAINT delivery_attempt_task_attempt_no_key UNIQUE (task_id, attempt_no);


--
-- Name: delivery_receipt delivery_receipt_event_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.delivery_receipt
    ADD CONSTRAINT delivery_receipt_event_key UNIQUE (source, event_id);


--
-- Name: delivery_receipt delivery_receipt_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.delivery_receipt
    ADD CONSTRAINT delivery_receipt_pkey PRIMARY KEY (id);


--
-- Name: delivery_task_key delivery_task_key_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.delivery_task_key
    ADD CONSTRAINT delivery_task_key_pkey PRIMARY KEY (task_id);


--
-- Name: delivery_task_key delivery_task_notification_channel_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.delivery_task_key
    ADD CONSTRAINT delivery_task_notification_channel_key UNIQUE (notification_id, channel);


--
-- Name: delivery_task delivery_task_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.delivery_task
    ADD CONSTRAINT delivery_task_pkey PRIMARY KEY (id);


--
-- Name: delivery_task_provider_msg delivery_task_provider_msg_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.delivery_task_provider_msg
    ADD CONSTRAINT delivery_task_provider_msg_pkey PRIMARY KEY (provider_msg_id, task_id);


--
-- Name: delivery_task_key delivery_task_ref_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.delivery_task_key
    ADD CONSTRAINT delivery_task_ref_key UNIQUE (ref);


--
-- Name: notification notification_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.notification
    ADD CONSTRAINT notification_pkey PRIMARY KEY (id);


--
-- Name: notification notification_user_event_key_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.notification
    ADD CONSTRAINT notification_user_event_key_key UNIQUE (user_id, event_key);


--
-- Name: schema_migrations schema_migrations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);


--
-- Name: delivery_attempt_late_accepted_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX delivery_attempt_late_accepted_idx ON public.delivery_attempt USING btree (task_id) WHERE (late_outcome = ANY (ARRAY['ACCEPTED'::text, 'ACCEPTED_REPLAY'::text, 'QUERY_FOUND'::text]));


--
-- Name: delivery_receipt_contradicts_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX delivery_receipt_contradicts_idx ON public.delivery_receipt USING btree (task_id) WHERE (effect = 'CONTRADICTS'::text);


--
-- Name: delivery_receipt_task_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX delivery_receipt_task_idx ON public.delivery_receipt USING btree (task_id);


--
-- Name: delivery_task_fallback_chain_key; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX delivery_task_fallback_chain_key ON public.delivery_task USING btree (notification_id, fallback_position) WHERE (fallback_position IS NOT NULL);


--
-- Name: delivery_task_finished_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX delivery_task_finished_idx ON public.delivery_task USING btree (updated_at, id) WHERE (state = ANY (ARRAY['SENT'::text, 'FAILED'::text, 'SUPPRESSED'::text]));


--
-- Name: delivery_task_leased_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX delivery_task_leased_idx ON public.delivery_task USING btree (channel, lease_until, id) WHERE (lease_until IS NOT NULL);


--
-- Name: delivery_task_parked_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX delivery_task_parked_idx ON public.delivery_task USING btree (id) WHERE needs_review;


--
-- Name: delivery_task_provider_msg_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX delivery_task_provider_msg_idx ON public.delivery_task USING btree (provider_msg_id) WHERE (provider_msg_id IS NOT NULL);


--
-- Name: delivery_task_provider_msg_task_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX delivery_task_provider_msg_task_idx ON public.delivery_task_provider_msg USING btree (task_id);


--
-- Name: delivery_task_ready_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX delivery_task_ready_idx ON public.delivery_task USING btree (channel, next_attempt_at, id) WHERE (next_attempt_at IS NOT NULL);


--
-- Name: delivery_task_receipt_contradicted_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX delivery_task_receipt_contradicted_idx ON public.delivery_task USING btree (id) WHERE ((receipt_at IS NOT NULL) AND (state = ANY (ARRAY['FAILED'::text, 'SUPPRESSED'::text])));


--
-- Name: delivery_task_receipt_unsettled_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX delivery_task_receipt_unsettled_idx ON public.delivery_task USING btree (id) WHERE ((receipt_at IS NOT NULL) AND (state = ANY (ARRAY['PENDING'::text, 'SENDING'::text, 'UNKNOWN'::text])));


--
-- Name: delivery_attempt delivery_attempt_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_attempt_append_only AFTER UPDATE ON public.delivery_attempt FOR EACH ROW WHEN ((NOT COALESCE(((new.id = old.id) AND (new.task_id = old.task_id) AND (new.attempt_no = old.attempt_no) AND (new.attempt_token = old.attempt_token) AND (new.action = old.action) AND (new.worker = old.worker) AND (new.started_at = old.started_at) AND (old.outcome IS NULL) AND (old.finished_at IS NULL) AND (new.outcome IS NOT NULL) AND (NOT (new.late_outcome IS DISTINCT FROM old.late_outcome)) AND (NOT (new.late_at IS DISTINCT FROM old.late_at)) AND (NOT (new.note IS DISTINCT FROM old.note)) AND ((old.provider_msg_id IS NULL) OR (NOT (new.provider_msg_id IS DISTINCT FROM old.provider_msg_id))) AND ((old.error IS NULL) OR (NOT (new.error IS DISTINCT FROM old.error)))), false))) EXECUTE FUNCTION public.delivery_attempt_append_only();


--
-- Name: TRIGGER delivery_attempt_append_only ON delivery_attempt; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER delivery_attempt_append_only ON public.delivery_attempt IS 'R3: rejects any UPDATE that rewrites what an attempt recorded (a finish''s first outcome passes by the WHEN)';


--
-- Name: delivery_attempt delivery_attempt_calls_follow_tasks; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_attempt_calls_follow_tasks AFTER INSERT ON public.delivery_attempt REFERENCING NEW TABLE AS inserted_attempts FOR EACH STATEMENT EXECUTE FUNCTION public.delivery_attempt_calls_follow_tasks();


--
-- Name: TRIGGER delivery_attempt_calls_follow_tasks ON delivery_attempt; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER delivery_attempt_calls_follow_tasks ON public.delivery_attempt IS 'R3: refuses a statement that opens a call attempt its task''s claim did not count';


--
-- Name: delivery_attempt delivery_attempt_fits_insert; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_attempt_fits_insert AFTER INSERT ON public.delivery_attempt FOR EACH ROW WHEN (((new.action <> ALL (ARRAY['SEND'::text, 'QUERY'::text, 'TOPIC_RESEND'::text])) OR (new.outcome IS NOT NULL) OR (new.late_outcome IS NOT NULL))) EXECUTE FUNCTION public.delivery_attempt_fits();


--
-- Name: TRIGGER delivery_attempt_fits_insert ON delivery_attempt; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER delivery_attempt_fits_insert ON public.delivery_attempt IS 'R3: refuses an attempt whose outcome does not fit its action or which its task did not just count (open calls: delivery_attempt_calls_follow_tasks)';


--
-- Name: delivery_attempt delivery_attempt_fits_update; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_attempt_fits_update AFTER UPDATE ON public.delivery_attempt FOR EACH ROW WHEN ((((new.outcome IS DISTINCT FROM old.outcome) OR (new.late_outcome IS DISTINCT FROM old.late_outcome)) AND (NOT COALESCE(((NOT (new.late_outcome IS DISTINCT FROM old.late_outcome)) AND (((new.action = ANY (ARRAY['SEND'::text, 'TOPIC_RESEND'::text])) AND (new.outcome = ANY (ARRAY['ACCEPTED'::text, 'ACCEPTED_REPLAY'::text, 'TIMEOUT'::text, 'IO_ERROR'::text, 'IN_FLIGHT'::text, 'MALFORMED_RESPONSE'::text, 'HTTP_5XX'::text, 'THROTTLED'::text, 'CONNECT_FAILED'::text, 'REJECTED'::text, 'GATEWAY_ERROR'::text, 'ACCOUNT_REFUSED'::text]))) OR ((new.action = 'QUERY'::text) AND (new.outcome = ANY (ARRAY['QUERY_FOUND'::text, 'QUERY_NOT_FOUND'::text, 'QUERY_FAILED'::text]))))), false)))) EXECUTE FUNCTION public.delivery_attempt_fits();


--
-- Name: TRIGGER delivery_attempt_fits_update ON delivery_attempt; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER delivery_attempt_fits_update ON public.delivery_attempt IS 'R3: refuses an outcome or late outcome that does not fit the attempt''s action (a call''s own outcome passes by the WHEN)';


--
-- Name: delivery_attempt delivery_attempt_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_attempt_no_truncate BEFORE TRUNCATE ON public.delivery_attempt FOR EACH STATEMENT EXECUTE FUNCTION public.delivery_attempt_no_truncate();


--
-- Name: TRIGGER delivery_attempt_no_truncate ON delivery_attempt; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER delivery_attempt_no_truncate ON public.delivery_attempt IS 'R3: rejects TRUNCATE, which fires no row trigger';


--
-- Name: delivery_attempt delivery_attempt_provider_msg_insert; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_attempt_provider_msg_insert AFTER INSERT ON public.delivery_attempt FOR EACH ROW WHEN ((new.provider_msg_id IS NOT NULL)) EXECUTE FUNCTION public.delivery_attempt_provider_msg_record();


--
-- Name: delivery_attempt delivery_attempt_provider_msg_update; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_attempt_provider_msg_update AFTER UPDATE ON public.delivery_attempt REFERENCING NEW TABLE AS new_attempts FOR EACH STATEMENT EXECUTE FUNCTION public.delivery_attempt_provider_msg_record();


--
-- Name: delivery_attempt delivery_attempt_retention_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_attempt_retention_only BEFORE DELETE ON public.delivery_attempt FOR EACH ROW EXECUTE FUNCTION public.delivery_attempt_retention_only();


--
-- Name: TRIGGER delivery_attempt_retention_only ON delivery_attempt; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER delivery_attempt_retention_only ON public.delivery_attempt IS 'R3: rejects DELETE of an open attempt or of an attempt of a task not in a terminal state';


--
-- Name: delivery_receipt delivery_receipt_append_only_row; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_receipt_append_only_row BEFORE DELETE OR UPDATE ON public.delivery_receipt FOR EACH ROW EXECUTE FUNCTION public.delivery_receipt_append_only();


--
-- Name: delivery_receipt delivery_receipt_append_only_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_receipt_append_only_truncate BEFORE TRUNCATE ON public.delivery_receipt FOR EACH STATEMENT EXECUTE FUNCTION public.delivery_receipt_append_only();


--
-- Name: delivery_task delivery_task_account_refusals; Type: TRIGGER; Schema: public; Owner: -
--

CREATE CONSTRAINT TRIGGER delivery_task_account_refusals AFTER UPDATE ON public.delivery_task DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ((new.account_refusals IS DISTINCT FROM old.account_refusals)) EXECUTE FUNCTION public.delivery_task_account_refusals();


--
-- Name: TRIGGER delivery_task_account_refusals ON delivery_task; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER delivery_task_account_refusals ON public.delivery_task IS 'refuses at commit a refund (account_refusals) without its ACCOUNT_REFUSED attempt';


--
-- Name: delivery_task delivery_task_attempts_kept; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_task_attempts_kept AFTER DELETE ON public.delivery_task REFERENCING OLD TABLE AS deleted_tasks FOR EACH STATEMENT EXECUTE FUNCTION public.delivery_task_attempts_kept();


--
-- Name: TRIGGER delivery_task_attempts_kept ON delivery_task; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER delivery_task_attempts_kept ON public.delivery_task IS 'R3: refuses a DELETE of tasks whose attempts stay';


--
-- Name: delivery_task delivery_task_evidence; Type: TRIGGER; Schema: public; Owner: -
--

CREATE CONSTRAINT TRIGGER delivery_task_evidence AFTER UPDATE ON public.delivery_task DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ((((new.attempt_count <> old.attempt_count) AND (new.state <> 'SENDING'::text)) OR ((old.state = 'SENDING'::text) AND (new.state = ANY (ARRAY['PENDING'::text, 'FAILED'::text]))) OR (old.outcome_uncertain AND (NOT new.outcome_uncertain)))) EXECUTE FUNCTION public.delivery_task_evidence();


--
-- Name: TRIGGER delivery_task_evidence ON delivery_task; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER delivery_task_evidence ON public.delivery_task IS 'R3, R6: refuses at commit a move whose attempt row is missing or says otherwise (a claim''s: delivery_task_holders_have_attempts)';


--
-- Name: delivery_task delivery_task_fallback; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_task_fallback AFTER UPDATE ON public.delivery_task FOR EACH ROW WHEN (((new.fallback_position IS NOT NULL) AND (new.state IS DISTINCT FROM old.state))) EXECUTE FUNCTION public.delivery_task_fallback();


--
-- Name: TRIGGER delivery_task_fallback ON delivery_task; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER delivery_task_fallback ON public.delivery_task IS 'R2: a fallback chain''s next task is released, or the rest suppressed, with the final state of the one before';


--
-- Name: delivery_task delivery_task_holders_have_attempts; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_task_holders_have_attempts AFTER UPDATE ON public.delivery_task REFERENCING NEW TABLE AS updated_tasks FOR EACH STATEMENT EXECUTE FUNCTION public.delivery_task_holders_have_attempts();


--
-- Name: TRIGGER delivery_task_holders_have_attempts ON delivery_task; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER delivery_task_holders_have_attempts ON public.delivery_task IS 'R3: refuses a statement that leaves a task SENDING without its open call attempt';


--
-- Name: delivery_task_key delivery_task_key_fixed; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_task_key_fixed BEFORE DELETE OR UPDATE ON public.delivery_task_key FOR EACH ROW EXECUTE FUNCTION public.delivery_task_key_fixed();


--
-- Name: delivery_task delivery_task_key_insert; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_task_key_insert AFTER INSERT ON public.delivery_task REFERENCING NEW TABLE AS new_tasks FOR EACH STATEMENT EXECUTE FUNCTION public.delivery_task_key_insert();


--
-- Name: delivery_task_key delivery_task_key_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_task_key_no_truncate BEFORE TRUNCATE ON public.delivery_task_key FOR EACH STATEMENT EXECUTE FUNCTION public.delivery_task_key_fixed();


--
-- Name: delivery_task_provider_msg delivery_task_provider_msg_fixed; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_task_provider_msg_fixed BEFORE DELETE OR UPDATE ON public.delivery_task_provider_msg FOR EACH ROW EXECUTE FUNCTION public.delivery_task_provider_msg_fixed();


--
-- Name: delivery_task_provider_msg delivery_task_provider_msg_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_task_provider_msg_no_truncate BEFORE TRUNCATE ON public.delivery_task_provider_msg FOR EACH STATEMENT EXECUTE FUNCTION public.delivery_task_provider_msg_fixed();


--
-- Name: delivery_task delivery_task_provider_msg_replaced; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_task_provider_msg_replaced AFTER UPDATE ON public.delivery_task FOR EACH ROW WHEN (((old.provider_msg_id IS NOT NULL) AND (new.provider_msg_id IS DISTINCT FROM old.provider_msg_id))) EXECUTE FUNCTION public.delivery_task_provider_msg_replaced();


--
-- Name: delivery_task delivery_task_ref_fixed; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_task_ref_fixed AFTER UPDATE ON public.delivery_task FOR EACH ROW WHEN (((old.ref)::text IS DISTINCT FROM (new.ref)::text)) EXECUTE FUNCTION public.delivery_task_ref_fixed();


--
-- Name: delivery_task delivery_task_state_machine; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER delivery_task_state_machine AFTER UPDATE ON public.delivery_task FOR EACH ROW WHEN (((NOT COALESCE(((new.id = old.id) AND (new.notification_id = old.notification_id) AND ((new.channel)::text = (old.channel)::text) AND (new.max_attempts = old.max_attempts) AND (new.created_at = old.created_at) AND (NOT (new.fallback_position IS DISTINCT FROM old.fallback_position)) AND (new.outcome_uncertain OR (NOT old.outcome_uncertain)) AND ((NOT old.outcome_uncertain) OR (new.uncertain_since = old.uncertain_since)) AND (old.outcome_uncertain OR (NOT new.outcome_uncertain) OR (new.uncertain_since <= old.updated_at)) AND (((new.state = 'SENDING'::text) AND (new.attempt_count = (old.attempt_count + 1)) AND (new.attempt_token IS DISTINCT FROM old.attempt_token) AND (new.lease_until > now()) AND (NOT (new.provider_msg_id IS DISTINCT FROM old.provider_msg_id)) AND (((old.state = ANY (ARRAY['PENDING'::text, 'UNKNOWN'::text])) AND (NOT old.needs_review) AND (old.next_attempt_at <= now())) OR ((old.state = 'SENDING'::text) AND (old.lease_until < now()) AND new.outcome_uncertain))) OR ((old.state = 'SENDING'::text) AND (new.state = ANY (ARRAY['SENT'::text, 'PENDING'::text, 'UNKNOWN'::text, 'FAILED'::text])) AND (new.attempt_count = old.attempt_count) AND (NOT (new.attempt_token IS DISTINCT FROM old.attempt_token)) AND (new.lease_until IS NULL) AND (new.lease_owner IS NULL) AND (NOT ((new.state = 'FAILED'::text) AND new.outcome_uncertain)) AND ((new.provider_msg_id IS NOT NULL) OR (old.provider_msg_id IS NULL))))), false)) AND (old.* IS DISTINCT FROM new.*))) EXECUTE FUNCTION public.delivery_task_state_machine();


--
-- Name: TRIGGER delivery_task_state_machine ON delivery_task; Type: COMMENT; Schema: public; Owner: -
--

COMMENT ON TRIGGER delivery_task_state_machine ON public.delivery_task IS 'R2, R6: refuses any UPDATE that is not a move of the delivery protocol (a claim or a finish passes by the WHEN)';


--
-- Name: delivery_receipt delivery_receipt_task_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.delivery_receipt
    ADD CONSTRAINT delivery_receipt_task_id_fkey FOREIGN KEY (task_id) REFERENCES public.delivery_task(id);


--
-- Name: delivery_task_key delivery_task_key_task_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.delivery_task_key
    ADD CONSTRAINT delivery_task_key_task_id_fkey FOREIGN KEY (task_id) REFERENCES public.delivery_task(id) ON DELETE CASCADE;


--
-- Name: delivery_task delivery_task_notification_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.delivery_task
    ADD CONSTRAINT delivery_task_notification_id_fkey FOREIGN KEY (notification_id) REFERENCES public.notification(id);


--
-- Name: delivery_task_provider_msg delivery_task_provider_msg_task_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.delivery_task_provider_msg
    ADD CONSTRAINT delivery_task_provider_msg_task_id_fkey FOREIGN KEY (task_id) REFERENCES public.delivery_task(id) ON DELETE CASCADE;


--
-- Name: delivery_attempt; Type: ROW SECURITY; Schema: public; Owner: -
--

ALTER TABLE public.delivery_attempt ENABLE ROW LEVEL SECURITY;

--
-- Name: delivery_attempt delivery_attempt_operator_select; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_attempt_operator_select ON public.delivery_attempt FOR SELECT TO notifier_operator USING (true);


--
-- Name: delivery_attempt delivery_attempt_receiver_select; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_attempt_receiver_select ON public.delivery_attempt FOR SELECT TO notifier_receiver USING (true);


--
-- Name: delivery_attempt delivery_attempt_worker_insert; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_attempt_worker_insert ON public.delivery_attempt FOR INSERT TO notifier_worker WITH CHECK ((action = ANY (ARRAY['SEND'::text, 'QUERY'::text, 'SKIP'::text, 'TOPIC_RESEND'::text])));


--
-- Name: delivery_attempt delivery_attempt_worker_select; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_attempt_worker_select ON public.delivery_attempt FOR SELECT TO notifier_worker USING (true);


--
-- Name: delivery_attempt delivery_attempt_worker_update; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_attempt_worker_update ON public.delivery_attempt FOR UPDATE TO notifier_worker USING ((action = ANY (ARRAY['SEND'::text, 'QUERY'::text, 'SKIP'::text, 'TOPIC_RESEND'::text]))) WITH CHECK ((action = ANY (ARRAY['SEND'::text, 'QUERY'::text, 'SKIP'::text, 'TOPIC_RESEND'::text])));


--
-- Name: delivery_task; Type: ROW SECURITY; Schema: public; Owner: -
--

ALTER TABLE public.delivery_task ENABLE ROW LEVEL SECURITY;

--
-- Name: delivery_task delivery_task_creator_insert; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_task_creator_insert ON public.delivery_task FOR INSERT TO notifier_creator WITH CHECK (((state = 'PENDING'::text) AND (attempt_count = 0) AND (EXISTS ( SELECT
   FROM (public.notification n
     JOIN public.channel_pref p ON (((p.user_id = n.user_id) AND ((p.channel)::text = (delivery_task.channel)::text))))
  WHERE ((n.id = delivery_task.notification_id) AND
        CASE
            WHEN (delivery_task.fallback_position > 1) THEN (delivery_task.next_attempt_at IS NULL)
            ELSE (delivery_task.next_attempt_at = GREATEST(n.send_at, now()))
        END AND
        CASE
            WHEN ((n.created_at = now()) AND (((((((n.xmin)::text)::bigint - (((pg_current_xact_id())::text)::bigint % '4294967296'::bigint)) + '6442450944'::bigint) % '4294967296'::bigint) - '2147483648'::bigint) >= 0)) THEN (pg_xact_status(((((((pg_current_xact_id())::text)::bigint + (((((n.xmin)::text)::bigint - (((pg_current_xact_id())::text)::bigint % '4294967296'::bigint)) + '6442450944'::bigint) % '4294967296'::bigint)) - '2147483648'::bigint))::text)::xid8) = 'in progress'::text)
            ELSE false
        END AND p.enabled)))));


--
-- Name: delivery_task delivery_task_creator_select; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_task_creator_select ON public.delivery_task FOR SELECT TO notifier_creator USING (true);


--
-- Name: delivery_task_key; Type: ROW SECURITY; Schema: public; Owner: -
--

ALTER TABLE public.delivery_task_key ENABLE ROW LEVEL SECURITY;

--
-- Name: delivery_task_key delivery_task_key_creator_select; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_task_key_creator_select ON public.delivery_task_key FOR SELECT TO notifier_creator USING (true);


--
-- Name: delivery_task_key delivery_task_key_operator_select; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_task_key_operator_select ON public.delivery_task_key FOR SELECT TO notifier_operator USING (true);


--
-- Name: delivery_task_key delivery_task_key_receiver_select; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_task_key_receiver_select ON public.delivery_task_key FOR SELECT TO notifier_receiver USING (true);


--
-- Name: delivery_task_key delivery_task_key_worker_select; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_task_key_worker_select ON public.delivery_task_key FOR SELECT TO notifier_worker USING (true);


--
-- Name: delivery_task delivery_task_operator_select; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_task_operator_select ON public.delivery_task FOR SELECT TO notifier_operator USING (true);


--
-- Name: delivery_task_provider_msg; Type: ROW SECURITY; Schema: public; Owner: -
--

ALTER TABLE public.delivery_task_provider_msg ENABLE ROW LEVEL SECURITY;

--
-- Name: delivery_task_provider_msg delivery_task_provider_msg_operator_select; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_task_provider_msg_operator_select ON public.delivery_task_provider_msg FOR SELECT TO notifier_operator USING (true);


--
-- Name: delivery_task_provider_msg delivery_task_provider_msg_receiver_select; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_task_provider_msg_receiver_select ON public.delivery_task_provider_msg FOR SELECT TO notifier_receiver USING (true);


--
-- Name: delivery_task_provider_msg delivery_task_provider_msg_worker_select; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_task_provider_msg_worker_select ON public.delivery_task_provider_msg FOR SELECT TO notifier_worker USING (true);


--
-- Name: delivery_task delivery_task_receiver_select; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_task_receiver_select ON public.delivery_task FOR SELECT TO notifier_receiver USING (true);


--
-- Name: delivery_task delivery_task_worker_select; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_task_worker_select ON public.delivery_task FOR SELECT TO notifier_worker USING (true);


--
-- Name: delivery_task delivery_task_worker_update; Type: POLICY; Schema: public; Owner: -
--

CREATE POLICY delivery_task_worker_update ON public.delivery_task FOR UPDATE TO notifier_worker USING ((NOT needs_review)) WITH CHECK (true);


--
-- PostgreSQL database dump complete
--

\unrestrict dbmate


--
-- Dbmate schema migrations
--

INSERT INTO public.schema_migrations (version) VALUES
    ('001'),
    ('002'),
    ('003'),
    ('004'),
    ('005');
