-- migrate:up
-- Fallback chains (create --fallback push,sms,email; docs/protocol.md#fallback): an ordered list of
-- channels, each called only when the one before ended certainly not sent.
--   * notifier_create(fallback => ...) and TaskInsertForEnabledPrefs create one task per chain channel
--     the user has enabled (R2), numbered from 1 in chain order (fallback_position). Only the first is
--     due; the others are PENDING with no next_attempt_at ("unreleased"): the claim's index
--     (delivery_task_ready_idx, WHERE next_attempt_at IS NOT NULL) does not hold them.
--   * When a chain task becomes final, delivery_task_fallback (AFTER UPDATE, in the statement that made
--     it final, whatever made it so: a finish, a claim's settle, a resolve, a receipt, a cancel) acts
--     on the rest of its chain, in the same transaction:
--       SENT                    every unreleased later task: SUPPRESSED, with a SKIP attempt
--                               FALLBACK_NOT_NEEDED (the history says why it was never called)
--       FAILED or SUPPRESSED    the next task (position + 1) is released: next_attempt_at = now()
--     and nothing when the notification was cancelled (the cancel suppresses every waiting task).
--   * The state machine refuses every other move of an unreleased task, for every role: it is released
--     only when delivery_task_fallback_turn() says RELEASE, settled only by a cancel or when it says
--     NOT_NEEDED; it is never claimed, set aside, parked or settled by a receipt (it was never called).
-- The moves (schema/010's table gains two rows):
--   unreleased  PENDING, due now   release (delivery_task_fallback)   =   -
--   unreleased  SUPPRESSED         fallback not needed (same)         +1  SKIP FALLBACK_NOT_NEEDED

ALTER TABLE delivery_task ADD COLUMN fallback_position smallint;
ALTER TABLE delivery_task ADD CONSTRAINT delivery_task_fallback_position_check CHECK (fallback_position BETWEEN 1 AND 32);
-- One task per place in a chain: the release finds exactly one next task.
CREATE UNIQUE INDEX delivery_task_fallback_chain_key ON delivery_task (notification_id, fallback_position)
    WHERE fallback_position IS NOT NULL;
-- An unreleased task is the one waiting task without next_attempt_at: a later place in a chain, never
-- attempted. "IS NOT NULL AND": a CHECK passes on NULL, and fallback_position > 1 is NULL for a task
-- outside a chain.
ALTER TABLE delivery_task DROP CONSTRAINT delivery_task_scheduled_iff_waiting;
ALTER TABLE delivery_task ADD CONSTRAINT delivery_task_scheduled_iff_waiting
    CHECK ((next_attempt_at IS NOT NULL) = (state IN ('PENDING', 'UNKNOWN') AND NOT needs_review)
           OR (state = 'PENDING' AND next_attempt_at IS NULL AND fallback_position IS NOT NULL AND fallback_position > 1
               AND attempt_count = 0));

ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_outcome_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_outcome_check CHECK (outcome IN (
    'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
    'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
    'GATEWAY_ERROR',
    'REJECTED', 'ACCOUNT_REFUSED', 'LEASE_EXPIRED',
    'PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN',
    'CANCELLED', 'CANCELLED_UNCERTAIN', 'FALLBACK_NOT_NEEDED',
    'MANUAL_SENT', 'MANUAL_FAILED',
    'RECEIPT_ACCEPTED'));

-- What an unreleased task at position p of a notification's chain may become, read by the state machine
-- and by delivery_task_fallback (one rule, one place):
--   NOT_NEEDED  an earlier task of the chain is SENT
--   WAIT        otherwise, when the notification was cancelled (the cancel settles its waiting tasks)
--   RELEASE     otherwise, when the task before ended certainly not sent: FAILED or SUPPRESSED
--   WAIT        otherwise: the task before is still waiting, SENDING, UNKNOWN or parked
-- Every role that updates tasks may read delivery_task and notification (schema/006).
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
    'A fallback chain''s verdict on its task at a position: RELEASE, NOT_NEEDED or WAIT (schema/029)';

-- Rewrites a function from its own definition (as 027 does), each edit's text found exactly once (a
-- definition that no longer holds it stops the migration), so nothing else of it moves; backwards
-- undoes the same edits.
CREATE FUNCTION pg_temp.notifier_rewrite(fn regprocedure, edits text[], backwards boolean DEFAULT false) RETURNS void
    LANGUAGE plpgsql
AS $$
DECLARE
    def text := pg_get_functiondef(fn);
    old text;
    new text;
BEGIN
    FOR i IN 1 .. array_length(edits, 1) BY 2 LOOP
        old := CASE WHEN backwards THEN edits[i + 1] ELSE edits[i] END;
        new := CASE WHEN backwards THEN edits[i] ELSE edits[i + 1] END;
        IF (length(def) - length(replace(def, old, ''))) / length(old) <> 1 THEN
            RAISE EXCEPTION '029: % does not hold exactly once: %', fn, old;
        END IF;
        def := replace(def, old, new);
    END LOOP;
    EXECUTE def;
END
$$;

SELECT pg_temp.notifier_rewrite('delivery_task_state_machine()', ARRAY[
    $e$    parked   boolean; -- UNKNOWN, needs_review$e$,
    $e$    parked   boolean; -- UNKNOWN, needs_review
    unreleased boolean; -- PENDING in a fallback chain, not released yet (schema/029)$e$,
    $e$    due := waiting AND OLD.next_attempt_at <= now();$e$,
    $e$    due := waiting AND coalesce(OLD.next_attempt_at <= now(), false);
    unreleased := OLD.state = 'PENDING' AND OLD.next_attempt_at IS NULL;$e$,
    $e$        WHEN NEW.created_at IS DISTINCT FROM OLD.created_at THEN 'created_at'$e$,
    $e$        WHEN NEW.created_at IS DISTINCT FROM OLD.created_at THEN 'created_at'
        WHEN NEW.fallback_position IS DISTINCT FROM OLD.fallback_position THEN 'fallback_position'$e$,
    $e$        move := CASE
            WHEN (to_jsonb(OLD) ->> 'receipt_at') IS NULL$e$,
    $e$        move := CASE
            WHEN unreleased AND NEW.state = 'PENDING' AND NEW.next_attempt_at IS NOT NULL THEN 'release'
            WHEN unreleased AND NEW.state = 'SUPPRESSED' AND counted THEN 'settle'
            WHEN unreleased THEN NULL
            WHEN (to_jsonb(OLD) ->> 'receipt_at') IS NULL$e$,
    $e$                WHEN parked THEN 'a parked task changes only by its resolution (notifier_resolve)'$e$,
    $e$                WHEN unreleased THEN 'a fallback task not released yet changes only by its release, its settle as '
                                     'not needed, or a cancel (schema/029)'
                WHEN parked THEN 'a parked task changes only by its resolution (notifier_resolve)'$e$,
    $e$        ELSIF move = 'claim' AND OLD.state = 'SENDING' AND NOT expired THEN$e$,
    $e$        ELSIF move = 'release' AND NOT (
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
        ELSIF move = 'claim' AND OLD.state = 'SENDING' AND NOT expired THEN$e$,
    $e$n.cancelled_at IS NOT NULL))) THEN$e$,
    $e$n.cancelled_at IS NOT NULL))
                OR (move = 'settle' AND unreleased
                    AND public.delivery_task_fallback_turn(NEW.notification_id, NEW.fallback_position) = 'NOT_NEEDED')) THEN$e$]);

