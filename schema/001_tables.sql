-- migrate:up
-- The tables of notifier, each with its columns, checks, keys and indexes in one place. Who may write
-- what is 002_roles_and_row_security.sql; which updates of a task or an attempt are allowed is
-- 003_state_machine.sql; receipts and rate limits' functions are 004, create and cancel 005. The
-- current schema as one dump: db/schema.sql (checked against these files by `just schema-check`).

-- A channel's name and a task's reference are checked where they are written (INSERT, or an UPDATE
-- that sets the column), not on every later UPDATE of the row: a domain's CHECK runs where a value is
-- assigned to a column of that type, so the same rule holds for every writer and costs nothing on an
-- UPDATE that leaves the column alone. As table CHECKs, PostgreSQL evaluated both regular expressions
-- again for every UPDATE of a task, although neither column ever changes after the INSERT (003
-- refuses it): a claim and a finish each ran three regular expressions per task, about 11% of the
-- server's instructions per delivery (docs/benchmarks/2026-12-04-hot-path-checks.md). A value that
-- breaks the rule fails with SQLSTATE 23514 naming notifier_channel_check or notifier_task_ref_check
-- (and the type).
CREATE DOMAIN notifier_channel AS text
    CONSTRAINT notifier_channel_check CHECK (VALUE ~ '^[a-z][a-z0-9_-]{0,31}$');
COMMENT ON DOMAIN notifier_channel IS 'A channel''s name: lowercase, from a letter, at most 32 characters (schema/001)';

