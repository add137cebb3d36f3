-- name: PrefUpsert :one
-- Sets a user's address and switch on one channel. version goes up on every change (not on a repeat
-- of the same setting) so a reader can tell two settings apart. The switch is read again by every claim:
-- disabling it stops any task not yet claimed.
INSERT INTO channel_pref (user_id, channel, address, enabled)
VALUES (@user_id, @channel, @address, @enabled)
ON CONFLICT (user_id, channel) DO UPDATE
    SET address    = excluded.address,
        enabled    = excluded.enabled,
        version    = channel_pref.version
                     + CASE WHEN (channel_pref.address, channel_pref.enabled)
                                 IS DISTINCT FROM (excluded.address, excluded.enabled) THEN 1 ELSE 0 END,
        updated_at = CASE WHEN (channel_pref.address, channel_pref.enabled)
                               IS DISTINCT FROM (excluded.address, excluded.enabled)
                          THEN now() ELSE channel_pref.updated_at END
RETURNING user_id, channel, address, enabled, version, updated_at;

-- name: PrefListByUser :many
-- A user's channels, for operators and tests.
SELECT user_id, channel, address, enabled, version, updated_at
FROM channel_pref
WHERE user_id = @user_id
ORDER BY channel;