SELECT pg_temp.notifier_rewrite('delivery_task_evidence()', ARRAY[
    $e$WHEN 'SUPPRESSED' THEN 'a SKIP attempt PREF_DISABLED or CANCELLED'$e$,
    $e$WHEN 'SUPPRESSED' THEN 'a SKIP attempt PREF_DISABLED, CANCELLED or FALLBACK_NOT_NEEDED'$e$,
    $e$WHEN 'SUPPRESSED' THEN a.action = 'SKIP' AND a.outcome IN ('PREF_DISABLED', 'CANCELLED')$e$,
    $e$WHEN 'SUPPRESSED' THEN a.action = 'SKIP' AND a.outcome IN ('PREF_DISABLED', 'CANCELLED', 'FALLBACK_NOT_NEEDED')$e$,
    $e$AND NOT OLD.needs_review AND OLD.next_attempt_at > now()$e$,
    $e$AND NOT OLD.needs_review AND coalesce(OLD.next_attempt_at > now(), true)$e$,
    $e$AND a.outcome NOT IN ('CANCELLED', 'CANCELLED_UNCERTAIN') THEN
            want := 'a SKIP attempt CANCELLED or CANCELLED_UNCERTAIN (the task was not due: only a cancel settles it)';$e$,
    $e$AND a.outcome NOT IN ('CANCELLED', 'CANCELLED_UNCERTAIN', 'FALLBACK_NOT_NEEDED') THEN
            want := 'a SKIP attempt CANCELLED, CANCELLED_UNCERTAIN or FALLBACK_NOT_NEEDED (the task was not due: '
                    'only a cancel, or a fallback chain that no longer needs it, settles it)';$e$]);

