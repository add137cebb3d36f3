-- migrate:up
-- Send at a time (docs/protocol.md#send-at): a notification may carry a send time, and its tasks wait
-- until then. The send time is stored on the notification (NULL: at once), so that show and a duplicate
-- submission see it; each new task is due at greatest(send_at, now()): a send time already past is due
-- at once. A duplicate submission (created = false) changes nothing, whatever send time it carries.
ALTER TABLE notification ADD COLUMN send_at timestamptz;
-- A notification that expired before its tasks were due would only ever be written off (TTL_EXPIRED).
ALTER TABLE notification ADD CONSTRAINT notification_send_before_expiry CHECK (send_at < expires_at);
GRANT INSERT (send_at) ON notification TO notifier_creator;

-- Guards creation of work: as 026's policy, but a new task is due exactly when its notification says,
-- never earlier: at now() for a notification without a send time or with one already past, at its
-- send time otherwise. A task dated back (before now()) would jump the queue, and a task dated to any
-- other time than its notification's would be sent at a time nobody asked for; both are refused.
-- Scheduled tasks sit in delivery_task_ready_idx like any waiting task, ordered by their time: the
-- claim's range (next_attempt_at <= now()) stops before them (TestClaimPlanSkipsScheduledTasks).
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

-- notifier_create gains the parameter send_at (NULL: at once), after every earlier one, so that a call
-- by name or by position written for 026 keeps working. A send time at or after the expiry raises
-- invalid_parameter_value (22023) naming send_at, before anything is written.
DROP FUNCTION notifier_create(text, text, text, interval, integer, text[]);

CREATE FUNCTION notifier_create(
    user_id text,
    event_key text,
    body text,
    ttl interval DEFAULT interval '24 hours',
    max_attempts integer DEFAULT 3,
    channels text[] DEFAULT NULL,
    send_at timestamptz DEFAULT NULL)
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
    -- The send time must come before the expiry, on the database clock, as the notification's CHECK
    -- (notification_send_before_expiry) has it: a notification that expires before its tasks are due
    -- would only ever be written off. A send time already past is due at once.
    IF notifier_create.send_at IS NOT NULL AND notifier_create.send_at >= now() + notifier_create.ttl THEN
        RAISE EXCEPTION 'notifier_create: send_at % is at or after the expiry % (now() + ttl): it would expire before it is due',
                notifier_create.send_at, now() + notifier_create.ttl
            USING ERRCODE = 'invalid_parameter_value';
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
            INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
            SELECT new_id, p.channel, notifier_create.max_attempts, greatest(notifier_create.send_at, now())
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

COMMENT ON FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz) IS
    'Submits one event in the caller''s transaction: (notification_id, created); schema/026, 028, docs/protocol.md#create';

REVOKE EXECUTE ON FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz) TO notifier_creator;

-- migrate:down
DROP FUNCTION notifier_create(text, text, text, interval, integer, text[], timestamptz);

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

ALTER TABLE notification DROP COLUMN send_at;
