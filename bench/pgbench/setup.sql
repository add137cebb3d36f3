-- Prepares due tasks for claim_finish.sql, as the load bench (bench/load) does before it runs pgbench:
--
--   psql "$DATABASE_URL" -X -v ON_ERROR_STOP=1 -v tasks=40000 -f bench/pgbench/setup.sql
--
-- 1000 users with push and sms enabled, then :tasks notifications with one PENDING push task each, all
-- due now (a worker claims one channel per statement; the script replays push claims). Each delivery of claim_finish.sql claims and finishes one of them, so
-- run pgbench for at most :tasks transactions in all (clients x -t): a claim that finds no task makes
-- its \gset fail. Event keys carry this transaction's id: the script can run again on the same database.
-- WRITES test data: a throwaway database only.
\set ON_ERROR_STOP on
BEGIN;
INSERT INTO channel_pref (user_id, channel, address, enabled)
SELECT 'pgbench-u' || u, c.channel, 'pgbench-u' || u || '@' || c.channel, true
FROM generate_series(0, 999) AS u
CROSS JOIN (VALUES ('push'), ('sms')) AS c (channel)
ON CONFLICT (user_id, channel) DO NOTHING;
WITH n AS (
    INSERT INTO notification (user_id, event_key, body, expires_at)
    SELECT 'pgbench-u' || (g % 1000), 'pgbench-' || pg_current_xact_id() || '-' || g,
           'Hello, pgbench notification ' || g, now() + interval '1 hour'
    FROM generate_series(1, :tasks) AS g
    RETURNING id
)
INSERT INTO delivery_task (notification_id, channel, max_attempts, next_attempt_at)
SELECT n.id, 'push', 3, now()
FROM n;
COMMIT;
ANALYZE notification, delivery_task, delivery_attempt, channel_pref;