SELECT pg_temp.notifier_rewrite('delivery_attempt_fits()', ARRAY[
    $e$'CANCELLED', 'CANCELLED_UNCERTAIN']$e$,
    $e$'CANCELLED', 'CANCELLED_UNCERTAIN', 'FALLBACK_NOT_NEEDED']$e$,
    $e$OR (NEW.outcome = 'CANCELLED' AND t.state = 'SUPPRESSED')) THEN$e$,
    $e$OR (NEW.outcome IN ('CANCELLED', 'FALLBACK_NOT_NEEDED') AND t.state = 'SUPPRESSED')) THEN$e$,
    $e$    ELSIF NEW.action = 'SKIP' AND NEW.outcome IN ('CANCELLED', 'CANCELLED_UNCERTAIN')
$e$,
    $e$    ELSIF NEW.action = 'SKIP' AND NEW.outcome = 'FALLBACK_NOT_NEEDED'
          AND NOT EXISTS (SELECT FROM public.delivery_task dt
                          WHERE dt.id = NEW.task_id AND dt.fallback_position IS NOT NULL
                            AND public.delivery_task_fallback_turn(dt.notification_id, dt.fallback_position) = 'NOT_NEEDED') THEN
        col := 'outcome';
        why := 'a SKIP FALLBACK_NOT_NEEDED for a task whose fallback chain has no earlier task SENT';
    ELSIF NEW.action = 'SKIP' AND NEW.outcome IN ('CANCELLED', 'CANCELLED_UNCERTAIN')
$e$]);

SELECT pg_temp.notifier_rewrite('notifier_create(text, text, text, interval, integer, text[], timestamptz)', ARRAY[
    $e$send_at timestamp with time zone DEFAULT NULL::timestamp with time zone)$e$,
    $e$send_at timestamp with time zone DEFAULT NULL::timestamp with time zone, fallback text[] DEFAULT NULL::text[])$e$,
    $e$    END IF;

    -- Twice at most$e$,
    $e$    END IF;
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

    -- Twice at most$e$,
    $e$            INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
            SELECT new_id, p.channel, notifier_create.max_attempts, greatest(notifier_create.send_at, now())
            FROM channel_pref p
            WHERE p.user_id = notifier_create.user_id AND p.enabled
              AND (notifier_create.channels IS NULL OR p.channel = ANY (notifier_create.channels))
            ORDER BY p.channel;$e$,
    $e$            -- A fallback chain: its channels with an enabled preference, numbered in chain order from 1;
            -- only the first is due (at the send time, or now: schema/028), the others wait unreleased
            -- (schema/029).
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
            ORDER BY c.channel;$e$]);

DROP FUNCTION pg_temp.notifier_rewrite(regprocedure, text[], boolean);

DROP FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz);
COMMENT ON FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz, text[]) IS
    'Submits one event in the caller''s transaction: (notification_id, created); schema/026, 028, 029, docs/protocol.md#create';
REVOKE EXECUTE ON FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz, text[]) TO notifier_creator;

-- The release and the "rest not needed", in the statement that makes a chain task final. SECURITY
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
    'A fallback chain moves on in the statement that makes one of its tasks final: the next released, or the rest not needed (schema/029)';

