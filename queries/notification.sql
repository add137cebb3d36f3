-- name: NotificationInsert :one
-- Creates the logical notification unless (user_id, event_key) exists. Guards R1: the UNIQUE constraint,
-- not a prior SELECT, decides; a concurrent duplicate waits on the index and then inserts nothing, so
-- this returns no row (pgx.ErrNoRows) to every submitter but one.
INSERT INTO notification (user_id, event_key, body, expires_at)
VALUES (@user_id, @event_key, @body, now() + make_interval(secs => @ttl_seconds::float8))
ON CONFLICT (user_id, event_key) DO NOTHING
RETURNING id;

-- name: NotificationGetIDByUserEvent :one
-- Reads the notification that won the insert. Must run as a new statement (Read Committed) so it sees the
-- row committed by the concurrent winner, which the INSERT's own snapshot could not.
SELECT id
FROM notification
WHERE user_id = @user_id AND event_key = @event_key;

-- name: NotificationGet :one
-- One notification, for operators and tests.
SELECT id, user_id, event_key, body, created_at, expires_at
FROM notification
WHERE id = @id;
