-- migrate:up
-- The state machine's checks (schema/010) for the moves every delivery makes, without a PL/pgSQL call
-- per row. Each claim and each finish called a trigger function per task and per attempt, five calls
-- per delivery, about a quarter of the server's instructions per delivery; a PL/pgSQL call with its
-- pinned settings costs about 35,000 instructions, where the executor evaluates a WHEN for a row in a
-- few hundred (docs/benchmarks/2026-12-04-hot-path-checks.md). The rules do not change, nor who they
-- bind: every move not recognised here still goes through the functions of 005 and 010, which keep
-- their own fast paths and give the same errors (TestStateMachine*, for every role).
--
--   delivery_task_state_machine   its WHEN now holds the function's first test, the one that passes a
--                                 claim or a finish (010's comment on keeping the WHEN small was
--                                 measured per task: the WHEN is prepared once per statement, and a
--                                 claim or finish of 25 or more tasks pays that back many times)
--   delivery_attempt_append_only  the WHEN passes the one update every finish makes: an open attempt
--                                 gets its outcome, nothing it was opened with changes
--   claims' evidence              checked per statement instead of per row at commit: every task a
--                                 statement leaves SENDING holds the open call attempt of its token
--                                 (delivery_task_holders_have_attempts, below); the deferred row
--                                 trigger delivery_task_evidence keeps every other counted move
--   calls' fit with their task    checked per statement instead of per row: every open SEND, QUERY or
--                                 TOPIC_RESEND attempt inserted is the one its task's claim counted,
--                                 under the task's token (delivery_attempt_calls_follow_tasks, below);
--                                 delivery_attempt_fits() keeps every other insert, a closed call's
--                                 included, so an outcome that does not fit its action is still named so
--
-- One rule is stricter than before: a claim's attempt row must be written by the same statement as the
-- claim (at its end, rather than by the commit), as TaskStartAttempts does; a claim and its attempt in
-- two statements of one transaction is refused (delivery_task_evidence).

DROP TRIGGER delivery_task_state_machine ON delivery_task;
-- The WHEN is the function's first test (010), unchanged, and the row left as it was after it: the
-- executor stops at the first false term, so a claim or a finish never compares whole rows.
CREATE TRIGGER delivery_task_state_machine
    AFTER UPDATE ON delivery_task
    FOR EACH ROW
    WHEN (NOT coalesce(
              NEW.id = OLD.id AND NEW.notification_id = OLD.notification_id AND NEW.channel = OLD.channel
              AND NEW.max_attempts = OLD.max_attempts AND NEW.created_at = OLD.created_at
              AND (NEW.outcome_uncertain OR NOT OLD.outcome_uncertain)
              AND (NOT OLD.outcome_uncertain OR NEW.uncertain_since = OLD.uncertain_since)
              AND (OLD.outcome_uncertain OR NOT NEW.outcome_uncertain OR NEW.uncertain_since <= OLD.updated_at)
              AND ((NEW.state = 'SENDING' AND NEW.attempt_count = OLD.attempt_count + 1
                    AND NEW.attempt_token IS DISTINCT FROM OLD.attempt_token AND NEW.lease_until > now()
                    AND NEW.provider_msg_id IS NOT DISTINCT FROM OLD.provider_msg_id
                    AND ((OLD.state IN ('PENDING', 'UNKNOWN') AND NOT OLD.needs_review AND OLD.next_attempt_at <= now())
                         OR (OLD.state = 'SENDING' AND OLD.lease_until < now() AND NEW.outcome_uncertain)))
                   OR (OLD.state = 'SENDING' AND NEW.state IN ('SENT', 'PENDING', 'UNKNOWN', 'FAILED')
                       AND NEW.attempt_count = OLD.attempt_count AND NEW.attempt_token IS NOT DISTINCT FROM OLD.attempt_token
                       AND NEW.lease_until IS NULL AND NEW.lease_owner IS NULL
                       AND NOT (NEW.state = 'FAILED' AND NEW.outcome_uncertain)
                       AND (NEW.provider_msg_id IS NOT NULL OR OLD.provider_msg_id IS NULL))),
              false)
          AND OLD.* IS DISTINCT FROM NEW.*)
EXECUTE FUNCTION delivery_task_state_machine();

COMMENT ON TRIGGER delivery_task_state_machine ON delivery_task IS
    'R2, R6: refuses any UPDATE that is not a move of the delivery protocol (a claim or a finish passes by the WHEN)';

