-- Facts about the server that commands check before they start work.

-- name: ServerConnectionsAvailable :one
-- How many connections the server accepts from ordinary roles: max_connections less the slots reserved
-- for superusers. A worker sizes its pool independently of its calls in flight and refuses to start
-- when its pool could take more than a quarter of these, so several workers, the creators and the
-- operators always find a connection (a pool of 258 once left a worker stalled on "too many clients").
SELECT (current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int)::int AS available;
