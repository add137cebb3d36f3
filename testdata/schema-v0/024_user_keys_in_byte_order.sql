-- migrate:up
-- The keys a submission is deduplicated and routed by, a notification's (user_id, event_key) and a
-- preference's user_id, compare byte by byte (COLLATE "C") instead of by the database's language rules,
-- as 023 made the delivery's identifiers. Only equality is asked of them by the protocol: R1's UNIQUE
-- (user_id, event_key) holds the same under any deterministic collation, since two values are equal
-- exactly when their bytes are. Every create inserts its key into notification_user_event_key_key and
-- looks its user up in channel_pref_pkey (and so does every claim), and under a language's collation each
-- comparison on the way down those trees is a strcoll(). Measured with `just bench-create-jsonl` on a
-- cluster initialised with en_US.UTF-8: bulk create went from 1.01-1.03 to 1.19-1.20 x River's InsertMany
-- (docs/benchmarks/2026-12-05-byte-order-keys.md). NotificationInsert still sorts a batch in the
-- database's collation, so batches of this release and of earlier ones lock shared keys in one order.
--
-- The creator's insert policy on delivery_task reads both user_id columns, so it goes while they change
-- (PostgreSQL refuses otherwise) and comes back as 020 made it. No table is rewritten: the two indexes
-- are rebuilt, holding writes to notification and channel_pref meanwhile.
DROP POLICY delivery_task_creator_insert ON delivery_task;
ALTER TABLE notification
    ALTER COLUMN user_id TYPE text COLLATE "C",
    ALTER COLUMN event_key TYPE text COLLATE "C";
ALTER TABLE channel_pref ALTER COLUMN user_id TYPE text COLLATE "C";
CREATE POLICY delivery_task_creator_insert ON delivery_task FOR INSERT TO notifier_creator
    WITH CHECK (state = 'PENDING' AND attempt_count = 0 AND next_attempt_at = now()
                AND EXISTS (SELECT FROM notification n
                            JOIN channel_pref p ON p.user_id = n.user_id AND p.channel = delivery_task.channel
                            WHERE n.id = delivery_task.notification_id
                              AND n.xmin = pg_current_xact_id()::xid
                              AND p.enabled));

-- migrate:down
DROP POLICY delivery_task_creator_insert ON delivery_task;
ALTER TABLE notification
    ALTER COLUMN user_id TYPE text COLLATE "default",
    ALTER COLUMN event_key TYPE text COLLATE "default";
ALTER TABLE channel_pref ALTER COLUMN user_id TYPE text COLLATE "default";
CREATE POLICY delivery_task_creator_insert ON delivery_task FOR INSERT TO notifier_creator
    WITH CHECK (state = 'PENDING' AND attempt_count = 0 AND next_attempt_at = now()
                AND EXISTS (SELECT FROM notification n
                            JOIN channel_pref p ON p.user_id = n.user_id AND p.channel = delivery_task.channel
                            WHERE n.id = delivery_task.notification_id
                              AND n.xmin = pg_current_xact_id()::xid
                              AND p.enabled));
