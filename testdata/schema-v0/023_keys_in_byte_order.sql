-- migrate:up
-- The identifiers we send to channels and get back from them, a task's ref and a provider's message id,
-- compare byte by byte (COLLATE "C") instead of by the database's language rules. Only equality is ever
-- asked of them (a receipt's lookup, the ref's uniqueness), and equality is the same under both: the
-- default collation is deterministic, so two values are equal exactly when their bytes are. What changes
-- is the cost of keeping their indexes. Neither update of a task is HOT, so every claim and every finish
-- inserts the task's ref into delivery_task_ref_key again, and a finish inserts the message id into the
-- partial indexes of the task and of the attempt: each insertion compares the new key with about twenty
-- others on its way down the tree. Under a language's collation each comparison is a call to strcoll();
-- in byte order it is a memcmp(). Measured with `just bench-cost` (docs/benchmarks/2026-12-05-byte-order-keys.md):
-- 12% of the server's instructions per delivery on a cluster initialised with en_US.UTF-8 (the default
-- of many installations and images), 3% on one with C.UTF-8, whose strcoll() is already byte order.
--
-- The triggers whose WHEN reads these columns must go while a column's collation changes (PostgreSQL
-- refuses otherwise); they are created again from their own definitions and keep their comments, so
-- nothing about what they check changes. No table is rewritten: the three indexes on the columns are
-- rebuilt, holding writes to both tables meanwhile.
DO $$
DECLARE
    saved record;
    kept  text[] := '{}';
    notes text[] := '{}';
    found integer := 0;
BEGIN
    FOR saved IN
        SELECT t.oid, t.tgname, c.relname
        FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = 'public'::regnamespace
          AND (c.relname, t.tgname) IN (('delivery_task', 'delivery_task_ref_fixed'),
                                        ('delivery_task', 'delivery_task_state_machine'),
                                        ('delivery_attempt', 'delivery_attempt_append_only'))
    LOOP
        kept  := kept || pg_get_triggerdef(saved.oid);
        notes := notes || format('COMMENT ON TRIGGER %I ON %I IS %L', saved.tgname, saved.relname,
                                 obj_description(saved.oid, 'pg_trigger'));
        EXECUTE format('DROP TRIGGER %I ON %I', saved.tgname, saved.relname);
        found := found + 1;
    END LOOP;
    IF found <> 3 THEN
        RAISE EXCEPTION 'schema/023: expected the 3 triggers that read ref and provider_msg_id, found %', found;
    END IF;

    ALTER TABLE delivery_task
        ALTER COLUMN ref TYPE notifier_task_ref COLLATE "C",
        ALTER COLUMN provider_msg_id TYPE text COLLATE "C";
    ALTER TABLE delivery_attempt
        ALTER COLUMN provider_msg_id TYPE text COLLATE "C";

    FOR i IN 1 .. found LOOP
        EXECUTE kept[i];
        EXECUTE notes[i];
    END LOOP;
END $$;

-- migrate:down
DO $$
DECLARE
    saved record;
    kept  text[] := '{}';
    notes text[] := '{}';
    found integer := 0;
BEGIN
    FOR saved IN
        SELECT t.oid, t.tgname, c.relname
        FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = 'public'::regnamespace
          AND (c.relname, t.tgname) IN (('delivery_task', 'delivery_task_ref_fixed'),
                                        ('delivery_task', 'delivery_task_state_machine'),
                                        ('delivery_attempt', 'delivery_attempt_append_only'))
    LOOP
        kept  := kept || pg_get_triggerdef(saved.oid);
        notes := notes || format('COMMENT ON TRIGGER %I ON %I IS %L', saved.tgname, saved.relname,
                                 obj_description(saved.oid, 'pg_trigger'));
        EXECUTE format('DROP TRIGGER %I ON %I', saved.tgname, saved.relname);
        found := found + 1;
    END LOOP;
    IF found <> 3 THEN
        RAISE EXCEPTION 'schema/023: expected the 3 triggers that read ref and provider_msg_id, found %', found;
    END IF;

    ALTER TABLE delivery_task
        ALTER COLUMN ref TYPE notifier_task_ref COLLATE "default",
        ALTER COLUMN provider_msg_id TYPE text COLLATE "default";
    ALTER TABLE delivery_attempt
        ALTER COLUMN provider_msg_id TYPE text COLLATE "default";

    FOR i IN 1 .. found LOOP
        EXECUTE kept[i];
        EXECUTE notes[i];
    END LOOP;
END $$;
