-- migrate:up
-- The delivery state machine in the database, for every writer: the four roles of 002, the owner, a
-- script, a hand-written fix. queries/ already make only these moves (and guard each on the row's state);
-- the triggers below refuse every other one, so a SENT task is never sent again, an uncertain history is
-- never written off without evidence, and every counted attempt leaves its row (R2, R3, R6).
--
-- The moves, all of them (queries/delivery_task.sql; service/delivery Decide and Next; notifier_resolve
-- below; notifier_apply_receipt, 004; notifier_cancel and delivery_task_fallback, 005). "waiting" is
-- PENDING, or UNKNOWN not parked, but not an unreleased fallback task; "due" is next_attempt_at <= now()
-- (a task created with a send time is waiting, not due, until then); "expired" is SENDING with
-- lease_until < now(); "parked" is UNKNOWN with needs_review; "unreleased" is PENDING without
-- next_attempt_at (a later place in a fallback chain, never attempted); "cancelled" is a task whose
-- notification has cancelled_at set; now() is the transaction's database clock.
--
--   from                 to                       move (query)                        attempt_count  attempt row at commit
--   -------------------  -----------------------  ----------------------------------  -------------  --------------------------------------
--   waiting, due         SENDING                  claim (TaskStartAttempts)           +1             SEND/QUERY/TOPIC_RESEND, the new token
--   expired              SENDING                  takeover (TaskStartAttempts)        +1             same; the task stays uncertain
--   waiting, due         SUPPRESSED               settle, pref disabled               +1             SKIP PREF_DISABLED
--                                                 (TaskSettleWithoutCall)
--   waiting, due         FAILED                   settle, expired (same)              +1             SKIP TTL_EXPIRED
--   waiting due/expired  UNKNOWN parked           settle with uncertain history       +1             SKIP PREF_DISABLED_UNCERTAIN or
--                                                 (same)                                            TTL_EXPIRED_UNCERTAIN
--   waiting due/expired  UNKNOWN parked           park at claim (TaskPark)            =              -
--   waiting (due or      SUPPRESSED               cancel, certain (notifier_cancel;   +1             SKIP CANCELLED
--   not), cancelled                               or the claim's settle, as above)
--   waiting (due or      UNKNOWN parked           cancel, uncertain history (same)    +1             SKIP CANCELLED_UNCERTAIN
--   not), cancelled
--   unreleased           PENDING, due now         release (delivery_task_fallback)    =              -
--   unreleased           SUPPRESSED               fallback not needed (same)          +1             SKIP FALLBACK_NOT_NEEDED
--   SENDING              SENT                     finish (TaskFinish)                 =              - (after an uncertain history: this
--                                                                                                   attempt's ACCEPTED, ACCEPTED_REPLAY
--                                                                                                   or QUERY_FOUND)
--   SENDING              PENDING, FAILED          finish, not accepted                =              this attempt: REJECTED, HTTP_5XX,
--                                                                                                   THROTTLED, CONNECT_FAILED or
--                                                                                                   QUERY_NOT_FOUND (only QUERY_NOT_FOUND
--                                                                                                   after an uncertain history); for
--                                                                                                   PENDING also ACCOUNT_REFUSED
--   SENDING              UNKNOWN (retry, parked)  finish, outcome unknown             =              -
--   parked               SENT, FAILED             resolve (notifier_resolve below)    +1             MANUAL MANUAL_SENT / MANUAL_FAILED
--   not final            itself, receipt_at set   note a receipt (notifier_apply_     =              -
--                                                 receipt, 004): nothing else
--   waiting, parked,     SENT                     settle by receipt (same): only      +1             RECEIPT RECEIPT_ACCEPTED
--   expired              (not parked)             with receipt_at set
--   waiting, due         itself, later            set aside: next_attempt_at later,   =              -
--                        next_attempt_at          last_error set, updated_at may
--                                                 change, nothing else
--   expired              itself, later lease      set aside: lease_until later,       =              -
--                                                 last_error set, nothing else (not
--                                                 updated_at: when the lost attempt
--                                                 began, uncertain_since's source)
--   SENT/FAILED/SUPPRESSED  -                     final: nothing changes, ever
--
-- A task that is not due yet is settled only by a cancel, or, unreleased, as not needed. An unreleased
-- task is released only when delivery_task_fallback_turn() says RELEASE (the task before ended FAILED
-- or SUPPRESSED), settled only by a cancel or when it says NOT_NEEDED (an earlier task is SENT); it is
-- never claimed, set aside, parked or settled by a receipt (it was never called).
--
-- Across every move: notification_id, channel, max_attempts, created_at, fallback_position, ref and id
-- never change; attempt_count never decreases and grows by one exactly when an attempt (or a
-- resolution) begins; account_refusals grows by one only by a finish whose attempt says ACCOUNT_REFUSED
-- (the refund: a claim's budget is attempt_count - account_refusals); attempt_token changes only at a
-- claim; outcome_uncertain becomes false only by a finish that was accepted (SENT) or found nothing
-- (QUERY_NOT_FOUND), or by the resolve or a receipt; when it becomes true, uncertain_since is no later
-- than the row's updated_at (a holder's: when its attempt began), and while it stays true,
-- uncertain_since stays; a task taken over from an expired lease is uncertain; FAILED and SUPPRESSED are
-- certain unless a human resolved them; needs_review becomes false only by the resolve or a provider's
-- receipt; a task nobody holds has no lease; provider_msg_id is written only by a finish, the resolve or
-- a receipt, and never erased. A no-op update (the row unchanged) passes. receipt_at is read through
-- to_jsonb in the functions below, as it was when they were first written.
--
-- Where: delivery_task_state_machine (AFTER UPDATE, each row, at the end of the statement) checks the
-- move itself, and its WHEN passes a claim or a finish without a call; delivery_task_holders_have_attempts
-- (AFTER UPDATE, each statement) checks a claim's attempt row; delivery_task_evidence (a constraint
-- trigger, DEFERRABLE INITIALLY DEFERRED: at commit) checks the attempt row every other counted move
-- needs, which the protocol writes in the same statement (a data-modifying CTE) or the same
-- transaction; delivery_task_account_refusals (at commit) checks a refund. delivery_attempt_fits (AFTER
-- INSERT and UPDATE) checks an attempt row against its action and, when inserted, against its task;
-- delivery_attempt_calls_follow_tasks (AFTER INSERT, each statement) checks the open calls a statement
-- inserts. AFTER, not BEFORE: the tables' own CHECK constraints report first, under their own names.
-- Violations raise SQLSTATE 23000 (integrity_constraint_violation) with TABLE, COLUMN and one of these
-- CONSTRAINT names:
--   delivery_task_fixed, delivery_task_final, delivery_task_transition, delivery_task_attempt_count,
--   delivery_task_uncertainty, delivery_task_evidence, delivery_task_account_refusals,
--   delivery_attempt_outcome_fits_action, delivery_attempt_follows_task, delivery_attempt_append_only,
--   delivery_attempt_retention_only
-- What they cannot stop: a role that may ALTER the tables (the owner) can disable or drop the triggers;
-- the owner may still INSERT a task in any state (fixtures, restores; CHECKs still apply); and a worker
-- that holds a task's token is trusted to report what the channel said (the database cannot ask it).
--
-- Cost: the moves every delivery makes (a claim, a finish: an attempt opened, its outcome recorded) are
-- recognised by the triggers' WHEN clauses and statement-level checks without a PL/pgSQL call per row. A
-- PL/pgSQL call with its pinned settings costs about 35,000 instructions, where the executor evaluates
-- a WHEN for a row in a few hundred (docs/benchmarks/2026-12-04-hot-path-checks.md). Every move not
-- recognised there still goes through the functions, which hold every rule and give the errors.

-- delivery_attempt is append-only (R3), in the database, not only in queries/: every channel call leaves
-- one row, and what it observed is kept verbatim: a recorded outcome is never overwritten, a late
-- observation goes to late_outcome once, and an open, uncertain or parked history is never deleted.
-- queries/ already guard their own updates with `outcome IS NULL` / `late_outcome IS NULL`; these
-- triggers make the same rules hold for every other writer too (a hand-written fix, a script, a future
-- query).
--
-- The only updates the protocol makes, and so the only ones allowed:
--   AttemptFinish, AttemptMarkLeaseExpired  open attempt: outcome + finished_at (+ provider_msg_id, error)
--   AttemptRecordLate                        late_outcome + late_at (+ provider_msg_id, error if NULL)
-- Violations raise SQLSTATE 23000 (integrity_constraint_violation) with constraint name
-- delivery_attempt_append_only or delivery_attempt_retention_only, the table and the offending column.

-- Guards UPDATE of delivery_attempt (R3). Rejects a change to the columns fixed when the attempt was
-- opened (id, task_id, attempt_no, attempt_token, action, worker, started_at); to outcome/finished_at once
-- the outcome is recorded; to late_outcome/late_at once recorded; to note once set; and to provider_msg_id
-- or error except from NULL, in the update that records the outcome or the late outcome they explain.
CREATE FUNCTION delivery_attempt_append_only() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    col text;
    why text;
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id THEN
        col := 'id';
    ELSIF NEW.task_id IS DISTINCT FROM OLD.task_id THEN
        col := 'task_id';
    ELSIF NEW.attempt_no IS DISTINCT FROM OLD.attempt_no THEN
        col := 'attempt_no';
    ELSIF NEW.attempt_token IS DISTINCT FROM OLD.attempt_token THEN
        col := 'attempt_token';
    ELSIF NEW.action IS DISTINCT FROM OLD.action THEN
        col := 'action';
    ELSIF NEW.worker IS DISTINCT FROM OLD.worker THEN
        col := 'worker';
    ELSIF NEW.started_at IS DISTINCT FROM OLD.started_at THEN
        col := 'started_at';
    END IF;
    IF col IS NOT NULL THEN
        why := 'is fixed when the attempt is opened';
    ELSIF (OLD.outcome IS NOT NULL OR OLD.finished_at IS NOT NULL)
        AND (NEW.outcome IS DISTINCT FROM OLD.outcome OR NEW.finished_at IS DISTINCT FROM OLD.finished_at) THEN
        col := CASE WHEN NEW.outcome IS DISTINCT FROM OLD.outcome THEN 'outcome' ELSE 'finished_at' END;
        why := 'is written once; a later observation goes to late_outcome';
    ELSIF (OLD.late_outcome IS NOT NULL OR OLD.late_at IS NOT NULL)
        AND (NEW.late_outcome IS DISTINCT FROM OLD.late_outcome OR NEW.late_at IS DISTINCT FROM OLD.late_at) THEN
        col := CASE WHEN NEW.late_outcome IS DISTINCT FROM OLD.late_outcome THEN 'late_outcome' ELSE 'late_at' END;
        why := 'is written once';
    ELSIF OLD.note IS NOT NULL AND NEW.note IS DISTINCT FROM OLD.note THEN
        col := 'note';
        why := 'is written once';
    ELSIF (NEW.provider_msg_id IS DISTINCT FROM OLD.provider_msg_id OR NEW.error IS DISTINCT FROM OLD.error)
        AND NOT (
            -- only from NULL ...
            (OLD.provider_msg_id IS NULL OR NEW.provider_msg_id IS NOT DISTINCT FROM OLD.provider_msg_id)
            AND (OLD.error IS NULL OR NEW.error IS NOT DISTINCT FROM OLD.error)
            -- ... and only by the update that records the outcome or the late outcome
            AND ((OLD.outcome IS NULL AND NEW.outcome IS NOT NULL)
                 OR (OLD.late_outcome IS NULL AND NEW.late_outcome IS NOT NULL))) THEN
        col := CASE WHEN NEW.provider_msg_id IS DISTINCT FROM OLD.provider_msg_id THEN 'provider_msg_id' ELSE 'error' END;
        why := 'is written once, with the outcome or late_outcome it explains';
    END IF;
    IF col IS NOT NULL THEN
        RAISE EXCEPTION 'delivery_attempt is append-only: % of attempt % (task %, attempt %) %',
                col, OLD.id, OLD.task_id, OLD.attempt_no, why
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  COLUMN = col,
                  CONSTRAINT = 'delivery_attempt_append_only',
                  HINT = 'an attempt keeps what it observed verbatim (R3); record a new attempt instead';
    END IF;
    RETURN NULL; -- AFTER trigger: the return value is ignored
END
$$;

COMMENT ON FUNCTION delivery_attempt_append_only() IS
    'R3: delivery_attempt is append-only; only the protocol''s own write-once updates pass';

-- Guards UPDATE of delivery_attempt with delivery_attempt_append_only(). An AFTER trigger on purpose: the
-- table's own NOT NULL and CHECK constraints are evaluated first and report their own SQLSTATE and name,
-- and the rule is checked on the final row, whatever any other trigger did to it. Raising here still
-- aborts the statement, so a rejected update changes nothing. The WHEN passes exactly the rows for which
-- the function finds nothing to refuse by the finish's rule, the one update every finish makes: the
-- columns fixed at opening unchanged, an outcome written where there was none, the late outcome and the
-- note untouched, a message id and an error only where there were none.
CREATE TRIGGER delivery_attempt_append_only
    AFTER UPDATE ON delivery_attempt
    FOR EACH ROW
    WHEN (NOT coalesce(
              NEW.id = OLD.id AND NEW.task_id = OLD.task_id AND NEW.attempt_no = OLD.attempt_no
              AND NEW.attempt_token = OLD.attempt_token AND NEW.action = OLD.action AND NEW.worker = OLD.worker
              AND NEW.started_at = OLD.started_at
              AND OLD.outcome IS NULL AND OLD.finished_at IS NULL AND NEW.outcome IS NOT NULL
              AND NEW.late_outcome IS NOT DISTINCT FROM OLD.late_outcome AND NEW.late_at IS NOT DISTINCT FROM OLD.late_at
              AND NEW.note IS NOT DISTINCT FROM OLD.note
              AND (OLD.provider_msg_id IS NULL OR NEW.provider_msg_id IS NOT DISTINCT FROM OLD.provider_msg_id)
              AND (OLD.error IS NULL OR NEW.error IS NOT DISTINCT FROM OLD.error),
              false))
EXECUTE FUNCTION delivery_attempt_append_only();

COMMENT ON TRIGGER delivery_attempt_append_only ON delivery_attempt IS
    'R3: rejects any UPDATE that rewrites what an attempt recorded (a finish''s first outcome passes by the WHEN)';

-- Guards DELETE of delivery_attempt: retention may prune finished history, never an open attempt (its
-- holder may still record what the channel said) nor any attempt of a task that is not in a terminal
-- state (SENT, FAILED, SUPPRESSED): an UNKNOWN task's history is the only evidence a human has to resolve
-- it. Terminal states are final in the protocol (no query in queries/ moves a task out of one), so the
-- check cannot be invalidated by a concurrent update. Runs as the deleting user: a caller who may not
-- read the task (privileges, row-level security) cannot delete its attempts. search_path is pinned to
-- the one the migration ran with, so the task lookup cannot be redirected.
CREATE FUNCTION delivery_attempt_retention_only() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
AS $$
DECLARE
    task_state text;
BEGIN
    IF OLD.outcome IS NULL THEN
        RAISE EXCEPTION 'delivery_attempt % (task %, attempt %) is open and cannot be deleted',
                OLD.id, OLD.task_id, OLD.attempt_no
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  CONSTRAINT = 'delivery_attempt_retention_only',
                  HINT = 'its holder may still record what the channel said; only finished history is pruned';
    END IF;
    SELECT t.state INTO task_state FROM delivery_task t WHERE t.id = OLD.task_id;
    IF task_state IS NULL OR task_state NOT IN ('SENT', 'FAILED', 'SUPPRESSED') THEN
        RAISE EXCEPTION 'delivery_attempt % cannot be deleted: its task % is %, not in a terminal state',
                OLD.id, OLD.task_id, coalesce(task_state, 'not visible')
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  CONSTRAINT = 'delivery_attempt_retention_only',
                  HINT = 'only the history of a SENT, FAILED or SUPPRESSED task may be pruned (R3, R6)';
    END IF;
    RETURN OLD;
END
$$;

COMMENT ON FUNCTION delivery_attempt_retention_only() IS
    'R3: attempts are deleted only as finished history of a SENT, FAILED or SUPPRESSED task';

-- Guards DELETE of delivery_attempt with delivery_attempt_retention_only(), before the row goes.
CREATE TRIGGER delivery_attempt_retention_only
    BEFORE DELETE ON delivery_attempt
    FOR EACH ROW
EXECUTE FUNCTION delivery_attempt_retention_only();

COMMENT ON TRIGGER delivery_attempt_retention_only ON delivery_attempt IS
    'R3: rejects DELETE of an open attempt or of an attempt of a task not in a terminal state';

-- Guards TRUNCATE of delivery_attempt (directly or by TRUNCATE delivery_task CASCADE): it fires no row
-- trigger, so it would bypass the DELETE rule above and wipe open and uncertain history with it.
CREATE FUNCTION delivery_attempt_no_truncate() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'delivery_attempt is append-only and cannot be truncated'
        USING ERRCODE = 'integrity_constraint_violation',
              TABLE = 'delivery_attempt',
              CONSTRAINT = 'delivery_attempt_retention_only',
              HINT = 'prune finished history with DELETE; the rows of open, uncertain and parked tasks stay';
END
$$;

COMMENT ON FUNCTION delivery_attempt_no_truncate() IS
    'R3: TRUNCATE would bypass the row-level DELETE rule of delivery_attempt';

-- Guards TRUNCATE of delivery_attempt with delivery_attempt_no_truncate().
CREATE TRIGGER delivery_attempt_no_truncate
    BEFORE TRUNCATE ON delivery_attempt
    FOR EACH STATEMENT
EXECUTE FUNCTION delivery_attempt_no_truncate();

COMMENT ON TRIGGER delivery_attempt_no_truncate ON delivery_attempt IS
    'R3: rejects TRUNCATE, which fires no row trigger';

-- Guards UPDATE of delivery_task: exactly the moves of the table above (R2, R6). Its first test passes
-- the two moves every delivery makes, and is the trigger's WHEN too (the function keeps it for an update
-- that reaches it another way); every condition there is also checked below it.
CREATE FUNCTION delivery_task_state_machine() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    waiting  boolean; -- PENDING, or UNKNOWN not parked
    due      boolean; -- waiting, and next_attempt_at has come
    expired  boolean; -- SENDING, and the lease ran out
    parked   boolean; -- UNKNOWN, needs_review
    unreleased boolean; -- PENDING in a fallback chain, not released yet (schema/005)
    counted  boolean; -- attempt_count up by one
    set_aside_columns text[]; -- what a set-aside may change: the time it moves, why, (waiting) when
    move     text;    -- the protocol's move this update makes, NULL when it makes none
    col      text;
    why      text;
    rule     text;
    msg      text;
    hint     constant text := 'see the moves in schema/003_state_machine.sql; a parked task is settled with notifier_resolve()';
    old_desc text;
    new_desc text;
BEGIN
    -- The two moves every delivery makes, recognised first, in one expression (PL/pgSQL keeps its plan
    -- for the session): a claim of a due waiting task or a takeover of an expired hold (counted, a new
    -- token, a lease in the future, uncertain if taken over), and a finish (the holder's token stays, its
    -- lease goes, nothing counted, FAILED only when certain, a message id written or kept, never
    -- erased); for both, what the task is for stays and no uncertainty is written off, moved, or
    -- started after its attempt. Every condition here is also checked below; any other update, every
    -- refused one included, takes the long way. coalesce: an unknown comparison never lets one pass.
    IF coalesce(
        NEW.id = OLD.id AND NEW.notification_id = OLD.notification_id AND NEW.channel = OLD.channel
        AND NEW.max_attempts = OLD.max_attempts AND NEW.created_at = OLD.created_at
        AND NEW.fallback_position IS NOT DISTINCT FROM OLD.fallback_position
        AND (NEW.outcome_uncertain OR NOT OLD.outcome_uncertain)
        AND (NOT OLD.outcome_uncertain OR NEW.uncertain_since = OLD.uncertain_since)
        AND (OLD.outcome_uncertain OR NOT NEW.outcome_uncertain OR NEW.uncertain_since <= OLD.updated_at)
        AND ((NEW.state = 'SENDING' AND NEW.attempt_count = OLD.attempt_count + 1
              AND NEW.attempt_token IS DISTINCT FROM OLD.attempt_token AND NEW.lease_until > now()
              AND NEW.provider_msg_id IS NOT DISTINCT FROM OLD.provider_msg_id
              AND ((OLD.state IN ('PENDING', 'UNKNOWN') AND NOT OLD.needs_review AND OLD.next_attempt_at <= now())
                   OR (OLD.state = 'SENDING' AND OLD.lease_until < now() AND NEW.outcome_uncertain)))
             OR (OLD.state = 'SENDING' AND NEW.state IN ('SENT', 'PENDING', 'UNKNOWN', 'FAILED')
                 AND NEW.attempt_count = OLD.attempt_count AND NEW.attempt_token IS NOT DISTINCT FROM OLD.attempt_token
                 AND NEW.lease_until IS NULL AND NEW.lease_owner IS NULL
                 AND NOT (NEW.state = 'FAILED' AND NEW.outcome_uncertain)
                 AND (NEW.provider_msg_id IS NOT NULL OR OLD.provider_msg_id IS NULL))),
        false) THEN
        RETURN NULL; -- AFTER trigger: the return value is ignored
    END IF;

    waiting := OLD.state IN ('PENDING', 'UNKNOWN') AND NOT OLD.needs_review;
    due := waiting AND coalesce(OLD.next_attempt_at <= now(), false);
    unreleased := OLD.state = 'PENDING' AND OLD.next_attempt_at IS NULL;
    expired := OLD.state = 'SENDING' AND OLD.lease_until < now();
    parked := OLD.state = 'UNKNOWN' AND OLD.needs_review;
    counted := NEW.attempt_count = OLD.attempt_count + 1;
    set_aside_columns := CASE WHEN OLD.state = 'SENDING' THEN ARRAY['lease_until', 'last_error']
                              ELSE ARRAY['next_attempt_at', 'last_error', 'updated_at'] END;
    old_desc := OLD.state || CASE WHEN OLD.needs_review THEN ' (parked)' ELSE '' END;
    new_desc := NEW.state || CASE WHEN NEW.needs_review THEN ' (parked)' ELSE '' END;

    -- What a task is for never changes.
    col := CASE
        WHEN NEW.id IS DISTINCT FROM OLD.id THEN 'id'
        WHEN NEW.notification_id IS DISTINCT FROM OLD.notification_id THEN 'notification_id'
        WHEN NEW.channel IS DISTINCT FROM OLD.channel THEN 'channel'
        WHEN NEW.max_attempts IS DISTINCT FROM OLD.max_attempts THEN 'max_attempts'
        WHEN NEW.created_at IS DISTINCT FROM OLD.created_at THEN 'created_at'
        WHEN NEW.fallback_position IS DISTINCT FROM OLD.fallback_position THEN 'fallback_position'
    END;
    IF col IS NOT NULL THEN
        rule := 'delivery_task_fixed';
        why := col || ' is fixed when the task is created';
    ELSIF OLD.state IN ('SENT', 'FAILED', 'SUPPRESSED') THEN
        rule := 'delivery_task_final';
        SELECT n.key INTO col
        FROM jsonb_each(to_jsonb(NEW)) n JOIN jsonb_each(to_jsonb(OLD)) o USING (key)
        WHERE n.value IS DISTINCT FROM o.value ORDER BY n.key = 'state' DESC, n.key LIMIT 1;
        why := format('%s changes, but %s is final', col, OLD.state);
    ELSIF NEW.attempt_count < OLD.attempt_count THEN
        rule := 'delivery_task_attempt_count';
        col := 'attempt_count';
        why := format('attempt_count goes down from %s to %s; attempts are never uncounted', OLD.attempt_count, NEW.attempt_count);
    ELSIF NEW.attempt_count > OLD.attempt_count + 1 THEN
        rule := 'delivery_task_attempt_count';
        col := 'attempt_count';
        why := format('attempt_count jumps from %s to %s; it grows by one per attempt', OLD.attempt_count, NEW.attempt_count);
    END IF;

    IF rule IS NULL THEN
        -- Which move is it? Decided by the states and the token; the conditions each move must meet follow.
        move := CASE
            WHEN unreleased AND NEW.state = 'PENDING' AND NEW.next_attempt_at IS NOT NULL THEN 'release'
            WHEN unreleased AND NEW.state = 'SUPPRESSED' AND counted THEN 'settle'
            WHEN unreleased THEN NULL
            WHEN (to_jsonb(OLD) ->> 'receipt_at') IS NULL AND (to_jsonb(NEW) ->> 'receipt_at') IS NOT NULL
                 THEN 'note receipt'
            WHEN NEW.state = 'SENT' AND counted AND NOT NEW.needs_review AND (waiting OR parked OR expired)
                 AND (to_jsonb(NEW) ->> 'receipt_at') IS NOT NULL THEN 'receipt'
            WHEN NEW.state = 'SENDING' AND (waiting OR OLD.state = 'SENDING')
                 AND NEW.attempt_token IS DISTINCT FROM OLD.attempt_token THEN 'claim'
            WHEN waiting AND NEW.state = OLD.state AND NOT NEW.needs_review
                 AND NEW.next_attempt_at IS DISTINCT FROM OLD.next_attempt_at THEN 'set aside'
            WHEN OLD.state = 'SENDING' AND NEW.state = 'SENDING'
                 AND NEW.lease_until IS DISTINCT FROM OLD.lease_until THEN 'set aside'
            WHEN waiting AND counted
                 AND (NEW.state IN ('SUPPRESSED', 'FAILED') OR (NEW.state = 'UNKNOWN' AND NEW.needs_review)) THEN 'settle'
            WHEN OLD.state = 'SENDING' AND counted AND NEW.state = 'UNKNOWN' AND NEW.needs_review THEN 'settle'
            WHEN waiting AND NEW.state = 'UNKNOWN' AND NEW.needs_review THEN 'park'
            WHEN OLD.state = 'SENDING' AND NEW.state IN ('SENT', 'PENDING', 'UNKNOWN', 'FAILED') THEN 'finish'
            WHEN parked AND NEW.state IN ('SENT', 'FAILED') AND NOT NEW.needs_review THEN 'resolve'
        END;
        rule := 'delivery_task_transition';
        col := 'state';
        IF move IS NULL THEN
            why := CASE
                WHEN unreleased THEN 'a fallback task not released yet changes only by its release, its settle as '
                                     'not needed, or a cancel (schema/005)'
                WHEN parked THEN 'a parked task changes only by its resolution (notifier_resolve)'
                WHEN NEW.attempt_token IS DISTINCT FROM OLD.attempt_token THEN 'the attempt token changes only at a claim'
                ELSE 'not a move of the delivery protocol'
            END;
            IF NEW.attempt_token IS DISTINCT FROM OLD.attempt_token AND NOT parked THEN
                col := 'attempt_token';
            END IF;
        ELSIF move = 'note receipt' AND to_jsonb(NEW) - 'receipt_at' <> to_jsonb(OLD) - 'receipt_at' THEN
            why := 'notes a receipt and changes something else; a receipt is noted alone (the settle follows)';
            col := 'receipt_at';
        ELSIF move = 'release' AND NOT (
                to_jsonb(NEW) - ARRAY['next_attempt_at', 'updated_at', 'last_error']
                    = to_jsonb(OLD) - ARRAY['next_attempt_at', 'updated_at', 'last_error']
                AND NEW.next_attempt_at = now()) THEN
            why := 'a release makes the task due now and changes nothing else (but updated_at and last_error)';
            col := 'next_attempt_at';
        ELSIF move = 'release'
              AND public.delivery_task_fallback_turn(NEW.notification_id, NEW.fallback_position) <> 'RELEASE' THEN
            why := 'releases a fallback task before the one before it ended certainly not sent (FAILED or '
                   'SUPPRESSED), or after its chain was sent or cancelled';
            col := 'next_attempt_at';
        ELSIF move = 'claim' AND OLD.state = 'SENDING' AND NOT expired THEN
            why := 'takes over a lease that has not expired on the database clock';
            col := 'lease_until';
        ELSIF move = 'claim' AND NOT due AND OLD.state <> 'SENDING' THEN
            why := 'claims a task that is not due yet';
            col := 'next_attempt_at';
        ELSIF move = 'claim' AND NOT NEW.lease_until > now() THEN
            why := 'claims without a lease in the future';
            col := 'lease_until';
        ELSIF move <> 'claim' AND NEW.attempt_token IS DISTINCT FROM OLD.attempt_token THEN
            why := format('changes the attempt token in a %s; only a claim does', move);
            col := 'attempt_token';
        ELSIF move = 'set aside' AND NOT (
                to_jsonb(NEW) - set_aside_columns = to_jsonb(OLD) - set_aside_columns
                AND NEW.last_error IS NOT NULL
                AND CASE WHEN waiting
                         THEN due AND NEW.next_attempt_at > OLD.next_attempt_at
                         ELSE expired AND NEW.lease_until > OLD.lease_until END) THEN
            why := 'sets aside only a due or expired task: its next_attempt_at or lease_until later, last_error '
                   'set, nothing else changed (a holder''s updated_at marks when its attempt began)';
            col := CASE WHEN waiting THEN 'next_attempt_at' ELSE 'lease_until' END;
        ELSIF move IN ('settle', 'park') AND NOT (due OR expired
                OR (move = 'settle' AND waiting
                    AND EXISTS (SELECT FROM public.notification n
                                WHERE n.id = NEW.notification_id AND n.cancelled_at IS NOT NULL))
                OR (move = 'settle' AND unreleased
                    AND public.delivery_task_fallback_turn(NEW.notification_id, NEW.fallback_position) = 'NOT_NEEDED')) THEN
            why := 'settles or parks only a task its claim may take: due, or SENDING with an expired lease '
                   '(or, for a cancelled notification, settles any waiting task: schema/005)';
            col := CASE WHEN waiting THEN 'next_attempt_at' ELSE 'lease_until' END;
        ELSIF NEW.state <> 'SENDING' AND (NEW.lease_until IS NOT NULL OR NEW.lease_owner IS NOT NULL) THEN
            why := 'leaves a lease on a task nobody holds';
            col := 'lease_until';
        ELSE
            -- The move is one of the protocol's. Now its counting, its uncertainty and its evidence.
            rule := NULL;
            IF counted <> (move IN ('claim', 'settle', 'resolve', 'receipt')) THEN
                rule := 'delivery_task_attempt_count';
                col := 'attempt_count';
                why := CASE WHEN counted THEN format('attempt_count is counted up by a %s, which starts no attempt', move)
                            ELSE format('attempt_count is not counted up by a %s, which starts an attempt', move) END;
            ELSIF OLD.outcome_uncertain AND NOT NEW.outcome_uncertain
                  AND NOT (move = 'finish' AND NEW.state IN ('SENT', 'PENDING', 'FAILED')) AND move NOT IN ('resolve', 'receipt') THEN
                rule := 'delivery_task_uncertainty';
                col := 'outcome_uncertain';
                why := 'writes uncertainty off; only an acceptance, a query that found nothing, a receipt or a resolution may';
            ELSIF OLD.outcome_uncertain AND NEW.outcome_uncertain
                  AND NEW.uncertain_since IS DISTINCT FROM OLD.uncertain_since THEN
                rule := 'delivery_task_uncertainty';
                col := 'uncertain_since';
                why := 'moves the start of an uncertainty that goes on (channel contracts are measured from it)';
            ELSIF expired AND move IN ('claim', 'settle', 'park') AND NOT NEW.outcome_uncertain THEN
                rule := 'delivery_task_uncertainty';
                col := 'outcome_uncertain';
                why := 'takes a task over from an expired lease as certain; the lost call may have been accepted';
            ELSIF NEW.state IN ('FAILED', 'SUPPRESSED') AND NEW.outcome_uncertain AND move <> 'resolve' THEN
                rule := 'delivery_task_uncertainty';
                col := 'outcome_uncertain';
                why := 'writes off a task that may have been accepted (R6); park it for review instead';
            ELSIF NOT OLD.outcome_uncertain AND NEW.outcome_uncertain AND NEW.uncertain_since > OLD.updated_at THEN
                rule := 'delivery_task_uncertainty';
                col := 'uncertain_since';
                why := 'starts an uncertainty after the attempt that caused it began (the row''s updated_at): '
                       'channel contracts would be measured from too late';
            ELSIF NEW.provider_msg_id IS DISTINCT FROM OLD.provider_msg_id
                  AND (move NOT IN ('finish', 'resolve', 'receipt') OR NEW.provider_msg_id IS NULL) THEN
                rule := 'delivery_task_transition';
                col := 'provider_msg_id';
                why := 'provider_msg_id is written only by a finish, a resolution or a receipt, and never erased';
            END IF;
        END IF;
    END IF;

    IF rule IS NULL THEN
        RETURN NULL; -- AFTER trigger: the return value is ignored
    END IF;
    msg := format('delivery_task %s: %s -> %s: %s', OLD.id, old_desc, new_desc, why);
    col := coalesce(col, '');
    -- One RAISE per rule, so that each constraint name this function can raise is written out here.
    CASE rule
    WHEN 'delivery_task_fixed' THEN
        RAISE EXCEPTION USING MESSAGE = msg, ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task',
            COLUMN = col, CONSTRAINT = 'delivery_task_fixed', HINT = hint;
    WHEN 'delivery_task_final' THEN
        RAISE EXCEPTION USING MESSAGE = msg, ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task',
            COLUMN = col, CONSTRAINT = 'delivery_task_final', HINT = hint;
    WHEN 'delivery_task_attempt_count' THEN
        RAISE EXCEPTION USING MESSAGE = msg, ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task',
            COLUMN = col, CONSTRAINT = 'delivery_task_attempt_count', HINT = hint;
    WHEN 'delivery_task_uncertainty' THEN
        RAISE EXCEPTION USING MESSAGE = msg, ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task',
            COLUMN = col, CONSTRAINT = 'delivery_task_uncertainty', HINT = hint;
    ELSE
        RAISE EXCEPTION USING MESSAGE = msg, ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task',
            COLUMN = col, CONSTRAINT = 'delivery_task_transition', HINT = hint;
    END CASE;
END
$$;

COMMENT ON FUNCTION delivery_task_state_machine() IS
    'R2, R6: an update of delivery_task must be one of the protocol''s moves (schema/003_state_machine.sql)';

-- Guards UPDATE of delivery_task with delivery_task_state_machine(). The WHEN is the function's first
-- test, unchanged, and the row left as it was after it: the executor stops at the first false term, so
-- a claim or a finish never compares whole rows, and never calls the function. The WHEN is prepared
-- once per statement, which a claim or finish of 25 or more tasks pays back many times.
CREATE TRIGGER delivery_task_state_machine
    AFTER UPDATE ON delivery_task
    FOR EACH ROW
    WHEN (NOT coalesce(
              NEW.id = OLD.id AND NEW.notification_id = OLD.notification_id AND NEW.channel = OLD.channel
              AND NEW.max_attempts = OLD.max_attempts AND NEW.created_at = OLD.created_at
              AND NEW.fallback_position IS NOT DISTINCT FROM OLD.fallback_position
              AND (NEW.outcome_uncertain OR NOT OLD.outcome_uncertain)
              AND (NOT OLD.outcome_uncertain OR NEW.uncertain_since = OLD.uncertain_since)
              AND (OLD.outcome_uncertain OR NOT NEW.outcome_uncertain OR NEW.uncertain_since <= OLD.updated_at)
              AND ((NEW.state = 'SENDING' AND NEW.attempt_count = OLD.attempt_count + 1
                    AND NEW.attempt_token IS DISTINCT FROM OLD.attempt_token AND NEW.lease_until > now()
                    AND NEW.provider_msg_id IS NOT DISTINCT FROM OLD.provider_msg_id
                    AND ((OLD.state IN ('PENDING', 'UNKNOWN') AND NOT OLD.needs_review AND OLD.next_attempt_at <= now())
                         OR (OLD.state = 'SENDING' AND OLD.lease_until < now() AND NEW.outcome_uncertain)))
                   OR (OLD.state = 'SENDING' AND NEW.state IN ('SENT', 'PENDING', 'UNKNOWN', 'FAILED')
                       AND NEW.attempt_count = OLD.attempt_count AND NEW.attempt_token IS NOT DISTINCT FROM OLD.attempt_token
                       AND NEW.lease_until IS NULL AND NEW.lease_owner IS NULL
                       AND NOT (NEW.state = 'FAILED' AND NEW.outcome_uncertain)
                       AND (NEW.provider_msg_id IS NOT NULL OR OLD.provider_msg_id IS NULL))),
              false)
          AND OLD.* IS DISTINCT FROM NEW.*)
EXECUTE FUNCTION delivery_task_state_machine();

COMMENT ON TRIGGER delivery_task_state_machine ON delivery_task IS
    'R2, R6: refuses any UPDATE that is not a move of the delivery protocol (a claim or a finish passes by the WHEN)';

-- Guards UPDATE of delivery_task: the reference never changes once a channel may have seen it (no role
-- has a column grant on it; this stops the owner too). Raised as the state machine's rule for what a
-- task is for (delivery_task_fixed).
CREATE FUNCTION delivery_task_ref_fixed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = format('delivery_task %s: ref is fixed when the task is created (a channel may have seen it)', OLD.id),
        ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task', COLUMN = 'ref',
        CONSTRAINT = 'delivery_task_fixed',
        HINT = 'see the moves in schema/003_state_machine.sql; a parked task is settled with notifier_resolve()';
END
$$;

COMMENT ON FUNCTION delivery_task_ref_fixed() IS
    'R2, R3: what was sent to a channel names one task forever (schema/001_tables.sql)';

-- The WHEN is evaluated per updated row without calling the function: nothing for a claim or a finish.
CREATE TRIGGER delivery_task_ref_fixed
    AFTER UPDATE ON delivery_task
    FOR EACH ROW
    WHEN (OLD.ref IS DISTINCT FROM NEW.ref)
EXECUTE FUNCTION delivery_task_ref_fixed();

-- Guards R2 and refs that never repeat for every writer: writes the key rows (delivery_task_key, 001) of
-- the tasks one statement inserted, before that statement ends, so a duplicate (notification, channel) or
-- ref fails the insert itself. Statement-level over the transition table: one INSERT per statement,
-- where a row-level trigger would run one per task (measured in docs/benchmarks/2026-12-06-task-keys.md).
-- SECURITY DEFINER: no role may write delivery_task_key itself (002), whatever role inserts the tasks.
CREATE FUNCTION delivery_task_key_insert() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    INSERT INTO public.delivery_task_key (task_id, notification_id, channel, ref)
    SELECT n.id, n.notification_id, n.channel, n.ref FROM new_tasks n;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION delivery_task_key_insert() IS
    'R2: a task''s unique keys are written by the statement that inserts it (schema/003)';

CREATE TRIGGER delivery_task_key_insert
    AFTER INSERT ON delivery_task
    REFERENCING NEW TABLE AS new_tasks
    FOR EACH STATEMENT
EXECUTE FUNCTION delivery_task_key_insert();

-- Guards the key rows against everyone, the owner too (the roles have no grant to write them at all):
-- no UPDATE, no TRUNCATE, and a DELETE only of the keys of a task that is gone (the cascade of
-- retention's DELETE of the task). A key that changed or went while its task stays would let a second
-- task on the same channel, or a reused ref, in.
CREATE FUNCTION delivery_task_key_fixed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    IF TG_OP = 'DELETE' AND NOT EXISTS (SELECT FROM public.delivery_task t WHERE t.id = OLD.task_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION USING
        MESSAGE = CASE WHEN TG_OP = 'TRUNCATE' THEN 'delivery_task_key cannot be truncated'
                       ELSE format('delivery_task_key of task %s: a task''s keys are fixed while the task exists', OLD.task_id) END,
        ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task_key',
        CONSTRAINT = 'delivery_task_key_fixed',
        HINT = 'a task''s keys are written with it and deleted with it (notifier prune)';
END
$$;

COMMENT ON FUNCTION delivery_task_key_fixed() IS
    'R2, R3: a task''s keys neither change nor go while it exists (schema/003)';

CREATE TRIGGER delivery_task_key_fixed
    BEFORE UPDATE OR DELETE ON delivery_task_key
    FOR EACH ROW
EXECUTE FUNCTION delivery_task_key_fixed();

CREATE TRIGGER delivery_task_key_no_truncate
    BEFORE TRUNCATE ON delivery_task_key
    FOR EACH STATEMENT
EXECUTE FUNCTION delivery_task_key_fixed();

-- Guards receipts' matching by provider id for every writer: records the provider message ids that the
-- attempts of a statement hold and their task does not (delivery_task_provider_msg, 001), once the
-- statement has written both. An accepted finish writes one id on the task and its attempt in one
-- statement (TaskFinish), so it records nothing; a superseded holder's late acceptance, or a receipt's
-- id on a task that carries another, is recorded. Run for an UPDATE once per statement, over its
-- transition table: a PL/pgSQL call costs about 35,000 instructions, paid once by a finish of 25
-- attempts, plus one primary-key probe of the task per attempt that holds an id. For an INSERT once per
-- row whose WHEN passes: only the resolve's and a receipt's attempts carry an id (a worker may not insert
-- one, 002), so a claim's attempts never call it. SECURITY DEFINER: no role may write the table itself.
-- enable_seqscan off: the probe is by the task's primary key at any size (see delivery_task_evidence).
CREATE FUNCTION delivery_attempt_provider_msg_record() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, public, pg_temp
    SET enable_seqscan = off
AS $$
BEGIN
    IF TG_LEVEL = 'ROW' THEN
        INSERT INTO public.delivery_task_provider_msg (provider_msg_id, task_id)
        SELECT NEW.provider_msg_id, NEW.task_id
        WHERE NOT EXISTS (SELECT FROM public.delivery_task t
                          WHERE t.id = NEW.task_id AND t.provider_msg_id = NEW.provider_msg_id)
        ON CONFLICT DO NOTHING;
        RETURN NULL;
    END IF;
    INSERT INTO public.delivery_task_provider_msg (provider_msg_id, task_id)
    SELECT DISTINCT a.provider_msg_id, a.task_id
    FROM new_attempts a
    WHERE a.provider_msg_id IS NOT NULL
      AND NOT EXISTS (SELECT FROM public.delivery_task t
                      WHERE t.id = a.task_id AND t.provider_msg_id = a.provider_msg_id)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION delivery_attempt_provider_msg_record() IS
    'Receipts match by provider id: an attempt''s id its task does not carry is recorded (schema/003)';

CREATE TRIGGER delivery_attempt_provider_msg_insert
    AFTER INSERT ON delivery_attempt
    FOR EACH ROW
    WHEN (NEW.provider_msg_id IS NOT NULL)
EXECUTE FUNCTION delivery_attempt_provider_msg_record();

CREATE TRIGGER delivery_attempt_provider_msg_update
    AFTER UPDATE ON delivery_attempt
    REFERENCING NEW TABLE AS new_attempts
    FOR EACH STATEMENT
EXECUTE FUNCTION delivery_attempt_provider_msg_record();

-- Guards receipts' matching by provider id when a task's own id changes: the id that a later finish or
-- a resolution replaced stays findable (delivery_task_provider_msg, 001). The WHEN passes every claim
-- and every first finish without a call; provider_msg_id is never erased (delivery_task_state_machine).
CREATE FUNCTION delivery_task_provider_msg_replaced() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    INSERT INTO public.delivery_task_provider_msg (provider_msg_id, task_id)
    VALUES (OLD.provider_msg_id, OLD.id)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION delivery_task_provider_msg_replaced() IS
    'Receipts match by provider id: a task''s replaced id is recorded (schema/003)';

CREATE TRIGGER delivery_task_provider_msg_replaced
    AFTER UPDATE ON delivery_task
    FOR EACH ROW
    WHEN (OLD.provider_msg_id IS NOT NULL AND NEW.provider_msg_id IS DISTINCT FROM OLD.provider_msg_id)
EXECUTE FUNCTION delivery_task_provider_msg_replaced();

-- Guards the recorded ids against everyone, the owner too (the roles have no grant to write them): no
-- UPDATE, no TRUNCATE, and a DELETE only of the ids of a task that is gone (the cascade of retention's
-- DELETE of the task). An id that went while its task stays would leave a receipt naming it unmatched.
CREATE FUNCTION delivery_task_provider_msg_fixed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    IF TG_OP = 'DELETE' AND NOT EXISTS (SELECT FROM public.delivery_task t WHERE t.id = OLD.task_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION USING
        MESSAGE = CASE WHEN TG_OP = 'TRUNCATE' THEN 'delivery_task_provider_msg cannot be truncated'
                       ELSE format('delivery_task_provider_msg of task %s: a task''s provider message ids stay while the task exists', OLD.task_id) END,
        ERRCODE = 'integrity_constraint_violation', TABLE = 'delivery_task_provider_msg',
        CONSTRAINT = 'delivery_task_provider_msg_fixed',
        HINT = 'they are recorded by the triggers of schema/003 and deleted with their task (notifier prune)';
END
$$;

COMMENT ON FUNCTION delivery_task_provider_msg_fixed() IS
    'Receipts match by provider id: a task''s recorded ids neither change nor go while it exists (schema/003)';

CREATE TRIGGER delivery_task_provider_msg_fixed
    BEFORE UPDATE OR DELETE ON delivery_task_provider_msg
    FOR EACH ROW
EXECUTE FUNCTION delivery_task_provider_msg_fixed();

CREATE TRIGGER delivery_task_provider_msg_no_truncate
    BEFORE TRUNCATE ON delivery_task_provider_msg
    FOR EACH STATEMENT
EXECUTE FUNCTION delivery_task_provider_msg_fixed();

-- Guards, at commit, the attempt row a move needs (R3, R6): a counted attempt has its row, of the kind
-- the move makes; a finish that writes "not accepted" points at this attempt's refusal (after an
-- uncertain history: at a query that found nothing); an uncertainty written off by an acceptance points
-- at it. Deferred because the protocol writes the row in the same statement as the task (TaskFinish,
-- notifier_resolve) or right after it in the same transaction (TaskSettleWithoutCall, then
-- AttemptRecordSkip). Runs as the committing user (every role that updates tasks may read attempts).
-- search_path pinned with pg_temp last and the table named with its schema, so that a caller's
-- temporary table or function cannot stand in for ours (the same in every function of this file).
-- enable_seqscan off: PL/pgSQL keeps a statement's plan for the session, and one made while the table
-- was small (a new database) would scan the whole table on every call ever after; the lookup is by a
-- unique index (here (task_id, attempt_no); delivery_attempt_fits: the task's primary key) at any size.
CREATE FUNCTION delivery_task_evidence() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
    SET enable_seqscan = off
AS $$
DECLARE
    a    record;
    ok   boolean := true;
    want text;
BEGIN
    SELECT at.action, at.outcome, at.attempt_token INTO a
    FROM public.delivery_attempt at
    WHERE at.task_id = NEW.id AND at.attempt_no = NEW.attempt_count;

    IF NEW.attempt_count <> OLD.attempt_count THEN
        want := CASE NEW.state
            WHEN 'SENDING' THEN 'an open SEND, QUERY or TOPIC_RESEND attempt with the task''s token'
            WHEN 'SUPPRESSED' THEN 'a SKIP attempt PREF_DISABLED, CANCELLED or FALLBACK_NOT_NEEDED'
            WHEN 'FAILED' THEN 'a SKIP attempt TTL_EXPIRED or a MANUAL attempt MANUAL_FAILED'
            WHEN 'UNKNOWN' THEN 'a SKIP attempt PREF_DISABLED_UNCERTAIN, TTL_EXPIRED_UNCERTAIN or CANCELLED_UNCERTAIN'
            WHEN 'SENT' THEN 'a MANUAL attempt MANUAL_SENT or a RECEIPT attempt RECEIPT_ACCEPTED'
            ELSE 'no attempt (no move counts one into this state)'
        END;
        ok := CASE NEW.state
            WHEN 'SENDING' THEN a.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND a.attempt_token = NEW.attempt_token
            WHEN 'SUPPRESSED' THEN a.action = 'SKIP' AND a.outcome IN ('PREF_DISABLED', 'CANCELLED', 'FALLBACK_NOT_NEEDED')
            WHEN 'FAILED' THEN (a.action = 'SKIP' AND a.outcome = 'TTL_EXPIRED')
                            OR (a.action = 'MANUAL' AND a.outcome = 'MANUAL_FAILED')
            WHEN 'UNKNOWN' THEN a.action = 'SKIP' AND a.outcome IN ('PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN', 'CANCELLED_UNCERTAIN')
            WHEN 'SENT' THEN (a.action = 'MANUAL' AND a.outcome = 'MANUAL_SENT')
                          OR (a.action = 'RECEIPT' AND a.outcome = 'RECEIPT_ACCEPTED')
            ELSE false
        END;
        -- Before it is due, a waiting task is settled without a call only by a cancel (schema/005); a
        -- receipt's SENT is evidence of its own.
        IF ok AND OLD.state IN ('PENDING', 'UNKNOWN') AND NOT OLD.needs_review AND coalesce(OLD.next_attempt_at > now(), true)
           AND NEW.state IN ('SUPPRESSED', 'FAILED', 'UNKNOWN') AND a.outcome NOT IN ('CANCELLED', 'CANCELLED_UNCERTAIN', 'FALLBACK_NOT_NEEDED') THEN
            want := 'a SKIP attempt CANCELLED, CANCELLED_UNCERTAIN or FALLBACK_NOT_NEEDED (the task was not due: '
                    'only a cancel, or a fallback chain that no longer needs it, settles it)';
            ok := false;
        END IF;
    ELSIF OLD.state = 'SENDING' AND NEW.state IN ('PENDING', 'FAILED') AND NOT NEW.outcome_uncertain THEN
        IF OLD.outcome_uncertain THEN
            want := 'this attempt''s QUERY_NOT_FOUND (the only proof that an uncertain history was not accepted)';
            ok := a.attempt_token = OLD.attempt_token AND a.outcome = 'QUERY_NOT_FOUND';
        ELSE
            want := 'this attempt''s refusal: REJECTED, HTTP_5XX, THROTTLED, CONNECT_FAILED, QUERY_NOT_FOUND (or, for PENDING, ACCOUNT_REFUSED)';
            ok := a.attempt_token = OLD.attempt_token
                  AND (a.outcome IN ('REJECTED', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED', 'QUERY_NOT_FOUND')
                       OR (a.outcome = 'ACCOUNT_REFUSED' AND NEW.state = 'PENDING'));
        END IF;
    ELSIF OLD.outcome_uncertain AND NOT NEW.outcome_uncertain AND NEW.state = 'SENT' THEN
        want := 'this attempt''s acceptance: ACCEPTED, ACCEPTED_REPLAY or QUERY_FOUND';
        ok := a.attempt_token = OLD.attempt_token AND a.outcome IN ('ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND');
    END IF;

    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION 'delivery_task % (% -> %, attempt %) has no evidence: it needs % as attempt %, found %',
                NEW.id, OLD.state, NEW.state, NEW.attempt_count, want, NEW.attempt_count,
                CASE WHEN a.action IS NULL THEN 'none' ELSE a.action || ' ' || coalesce(a.outcome, '(open)') END
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_task',
                  COLUMN = 'attempt_count',
                  CONSTRAINT = 'delivery_task_evidence',
                  HINT = 'a move and its attempt row are written in one transaction; see schema/003_state_machine.sql';
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION delivery_task_evidence() IS
    'R3, R6: at commit, a counted attempt has its row, and a task written off as not accepted has the observation that proves it';

-- Queued only for the moves that need evidence: a counted attempt other than a claim (a settle, a
-- resolve, a receipt's settle, a cancel; a claim's is delivery_task_holders_have_attempts'), a finish
-- that writes PENDING or FAILED, an uncertainty written off. A move to SENDING that counts an attempt
-- is a claim; a plain finish to SENT or UNKNOWN queues nothing.
CREATE CONSTRAINT TRIGGER delivery_task_evidence
    AFTER UPDATE ON delivery_task
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN ((NEW.attempt_count <> OLD.attempt_count AND NEW.state <> 'SENDING')
          OR (OLD.state = 'SENDING' AND NEW.state IN ('PENDING', 'FAILED'))
          OR (OLD.outcome_uncertain AND NOT NEW.outcome_uncertain))
EXECUTE FUNCTION delivery_task_evidence();

COMMENT ON TRIGGER delivery_task_evidence ON delivery_task IS
    'R3, R6: refuses at commit a move whose attempt row is missing or says otherwise (a claim''s: delivery_task_holders_have_attempts)';

-- Why an open call attempt does not follow its task, or NULL when it does: the tests delivery_attempt_fits()
-- makes of such a row, in its order, given the task as read now (its state, its attempt_count, whether
-- its attempt_token is the attempt's). {column, reason}, for the two statement-level checks below.
CREATE FUNCTION delivery_attempt_call_misfit(task_state text, task_count integer, task_token_held boolean, attempt_no integer)
    RETURNS text[]
    LANGUAGE sql
    IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN task_state IS NULL THEN ARRAY['task_id', 'its task is not visible']
        WHEN attempt_no <> task_count THEN ARRAY['attempt_no',
            format('the task has counted %s attempts; a new attempt is the one its move just counted', task_count)]
        WHEN NOT coalesce(task_state = 'SENDING' AND task_token_held, false) THEN ARRAY['attempt_token',
            format('a call is opened only by the task''s holder, with its token (the task is %s)', task_state)]
    END
$$;

-- Guards, at the end of every statement that updates tasks, what a holder needs (R3): a task left
-- SENDING holds the open call attempt its claim counted, of its token: (task_id, attempt_no) is the
-- task's (id, attempt_count), action SEND, QUERY or TOPIC_RESEND, attempt_token the task's. One
-- set-based lookup per statement (a transition table, the (task_id, attempt_no) unique index) instead of
-- a PL/pgSQL call per claimed task at commit. So a claim's attempt row must be written by the same
-- statement as the claim (at its end, rather than by the commit), as TaskStartAttempts does; a claim
-- and its attempt in two statements of one transaction is refused (delivery_task_evidence). When the
-- statement did open a call for such a task, but under another number or token, that attempt is named
-- as at fault, as delivery_attempt_fits() would name it (its check runs after this one in the
-- statement). Runs as the updating user; search_path and enable_seqscan pinned (once per statement).
CREATE FUNCTION delivery_task_holders_have_attempts() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
    SET enable_seqscan = off
AS $$
DECLARE
    t      record;
    opened record;
    misfit text[];
BEGIN
    SELECT n.id, n.attempt_count, n.attempt_token, a.action, a.outcome INTO t
    FROM updated_tasks n
    LEFT JOIN public.delivery_attempt a ON a.task_id = n.id AND a.attempt_no = n.attempt_count
    WHERE n.state = 'SENDING'
      AND NOT coalesce(a.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND a.attempt_token = n.attempt_token, false)
    ORDER BY n.id
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT a.id, a.attempt_no, a.attempt_token = t.attempt_token AS held INTO opened
    FROM public.delivery_attempt a
    WHERE a.task_id = t.id AND a.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND a.outcome IS NULL
      AND a.xmin = pg_current_xact_id()::xid
    ORDER BY a.attempt_no DESC
    LIMIT 1;
    misfit := delivery_attempt_call_misfit('SENDING', t.attempt_count, opened.held, opened.attempt_no);
    IF FOUND AND misfit IS NOT NULL THEN
        RAISE EXCEPTION 'delivery_attempt % (task %, attempt %): %', opened.id, t.id, opened.attempt_no, misfit[2]
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  COLUMN = misfit[1],
                  CONSTRAINT = 'delivery_attempt_follows_task',
                  HINT = 'attempts are opened by the move that counts them (schema/003_state_machine.sql)';
    END IF;
    RAISE EXCEPTION 'delivery_task % (SENDING, attempt %) has no evidence: it needs an open SEND, QUERY or TOPIC_RESEND attempt with the task''s token as attempt %, written by the same statement, found %',
            t.id, t.attempt_count, t.attempt_count,
            CASE WHEN t.action IS NULL THEN 'none' ELSE t.action || ' ' || coalesce(t.outcome, '(open)') END
        USING ERRCODE = 'integrity_constraint_violation',
              TABLE = 'delivery_task',
              COLUMN = 'attempt_count',
              CONSTRAINT = 'delivery_task_evidence',
              HINT = 'a claim and its attempt row are written in one statement (TaskStartAttempts); see schema/003_state_machine.sql';
END
$$;

COMMENT ON FUNCTION delivery_task_holders_have_attempts() IS
    'R3: a task a statement leaves SENDING holds the open call attempt of its token (schema/003)';

CREATE TRIGGER delivery_task_holders_have_attempts
    AFTER UPDATE ON delivery_task
    REFERENCING NEW TABLE AS updated_tasks
    FOR EACH STATEMENT
EXECUTE FUNCTION delivery_task_holders_have_attempts();

COMMENT ON TRIGGER delivery_task_holders_have_attempts ON delivery_task IS
    'R3: refuses a statement that leaves a task SENDING without its open call attempt';

-- Guards INSERT and UPDATE of delivery_attempt (R3): what an attempt records fits what it did, and a new
-- attempt follows its task.
--   outcome by action   SEND, TOPIC_RESEND: ACCEPTED, ACCEPTED_REPLAY, TIMEOUT, IO_ERROR, IN_FLIGHT,
--                       MALFORMED_RESPONSE, HTTP_5XX, THROTTLED, CONNECT_FAILED, REJECTED, GATEWAY_ERROR,
--                       ACCOUNT_REFUSED, or LEASE_EXPIRED; QUERY: QUERY_FOUND, QUERY_NOT_FOUND,
--                       QUERY_FAILED or LEASE_EXPIRED; SKIP: PREF_DISABLED, TTL_EXPIRED and their
--                       _UNCERTAIN forms, CANCELLED, CANCELLED_UNCERTAIN (only for a notification that
--                       was cancelled), FALLBACK_NOT_NEEDED (only for a task whose fallback chain has an
--                       earlier task SENT); MANUAL: MANUAL_SENT, MANUAL_FAILED; RECEIPT: RECEIPT_ACCEPTED.
--                       late_outcome: a call's outcome, of a call.
--   LEASE_EXPIRED       closes an attempt only when its holder is gone: the task's token changed, or the
--                       lease expired on the database clock (a live holder records its own outcome).
--   a new attempt       attempt_no is the task's attempt_count (the move that counted it ran first, in
--                       this statement or transaction); a call (SEND, QUERY, TOPIC_RESEND) is inserted
--                       open, with the token of the task's current holder; SKIP, MANUAL and RECEIPT are
--                       inserted closed, for a task their move has just settled (SKIP: SUPPRESSED, FAILED
--                       or parked as its outcome says; MANUAL: SENT or FAILED as its outcome says;
--                       RECEIPT: SENT).
-- AFTER the row is written, at the end of the statement: in TaskStartAttempts the task's update and the
-- attempt's insert are sibling CTEs, and by then both have run. The task is read as the inserting user
-- (a caller who may not read it cannot attach an attempt to it).
CREATE FUNCTION delivery_attempt_fits() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
    SET enable_seqscan = off
AS $$
DECLARE
    -- the outcomes of a call, by action
    call_outcomes constant text[] := CASE NEW.action
        WHEN 'SEND' THEN ARRAY['ACCEPTED', 'ACCEPTED_REPLAY', 'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE',
                               'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED', 'REJECTED', 'GATEWAY_ERROR', 'ACCOUNT_REFUSED']
        WHEN 'TOPIC_RESEND' THEN ARRAY['ACCEPTED', 'ACCEPTED_REPLAY', 'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE',
                               'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED', 'REJECTED', 'GATEWAY_ERROR', 'ACCOUNT_REFUSED']
        WHEN 'QUERY' THEN ARRAY['QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED']
        ELSE ARRAY[]::text[]
    END;
    outcomes constant text[] := CASE NEW.action
        WHEN 'SKIP' THEN ARRAY['PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN',
                               'CANCELLED', 'CANCELLED_UNCERTAIN', 'FALLBACK_NOT_NEEDED']
        WHEN 'MANUAL' THEN ARRAY['MANUAL_SENT', 'MANUAL_FAILED']
        WHEN 'RECEIPT' THEN ARRAY['RECEIPT_ACCEPTED']
        ELSE call_outcomes || 'LEASE_EXPIRED'::text
    END;
    t   record;
    col text;
    why text;
BEGIN
    -- What every finish writes, a call's outcome or late observation that fits it, passes at once.
    IF TG_OP = 'UPDATE' AND coalesce(
           (NEW.outcome IS NOT DISTINCT FROM OLD.outcome
            OR NEW.outcome = ANY (call_outcomes))
           AND (NEW.late_outcome IS NOT DISTINCT FROM OLD.late_outcome OR NEW.late_outcome = ANY (call_outcomes)),
           false) THEN
        RETURN NULL;
    END IF;
    IF NEW.outcome IS NOT NULL AND (TG_OP = 'INSERT' OR NEW.outcome IS DISTINCT FROM OLD.outcome)
       AND NOT NEW.outcome = ANY (outcomes) THEN
        col := 'outcome';
        why := format('%s is not an outcome of a %s attempt', NEW.outcome, NEW.action);
    ELSIF NEW.late_outcome IS NOT NULL AND (TG_OP = 'INSERT' OR NEW.late_outcome IS DISTINCT FROM OLD.late_outcome)
       AND NOT NEW.late_outcome = ANY (call_outcomes) THEN
        col := 'late_outcome';
        why := format('%s is not a late observation of a %s attempt', NEW.late_outcome, NEW.action);
    END IF;
    IF col IS NOT NULL THEN
        RAISE EXCEPTION 'delivery_attempt % (task %, attempt %): %', NEW.id, NEW.task_id, NEW.attempt_no, why
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  COLUMN = col,
                  CONSTRAINT = 'delivery_attempt_outcome_fits_action',
                  HINT = 'see the outcomes by action in schema/003_state_machine.sql';
    END IF;
    IF TG_OP <> 'INSERT' AND NOT (NEW.outcome = 'LEASE_EXPIRED' AND OLD.outcome IS NULL) THEN
        RETURN NULL;
    END IF;

    SELECT dt.state, dt.needs_review, dt.attempt_count, dt.attempt_token, dt.lease_until < now() AS expired INTO t
    FROM public.delivery_task dt WHERE dt.id = NEW.task_id;
    IF TG_OP <> 'INSERT' THEN
        -- LEASE_EXPIRED closes the attempt of a holder that is gone: superseded, or its lease ran out.
        IF t.state = 'SENDING' AND t.attempt_token = NEW.attempt_token AND NOT t.expired THEN
            RAISE EXCEPTION 'delivery_attempt % (task %, attempt %): LEASE_EXPIRED, but its holder''s lease has not expired',
                    NEW.id, NEW.task_id, NEW.attempt_no
                USING ERRCODE = 'integrity_constraint_violation',
                      TABLE = 'delivery_attempt',
                      COLUMN = 'outcome',
                      CONSTRAINT = 'delivery_attempt_follows_task',
                      HINT = 'a live holder records its own outcome when its call ends';
        END IF;
        RETURN NULL;
    END IF;
    IF t.state IS NULL THEN
        col := 'task_id';
        why := 'its task is not visible';
    ELSIF NEW.attempt_no <> t.attempt_count THEN
        col := 'attempt_no';
        why := format('the task has counted %s attempts; a new attempt is the one its move just counted', t.attempt_count);
    ELSIF NEW.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND NOT (t.state = 'SENDING' AND t.attempt_token = NEW.attempt_token) THEN
        col := 'attempt_token';
        why := format('a call is opened only by the task''s holder, with its token (the task is %s)', t.state);
    ELSIF NEW.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND (NEW.outcome IS NOT NULL OR NEW.late_outcome IS NOT NULL) THEN
        col := 'outcome';
        why := 'a call is opened before it is made; its outcome is recorded when it ends';
    ELSIF NEW.action = 'SKIP' AND NEW.outcome = 'FALLBACK_NOT_NEEDED'
          AND NOT EXISTS (SELECT FROM public.delivery_task dt
                          WHERE dt.id = NEW.task_id AND dt.fallback_position IS NOT NULL
                            AND public.delivery_task_fallback_turn(dt.notification_id, dt.fallback_position) = 'NOT_NEEDED') THEN
        col := 'outcome';
        why := 'a SKIP FALLBACK_NOT_NEEDED for a task whose fallback chain has no earlier task SENT';
    ELSIF NEW.action = 'SKIP' AND NEW.outcome IN ('CANCELLED', 'CANCELLED_UNCERTAIN')
          AND NOT EXISTS (SELECT FROM public.delivery_task dt JOIN public.notification n ON n.id = dt.notification_id
                          WHERE dt.id = NEW.task_id AND n.cancelled_at IS NOT NULL) THEN
        col := 'outcome';
        why := format('a SKIP %s for a notification that was not cancelled', NEW.outcome);
    ELSIF NEW.action = 'SKIP' AND NOT (
            (NEW.outcome = 'PREF_DISABLED' AND t.state = 'SUPPRESSED')
            OR (NEW.outcome = 'TTL_EXPIRED' AND t.state = 'FAILED')
            OR (NEW.outcome IN ('PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN', 'CANCELLED_UNCERTAIN')
                AND t.state = 'UNKNOWN' AND t.needs_review)
            OR (NEW.outcome IN ('CANCELLED', 'FALLBACK_NOT_NEEDED') AND t.state = 'SUPPRESSED')) THEN
        col := 'outcome';
        why := format('a SKIP %s does not record the task''s settlement (the task is %s)', coalesce(NEW.outcome, 'without outcome'), t.state);
    ELSIF NEW.action = 'MANUAL' AND NOT (
            (NEW.outcome = 'MANUAL_SENT' AND t.state = 'SENT') OR (NEW.outcome = 'MANUAL_FAILED' AND t.state = 'FAILED')) THEN
        col := 'outcome';
        why := format('a MANUAL %s does not record the task''s resolution (the task is %s)', coalesce(NEW.outcome, 'without outcome'), t.state);
    ELSIF NEW.action = 'RECEIPT' AND NOT (NEW.outcome = 'RECEIPT_ACCEPTED' AND t.state = 'SENT') THEN
        col := 'outcome';
        why := format('a RECEIPT %s does not record the task''s settlement by receipt (the task is %s)', coalesce(NEW.outcome, 'without outcome'), t.state);
    END IF;
    IF col IS NOT NULL THEN
        RAISE EXCEPTION 'delivery_attempt % (task %, attempt %): %', NEW.id, NEW.task_id, NEW.attempt_no, why
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_attempt',
                  COLUMN = col,
                  CONSTRAINT = 'delivery_attempt_follows_task',
                  HINT = 'attempts are opened by the move that counts them (schema/003_state_machine.sql)';
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION delivery_attempt_fits() IS
    'R3: an attempt''s outcome fits its action, and a new attempt is the one its task''s move just counted';

-- Guards INSERT of delivery_attempt with delivery_attempt_fits(), for every insert but an open call:
-- SKIP, MANUAL and RECEIPT rows, and any call inserted with an outcome (refused by the function, as an
-- outcome that does not fit the action or as a call opened closed). Open calls are
-- delivery_attempt_calls_follow_tasks'.
CREATE TRIGGER delivery_attempt_fits_insert
    AFTER INSERT ON delivery_attempt
    FOR EACH ROW
    WHEN (NEW.action NOT IN ('SEND', 'QUERY', 'TOPIC_RESEND') OR NEW.outcome IS NOT NULL OR NEW.late_outcome IS NOT NULL)
EXECUTE FUNCTION delivery_attempt_fits();

COMMENT ON TRIGGER delivery_attempt_fits_insert ON delivery_attempt IS
    'R3: refuses an attempt whose outcome does not fit its action or which its task did not just count (open calls: delivery_attempt_calls_follow_tasks)';

-- Guards UPDATE of delivery_attempt with delivery_attempt_fits(): an outcome or late outcome recorded
-- later fits the action too (delivery_attempt_append_only already makes each written once), and
-- LEASE_EXPIRED closes only a holder that is gone. A call's outcome recorded on its open attempt, the
-- one update every finish makes, is decided by the WHEN instead of by a call of the function: it skips
-- exactly the rows for which delivery_attempt_fits() returns at its first test without checking
-- anything else (a SEND or TOPIC_RESEND given one of a call's outcomes, a QUERY given one of a query's,
-- the late outcome left as it was). Everything else (another outcome, LEASE_EXPIRED, a late observation)
-- still calls the function. The outcome lists are the function's call_outcomes; the case
-- TestStateMachineEveryOutcomeOfAnOpenCall records every outcome the CHECK allows on an open SEND and an
-- open QUERY attempt and fails if one that does not fit passes. Measured: the server's CPU per delivery
-- at 100 ms about 7-9% lower (docs/benchmarks/2026-12-04-database-cost.md).
CREATE TRIGGER delivery_attempt_fits_update
    AFTER UPDATE ON delivery_attempt
    FOR EACH ROW
    WHEN ((NEW.outcome IS DISTINCT FROM OLD.outcome OR NEW.late_outcome IS DISTINCT FROM OLD.late_outcome)
          AND NOT coalesce(NEW.late_outcome IS NOT DISTINCT FROM OLD.late_outcome
                           AND ((NEW.action IN ('SEND', 'TOPIC_RESEND')
                                 AND NEW.outcome IN ('ACCEPTED', 'ACCEPTED_REPLAY', 'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT',
                                                     'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
                                                     'REJECTED', 'GATEWAY_ERROR', 'ACCOUNT_REFUSED'))
                                OR (NEW.action = 'QUERY'
                                    AND NEW.outcome IN ('QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED'))),
                           false))
EXECUTE FUNCTION delivery_attempt_fits();

COMMENT ON TRIGGER delivery_attempt_fits_update ON delivery_attempt IS
    'R3: refuses an outcome or late outcome that does not fit the attempt''s action (a call''s own outcome passes by the WHEN)';

-- Guards, at the end of every statement that inserts attempts, the open calls among them (R3): each is
-- the attempt its task's claim just counted, under the task's token: the task is visible, SENDING, its
-- attempt_count is the attempt_no and its attempt_token the attempt's. The same tests, in the same order,
-- as delivery_attempt_fits() makes of such a row; one set-based lookup per statement (the task's
-- primary key) instead of a PL/pgSQL call per attempt. Runs as the inserting user (a caller who may not
-- read the task cannot attach an attempt to it).
CREATE FUNCTION delivery_attempt_calls_follow_tasks() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
    SET enable_seqscan = off
AS $$
DECLARE
    a      record;
    misfit text[];
BEGIN
    SELECT n.id, n.task_id, n.attempt_no, t.state, t.attempt_count, t.attempt_token = n.attempt_token AS held INTO a
    FROM inserted_attempts n
    LEFT JOIN public.delivery_task t ON t.id = n.task_id
    WHERE n.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND n.outcome IS NULL AND n.late_outcome IS NULL
      AND NOT coalesce(t.state = 'SENDING' AND t.attempt_token = n.attempt_token AND t.attempt_count = n.attempt_no, false)
    ORDER BY n.id
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    misfit := delivery_attempt_call_misfit(a.state, a.attempt_count, a.held, a.attempt_no);
    RAISE EXCEPTION 'delivery_attempt % (task %, attempt %): %', a.id, a.task_id, a.attempt_no, misfit[2]
        USING ERRCODE = 'integrity_constraint_violation',
              TABLE = 'delivery_attempt',
              COLUMN = misfit[1],
              CONSTRAINT = 'delivery_attempt_follows_task',
              HINT = 'attempts are opened by the move that counts them (schema/003_state_machine.sql)';
END
$$;

COMMENT ON FUNCTION delivery_attempt_calls_follow_tasks() IS
    'R3: an open call attempt a statement inserts is the one its task''s claim counted, under the task''s token (schema/003)';

CREATE TRIGGER delivery_attempt_calls_follow_tasks
    AFTER INSERT ON delivery_attempt
    REFERENCING NEW TABLE AS inserted_attempts
    FOR EACH STATEMENT
EXECUTE FUNCTION delivery_attempt_calls_follow_tasks();

COMMENT ON TRIGGER delivery_attempt_calls_follow_tasks ON delivery_attempt IS
    'R3: refuses a statement that opens a call attempt its task''s claim did not count';

-- Guards DELETE of delivery_task: no attempt outlives its task, in place of a foreign key from
-- delivery_attempt (001 says why). Retention (RetentionPruneBatch) deletes a task's attempts in the
-- same statement, before the task. Nothing can slip between the attempts' checks and the commit: an
-- attempt is inserted only with a move of its task in the same transaction (a claim, a settle, a
-- resolve, a receipt's settle: the attempt number is checked against the task's count), so its task's
-- row is locked until the commit, and a DELETE of that task waits for it and then finds the attempt.
-- delivery_receipt's foreign key still refuses a TRUNCATE of delivery_task. SQLSTATE 23503
-- (foreign_key_violation), as a foreign key raises. Runs as the deleting user (only the owner may
-- delete); search_path and enable_seqscan pinned (each deleted task is looked up in the (task_id,
-- attempt_no) index).
CREATE FUNCTION delivery_task_attempts_kept() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
    SET enable_seqscan = off
AS $$
DECLARE
    kept record;
BEGIN
    SELECT a.task_id, a.attempt_no INTO kept
    FROM deleted_tasks d
    JOIN public.delivery_attempt a ON a.task_id = d.id
    ORDER BY a.task_id, a.attempt_no
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'delivery_task % cannot be deleted: its attempt % is kept', kept.task_id, kept.attempt_no
            USING ERRCODE = 'foreign_key_violation',
                  TABLE = 'delivery_task',
                  CONSTRAINT = 'delivery_task_attempts_kept',
                  HINT = 'a task goes with all its attempts, in one statement (notifier prune)';
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION delivery_task_attempts_kept() IS
    'R3: no attempt outlives its task (schema/003, in place of a foreign key)';

CREATE TRIGGER delivery_task_attempts_kept
    AFTER DELETE ON delivery_task
    REFERENCING OLD TABLE AS deleted_tasks
    FOR EACH STATEMENT
EXECUTE FUNCTION delivery_task_attempts_kept();

COMMENT ON TRIGGER delivery_task_attempts_kept ON delivery_task IS
    'R3: refuses a DELETE of tasks whose attempts stay';

-- Guards, at commit, every change of account_refusals (a constraint trigger queued only when it changes:
-- no delivery but a refused one pays for it): it grows by one, by a finish (SENDING, this holder's token,
-- to PENDING or UNKNOWN not parked, attempt_count unchanged) whose attempt row, the task's current one
-- with that token, records ACCOUNT_REFUSED. It never shrinks: a refund is never taken back. An
-- ACCOUNT_REFUSED attempt is recorded like any refusal, and the task goes back to wait (PENDING, or
-- UNKNOWN with its uncertainty kept); never FAILED (delivery_task_evidence lists no ACCOUNT_REFUSED for
-- FAILED): a task is never written off for an account state.
CREATE FUNCTION delivery_task_account_refusals() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
    SET enable_seqscan = off
AS $$
DECLARE
    a   record;
    why text;
BEGIN
    SELECT at.outcome, at.attempt_token INTO a
    FROM public.delivery_attempt at
    WHERE at.task_id = NEW.id AND at.attempt_no = NEW.attempt_count;
    why := CASE
        WHEN NEW.account_refusals <> OLD.account_refusals + 1 THEN
            format('account_refusals goes from %s to %s; it grows by one per attempt refused for an account state',
                   OLD.account_refusals, NEW.account_refusals)
        WHEN NOT (OLD.state = 'SENDING' AND NEW.state IN ('PENDING', 'UNKNOWN') AND NOT NEW.needs_review
                  AND NEW.attempt_count = OLD.attempt_count AND NEW.attempt_token IS NOT DISTINCT FROM OLD.attempt_token) THEN
            format('account_refusals grows in a move %s -> %s that is not the finish of a refused call', OLD.state, NEW.state)
        WHEN NOT coalesce(a.outcome = 'ACCOUNT_REFUSED' AND a.attempt_token = OLD.attempt_token, false) THEN
            format('account_refusals grows but attempt %s records %s, not ACCOUNT_REFUSED', NEW.attempt_count,
                   coalesce(a.outcome, 'nothing'))
    END;
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'delivery_task %: %', NEW.id, why
            USING ERRCODE = 'integrity_constraint_violation',
                  TABLE = 'delivery_task',
                  COLUMN = 'account_refusals',
                  CONSTRAINT = 'delivery_task_account_refusals',
                  HINT = 'only a finish with an ACCOUNT_REFUSED attempt refunds it; see schema/003_state_machine.sql';
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION delivery_task_account_refusals() IS
    'An attempt is refunded from the budget only by the finish of a call refused for an account state (schema/003)';

CREATE CONSTRAINT TRIGGER delivery_task_account_refusals
    AFTER UPDATE ON delivery_task
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.account_refusals IS DISTINCT FROM OLD.account_refusals)
EXECUTE FUNCTION delivery_task_account_refusals();

COMMENT ON TRIGGER delivery_task_account_refusals ON delivery_task IS
    'refuses at commit a refund (account_refusals) without its ACCOUNT_REFUSED attempt';

-- The manual resolution, whole: a parked task (UNKNOWN, needs_review) becomes SENT or FAILED and gets
-- its MANUAL_SENT / MANUAL_FAILED attempt with the note and the operator, in one statement, or nothing
-- happens. Returns the MANUAL attempt's number; no row when the task was not parked (no such task, not
-- parked, or already resolved: a second or concurrent call re-evaluates the WHERE after the first
-- commits and matches nothing). SECURITY DEFINER: the operator role writes delivery_task and
-- delivery_attempt only through it (it has no UPDATE or INSERT of its own). search_path pinned, pg_temp
-- last, so a caller's temporary table cannot stand in for ours.
CREATE FUNCTION notifier_resolve(task_id bigint, final_state text, note text, operator text, provider_msg_id text)
    RETURNS TABLE (attempt_no integer)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF final_state IS NULL OR final_state NOT IN ('SENT', 'FAILED') THEN
        RAISE EXCEPTION 'notifier_resolve: final state %: a parked task resolves to SENT or FAILED', coalesce(final_state, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH resolved AS (
        UPDATE delivery_task t
        SET state           = notifier_resolve.final_state,
            needs_review    = false,
            attempt_count   = t.attempt_count + 1,
            provider_msg_id = coalesce(notifier_resolve.provider_msg_id, t.provider_msg_id),
            last_error      = NULL,
            updated_at      = now()
        WHERE t.id = notifier_resolve.task_id
          AND t.state = 'UNKNOWN'
          AND t.needs_review
        RETURNING t.id, t.attempt_count
    ), recorded AS (
        INSERT INTO delivery_attempt AS a (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome,
                                           provider_msg_id, note)
        SELECT r.id, r.attempt_count, gen_random_uuid(), 'MANUAL', notifier_resolve.operator, now(),
               'MANUAL_' || notifier_resolve.final_state, notifier_resolve.provider_msg_id, notifier_resolve.note
        FROM resolved r
        RETURNING a.attempt_no
    )
    SELECT r.attempt_no FROM recorded r;
END
$$;

COMMENT ON FUNCTION notifier_resolve(bigint, text, text, text, text) IS
    'A human''s final word on a parked task: SENT or FAILED with its MANUAL attempt, together or not at all';

REVOKE EXECUTE ON FUNCTION notifier_resolve(bigint, text, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION notifier_resolve(bigint, text, text, text, text) TO notifier_operator;

-- migrate:down
DROP FUNCTION notifier_resolve(bigint, text, text, text, text);
DROP TRIGGER delivery_task_account_refusals ON delivery_task;
DROP FUNCTION delivery_task_account_refusals();
DROP TRIGGER delivery_task_attempts_kept ON delivery_task;
DROP FUNCTION delivery_task_attempts_kept();
DROP TRIGGER delivery_attempt_calls_follow_tasks ON delivery_attempt;
DROP FUNCTION delivery_attempt_calls_follow_tasks();
DROP TRIGGER delivery_attempt_fits_update ON delivery_attempt;
DROP TRIGGER delivery_attempt_fits_insert ON delivery_attempt;
DROP FUNCTION delivery_attempt_fits();
DROP TRIGGER delivery_task_holders_have_attempts ON delivery_task;
DROP FUNCTION delivery_task_holders_have_attempts();
DROP FUNCTION delivery_attempt_call_misfit(text, integer, boolean, integer);
DROP TRIGGER delivery_task_evidence ON delivery_task;
DROP FUNCTION delivery_task_evidence();
DROP TRIGGER delivery_task_provider_msg_no_truncate ON delivery_task_provider_msg;
DROP TRIGGER delivery_task_provider_msg_fixed ON delivery_task_provider_msg;
DROP FUNCTION delivery_task_provider_msg_fixed();
DROP TRIGGER delivery_task_provider_msg_replaced ON delivery_task;
DROP FUNCTION delivery_task_provider_msg_replaced();
DROP TRIGGER delivery_attempt_provider_msg_update ON delivery_attempt;
DROP TRIGGER delivery_attempt_provider_msg_insert ON delivery_attempt;
DROP FUNCTION delivery_attempt_provider_msg_record();
DROP TRIGGER delivery_task_key_no_truncate ON delivery_task_key;
DROP TRIGGER delivery_task_key_fixed ON delivery_task_key;
DROP FUNCTION delivery_task_key_fixed();
DROP TRIGGER delivery_task_key_insert ON delivery_task;
DROP FUNCTION delivery_task_key_insert();
DROP TRIGGER delivery_task_ref_fixed ON delivery_task;
DROP FUNCTION delivery_task_ref_fixed();
DROP TRIGGER delivery_task_state_machine ON delivery_task;
DROP FUNCTION delivery_task_state_machine();
DROP TRIGGER delivery_attempt_no_truncate ON delivery_attempt;
DROP FUNCTION delivery_attempt_no_truncate();
DROP TRIGGER delivery_attempt_retention_only ON delivery_attempt;
DROP FUNCTION delivery_attempt_retention_only();
DROP TRIGGER delivery_attempt_append_only ON delivery_attempt;
DROP FUNCTION delivery_attempt_append_only();