REVOKE EXECUTE ON FUNCTION delivery_task_fallback() FROM PUBLIC;

CREATE TRIGGER delivery_task_fallback
    AFTER UPDATE ON delivery_task
    FOR EACH ROW
    WHEN (NEW.fallback_position IS NOT NULL AND NEW.state IS DISTINCT FROM OLD.state)
EXECUTE FUNCTION delivery_task_fallback();

COMMENT ON TRIGGER delivery_task_fallback ON delivery_task IS
    'R2: a fallback chain''s next task is released, or the rest suppressed, with the final state of the one before';

-- The creator inserts a chain's tasks: the first due at its notification's time (schema/028), the
-- later ones unreleased.
GRANT INSERT (fallback_position) ON delivery_task TO notifier_creator;
ALTER POLICY delivery_task_creator_insert ON delivery_task
    WITH CHECK (state = 'PENDING' AND attempt_count = 0
                AND EXISTS (SELECT FROM notification n
                            JOIN channel_pref p ON p.user_id = n.user_id AND p.channel = delivery_task.channel
                            WHERE n.id = delivery_task.notification_id
                              AND CASE WHEN delivery_task.fallback_position > 1 THEN delivery_task.next_attempt_at IS NULL
                                       ELSE delivery_task.next_attempt_at = greatest(n.send_at, now()) END
                              -- CASE, not AND: created_at and d >= 0 are asked before pg_xact_status
                              AND CASE WHEN n.created_at = now()
                                            AND (n.xmin::text::bigint - pg_current_xact_id()::text::bigint % 4294967296
                                                 + 6442450944) % 4294967296 - 2147483648 >= 0
                                       THEN pg_xact_status((pg_current_xact_id()::text::bigint
                                                            + (n.xmin::text::bigint - pg_current_xact_id()::text::bigint % 4294967296
                                                               + 6442450944) % 4294967296 - 2147483648)::text::xid8) = 'in progress'
                                       ELSE false END
                              AND p.enabled));

-- migrate:down
DO $$
BEGIN
    IF EXISTS (SELECT FROM delivery_task WHERE fallback_position IS NOT NULL) THEN
        RAISE EXCEPTION 'cannot roll back 029_fallback: delivery_task holds fallback chains, which the earlier schema cannot release'
            USING ERRCODE = 'check_violation';
    END IF;
END
$$;
ALTER POLICY delivery_task_creator_insert ON delivery_task
    WITH CHECK (state = 'PENDING' AND attempt_count = 0
                AND EXISTS (SELECT FROM notification n
                            JOIN channel_pref p ON p.user_id = n.user_id AND p.channel = delivery_task.channel
                            WHERE n.id = delivery_task.notification_id
                              AND delivery_task.next_attempt_at = greatest(n.send_at, now())
                              -- CASE, not AND: created_at and d >= 0 are asked before pg_xact_status
                              AND CASE WHEN n.created_at = now()
                                            AND (n.xmin::text::bigint - pg_current_xact_id()::text::bigint % 4294967296
                                                 + 6442450944) % 4294967296 - 2147483648 >= 0
                                       THEN pg_xact_status((pg_current_xact_id()::text::bigint
                                                            + (n.xmin::text::bigint - pg_current_xact_id()::text::bigint % 4294967296
                                                               + 6442450944) % 4294967296 - 2147483648)::text::xid8) = 'in progress'
                                       ELSE false END
                              AND p.enabled));
REVOKE INSERT (fallback_position) ON delivery_task FROM notifier_creator;
DROP TRIGGER delivery_task_fallback ON delivery_task;
DROP FUNCTION delivery_task_fallback();
-- Rewrites a function from its own definition (as 027 does), each edit's text found exactly once (a
-- definition that no longer holds it stops the migration), so nothing else of it moves; backwards
-- undoes the same edits.
CREATE FUNCTION pg_temp.notifier_rewrite(fn regprocedure, edits text[], backwards boolean DEFAULT false) RETURNS void
    LANGUAGE plpgsql
AS $$
DECLARE
    def text := pg_get_functiondef(fn);
    old text;
    new text;
