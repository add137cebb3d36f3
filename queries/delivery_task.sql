-- name: TaskInsertForEnabledPrefs :many
-- Creates one PENDING task per channel each user has enabled, in the same transaction that created the
-- notifications (NotificationInsert returned them), due at their notification's send time, or at once
-- when it has none or it is past: greatest(send_at, now()), the only time the creator role may set
-- (schema/005). Guards R2: UNIQUE (notification_id, channel) on the tasks' key rows, which this
-- statement writes (schema/003), allows one task per channel; it runs only for the notifications this submitter created (for the creator role, row-level
-- security also requires that this transaction inserted the notification and that the channel is
-- enabled: schema/005). @channel_lists restricts each notification to the channels its submitter named,
-- joined by commas (a channel name has none), or an empty string for every enabled channel: the same
-- rule as notifier_create's channels (schema/005). @fallback_lists holds each notification's fallback
-- chain the same way: its enabled channels are numbered from 1 in chain order, only the first is due,
-- the others wait unreleased (no next_attempt_at) until the one before ends certainly not sent
-- (schema/005, the rule of notifier_create's fallback). The first is due at its notification's send
-- time, or now (schema/005).
INSERT INTO delivery_task (notification_id, channel, max_attempts, fallback_position, next_attempt_at)
SELECT c.id, c.channel, c.max_attempts, c.position, CASE WHEN c.position > 1 THEN NULL ELSE greatest(c.send_at, now()) END
FROM (SELECT n.id, p.channel, n.max_attempts, s.send_at,
             CASE WHEN n.fallback_list <> ''
                  THEN row_number() OVER (PARTITION BY n.id
                                          ORDER BY array_position(string_to_array(n.fallback_list, ','), p.channel::text))
             END::smallint AS position
      FROM (SELECT unnest(@notification_ids::bigint[]) AS id, unnest(@user_ids::text[]) AS user_id,
                   unnest(@max_attempts::int[]) AS max_attempts, unnest(@channel_lists::text[]) AS channel_list,
                   unnest(@fallback_lists::text[]) AS fallback_list) AS n
      JOIN notification s ON s.id = n.id
      JOIN channel_pref p ON p.user_id = n.user_id AND p.enabled
      WHERE (n.channel_list = '' OR p.channel = ANY (string_to_array(n.channel_list, ',')))
        AND (n.fallback_list = '' OR p.channel = ANY (string_to_array(n.fallback_list, ',')))) AS c
ORDER BY c.id, c.channel
RETURNING id, notification_id, channel, ref;

-- name: TaskClaim :many
-- Locks up to @max_tasks tasks of one channel for this claimer, in one statement: first SENDING tasks
-- whose holder's lease ran out on the database clock (the holder died or stalled; lease_expired = true),
-- then the longest-waiting due tasks (PENDING, or UNKNOWN and not parked). FOR UPDATE OF t SKIP LOCKED:
-- two claimers never lock the same task; the preference switch and the expiry are read in this same
-- transaction. Each branch walks its own partial index from the channel's first entry
-- (delivery_task_leased_idx holds only tasks with a lease, delivery_task_ready_idx only rows with a
-- next_attempt_at, both led by channel), so finished and parked history, and other channels' backlog,
-- are never read: parked and finished tasks have no next_attempt_at (CHECK
-- delivery_task_scheduled_iff_waiting). A worker serving several channels claims them in turn. The
-- branches are CTEs scanned lazily under the outer LIMIT: due tasks are locked only when fewer than
-- @max_tasks leases expired, and never more rows than are returned. The notification and preference of
-- each locked task are read by primary key, one lookup per row, by construction (LATERAL ... OFFSET 0):
-- a worker runs this statement prepared, and its generic plan cannot see @max_tasks; it guesses 10% of
-- the due backlog and, with a backlog large next to notification, would hash the locked rows and scan
-- all of notification (history) on every claim (TestClaimGenericPlanLooksUpByKey).
-- ref is what the worker sends the channel to name the task (schema/001): random, never reused, so no
-- call can be answered with another task's message.
-- A paused channel (schema/001, channel_pause) gives no task, except one probe once the pause's backoff
-- has passed: the probe CTE takes the slot (pushes probe_after past the probe's lease, so that no other
-- claim probes meanwhile; a concurrent claim waits for this row lock and then finds the slot taken) and
-- the claim locks one task. Not paused: one primary-key probe of an almost always empty table.
WITH probe AS (
    UPDATE channel_pause p
    SET probe_after = now() + make_interval(secs => p.probe_hold_seconds)
    WHERE p.channel = @channel::text
      AND p.probe_after <= now()
    RETURNING p.channel
), gate AS (
    SELECT CASE WHEN EXISTS (SELECT FROM probe) THEN 1
                WHEN EXISTS (SELECT FROM channel_pause p WHERE p.channel = @channel::text) THEN 0
                ELSE @max_tasks::int END AS max_tasks,
           EXISTS (SELECT FROM probe) AS probe
), lease_expired AS (
    SELECT t.id, t.notification_id, t.channel, t.ref, t.state, t.attempt_count, t.max_attempts, t.outcome_uncertain,
           t.attempt_token, t.uncertain_since, t.updated_at, t.receipt_at, t.account_refusals
    FROM delivery_task t
    WHERE t.channel = @channel::text
      AND t.state = 'SENDING'
      AND t.lease_until < now()
    ORDER BY t.lease_until, t.id
    LIMIT (SELECT g.max_tasks FROM gate g)
    FOR UPDATE OF t SKIP LOCKED
), due AS (
    SELECT t.id, t.notification_id, t.channel, t.ref, t.state, t.attempt_count, t.max_attempts, t.outcome_uncertain,
           t.attempt_token, t.uncertain_since, t.updated_at, t.receipt_at, t.account_refusals
    FROM delivery_task t
    WHERE t.channel = @channel::text
      AND t.next_attempt_at IS NOT NULL
      AND t.next_attempt_at <= now()
    ORDER BY t.next_attempt_at, t.id
    LIMIT (SELECT g.max_tasks FROM gate g)
    FOR UPDATE OF t SKIP LOCKED
), locked AS (
    (SELECT l.*, true AS lease_expired FROM lease_expired l
     UNION ALL
     SELECT d.*, false AS lease_expired FROM due d)
    LIMIT (SELECT g.max_tasks FROM gate g)
)
SELECT t.id, t.notification_id, t.channel, t.ref, t.state, t.attempt_count, t.max_attempts, t.outcome_uncertain,
       t.account_refusals,
       (SELECT g.probe FROM gate g)::bool AS probe,
       t.lease_expired::bool            AS lease_expired,
       t.attempt_token                  AS held_token,
       coalesce(p.enabled, false)::bool AS pref_enabled,
       coalesce(p.address, '')::text    AS address,
       n.body,
       n.expires_at,
       (n.expires_at <= now())::bool    AS expired,
       -- the submitter cancelled the notification (notifier_cancel, schema/005): settled, not called
       (n.cancelled_at IS NOT NULL)::bool AS cancelled,
       -- a provider's receipt arrived while the task was held (schema/004): it is settled, not called
       (t.receipt_at IS NOT NULL)::bool AS receipt_noted,
       -- how long the uncertainty has lasted; for a lease that just expired, since the lost attempt began
       extract(epoch FROM now() - coalesce(t.uncertain_since, t.updated_at))::float8 AS uncertain_age_seconds
FROM locked t
CROSS JOIN LATERAL (
    -- OFFSET 0: a per-row primary-key lookup, never a hash join (see above)
    SELECT n.user_id, n.body, n.expires_at, n.cancelled_at FROM notification n WHERE n.id = t.notification_id OFFSET 0
) n
LEFT JOIN LATERAL (
    SELECT p.enabled, p.address FROM channel_pref p WHERE p.user_id = n.user_id AND p.channel = t.channel OFFSET 0
) p ON true;

-- name: TaskStartAttempts :many
-- Makes the claimer the only holder of tasks it has locked in this transaction, and opens their attempt
-- rows before any call is made (R3: if the worker dies during the call, its row stays open and the next
-- claim marks it LEASE_EXPIRED). Per task: a fresh attempt token (any earlier holder's finish now matches
-- 0 rows, R2; random, chosen by the claimer so that it can find its claim again when the answer to the
-- commit is lost: TaskHeldByTokens), a lease on the database clock, the action the claimer decided, and the uncertainty the
-- attempt starts with (true when an earlier attempt may have been accepted, including a lease that
-- expired: then it began when the lost attempt was claimed, the row's updated_at). The state condition
-- repeats the claim's (due and waiting, or SENDING with an expired lease, on the same transaction's
-- clock), so no other row can be started; an attempt row is opened exactly for each task started, with
-- that task's new token and attempt number (schema/003 checks both at commit).
-- Only a waiting task has a next_attempt_at (PENDING, or UNKNOWN and not parked: CHECK
-- delivery_task_scheduled_iff_waiting), so the ELSE branch is the due condition of TaskClaim.
-- The state condition is a CASE so that no index can answer it: each task is found by its key, from
-- @ids. Written as plain comparisons, it matched the claim indexes (lease_until, next_attempt_at), and a
-- generic plan made while those indexes held few due tasks (a drained queue, a new database) scanned
-- every due task and compared each with every id: 850 ms for a claim of 256 behind a backlog of 7,000,
-- growing with the backlog (TestStartAttemptsGenericPlanLooksUpByKey).
WITH started AS (
    UPDATE delivery_task t
    SET state             = 'SENDING',
        attempt_token     = u.attempt_token::uuid,
        lease_owner       = @worker::text,
        lease_until       = now() + make_interval(secs => @lease_seconds::float8),
        next_attempt_at   = NULL,
        attempt_count     = t.attempt_count + 1,
        outcome_uncertain = u.outcome_uncertain,
        uncertain_since   = CASE WHEN u.outcome_uncertain THEN coalesce(t.uncertain_since, t.updated_at) END,
        updated_at        = now()
    FROM (SELECT unnest(@ids::bigint[]) AS id,
                 unnest(@attempt_tokens::text[]) AS attempt_token,
                 unnest(@outcome_uncertain::bool[]) AS outcome_uncertain,
                 unnest(@actions::text[]) AS action) AS u
    WHERE t.id = u.id
      AND CASE t.state WHEN 'SENDING' THEN t.lease_until < now() ELSE t.next_attempt_at <= now() END
    RETURNING t.id, t.attempt_token, t.attempt_count, t.lease_until, u.action
), opened AS (
    INSERT INTO delivery_attempt (task_id, attempt_no, attempt_token, action, worker)
    SELECT s.id, s.attempt_count, s.attempt_token, s.action, @worker::text
    FROM started s
)
SELECT s.id, s.attempt_token::uuid AS attempt_token, s.attempt_count, s.lease_until::timestamptz AS lease_until
FROM started s;

-- name: TaskHeldByTokens :many
-- The tasks a claimer holds by the attempt tokens it chose, for a claim whose commit's answer was lost
-- (the connection broke after the COMMIT was sent): the claim committed exactly when its tokens are the
-- tasks' tokens now. No call was made yet, and the lease is live (nobody else may take the tasks), so
-- the claimer calls them as it would have; without this each such task waited for its lease to run out
-- and was then taken over as uncertain: parked, on a channel that can neither dedupe nor be asked.
-- Through the attempt rows' unique token index, then the task by key. The lease is tested `IS TRUE`,
-- which no index answers, so a generic plan made on a drained queue's statistics cannot walk every live
-- lease instead (as AttemptMarkLeaseExpired; TestLeaseQueriesGenericPlansLookUpByKey).
SELECT t.id, t.attempt_count, t.lease_until::timestamptz AS lease_until, a.attempt_token::text AS attempt_token
FROM delivery_attempt a
JOIN delivery_task t ON t.id = a.task_id AND t.attempt_token = a.attempt_token
WHERE a.attempt_token = ANY (CAST(@attempt_tokens::text[] AS uuid[]))
  AND t.state = 'SENDING'
  AND (t.lease_until > now()) IS TRUE;

-- name: TaskSettleWithoutCall :one
-- Claim-time decision not to call (preference disabled, notification expired or cancelled). Guards R5 and R6: the
-- caller passes SUPPRESSED/FAILED only when no earlier attempt may have been accepted; otherwise UNKNOWN
-- with needs_review (parked). Counts as an attempt: the caller records its row with AttemptRecordSkip
-- in the same transaction (delivery_task_evidence checks it at commit). Guards on the row's state, not
-- on the caller's care: only a task a claim may take (due and waiting, or SENDING with an expired lease)
-- is settled; any other row matches nothing (pgx.ErrNoRows). The state machine (schema/003) also
-- refuses SUPPRESSED or FAILED for an uncertain task.
UPDATE delivery_task
SET state             = @state::text,
    needs_review      = @needs_review,
    outcome_uncertain = @outcome_uncertain,
    uncertain_since   = CASE WHEN @outcome_uncertain::bool THEN coalesce(uncertain_since, updated_at) END,
    next_attempt_at   = NULL,
    lease_owner       = NULL,
    lease_until       = NULL,
    attempt_count     = attempt_count + 1,
    last_error        = @last_error::text,
    updated_at        = now()
WHERE id = @id
  AND ((state IN ('PENDING', 'UNKNOWN') AND NOT needs_review AND next_attempt_at <= now())
       OR (state = 'SENDING' AND lease_until < now()))
  AND @state::text IN ('SUPPRESSED', 'FAILED', 'UNKNOWN')
  AND (@state::text = 'UNKNOWN') = @needs_review::bool
RETURNING attempt_count;

-- name: TaskSetAside :execrows
-- Moves one task out of the claim's way after the database refused to claim it for what its own rows
-- hold (a constraint, a trigger's exception, a data exception: e.g. an attempt row that clashes with the
-- next attempt number). Without it, that task stays first in line and every claim on its channel fails:
-- one bad row would stop the queue. Nothing about the task's history changes: a waiting task keeps its
-- state and is due again after @delay_seconds; a SENDING task whose lease expired keeps its holder's
-- token (a live holder may still finish) and is taken over after the lease is extended by that long.
-- last_error says why, for status and review. Guarded on the state the claim found: a task that moved
-- meanwhile is left alone (0 rows).
UPDATE delivery_task
SET next_attempt_at = CASE WHEN state = 'SENDING' THEN next_attempt_at
                           ELSE now() + make_interval(secs => @delay_seconds::float8) END,
    lease_until     = CASE WHEN state = 'SENDING' THEN now() + make_interval(secs => @delay_seconds::float8)
                           ELSE lease_until END,
    last_error      = @last_error::text
WHERE id = @id
  AND ((state IN ('PENDING', 'UNKNOWN') AND NOT needs_review AND next_attempt_at <= now())
       OR (state = 'SENDING' AND lease_until < now()));

-- name: TaskPark :execrows
-- Stops automatic processing of a locked task whose history is uncertain and which may not be called
-- again (a channel with neither idempotency key nor query, or no attempt budget left after a lease
-- expired). No call, no new attempt; a human resolves it (notifier_resolve). Guards on the row's state
-- as TaskSettleWithoutCall does: only a due waiting task or an expired SENDING one; 0 rows otherwise.
UPDATE delivery_task
SET state             = 'UNKNOWN',
    needs_review      = true,
    outcome_uncertain = true,
    uncertain_since   = coalesce(uncertain_since, updated_at),
    next_attempt_at   = NULL,
    lease_owner       = NULL,
    lease_until       = NULL,
    last_error        = @last_error::text,
    updated_at        = now()
WHERE id = @id
  AND ((state IN ('PENDING', 'UNKNOWN') AND NOT needs_review AND next_attempt_at <= now())
       OR (state = 'SENDING' AND lease_until < now()));

-- name: TaskFinish :many
-- Records what each holder's call observed, one row per attempt, in one statement (autocommit: the whole
-- finish is atomic without a transaction block). Guarded per row by the attempt token (R2): a task changes
-- only while it is SENDING with exactly that token. Then, on the attempt rows (R3, written once):
--   AttemptFinish: the holders whose task changed record their observation as the attempt's outcome;
--   AttemptRecordLate: the superseded holders (their lease expired and another claim took over) keep it
--   as late_outcome, without touching outcome or the task.
-- A superseding claim changes the task's token and closes the old attempt (AttemptMarkLeaseExpired) in
-- one transaction; this statement waits for that task row lock, so the late branch is chosen exactly when
-- the takeover committed first, and its update re-checks `late_outcome IS NULL` on the attempt's newest
-- version (data-modifying CTEs run to completion whether or not the final SELECT reads them). Returns
-- per attempt whether its observation is the task's (current: recorded now, or by an earlier copy). next_attempt_at is set only for states that wait for a
-- retry (a negative retry_after_seconds means none: finished, or parked with needs_review; the table's
-- CHECKs refuse any other combination). An empty provider_msg_id, last_error or error means none.
-- Attempt tokens arrive as text[] and are cast to uuid here: the worker holds them as strings, and pgx
-- cannot send strings as a binary uuid[], so a uuid[] parameter made it fail and retry the encoding as
-- text on every call. A malformed token fails the whole statement, as before.
-- Idempotent: a worker whose finish met a broken connection cannot know whether it committed, and sends
-- it again (Dispatcher.FinishBatch, until the lease would run out). An attempt whose row already holds
-- this very outcome was recorded by an earlier copy of this finish (no other statement writes a call's
-- outcome: a takeover writes LEASE_EXPIRED, a late observation goes to late_outcome): recorded_before
-- changes nothing and reports it current, not superseded.
WITH u AS (
    SELECT unnest(@ids::bigint[]) AS id,
           unnest(@attempt_tokens::text[])::uuid AS attempt_token,
           unnest(@states::text[]) AS state,
           unnest(@outcome_uncertain::bool[]) AS outcome_uncertain,
           unnest(@needs_review::bool[]) AS needs_review,
           unnest(@provider_msg_ids::text[]) AS provider_msg_id,
           unnest(@last_errors::text[]) AS last_error,
           unnest(@retry_after_seconds::float8[]) AS retry_after_seconds,
           unnest(@outcomes::text[]) AS outcome,
           unnest(@errors::text[]) AS error
), recorded_before AS (
    SELECT u.attempt_token
    FROM u
    JOIN delivery_attempt a ON a.attempt_token = u.attempt_token
    WHERE a.outcome = u.outcome
), finished AS (
    UPDATE delivery_task t
    SET state             = u.state,
        outcome_uncertain = u.outcome_uncertain,
        -- updated_at is still this attempt's claim time: nothing else changes a SENDING row with our token
        uncertain_since   = CASE WHEN u.outcome_uncertain THEN coalesce(t.uncertain_since, t.updated_at) END,
        needs_review      = u.needs_review,
        -- the refund of an attempt refused for an account state (schema/003 checks its attempt row)
        account_refusals  = t.account_refusals + CASE WHEN u.outcome = 'ACCOUNT_REFUSED' THEN 1 ELSE 0 END,
        provider_msg_id   = coalesce(nullif(u.provider_msg_id, ''), t.provider_msg_id),
        last_error        = nullif(u.last_error, ''),
        lease_owner       = NULL,
        lease_until       = NULL,
        next_attempt_at   = CASE WHEN u.retry_after_seconds >= 0
                                 THEN now() + make_interval(secs => u.retry_after_seconds) END,
        updated_at        = now()
    FROM u
    WHERE t.id = u.id
      AND t.state = 'SENDING'
      AND t.attempt_token = u.attempt_token
    RETURNING t.id, t.attempt_token
), attempt_finish AS (
    UPDATE delivery_attempt a
    SET outcome         = u.outcome,
        finished_at     = now(),
        provider_msg_id = nullif(u.provider_msg_id, ''),
        error           = nullif(u.error, '')
    FROM u
    JOIN finished f ON f.attempt_token = u.attempt_token
    WHERE a.attempt_token = u.attempt_token
      AND a.outcome IS NULL
), attempt_record_late AS (
    UPDATE delivery_attempt a
    SET late_outcome    = u.outcome,
        late_at         = now(),
        provider_msg_id = coalesce(a.provider_msg_id, nullif(u.provider_msg_id, '')),
        error           = coalesce(a.error, nullif(u.error, ''))
    FROM u
    WHERE a.attempt_token = u.attempt_token
      AND a.late_outcome IS NULL
      AND NOT EXISTS (SELECT 1 FROM finished f WHERE f.attempt_token = u.attempt_token)
      AND NOT EXISTS (SELECT 1 FROM recorded_before r WHERE r.attempt_token = u.attempt_token)
      -- re-checked on the row's newest version after a wait: an earlier copy that committed meanwhile
      AND a.outcome IS DISTINCT FROM u.outcome
)
SELECT u.id::bigint AS id,
       (f.id IS NOT NULL OR EXISTS (SELECT 1 FROM recorded_before r WHERE r.attempt_token = u.attempt_token))::bool AS current
