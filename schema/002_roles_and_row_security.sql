-- migrate:up
-- Least privilege for the four kinds of caller. Each role gets exactly what the queries in queries/ that
-- its commands run need, and row-level security draws the line the protocol draws: a worker never
-- resolves a parked task, an operator only resolves parked tasks (through notifier_resolve, 003), a
-- creator only creates new work (and cancels it through notifier_cancel, 005), a receiver only records
-- receipts (and settles tasks through notifier_apply_receipt, 004), and nobody deletes history.
--
--   notifier_creator   notifier create, cancel, pref set    (Notifier.Create, Cancel, SetPreference;
--                                                            notifier_create() in the caller's transaction)
--   notifier_worker    notifier work                        (Dispatcher: claim, finish)
--   notifier_operator  notifier resolve, review, status     (Notifier.ResolveManually, Task, Attempts,
--                                                            Parked, Status)
--   notifier_receiver  notifier receipts                    (the signed callbacks of providers)
--
-- The roles are NOLOGIN groups: grant one to a login role (GRANT notifier_worker TO notifier_worker_app).
-- The table owner (the user that runs these migrations) is not subject to row-level security (no FORCE);
-- neither is a superuser or a BYPASSRLS role, which is why the roles below must never be either.
-- Identity columns (GENERATED ALWAYS) draw their values without a privilege on their sequence, so no
-- sequence is granted. Schema public: PostgreSQL 15 grants USAGE to PUBLIC by default; it is granted
-- explicitly here so that a database that revoked it still works.
-- Nobody of the four may DELETE from delivery_task, delivery_attempt or delivery_receipt (none is
-- granted, and no DELETE policy exists): retention (notifier prune) runs as the owner, and the triggers
-- of 003 and 004 keep even the owner to finished history. The functions' EXECUTE grants are with the
-- functions (003, 004, 005).

-- The four roles. Roles are cluster-wide while migrations run per database, and several databases of one
-- cluster (test templates, staging next to production) run this same migration, possibly at once: a role
-- is created only when missing, and a concurrent creation by another database's migration is not an
-- error. An existing role that could bypass row-level security would make every policy below void, so
-- the migration refuses it rather than pretend.
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['notifier_creator', 'notifier_worker', 'notifier_operator', 'notifier_receiver'] LOOP
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
GRANT USAGE ON SCHEMA public TO notifier_creator, notifier_worker, notifier_operator, notifier_receiver;

-- channel_pref: the creator sets preferences (PrefUpsert: INSERT ... ON CONFLICT DO UPDATE ... RETURNING)
-- and reads them when it creates tasks (TaskInsertForEnabledPrefs); the worker reads the switch and the
-- address at claim time (TaskClaim); operators may read them (a task's channel and address, when they
-- look into it); the receiver may switch a preference off after a hard bounce (--disable-on-bounce).
GRANT SELECT ON channel_pref TO notifier_creator, notifier_worker, notifier_operator, notifier_receiver;
GRANT INSERT (user_id, channel, address, enabled) ON channel_pref TO notifier_creator;
GRANT UPDATE (address, enabled, version, updated_at) ON channel_pref TO notifier_creator;
GRANT UPDATE (enabled, version, updated_at) ON channel_pref TO notifier_receiver;

-- notification: the creator inserts it (NotificationInsert; its ON CONFLICT target and RETURNING read),
-- with its send time, and reads the winner back (NotificationGetIDByUserEvent); the worker reads body,
-- owner, expiry and cancel at claim time; operators read user and event key of parked tasks
-- (TaskListParked, NotificationGet); the receiver reads what matching a receipt needs.
GRANT SELECT ON notification TO notifier_creator, notifier_worker, notifier_operator, notifier_receiver;
GRANT INSERT (user_id, event_key, body, expires_at, send_at) ON notification TO notifier_creator;

-- delivery_task, per role:
--   creator   INSERT the columns TaskInsertForEnabledPrefs sets (a fallback chain's position included),
--             SELECT for its RETURNING and for TaskListByNotification (a duplicate submitter's answer).
--             next_attempt_at: the policy below decides which value it may take.
--   worker    SELECT; UPDATE the columns TaskStartAttempts, TaskSettleWithoutCall, TaskPark and TaskFinish
--             set (the claim's FOR UPDATE also needs UPDATE). Not id, notification_id, channel, ref,
--             max_attempts, created_at, fallback_position: a worker cannot re-target a task or raise its
--             budget.
--   operator  SELECT (TaskGet, TaskListParked, TaskCountByChannelState, TaskOldestReady); it writes only
--             through notifier_resolve (003).
--   receiver  SELECT; it writes only through notifier_apply_receipt (004).
GRANT SELECT ON delivery_task TO notifier_creator, notifier_worker, notifier_operator, notifier_receiver;
GRANT INSERT (notification_id, channel, max_attempts, next_attempt_at, fallback_position) ON delivery_task TO notifier_creator;
GRANT UPDATE (state, attempt_count, attempt_token, lease_owner, lease_until, next_attempt_at,
              outcome_uncertain, needs_review, provider_msg_id, last_error, updated_at, uncertain_since,
              account_refusals)
    ON delivery_task TO notifier_worker;

-- delivery_task_key: every role may look a task up by its keys, as it reads delivery_task (the creator's
-- TaskListByNotification, the worker's and the receiver's ReceiptTaskByRef, the operator's status and
-- cancel); none may write them: the insert trigger delivery_task_key_insert (003) is the only writer.
GRANT SELECT ON delivery_task_key TO notifier_creator, notifier_worker, notifier_operator, notifier_receiver;

-- delivery_attempt, per role (the creator has no access at all):
--   worker    SELECT (its UPDATEs read attempt_token, outcome, late_outcome, provider_msg_id, error);
--             INSERT the columns of TaskStartAttempts' attempt rows and AttemptRecordSkip; UPDATE the columns of
--             TaskFinish (AttemptFinish, AttemptRecordLate) and AttemptMarkLeaseExpired (delivery_attempt_append_only
--             still decides which of those updates are allowed).
--   operator  SELECT (AttemptListByTask, for review and resolve).
--   receiver  SELECT (matching a receipt by the provider's message id).
GRANT SELECT ON delivery_attempt TO notifier_worker, notifier_operator, notifier_receiver;
GRANT INSERT (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome, error)
    ON delivery_attempt TO notifier_worker;
GRANT UPDATE (outcome, finished_at, provider_msg_id, error, late_outcome, late_at)
    ON delivery_attempt TO notifier_worker;

-- delivery_task_provider_msg: read by those who read attempts (the receiver matches a receipt by a
-- provider's message id through it); none may write it: the triggers of 003 that keep it are the only
-- writers, whatever role writes the attempt or the task.
GRANT SELECT ON delivery_task_provider_msg TO notifier_worker, notifier_operator, notifier_receiver;

-- delivery_receipt: the receiver records receipts and reads them (its dedupe by event id); operators
-- read them (review, status). The worker learns only the count of contradicted tasks, through
-- notifier_late_accepted_count (004): a grant on the table would also let it run `notifier review`.
GRANT SELECT ON delivery_receipt TO notifier_operator, notifier_receiver;
GRANT INSERT (task_id, source, event_id, kind, hard_bounce, effect, provider_msg_id, occurred_at, detail)
    ON delivery_receipt TO notifier_receiver;

-- channel_rate_limit: notifier_worker runs all of its moves (SELECT for their WHERE, ON CONFLICT and
-- RETURNING); it cannot rename a bucket (no UPDATE of channel) nor delete one. notifier_operator reads
-- them (notifier status). Lifting a limit is deleting its row, as the tables' owner.
GRANT SELECT ON channel_rate_limit TO notifier_worker, notifier_operator;
GRANT INSERT (channel, rate, burst, tokens) ON channel_rate_limit TO notifier_worker;
GRANT UPDATE (rate, burst, tokens, refilled_at, paused_until, updated_at) ON channel_rate_limit TO notifier_worker;

-- channel_pause: the worker writes pauses (its finish), takes probes (its claim) and ends them (a probe's
-- answer); the operator reads them (notifier status, the console). Lifting a pause by hand is deleting
-- its row, as the owner.
GRANT SELECT ON channel_pause TO notifier_worker, notifier_operator;
GRANT INSERT (channel, cause, backoff_seconds, probe_after, probe_hold_seconds) ON channel_pause TO notifier_worker;
GRANT UPDATE (cause, backoff_seconds, probe_after, probe_hold_seconds, updated_at) ON channel_pause TO notifier_worker;
GRANT DELETE ON channel_pause TO notifier_worker;

-- Row-level security on the two tables whose rows the roles must split between them. Not FORCEd: the
-- owner (migrations, tests, retention) is unaffected. A role without a policy for a command gets no rows
-- for it: in particular, no DELETE policy exists for anyone.
ALTER TABLE delivery_task ENABLE ROW LEVEL SECURITY;
ALTER TABLE delivery_task_key ENABLE ROW LEVEL SECURITY;
ALTER TABLE delivery_attempt ENABLE ROW LEVEL SECURITY;
ALTER TABLE delivery_task_provider_msg ENABLE ROW LEVEL SECURITY;

-- Guards creation of work: a new task starts PENDING with no attempt made, for a notification this very
-- transaction inserted (a creator cannot add channels to someone else's notification, or to an old one)
-- and a channel its user has enabled, due exactly when its notification says.
--   * Due: at now() for a notification without a send time or with one already past, at its send time
--     otherwise; a later place in a fallback chain waits unreleased (no next_attempt_at). A task dated
--     back (before now()) would jump the queue, and a task dated to any other time than its
--     notification's would be sent at a time nobody asked for; both are refused.
--   * This transaction's notification, savepoints included: a notification row that this statement can
--     see and whose inserting xid is still in progress was inserted by this transaction or one of its
--     subtransactions, because another transaction's uncommitted rows are invisible (and a transaction
--     whose commit is not yet visible to our snapshot is invisible too). pg_xact_status() answers "in
--     progress" for the current transaction tree first (TransactionIdIsCurrentTransactionId). It takes a
--     full 64-bit xid; xmin holds the low 32 bits, so the policy rebuilds the full id as the top-level
--     xid plus d, the signed distance from the top level's low 32 bits to xmin's, modulo 2^32: our
--     subtransactions' xids come after the top level's, across an epoch boundary too. A row older than
--     our top-level xid (d < 0) is not ours and is not looked up; a later transaction's xid was
--     assigned, so pg_xact_status() can answer for it. A row's raw xmin outlives freezing, and an
--     ancient frozen row's 32 bits may coincide with one of our xids; so the policy first asks
--     created_at = now(): the creator cannot set created_at (its column grant), a notification of this
--     transaction was stamped with its start time, and an old one was not. A rolled-back savepoint takes
--     its notification with it, and with it the right to add tasks.
-- The expression sits in the policy itself rather than in a helper function: its functions and
-- operators are bound when the policy is created (no caller's search_path reaches them), and a
-- creator's task insert costs less (10,000 tasks: 320-360 ms, where a SQL helper with its own
-- search_path took 380-500 ms).
CREATE POLICY delivery_task_creator_insert ON delivery_task FOR INSERT TO notifier_creator
    WITH CHECK (state = 'PENDING' AND attempt_count = 0
                AND EXISTS (SELECT FROM notification n
                            JOIN channel_pref p ON p.user_id = n.user_id AND p.channel = delivery_task.channel
                            WHERE n.id = delivery_task.notification_id
                              AND CASE WHEN delivery_task.fallback_position > 1 THEN delivery_task.next_attempt_at IS NULL
                                       ELSE delivery_task.next_attempt_at = greatest(n.send_at, now()) END
                              -- CASE, not AND: created_at and d >= 0 are asked before pg_xact_status
                              AND CASE WHEN n.created_at = now()
                                            AND (n.xmin::text::bigint - pg_current_xact_id()::text::bigint % 4294967296
                                                 + 6442450944) % 4294967296 - 2147483648 >= 0
                                       THEN pg_xact_status((pg_current_xact_id()::text::bigint
                                                            + (n.xmin::text::bigint - pg_current_xact_id()::text::bigint % 4294967296
                                                               + 6442450944) % 4294967296 - 2147483648)::text::xid8) = 'in progress'
                                       ELSE false END
                              AND p.enabled));

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

-- The receiver reads every task (matching a receipt); it writes none directly.
CREATE POLICY delivery_task_receiver_select ON delivery_task FOR SELECT TO notifier_receiver USING (true);

-- A task's keys are read as the task is: by every role, every row. No write policy: no role writes them.
CREATE POLICY delivery_task_key_creator_select ON delivery_task_key FOR SELECT TO notifier_creator USING (true);
CREATE POLICY delivery_task_key_worker_select ON delivery_task_key FOR SELECT TO notifier_worker USING (true);
CREATE POLICY delivery_task_key_operator_select ON delivery_task_key FOR SELECT TO notifier_operator USING (true);
CREATE POLICY delivery_task_key_receiver_select ON delivery_task_key FOR SELECT TO notifier_receiver USING (true);

-- The worker reads attempts (its updates find their row by attempt_token).
CREATE POLICY delivery_attempt_worker_select ON delivery_attempt FOR SELECT TO notifier_worker
    USING (true);

-- Guards attempt creation by workers: the actions of a claim (SEND, QUERY, SKIP, TOPIC_RESEND), never a
-- MANUAL resolution or a RECEIPT.
CREATE POLICY delivery_attempt_worker_insert ON delivery_attempt FOR INSERT TO notifier_worker
    WITH CHECK (action IN ('SEND', 'QUERY', 'SKIP', 'TOPIC_RESEND'));

-- Guards attempt updates by workers: only their own kind of attempt (finish, lease expiry, late
-- outcome), never an operator's MANUAL row or a receipt's.
CREATE POLICY delivery_attempt_worker_update ON delivery_attempt FOR UPDATE TO notifier_worker
    USING (action IN ('SEND', 'QUERY', 'SKIP', 'TOPIC_RESEND'))
    WITH CHECK (action IN ('SEND', 'QUERY', 'SKIP', 'TOPIC_RESEND'));

-- The operator reads attempts (review, resolve).
CREATE POLICY delivery_attempt_operator_select ON delivery_attempt FOR SELECT TO notifier_operator
    USING (true);

-- The receiver reads every attempt; it writes none directly.
CREATE POLICY delivery_attempt_receiver_select ON delivery_attempt FOR SELECT TO notifier_receiver USING (true);

-- A task's other provider message ids are read as its attempts are. No write policy: no role writes them.
CREATE POLICY delivery_task_provider_msg_worker_select ON delivery_task_provider_msg FOR SELECT TO notifier_worker USING (true);
CREATE POLICY delivery_task_provider_msg_operator_select ON delivery_task_provider_msg FOR SELECT TO notifier_operator USING (true);
CREATE POLICY delivery_task_provider_msg_receiver_select ON delivery_task_provider_msg FOR SELECT TO notifier_receiver USING (true);

-- migrate:down
-- Removes this database's policies and grants. The roles themselves are NOT dropped: roles are
-- cluster-wide, and other databases of the same cluster (other test databases, a staging database next
-- to production) may still use them and hold grants to them; DROP ROLE would fail there ("role cannot be
-- dropped because some objects depend on it") or, worse, succeed and break them. Dropping a role is a
-- cluster administrator's decision, after the last database using it has revoked its grants.
DROP POLICY delivery_task_provider_msg_receiver_select ON delivery_task_provider_msg;
DROP POLICY delivery_task_provider_msg_operator_select ON delivery_task_provider_msg;
DROP POLICY delivery_task_provider_msg_worker_select ON delivery_task_provider_msg;
DROP POLICY delivery_attempt_receiver_select ON delivery_attempt;
DROP POLICY delivery_attempt_operator_select ON delivery_attempt;
DROP POLICY delivery_attempt_worker_update ON delivery_attempt;
DROP POLICY delivery_attempt_worker_insert ON delivery_attempt;
DROP POLICY delivery_attempt_worker_select ON delivery_attempt;
DROP POLICY delivery_task_key_receiver_select ON delivery_task_key;
DROP POLICY delivery_task_key_operator_select ON delivery_task_key;
DROP POLICY delivery_task_key_worker_select ON delivery_task_key;
DROP POLICY delivery_task_key_creator_select ON delivery_task_key;
DROP POLICY delivery_task_receiver_select ON delivery_task;
DROP POLICY delivery_task_operator_select ON delivery_task;
DROP POLICY delivery_task_worker_update ON delivery_task;
DROP POLICY delivery_task_worker_select ON delivery_task;
DROP POLICY delivery_task_creator_select ON delivery_task;
DROP POLICY delivery_task_creator_insert ON delivery_task;
ALTER TABLE delivery_task_provider_msg DISABLE ROW LEVEL SECURITY;
ALTER TABLE delivery_attempt DISABLE ROW LEVEL SECURITY;
ALTER TABLE delivery_task_key DISABLE ROW LEVEL SECURITY;
ALTER TABLE delivery_task DISABLE ROW LEVEL SECURITY;
-- REVOKE ALL on a table also revokes the column privileges granted above.
REVOKE ALL ON channel_pref, notification, delivery_task, delivery_task_key, delivery_attempt,
              delivery_task_provider_msg, delivery_receipt, channel_rate_limit, channel_pause
    FROM notifier_creator, notifier_worker, notifier_operator, notifier_receiver;
REVOKE USAGE ON SCHEMA public FROM notifier_creator, notifier_worker, notifier_operator, notifier_receiver;
