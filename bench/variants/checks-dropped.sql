-- A measurement, not a migration (bench/cost.sh): every CHECK of delivery_task and delivery_attempt
-- dropped, an upper bound of what the tables' CHECKs cost a delivery: read back from the catalog per
-- statement, then evaluated per row (docs/benchmarks/2026-12-05-row-costs.md).
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT conrelid::regclass AS tab, conname FROM pg_constraint
             WHERE contype = 'c' AND conrelid IN ('delivery_task'::regclass, 'delivery_attempt'::regclass) LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', c.tab, c.conname);
    END LOOP;
END
$$;
