-- migrate:up
-- Create in the caller's own transaction: notifier_create() submits one event (docs/protocol.md#create)
-- inside whatever transaction calls it, so an application's business write and its notification commit
-- or roll back together. It runs with the caller's rights (SECURITY INVOKER): only a role granted
-- notifier_creator may execute it, and every row it writes passes the same grants and policies as the
-- creator's own statements (schema/006, 010).
--
-- Savepoints. The creator's insert policy on delivery_task (010, 020, 024) required that this very
-- transaction inserted the notification: n.xmin = pg_current_xact_id()::xid. A notification inserted
-- inside a savepoint carries the subtransaction's xid, so the policy refused its tasks. The rule that
-- replaces it: a notification row that this statement can see and whose inserting xid is still in
-- progress was inserted by this transaction or one of its subtransactions, because another
-- transaction's uncommitted rows are invisible (and a transaction whose commit is not yet visible to our
-- snapshot is invisible too). pg_xact_status() answers "in progress" for the current transaction tree
-- first (TransactionIdIsCurrentTransactionId). It takes a full 64-bit xid; xmin holds the low 32 bits,
-- so the policy rebuilds the full id as the top-level xid plus d, the signed distance from the top
-- level's low 32 bits to xmin's, modulo 2^32: our subtransactions' xids come after the top level's,
-- across an epoch boundary too. A row older than our top-level xid (d < 0) is not ours and is not
-- looked up; a later transaction's xid was assigned, so pg_xact_status() can answer for it. A row's
-- raw xmin outlives freezing, and an ancient frozen row's 32 bits may coincide with one of our xids
-- (the old policy had that hole); so the policy first asks created_at = now(): the creator cannot set
-- created_at (006's column grant), a notification of this transaction was stamped with its start
-- time, and an old one was not. A rolled-back savepoint takes its notification with it, and with it
-- the right to add tasks.
--
-- The expression sits in the policy itself rather than in a helper function: its functions and
-- operators are bound when the policy is created (no caller's search_path reaches them), and a
-- creator's task insert costs what it did under 024 (10,000 tasks: 320-360 ms either way, where a SQL
-- helper with its own search_path took 380-500 ms).
ALTER POLICY delivery_task_creator_insert ON delivery_task
    WITH CHECK (state = 'PENDING' AND attempt_count = 0 AND next_attempt_at = now()
                AND EXISTS (SELECT FROM notification n
                            JOIN channel_pref p ON p.user_id = n.user_id AND p.channel = delivery_task.channel
                            WHERE n.id = delivery_task.notification_id
                              -- CASE, not AND: created_at and d >= 0 are asked before pg_xact_status
                              AND CASE WHEN n.created_at = now()
                                            AND (n.xmin::text::bigint - pg_current_xact_id()::text::bigint % 4294967296
                                                 + 6442450944) % 4294967296 - 2147483648 >= 0
                                       THEN pg_xact_status((pg_current_xact_id()::text::bigint
                                                            + (n.xmin::text::bigint - pg_current_xact_id()::text::bigint % 4294967296
                                                               + 6442450944) % 4294967296 - 2147483648)::text::xid8) = 'in progress'
                                       ELSE false END
                              AND p.enabled));

-- notifier_create: one event, in the caller's transaction. Named parameters with defaults, so that later
-- ones (a send time, a fallback chain) can be added without breaking a caller. The defaults are create's
-- (notifier create --ttl 24h --max-attempts 3) and so are the bounds (service.ValidateCreate); a bad
-- value raises invalid_parameter_value (22023) naming the parameter, before anything is written.
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
CREATE FUNCTION notifier_create(
    user_id text,
    event_key text,
    body text,
    ttl interval DEFAULT interval '24 hours',
    max_attempts integer DEFAULT 3,
    channels text[] DEFAULT NULL)
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
        -- The rule of the domain notifier_channel (schema/020).
        SELECT c INTO bad_channel FROM unnest(notifier_create.channels) AS c
        WHERE c IS NULL OR c !~ '^[a-z][a-z0-9_-]{0,31}$' LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'notifier_create: channels: % is not a channel name (1-32 of a-z, 0-9, _ or -, starting with a letter)',
                    coalesce(quote_literal(bad_channel), 'NULL')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;

    -- Twice at most: a winner read back as missing was deleted (retention) between the two statements.
    FOR try IN 1..2 LOOP
        new_id := NULL;
        IF isolation = 'read committed' THEN
            INSERT INTO notification (user_id, event_key, body, expires_at)
            VALUES (notifier_create.user_id, notifier_create.event_key, notifier_create.body, now() + notifier_create.ttl)
            ON CONFLICT (user_id, event_key) DO NOTHING
            RETURNING id INTO new_id;
        ELSE
            BEGIN
                INSERT INTO notification (user_id, event_key, body, expires_at)
                VALUES (notifier_create.user_id, notifier_create.event_key, notifier_create.body, now() + notifier_create.ttl)
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
            INSERT INTO delivery_task (notification_id, channel, max_attempts)
            SELECT new_id, p.channel, notifier_create.max_attempts
            FROM channel_pref p
            WHERE p.user_id = notifier_create.user_id AND p.enabled
              AND (notifier_create.channels IS NULL OR p.channel = ANY (notifier_create.channels))
            ORDER BY p.channel;
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

COMMENT ON FUNCTION notifier_create(text, text, text, interval, integer, text[]) IS
    'Submits one event in the caller''s transaction: (notification_id, created); schema/026, docs/protocol.md#create';

REVOKE EXECUTE ON FUNCTION notifier_create(text, text, text, interval, integer, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION notifier_create(text, text, text, interval, integer, text[]) TO notifier_creator;

-- migrate:down
DROP FUNCTION notifier_create(text, text, text, interval, integer, text[]);
ALTER POLICY delivery_task_creator_insert ON delivery_task
    WITH CHECK (state = 'PENDING' AND attempt_count = 0 AND next_attempt_at = now()
                AND EXISTS (SELECT FROM notification n
                            JOIN channel_pref p ON p.user_id = n.user_id AND p.channel = delivery_task.channel
                            WHERE n.id = delivery_task.notification_id
                              AND n.xmin = pg_current_xact_id()::xid
                              AND p.enabled));
