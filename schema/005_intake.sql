-- migrate:up
-- The intake: how work enters (notifier_create, in the caller's transaction), leaves before it is sent
-- (notifier_cancel) and moves along a fallback chain (delivery_task_fallback). Each function writes only
-- the moves of the state machine (003), which checks them as it checks a worker's.

-- notifier_create: one event, in the caller's own transaction (docs/protocol.md#create), so an
-- application's business write and its notification commit or roll back together. It runs with the
-- caller's rights (SECURITY INVOKER): only a role granted notifier_creator may execute it, and every row
-- it writes passes the same grants and policies as the creator's own statements (002). Named parameters
-- with defaults, each added after the ones before, so that a call by name or by position keeps working.
-- The defaults are create's (notifier create --ttl 24h --max-attempts 3) and so are the bounds
-- (service.ValidateCreate); a bad value raises invalid_parameter_value (22023) naming the parameter,
-- before anything is written.
--
-- R1: the UNIQUE (user_id, event_key) decides, as in NotificationInsert. At READ COMMITTED an insert that
-- meets a concurrent uncommitted one waits for it: if that one commits, nothing is inserted and a new
-- statement (a fresh snapshot) reads the winner back, created = false; if it rolls back, this insert
-- goes ahead, created = true. At REPEATABLE READ or SERIALIZABLE a winner that committed after this
-- transaction's snapshot cannot be read back: PostgreSQL refuses the insert with serialization_failure
-- (40001), which is raised again naming the isolation level; a winner the snapshot sees is read back.
-- The exception block (a subtransaction) is taken only at those levels: at READ COMMITTED a batch of
-- creates would otherwise open one subtransaction per event.
--
-- Tasks: one PENDING task per channel the user has enabled, restricted to channels when given (NULL:
-- every enabled channel). A named channel without an enabled preference gets no task; the caller can
-- tell from the tasks (service.Created.ChannelsWithoutPreference).
-- send_at (NULL: at once; docs/protocol.md#send-at): the notification's send time; its tasks are due at
-- greatest(send_at, now()). A send time at or after the expiry raises invalid_parameter_value naming
-- send_at, before anything is written. A duplicate submission changes nothing, whatever send time it
-- carries.
-- fallback (docs/protocol.md#fallback): an ordered list of channels, each called only when the one
-- before ended certainly not sent: one task per chain channel the user has enabled (R2), numbered from 1
-- in chain order (fallback_position); only the first is due, the others are PENDING with no
-- next_attempt_at ("unreleased"): the claim's index (delivery_task_ready_idx) does not hold them.
CREATE FUNCTION notifier_create(
    user_id text,
    event_key text,
    body text,
    ttl interval DEFAULT interval '24 hours',
    max_attempts integer DEFAULT 3,
    channels text[] DEFAULT NULL,
    send_at timestamptz DEFAULT NULL,
    fallback text[] DEFAULT NULL)
    RETURNS TABLE (notification_id bigint, created boolean)
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER
    SET search_path = pg_catalog, public, pg_temp
AS $$
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
$$;

COMMENT ON FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz, text[]) IS
    'Submits one event in the caller''s transaction: (notification_id, created); schema/005, docs/protocol.md#create';

REVOKE EXECUTE ON FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz, text[]) TO notifier_creator;

-- Cancel (notifier cancel): the submitter takes an event back. What the cancel may do to each task of
-- the notification depends on what the task may already have done:
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
--
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

COMMENT ON FUNCTION notifier_cancel(text, text, text) IS
    'The submitter takes an event back: waiting tasks end now (SUPPRESSED, or parked when uncertain), held ones at their next claim (schema/005)';

REVOKE EXECUTE ON FUNCTION notifier_cancel(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION notifier_cancel(text, text, text) TO notifier_creator;

-- What an unreleased task at position p of a notification's chain may become, read by the state machine
-- (003) and by delivery_task_fallback (one rule, one place):
--   NOT_NEEDED  an earlier task of the chain is SENT
--   WAIT        otherwise, when the notification was cancelled (the cancel settles its waiting tasks)
--   RELEASE     otherwise, when the task before ended certainly not sent: FAILED or SUPPRESSED
--   WAIT        otherwise: the task before is still waiting, SENDING, UNKNOWN or parked
-- Every role that updates tasks may read delivery_task and notification (002).
CREATE FUNCTION delivery_task_fallback_turn(notification_id bigint, fallback_position smallint) RETURNS text
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, public, pg_temp
AS $$
    SELECT CASE
        WHEN EXISTS (SELECT FROM public.delivery_task e
                     WHERE e.notification_id = $1 AND e.fallback_position < $2 AND e.state = 'SENT') THEN 'NOT_NEEDED'
        WHEN EXISTS (SELECT FROM public.notification n WHERE n.id = $1 AND n.cancelled_at IS NOT NULL) THEN 'WAIT'
        WHEN EXISTS (SELECT FROM public.delivery_task b
                     WHERE b.notification_id = $1 AND b.fallback_position = $2 - 1
                       AND b.state IN ('FAILED', 'SUPPRESSED')) THEN 'RELEASE'
        ELSE 'WAIT'
    END
$$;

COMMENT ON FUNCTION delivery_task_fallback_turn(bigint, smallint) IS
    'A fallback chain''s verdict on its task at a position: RELEASE, NOT_NEEDED or WAIT (schema/005)';

-- When a chain task becomes final, in the statement that made it final (whatever made it so: a finish,
-- a claim's settle, a resolve, a receipt, a cancel), the rest of its chain moves on, in the same
-- transaction:
--   SENT                    every unreleased later task: SUPPRESSED, with a SKIP attempt
--                           FALLBACK_NOT_NEEDED (the history says why it was never called)
--   FAILED or SUPPRESSED    the next task (position + 1) is released: next_attempt_at = now()
-- and nothing when the notification was cancelled (the cancel suppresses every waiting task). SECURITY
-- DEFINER: the operator (notifier_resolve) and the receipt path write as the owner already, a worker may
-- not write attempts of a task it does not hold; the state machine checks these moves all the same.
CREATE FUNCTION delivery_task_fallback() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, public, pg_temp
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

COMMENT ON FUNCTION delivery_task_fallback() IS
    'A fallback chain moves on in the statement that makes one of its tasks final: the next released, or the rest not needed (schema/005)';

REVOKE EXECUTE ON FUNCTION delivery_task_fallback() FROM PUBLIC;

CREATE TRIGGER delivery_task_fallback
    AFTER UPDATE ON delivery_task
    FOR EACH ROW
    WHEN (NEW.fallback_position IS NOT NULL AND NEW.state IS DISTINCT FROM OLD.state)
EXECUTE FUNCTION delivery_task_fallback();

COMMENT ON TRIGGER delivery_task_fallback ON delivery_task IS
    'R2: a fallback chain''s next task is released, or the rest suppressed, with the final state of the one before';

-- migrate:down
DROP TRIGGER delivery_task_fallback ON delivery_task;
DROP FUNCTION delivery_task_fallback();
DROP FUNCTION delivery_task_fallback_turn(bigint, smallint);
DROP FUNCTION notifier_cancel(text, text, text);
DROP FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz, text[]);
