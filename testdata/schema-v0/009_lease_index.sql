-- migrate:up
-- delivery_task_leased_idx (003) was partial on state = 'SENDING'. The finish's token guard
-- (TaskFinish: state = 'SENDING' AND attempt_token = ...) implies that predicate, so the planner, which
-- sees a small index, could answer a finish by walking all of it and joining on id instead of looking
-- the tasks up by primary key; and between vacuums the index also holds a dead entry for every task
-- claimed since, so each such finish read more of them. With the predicate on lease_until, which only
-- the claim's expired-lease branch compares (lease_until < now() implies lease_until IS NOT NULL), no
-- finish can choose it. Only SENDING tasks have a lease (TaskFinish, TaskSettleWithoutCall and TaskPark
-- clear it), so the index holds the same rows as before.
-- Not CONCURRENTLY (dbmate sends a file as one multi-statement query, an implicit transaction): the
-- build reads the whole table while holding off writes to it, about a second per million tasks here;
-- on a large table run it when workers may pause.
DROP INDEX delivery_task_leased_idx;
CREATE INDEX delivery_task_leased_idx ON delivery_task (lease_until, id) WHERE lease_until IS NOT NULL;

-- migrate:down
DROP INDEX delivery_task_leased_idx;
CREATE INDEX delivery_task_leased_idx ON delivery_task (lease_until, id) WHERE state = 'SENDING';