FROM u
LEFT JOIN finished f ON f.attempt_token = u.attempt_token;

-- name: TaskResolveManually :one
-- A human's final word on a parked task, after checking with the channel: notifier_resolve (schema/003)
-- sets SENT or FAILED and appends the MANUAL_SENT / MANUAL_FAILED attempt with the note and the operator
-- in one statement, or does nothing. Only a parked task (UNKNOWN and needs_review) is resolved, once: a
-- second or concurrent call re-evaluates the function's WHERE after the first commits and returns no row
-- (pgx.ErrNoRows). The operator role may run nothing else that writes (EXECUTE on this function only).
SELECT r.attempt_no::integer AS attempt_no
FROM notifier_resolve(@id::bigint, @final_state::text, @note::text, @operator::text,
                      sqlc.narg('provider_msg_id')::text) AS r;

-- name: TaskGet :one
-- One task as the service knows it.
SELECT id, notification_id, channel, ref, state, attempt_count, max_attempts, attempt_token, lease_owner,
       lease_until, next_attempt_at, outcome_uncertain, uncertain_since, needs_review, provider_msg_id,
       last_error, created_at, updated_at
FROM delivery_task
WHERE id = @id;

-- name: TaskListByNotification :many
-- Every task of one notification (notifier show), whatever its state, in creation order. Read only; R2
-- makes it one row per channel at most: the tasks are found through the UNIQUE (notification_id,
-- channel) index of their key rows (schema/001), then read by primary key.
SELECT t.id, t.channel, t.ref, t.state, t.needs_review, t.attempt_count, t.last_error, t.fallback_position
FROM delivery_task_key k
JOIN delivery_task t ON t.id = k.task_id
WHERE k.notification_id = @notification_id
ORDER BY t.id;

