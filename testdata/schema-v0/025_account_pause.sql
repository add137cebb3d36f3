-- migrate:up
-- ACCOUNT_REFUSED: the provider certainly refused this request for a state of our account that an
-- operator can fix (a rejected or expired credential, a paused sending account). Not the task's fault:
--   * the attempt is recorded like any refusal, and the task goes back to wait (PENDING, or UNKNOWN with
--     its uncertainty kept); never FAILED (delivery_task_evidence lists no ACCOUNT_REFUSED for FAILED);
--   * the attempt is refunded: account_refusals counts the task's attempts refused so, and the budget a
--     claim checks is attempt_count - account_refusals < max_attempts. attempt_count still grows by
--     exactly one per attempt begun (schema/010). account_refusals grows only by a finish whose attempt
--     says ACCOUNT_REFUSED, by one (delivery_task_account_refusals below, for every role);
--   * the channel pauses for every worker (channel_pause below): claims lock none of its tasks, except one
--     probe task at a time once the pause's backoff has passed (TaskClaim). A probe refused again doubles
--     the backoff up to the worker's cap; any other answer to a probe ends the pause.

-- An attempt may record ACCOUNT_REFUSED as a call's outcome or late observation.
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_outcome_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_outcome_check CHECK (outcome IN (
    'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
    'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
    'GATEWAY_ERROR',
    'REJECTED', 'ACCOUNT_REFUSED', 'LEASE_EXPIRED',
    'PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN',
    'MANUAL_SENT', 'MANUAL_FAILED',
    'RECEIPT_ACCEPTED'));
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_late_outcome_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_late_outcome_check CHECK (late_outcome IN (
    'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
    'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
    'GATEWAY_ERROR',
    'REJECTED', 'ACCOUNT_REFUSED'));

-- The state machine's two functions learn the outcome where they list a call's outcomes (010): the
-- outcomes of a SEND or TOPIC_RESEND (delivery_attempt_fits), and the refusals that let a finish write
-- PENDING (delivery_task_evidence; FAILED keeps needing another refusal, below). Each function is
-- rewritten from its own definition with the one list changed, so nothing else of 010 moves; a
-- definition that no longer holds the list stops the migration.
DO $$
DECLARE
    def text;
