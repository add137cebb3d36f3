-- A measurement, not a migration (bench/cost.sh): delivery_task without the two indexes only a finish adds
-- entries to, retention's (finished tasks by updated_at) and the provider id's. Retention and receipts
-- cannot work without them (docs/benchmarks/2026-12-05-row-costs.md).
DROP INDEX delivery_task_finished_idx;
DROP INDEX delivery_task_provider_msg_idx;