-- name: TaskListParked :many
-- Tasks waiting for a human (notifier review, the console's list), oldest first, via
-- delivery_task_parked_idx; only those of @channel when it is given (the console's filter: a filter in
-- the statement, not after it, so a page is full whenever more tasks match). Read only.
SELECT t.id, t.notification_id, t.channel, t.state, t.attempt_count, t.max_attempts, t.provider_msg_id,
       t.last_error, t.updated_at, n.user_id, n.event_key
FROM delivery_task t
JOIN notification n ON n.id = t.notification_id
WHERE t.needs_review
  AND t.id > @after_id
  AND (sqlc.narg('channel')::text IS NULL OR t.channel = sqlc.narg('channel')::text)
ORDER BY t.id
LIMIT @max_rows;

-- name: TaskListLateAccepted :many
-- Final "not sent" tasks (FAILED, SUPPRESSED) that later evidence says were accepted after all: a
-- superseded holder recorded ACCEPTED, ACCEPTED_REPLAY or QUERY_FOUND as its attempt's late_outcome, or a
-- provider's receipt arrived (schema/004: after the task was final, or while it was held and its finish
-- then wrote it off). The state stays final (R3: the evidence is kept, not applied); notifier review shows
-- these so a human learns that the user may have received the message. Via the partial indexes
-- delivery_attempt_late_accepted_idx, delivery_receipt_contradicts_idx and
-- delivery_task_receipt_contradicted_idx. Only those of @channel and in @state (FAILED or SUPPRESSED)
-- when given: the console's filters, in the statement so that a page is full whenever more tasks match.
SELECT t.id, t.notification_id, t.channel, t.state, t.attempt_count, t.max_attempts, t.provider_msg_id,
       t.last_error, t.updated_at, n.user_id, n.event_key
