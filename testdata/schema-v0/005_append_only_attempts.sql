-- migrate:up
-- R3 in the database, not only in queries/: delivery_attempt is append-only. Every channel call leaves one
-- row, and what it observed is kept verbatim: a recorded outcome is never overwritten, a late observation
-- goes to late_outcome once, and an open, uncertain or parked history is never deleted. queries/ already
-- guard their own updates with `outcome IS NULL` / `late_outcome IS NULL`; these triggers make the same
-- rules hold for every other writer too (a hand-written fix, a script, a future query).
--
-- The only updates the protocol makes, and so the only ones allowed:
--   AttemptFinish, AttemptMarkLeaseExpired  open attempt: outcome + finished_at (+ provider_msg_id, error)
--   AttemptRecordLate                        late_outcome + late_at (+ provider_msg_id, error if NULL)
-- Violations raise SQLSTATE 23000 (integrity_constraint_violation) with constraint name
-- delivery_attempt_append_only or delivery_attempt_retention_only, the table and the offending column.

-- Guards UPDATE of delivery_attempt (R3). Rejects a change to the columns fixed when the attempt was
-- opened (id, task_id, attempt_no, attempt_token, action, worker, started_at); to outcome/finished_at once
-- the outcome is recorded; to late_outcome/late_at once recorded; to note once set; and to provider_msg_id
-- or error except from NULL, in the update that records the outcome or the late outcome they explain.
CREATE FUNCTION delivery_attempt_append_only() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    col text;
    why text;
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id THEN
        col := 'id';
    ELSIF NEW.task_id IS DISTINCT FROM OLD.task_id THEN
        col := 'task_id';
    ELSIF NEW.attempt_no IS DISTINCT FROM OLD.attempt_no THEN
        col := 'attempt_no';
    ELSIF NEW.attempt_token IS DISTINCT FROM OLD.attempt_token THEN
        col := 'attempt_token';
    ELSIF NEW.action IS DISTINCT FROM OLD.action THEN
        col := 'action';
    ELSIF NEW.worker IS DISTINCT FROM OLD.worker THEN
        col := 'worker';
    ELSIF NEW.started_at IS DISTINCT FROM OLD.started_at THEN
        col := 'started_at';
    END IF;
    IF col IS NOT NULL THEN
        why := 'is fixed when the attempt is opened';
    ELSIF (OLD.outcome IS NOT NULL OR OLD.finished_at IS NOT NULL)
        AND (NEW.outcome IS DISTINCT FROM OLD.outcome OR NEW.finished_at IS DISTINCT FROM OLD.finished_at) THEN
        col := CASE WHEN NEW.outcome IS DISTINCT FROM OLD.outcome THEN 'outcome' ELSE 'finished_at' END;
        why := 'is written once; a later observation goes to late_outcome';
    ELSIF (OLD.late_outcome IS NOT NULL OR OLD.late_at IS NOT NULL)
        AND (NEW.late_outcome IS DISTINCT FROM OLD.late_outcome OR NEW.late_at IS DISTINCT FROM OLD.late_at) THEN
        col := CASE WHEN NEW.late_outcome IS DISTINCT FROM OLD.late_outcome THEN 'late_outcome' ELSE 'late_at' END;
        why := 'is written once';
    ELSIF OLD.note IS NOT NULL AND NEW.note IS DISTINCT FROM OLD.note THEN
        col := 'note';
        why := 'is written once';
    ELSIF (NEW.provider_msg_id IS DISTINCT FROM OLD.provider_msg_id OR NEW.error IS DISTINCT FROM OLD.error)
        AND NOT (
            -- only from NULL ...
            (OLD.provider_msg_id IS NULL OR NEW.provider_msg_id IS NOT DISTINCT FROM OLD.provider_msg_id)
            AND (OLD.error IS NULL OR NEW.error IS NOT DISTINCT FROM OLD.error)
            -- ... and only by the update that records the outcome or the late outcome
            AND ((OLD.outcome IS NULL AND NEW.outcome IS NOT NULL)
                 OR (OLD.late_outcome IS NULL AND NEW.late_outcome IS NOT NULL))) THEN
        col := CASE WHEN NEW.provider_msg_id IS DISTINCT FROM OLD.provider_msg_id THEN 'provider_msg_id' ELSE 'error' END;
        why := 'is written once, with the outcome or late_outcome it explains';
    END IF;
    IF col IS NOT NULL THEN
        RAISE EXCEPTION 'delivery_attempt is append-only: % of attempt % (task %, attempt %) %',
                col, OLD.id, OLD.task_id, OLD.attempt_no, why
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  COLUMN = col,
                  CONSTRAINT = 'delivery_attempt_append_only',
                  HINT = 'an attempt keeps what it observed verbatim (R3); record a new attempt instead';
    END IF;
    RETURN NULL; -- AFTER trigger: the return value is ignored
END
$$;

