-- migrate:up
-- Least privilege for the three kinds of caller. Each role gets exactly what the queries in queries/ that
-- its commands run need, and row-level security draws the line the protocol draws: a worker never
-- resolves a parked task, an operator only resolves parked tasks, a creator only creates new work, and
-- nobody deletes.
--
--   notifier_creator   notifier create, notifier pref set  (Notifier.Create, Notifier.SetPreference)
--   notifier_worker    notifier work                        (Dispatcher: claim, finish)
--   notifier_operator  notifier resolve, review, status     (Notifier.ResolveManually, Task, Attempts,
--                                                            Parked, Status)
--
-- The roles are NOLOGIN groups: grant one to a login role (GRANT notifier_worker TO notifier_worker_app).
-- The table owner (the user that runs these migrations) is not subject to row-level security (no FORCE);
-- neither is a superuser or a BYPASSRLS role, which is why the roles below must never be either.
-- Identity columns (GENERATED ALWAYS) draw their values without a privilege on their sequence, so no
-- sequence is granted. Schema public: PostgreSQL 15 grants USAGE to PUBLIC by default; it is granted
-- explicitly here so that a database that revoked it still works.
-- Nobody of the three may DELETE from any table (none is granted, and no DELETE policy exists). Retention
-- (pruning finished history, see delivery_attempt_retention_only) will get its own role with DELETE and a
-- DELETE policy in a later migration.

-- The three roles. Roles are cluster-wide while migrations run per database, and several databases of one
-- cluster (test templates, staging next to production) run this same migration, possibly at once: a role
-- is created only when missing, and a concurrent creation by another database's migration is not an
-- error. An existing role that could bypass row-level security would make every policy below void, so
-- the migration refuses it rather than pretend.
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['notifier_creator', 'notifier_worker', 'notifier_operator'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created meanwhile by the same migration in another database of this cluster
            END;
        END IF;
        IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = r AND (rolsuper OR rolbypassrls)) THEN
            RAISE EXCEPTION 'role % exists and is a superuser or has BYPASSRLS: its row-level security would be void', r
                USING ERRCODE = 'insufficient_privilege',
                      HINT = format('ALTER ROLE %I NOSUPERUSER NOBYPASSRLS, then migrate again', r);
        END IF;
    END LOOP;
END
$$;

-- Every role resolves the tables in schema public.
GRANT USAGE ON SCHEMA public TO notifier_creator, notifier_worker, notifier_operator;

-- channel_pref: the creator sets preferences (PrefUpsert: INSERT ... ON CONFLICT DO UPDATE ... RETURNING)
-- and reads them when it creates tasks (TaskInsertForEnabledPrefs); the worker reads the switch and the
-- address at claim time (TaskClaim); operators may read them (a task's channel and address, when they
-- look into it).
GRANT SELECT ON channel_pref TO notifier_creator, notifier_worker, notifier_operator;
GRANT INSERT (user_id, channel, address, enabled) ON channel_pref TO notifier_creator;
GRANT UPDATE (address, enabled, version, updated_at) ON channel_pref TO notifier_creator;

-- notification: the creator inserts it (NotificationInsert; its ON CONFLICT target and RETURNING read)
-- and reads the winner back (NotificationGetIDByUserEvent); the worker reads body, owner and expiry at
-- claim time; operators read user and event key of parked tasks (TaskListParked, NotificationGet).
GRANT SELECT ON notification TO notifier_creator, notifier_worker, notifier_operator;
GRANT INSERT (user_id, event_key, body, expires_at) ON notification TO notifier_creator;

