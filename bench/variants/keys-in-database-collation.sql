-- A measurement, not a migration (bench/cost.sh, bench/variant.sh): the index keys on the providers'
-- message ids compared under the database's collation, as before they were made byte order
-- (COLLATE "C"): the task's, and those its attempts named that the task does not hold
-- (delivery_task_provider_msg). Only their cost of insertion is measured: a finish inserts the message ids. (The task's
-- ref is indexed on delivery_task_key, which neither the claim nor the finish writes.) No statement of
-- the claim or the finish looks these indexes up,
-- and the receipts' lookups, which do, cannot use them while their collation differs from the
-- column's. Run it on a cluster initialised with a language's locale to see what 023 saves there
-- (bench-cost --locale en_US.UTF-8, PGTEST_LOCALE=en_US.UTF-8; docs/benchmarks/2026-12-05-byte-order-keys.md).
DROP INDEX delivery_task_provider_msg_idx;
CREATE INDEX delivery_task_provider_msg_idx ON delivery_task (provider_msg_id COLLATE "default")
    WHERE provider_msg_id IS NOT NULL;
ALTER TABLE delivery_task_provider_msg DROP CONSTRAINT delivery_task_provider_msg_pkey;
CREATE UNIQUE INDEX delivery_task_provider_msg_pkey
    ON delivery_task_provider_msg (provider_msg_id COLLATE "default", task_id);
