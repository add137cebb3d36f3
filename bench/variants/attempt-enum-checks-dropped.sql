-- A measurement, not a migration (bench/cost.sh): delivery_attempt without the CHECKs of its outcome,
-- late_outcome and action lists, which PostgreSQL reads back from the catalog once per statement that
-- writes the table (docs/benchmarks/2026-12-05-row-costs.md).
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_outcome_check,
    DROP CONSTRAINT delivery_attempt_late_outcome_check, DROP CONSTRAINT delivery_attempt_action_check;
