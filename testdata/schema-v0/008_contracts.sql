-- migrate:up
-- Channel contracts (idempotency key retention, query settle time, how long to keep guessing) are
-- measured from when the task's current uncertainty began: the start of the first attempt that may have
-- been accepted without our knowing.
ALTER TABLE delivery_task ADD COLUMN uncertain_since timestamptz;
ALTER TABLE delivery_task ADD CONSTRAINT delivery_task_uncertain_since_iff_uncertain
    CHECK ((uncertain_since IS NOT NULL) = outcome_uncertain);

-- TOPIC_RESEND: a resend on a channel without idempotency key that replaces the first copy only if that
-- one is still undelivered (Web Push Topic, RFC 8030 section 5.4). Opt-in per channel.
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_action_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_action_check
    CHECK (action IN ('SEND', 'QUERY', 'SKIP', 'MANUAL', 'TOPIC_RESEND'));

-- The worker role (006_roles.sql) writes the new column and the new action.
GRANT UPDATE (uncertain_since) ON delivery_task TO notifier_worker;
ALTER POLICY delivery_attempt_worker_insert ON delivery_attempt
    WITH CHECK (action IN ('SEND', 'QUERY', 'SKIP', 'TOPIC_RESEND'));
ALTER POLICY delivery_attempt_worker_update ON delivery_attempt
    USING (action IN ('SEND', 'QUERY', 'SKIP', 'TOPIC_RESEND'))
    WITH CHECK (action IN ('SEND', 'QUERY', 'SKIP', 'TOPIC_RESEND'));

-- migrate:down
ALTER POLICY delivery_attempt_worker_update ON delivery_attempt
    USING (action IN ('SEND', 'QUERY', 'SKIP'))
    WITH CHECK (action IN ('SEND', 'QUERY', 'SKIP'));
ALTER POLICY delivery_attempt_worker_insert ON delivery_attempt
    WITH CHECK (action IN ('SEND', 'QUERY', 'SKIP'));
REVOKE UPDATE (uncertain_since) ON delivery_task FROM notifier_worker;
ALTER TABLE delivery_attempt DROP CONSTRAINT delivery_attempt_action_check;
ALTER TABLE delivery_attempt ADD CONSTRAINT delivery_attempt_action_check
    CHECK (action IN ('SEND', 'QUERY', 'SKIP', 'MANUAL'));
ALTER TABLE delivery_task DROP COLUMN uncertain_since;
