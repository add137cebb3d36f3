-- migrate:up
-- One row per (user, channel): where to reach the user on that channel and whether they want it.
-- Read by create (which channels get a task) and again by every claim (the switch is checked at claim time).
CREATE TABLE channel_pref (
    user_id    text        NOT NULL CHECK (user_id <> '' AND length(user_id) <= 200),
    channel    text        NOT NULL CHECK (channel ~ '^[a-z][a-z0-9_-]{0,31}$'),
    address    text        NOT NULL CHECK (address <> '' AND length(address) <= 1000),
    enabled    boolean     NOT NULL DEFAULT true,
    version    bigint      NOT NULL DEFAULT 1 CHECK (version >= 1),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, channel)
);

-- migrate:down
DROP TABLE channel_pref;