FROM delivery_task t
JOIN notification n ON n.id = t.notification_id
WHERE (t.id IN (SELECT a.task_id FROM delivery_attempt a
                WHERE a.late_outcome IN ('ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND'))
       OR t.id IN (SELECT r.task_id FROM delivery_receipt r WHERE r.effect = 'CONTRADICTS')
       OR t.receipt_at IS NOT NULL)
  AND t.state IN ('FAILED', 'SUPPRESSED')
  AND t.id > @after_id
  AND (sqlc.narg('channel')::text IS NULL OR t.channel = sqlc.narg('channel')::text)
  AND (sqlc.narg('state')::text IS NULL OR t.state = sqlc.narg('state')::text)
ORDER BY t.id
LIMIT @max_rows;

-- name: TaskCountLateAccepted :one
-- How many final "not sent" tasks later evidence contradicts (see TaskListLateAccepted), for notifier
-- status: schema/004's notifier_late_accepted_count(), which the alert gauges count with too.
SELECT notifier_late_accepted_count()::bigint AS tasks;

-- name: TaskCountByChannelState :many
-- Counts for notifier status.
SELECT channel, state, needs_review, count(*)::bigint AS tasks
FROM delivery_task
GROUP BY channel, state, needs_review
ORDER BY channel, state, needs_review;

