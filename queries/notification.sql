-- name: NotificationGet :one
-- One notification, for operators (the console's task page shows its user, event key and body), show
-- (with its cancel, if any) and tests.
SELECT id, user_id, event_key, body, created_at, expires_at, cancelled_at, cancel_note, send_at
FROM notification
WHERE id = @id;

-- name: NotificationInsert :many
-- Creates the logical notifications of a batch of events (one for notifier create, up to thousands for
-- create --jsonl), one per (user_id, event_key) that does not exist yet. Guards R1: the UNIQUE
-- constraint, not a prior SELECT, decides; an event that exists (from before, from a concurrent
-- submitter, whose insert this one waits for on the index, or earlier in this very batch) inserts
-- nothing and returns no row, to every submitter but one. Rows go in (user_id, event_key) order, the first of equal
-- keys first (its body wins), so that two batches lock shared keys in the same order and cannot
-- deadlock on each other. Each event's send time (schema/005) is @send_ats (RFC 3339) or, relative to
-- the database clock like the expiry, @send_delay_seconds; '' and 0 mean at once (NULL). A send time at
-- or after the expiry fails the whole batch (CHECK notification_send_before_expiry), nothing written.
INSERT INTO notification (user_id, event_key, body, expires_at, send_at)
SELECT e.user_id, e.event_key, e.body, now() + make_interval(secs => e.ttl_seconds),
       coalesce(nullif(e.send_at, '')::timestamptz,
                now() + make_interval(secs => nullif(e.send_delay_seconds, 0)))
FROM (SELECT unnest(@user_ids::text[]) AS user_id, unnest(@event_keys::text[]) AS event_key,
             unnest(@bodies::text[]) AS body, unnest(@ttl_seconds::float8[]) AS ttl_seconds,
             unnest(@send_ats::text[]) AS send_at, unnest(@send_delay_seconds::float8[]) AS send_delay_seconds,
             generate_series(1, cardinality(@user_ids::text[])) AS n) AS e
ORDER BY e.user_id, e.event_key, e.n
ON CONFLICT (user_id, event_key) DO NOTHING
RETURNING id, user_id, event_key;

-- name: NotificationListWithTasks :many
-- The notifications and tasks of a batch's events that its insert did not create (they existed, or
-- repeat an earlier line): a new statement, so it sees a concurrent winner's committed rows and this
-- transaction's own. A notification without a task (no channel enabled) comes back once, with NULLs.
-- The tasks come from their key rows (schema/001), which hold all this reads of them.
SELECT n.id AS notification_id, n.user_id, n.event_key, k.task_id, k.channel, k.ref
FROM (SELECT DISTINCT unnest(@user_ids::text[]) AS user_id, unnest(@event_keys::text[]) AS event_key) AS e
JOIN notification n ON n.user_id = e.user_id AND n.event_key = e.event_key
LEFT JOIN delivery_task_key k ON k.notification_id = n.id
ORDER BY n.id, k.channel;

-- name: NotificationListBodies :many
-- The bodies of a page of notifications (the console's list shows each listed task's message), in one
-- statement rather than one per task. Read only, by primary key; the operator role may read notification
-- (schema/002).
SELECT id, body
FROM notification
WHERE id = ANY (@ids::bigint[]);

-- name: NotificationGetByUserEvent :one
-- The one notification of (user_id, event_key) (notifier show --user --event-key), the same columns as
-- NotificationGet. Read only; R1 makes it at most one row: the lookup is the UNIQUE key
-- notification_user_event_key_key that deduplicates every create, so a script finds the event by the
-- key it submitted it under.
SELECT id, user_id, event_key, body, created_at, expires_at, cancelled_at, cancel_note, send_at
FROM notification
WHERE user_id = @user_id AND event_key = @event_key;

-- name: NotificationCreateInTx :many
-- Submits a batch of events through notifier_create (schema/005), one call per event, in the caller's
-- transaction and at its isolation level: what Notifier.CreateTx and CreateBatchTx run. The calls go in
-- (user_id, event_key) order, the first of equal keys first, as NotificationInsert sorts its rows, so
-- that batches of either create path lock shared keys in the same order and cannot deadlock on each
-- other; the answers come back in input order (n, from 1). @channel_lists holds each event's channels
-- joined by commas (a channel name has none), or an empty string for every enabled channel; @send_ats
-- and @send_delay_seconds are each event's send time as NotificationInsert takes them;
-- @fallback_lists each event's fallback chain the same way as the channels, or an empty string for none.
SELECT e.n::int AS n, c.notification_id::bigint AS notification_id, c.created::boolean AS created
FROM (SELECT s.*
      FROM (SELECT unnest(@user_ids::text[]) AS user_id, unnest(@event_keys::text[]) AS event_key,
                   unnest(@bodies::text[]) AS body, unnest(@ttl_seconds::float8[]) AS ttl_seconds,
                   unnest(@max_attempts::int[]) AS max_attempts, unnest(@channel_lists::text[]) AS channel_list,
                   unnest(@send_ats::text[]) AS send_at, unnest(@send_delay_seconds::float8[]) AS send_delay_seconds,
                   unnest(@fallback_lists::text[]) AS fallback_list,
                   generate_series(1, cardinality(@user_ids::text[])) AS n) AS s
      ORDER BY s.user_id, s.event_key, s.n) AS e
CROSS JOIN LATERAL notifier_create(user_id => e.user_id, event_key => e.event_key, body => e.body,
                                   ttl => make_interval(secs => e.ttl_seconds), max_attempts => e.max_attempts,
                                   channels => string_to_array(nullif(e.channel_list, ''), ','),
                                   send_at => coalesce(nullif(e.send_at, '')::timestamptz,
                                                       now() + make_interval(secs => nullif(e.send_delay_seconds, 0))),
                                   fallback => string_to_array(nullif(e.fallback_list, ''), ',')) AS c
ORDER BY e.n;

-- name: NotificationTasks :many
-- The tasks of some notifications, for create's answer (CreateTx reads them back after notifier_create:
-- its own new tasks, or the winner's), from their key rows (schema/001).
SELECT k.notification_id, k.task_id AS id, k.channel, k.ref
FROM delivery_task_key k
WHERE k.notification_id = ANY (@notification_ids::bigint[])
ORDER BY k.notification_id, k.channel;
