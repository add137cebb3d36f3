-- Queries of the load bench only (bench/load, the `bench` binary of bench/cmd/bench): load figures, the
-- seed's claim as a baseline, and the checks after a load run. Compiled by sqlc's second target into
-- bench/dbgen, apart from the product's dbgen: no worker, create or operator command can call them.
-- The bench writes test data: run it on a throwaway database only.

-- name: BenchSeedClaim :one
-- The SEED's unindexed claim (docs/protocol.md#claim), verbatim: one OR over states and ORDER BY t.id, written for
-- a table with no claim index, so its cost grows with the finished history in front of the first due
-- task (docs/protocol.md#known-boundaries). Kept ONLY as a benchmark baseline, run by the bench in a transaction it
-- rolls back (it claims nothing); NEVER used by workers, which run TaskClaim. On this schema the planner may still serve its OR with a BitmapOr over the partial
-- claim indexes and sort every due task; BenchSeedClaimOnSeedIndexes measures it without that rescue.
SELECT t.id, t.state, t.channel, t.attempt_count, t.outcome_uncertain,
       (t.state = 'SENDING') AS lease_expired,
       coalesce(p.enabled, false), p.address, n.body, n.expires_at <= now()
  FROM delivery_task t
  JOIN notification n ON n.id = t.notification_id
  LEFT JOIN channel_pref p ON p.user_id = n.user_id AND p.channel = t.channel
 WHERE (t.state IN ('PENDING', 'UNKNOWN') AND t.next_attempt_at <= now())
    OR (t.state = 'SENDING' AND t.lease_until < now())
 ORDER BY t.id
 LIMIT 1
 FOR UPDATE OF t SKIP LOCKED;

-- name: BenchSeedClaimOnSeedIndexes :one
-- BenchSeedClaim again, under its own name so that it gets its own prepared statement and plan: the
-- bench runs it after BenchPlanWithoutBitmapScans, in a transaction it rolls back. This schema's partial
-- claim indexes can serve the seed's OR only through a BitmapOr; without bitmap scans the planner has
-- what the seed's schema had (the primary key): walk delivery_task by id, or scan it all and sort. A
-- benchmark baseline only; never used by workers.
SELECT t.id, t.state, t.channel, t.attempt_count, t.outcome_uncertain,
       (t.state = 'SENDING') AS lease_expired,
       coalesce(p.enabled, false), p.address, n.body, n.expires_at <= now()
  FROM delivery_task t
  JOIN notification n ON n.id = t.notification_id
  LEFT JOIN channel_pref p ON p.user_id = n.user_id AND p.channel = t.channel
 WHERE (t.state IN ('PENDING', 'UNKNOWN') AND t.next_attempt_at <= now())
    OR (t.state = 'SENDING' AND t.lease_until < now())
 ORDER BY t.id
 LIMIT 1
 FOR UPDATE OF t SKIP LOCKED;

-- name: BenchPlanWithoutBitmapScans :exec
-- enable_bitmapscan = off until the end of the current transaction (set_config(..., true) is SET LOCAL).
SELECT set_config('enable_bitmapscan', 'off', true);

-- name: BenchFillHistory :execrows
-- Inserts history fast, in one statement: @notifications notifications (event keys @tag-<g> for g from
-- @first on, created a day ago), each with a task on push and on sms claimed then (SENDING, held by
-- 'bench-history', its lease far away so that no worker takes it over) and its open SEND attempt.
-- BenchFinishHistory then finishes them: the state machine (schema/003) accepts history only as the
-- protocol's moves make it (a call's attempt is opened by its holder, then recorded and finished).
-- Returns the number of attempts (= tasks) inserted. The parameters sit in their own CTE (arg): sqlc
-- v1.31 mis-edits named parameters inside a data-modifying CTE.
WITH arg AS (
    SELECT @tag::text AS tag, @first::bigint AS first, @notifications::bigint AS notifications
), n AS (
    INSERT INTO notification (user_id, event_key, body, created_at, expires_at)
    SELECT 'bench-history-u' || (g % 1000), arg.tag || '-' || g, 'history ' || g,
           now() - interval '1 day', now() - interval '23 hours'
    FROM arg CROSS JOIN generate_series(arg.first, arg.first + arg.notifications - 1) AS g
    RETURNING id, created_at
), t AS (
    INSERT INTO delivery_task (notification_id, channel, state, attempt_count, max_attempts, attempt_token,
                               lease_owner, lease_until, next_attempt_at, created_at, updated_at)
    SELECT n.id, c.channel, 'SENDING', 1, 3, gen_random_uuid(), 'bench-history', now() + interval '1 day', NULL,
           n.created_at, n.created_at
    FROM n CROSS JOIN (VALUES ('push'), ('sms')) AS c (channel)
    RETURNING id, attempt_token, created_at
)
INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, started_at)
SELECT t.id, 1, t.attempt_token, 'SEND', 'bench-history', t.created_at
FROM t;