BEGIN
    FOR i IN 1 .. array_length(edits, 1) BY 2 LOOP
        old := CASE WHEN backwards THEN edits[i + 1] ELSE edits[i] END;
        new := CASE WHEN backwards THEN edits[i] ELSE edits[i + 1] END;
        IF (length(def) - length(replace(def, old, ''))) / length(old) <> 1 THEN
            RAISE EXCEPTION '029: % does not hold exactly once: %', fn, old;
        END IF;
        def := replace(def, old, new);
    END LOOP;
    EXECUTE def;
END
$$;

SELECT pg_temp.notifier_rewrite('notifier_create(text, text, text, interval, integer, text[], timestamptz, text[])', ARRAY[
    $e$send_at timestamp with time zone DEFAULT NULL::timestamp with time zone)$e$,
    $e$send_at timestamp with time zone DEFAULT NULL::timestamp with time zone, fallback text[] DEFAULT NULL::text[])$e$,
    $e$    END IF;

    -- Twice at most$e$,
    $e$    END IF;
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

    -- Twice at most$e$,
    $e$            INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
            SELECT new_id, p.channel, notifier_create.max_attempts, greatest(notifier_create.send_at, now())
            FROM channel_pref p
            WHERE p.user_id = notifier_create.user_id AND p.enabled
              AND (notifier_create.channels IS NULL OR p.channel = ANY (notifier_create.channels))
            ORDER BY p.channel;$e$,
    $e$            -- A fallback chain: its channels with an enabled preference, numbered in chain order from 1;
            -- only the first is due (at the send time, or now: schema/028), the others wait unreleased
            -- (schema/029).
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
            ORDER BY c.channel;$e$], backwards => true);

SELECT pg_temp.notifier_rewrite('delivery_attempt_fits()', ARRAY[
    $e$'CANCELLED', 'CANCELLED_UNCERTAIN']$e$,
    $e$'CANCELLED', 'CANCELLED_UNCERTAIN', 'FALLBACK_NOT_NEEDED']$e$,
    $e$OR (NEW.outcome = 'CANCELLED' AND t.state = 'SUPPRESSED')) THEN$e$,
    $e$OR (NEW.outcome IN ('CANCELLED', 'FALLBACK_NOT_NEEDED') AND t.state = 'SUPPRESSED')) THEN$e$,
    $e$    ELSIF NEW.action = 'SKIP' AND NEW.outcome IN ('CANCELLED', 'CANCELLED_UNCERTAIN')
$e$,
    $e$    ELSIF NEW.action = 'SKIP' AND NEW.outcome = 'FALLBACK_NOT_NEEDED'
          AND NOT EXISTS (SELECT FROM public.delivery_task dt
                          WHERE dt.id = NEW.task_id AND dt.fallback_position IS NOT NULL
                            AND public.delivery_task_fallback_turn(dt.notification_id, dt.fallback_position) = 'NOT_NEEDED') THEN
        col := 'outcome';
        why := 'a SKIP FALLBACK_NOT_NEEDED for a task whose fallback chain has no earlier task SENT';
    ELSIF NEW.action = 'SKIP' AND NEW.outcome IN ('CANCELLED', 'CANCELLED_UNCERTAIN')
$e$], backwards => true);

SELECT pg_temp.notifier_rewrite('delivery_task_evidence()', ARRAY[
    $e$WHEN 'SUPPRESSED' THEN 'a SKIP attempt PREF_DISABLED or CANCELLED'$e$,
    $e$WHEN 'SUPPRESSED' THEN 'a SKIP attempt PREF_DISABLED, CANCELLED or FALLBACK_NOT_NEEDED'$e$,
    $e$WHEN 'SUPPRESSED' THEN a.action = 'SKIP' AND a.outcome IN ('PREF_DISABLED', 'CANCELLED')$e$,
    $e$WHEN 'SUPPRESSED' THEN a.action = 'SKIP' AND a.outcome IN ('PREF_DISABLED', 'CANCELLED', 'FALLBACK_NOT_NEEDED')$e$,
    $e$AND NOT OLD.needs_review AND OLD.next_attempt_at > now()$e$,
    $e$AND NOT OLD.needs_review AND coalesce(OLD.next_attempt_at > now(), true)$e$,
    $e$AND a.outcome NOT IN ('CANCELLED', 'CANCELLED_UNCERTAIN') THEN
            want := 'a SKIP attempt CANCELLED or CANCELLED_UNCERTAIN (the task was not due: only a cancel settles it)';$e$,
    $e$AND a.outcome NOT IN ('CANCELLED', 'CANCELLED_UNCERTAIN', 'FALLBACK_NOT_NEEDED') THEN
            want := 'a SKIP attempt CANCELLED, CANCELLED_UNCERTAIN or FALLBACK_NOT_NEEDED (the task was not due: '
                    'only a cancel, or a fallback chain that no longer needs it, settles it)';$e$], backwards => true);

