-- migrate:up
-- Per-channel rate limits shared by every worker on every machine: one token bucket row per channel
-- (issue 18). A worker takes tokens in its claim's transaction, one per channel call, so a task whose
-- channel has no token left is simply not claimed yet; a 429 from the channel pauses the bucket for
-- every worker. A channel without a row has no limit, and no worker reads or writes a row for it.
--
-- The bucket is lazy: (tokens, refilled_at) is its content at refilled_at, and it fills at `rate`
-- tokens per second up to `burst`, on the database clock (rate_limit_tokens below), so nothing needs
-- to tick. While paused_until is in the future it holds nothing and fills with nothing; afterwards it
-- fills from empty, from paused_until on.
--
-- The moves (queries/channel_rate_limit.sql, each a single statement):
--   RateLimitConfigure  `notifier work` at start, for a channel with rate_limit in its channels file:
--                       insert the bucket full, or set rate and burst and keep what it holds (clamped
--                       to the new burst): the last worker to start wins.
--   RateLimitPeek       the claim, before it locks a channel's tasks: how many whole tokens there are,
--                       without a lock. Below one, the channel's tasks are not even looked at.
--   RateLimitTake       the claim, once it knows how many calls it will make: locks the buckets (in
--                       channel order: two claims never wait for each other in a cycle), grants at
--                       most the whole tokens there are, and keeps the row lock until the claim
--                       commits, so a claim that rolls back gives its tokens back.
--   RateLimitPause      after a 429: empty the bucket and pause it until the Retry-After has passed
--                       (1 s without one), for every worker.
--   RateLimitList       notifier status, and `notifier work` at start: which of its channels have a
--                       bucket (its claims consult exactly those).
CREATE TABLE channel_rate_limit (
    channel      text        NOT NULL,
    rate         float8      NOT NULL, -- tokens per second
    burst        float8      NOT NULL, -- most tokens held: calls that may go out at once
    tokens       float8      NOT NULL, -- held at refilled_at
    refilled_at  timestamptz NOT NULL DEFAULT now(),
    paused_until timestamptz,          -- no token before this (a 429); NULL: not paused
    updated_at   timestamptz NOT NULL DEFAULT now(), -- last configured or paused
    CONSTRAINT channel_rate_limit_pkey PRIMARY KEY (channel),
    -- the same names a task's channel may have (delivery_task_channel_check)
    CONSTRAINT channel_rate_limit_channel_check CHECK (channel ~ '^[a-z][a-z0-9_-]{0,31}$'),
    -- positive and finite (NaN compares above every number, so the upper bound refuses it too)
    CONSTRAINT channel_rate_limit_rate_check CHECK (rate > 0 AND rate <= 1000000),
    CONSTRAINT channel_rate_limit_burst_check CHECK (burst >= 1 AND burst <= 1000000),
    CONSTRAINT channel_rate_limit_tokens_check CHECK (tokens >= 0 AND tokens <= burst),
    CONSTRAINT channel_rate_limit_refilled_at_check CHECK (isfinite(refilled_at)),
    CONSTRAINT channel_rate_limit_updated_at_check CHECK (isfinite(updated_at)),
    -- a Retry-After is honoured for at most an hour (httpkit.MaxRetryAfter): a bad header or a bad hand
    -- edit cannot stop a channel for days
    CONSTRAINT channel_rate_limit_pause_check CHECK (paused_until <= updated_at + interval '1 hour')
);

-- The whole tokens a bucket could grant now are floor() of this: what it held at refilled_at plus what
-- it gained since (never from before a pause's end), at most burst; nothing while paused. now() is the
-- transaction's clock, as for every lease; a statement that moves refilled_at takes greatest() of the
-- two, so a claim whose transaction began before another's take never counts that interval twice.
CREATE FUNCTION rate_limit_tokens(tokens float8, rate float8, burst float8, refilled_at timestamptz,
                                  paused_until timestamptz) RETURNS float8
    LANGUAGE sql STABLE -- no SET clause, not STRICT: inlined into the statements that call it
AS $$
    SELECT CASE WHEN paused_until > now() THEN 0::float8
                ELSE least(burst, tokens + rate * greatest(0::float8,
                         extract(epoch FROM now() - greatest(refilled_at, paused_until))::float8))
           END
$$;

-- notifier_worker runs all of the moves above (SELECT for their WHERE, ON CONFLICT and RETURNING);
-- it cannot rename a bucket (no UPDATE of channel) nor delete one. notifier_operator reads them
-- (notifier status). The creator has no business here. Lifting a limit is deleting its row, as the
-- tables' owner.
GRANT SELECT ON channel_rate_limit TO notifier_worker, notifier_operator;
GRANT INSERT (channel, rate, burst, tokens) ON channel_rate_limit TO notifier_worker;
GRANT UPDATE (rate, burst, tokens, refilled_at, paused_until, updated_at) ON channel_rate_limit TO notifier_worker;

-- migrate:down
DROP TABLE channel_rate_limit;
DROP FUNCTION rate_limit_tokens(float8, float8, float8, timestamptz, timestamptz);
