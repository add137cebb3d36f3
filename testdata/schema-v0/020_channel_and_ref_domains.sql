-- migrate:up
-- A channel's name and a task's reference are checked when they are written, not on every later UPDATE
-- of the row. As table CHECKs (001, 003, 014, 016) PostgreSQL evaluated both regular expressions again
-- for every UPDATE of a task, although neither column ever changes after the INSERT (schema/010 and
-- 016 refuse it): a claim and a finish each ran three regular expressions per task, about 11% of the
-- server's instructions per delivery (docs/benchmarks/2026-12-04-hot-path-checks.md). A domain's CHECK
-- runs where a value is assigned to a column of that type (INSERT, or an UPDATE that sets the column),
-- so the same rule holds for every writer and costs nothing on an UPDATE that leaves the column alone.
-- One definition each, instead of one per table: notifier_channel for channel_pref, delivery_task and
-- channel_rate_limit; notifier_task_ref for delivery_task.ref.
--
-- Deploy: the domains come without a constraint first, so that changing the columns' type rewrites no
-- table (a domain with a constraint would); the constraints are then added, which reads each table once
-- to validate it, and delivery_task's two partial claim indexes (they hold only waiting and leased
-- tasks) are rebuilt. Writes to the three tables wait meanwhile: 9 seconds for a million tasks here.
-- A value that breaks the rule now fails with SQLSTATE 23514 naming notifier_channel_check or
-- notifier_task_ref_check (and the type), where it named the table's constraint before.
CREATE DOMAIN notifier_channel AS text;
COMMENT ON DOMAIN notifier_channel IS 'A channel''s name: lowercase, from a letter, at most 32 characters (schema/020)';
CREATE DOMAIN notifier_task_ref AS text;
COMMENT ON DOMAIN notifier_task_ref IS
    'What the service sends a channel to name a task: a random lowercase UUID, or task-<id> for tasks older than schema/016';

-- A column's type cannot change under a policy or a trigger that reads it: both are set up again below,
-- as they were.
DROP POLICY delivery_task_creator_insert ON delivery_task;
DROP TRIGGER delivery_task_ref_fixed ON delivery_task;
ALTER TABLE channel_pref ALTER COLUMN channel TYPE notifier_channel;
ALTER TABLE delivery_task ALTER COLUMN channel TYPE notifier_channel, ALTER COLUMN ref TYPE notifier_task_ref;
ALTER TABLE channel_rate_limit ALTER COLUMN channel TYPE notifier_channel;
CREATE POLICY delivery_task_creator_insert ON delivery_task FOR INSERT TO notifier_creator
    WITH CHECK (state = 'PENDING' AND attempt_count = 0 AND next_attempt_at = now()
                AND EXISTS (SELECT FROM notification n
                            JOIN channel_pref p ON p.user_id = n.user_id AND p.channel = delivery_task.channel
                            WHERE n.id = delivery_task.notification_id
                              AND n.xmin = pg_current_xact_id()::xid
                              AND p.enabled));
CREATE TRIGGER delivery_task_ref_fixed
    AFTER UPDATE ON delivery_task
    FOR EACH ROW WHEN (OLD.ref IS DISTINCT FROM NEW.ref)
    EXECUTE FUNCTION delivery_task_ref_fixed();

ALTER DOMAIN notifier_channel ADD CONSTRAINT notifier_channel_check CHECK (VALUE ~ '^[a-z][a-z0-9_-]{0,31}$');
ALTER DOMAIN notifier_task_ref ADD CONSTRAINT notifier_task_ref_check CHECK (
    VALUE ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' OR VALUE ~ '^task-[1-9][0-9]{0,18}$');
ALTER TABLE channel_pref DROP CONSTRAINT channel_pref_channel_check;
ALTER TABLE delivery_task DROP CONSTRAINT delivery_task_channel_check, DROP CONSTRAINT delivery_task_ref_check;
ALTER TABLE channel_rate_limit DROP CONSTRAINT channel_rate_limit_channel_check;

-- migrate:down
ALTER TABLE channel_pref ADD CONSTRAINT channel_pref_channel_check CHECK (channel ~ '^[a-z][a-z0-9_-]{0,31}$');
ALTER TABLE delivery_task ADD CONSTRAINT delivery_task_channel_check CHECK (channel ~ '^[a-z][a-z0-9_-]{0,31}$'),
    ADD CONSTRAINT delivery_task_ref_check CHECK (
        ref ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' OR ref ~ '^task-[1-9][0-9]{0,18}$');
ALTER TABLE channel_rate_limit ADD CONSTRAINT channel_rate_limit_channel_check CHECK (channel ~ '^[a-z][a-z0-9_-]{0,31}$');
DROP POLICY delivery_task_creator_insert ON delivery_task;
DROP TRIGGER delivery_task_ref_fixed ON delivery_task;
ALTER TABLE channel_pref ALTER COLUMN channel TYPE text;
ALTER TABLE delivery_task ALTER COLUMN channel TYPE text, ALTER COLUMN ref TYPE text;
ALTER TABLE channel_rate_limit ALTER COLUMN channel TYPE text;
CREATE POLICY delivery_task_creator_insert ON delivery_task FOR INSERT TO notifier_creator
    WITH CHECK (state = 'PENDING' AND attempt_count = 0 AND next_attempt_at = now()
                AND EXISTS (SELECT FROM notification n
                            JOIN channel_pref p ON p.user_id = n.user_id AND p.channel = delivery_task.channel
                            WHERE n.id = delivery_task.notification_id
                              AND n.xmin = pg_current_xact_id()::xid
                              AND p.enabled));
CREATE TRIGGER delivery_task_ref_fixed
    AFTER UPDATE ON delivery_task
    FOR EACH ROW WHEN (OLD.ref IS DISTINCT FROM NEW.ref)
    EXECUTE FUNCTION delivery_task_ref_fixed();
DROP DOMAIN notifier_task_ref;
DROP DOMAIN notifier_channel;
