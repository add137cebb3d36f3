-- migrate:up
-- `notifier work --metrics-addr` exports fleet-wide gauges for the alert rules (TaskAlertGauges), among
-- them the late acceptances that `notifier status` counts (TaskCountLateAccepted): a final "not sent"
-- task that a receipt contradicts is one of them, so the worker must see which task a receipt
-- contradicted. It gets exactly those two columns: no provider ids, no details, no write.
GRANT SELECT (task_id, effect) ON delivery_receipt TO notifier_worker;

-- migrate:down
REVOKE SELECT (task_id, effect) ON delivery_receipt FROM notifier_worker;
