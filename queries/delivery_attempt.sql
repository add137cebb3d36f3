-- name: AttemptStart :exec
-- Opens the attempt rows of a claim, in the claim's transaction, before any call is made (R3): if the
-- worker dies during the call, its row stays open and the next claim marks it LEASE_EXPIRED.
INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
SELECT u.task_id, u.attempt_no, u.attempt_token, u.action, @worker::text
FROM (SELECT unnest(@task_ids::bigint[]) AS task_id,
             unnest(@attempt_nos::int[]) AS attempt_no,
             unnest(@attempt_tokens::uuid[]) AS attempt_token,
             unnest(@actions::text[]) AS action) AS u;

-- name: AttemptMarkLeaseExpired :execrows
-- Closes the open attempt of a holder whose lease ran out, when another claim takes the task over. Its
-- call may or may not have been accepted, so the new attempt counts as uncertain. Only an open attempt is
-- touched: a recorded outcome is never overwritten (R3).
UPDATE delivery_attempt
SET outcome     = 'LEASE_EXPIRED',
    finished_at = now(),
    error       = 'lease expired before the holder recorded a result; the call may have been accepted'
WHERE attempt_token = ANY (@attempt_tokens::uuid[])
  AND outcome IS NULL;

-- name: AttemptRecordSkip :exec
-- Records a claim-time decision not to call (PREF_DISABLED, TTL_EXPIRED and their _UNCERTAIN variants).
INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome, error)
VALUES (@task_id, @attempt_no, gen_random_uuid(), 'SKIP', @worker::text, now(), @outcome::text, @error::text);

-- name: AttemptFinish :execrows
-- Records each holder's observation on its own attempt, in the transaction whose TaskFinish matched
-- that attempt's token. Written once: an attempt that already has an outcome is not changed (R3).
UPDATE delivery_attempt a
SET outcome         = u.outcome,
    finished_at     = now(),
    provider_msg_id = nullif(u.provider_msg_id, ''),
    error           = nullif(u.error, '')
FROM (SELECT unnest(@attempt_tokens::uuid[]) AS attempt_token,
             unnest(@outcomes::text[]) AS outcome,
             unnest(@provider_msg_ids::text[]) AS provider_msg_id,
             unnest(@errors::text[]) AS error) AS u
WHERE a.attempt_token = u.attempt_token
  AND a.outcome IS NULL;

-- name: AttemptRecordLate :execrows
-- Keeps the observations of superseded holders (TaskFinish did not return their task) on their own
-- attempts without touching outcome (R3): late_outcome is written once, the task is not changed.
UPDATE delivery_attempt a
SET late_outcome    = u.outcome,
    late_at         = now(),
    provider_msg_id = coalesce(a.provider_msg_id, nullif(u.provider_msg_id, '')),
    error           = coalesce(a.error, nullif(u.error, ''))
FROM (SELECT unnest(@attempt_tokens::uuid[]) AS attempt_token,
             unnest(@outcomes::text[]) AS outcome,
             unnest(@provider_msg_ids::text[]) AS provider_msg_id,
             unnest(@errors::text[]) AS error) AS u
WHERE a.attempt_token = u.attempt_token
  AND a.late_outcome IS NULL;

-- name: AttemptRecordManual :exec
-- The MANUAL_SENT / MANUAL_FAILED row of a resolution, in the transaction whose TaskResolveManually
-- matched: who decided, when, and why.
INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome,
                              provider_msg_id, note)
VALUES (@task_id, @attempt_no, gen_random_uuid(), 'MANUAL', @operator::text, now(), @outcome::text,
        sqlc.narg('provider_msg_id'), @note::text);

-- name: AttemptListByTask :many
-- A task's whole history in order: what every attempt observed, and what arrived late.
SELECT id, task_id, attempt_no, attempt_token, action, worker, started_at, finished_at, outcome,
       provider_msg_id, error, late_outcome, late_at, note
FROM delivery_attempt
WHERE task_id = @task_id
ORDER BY attempt_no;
