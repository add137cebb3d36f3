-- migrate:up
-- A call's outcome recorded on its open attempt, the one update every finish makes, is decided by the
-- trigger's WHEN instead of by a call of delivery_attempt_fits() (schema/010): the WHEN is evaluated in
-- the executor, a PL/pgSQL call costs a function entry per row. It skips exactly the rows for which
-- delivery_attempt_fits() returns at its first test without checking anything else: a SEND or
-- TOPIC_RESEND given one of a call's outcomes, a QUERY given one of a query's, the late outcome left as
-- it was. Everything else (another outcome, LEASE_EXPIRED, a late observation) still calls the function,
-- which still holds every rule (R3). The outcome lists are those of 010's call_outcomes; the case
-- TestStateMachineEveryOutcomeOfAnOpenCall records every outcome the CHECK allows on an open SEND and an
-- open QUERY attempt and fails if one that does not fit passes. Measured: the server's CPU per delivery
-- at 100 ms about 7-9% lower, in 5 of 6 interleaved pairs (docs/benchmarks/2026-12-04-database-cost.md).
DROP TRIGGER delivery_attempt_fits_update ON delivery_attempt;
CREATE TRIGGER delivery_attempt_fits_update
    AFTER UPDATE ON delivery_attempt
    FOR EACH ROW
    WHEN ((NEW.outcome IS DISTINCT FROM OLD.outcome OR NEW.late_outcome IS DISTINCT FROM OLD.late_outcome)
          AND NOT coalesce(NEW.late_outcome IS NOT DISTINCT FROM OLD.late_outcome
                           AND ((NEW.action IN ('SEND', 'TOPIC_RESEND')
                                 AND NEW.outcome IN ('ACCEPTED', 'ACCEPTED_REPLAY', 'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT',
                                                     'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
                                                     'REJECTED', 'GATEWAY_ERROR'))
                                OR (NEW.action = 'QUERY'
                                    AND NEW.outcome IN ('QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED'))),
                           false))
EXECUTE FUNCTION delivery_attempt_fits();

COMMENT ON TRIGGER delivery_attempt_fits_update ON delivery_attempt IS
    'R3: refuses an outcome or late outcome that does not fit the attempt''s action (a call''s own outcome passes by the WHEN)';

-- migrate:down
DROP TRIGGER delivery_attempt_fits_update ON delivery_attempt;
CREATE TRIGGER delivery_attempt_fits_update
    AFTER UPDATE ON delivery_attempt
    FOR EACH ROW
    WHEN (NEW.outcome IS DISTINCT FROM OLD.outcome OR NEW.late_outcome IS DISTINCT FROM OLD.late_outcome)
EXECUTE FUNCTION delivery_attempt_fits();

COMMENT ON TRIGGER delivery_attempt_fits_update ON delivery_attempt IS
    'R3: refuses an outcome or late outcome that does not fit the attempt''s action';
