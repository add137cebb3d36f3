-- migrate:up
-- GATEWAY_ERROR: a 502 or 504, or any 5xx that a plain-http request got through a forward proxy. A gateway
-- answered, not the provider, and it may have passed the request on before it failed: the provider may have
-- accepted it. It is an uncertain outcome of a call, like IO_ERROR (service/delivery.Next), never the
-- "refused before acceptance" of HTTP_5XX. Only the two lists of accepted outcomes change; the constraints
-- keep their names (schema/004 named them implicitly).
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_outcome_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_outcome_check CHECK (outcome IN (
    'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
    'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
    'GATEWAY_ERROR',
    'REJECTED', 'LEASE_EXPIRED',
    'PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN',
    'MANUAL_SENT', 'MANUAL_FAILED'));
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_late_outcome_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_late_outcome_check CHECK (late_outcome IN (
    'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
    'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
    'GATEWAY_ERROR',
    'REJECTED'));

-- migrate:down
-- A recorded GATEWAY_ERROR cannot be rewritten (the history is append-only, schema/005) and the older
-- constraints would refuse it: roll back only a table that holds none, and say why otherwise.
DO $$
BEGIN
    IF EXISTS (SELECT FROM delivery_attempt WHERE outcome = 'GATEWAY_ERROR' OR late_outcome = 'GATEWAY_ERROR') THEN
        RAISE EXCEPTION 'cannot roll back 011_gateway_outcome: delivery_attempt holds GATEWAY_ERROR observations, which the earlier schema does not allow'
            USING ERRCODE = 'check_violation';
    END IF;
END
$$;
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_late_outcome_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_late_outcome_check CHECK (late_outcome IN (
    'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
    'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
    'REJECTED'));
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_outcome_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_outcome_check CHECK (outcome IN (
    'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
    'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
    'REJECTED', 'LEASE_EXPIRED',
    'PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN',
    'MANUAL_SENT', 'MANUAL_FAILED'));