-- name: BenchFinishHistory :execrows
-- Finishes the history BenchFillHistory inserted, as workers would have a second after each claim: the
-- attempt ACCEPTED with a message id, the task SENT. Finished tasks carry no next_attempt_at nor lease
-- (CHECK delivery_task_scheduled_iff_waiting), so they end in none of the claim indexes; the held ones
-- are found through delivery_task_leased_idx (only held tasks have a lease). Returns the tasks finished.
WITH held AS (
    SELECT t.id, t.attempt_token, t.channel || '-history-' || t.notification_id AS provider_msg_id
    FROM delivery_task t
    WHERE t.lease_until IS NOT NULL AND t.lease_owner = 'bench-history' AND t.state = 'SENDING'
), recorded AS (
    UPDATE delivery_attempt a
    SET outcome = 'ACCEPTED', finished_at = a.started_at + interval '1 second', provider_msg_id = h.provider_msg_id
    FROM held h
    WHERE a.attempt_token = h.attempt_token AND a.outcome IS NULL
)
UPDATE delivery_task t
SET state = 'SENT', provider_msg_id = h.provider_msg_id, lease_owner = NULL, lease_until = NULL,
    updated_at = t.created_at + interval '1 second'
FROM held h
WHERE t.id = h.id;

-- name: BenchAnalyze :exec
-- Between the create and the deliver phase: fresh planner statistics, as bench/pgbench/setup.sql takes
-- them before pgbench replays the same SQL, so both sides start from the same kind of tables.
ANALYZE notification, delivery_task, delivery_attempt, channel_pref;

-- name: BenchVacuumAnalyze :exec
-- Before each claim-latency probe: the tables as autovacuum leaves them in steady state (dead rows of
-- earlier phases gone, visibility map set, fresh planner statistics), and no insert-triggered
-- autovacuum of a million new rows running on a small machine while the probe measures.
VACUUM (ANALYZE) notification, delivery_task, delivery_attempt, channel_pref;

-- name: BenchXactCommit :one
-- Committed transactions of this database so far (cumulative statistics, flushed by each backend at
-- most about once a second): the delta over a phase divided by its deliveries, for both peers
-- (bench/load, bench/river). Beside them the rows
-- written (inserted, updated, deleted) and, of the updates to the product's tables, how many were
-- HOT (no index entry written): what each delivery costs the server besides its statements. And the
-- autovacuum and autoanalyze runs finished on its tables: server work that the server's CPU counts
-- and that falls in some phases and not others (a run still going at the end is not counted).
SELECT coalesce(d.xact_commit, 0)::bigint AS xact_commit,
       (coalesce(d.tup_inserted, 0) + coalesce(d.tup_updated, 0) + coalesce(d.tup_deleted, 0))::bigint AS rows_written,
       coalesce(t.n_tup_upd, 0)::bigint AS updates,
       coalesce(t.n_tup_hot_upd, 0)::bigint AS hot_updates,
       coalesce(t.autovacuums, 0)::bigint AS autovacuums
FROM pg_catalog.pg_stat_database d,
     LATERAL (SELECT sum(n_tup_upd) AS n_tup_upd, sum(n_tup_hot_upd) AS n_tup_hot_upd,
                     sum(autovacuum_count + autoanalyze_count) AS autovacuums
              FROM pg_catalog.pg_stat_user_tables) t
