-- migrate:up
-- A task's two unique keys, (notification_id, channel) and ref, on a row that is never updated. On
-- delivery_task they cost 13% of the server's instructions per delivery
-- (docs/benchmarks/2026-12-05-row-costs.md): a claim and a finish each update the task, neither update is
-- HOT (the claim and retention indexes cover columns both change), so each added a new entry to both
-- unique indexes and checked it against the heap for a duplicate, although neither key ever changes.
-- delivery_task_key holds them instead; the claim and the finish never touch it
-- (docs/benchmarks/2026-12-06-task-keys.md).
--
-- What stays the same:
--   * R2, one task per (notification, channel), and refs that never repeat: the statement that inserts
--     tasks writes their key rows (delivery_task_key_insert), whatever role inserts, so a duplicate
--     fails that statement with the same constraint names as before (delivery_task_notification_channel_key,
--     delivery_task_ref_key; SQLSTATE 23505).
--   * delivery_task keeps notification_id, channel and ref: the claim reads them for every task it
--     calls, with no join, and the state machine (delivery_task_fixed) and delivery_task_ref_fixed keep
--     them from changing. A key row is a copy made from the same inserted row and is never changed
--     either (delivery_task_key_fixed), so the two stay equal.
--   * Lookups by ref (a receipt) and by notification (create's answer, status, cancel, retention) go
--     through the key table's unique indexes; delivery_task has no index on either any more.
-- Deploy: writes to delivery_task wait while the existing tasks' keys are copied (one read of the table)
-- and the new table's two indexes are built.
LOCK TABLE delivery_task IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE delivery_task DROP CONSTRAINT delivery_task_notification_channel_key;
ALTER TABLE delivery_task DROP CONSTRAINT delivery_task_ref_key;

-- One row per task, written with it, deleted only with it (retention: ON DELETE CASCADE). The columns
-- have the types of delivery_task's, ref in byte order as there (schema/023).
CREATE TABLE delivery_task_key (
    task_id         bigint            PRIMARY KEY REFERENCES delivery_task (id) ON DELETE CASCADE,
    notification_id bigint            NOT NULL,
    channel         notifier_channel  NOT NULL,
    ref             notifier_task_ref COLLATE "C" NOT NULL,
    -- R2: one task per (notification, channel); how a notification's tasks are found.
    CONSTRAINT delivery_task_notification_channel_key UNIQUE (notification_id, channel),
    -- One task per reference, never reused: how a receipt finds its task (ReceiptTaskByRef).
    CONSTRAINT delivery_task_ref_key UNIQUE (ref)
);

COMMENT ON TABLE delivery_task_key IS
    'A task''s unique keys, off the row the claim and the finish update (schema/030)';

INSERT INTO delivery_task_key (task_id, notification_id, channel, ref)
SELECT t.id, t.notification_id, t.channel, t.ref FROM delivery_task t;

-- Writes the key rows of the tasks one statement inserted, before that statement ends: a duplicate
-- fails the insert itself. Statement-level over the transition table: one INSERT per statement, where
-- a row-level trigger would run one per task (measured in docs/benchmarks/2026-12-06-task-keys.md).
-- SECURITY DEFINER: no role may write delivery_task_key itself, whatever role inserts the tasks.
CREATE FUNCTION delivery_task_key_insert() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    INSERT INTO public.delivery_task_key (task_id, notification_id, channel, ref)
    SELECT n.id, n.notification_id, n.channel, n.ref FROM new_tasks n;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION delivery_task_key_insert() IS
    'R2: a task''s unique keys are written by the statement that inserts it (schema/030)';

CREATE TRIGGER delivery_task_key_insert
    AFTER INSERT ON delivery_task
    REFERENCING NEW TABLE AS new_tasks
    FOR EACH STATEMENT
EXECUTE FUNCTION delivery_task_key_insert();

-- Guards the key rows against everyone, the owner too (the roles have no grant to write them at all):
-- no UPDATE, no TRUNCATE, and a DELETE only of the keys of a task that is gone (the cascade of
-- retention's DELETE of the task). A key that changed or went while its task stays would let a second
-- task on the same channel, or a reused ref, in.
CREATE FUNCTION delivery_task_key_fixed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    IF TG_OP = 'DELETE' AND NOT EXISTS (SELECT FROM public.delivery_task t WHERE t.id = OLD.task_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION USING
        MESSAGE = CASE WHEN TG_OP = 'TRUNCATE' THEN 'delivery_task_key cannot be truncated'
                       ELSE format('delivery_task_key of task %s: a task''s keys are fixed while the task exists', OLD.task_id) END,
        ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task_key',
        CONSTRAINT = 'delivery_task_key_fixed',
        HINT = 'a task''s keys are written with it and deleted with it (notifier prune)';
END
$$;

COMMENT ON FUNCTION delivery_task_key_fixed() IS
    'R2, R3: a task''s keys neither change nor go while it exists (schema/030)';

CREATE TRIGGER delivery_task_key_fixed
    BEFORE UPDATE OR DELETE ON delivery_task_key
    FOR EACH ROW
EXECUTE FUNCTION delivery_task_key_fixed();

CREATE TRIGGER delivery_task_key_no_truncate
    BEFORE TRUNCATE ON delivery_task_key
    FOR EACH STATEMENT
EXECUTE FUNCTION delivery_task_key_fixed();

-- Read as delivery_task is read (schema/006, 015): every role may look a task up by its keys; none may
-- write them (the insert trigger above is the only writer). Row security as on delivery_task.
GRANT SELECT ON delivery_task_key TO notifier_creator, notifier_worker, notifier_operator, notifier_receiver;
ALTER TABLE delivery_task_key ENABLE ROW LEVEL SECURITY;
CREATE POLICY delivery_task_key_creator_select ON delivery_task_key FOR SELECT TO notifier_creator USING (true);
CREATE POLICY delivery_task_key_worker_select ON delivery_task_key FOR SELECT TO notifier_worker USING (true);
CREATE POLICY delivery_task_key_operator_select ON delivery_task_key FOR SELECT TO notifier_operator USING (true);
CREATE POLICY delivery_task_key_receiver_select ON delivery_task_key FOR SELECT TO notifier_receiver USING (true);

-- Rewrites a function from its own definition (as 027 and 029 do), each edit's text found exactly once
-- (a definition that no longer holds it stops the migration); backwards undoes the same edits.
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
            RAISE EXCEPTION '030: % does not hold exactly once: %', fn, old;
        END IF;
        def := replace(def, old, new);
    END LOOP;
    EXECUTE def;
END
$$;

-- The cancel finds the notification's tasks through the key table.
SELECT pg_temp.notifier_rewrite('notifier_cancel(text,text,text)', ARRAY[
    $e$        FROM delivery_task dt
        WHERE dt.notification_id = nid
        ORDER BY dt.id
        FOR UPDATE$e$,
    $e$        FROM delivery_task_key k
        JOIN delivery_task dt ON dt.id = k.task_id
        WHERE k.notification_id = nid
        ORDER BY dt.id
        FOR UPDATE OF dt$e$]);

-- migrate:down
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
            RAISE EXCEPTION '030: % does not hold exactly once: %', fn, old;
        END IF;
        def := replace(def, old, new);
    END LOOP;
    EXECUTE def;
END
$$;

SELECT pg_temp.notifier_rewrite('notifier_cancel(text,text,text)', ARRAY[
    $e$        FROM delivery_task dt
        WHERE dt.notification_id = nid
        ORDER BY dt.id
        FOR UPDATE$e$,
    $e$        FROM delivery_task_key k
        JOIN delivery_task dt ON dt.id = k.task_id
        WHERE k.notification_id = nid
        ORDER BY dt.id
        FOR UPDATE OF dt$e$], backwards => true);

LOCK TABLE delivery_task IN SHARE ROW EXCLUSIVE MODE;
DROP TRIGGER delivery_task_key_insert ON delivery_task;
DROP FUNCTION delivery_task_key_insert();
-- Dropped with the table: its triggers (then delivery_task_key_fixed), policies and grants.
DROP TABLE delivery_task_key;
DROP FUNCTION delivery_task_key_fixed();
ALTER TABLE delivery_task ADD CONSTRAINT delivery_task_notification_channel_key UNIQUE (notification_id, channel);
ALTER TABLE delivery_task ADD CONSTRAINT delivery_task_ref_key UNIQUE (ref);