BEGIN
    def := pg_get_functiondef('delivery_attempt_fits()'::regprocedure);
    IF strpos(def, $l$'REJECTED', 'GATEWAY_ERROR']$l$) = 0 THEN
        RAISE EXCEPTION '025: delivery_attempt_fits() does not hold the call outcomes of schema/010';
    END IF;
    EXECUTE replace(def, $l$'REJECTED', 'GATEWAY_ERROR']$l$, $l$'REJECTED', 'GATEWAY_ERROR', 'ACCOUNT_REFUSED']$l$);

    def := pg_get_functiondef('delivery_task_evidence()'::regprocedure);
    IF strpos(def, $l$AND a.outcome IN ('REJECTED', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED', 'QUERY_NOT_FOUND');$l$) = 0 THEN
        RAISE EXCEPTION '025: delivery_task_evidence() does not hold the refusals of schema/010';
    END IF;
    -- ACCOUNT_REFUSED is evidence for PENDING only: a task is never written off for an account state.
    EXECUTE replace(replace(def,
        $l$AND a.outcome IN ('REJECTED', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED', 'QUERY_NOT_FOUND');$l$,
        $l$AND (a.outcome IN ('REJECTED', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED', 'QUERY_NOT_FOUND')
                       OR (a.outcome = 'ACCOUNT_REFUSED' AND NEW.state = 'PENDING'));$l$),
        $l$REJECTED, HTTP_5XX, THROTTLED, CONNECT_FAILED or QUERY_NOT_FOUND$l$,
        $l$REJECTED, HTTP_5XX, THROTTLED, CONNECT_FAILED, QUERY_NOT_FOUND (or, for PENDING, ACCOUNT_REFUSED)$l$);
END
$$;

-- The finish's fast path (019) passes ACCOUNT_REFUSED on an open SEND or TOPIC_RESEND like any call outcome.
DROP TRIGGER delivery_attempt_fits_update ON delivery_attempt;
CREATE TRIGGER delivery_attempt_fits_update
    AFTER UPDATE ON delivery_attempt
    FOR EACH ROW
    WHEN ((NEW.outcome IS DISTINCT FROM OLD.outcome OR NEW.late_outcome IS DISTINCT FROM OLD.late_outcome)
          AND NOT coalesce(NEW.late_outcome IS NOT DISTINCT FROM OLD.late_outcome
                           AND ((NEW.action IN ('SEND', 'TOPIC_RESEND')
                                 AND NEW.outcome IN ('ACCEPTED', 'ACCEPTED_REPLAY', 'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT',
                                                     'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
                                                     'REJECTED', 'GATEWAY_ERROR', 'ACCOUNT_REFUSED'))
                                OR (NEW.action = 'QUERY'
                                    AND NEW.outcome IN ('QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED'))),
                           false))
EXECUTE FUNCTION delivery_attempt_fits();

COMMENT ON TRIGGER delivery_attempt_fits_update ON delivery_attempt IS
    'R3: refuses an outcome or late outcome that does not fit the attempt''s action (a call''s own outcome passes by the WHEN)';

-- The refund: attempts of this task refused for an account state, never more than it made. (A negative
-- attempt_count is delivery_task_attempt_count_check's to refuse, hence greatest(): one bound, one name.)
ALTER TABLE delivery_task ADD COLUMN account_refusals integer NOT NULL DEFAULT 0;
ALTER TABLE delivery_task ADD CONSTRAINT delivery_task_account_refusals_check
    CHECK (account_refusals >= 0 AND account_refusals <= greatest(attempt_count, 0));
GRANT UPDATE (account_refusals) ON delivery_task TO notifier_worker;

-- Guards, at commit, every change of account_refusals (a constraint trigger queued only when it changes:
-- no delivery but a refused one pays for it): it grows by one, by a finish (SENDING, this holder's token,
-- to PENDING or UNKNOWN not parked, attempt_count unchanged) whose attempt row, the task's current one
-- with that token, records ACCOUNT_REFUSED. It never shrinks: a refund is never taken back.
CREATE FUNCTION delivery_task_account_refusals() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
    SET enable_seqscan = off
AS $$
DECLARE
    a   record;
    why text;
BEGIN
    SELECT at.outcome, at.attempt_token INTO a
    FROM public.delivery_attempt at
    WHERE at.task_id = NEW.id AND at.attempt_no = NEW.attempt_count;
    why := CASE
        WHEN NEW.account_refusals <> OLD.account_refusals + 1 THEN
            format('account_refusals goes from %s to %s; it grows by one per attempt refused for an account state',
                   OLD.account_refusals, NEW.account_refusals)
        WHEN NOT (OLD.state = 'SENDING' AND NEW.state IN ('PENDING', 'UNKNOWN') AND NOT NEW.needs_review
                  AND NEW.attempt_count = OLD.attempt_count AND NEW.attempt_token IS NOT DISTINCT FROM OLD.attempt_token) THEN
            format('account_refusals grows in a move %s -> %s that is not the finish of a refused call', OLD.state, NEW.state)
        WHEN NOT coalesce(a.outcome = 'ACCOUNT_REFUSED' AND a.attempt_token = OLD.attempt_token, false) THEN
            format('account_refusals grows but attempt %s records %s, not ACCOUNT_REFUSED', NEW.attempt_count,
                   coalesce(a.outcome, 'nothing'))
    END;
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'delivery_task %: %', NEW.id, why
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_task',
                  COLUMN = 'account_refusals',
                  CONSTRAINT = 'delivery_task_account_refusals',
                  HINT = 'only a finish with an ACCOUNT_REFUSED attempt refunds it; see schema/025_account_pause.sql';
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION delivery_task_account_refusals() IS
    'An attempt is refunded from the budget only by the finish of a call refused for an account state (schema/025)';

CREATE CONSTRAINT TRIGGER delivery_task_account_refusals
    AFTER UPDATE ON delivery_task
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.account_refusals IS DISTINCT FROM OLD.account_refusals)
EXECUTE FUNCTION delivery_task_account_refusals();

COMMENT ON TRIGGER delivery_task_account_refusals ON delivery_task IS
    'refuses at commit a refund (account_refusals) without its ACCOUNT_REFUSED attempt';

-- One row per paused channel, shared by every worker (queries/channel_pause.sql). No row: not paused,
-- and a claim pays one index probe of this almost always empty table per channel to know it.
CREATE TABLE channel_pause (
    channel            text        NOT NULL,
    cause              text        NOT NULL, -- the refusal's Detail: what an operator must fix
    paused_at          timestamptz NOT NULL DEFAULT now(),
    backoff_seconds    float8      NOT NULL, -- the current wait between probes
    probe_after        timestamptz NOT NULL, -- no probe before this
    probe_hold_seconds float8      NOT NULL, -- a claimed probe holds the slot this long (the lease)
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT channel_pause_pkey PRIMARY KEY (channel),
    CONSTRAINT channel_pause_channel_check CHECK (channel ~ '^[a-z][a-z0-9_-]{0,31}$'),
    CONSTRAINT channel_pause_cause_check CHECK (length(cause) <= 2000),
    CONSTRAINT channel_pause_backoff_check CHECK (backoff_seconds > 0 AND backoff_seconds <= 3600),
    CONSTRAINT channel_pause_hold_check CHECK (probe_hold_seconds > 0 AND probe_hold_seconds <= 86400)
);

-- The worker writes pauses (its finish), takes probes (its claim) and ends them (a probe's answer); the
-- operator reads them (notifier status, the console). Lifting a pause by hand is deleting its row, as the
-- owner.
GRANT SELECT ON channel_pause TO notifier_worker, notifier_operator;
GRANT INSERT (channel, cause, backoff_seconds, probe_after, probe_hold_seconds) ON channel_pause TO notifier_worker;
GRANT UPDATE (cause, backoff_seconds, probe_after, probe_hold_seconds, updated_at) ON channel_pause TO notifier_worker;
GRANT DELETE ON channel_pause TO notifier_worker;

-- migrate:down
DO $$
BEGIN
    IF EXISTS (SELECT FROM delivery_attempt WHERE outcome = 'ACCOUNT_REFUSED' OR late_outcome = 'ACCOUNT_REFUSED') THEN
        RAISE EXCEPTION 'cannot roll back 025_account_pause: delivery_attempt holds ACCOUNT_REFUSED observations, which the earlier schema does not allow'
            USING ERRCODE = 'check_violation';
    END IF;
END
$$;
DROP TABLE channel_pause;
DROP TRIGGER delivery_task_account_refusals ON delivery_task;
DROP FUNCTION delivery_task_account_refusals();
ALTER TABLE delivery_task DROP COLUMN account_refusals;
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
DO $$
DECLARE
    def text;
BEGIN
    def := pg_get_functiondef('delivery_attempt_fits()'::regprocedure);
    EXECUTE replace(def, $l$'REJECTED', 'GATEWAY_ERROR', 'ACCOUNT_REFUSED']$l$, $l$'REJECTED', 'GATEWAY_ERROR']$l$);
    def := pg_get_functiondef('delivery_task_evidence()'::regprocedure);
    EXECUTE replace(replace(def,
        $l$AND (a.outcome IN ('REJECTED', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED', 'QUERY_NOT_FOUND')
                       OR (a.outcome = 'ACCOUNT_REFUSED' AND NEW.state = 'PENDING'));$l$,
        $l$AND a.outcome IN ('REJECTED', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED', 'QUERY_NOT_FOUND');$l$),
        $l$REJECTED, HTTP_5XX, THROTTLED, CONNECT_FAILED, QUERY_NOT_FOUND (or, for PENDING, ACCOUNT_REFUSED)$l$,
        $l$REJECTED, HTTP_5XX, THROTTLED, CONNECT_FAILED or QUERY_NOT_FOUND$l$);
END
$$;
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_late_outcome_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_late_outcome_check CHECK (late_outcome IN (
    'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
    'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
    'GATEWAY_ERROR',
    'REJECTED'));
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_outcome_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_outcome_check CHECK (outcome IN (
    'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
    'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
    'GATEWAY_ERROR',
    'REJECTED', 'LEASE_EXPIRED',
    'PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN',
    'MANUAL_SENT', 'MANUAL_FAILED',
    'RECEIPT_ACCEPTED'));
