-- name: NotificationCancel :many
-- The submitter takes an event back (notifier_cancel, schema/005): one row per task of the notification
-- of (user_id, event_key), with its state before and after and the cancel's effect on it (CANCELLED,
-- PARKED, AT_NEXT_CLAIM, ALREADY_PARKED, FINAL) and whether that changed anything. No row: no such
-- notification, or one without tasks. One statement: the cancel is recorded and the tasks it may settle
-- now are settled with their SKIP attempts, together or not at all.
SELECT c.notification_id::bigint AS notification_id, c.task_id::bigint AS task_id, c.channel::text AS channel,
       c.state_before::text AS state_before, c.state_after::text AS state_after, c.effect::text AS effect,
       c.changed::bool AS changed
FROM notifier_cancel(@user_id::text, @event_key::text, sqlc.narg('note')::text) AS c;
