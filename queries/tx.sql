-- Transaction control of the claim transaction (service/pipelinetx.go). The worker never spends a round
-- trip on BEGIN or COMMIT alone: BEGIN travels in one pipeline with TaskClaim, COMMIT in one pipeline with
-- TaskStartAttempts (or alone when nothing was started). In a pipeline the server skips every message
-- after a failed one up to the pipeline's end, so a COMMIT queued behind a failed statement never runs:
-- the transaction is left aborted and the worker sends TxRollback.

-- TxBegin opens the claim transaction. READ COMMITTED: the claim's SKIP LOCKED and the finish's token
-- guard are written for it (a row changed after the snapshot is re-checked, not a serialization error).
-- name: TxBegin :exec
BEGIN ISOLATION LEVEL READ COMMITTED;

-- TxCommit makes a claim durable: the new tokens, leases and open attempt rows. Only after it returns
-- does the worker call a channel, so every call has its attempt row first.
-- name: TxCommit :exec
COMMIT;

-- TxRollback abandons a claim transaction that failed: its locks are released and nothing of it is
-- written; the tasks stay due for the next claim.
-- name: TxRollback :exec
ROLLBACK;
