-- Facts about the server that commands check before they start work.

-- name: ServerConnectionsAvailable :one
-- How many connections the server accepts from ordinary roles: max_connections less the slots reserved
-- for superusers. A worker sizes its pool independently of its calls in flight and refuses to start
-- when its pool could take more than a quarter of these, so several workers, the creators and the
-- operators always find a connection (a pool of 258 once left a worker stalled on "too many clients").
SELECT (current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int)::int AS available;

-- name: ServerStanding :one
-- Whether this server takes writes, and whether a commit here waits for a standby. A command that
-- writes refuses a server that is read-only (a standby, or a primary demoted by a failover: pg_is_in_
-- recovery(); or default_transaction_read_only) at start, naming target_session_attrs=read-write,
-- instead of retrying SQLSTATE 25006 forever. Only synchronous replication keeps R1 and R3 across a
-- failover (a create answered created=true, an attempt row written before the call): a commit waits for
-- a standby when synchronous_standby_names names one and synchronous_commit is on, remote_write or
-- remote_apply (this session's value: a role's or the URL's setting counts). pg_stat_replication shows
-- every walsender to every role, but its sync_state only to roles with pg_read_all_stats: sync_seen
-- counts the rows whose state this role can read.
SELECT pg_is_in_recovery()::bool                                       AS in_recovery,
       current_setting('transaction_read_only')::bool                  AS read_only,
       current_setting('synchronous_commit')::text                     AS synchronous_commit,
       current_setting('synchronous_standby_names')::text              AS synchronous_standby_names,
       (SELECT count(*) FROM pg_catalog.pg_stat_replication)::int                 AS standbys,
       (SELECT count(sync_state) FROM pg_catalog.pg_stat_replication)::int        AS sync_seen,
       (SELECT count(*) FROM pg_catalog.pg_stat_replication
        WHERE sync_state IN ('sync', 'quorum'))::int                   AS sync_standbys;

-- name: SessionPlanCacheMode :one
-- The plan_cache_mode this session runs with. A worker asks for force_generic_plan when it connects
-- (service.WorkerPlanCacheMode: its statements are planned once); a pooler that drops the startup
-- parameter (PgBouncer's ignore_startup_parameters) leaves the login role's setting, or auto, and the
-- worker says so at start instead of spending twice the server's CPU per delivery unnoticed.
SELECT current_setting('plan_cache_mode')::text AS plan_cache_mode;
