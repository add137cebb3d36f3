-- migrate:up
-- How many final "not sent" tasks (FAILED, SUPPRESSED) later evidence says were accepted after all: a
-- superseded holder's late_outcome ACCEPTED, ACCEPTED_REPLAY or QUERY_FOUND, a provider's receipt that
-- contradicts the write-off, or a receipt noted while the task was held and then written off (the tasks
-- TaskListLateAccepted lists). notifier status shows it, and `notifier work --metrics-addr` exports it
-- for the alert rules (TaskAlertGauges). A function so that the worker role learns this one number and
-- nothing of delivery_receipt: a grant on the table would also let it run `notifier review`, which is
-- the operator's. SECURITY DEFINER, search_path pinned, pg_temp last; STABLE, it writes nothing.
--
-- Found from the evidence, each part by its partial index (delivery_attempt_late_accepted_idx,
-- delivery_receipt_contradicts_idx, delivery_task_receipt_contradicted_idx), then the tasks by id: a
-- cost that grows with the late acceptances, not with the FAILED and SUPPRESSED tasks kept (the OR of
-- the three tests over the tasks read all of those: 110 ms for 200,000 of them; this, 0.6 ms).
CREATE FUNCTION notifier_late_accepted_count()
    RETURNS bigint
    LANGUAGE sql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, public, pg_temp
AS $$
    SELECT count(*)
    FROM public.delivery_task t
    WHERE t.id IN (SELECT a.task_id FROM public.delivery_attempt a
                   WHERE a.late_outcome IN ('ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND')
                   UNION
                   SELECT r.task_id FROM public.delivery_receipt r WHERE r.effect = 'CONTRADICTS'
                   UNION
                   SELECT c.id FROM public.delivery_task c
                   WHERE c.receipt_at IS NOT NULL AND c.state IN ('FAILED', 'SUPPRESSED'))
      AND t.state IN ('FAILED', 'SUPPRESSED')
$$;

COMMENT ON FUNCTION notifier_late_accepted_count() IS
    'How many FAILED or SUPPRESSED tasks a late answer or a receipt says were accepted (status, the alert gauges)';

REVOKE EXECUTE ON FUNCTION notifier_late_accepted_count() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION notifier_late_accepted_count() TO notifier_worker, notifier_operator;

-- migrate:down
DROP FUNCTION notifier_late_accepted_count();
