-- name: AttemptMarkLeaseExpired :execrows
-- Closes the open attempt of a holder whose lease ran out, when another claim takes the task over. Its
-- call may or may not have been accepted, so the new attempt counts as uncertain. Only an open attempt is
-- touched: a recorded outcome is never overwritten (R3). Guards on the task's row, not on the caller's
-- care: only the attempt of the task's current holder, and only once that holder's lease has expired on
-- the database clock (a live holder's attempt stays open for its finish). Tokens arrive as text[] and are
-- cast here, as in TaskFinish (the worker holds them as strings; the cast is on the parameter, the index
-- still serves); the task is read by primary key. The lease is tested `IS TRUE`, which no index answers:
-- as a plain comparison it matched the lease index, and a generic plan made on a drained queue's
-- statistics walked every expired lease and compared each with every token (257 ms for 256 tokens
-- among 2,000 expired leases, growing with both: after a crash, when many expire at once;
-- TestLeaseQueriesGenericPlansLookUpByKey).
UPDATE delivery_attempt a
SET outcome     = 'LEASE_EXPIRED',
    finished_at = now(),
    error       = 'lease expired before the holder recorded a result; the call may have been accepted'
WHERE a.attempt_token = ANY ((@attempt_tokens::text[])::uuid[])
  AND a.outcome IS NULL
  AND EXISTS (SELECT 1 FROM delivery_task t
              WHERE t.id = a.task_id AND t.state = 'SENDING' AND t.attempt_token = a.attempt_token
                AND (t.lease_until < now()) IS TRUE);

-- name: AttemptRecordSkip :exec
-- Records a claim-time decision not to call (PREF_DISABLED, TTL_EXPIRED, CANCELLED and their _UNCERTAIN variants),
-- right after TaskSettleWithoutCall counted it, in the same transaction: attempt_no is the count it
-- returned, and the outcome matches the state it wrote (delivery_attempt_follows_task, schema/003).
INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome, error)
VALUES (@task_id, @attempt_no, gen_random_uuid(), 'SKIP', @worker::text, now(), @outcome::text, @error::text);

-- name: AttemptListByTask :many
-- A task's whole history in order: what every attempt observed, and what arrived late.
SELECT id, task_id, attempt_no, attempt_token, action, worker, started_at, finished_at, outcome,
       provider_msg_id, error, late_outcome, late_at, note
FROM delivery_attempt
WHERE task_id = @task_id
ORDER BY attempt_no;

-- name: AttemptListByTasks :many
-- The whole histories of a page of tasks (notifier review), or of one notification's tasks (notifier
-- show), in one statement rather than one per task: every attempt of each task in @task_ids, by task and
-- in order, verbatim as AttemptListByTask reads them (R3: the history as recorded, nothing merged). Read only; each task's rows come from the (task_id, attempt_no) unique index.
SELECT id, task_id, attempt_no, attempt_token, action, worker, started_at, finished_at, outcome,
       provider_msg_id, error, late_outcome, late_at, note
FROM delivery_attempt
WHERE task_id = ANY (@task_ids::bigint[])
ORDER BY task_id, attempt_no;
