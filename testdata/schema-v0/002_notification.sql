-- migrate:up
-- One logical notification per (user_id, event_key). The UNIQUE constraint is the only basis of logical
-- dedupe: however many times and however concurrently an event is submitted, one row exists.
CREATE TABLE notification (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id    text        NOT NULL CHECK (user_id <> '' AND length(user_id) <= 200),
    event_key  text        NOT NULL CHECK (event_key <> '' AND length(event_key) <= 200),
    body       text        NOT NULL CHECK (octet_length(body) <= 65536),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    CONSTRAINT notification_user_event_key_key UNIQUE (user_id, event_key),
    CONSTRAINT notification_expires_after_created CHECK (expires_at > created_at)
);

-- migrate:down
DROP TABLE notification;