WHERE d.datname = current_database();

-- name: BenchFinishedTasks :one
-- Tasks no claim will select again (finished or parked): the history a claim must not walk.
SELECT count(*)::bigint AS tasks
FROM delivery_task
WHERE next_attempt_at IS NULL AND state <> 'SENDING';

-- name: BenchRunCheck :one
-- The final check of a bench run over its users (user_id starting with @user_prefix): notifications,
-- (user, event_key) pairs with more than one notification (must be 0, R1), tasks, and tasks not SENT.
SELECT (SELECT count(*) FROM notification n
        WHERE left(n.user_id, length(@user_prefix::text)) = @user_prefix::text)::bigint AS notifications,
       (SELECT count(*) FROM (SELECT 1 FROM notification n
                              WHERE left(n.user_id, length(@user_prefix::text)) = @user_prefix::text
                              GROUP BY n.user_id, n.event_key
                              HAVING count(*) > 1) AS d)::bigint AS duplicate_events,
       (SELECT count(*) FROM delivery_task t JOIN notification n ON n.id = t.notification_id
        WHERE left(n.user_id, length(@user_prefix::text)) = @user_prefix::text)::bigint AS tasks,
       (SELECT count(*) FROM delivery_task t JOIN notification n ON n.id = t.notification_id
        WHERE left(n.user_id, length(@user_prefix::text)) = @user_prefix::text
          AND t.state <> 'SENT')::bigint AS not_sent;

-- name: BenchSentLatency :one
-- Create -> SENT latency of the tasks of notifications @min_id..@max_id: from notification.created_at
-- (the create transaction's start) to the task's updated_at when it became SENT (the finish
-- transaction's start), in milliseconds.
SELECT count(*)::bigint AS sent,
       (1000 * coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM t.updated_at - n.created_at)), 0))::float8 AS p50_ms,
       (1000 * coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM t.updated_at - n.created_at)), 0))::float8 AS p99_ms
FROM delivery_task t
JOIN notification n ON n.id = t.notification_id
WHERE n.id BETWEEN @min_id::bigint AND @max_id::bigint
  AND t.state = 'SENT';

-- name: BenchSettings :one
-- The server settings a throughput figure depends on, printed with it. plan_cache_mode is this session's
-- (a worker connection's, service.WorkerPlanCacheMode): the bench runs pgbench with the same.
SELECT current_setting('server_version')::text     AS server_version,
       current_setting('fsync')::text              AS fsync,
       current_setting('synchronous_commit')::text AS synchronous_commit,
       current_setting('shared_buffers')::text     AS shared_buffers,
       current_setting('plan_cache_mode')::text    AS plan_cache_mode;

-- name: BenchBackendPID :one
-- The process id of this connection's backend. Both peers (bench/load, bench/river) read the server's
-- CPU time from /proc through it (its parent is the postmaster) when PostgreSQL runs on their machine.
SELECT pg_backend_pid()::int AS pid;

-- name: BenchProbePrefs :exec
-- costprobe: 1,000 users (u1..u1000) with push and sms enabled, kept from one round to the next.
INSERT INTO channel_pref (user_id, channel, address, enabled)
SELECT 'u' || g, c, 'a' || g, true
FROM generate_series(1, 1000) AS g, unnest(ARRAY['push', 'sms']) AS c
ON CONFLICT DO NOTHING;

-- name: BenchProbeTasks :exec
-- costprobe: @events new events of those users (keys @run-1..@run-N), each with a due push and sms task,
-- written directly as the table owner (the probe measures the claim and the finish, not the create).
WITH n AS (
    INSERT INTO notification (user_id, event_key, body, expires_at)
    SELECT 'u' || (g % 1000 + 1), @run::text || '-' || g, 'hello ' || g, now() + interval '1 hour'
    FROM generate_series(1, @events::int) AS g
    RETURNING id
)
INSERT INTO delivery_task (notification_id, channel, max_attempts)
SELECT n.id, c, 5 FROM n, unnest(ARRAY['push', 'sms']) AS c;