COMMENT ON FUNCTION delivery_attempt_append_only() IS
    'R3: delivery_attempt is append-only; only the protocol''s own write-once updates pass';

-- Guards UPDATE of delivery_attempt with delivery_attempt_append_only(). An AFTER trigger on purpose: the
-- table's own NOT NULL and CHECK constraints are evaluated first and report their own SQLSTATE and name,
-- and the rule is checked on the final row, whatever any other trigger did to it. Raising here still
-- aborts the statement, so a rejected update changes nothing.
CREATE TRIGGER delivery_attempt_append_only
    AFTER UPDATE ON delivery_attempt
    FOR EACH ROW
EXECUTE FUNCTION delivery_attempt_append_only();

COMMENT ON TRIGGER delivery_attempt_append_only ON delivery_attempt IS
    'R3: rejects any UPDATE that rewrites what an attempt recorded';

-- Guards DELETE of delivery_attempt: retention may prune finished history, never an open attempt (its
-- holder may still record what the channel said) nor any attempt of a task that is not in a terminal
-- state (SENT, FAILED, SUPPRESSED): an UNKNOWN task's history is the only evidence a human has to resolve
-- it. Terminal states are final in the protocol (no query in queries/ moves a task out of one), so the
-- check cannot be invalidated by a concurrent update. Runs as the deleting user: a caller who may not
-- read the task (privileges, row-level security) cannot delete its attempts. search_path is pinned to
-- the one the migration ran with, so the task lookup cannot be redirected.
CREATE FUNCTION delivery_attempt_retention_only() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
AS $$
DECLARE
    task_state text;
BEGIN
    IF OLD.outcome IS NULL THEN
        RAISE EXCEPTION 'delivery_attempt % (task %, attempt %) is open and cannot be deleted',
                OLD.id, OLD.task_id, OLD.attempt_no
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  CONSTRAINT = 'delivery_attempt_retention_only',
                  HINT = 'its holder may still record what the channel said; only finished history is pruned';
    END IF;
    SELECT t.state INTO task_state FROM delivery_task t WHERE t.id = OLD.task_id;
    IF task_state IS NULL OR task_state NOT IN ('SENT', 'FAILED', 'SUPPRESSED') THEN
        RAISE EXCEPTION 'delivery_attempt % cannot be deleted: its task % is %, not in a terminal state',
                OLD.id, OLD.task_id, coalesce(task_state, 'not visible')
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  CONSTRAINT = 'delivery_attempt_retention_only',
                  HINT = 'only the history of a SENT, FAILED or SUPPRESSED task may be pruned (R3, R6)';
    END IF;
    RETURN OLD;
END
$$;

COMMENT ON FUNCTION delivery_attempt_retention_only() IS
    'R3: attempts are deleted only as finished history of a SENT, FAILED or SUPPRESSED task';

-- Guards DELETE of delivery_attempt with delivery_attempt_retention_only(), before the row goes.
CREATE TRIGGER delivery_attempt_retention_only
    BEFORE DELETE ON delivery_attempt
    FOR EACH ROW
EXECUTE FUNCTION delivery_attempt_retention_only();

COMMENT ON TRIGGER delivery_attempt_retention_only ON delivery_attempt IS
    'R3: rejects DELETE of an open attempt or of an attempt of a task not in a terminal state';

-- Guards TRUNCATE of delivery_attempt (directly or by TRUNCATE delivery_task CASCADE): it fires no row
-- trigger, so it would bypass the DELETE rule above and wipe open and uncertain history with it.
CREATE FUNCTION delivery_attempt_no_truncate() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'delivery_attempt is append-only and cannot be truncated'
        USING ERRCODE = 'integrity_constraint_violation',
              TABLE = 'delivery_attempt',
              CONSTRAINT = 'delivery_attempt_retention_only',
              HINT = 'prune finished history with DELETE; the rows of open, uncertain and parked tasks stay';
END
$$;

COMMENT ON FUNCTION delivery_attempt_no_truncate() IS
    'R3: TRUNCATE would bypass the row-level DELETE rule of delivery_attempt';

-- Guards TRUNCATE of delivery_attempt with delivery_attempt_no_truncate().
CREATE TRIGGER delivery_attempt_no_truncate
    BEFORE TRUNCATE ON delivery_attempt
    FOR EACH STATEMENT
EXECUTE FUNCTION delivery_attempt_no_truncate();

COMMENT ON TRIGGER delivery_attempt_no_truncate ON delivery_attempt IS
    'R3: rejects TRUNCATE, which fires no row trigger';

-- migrate:down
-- Exactly what the up created: three triggers, then their functions.
DROP TRIGGER delivery_attempt_no_truncate ON delivery_attempt;
DROP TRIGGER delivery_attempt_retention_only ON delivery_attempt;
DROP TRIGGER delivery_attempt_append_only ON delivery_attempt;
DROP FUNCTION delivery_attempt_no_truncate();
DROP FUNCTION delivery_attempt_retention_only();
DROP FUNCTION delivery_attempt_append_only();