-- name: TaskOldestReady :one
-- Age of the longest-waiting due task (0 when none), for notifier status and alerting.
SELECT coalesce(extract(epoch FROM now() - min(next_attempt_at)), 0)::float8 AS age_seconds
FROM delivery_task
WHERE next_attempt_at IS NOT NULL AND next_attempt_at <= now();

-- name: TaskCountScheduled :one
-- Tasks waiting for their send time (schema/005), for notifier status and its gauge: waiting, never
-- attempted (attempt_count = 0, so a task set aside for a retry is not counted) and not due yet. They are
-- not overdue: TaskOldestReady and TaskAlertGauges measure a task only from its next_attempt_at, once
-- it has come. Reads the range of delivery_task_ready_idx after now() of each channel, and each of those
-- tasks: a cost that grows with the scheduled tasks (docs/operations.md#scheduled-tasks).
SELECT count(*)::bigint AS tasks
FROM delivery_task t
WHERE t.next_attempt_at > now() AND t.attempt_count = 0;

-- name: TaskAlertGauges :one
-- What the alert rules watch, fleet-wide, for `notifier work --metrics-addr` (every worker reads it every
-- 15 s; the rules take the max over workers). Reads only. Each part costs what there is to show, not the
-- backlog: parked tasks (how many, and since when the oldest waits: TaskPark set its updated_at) by
-- delivery_task_parked_idx; the oldest due task as TaskOldestReady measures it, but found by a skip scan
-- of delivery_task_ready_idx (the first entry of each channel, then the first due entry per channel:
-- a cost that grows with the channels, where a min() over the index would read every waiting task);
-- late acceptances by schema/004's notifier_late_accepted_count(), as status counts them (the worker
-- role may run that function, and read nothing of delivery_receipt).
WITH RECURSIVE channels AS (
    (SELECT t.channel FROM delivery_task t WHERE t.next_attempt_at IS NOT NULL ORDER BY t.channel LIMIT 1)
    UNION ALL
    SELECT (SELECT t.channel FROM delivery_task t
            WHERE t.next_attempt_at IS NOT NULL AND t.channel > c.channel
            ORDER BY t.channel LIMIT 1)
    FROM channels c
    WHERE c.channel IS NOT NULL
), due AS (
    SELECT (SELECT t.next_attempt_at FROM delivery_task t
            WHERE t.channel = c.channel AND t.next_attempt_at IS NOT NULL AND t.next_attempt_at <= now()
            ORDER BY t.next_attempt_at LIMIT 1) AS since
    FROM channels c
    WHERE c.channel IS NOT NULL
), parked AS (
    SELECT count(*) AS tasks, min(t.updated_at) AS since FROM delivery_task t WHERE t.needs_review
)
SELECT (SELECT p.tasks FROM parked p)::bigint AS parked,
       coalesce(extract(epoch FROM now() - (SELECT p.since FROM parked p)), 0)::float8 AS oldest_parked_seconds,
       coalesce(extract(epoch FROM now() - (SELECT min(d.since) FROM due d)), 0)::float8 AS oldest_due_seconds,
       notifier_late_accepted_count()::bigint AS late_accepted;
