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

-- name: PrefDisableByTask :one
-- Switches off the preference a task was sent by (its user and channel), so that no later
-- notification goes to an address the provider said is gone: after a hard bounce receipt (notifier
-- receipts --disable-on-bounce) or an answer that the address is unregistered (FCM UNREGISTERED, APNs
-- 410: notifier work --disable-on-unregistered). The address of each attempt is not recorded: this
-- switches off the user's current preference on that channel, when enabled (no row: already off), and
-- bumps its version, so a claim already holding a task of that preference still sees the change.
UPDATE channel_pref p
SET enabled = false, version = p.version + 1, updated_at = now()
FROM delivery_task t
JOIN notification n ON n.id = t.notification_id
WHERE t.id = @task_id
  AND p.user_id = n.user_id
  AND p.channel = t.channel
  AND p.enabled
RETURNING p.user_id, p.channel;