SELECT pg_temp.notifier_rewrite('delivery_task_state_machine()', ARRAY[
    $e$    parked   boolean; -- UNKNOWN, needs_review$e$,
    $e$    parked   boolean; -- UNKNOWN, needs_review
    unreleased boolean; -- PENDING in a fallback chain, not released yet (schema/029)$e$,
    $e$    due := waiting AND OLD.next_attempt_at <= now();$e$,
    $e$    due := waiting AND coalesce(OLD.next_attempt_at <= now(), false);
    unreleased := OLD.state = 'PENDING' AND OLD.next_attempt_at IS NULL;$e$,
    $e$        WHEN NEW.created_at IS DISTINCT FROM OLD.created_at THEN 'created_at'$e$,
    $e$        WHEN NEW.created_at IS DISTINCT FROM OLD.created_at THEN 'created_at'
        WHEN NEW.fallback_position IS DISTINCT FROM OLD.fallback_position THEN 'fallback_position'$e$,
    $e$        move := CASE
            WHEN (to_jsonb(OLD) ->> 'receipt_at') IS NULL$e$,
    $e$        move := CASE
            WHEN unreleased AND NEW.state = 'PENDING' AND NEW.next_attempt_at IS NOT NULL THEN 'release'
            WHEN unreleased AND NEW.state = 'SUPPRESSED' AND counted THEN 'settle'
            WHEN unreleased THEN NULL
            WHEN (to_jsonb(OLD) ->> 'receipt_at') IS NULL$e$,
    $e$                WHEN parked THEN 'a parked task changes only by its resolution (notifier_resolve)'$e$,
    $e$                WHEN unreleased THEN 'a fallback task not released yet changes only by its release, its settle as '
                                     'not needed, or a cancel (schema/029)'
                WHEN parked THEN 'a parked task changes only by its resolution (notifier_resolve)'$e$,
    $e$        ELSIF move = 'claim' AND OLD.state = 'SENDING' AND NOT expired THEN$e$,
    $e$        ELSIF move = 'release' AND NOT (
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
        ELSIF move = 'claim' AND OLD.state = 'SENDING' AND NOT expired THEN$e$,
    $e$n.cancelled_at IS NOT NULL))) THEN$e$,
    $e$n.cancelled_at IS NOT NULL))
                OR (move = 'settle' AND unreleased
                    AND public.delivery_task_fallback_turn(NEW.notification_id, NEW.fallback_position) = 'NOT_NEEDED')) THEN$e$], backwards => true);

DROP FUNCTION pg_temp.notifier_rewrite(regprocedure, text[], boolean);

DROP FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz, text[]);
COMMENT ON FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz) IS
    'Submits one event in the caller''s transaction: (notification_id, created); schema/026, 028, docs/protocol.md#create';
REVOKE EXECUTE ON FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz) TO notifier_creator;
DROP FUNCTION delivery_task_fallback_turn(bigint, smallint);
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
ALTER TABLE delivery_task DROP CONSTRAINT delivery_task_scheduled_iff_waiting;
ALTER TABLE delivery_task ADD CONSTRAINT delivery_task_scheduled_iff_waiting
    CHECK ((next_attempt_at IS NOT NULL) = (state IN ('PENDING', 'UNKNOWN') AND NOT needs_review));
DROP INDEX delivery_task_fallback_chain_key;
ALTER TABLE delivery_task DROP COLUMN fallback_position;
