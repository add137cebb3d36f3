-- A measurement, not a migration (bench/variant.sh, bench/cost.sh): task-keys-unindexed.sql, and the
-- attempt's finish made HOT: its provider-id index dropped (receipts that name only an earlier attempt's
-- provider id then match nothing) and a fillfactor that leaves room on each page for the finished version.
-- An upper bound for a design that keeps the task's keys on a row the protocol never updates and the
-- attempts' provider ids in a table of their own (docs/benchmarks/2026-12-05-row-costs.md).
ALTER TABLE delivery_task DROP CONSTRAINT delivery_task_notification_channel_key;
ALTER TABLE delivery_task DROP CONSTRAINT delivery_task_ref_key;
DROP INDEX delivery_attempt_provider_msg_idx;
ALTER TABLE delivery_attempt SET (fillfactor = 75);
VACUUM FULL delivery_attempt;
