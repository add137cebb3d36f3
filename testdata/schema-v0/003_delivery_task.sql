-- migrate:up
-- One task per (notification, channel): how much the service knows about delivering it there.
--   attempt_token      the one valid token of the current holder; finish is guarded by it.
--   outcome_uncertain  an earlier attempt may have been accepted by the channel.
--   needs_review       parked: automatic processing stopped, a human resolves it (notifier resolve).
--   next_attempt_at    set exactly when the task is waiting for a claim (PENDING or UNKNOWN, not parked).
CREATE TABLE delivery_task (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    notification_id   bigint      NOT NULL REFERENCES notification (id),
    channel           text        NOT NULL CHECK (channel ~ '^[a-z][a-z0-9_-]{0,31}$'),
    state             text        NOT NULL DEFAULT 'PENDING'
                      CHECK (state IN ('PENDING', 'SENDING', 'SENT', 'UNKNOWN', 'FAILED', 'SUPPRESSED')),
    attempt_count     integer     NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    max_attempts      integer     NOT NULL CHECK (max_attempts BETWEEN 1 AND 100),
    attempt_token     uuid,
    lease_owner       text        CHECK (length(lease_owner) <= 200),
    lease_until       timestamptz,
    next_attempt_at   timestamptz DEFAULT now(),
    outcome_uncertain boolean     NOT NULL DEFAULT false,
    needs_review      boolean     NOT NULL DEFAULT false,
    provider_msg_id   text        CHECK (length(provider_msg_id) <= 500),
    last_error        text        CHECK (length(last_error) <= 2000),
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT delivery_task_notification_channel_key UNIQUE (notification_id, channel),
    -- A holder always has a token and a lease: without them no one could ever take the task over.
    CONSTRAINT delivery_task_sending_has_lease
        CHECK (state <> 'SENDING' OR (lease_until IS NOT NULL AND attempt_token IS NOT NULL AND lease_owner IS NOT NULL)),
    -- Only an UNKNOWN task can be parked for review.
    CONSTRAINT delivery_task_review_only_unknown CHECK (NOT needs_review OR state = 'UNKNOWN'),
    -- Claimable by time exactly when waiting: parked and finished tasks carry no next_attempt_at, so the
    -- claim index below never holds them.
    CONSTRAINT delivery_task_scheduled_iff_waiting
        CHECK ((next_attempt_at IS NOT NULL) = (state IN ('PENDING', 'UNKNOWN') AND NOT needs_review))
);

-- The claim path. Both indexes are partial: finished and parked tasks are not in them, so a claim's cost
-- does not grow with history (docs/protocol.md#known-boundaries).
CREATE INDEX delivery_task_ready_idx ON delivery_task (next_attempt_at, id) WHERE next_attempt_at IS NOT NULL;
CREATE INDEX delivery_task_leased_idx ON delivery_task (lease_until, id) WHERE state = 'SENDING';
-- Operators list parked tasks (notifier review).
CREATE INDEX delivery_task_parked_idx ON delivery_task (id) WHERE needs_review;

-- migrate:down
DROP TABLE delivery_task;
