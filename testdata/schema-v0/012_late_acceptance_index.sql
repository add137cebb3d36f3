-- migrate:up
-- Operators must see a task whose final "not sent" state a late answer contradicts: a superseded holder
-- whose call was accepted after all (late_outcome ACCEPTED, ACCEPTED_REPLAY or QUERY_FOUND) on a task
-- that meanwhile became FAILED or SUPPRESSED (for instance after a lagging query answered QUERY_NOT_FOUND).
-- The state stays final; notifier review and status surface it (TaskListLateAccepted,
-- TaskCountLateAccepted). Partial: it holds only such late acceptances, which are rare, so both reads
-- cost what there is to show, not the history.
CREATE INDEX delivery_attempt_late_accepted_idx ON delivery_attempt (task_id)
    WHERE late_outcome IN ('ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND');

-- migrate:down
DROP INDEX delivery_attempt_late_accepted_idx;
