-- A measurement, not a migration (bench/variant.sh, bench/cost.sh): delivery_task without its two unique
-- keys, (notification_id, channel) and ref. Every claim and finish updates the task row, and neither update
-- can be HOT (the claim and retention indexes cover columns both change), so each inserts a new entry into
-- both unique indexes and checks it for a duplicate: this variant measures what that costs. It gives up R1/R2's
-- one task per channel and the ref that is never reused: an upper bound for a design that keeps those keys
-- on a row the protocol never updates (docs/benchmarks/2026-12-05-row-costs.md).
ALTER TABLE delivery_task DROP CONSTRAINT delivery_task_notification_channel_key;
ALTER TABLE delivery_task DROP CONSTRAINT delivery_task_ref_key;