DROP TRIGGER delivery_attempt_append_only ON delivery_attempt;
-- The WHEN passes exactly the rows for which delivery_attempt_append_only() (005) finds nothing to refuse
-- by the finish's rule: the columns fixed at opening unchanged, an outcome written where there was none,
-- the late outcome and the note untouched, a message id and an error only where there were none.
CREATE TRIGGER delivery_attempt_append_only
    AFTER UPDATE ON delivery_attempt
    FOR EACH ROW
    WHEN (NOT coalesce(
              NEW.id = OLD.id AND NEW.task_id = OLD.task_id AND NEW.attempt_no = OLD.attempt_no
              AND NEW.attempt_token = OLD.attempt_token AND NEW.action = OLD.action AND NEW.worker = OLD.worker
              AND NEW.started_at = OLD.started_at
              AND OLD.outcome IS NULL AND OLD.finished_at IS NULL AND NEW.outcome IS NOT NULL
              AND NEW.late_outcome IS NOT DISTINCT FROM OLD.late_outcome AND NEW.late_at IS NOT DISTINCT FROM OLD.late_at
              AND NEW.note IS NOT DISTINCT FROM OLD.note
              AND (OLD.provider_msg_id IS NULL OR NEW.provider_msg_id IS NOT DISTINCT FROM OLD.provider_msg_id)
              AND (OLD.error IS NULL OR NEW.error IS NOT DISTINCT FROM OLD.error),
              false))
EXECUTE FUNCTION delivery_attempt_append_only();

COMMENT ON TRIGGER delivery_attempt_append_only ON delivery_attempt IS
    'R3: rejects any UPDATE that rewrites what an attempt recorded (a finish''s first outcome passes by the WHEN)';