-- delivery_task, per role:
--   creator   INSERT the columns TaskInsertForEnabledPrefs sets, SELECT for its RETURNING and for
--             TaskListByNotification (a duplicate submitter's answer).
--   worker    SELECT; UPDATE the columns TaskStartAttempts, TaskSettleWithoutCall, TaskPark and TaskFinish
--             set (the claim's FOR UPDATE also needs UPDATE). Not id, notification_id, channel,
--             max_attempts, created_at: a worker cannot re-target a task or raise its budget.
--   operator  SELECT (TaskGet, TaskListParked, TaskCountByChannelState, TaskOldestReady); UPDATE the
--             columns TaskResolveManually sets.
GRANT SELECT ON delivery_task TO notifier_creator, notifier_worker, notifier_operator;
GRANT INSERT (notification_id, channel, max_attempts, next_attempt_at) ON delivery_task TO notifier_creator;
GRANT UPDATE (state, attempt_count, attempt_token, lease_owner, lease_until, next_attempt_at,
              outcome_uncertain, needs_review, provider_msg_id, last_error, updated_at)
    ON delivery_task TO notifier_worker;
GRANT UPDATE (state, needs_review, attempt_count, provider_msg_id, last_error, updated_at)
    ON delivery_task TO notifier_operator;

-- delivery_attempt, per role (the creator has no access at all):
--   worker    SELECT (its UPDATEs read attempt_token, outcome, late_outcome, provider_msg_id, error);
--             INSERT the columns of TaskStartAttempts' attempt rows and AttemptRecordSkip; UPDATE the columns of
--             TaskFinish (AttemptFinish, AttemptRecordLate) and AttemptMarkLeaseExpired (delivery_attempt_append_only
--             still decides which of those updates are allowed).
--   operator  SELECT (AttemptListByTask, for review and resolve); INSERT the columns of AttemptRecordManual.
GRANT SELECT ON delivery_attempt TO notifier_worker, notifier_operator;
GRANT INSERT (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome, error)
    ON delivery_attempt TO notifier_worker;
GRANT UPDATE (outcome, finished_at, provider_msg_id, error, late_outcome, late_at)
    ON delivery_attempt TO notifier_worker;
GRANT INSERT (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome, provider_msg_id, note)
    ON delivery_attempt TO notifier_operator;

-- Row-level security on the two tables whose rows the roles must split between them. Not FORCEd: the
-- owner (migrations, tests, the retention job until it has its own role) is unaffected. A role without a
-- policy for a command gets no rows for it: in particular, no DELETE policy exists for anyone.
ALTER TABLE delivery_task ENABLE ROW LEVEL SECURITY;
ALTER TABLE delivery_attempt ENABLE ROW LEVEL SECURITY;

-- Guards creation of work: a new task starts PENDING with no attempt made, so a creator can neither
-- forge a SENT (or otherwise settled) task nor pre-spend its attempt budget.
CREATE POLICY delivery_task_creator_insert ON delivery_task FOR INSERT TO notifier_creator
    WITH CHECK (state = 'PENDING' AND attempt_count = 0);

-- The creator reads tasks: the RETURNING of TaskInsertForEnabledPrefs and TaskListByNotification.
CREATE POLICY delivery_task_creator_select ON delivery_task FOR SELECT TO notifier_creator
    USING (true);

-- The worker reads every task (claim).
CREATE POLICY delivery_task_worker_select ON delivery_task FOR SELECT TO notifier_worker
    USING (true);

-- Guards parked tasks from workers: a worker updates (and locks FOR UPDATE) only tasks not parked for
-- review, so it cannot resolve one; a parked task belongs to the operator. The new row is not restricted
-- (WITH CHECK true): finishing legitimately parks a task (needs_review = true).
CREATE POLICY delivery_task_worker_update ON delivery_task FOR UPDATE TO notifier_worker
    USING (NOT needs_review)
    WITH CHECK (true);

-- The operator reads every task (status, review, resolve's explanation of "not changed").
CREATE POLICY delivery_task_operator_select ON delivery_task FOR SELECT TO notifier_operator
    USING (true);

-- Guards the operator's only write: resolving a parked task (TaskResolveManually) to SENT or FAILED. It
-- cannot touch a task a worker may hold or retry, nor resolve to anything else.
CREATE POLICY delivery_task_operator_update ON delivery_task FOR UPDATE TO notifier_operator
    USING (needs_review)
    WITH CHECK (NOT needs_review AND state IN ('SENT', 'FAILED'));

-- The worker reads attempts (its updates find their row by attempt_token).
CREATE POLICY delivery_attempt_worker_select ON delivery_attempt FOR SELECT TO notifier_worker
    USING (true);

-- Guards attempt creation by workers: the actions of a claim (SEND, QUERY, SKIP), never a MANUAL
-- resolution.
CREATE POLICY delivery_attempt_worker_insert ON delivery_attempt FOR INSERT TO notifier_worker
    WITH CHECK (action IN ('SEND', 'QUERY', 'SKIP'));

-- Guards attempt updates by workers: only their own kind of attempt (finish, lease expiry, late
-- outcome), never an operator's MANUAL row.
CREATE POLICY delivery_attempt_worker_update ON delivery_attempt FOR UPDATE TO notifier_worker
    USING (action IN ('SEND', 'QUERY', 'SKIP'))
    WITH CHECK (action IN ('SEND', 'QUERY', 'SKIP'));

-- The operator reads attempts (review, resolve).
CREATE POLICY delivery_attempt_operator_select ON delivery_attempt FOR SELECT TO notifier_operator
    USING (true);

-- Guards attempt creation by operators: only the MANUAL row of a resolution (AttemptRecordManual), never
-- a SEND/QUERY/SKIP that would pose as a channel call.
CREATE POLICY delivery_attempt_operator_insert ON delivery_attempt FOR INSERT TO notifier_operator
    WITH CHECK (action = 'MANUAL');

-- migrate:down
-- Removes this database's policies and grants. The roles themselves are NOT dropped: roles are
-- cluster-wide, and other databases of the same cluster (other test databases, a staging database next
-- to production) may still use them and hold grants to them; DROP ROLE would fail there ("role cannot be
-- dropped because some objects depend on it") or, worse, succeed and break them. Dropping a role is a
-- cluster administrator's decision, after the last database using it has revoked its grants.
DROP POLICY delivery_attempt_operator_insert ON delivery_attempt;
DROP POLICY delivery_attempt_operator_select ON delivery_attempt;
DROP POLICY delivery_attempt_worker_update ON delivery_attempt;
DROP POLICY delivery_attempt_worker_insert ON delivery_attempt;
DROP POLICY delivery_attempt_worker_select ON delivery_attempt;
DROP POLICY delivery_task_operator_update ON delivery_task;
DROP POLICY delivery_task_operator_select ON delivery_task;
DROP POLICY delivery_task_worker_update ON delivery_task;
DROP POLICY delivery_task_worker_select ON delivery_task;
DROP POLICY delivery_task_creator_select ON delivery_task;
DROP POLICY delivery_task_creator_insert ON delivery_task;
ALTER TABLE delivery_attempt DISABLE ROW LEVEL SECURITY;
ALTER TABLE delivery_task DISABLE ROW LEVEL SECURITY;
-- REVOKE ALL on a table also revokes the column privileges granted above.
REVOKE ALL ON channel_pref, notification, delivery_task, delivery_attempt
    FROM notifier_creator, notifier_worker, notifier_operator;
REVOKE USAGE ON SCHEMA public FROM notifier_creator, notifier_worker, notifier_operator;
