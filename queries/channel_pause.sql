-- Channels paused for an account state (schema/001_tables.sql): one row per paused channel,
-- shared by every worker. TaskClaim reads it (and takes a probe's slot); these write and list it.

-- name: ChannelPauseRefused :one
-- After a call on @channel answered ACCOUNT_REFUSED (autocommit, one row). A channel not paused pauses:
-- the first probe after @start_seconds. A refused probe (@probe) doubles the backoff, at most
-- @cap_seconds, and the next probe waits that long; a refusal of a call claimed before the pause (in
-- flight when it began) only updates the cause. Returns whether this statement began the pause, and the
-- backoff now.
INSERT INTO channel_pause AS p (channel, cause, backoff_seconds, probe_after, probe_hold_seconds)
VALUES (@channel::text, @cause::text, @start_seconds::float8, now() + make_interval(secs => @start_seconds::float8),
        @hold_seconds::float8)
ON CONFLICT (channel) DO UPDATE
SET cause              = excluded.cause,
    backoff_seconds    = CASE WHEN @probe::bool THEN least(@cap_seconds::float8, p.backoff_seconds * 2)
                              ELSE p.backoff_seconds END,
    probe_after        = CASE WHEN @probe::bool
                              THEN now() + make_interval(secs => least(@cap_seconds::float8, p.backoff_seconds * 2))
                              ELSE p.probe_after END,
    probe_hold_seconds = excluded.probe_hold_seconds,
    updated_at         = now()
RETURNING (p.xmax = 0)::bool AS began, p.backoff_seconds;

-- name: ChannelPauseEnd :many
-- A probe on @channel got an answer other than ACCOUNT_REFUSED: the account works again, and the channel
-- resumes for every worker. Returns the pause that ended (none when another probe ended it first).
DELETE FROM channel_pause
WHERE channel = @channel::text
RETURNING channel, cause, extract(epoch FROM now() - paused_at)::float8 AS paused_seconds;

-- name: ChannelPauseList :many
-- Every paused channel (notifier status, the console, the metrics): its cause, since when and how long
-- by the database's clock, the current backoff, and how long until the next probe may go (0: now).
SELECT p.channel, p.cause, p.paused_at, p.backoff_seconds,
       extract(epoch FROM now() - p.paused_at)::float8 AS paused_seconds,
       greatest(0, extract(epoch FROM p.probe_after - now()))::float8 AS next_probe_seconds
FROM channel_pause p
ORDER BY p.channel;

-- name: ChannelPauseProbeRelease :exec
-- In the claim's transaction, after its probe task was settled without a call (expired, switched off,
-- settled by a receipt, parked): the provider was asked nothing, so the slot is freed and the next claim
-- probes at once. Without it, tasks that expire during a pause would end one per probe hold (the lease),
-- and the true probe would wait behind them.
UPDATE channel_pause
SET probe_after = now()
WHERE channel = @channel::text;