-- Why an open call attempt does not follow its task, or NULL when it does: the tests delivery_attempt_fits()
-- (010) makes of such a row, in its order, given the task as read now (its state, its attempt_count,
-- whether its attempt_token is the attempt's). {column, reason}, for the two statement-level checks below.
CREATE FUNCTION delivery_attempt_call_misfit(task_state text, task_count integer, task_token_held boolean, attempt_no integer)
    RETURNS text[]
    LANGUAGE sql
    IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN task_state IS NULL THEN ARRAY['task_id', 'its task is not visible']
        WHEN attempt_no <> task_count THEN ARRAY['attempt_no',
            format('the task has counted %s attempts; a new attempt is the one its move just counted', task_count)]
        WHEN NOT coalesce(task_state = 'SENDING' AND task_token_held, false) THEN ARRAY['attempt_token',
            format('a call is opened only by the task''s holder, with its token (the task is %s)', task_state)]
    END
$$;

-- Guards, at the end of every statement that updates tasks, what a holder needs (R3): a task left
-- SENDING holds the open call attempt its claim counted, of its token: (task_id, attempt_no) is the
-- task's (id, attempt_count), action SEND, QUERY or TOPIC_RESEND, attempt_token the task's. One
-- set-based lookup per statement (a transition table, the (task_id, attempt_no) unique index), where
-- delivery_task_evidence ran a PL/pgSQL call per claimed task at commit. When the statement did open a
-- call for such a task, but under another number or token, that attempt is named as at fault, as
-- delivery_attempt_fits() named it before (its check runs after this one in the statement). Runs as the
-- updating user; search_path and enable_seqscan pinned as in 010 (once per statement now).
CREATE FUNCTION delivery_task_holders_have_attempts() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
    SET enable_seqscan = off
AS $$
DECLARE
    t      record;
    opened record;
    misfit text[];
BEGIN
    SELECT n.id, n.attempt_count, n.attempt_token, a.action, a.outcome INTO t
    FROM updated_tasks n
    LEFT JOIN public.delivery_attempt a ON a.task_id = n.id AND a.attempt_no = n.attempt_count
    WHERE n.state = 'SENDING'
      AND NOT coalesce(a.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND a.attempt_token = n.attempt_token, false)
    ORDER BY n.id
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT a.id, a.attempt_no, a.attempt_token = t.attempt_token AS held INTO opened
    FROM public.delivery_attempt a
    WHERE a.task_id = t.id AND a.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND a.outcome IS NULL
      AND a.xmin = pg_current_xact_id()::xid
    ORDER BY a.attempt_no DESC
    LIMIT 1;
    misfit := delivery_attempt_call_misfit('SENDING', t.attempt_count, opened.held, opened.attempt_no);
    IF FOUND AND misfit IS NOT NULL THEN
        RAISE EXCEPTION 'delivery_attempt % (task %, attempt %): %', opened.id, t.id, opened.attempt_no, misfit[2]
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  COLUMN = misfit[1],
                  CONSTRAINT = 'delivery_attempt_follows_task',
                  HINT = 'attempts are opened by the move that counts them (schema/010_state_machine.sql)';
    END IF;
    RAISE EXCEPTION 'delivery_task % (SENDING, attempt %) has no evidence: it needs an open SEND, QUERY or TOPIC_RESEND attempt with the task''s token as attempt %, written by the same statement, found %',
            t.id, t.attempt_count, t.attempt_count,
            CASE WHEN t.action IS NULL THEN 'none' ELSE t.action || ' ' || coalesce(t.outcome, '(open)') END
        USING ERRCODE = 'integrity_constraint_violation',
              TABLE = 'delivery_task',
              COLUMN = 'attempt_count',
              CONSTRAINT = 'delivery_task_evidence',
              HINT = 'a claim and its attempt row are written in one statement (TaskStartAttempts); see schema/021_hot_path_checks.sql';
END
$$;

COMMENT ON FUNCTION delivery_task_holders_have_attempts() IS
    'R3: a task a statement leaves SENDING holds the open call attempt of its token (schema/021)';

CREATE TRIGGER delivery_task_holders_have_attempts
    AFTER UPDATE ON delivery_task
    REFERENCING NEW TABLE AS updated_tasks
    FOR EACH STATEMENT
EXECUTE FUNCTION delivery_task_holders_have_attempts();

COMMENT ON TRIGGER delivery_task_holders_have_attempts ON delivery_task IS
    'R3: refuses a statement that leaves a task SENDING without its open call attempt';

-- A claim's evidence is delivery_task_holders_have_attempts' now: the deferred row trigger is queued only
-- for the other moves that need it (a settle, a resolve, a receipt's settle, a finish that writes PENDING
-- or FAILED, an uncertainty written off). A move to SENDING that counts an attempt is a claim.
DROP TRIGGER delivery_task_evidence ON delivery_task;
CREATE CONSTRAINT TRIGGER delivery_task_evidence
    AFTER UPDATE ON delivery_task
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN ((NEW.attempt_count <> OLD.attempt_count AND NEW.state <> 'SENDING')
          OR (OLD.state = 'SENDING' AND NEW.state IN ('PENDING', 'FAILED'))
          OR (OLD.outcome_uncertain AND NOT NEW.outcome_uncertain))
EXECUTE FUNCTION delivery_task_evidence();

COMMENT ON TRIGGER delivery_task_evidence ON delivery_task IS
    'R3, R6: refuses at commit a move whose attempt row is missing or says otherwise (a claim''s: delivery_task_holders_have_attempts)';

-- Guards, at the end of every statement that inserts attempts, the open calls among them (R3): each is
-- the attempt its task's claim just counted, under the task's token: the task is visible, SENDING, its
-- attempt_count is the attempt_no and its attempt_token the attempt's. The same tests, in the same order,
-- as delivery_attempt_fits() (010) makes of such a row; one set-based lookup per statement (the task's
-- primary key) instead of a PL/pgSQL call per attempt. Runs as the inserting user (a caller who may not
-- read the task cannot attach an attempt to it).
CREATE FUNCTION delivery_attempt_calls_follow_tasks() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
    SET enable_seqscan = off
AS $$
DECLARE
    a      record;
    misfit text[];
BEGIN
    SELECT n.id, n.task_id, n.attempt_no, t.state, t.attempt_count, t.attempt_token = n.attempt_token AS held INTO a
    FROM inserted_attempts n
    LEFT JOIN public.delivery_task t ON t.id = n.task_id
    WHERE n.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND n.outcome IS NULL AND n.late_outcome IS NULL
      AND NOT coalesce(t.state = 'SENDING' AND t.attempt_token = n.attempt_token AND t.attempt_count = n.attempt_no, false)
    ORDER BY n.id
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    misfit := delivery_attempt_call_misfit(a.state, a.attempt_count, a.held, a.attempt_no);
    RAISE EXCEPTION 'delivery_attempt % (task %, attempt %): %', a.id, a.task_id, a.attempt_no, misfit[2]
        USING ERRCODE = 'integrity_constraint_violation',
              TABLE = 'delivery_attempt',
              COLUMN = misfit[1],
              CONSTRAINT = 'delivery_attempt_follows_task',
              HINT = 'attempts are opened by the move that counts them (schema/010_state_machine.sql)';
END
$$;

COMMENT ON FUNCTION delivery_attempt_calls_follow_tasks() IS
    'R3: an open call attempt a statement inserts is the one its task''s claim counted, under the task''s token (schema/021)';

CREATE TRIGGER delivery_attempt_calls_follow_tasks
    AFTER INSERT ON delivery_attempt
    REFERENCING NEW TABLE AS inserted_attempts
    FOR EACH STATEMENT
EXECUTE FUNCTION delivery_attempt_calls_follow_tasks();

COMMENT ON TRIGGER delivery_attempt_calls_follow_tasks ON delivery_attempt IS
    'R3: refuses a statement that opens a call attempt its task''s claim did not count';

-- The row trigger keeps every insert but an open call: SKIP, MANUAL and RECEIPT rows, and any call
-- inserted with an outcome (refused by the function, as an outcome that does not fit the action or as a
-- call opened closed).
DROP TRIGGER delivery_attempt_fits_insert ON delivery_attempt;
CREATE TRIGGER delivery_attempt_fits_insert
    AFTER INSERT ON delivery_attempt
    FOR EACH ROW
    WHEN (NEW.action NOT IN ('SEND', 'QUERY', 'TOPIC_RESEND') OR NEW.outcome IS NOT NULL OR NEW.late_outcome IS NOT NULL)
EXECUTE FUNCTION delivery_attempt_fits();

COMMENT ON TRIGGER delivery_attempt_fits_insert ON delivery_attempt IS
    'R3: refuses an attempt whose outcome does not fit its action or which its task did not just count (open calls: delivery_attempt_calls_follow_tasks)';

-- migrate:down
DROP TRIGGER delivery_attempt_fits_insert ON delivery_attempt;
CREATE TRIGGER delivery_attempt_fits_insert
    AFTER INSERT ON delivery_attempt
    FOR EACH ROW
EXECUTE FUNCTION delivery_attempt_fits();
COMMENT ON TRIGGER delivery_attempt_fits_insert ON delivery_attempt IS
    'R3: refuses an attempt whose outcome does not fit its action or which its task did not just count';
DROP TRIGGER delivery_attempt_calls_follow_tasks ON delivery_attempt;
DROP FUNCTION delivery_attempt_calls_follow_tasks();

DROP TRIGGER delivery_task_evidence ON delivery_task;
CREATE CONSTRAINT TRIGGER delivery_task_evidence
    AFTER UPDATE ON delivery_task
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.attempt_count <> OLD.attempt_count
          OR (OLD.state = 'SENDING' AND NEW.state IN ('PENDING', 'FAILED'))
          OR (OLD.outcome_uncertain AND NOT NEW.outcome_uncertain))
