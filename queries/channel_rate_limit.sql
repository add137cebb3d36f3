-- Per-channel rate limits shared by every worker (schema/001_tables.sql): one token bucket row per
-- channel, refilled lazily on the database clock by rate_limit_tokens(). A channel without a row has no
-- limit. None of these statements reads or writes a task: a limit decides how many of a channel's tasks
-- a claim may call, never what happens to a task.

-- name: RateLimitConfigure :exec
-- `notifier work` at start, for a channel with rate_limit in its channels file (autocommit, one row).
-- A new bucket starts full: up to burst calls may go out at once. An existing one takes the new rate
-- and burst (the last worker to start wins) and keeps what it holds, counted up to now at its old rate
-- and clamped to the new burst; a pause in progress stays.
INSERT INTO channel_rate_limit AS b (channel, rate, burst, tokens)
VALUES (@channel::text, @rate::float8, @burst::float8, @burst::float8)
ON CONFLICT (channel) DO UPDATE
SET rate        = excluded.rate,
    burst       = excluded.burst,
    tokens      = least(excluded.burst, rate_limit_tokens(b.tokens, b.rate, b.burst, b.refilled_at, b.paused_until)),
    refilled_at = greatest(b.refilled_at, now()),
    updated_at  = greatest(b.updated_at, now());

-- name: RateLimitPeek :many
-- The claim's first statement on a worker with limited channels: the tokens each bucket of @channels
-- could grant now, read by primary key without a lock. The claim locks no more of a channel's tasks
-- than there are whole tokens, and does not look at a channel with less than one: a throttled backlog
-- costs one index probe per claim (TestRateLimitClaimIgnoresThrottledBacklog). It is only an estimate:
-- RateLimitTake decides.
SELECT b.channel::text AS channel,
       rate_limit_tokens(b.tokens, b.rate, b.burst, b.refilled_at, b.paused_until)::float8 AS tokens
FROM channel_rate_limit b
WHERE b.channel = ANY (@channels::text[]);

-- name: RateLimitTake :many
-- The claim, once it has locked a limited channel's tasks and decided which it will call: grants per
-- channel at most @calls tokens, never more than the whole tokens the bucket holds, and takes them. The
-- claim calls only as many of the channel's tasks as granted and leaves the rest untouched (they are
-- due again at once); tasks settled or parked at claim time make no call and take no token. Guards the
-- limit across workers: the buckets are locked (FOR UPDATE) in channel order, so claims that need the
-- same buckets queue instead of deadlocking, and the tokens are counted on the locked row's newest
-- version; the lock lasts until the claim commits, so a claim that rolls back gives its tokens back. A
-- bucket with nothing to grant is not written. A channel without a row gets no row back (no limit).
WITH want AS (
    SELECT unnest(@channels::text[]) AS channel, unnest(@calls::int[]) AS calls
), bucket AS (
    SELECT b.channel, w.calls,
           rate_limit_tokens(b.tokens, b.rate, b.burst, b.refilled_at, b.paused_until) AS held
    FROM channel_rate_limit b
    JOIN want w ON w.channel = b.channel
    WHERE b.channel = ANY (@channels::text[]) -- by primary key, not a scan of every bucket
    ORDER BY b.channel
    FOR UPDATE OF b
), taken AS (
    UPDATE channel_rate_limit b
    SET tokens      = k.held - least(k.calls, floor(k.held)),
        refilled_at = greatest(b.refilled_at, now())
    FROM bucket k
    WHERE b.channel = k.channel
      AND b.channel = ANY (@channels::text[])
      AND least(k.calls, floor(k.held)) > 0
)
SELECT k.channel::text AS channel, least(k.calls, floor(k.held))::int AS granted
FROM bucket k;

-- name: RateLimitPause :execrows
-- After a call on a limited channel answered 429 (THROTTLED): the channel told us to slow down, so its
-- bucket is emptied and paused for @pause_seconds (its Retry-After, 1 s without one; the worker caps it
-- at an hour, as the table does), for every worker; a longer pause already running stays. Afterwards it
-- refills from empty. Autocommit, one row; 0 rows when the channel has no bucket.
UPDATE channel_rate_limit
SET paused_until = greatest(paused_until, now() + make_interval(secs => @pause_seconds::float8)),
    tokens       = 0,
    refilled_at  = greatest(refilled_at, now()),
    updated_at   = greatest(updated_at, now())
WHERE channel = @channel::text;

-- name: RateLimitList :many
-- Every bucket as it stands now, for notifier status, and for `work` at start to learn which of its
-- channels have one (those its claims consult): rate, burst, whole and partial tokens, and how much
-- longer it is paused (0 when it is not), on the database clock.
SELECT b.channel, b.rate, b.burst,
       rate_limit_tokens(b.tokens, b.rate, b.burst, b.refilled_at, b.paused_until)::float8 AS tokens,
       coalesce(greatest(0, extract(epoch FROM b.paused_until - now())), 0)::float8 AS paused_seconds
FROM channel_rate_limit b
ORDER BY b.channel;
