-- name: RoleCapabilities :one
-- What the connected user may do, so that a command refuses at once and names the role to grant instead
-- of failing half-way or, for a worker, claiming nothing forever because row-level security hides every
-- task (schema/002_roles_and_row_security.sql). A user may run a role's statements when it has that group role's
-- privileges (a member with INHERIT), or is exempt from row-level security and privileges on these
-- tables: their owner (RLS is not FORCEd), a superuser, or a BYPASSRLS role that owns or was granted
-- the rest. resolve needs EXECUTE on notifier_resolve (schema/003), which only the operator role and
-- the owner have; receipts needs INSERT on delivery_receipt and EXECUTE on notifier_apply_receipt
-- (schema/004), the receiver role's. Reads the catalogs only.
SELECT current_user::text AS user_name,
       (r.rolsuper OR r.rolbypassrls OR pg_has_role(current_user, c.relowner, 'USAGE')
        OR pg_has_role(current_user, 'notifier_worker', 'USAGE'))::bool AS can_work,
       (r.rolsuper OR r.rolbypassrls OR pg_has_role(current_user, c.relowner, 'USAGE')
        OR pg_has_role(current_user, 'notifier_creator', 'USAGE'))::bool AS can_create,
       has_function_privilege('notifier_resolve(bigint, text, text, text, text)', 'EXECUTE')::bool AS can_resolve,
       (has_any_column_privilege('delivery_receipt', 'INSERT')
        AND has_function_privilege('notifier_apply_receipt(bigint, text, text)', 'EXECUTE'))::bool AS can_receive
FROM pg_catalog.pg_roles r
CROSS JOIN pg_catalog.pg_class c
WHERE r.rolname = current_user
  AND c.oid = 'delivery_task'::regclass;
