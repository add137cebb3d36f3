-- A measurement, not a migration (bench/variant.sh, bench/cost.sh): the attempt's finish made HOT, its
-- provider-id index dropped (receipts that name only an earlier attempt's provider id then match
-- nothing) and a fillfactor that leaves room on each page for the finished version. An upper bound for a
-- design that keeps the attempts' provider ids in a table of their own (docs/benchmarks/2026-12-05-row-costs.md,
-- where it was measured together with the task's keys unindexed; schema/001 has since moved those keys to
-- delivery_task_key, docs/benchmarks/2026-12-06-task-keys.md).
DROP INDEX delivery_attempt_provider_msg_idx;
ALTER TABLE delivery_attempt SET (fillfactor = 75);
VACUUM FULL delivery_attempt;