EXECUTE FUNCTION delivery_task_evidence();
COMMENT ON TRIGGER delivery_task_evidence ON delivery_task IS
    'R3, R6: refuses at commit a move whose attempt row is missing or says otherwise';
DROP TRIGGER delivery_task_holders_have_attempts ON delivery_task;
DROP FUNCTION delivery_task_holders_have_attempts();
DROP FUNCTION delivery_attempt_call_misfit(text, integer, boolean, integer);

DROP TRIGGER delivery_attempt_append_only ON delivery_attempt;
CREATE TRIGGER delivery_attempt_append_only
    AFTER UPDATE ON delivery_attempt
    FOR EACH ROW
EXECUTE FUNCTION delivery_attempt_append_only();
COMMENT ON TRIGGER delivery_attempt_append_only ON delivery_attempt IS
    'R3: rejects any UPDATE that rewrites what an attempt recorded';

DROP TRIGGER delivery_task_state_machine ON delivery_task;
CREATE TRIGGER delivery_task_state_machine
    AFTER UPDATE ON delivery_task
    FOR EACH ROW
    WHEN (OLD.* IS DISTINCT FROM NEW.*)
EXECUTE FUNCTION delivery_task_state_machine();
COMMENT ON TRIGGER delivery_task_state_machine ON delivery_task IS
    'R2, R6: refuses any UPDATE that is not a move of the delivery protocol';
