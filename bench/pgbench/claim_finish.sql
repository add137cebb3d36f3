-- GENERATED from queries/*.sql by TestPgbenchScript (bench/pgbench/script_test.go); do not edit.
-- After changing a query: NOTIFIER_UPDATE_BENCH=1 go test ./bench/pgbench -run TestPgbenchScript
--
-- One delivery as a Go worker makes it at --max-in-flight 1 --batch 1 (Dispatcher.ClaimBatch, then
-- Dispatcher.FinishBatch with an ACCEPTED observation): the claim transaction and the finish statement
-- of one task, statement for statement, with the parameters of one task: arrays of one element, the
-- task id and attempt token taken from the claim with \gset, constants where the worker sends
-- constants. Run it with -M prepared (pgx prepares every statement too) and the workers'
-- plan_cache_mode (service.WorkerPlanCacheMode) against tasks made by setup.sql, no more transactions
-- than tasks:
--
--   psql "$DATABASE_URL" -v tasks=40000 -f bench/pgbench/setup.sql
--   PGOPTIONS='-c plan_cache_mode=force_generic_plan' \
--     pgbench -n -M prepared -c 8 -j 2 -t 5000 -f bench/pgbench/claim_finish.sql "$DATABASE_URL"
--
-- Same statements, not the same round trips: at --max-in-flight 1 the worker sends TaskFinish of the
-- previous task with TxBegin and TaskClaim (the finish carries the next claim), then TaskStartAttempts
-- with TxCommit: 2 round trips per delivery; pgbench cannot pipeline a statement whose result it
-- \gsets, so here each of the 5 statements waits for its answer. The worker claims one channel per
-- TaskClaim, its channels in turn; setup.sql makes push tasks only, and the script claims push.
\set max_tasks 1
\set lease_seconds 60
-- TxBegin (queries/tx.sql)
BEGIN ISOLATION LEVEL READ COMMITTED;
-- TaskClaim (queries/delivery_task.sql)
WITH probe AS (
    UPDATE channel_pause p
    SET probe_after = now() + make_interval(secs => p.probe_hold_seconds)
    WHERE p.channel = 'push'::text
      AND p.probe_after <= now()
    RETURNING p.channel
), gate AS (
    SELECT CASE WHEN EXISTS (SELECT FROM probe) THEN 1
                WHEN EXISTS (SELECT FROM channel_pause p WHERE p.channel = 'push'::text) THEN 0
                ELSE :max_tasks::int END AS max_tasks,
           EXISTS (SELECT FROM probe) AS probe
), lease_expired AS (
    SELECT t.id, t.notification_id, t.channel, t.ref, t.state, t.attempt_count, t.max_attempts, t.outcome_uncertain,
           t.attempt_token, t.uncertain_since, t.updated_at, t.receipt_at, t.account_refusals
    FROM delivery_task t
    WHERE t.channel = 'push'::text
      AND t.state = 'SENDING'
      AND t.lease_until < now()
    ORDER BY t.lease_until, t.id
    LIMIT (SELECT g.max_tasks FROM gate g)
    FOR UPDATE OF t SKIP LOCKED
), due AS (
    SELECT t.id, t.notification_id, t.channel, t.ref, t.state, t.attempt_count, t.max_attempts, t.outcome_uncertain,
           t.attempt_token, t.uncertain_since, t.updated_at, t.receipt_at, t.account_refusals
    FROM delivery_task t
    WHERE t.channel = 'push'::text
      AND t.next_attempt_at IS NOT NULL
      AND t.next_attempt_at <= now()
    ORDER BY t.next_attempt_at, t.id
    LIMIT (SELECT g.max_tasks FROM gate g)
    FOR UPDATE OF t SKIP LOCKED
), locked AS (
    (SELECT l.*, true AS lease_expired FROM lease_expired l
     UNION ALL
     SELECT d.*, false AS lease_expired FROM due d)
    LIMIT (SELECT g.max_tasks FROM gate g)
)
SELECT t.id, t.notification_id, t.channel, t.ref, t.state, t.attempt_count, t.max_attempts, t.outcome_uncertain,
       t.account_refusals,
       (SELECT g.probe FROM gate g)::bool AS probe,
       t.lease_expired::bool            AS lease_expired,
       t.attempt_token                  AS held_token,
       coalesce(p.enabled, false)::bool AS pref_enabled,
       coalesce(p.address, '')::text    AS address,
       n.body,
       n.expires_at,
       (n.expires_at <= now())::bool    AS expired,
       (n.cancelled_at IS NOT NULL)::bool AS cancelled,
       (t.receipt_at IS NOT NULL)::bool AS receipt_noted,
       extract(epoch FROM now() - coalesce(t.uncertain_since, t.updated_at))::float8 AS uncertain_age_seconds
FROM locked t
CROSS JOIN LATERAL (
    SELECT n.user_id, n.body, n.expires_at, n.cancelled_at FROM notification n WHERE n.id = t.notification_id OFFSET 0
) n
LEFT JOIN LATERAL (
    SELECT p.enabled, p.address FROM channel_pref p WHERE p.user_id = n.user_id AND p.channel = t.channel OFFSET 0
) p ON true \gset
-- TaskStartAttempts (queries/delivery_task.sql)
WITH started AS (
    UPDATE delivery_task t
    SET state             = 'SENDING',
        attempt_token     = u.attempt_token::uuid,
        lease_owner       = 'pgbench'::text,
        lease_until       = now() + make_interval(secs => :lease_seconds::float8),
        next_attempt_at   = NULL,
        attempt_count     = t.attempt_count + 1,
        outcome_uncertain = u.outcome_uncertain,
        uncertain_since   = CASE WHEN u.outcome_uncertain THEN coalesce(t.uncertain_since, t.updated_at) END,
        updated_at        = now()
    FROM (SELECT unnest(ARRAY[:id]::bigint[]) AS id,
                 unnest(ARRAY[gen_random_uuid()::text]) AS attempt_token,
                 unnest('{f}'::bool[]) AS outcome_uncertain,
                 unnest('{SEND}'::text[]) AS action) AS u
    WHERE t.id = u.id
      AND CASE t.state WHEN 'SENDING' THEN t.lease_until < now() ELSE t.next_attempt_at <= now() END
    RETURNING t.id, t.attempt_token, t.attempt_count, t.lease_until, u.action
), opened AS (
    INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
    SELECT s.id, s.attempt_count, s.attempt_token, s.action, 'pgbench'::text
    FROM started s
)
SELECT s.id, s.attempt_token::uuid AS attempt_token, s.attempt_count, s.lease_until::timestamptz AS lease_until
FROM started s \gset
-- TxCommit (queries/tx.sql)
COMMIT;
-- the channel call happens here, outside any transaction; the finish is one autocommit statement
-- TaskFinish (queries/delivery_task.sql)
WITH u AS (
    SELECT unnest(ARRAY[:id]::bigint[]) AS id,
           unnest(ARRAY[:attempt_token]::text[])::uuid AS attempt_token,
           unnest('{SENT}'::text[]) AS state,
           unnest('{f}'::bool[]) AS outcome_uncertain,
           unnest('{f}'::bool[]) AS needs_review,
           unnest('{pgbench-msg}'::text[]) AS provider_msg_id,
           unnest('{""}'::text[]) AS last_error,
           unnest('{-1}'::float8[]) AS retry_after_seconds,
           unnest('{ACCEPTED}'::text[]) AS outcome,
           unnest('{""}'::text[]) AS error
), recorded_before AS (
    SELECT u.attempt_token
    FROM u
    JOIN delivery_attempt a ON a.attempt_token = u.attempt_token
    WHERE a.outcome = u.outcome
), finished AS (
    UPDATE delivery_task t
    SET state             = u.state,
        outcome_uncertain = u.outcome_uncertain,
        uncertain_since   = CASE WHEN u.outcome_uncertain THEN coalesce(t.uncertain_since, t.updated_at) END,
        needs_review      = u.needs_review,
        account_refusals  = t.account_refusals + CASE WHEN u.outcome = 'ACCOUNT_REFUSED' THEN 1 ELSE 0 END,
        provider_msg_id   = coalesce(nullif(u.provider_msg_id, ''), t.provider_msg_id),
        last_error        = nullif(u.last_error, ''),
        lease_owner       = NULL,
        lease_until       = NULL,
        next_attempt_at   = CASE WHEN u.retry_after_seconds >= 0
                                 THEN now() + make_interval(secs => u.retry_after_seconds) END,
        updated_at        = now()
    FROM u
    WHERE t.id = u.id
      AND t.state = 'SENDING'
      AND t.attempt_token = u.attempt_token
    RETURNING t.id, t.attempt_token
), attempt_finish AS (
    UPDATE delivery_attempt a
    SET outcome         = u.outcome,
        finished_at     = now(),
        provider_msg_id = nullif(u.provider_msg_id, ''),
        error           = nullif(u.error, '')
    FROM u
    JOIN finished f ON f.attempt_token = u.attempt_token
    WHERE a.attempt_token = u.attempt_token
      AND a.outcome IS NULL
), attempt_record_late AS (
    UPDATE delivery_attempt a
    SET late_outcome    = u.outcome,
        late_at         = now(),
        provider_msg_id = coalesce(a.provider_msg_id, nullif(u.provider_msg_id, '')),
        error           = coalesce(a.error, nullif(u.error, ''))
    FROM u
    WHERE a.attempt_token = u.attempt_token
      AND a.late_outcome IS NULL
      AND NOT EXISTS (SELECT 1 FROM finished f WHERE f.attempt_token = u.attempt_token)
      AND NOT EXISTS (SELECT 1 FROM recorded_before r WHERE r.attempt_token = u.attempt_token)
      AND a.outcome IS DISTINCT FROM u.outcome
)
SELECT u.id::bigint AS id,
       (f.id IS NOT NULL OR EXISTS (SELECT 1 FROM recorded_before r WHERE r.attempt_token = u.attempt_token))::bool AS current
FROM u
LEFT JOIN finished f ON f.attempt_token = u.attempt_token;