-- A lowercase UUID, or an old task's task-<id>: safe in every place it goes (a URL query, a header, a
-- Message-ID), and recognisable when a provider carries it back (delivery.ParseRef).
CREATE DOMAIN notifier_task_ref AS text
    CONSTRAINT notifier_task_ref_check CHECK (
        VALUE ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' OR VALUE ~ '^task-[1-9][0-9]{0,18}$');
COMMENT ON DOMAIN notifier_task_ref IS
    'What the service sends a channel to name a task: a random lowercase UUID, or task-<id> for tasks created before refs were random';

-- Byte order (COLLATE "C"). The keys a submission is deduplicated and routed by (a notification's
-- user_id and event_key, a preference's user_id) and the identifiers we send to channels and get back
-- from them (a task's ref, a provider's message id) compare byte by byte instead of by the database's
-- language rules. Only equality is ever asked of them (R1's UNIQUE, a receipt's lookup, the ref's
-- uniqueness), and equality is the same under both: the default collation is deterministic. What
-- changes is the cost of their indexes: under a language's collation each comparison on the way down a
-- tree is a strcoll(), in byte order a memcmp(); 12% of the server's instructions per delivery on a
-- cluster initialised with en_US.UTF-8, 3% with C.UTF-8, and bulk create from 1.01-1.03 to 1.19-1.20 x
-- River's InsertMany (docs/benchmarks/2026-12-05-byte-order-keys.md). NotificationInsert still sorts a
-- batch in the database's collation.

-- One row per (user, channel): where to reach the user on that channel and whether they want it.
-- Read by create (which channels get a task) and again by every claim (the switch is checked at claim time).
CREATE TABLE channel_pref (
    user_id    text COLLATE "C" NOT NULL CHECK (user_id <> '' AND length(user_id) <= 200),
    channel    notifier_channel NOT NULL,
    address    text        NOT NULL CHECK (address <> '' AND length(address) <= 1000),
    enabled    boolean     NOT NULL DEFAULT true,
    version    bigint      NOT NULL DEFAULT 1 CHECK (version >= 1),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, channel)
);

-- One logical notification per (user_id, event_key). The UNIQUE constraint is the only basis of logical
-- dedupe: however many times and however concurrently an event is submitted, one row exists.
--   cancelled_at, cancel_note  when the submitter took the event back, and why (notifier_cancel, 005):
--                              written only by notifier_cancel (the creator has no UPDATE on notification)
--   send_at                    the send time (docs/protocol.md#send-at), NULL: at once. Stored here so
--                              that show and a duplicate submission see it; each new task is due at
--                              greatest(send_at, now()). A duplicate submission (created = false)
--                              changes nothing, whatever send time it carries.
CREATE TABLE notification (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id      text COLLATE "C" NOT NULL CHECK (user_id <> '' AND length(user_id) <= 200),
    event_key    text COLLATE "C" NOT NULL CHECK (event_key <> '' AND length(event_key) <= 200),
    body         text        NOT NULL CHECK (octet_length(body) <= 65536),
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    cancelled_at timestamptz,
    cancel_note  text        CONSTRAINT notification_cancel_note_check CHECK (length(cancel_note) <= 2000),
    send_at      timestamptz,
    CONSTRAINT notification_user_event_key_key UNIQUE (user_id, event_key),
    CONSTRAINT notification_expires_after_created CHECK (expires_at > created_at),
    CONSTRAINT notification_cancel_note_needs_cancel CHECK (cancel_note IS NULL OR cancelled_at IS NOT NULL),
    -- A notification that expired before its tasks were due would only ever be written off (TTL_EXPIRED).
    CONSTRAINT notification_send_before_expiry CHECK (send_at < expires_at)
);

-- One task per (notification, channel): how much the service knows about delivering it there.
--   attempt_token      the one valid token of the current holder; finish is guarded by it.
--   outcome_uncertain  an earlier attempt may have been accepted by the channel.
--   needs_review       parked: automatic processing stopped, a human resolves it (notifier resolve).
--   next_attempt_at    set exactly when the task is waiting for a claim (PENDING or UNKNOWN, not parked),
--                      but for an unreleased task of a fallback chain (below).
--   uncertain_since    when the task's current uncertainty began: the start of the first attempt that
--                      may have been accepted without our knowing. Channel contracts (idempotency key
--                      retention, query settle time, how long to keep guessing) are measured from it.
--   receipt_at         when the first receipt arrived for a task that was not final yet. Written once
--                      (003: "note a receipt"). While set on a task that is not SENT, the task is settled
--                      by it as soon as nobody holds it: at once when it is waiting or parked, by the
--                      receivers' sweep or the next claim when it was SENDING.
--   ref                the task's channel reference: what the service sends to a channel to name this
--                      task (the query's ref, the Idempotency-Key ntf-<ref>, the webhook-id, the Web Push
--                      Topic, the Message-ID) and what a provider's receipt carries back. Random, chosen
--                      by the database when the task is created (gen_random_uuid: 122 random bits), never
--                      changed (delivery_task_ref_fixed, 003): ids are not unique across the database's
--                      life (a restore from a backup, or a failover to a standby that had not received
--                      the last transactions, hands the lost ids out again, while the channel still
--                      remembers the keys it saw), so what was sent to a channel must never name another
--                      task. task-<id> is the form of tasks created before refs were random.
--   account_refusals   the task's attempts that the provider refused for a state of our account an
--                      operator can fix (ACCOUNT_REFUSED): refunded from the budget, so a claim checks
--                      attempt_count - account_refusals < max_attempts (003: delivery_task_account_refusals).
--   fallback_position  the task's place in its notification's fallback chain (docs/protocol.md#fallback),
--                      from 1 in chain order; NULL outside a chain. Only the first is due at create; the
--                      others are PENDING with no next_attempt_at ("unreleased") until the one before ends
--                      certainly not sent (005: delivery_task_fallback).
CREATE TABLE delivery_task (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    notification_id   bigint      NOT NULL REFERENCES notification (id),
    channel           notifier_channel NOT NULL,
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
    provider_msg_id   text COLLATE "C" CHECK (length(provider_msg_id) <= 500),
    last_error        text        CHECK (length(last_error) <= 2000),
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    uncertain_since   timestamptz,
    receipt_at        timestamptz,
    ref               notifier_task_ref COLLATE "C" NOT NULL DEFAULT gen_random_uuid()::text,
    account_refusals  integer     NOT NULL DEFAULT 0,
    fallback_position smallint    CONSTRAINT delivery_task_fallback_position_check CHECK (fallback_position BETWEEN 1 AND 32),
    -- A holder always has a token and a lease: without them no one could ever take the task over.
    CONSTRAINT delivery_task_sending_has_lease
        CHECK (state <> 'SENDING' OR (lease_until IS NOT NULL AND attempt_token IS NOT NULL AND lease_owner IS NOT NULL)),
    -- Only an UNKNOWN task can be parked for review.
    CONSTRAINT delivery_task_review_only_unknown CHECK (NOT needs_review OR state = 'UNKNOWN'),
    -- Claimable by time exactly when waiting: parked and finished tasks carry no next_attempt_at, so the
    -- claim index below never holds them. The one waiting task without next_attempt_at is an unreleased
    -- task of a fallback chain: a later place in a chain, never attempted. "IS NOT NULL AND": a CHECK
    -- passes on NULL, and fallback_position > 1 is NULL for a task outside a chain.
    CONSTRAINT delivery_task_scheduled_iff_waiting
        CHECK ((next_attempt_at IS NOT NULL) = (state IN ('PENDING', 'UNKNOWN') AND NOT needs_review)
               OR (state = 'PENDING' AND next_attempt_at IS NULL AND fallback_position IS NOT NULL AND fallback_position > 1
                   AND attempt_count = 0)),
    CONSTRAINT delivery_task_uncertain_since_iff_uncertain CHECK ((uncertain_since IS NOT NULL) = outcome_uncertain),
    -- UNKNOWN means "may have been accepted": it always carries the uncertainty (Next and Decide write it
    -- so; TaskPark sets it). Without it a claim would resend blindly on a channel that cannot dedupe.
    CONSTRAINT delivery_task_unknown_is_uncertain CHECK (state <> 'UNKNOWN' OR outcome_uncertain),
    -- The refund never exceeds the attempts made. (A negative attempt_count is
    -- delivery_task_attempt_count_check's to refuse, hence greatest(): one bound, one name.)
    CONSTRAINT delivery_task_account_refusals_check
        CHECK (account_refusals >= 0 AND account_refusals <= greatest(attempt_count, 0))
);

-- The claim path. Both indexes are partial: finished and parked tasks are not in them, so a claim's cost
-- does not grow with history (docs/protocol.md#known-boundaries). They lead with the channel: a worker
-- claims one channel at a time (TaskClaim takes one @channel), so a claim walks only its own channel's
-- waiting (or leased) tasks, whatever other channels' backlog (TestClaimIgnoresOtherChannels). Scheduled
-- tasks (a send time) sit in delivery_task_ready_idx like any waiting task, ordered by their time: the
-- claim's range (next_attempt_at <= now()) stops before them (TestClaimPlanSkipsScheduledTasks).
-- Unreleased fallback tasks (no next_attempt_at) are not in it.
CREATE INDEX delivery_task_ready_idx ON delivery_task (channel, next_attempt_at, id) WHERE next_attempt_at IS NOT NULL;
-- Partial on lease_until, not on state = 'SENDING': the finish's token guard (TaskFinish: state =
-- 'SENDING' AND attempt_token = ...) would imply that predicate, and the planner, which sees a small
-- index, could answer a finish by walking all of it instead of looking the tasks up by primary key.
-- Only SENDING tasks have a lease (TaskFinish, TaskSettleWithoutCall and TaskPark clear it), and only
-- the claim's expired-lease branch compares lease_until.
CREATE INDEX delivery_task_leased_idx ON delivery_task (channel, lease_until, id) WHERE lease_until IS NOT NULL;
-- Operators list parked tasks (notifier review).
CREATE INDEX delivery_task_parked_idx ON delivery_task (id) WHERE needs_review;
-- Retention (queries/retention.sql, notifier prune) picks the oldest finished tasks in (updated_at, id)
-- order. Partial, like the claim indexes: it holds only tasks in a terminal state, so pruning never
-- reads a PENDING, SENDING or UNKNOWN task, and its cost follows the history to prune, not the live
-- work. A task enters it once, when it reaches SENT, FAILED or SUPPRESSED (final states).
CREATE INDEX delivery_task_finished_idx ON delivery_task (updated_at, id)
    WHERE state IN ('SENT', 'FAILED', 'SUPPRESSED');
-- Tasks with a receipt not settled yet: what the receivers' sweep looks for. Small by construction.
CREATE INDEX delivery_task_receipt_unsettled_idx ON delivery_task (id)
    WHERE receipt_at IS NOT NULL AND state IN ('PENDING', 'SENDING', 'UNKNOWN');
-- Tasks that a holder's finish made FAILED or SUPPRESSED after a receipt was noted on them: the provider
-- had the message; notifier review shows them (LATE_ACCEPTED). Rare, so small.
CREATE INDEX delivery_task_receipt_contradicted_idx ON delivery_task (id)
    WHERE receipt_at IS NOT NULL AND state IN ('FAILED', 'SUPPRESSED');
-- Matching a receipt by the provider's message id, when it does not carry our reference.
CREATE INDEX delivery_task_provider_msg_idx ON delivery_task (provider_msg_id) WHERE provider_msg_id IS NOT NULL;
-- One task per place in a chain: the release finds exactly one next task.
CREATE UNIQUE INDEX delivery_task_fallback_chain_key ON delivery_task (notification_id, fallback_position)
    WHERE fallback_position IS NOT NULL;

-- A task's two unique keys, (notification_id, channel) and ref, on a row that is never updated. On
-- delivery_task they cost 13% of the server's instructions per delivery
-- (docs/benchmarks/2026-12-05-row-costs.md): a claim and a finish each update the task, neither update
-- can be HOT (the claim and retention indexes cover columns both change), so each would add a new entry
-- to both unique indexes and check it against the heap for a duplicate, although neither key ever
-- changes. The claim and the finish never touch this table (docs/benchmarks/2026-12-06-task-keys.md).
--   * R2, one task per (notification, channel), and refs that never repeat: the statement that inserts
--     tasks writes their key rows (003: delivery_task_key_insert), whatever role inserts, so a duplicate
--     fails that statement (SQLSTATE 23505, naming the constraint below).
--   * delivery_task keeps notification_id, channel and ref: the claim reads them for every task it
--     calls, with no join, and the state machine (003: delivery_task_state_machine,
--     delivery_task_ref_fixed) keeps them from changing. A key row is a copy made from the same inserted
--     row and never changes either (003: delivery_task_key_fixed), so the two stay equal.
--   * Lookups by ref (a receipt) and by notification (create's answer, status, cancel, retention) go
--     through this table's unique indexes; delivery_task has no index on either.
-- One row per task, written with it, deleted only with it (retention: ON DELETE CASCADE). The columns
-- have delivery_task's types, ref in byte order as there.
CREATE TABLE delivery_task_key (
    task_id         bigint            PRIMARY KEY REFERENCES delivery_task (id) ON DELETE CASCADE,
    notification_id bigint            NOT NULL,
    channel         notifier_channel  NOT NULL,
    ref             notifier_task_ref COLLATE "C" NOT NULL,
    -- R2: one task per (notification, channel); how a notification's tasks are found.
    CONSTRAINT delivery_task_notification_channel_key UNIQUE (notification_id, channel),
    -- One task per reference, never reused: how a receipt finds its task (ReceiptTaskByRef).
    CONSTRAINT delivery_task_ref_key UNIQUE (ref)
);

COMMENT ON TABLE delivery_task_key IS
    'A task''s unique keys, off the row the claim and the finish update (schema/001)';

-- One row per attempt: every channel call, every claim-time decision not to call, every manual resolution,
-- every settlement by a receipt. outcome is what this attempt observed, written once; an observation that
-- arrives after the attempt was superseded goes to late_outcome and never overwrites outcome.
--   action   SEND, QUERY (ask the channel whether an earlier send arrived), TOPIC_RESEND (a resend on a
--            channel without idempotency key that replaces the first copy only if that one is still
--            undelivered: Web Push Topic, RFC 8030 section 5.4; opt-in per channel), SKIP (settled at
--            claim or by a cancel, no call), MANUAL (a human's resolution), RECEIPT (a provider's receipt
--            settled the task).
--   outcome  the outcomes by action are listed with delivery_attempt_fits (003). GATEWAY_ERROR: a 502 or
--            504, or any 5xx that a plain-http request got through a forward proxy: a gateway answered,
--            not the provider, and it may have passed the request on before it failed, so it is an
--            uncertain outcome, never the "refused before acceptance" of HTTP_5XX. ACCOUNT_REFUSED: the
--            provider certainly refused this request for a state of our account (a rejected or expired
--            credential, a paused sending account), not the task's fault. CANCELLED and
--            CANCELLED_UNCERTAIN: a cancel's SKIP. FALLBACK_NOT_NEEDED: a fallback chain's SKIP once an
--            earlier channel was SENT. The last three are not late observations: no channel reports them.
-- No foreign key to delivery_task: "an attempt belongs to a task that exists" is held by the state
-- machine's checks (003), which compare every new attempt with its task as it is inserted; the foreign
-- key's own lookup (FOR KEY SHARE of the task) cost 37,000 of the server's 633,000 instructions per
-- delivery (docs/benchmarks/2026-12-04-hot-path-checks.md). delivery_task_attempts_kept (003) refuses
-- to delete a task whose attempts stay.
-- The finish (outcome, finished_at, provider_msg_id, error) changes no indexed column, so it is a HOT
-- update when the row's page has room for the new version: fillfactor 50 leaves that room for the rows
-- a claim inserts together (docs/benchmarks/2026-12-06-attempt-finish-hot.md). The provider's message id
-- is found through its task (delivery_task_provider_msg below), not an index here.
CREATE TABLE delivery_attempt (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id         bigint      NOT NULL,
    attempt_no      integer     NOT NULL CHECK (attempt_no >= 1),
    attempt_token   uuid        NOT NULL,
    action          text        NOT NULL
                    CHECK (action IN ('SEND', 'QUERY', 'SKIP', 'MANUAL', 'TOPIC_RESEND', 'RECEIPT')),
    worker          text        NOT NULL CHECK (worker <> '' AND length(worker) <= 200),
    started_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    outcome         text        CHECK (outcome IN (
                        'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
                        'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
                        'GATEWAY_ERROR',
                        'REJECTED', 'ACCOUNT_REFUSED', 'LEASE_EXPIRED',
                        'PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN',
                        'CANCELLED', 'CANCELLED_UNCERTAIN', 'FALLBACK_NOT_NEEDED',
                        'MANUAL_SENT', 'MANUAL_FAILED',
                        'RECEIPT_ACCEPTED')),
    provider_msg_id text COLLATE "C" CHECK (length(provider_msg_id) <= 500),
    error           text        CHECK (length(error) <= 2000),
    late_outcome    text        CHECK (late_outcome IN (
                        'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
                        'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
                        'GATEWAY_ERROR',
                        'REJECTED', 'ACCOUNT_REFUSED')),
    late_at         timestamptz,
    note            text        CHECK (length(note) <= 2000),
    CONSTRAINT delivery_attempt_attempt_token_key UNIQUE (attempt_token),
    CONSTRAINT delivery_attempt_task_attempt_no_key UNIQUE (task_id, attempt_no),
    CONSTRAINT delivery_attempt_finished_iff_outcome CHECK ((outcome IS NULL) = (finished_at IS NULL)),
    CONSTRAINT delivery_attempt_late_has_time CHECK ((late_outcome IS NULL) = (late_at IS NULL)),
    CONSTRAINT delivery_attempt_manual_has_note CHECK (action <> 'MANUAL' OR (note IS NOT NULL AND note <> ''))
) WITH (fillfactor = 50);

-- Operators must see a task whose final "not sent" state a late answer contradicts: a superseded holder
-- whose call was accepted after all (late_outcome ACCEPTED, ACCEPTED_REPLAY or QUERY_FOUND) on a task
-- that meanwhile became FAILED or SUPPRESSED (for instance after a lagging query answered QUERY_NOT_FOUND).
-- The state stays final; notifier review and status surface it (TaskListLateAccepted,
-- TaskCountLateAccepted). Partial: it holds only such late acceptances, which are rare, so both reads
-- cost what there is to show, not the history.
CREATE INDEX delivery_attempt_late_accepted_idx ON delivery_attempt (task_id)
    WHERE late_outcome IN ('ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND');

-- The provider message ids of a task that its row does not carry, so that a receipt naming one finds its
-- task (ReceiptTasksByProviderMsgID) without an index on delivery_attempt.provider_msg_id. Such an index
-- made the attempt's finish, which writes the id, an update that adds an entry to every index of the
-- table; without one the finish is HOT (docs/benchmarks/2026-12-06-attempt-finish-hot.md).
--   * An id that an attempt holds and its task does not, at the end of the statement that wrote it: a
--     superseded holder's late acceptance, a receipt's id on a task that had another (003:
--     delivery_attempt_provider_msg_insert, _update). An accepted finish writes the same id on the task
--     and its attempt in one statement, so it adds no row here.
--   * A task's provider_msg_id that a later finish or a resolution replaced (003:
--     delivery_task_provider_msg_replaced).
-- So every id that any attempt of a task ever held is the task's provider_msg_id or a row here. Written
-- only by those triggers (SECURITY DEFINER: no role may write it, 002), never changed, deleted only with
-- the task (ON DELETE CASCADE; 003: delivery_task_provider_msg_fixed).
CREATE TABLE delivery_task_provider_msg (
    provider_msg_id text   COLLATE "C" NOT NULL CHECK (length(provider_msg_id) <= 500),
    task_id         bigint NOT NULL REFERENCES delivery_task (id) ON DELETE CASCADE,
    -- How a receipt finds the task by an id (the id leads), once per task and id.
    CONSTRAINT delivery_task_provider_msg_pkey PRIMARY KEY (provider_msg_id, task_id)
);
-- The cascade of retention's DELETE of a task finds its rows here.
CREATE INDEX delivery_task_provider_msg_task_idx ON delivery_task_provider_msg (task_id);

COMMENT ON TABLE delivery_task_provider_msg IS
    'The provider message ids of a task that delivery_task.provider_msg_id does not carry (schema/001)';

-- Receipts: what a provider says about a message after it accepted it (accepted, delivered, bounced,
-- complained, undelivered), through a signed callback (notifier receipts). Any receipt is evidence that
-- the provider had the message, so it can end an uncertainty honestly (notifier_apply_receipt, 004).
-- Append-only (delivery_receipt_append_only, 004), deduplicated by the provider's event id.
-- One row per provider event about one of our tasks.
--   source      which signed callback format it came in (the receiver verified its signature before the
--               row is written): Standard Webhooks, Twilio, Postmark's delivery, bounce and
--               spam-complaint webhooks, Amazon SES events through an SNS topic (the SNS message's
--               signature verified). A receipt of any other provenance cannot be recorded by any role.
--   event_id    the provider's id of this event (Standard Webhooks: webhook-id; Twilio: message sid and
--               status): a redelivered or replayed callback is the same event, recorded once
--   kind        what the provider says: ACCEPTED (it has the message, queued or sent), DELIVERED,
--               BOUNCED (hard_bounce: permanently), COMPLAINED, UNDELIVERED (it gave up after accepting)
--   effect      what recording it did to the task: SETTLED (made SENT), NOTED (the task was SENDING: its
--               holder finishes, then the receipt settles it), UNCHANGED (already SENT), CONTRADICTS
--               (FAILED or SUPPRESSED: the provider had it after all)
CREATE TABLE delivery_receipt (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id         bigint      NOT NULL REFERENCES delivery_task (id),
    source          text        NOT NULL CHECK (source IN ('standard-webhooks', 'twilio', 'postmark', 'ses')),
    event_id        text        NOT NULL CHECK (event_id <> '' AND length(event_id) <= 500),
    kind            text        NOT NULL CHECK (kind IN ('ACCEPTED', 'DELIVERED', 'BOUNCED', 'COMPLAINED', 'UNDELIVERED')),
    hard_bounce     boolean     NOT NULL DEFAULT false,
    effect          text        NOT NULL CHECK (effect IN ('SETTLED', 'NOTED', 'UNCHANGED', 'CONTRADICTS')),
    provider_msg_id text        CHECK (length(provider_msg_id) <= 500),
    occurred_at     timestamptz,
    received_at     timestamptz NOT NULL DEFAULT now(),
    detail          text        CHECK (length(detail) <= 2000),
    CONSTRAINT delivery_receipt_event_key UNIQUE (source, event_id),
    CONSTRAINT delivery_receipt_hard_bounce_is_bounce CHECK (NOT hard_bounce OR kind = 'BOUNCED')
);

-- A task's receipts (status, review, retention).
CREATE INDEX delivery_receipt_task_idx ON delivery_receipt (task_id);
-- Final "not sent" tasks a receipt contradicts, for notifier review and status: rare, so small.
CREATE INDEX delivery_receipt_contradicts_idx ON delivery_receipt (task_id) WHERE effect = 'CONTRADICTS';

-- Per-channel rate limits shared by every worker on every machine: one token bucket row per channel. A
-- worker takes tokens in its claim's transaction, one per channel call, so a task whose channel has no
-- token left is simply not claimed yet; a 429 from the channel pauses the bucket for every worker. A
-- channel without a row has no limit, and no worker reads or writes a row for it.
--
-- The bucket is lazy: (tokens, refilled_at) is its content at refilled_at, and it fills at `rate`
-- tokens per second up to `burst`, on the database clock (rate_limit_tokens, 004), so nothing needs
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
    channel      notifier_channel NOT NULL,
    rate         float8      NOT NULL, -- tokens per second
    burst        float8      NOT NULL, -- most tokens held: calls that may go out at once
    tokens       float8      NOT NULL, -- held at refilled_at
    refilled_at  timestamptz NOT NULL DEFAULT now(),
    paused_until timestamptz,          -- no token before this (a 429); NULL: not paused
    updated_at   timestamptz NOT NULL DEFAULT now(), -- last configured or paused
    CONSTRAINT channel_rate_limit_pkey PRIMARY KEY (channel),
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

-- Channels paused for an account state (docs/channels.md#account-states): an ACCOUNT_REFUSED answer
-- pauses the channel for every worker. Claims lock none of its tasks, except one probe task at a time
-- once the pause's backoff has passed (TaskClaim). A probe refused again doubles the backoff up to the
-- worker's cap; any other answer to a probe ends the pause. One row per paused channel, shared by every
-- worker (queries/channel_pause.sql). No row: not paused, and a claim pays one index probe of this
-- almost always empty table per channel to know it.
CREATE TABLE channel_pause (
    channel            text        NOT NULL,
    cause              text        NOT NULL, -- the refusal's Detail: what an operator must fix
    paused_at          timestamptz NOT NULL DEFAULT now(),
    backoff_seconds    float8      NOT NULL, -- the current wait between probes
    probe_after        timestamptz NOT NULL, -- no probe before this
    probe_hold_seconds float8      NOT NULL, -- a claimed probe holds the slot this long (the lease)
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT channel_pause_pkey PRIMARY KEY (channel),
    CONSTRAINT channel_pause_channel_check CHECK (channel ~ '^[a-z][a-z0-9_-]{0,31}$'),
    CONSTRAINT channel_pause_cause_check CHECK (length(cause) <= 2000),
    CONSTRAINT channel_pause_backoff_check CHECK (backoff_seconds > 0 AND backoff_seconds <= 3600),
    CONSTRAINT channel_pause_hold_check CHECK (probe_hold_seconds > 0 AND probe_hold_seconds <= 86400)
);

-- migrate:down
DROP TABLE channel_pause;
DROP TABLE channel_rate_limit;
DROP TABLE delivery_receipt;
DROP TABLE delivery_task_provider_msg;
DROP TABLE delivery_attempt;
DROP TABLE delivery_task_key;
DROP TABLE delivery_task;
DROP TABLE notification;
DROP TABLE channel_pref;
DROP DOMAIN notifier_task_ref;
DROP DOMAIN notifier_channel;
