-- migrate:up
-- Retention (queries/retention.sql, notifier prune) picks the oldest finished tasks in (updated_at, id)
-- order. Partial, like the claim indexes of 003: it holds only tasks in a terminal state, so pruning
-- never reads a PENDING, SENDING or UNKNOWN task, and its cost follows the history to prune, not the
-- live work. A task enters it once, when it reaches SENT, FAILED or SUPPRESSED (final states).
CREATE INDEX delivery_task_finished_idx ON delivery_task (updated_at, id)
    WHERE state IN ('SENT', 'FAILED', 'SUPPRESSED');

-- migrate:down
DROP INDEX delivery_task_finished_idx;
