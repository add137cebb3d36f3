-- Retention: pruning finished history (notifier prune, Notifier.Prune). Only the table owner may run
-- these today: none of the roles of schema/002 may DELETE. Every statement here is one short
-- transaction of at most @batch_size rows per table, so workers and operators never wait on it for long.
--
-- What may go, and only that: a task in a terminal state (SENT, FAILED, SUPPRESSED: final in the
-- protocol, no query in queries/ moves a task out of one) whose last change is older than the retention
-- period, with all its attempts and receipts; and a notification once it has no task left. Never a PENDING, SENDING or
-- UNKNOWN task (parked or not), never an attempt without its task, never a notification that still has a
-- task. Deleting a notification ends its dedupe: the same (user_id, event_key) submitted again afterwards
-- creates a new notification, so the retention period is also the shortest dedupe window.

-- name: RetentionPruneBatch :one
-- Deletes up to @batch_size finished tasks whose updated_at is older than @older_than_seconds, their
-- attempts, and the notifications left without any task. Guards:
--   * never an unfinished or parked task: only state IN (SENT, FAILED, SUPPRESSED) is picked, and the row
--     lock (FOR UPDATE ... SKIP LOCKED) re-checks that condition on the row's latest version; a terminal
--     state is final, so it still holds when the row goes. A task with an open attempt (cannot happen
--     through queries/) is left alone: delivery_attempt_retention_only would refuse it.
--   * attempts only with their task: attempts are deleted for the picked tasks only, and all of them
--     before the first task (del_tasks waits for the count of del_attempts), so the trigger
--     delivery_attempt_retention_only still finds each task in its terminal state; the trigger
--     delivery_task_attempts_kept (schema/003) refuses a task deleted while one of its attempts stays.
--   * a notification only when none of its tasks remains: it goes only if the tasks this statement
--     deletes are all the tasks it has; any other task of it, finished or not, keeps it (the foreign key
--     from delivery_task would refuse it anyway).
-- Walks the partial index delivery_task_finished_idx (schema/001) in (updated_at, id) order from the
-- caller's cursor (@after_updated_at, @after_id: the last row of the previous batch, -infinity and 0 at
-- first), so a batch neither reads unfinished tasks nor re-reads the index entries of rows already
-- deleted. Returns picked = 0 when nothing is left.
WITH picked AS (
    SELECT t.id, t.notification_id, t.updated_at
    FROM delivery_task t
    WHERE t.state IN ('SENT', 'FAILED', 'SUPPRESSED')
      AND t.updated_at < now() - make_interval(secs => @older_than_seconds::float8)
      AND (t.updated_at, t.id) > (@after_updated_at::timestamptz, @after_id::bigint)
      -- a correlated count (one probe of delivery_attempt_task_attempt_no_key per task), not NOT EXISTS:
      -- the planner would turn that into an anti join that scans all of delivery_attempt every batch
      AND (SELECT count(*) FROM delivery_attempt a WHERE a.task_id = t.id AND a.outcome IS NULL) = 0
    ORDER BY t.updated_at, t.id
    LIMIT @batch_size::int
    FOR UPDATE OF t SKIP LOCKED
), del_attempts AS (
    DELETE FROM delivery_attempt a
    USING picked p
    WHERE a.task_id = p.id
    RETURNING a.id
), attempts_deleted AS (
    SELECT count(*) AS n FROM del_attempts
), del_receipts AS (
    -- a final task's receipts go with it (delivery_receipt_append_only allows exactly that)
    DELETE FROM delivery_receipt r
    USING picked p
    WHERE r.task_id = p.id
    RETURNING r.id
), receipts_deleted AS (
    SELECT count(*) AS n FROM del_receipts
), del_tasks AS (
    DELETE FROM delivery_task t
    USING picked p
    WHERE t.id = p.id
      AND (SELECT n FROM attempts_deleted) >= 0 -- every attempt goes before the first task
      AND (SELECT n FROM receipts_deleted) >= 0 -- and every receipt
    RETURNING t.id, t.notification_id
), deleted_per_notification AS (
    SELECT d.notification_id, count(*) AS tasks FROM del_tasks d GROUP BY d.notification_id
), del_notifications AS (
    DELETE FROM notification n
    USING deleted_per_notification dn
    WHERE n.id = dn.notification_id
      -- all its tasks go in this statement (the statement's snapshot still sees them all, and their key
      -- rows, which the cascade deletes after it): a correlated count through
      -- delivery_task_notification_channel_key (schema/001), never a scan of delivery_task
      AND (SELECT count(*) FROM delivery_task_key k WHERE k.notification_id = n.id) = dn.tasks
    RETURNING n.id
), last_picked AS (
    SELECT p.updated_at, p.id FROM picked p ORDER BY p.updated_at DESC, p.id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM picked)::bigint            AS picked,
       (SELECT count(*) FROM del_tasks)::bigint         AS tasks,
       (SELECT n FROM attempts_deleted)::bigint         AS attempts,
       (SELECT n FROM receipts_deleted)::bigint         AS receipts,
       (SELECT count(*) FROM del_notifications)::bigint AS notifications,
       coalesce((SELECT l.updated_at FROM last_picked l), @after_updated_at::timestamptz)::timestamptz AS last_updated_at,
       coalesce((SELECT l.id FROM last_picked l), @after_id::bigint)::bigint AS last_id;

