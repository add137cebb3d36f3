-- name: PrefUpsert :one
-- Sets a user's address and switch on one channel. version goes up on every change so a reader can tell
-- two settings apart. The switch is read again by every claim: disabling it stops any task not yet claimed.
INSERT INTO channel_pref (user_id, channel, address, enabled)
VALUES (@user_id, @channel, @address, @enabled)
ON CONFLICT (user_id, channel) DO UPDATE
    SET address    = excluded.address,
        enabled    = excluded.enabled,
        version    = channel_pref.version + 1,
        updated_at = now()
RETURNING user_id, channel, address, enabled, version, updated_at;

-- name: PrefListByUser :many
-- A user's channels, for operators and tests.
SELECT user_id, channel, address, enabled, version, updated_at
FROM channel_pref
WHERE user_id = @user_id
ORDER BY channel;
