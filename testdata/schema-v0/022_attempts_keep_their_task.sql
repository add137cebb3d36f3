-- migrate:up
-- "An attempt belongs to a task that exists", held by the state machine's checks instead of a foreign
-- key. The foreign key delivery_attempt_task_id_fkey (004) checked every new attempt with a query of its
-- own that locks the task's row (FOR KEY SHARE): 37,000 of the server's 633,000 instructions per delivery
-- (docs/benchmarks/2026-12-04-hot-path-checks.md), and the check was already made: every new attempt is
-- compared with its task as it is inserted (delivery_attempt_fits() for SKIP, MANUAL and RECEIPT rows
-- and for closed calls, delivery_attempt_calls_follow_tasks for open calls, schema/021), and an attempt
-- whose task is not there is refused (delivery_attempt_follows_task, column task_id). What the foreign
-- key also did, refuse to delete a task whose attempts stay, is delivery_task_attempts_kept below,
-- once per statement; delivery_receipt's foreign key still refuses a TRUNCATE of delivery_task.
--
-- Nothing can slip between the check and the commit: an attempt is inserted only with a move of its task
-- in the same transaction (a claim, a settle, a resolve, a receipt's settle: schema/010 checks the
-- attempt number against the task's count), so its task's row is locked until the commit, and a DELETE
-- of that task waits for it and then finds the attempt.
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_task_id_fkey;

-- Guards DELETE of delivery_task: no attempt outlives its task. Retention (RetentionPruneBatch) deletes a
-- task's attempts in the same statement, before the task. SQLSTATE 23503 (foreign_key_violation), as
-- the foreign key raised. Runs as the deleting user (only the owner may delete); search_path and
-- enable_seqscan pinned as in 010 (each deleted task is looked up in the (task_id, attempt_no) index).
CREATE FUNCTION delivery_task_attempts_kept() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
    SET enable_seqscan = off
AS $$
DECLARE
    kept record;
BEGIN
    SELECT a.task_id, a.attempt_no INTO kept
    FROM deleted_tasks d
    JOIN public.delivery_attempt a ON a.task_id = d.id
    ORDER BY a.task_id, a.attempt_no
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'delivery_task % cannot be deleted: its attempt % is kept', kept.task_id, kept.attempt_no
            USING ERRCODE = 'foreign_key_violation',
                  TABLE = 'delivery_task',
                  CONSTRAINT = 'delivery_task_attempts_kept',
                  HINT = 'a task goes with all its attempts, in one statement (notifier prune)';
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION delivery_task_attempts_kept() IS
    'R3: no attempt outlives its task (schema/022, in place of delivery_attempt_task_id_fkey)';

CREATE TRIGGER delivery_task_attempts_kept
    AFTER DELETE ON delivery_task
    REFERENCING OLD TABLE AS deleted_tasks
    FOR EACH STATEMENT
EXECUTE FUNCTION delivery_task_attempts_kept();

COMMENT ON TRIGGER delivery_task_attempts_kept ON delivery_task IS
    'R3: refuses a DELETE of tasks whose attempts stay';

-- migrate:down
DROP TRIGGER delivery_task_attempts_kept ON delivery_task;
DROP FUNCTION delivery_task_attempts_kept();
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_task_id_fkey FOREIGN KEY (task_id) REFERENCES delivery_task (id);