-- name: RetentionPruneEmptyNotifications :one
-- Deletes, among the next @batch_size notifications after @after_id (in id order), those created before
-- the retention period that have no task: the ones created for a user with no enabled channel, and any
-- whose last tasks were pruned by two concurrent batches that each saw the other's task. Guards: a
-- notification with any task, finished or not, stays; a notification gets tasks only in the transaction
-- that creates it (TaskInsertForEnabledPrefs), so one seen committed without a task never gets one. Reads
-- exactly @batch_size rows of the primary key per call (walked), however many it deletes; the caller
-- stops after a batch without any notification older than the period (old = 0): ids grow with
-- created_at, up to the length of one create transaction.
WITH walked AS (
    SELECT n.id, n.created_at < now() - make_interval(secs => @older_than_seconds::float8) AS old
    FROM notification n
    WHERE n.id > @after_id::bigint
    ORDER BY n.id
    LIMIT @batch_size::int
), deleted AS (
    DELETE FROM notification n
    USING walked w
    WHERE n.id = w.id
      AND w.old
      AND NOT EXISTS (SELECT FROM delivery_task_key k WHERE k.notification_id = n.id)
    RETURNING n.id
)
SELECT (SELECT count(*) FROM walked)::bigint                    AS walked,
       (SELECT count(*) FROM walked w WHERE w.old)::bigint      AS old,
       (SELECT count(*) FROM deleted)::bigint                   AS notifications,
       coalesce((SELECT max(w.id) FROM walked w), @after_id::bigint)::bigint AS last_id;

-- name: RetentionPreview :one
-- What a prune with this period would delete now, without deleting anything (notifier prune --dry-run):
-- finished tasks older than the period without an open attempt, their attempts and receipts, and the notifications
-- older than the period all of whose tasks (possibly none) are among them. Reads whole tables; for an
-- operator's look before the first prune, not for a schedule.
WITH prunable AS (
    SELECT t.id, t.notification_id
    FROM delivery_task t
    WHERE t.state IN ('SENT', 'FAILED', 'SUPPRESSED')
      AND t.updated_at < now() - make_interval(secs => @older_than_seconds::float8)
      AND NOT EXISTS (SELECT FROM delivery_attempt a WHERE a.task_id = t.id AND a.outcome IS NULL)
)
SELECT (SELECT count(*) FROM prunable)::bigint AS tasks,
       (SELECT count(*) FROM delivery_attempt a JOIN prunable p ON p.id = a.task_id)::bigint AS attempts,
       (SELECT count(*) FROM delivery_receipt r JOIN prunable p ON p.id = r.task_id)::bigint AS receipts,
       (SELECT count(*)
        FROM notification n
        WHERE n.created_at < now() - make_interval(secs => @older_than_seconds::float8)
          AND NOT EXISTS (SELECT FROM delivery_task_key k
                          JOIN delivery_task t ON t.id = k.task_id
                          WHERE k.notification_id = n.id
                            AND NOT (t.state IN ('SENT', 'FAILED', 'SUPPRESSED')
                                     AND t.updated_at < now() - make_interval(secs => @older_than_seconds::float8)
                                     AND NOT EXISTS (SELECT FROM delivery_attempt a
                                                     WHERE a.task_id = t.id AND a.outcome IS NULL))))::bigint AS notifications;
