-- migrate:up
-- A task's channel reference: what the service sends to a channel to name this task (the query's ref,
-- the Idempotency-Key ntf-<ref>, the webhook-id, the Web Push Topic, the Message-ID) and what a
-- provider's receipt carries back. Until now it was derived from the task id (task-<id>). Ids are not
-- unique across the database's life: a restore from a backup, or a failover to a standby that had not
-- received the last transactions, hands the lost ids out again, while the channel still remembers the
-- keys it saw. A new task with an old id was then answered with the old message's replay (recorded SENT,
-- never sent), and a query found another task's message. The ref is therefore random, chosen by the
-- database when the task is created (gen_random_uuid: 122 random bits), stored with the task and never
-- changed (delivery_task_ref_fixed below), so that what was sent to a channel never names another task.
--
-- Tasks that exist now keep the reference they were sent with (task-<id>): an uncertain task resent
-- after the upgrade must carry the key of its first attempt, and a query must find its message.
-- The backfill rewrites every row of delivery_task in this migration's transaction (writes to the table
-- wait until it commits), with the state machine's triggers off for it (it is no protocol move).
ALTER TABLE delivery_task ADD COLUMN ref text;
ALTER TABLE delivery_task DISABLE TRIGGER delivery_task_state_machine;
ALTER TABLE delivery_task DISABLE TRIGGER delivery_task_evidence;
UPDATE delivery_task SET ref = 'task-' || id;
ALTER TABLE delivery_task ENABLE TRIGGER delivery_task_state_machine;
ALTER TABLE delivery_task ENABLE TRIGGER delivery_task_evidence;
ALTER TABLE delivery_task
    ALTER COLUMN ref SET DEFAULT gen_random_uuid()::text,
    ALTER COLUMN ref SET NOT NULL,
    -- A lowercase UUID, or an old task's task-<id>: safe in every place it goes (a URL query, a header,
    -- a Message-ID), and recognisable when a provider carries it back (delivery.ParseRef).
    ADD CONSTRAINT delivery_task_ref_check CHECK (
        ref ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' OR ref ~ '^task-[1-9][0-9]{0,18}$'),
    -- One task per reference: how a receipt finds its task (TaskIDByRef).
    ADD CONSTRAINT delivery_task_ref_key UNIQUE (ref);

-- Guards UPDATE of delivery_task: the reference never changes once a channel may have seen it (no role
-- has a column grant on it; this stops the owner too). Raised as the state machine's rule for what a
-- task is for (delivery_task_fixed).
CREATE FUNCTION delivery_task_ref_fixed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = format('delivery_task %s: ref is fixed when the task is created (a channel may have seen it)', OLD.id),
        ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task', COLUMN = 'ref',
        CONSTRAINT = 'delivery_task_fixed',
        HINT = 'see the moves in schema/010_state_machine.sql; a parked task is settled with notifier_resolve()';
END
$$;

COMMENT ON FUNCTION delivery_task_ref_fixed() IS
    'R2, R3: what was sent to a channel names one task forever (schema/016_task_ref.sql)';

-- The WHEN is evaluated per updated row without calling the function: nothing for a claim or a finish.
CREATE TRIGGER delivery_task_ref_fixed
    AFTER UPDATE ON delivery_task
    FOR EACH ROW WHEN (OLD.ref IS DISTINCT FROM NEW.ref)
    EXECUTE FUNCTION delivery_task_ref_fixed();

-- migrate:down
DROP TRIGGER delivery_task_ref_fixed ON delivery_task;
DROP FUNCTION delivery_task_ref_fixed();
ALTER TABLE delivery_task DROP COLUMN ref;
