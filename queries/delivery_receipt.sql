-- Receipts (schema/004): a provider's signed callback about a message it accepted, recorded by notifier
-- receipts. Matching finds our task; notifier_apply_receipt settles it when nobody holds it; the receipt
-- row keeps what came and what it did. Nothing here moves a final state (schema/003 refuses it anyway).

-- name: ReceiptTaskByRef :one
-- The task a receipt names by our reference (the task's ref, schema/001; the provider echoes it back as
-- sent: in a status callback's URL, a message tag or metadata). The ref is unique and never reused, so a
-- receipt can only match the task that was sent: after a restore from a backup or a failover that lost
-- transactions, a receipt for a lost task matches nothing (pgx.ErrNoRows: refused, nothing written)
-- instead of a newer task that was handed the same id. Through delivery_task_ref_key, on the task's
-- key row (schema/001).
SELECT k.task_id AS id FROM delivery_task_key k WHERE k.ref = @ref::text;

-- name: ReceiptTasksByProviderMsgID :many
-- The tasks a provider's message id belongs to, for a receipt that carries no reference of ours: the id
-- the finish stored on the task, or one an attempt kept that its task does not carry (a late observation,
-- an id replaced since), which the triggers of schema/003 record in delivery_task_provider_msg. At most
-- two rows: one is a match, two are ambiguous (refused), none is unknown (refused). Through the partial
-- index delivery_task_provider_msg_idx and delivery_task_provider_msg_pkey.
SELECT id FROM (
    SELECT t.id FROM delivery_task t WHERE t.provider_msg_id = @provider_msg_id::text
    UNION
    SELECT p.task_id AS id FROM delivery_task_provider_msg p WHERE p.provider_msg_id = @provider_msg_id::text
) m
ORDER BY id
LIMIT 2;

-- name: ReceiptApply :one
-- A receipt's effect on its task (notifier_apply_receipt, schema/004): SETTLED (made SENT with a RECEIPT
-- attempt: the task was waiting, parked, or held under an expired lease), NOTED (SENDING under a live
-- lease: its holder finishes, then the sweep settles it), UNCHANGED (already SENT) or CONTRADICTS (FAILED
-- or SUPPRESSED: final, the receipt is only kept and shown). No row: no such task, so an unknown reference
-- is refused with nothing written. Locks the task row for the transaction.
SELECT r.effect::text AS effect, r.state::text AS state
FROM notifier_apply_receipt(@task_id::bigint, sqlc.narg('provider_msg_id')::text, @note::text) AS r;

-- name: ReceiptInsert :one
-- Records a receipt once per provider event: a redelivered or replayed callback (same source and event
-- id) inserts nothing and returns no row (pgx.ErrNoRows); the caller then rolls back what it applied.
-- Append-only (delivery_receipt_append_only).
INSERT INTO delivery_receipt (task_id, source, event_id, kind, hard_bounce, effect, provider_msg_id, occurred_at, detail)
VALUES (@task_id, @source, @event_id, @kind, @hard_bounce, @effect, sqlc.narg('provider_msg_id'),
        sqlc.narg('occurred_at'), sqlc.narg('detail'))
ON CONFLICT (source, event_id) DO NOTHING
RETURNING id;

-- name: ReceiptSweep :many
-- Settles tasks whose receipt arrived while a holder was calling (NOTED) once nobody holds them: waiting,
-- parked, or under an expired lease. Run by notifier receipts every few seconds; @max_tasks at a time,
-- through the small partial index delivery_task_receipt_unsettled_idx. A task still held under a live
-- lease is left to its holder.
SELECT t.id, r.effect::text AS effect
FROM (SELECT dt.id FROM delivery_task dt
      WHERE dt.receipt_at IS NOT NULL AND dt.state IN ('PENDING', 'SENDING', 'UNKNOWN')
        AND (dt.state <> 'SENDING' OR dt.lease_until < now())
      ORDER BY dt.id
      LIMIT @max_tasks) t
CROSS JOIN LATERAL notifier_apply_receipt(t.id, NULL, 'settled by a receipt noted while the task was held') AS r;

-- name: ReceiptCountByKind :many
-- Receipts by kind and effect, for notifier status.
SELECT kind, effect, count(*)::bigint AS receipts
FROM delivery_receipt
GROUP BY kind, effect
ORDER BY kind, effect;
