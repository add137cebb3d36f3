-- migrate:up
-- The delivery state machine in the database, for every writer: the three roles of 006, the owner, a
-- script, a hand-written fix. queries/ already make only these moves (and guard each on the row's state);
-- the triggers below refuse every other one, so a SENT task is never sent again, an uncertain history is
-- never written off without evidence, and every counted attempt leaves its row (R2, R3, R6).
--
-- The moves, all of them (queries/delivery_task.sql; service/delivery Decide and Next). "waiting" is
-- PENDING, or UNKNOWN not parked; "due" is next_attempt_at <= now(); "expired" is SENDING with
-- lease_until < now(); "parked" is UNKNOWN with needs_review; now() is the transaction's database clock.
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
--   SENDING              SENT                     finish (TaskFinish)                 =              - (after an uncertain history: this
--                                                                                                   attempt's ACCEPTED, ACCEPTED_REPLAY
--                                                                                                   or QUERY_FOUND)
--   SENDING              PENDING, FAILED          finish, not accepted                =              this attempt: REJECTED, HTTP_5XX,
--                                                                                                   THROTTLED, CONNECT_FAILED or
--                                                                                                   QUERY_NOT_FOUND (only QUERY_NOT_FOUND
--                                                                                                   after an uncertain history)
--   SENDING              UNKNOWN (retry, parked)  finish, outcome unknown             =              -
--   parked               SENT, FAILED             resolve (notifier_resolve below)    +1             MANUAL MANUAL_SENT / MANUAL_FAILED
--   not final            itself, receipt_at set   note a receipt (notifier_apply_      =              -
--                                                 receipt, schema/015): nothing else
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
-- Across every move: notification_id, channel, max_attempts, created_at and id never change;
-- attempt_count never decreases and grows by one exactly when an attempt (or a resolution) begins;
-- attempt_token changes only at a claim; outcome_uncertain becomes false only by a finish that was
-- accepted (SENT) or found nothing (QUERY_NOT_FOUND), or by the resolve; when it becomes true,
-- uncertain_since is no later than the row's updated_at (a holder's: when its attempt began), and while
-- it stays true, uncertain_since stays; a task taken over from an expired lease is uncertain; FAILED
-- and SUPPRESSED are certain unless a human resolved them; needs_review becomes false only by the
-- resolve or a provider's receipt; a task nobody holds has no lease; provider_msg_id is written only by
-- a finish, the resolve or a receipt, and never erased. A no-op update (the row unchanged) passes.
-- receipt_at (the first receipt proving that the provider accepted the message; schema/015) is read
-- through to_jsonb here, so that these functions do not depend on a column a later migration adds.
--
-- Where: delivery_task_state_machine (AFTER UPDATE, each row, at the end of the statement) checks the
-- move itself; delivery_task_evidence (a constraint trigger, DEFERRABLE INITIALLY DEFERRED: at commit)
-- checks the attempt row a move needs, which the protocol writes in the same statement (a data-modifying
-- CTE) or the same transaction. delivery_attempt_fits (AFTER INSERT and UPDATE) checks an attempt row
-- against its action and, when inserted, against its task. AFTER, not BEFORE, as in 005: the tables'
-- own CHECK constraints report first, under their own names.
-- Violations raise SQLSTATE 23000 (integrity_constraint_violation) with TABLE, COLUMN and one of these
-- CONSTRAINT names:
--   delivery_task_fixed, delivery_task_final, delivery_task_transition, delivery_task_attempt_count,
--   delivery_task_uncertainty, delivery_task_evidence, delivery_attempt_outcome_fits_action,
--   delivery_attempt_follows_task
-- What they cannot stop: a role that may ALTER the tables (the owner) can disable or drop the triggers;
-- the owner may still INSERT a task in any state (fixtures, restores; CHECKs still apply); and a worker
-- that holds a task's token is trusted to report what the channel said (the database cannot ask it).

-- UNKNOWN means "may have been accepted": it always carries the uncertainty (Next and Decide write it
-- so; TaskPark sets it). Without it a claim would resend blindly on a channel that cannot dedupe.
ALTER TABLE delivery_task ADD CONSTRAINT delivery_task_unknown_is_uncertain
    CHECK (state <> 'UNKNOWN' OR outcome_uncertain);

-- Guards UPDATE of delivery_task: exactly the moves of the table above (R2, R6).
CREATE FUNCTION delivery_task_state_machine() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    waiting  boolean; -- PENDING, or UNKNOWN not parked
    due      boolean; -- waiting, and next_attempt_at has come
    expired  boolean; -- SENDING, and the lease ran out
    parked   boolean; -- UNKNOWN, needs_review
    counted  boolean; -- attempt_count up by one
    set_aside_columns text[]; -- what a set-aside may change: the time it moves, why, (waiting) when
    move     text;    -- the protocol's move this update makes, NULL when it makes none
    col      text;
    why      text;
    rule     text;
    msg      text;
    hint     constant text := 'see the moves in schema/010_state_machine.sql; a parked task is settled with notifier_resolve()';
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
    due := waiting AND OLD.next_attempt_at <= now();
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
        ELSIF move IN ('settle', 'park') AND NOT (due OR expired) THEN
            why := 'settles or parks only a task its claim may take: due, or SENDING with an expired lease';
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
    'R2, R6: an update of delivery_task must be one of the protocol''s moves (schema/010_state_machine.sql)';

-- Guards UPDATE of delivery_task with delivery_task_state_machine(). A row left as it was is no move.
-- The WHEN stays small on purpose: a trigger's WHEN is read back from the catalog and prepared again
-- for every statement, which for a long one costs more than the function's own fast path.
CREATE TRIGGER delivery_task_state_machine
    AFTER UPDATE ON delivery_task
    FOR EACH ROW
    WHEN (OLD.* IS DISTINCT FROM NEW.*)
EXECUTE FUNCTION delivery_task_state_machine();

COMMENT ON TRIGGER delivery_task_state_machine ON delivery_task IS
    'R2, R6: refuses any UPDATE that is not a move of the delivery protocol';

-- Guards, at commit, the attempt row a move needs (R3, R6): a counted attempt has its row, of the kind
-- the move makes; a finish that writes "not accepted" points at this attempt's refusal (after an
-- uncertain history: at a query that found nothing); an uncertainty written off by an acceptance points
-- at it. Deferred because the protocol writes the row in the same statement as the task (TaskStartAttempts,
-- TaskFinish, notifier_resolve) or right after it in the same transaction (TaskSettleWithoutCall, then
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
            WHEN 'SUPPRESSED' THEN 'a SKIP attempt PREF_DISABLED'
            WHEN 'FAILED' THEN 'a SKIP attempt TTL_EXPIRED or a MANUAL attempt MANUAL_FAILED'
            WHEN 'UNKNOWN' THEN 'a SKIP attempt PREF_DISABLED_UNCERTAIN or TTL_EXPIRED_UNCERTAIN'
            WHEN 'SENT' THEN 'a MANUAL attempt MANUAL_SENT or a RECEIPT attempt RECEIPT_ACCEPTED'
            ELSE 'no attempt (no move counts one into this state)'
        END;
        ok := CASE NEW.state
            WHEN 'SENDING' THEN a.action IN ('SEND', 'QUERY', 'TOPIC_RESEND') AND a.attempt_token = NEW.attempt_token
            WHEN 'SUPPRESSED' THEN a.action = 'SKIP' AND a.outcome = 'PREF_DISABLED'
            WHEN 'FAILED' THEN (a.action = 'SKIP' AND a.outcome = 'TTL_EXPIRED')
                            OR (a.action = 'MANUAL' AND a.outcome = 'MANUAL_FAILED')
            WHEN 'UNKNOWN' THEN a.action = 'SKIP' AND a.outcome IN ('PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN')
            WHEN 'SENT' THEN (a.action = 'MANUAL' AND a.outcome = 'MANUAL_SENT')
                          OR (a.action = 'RECEIPT' AND a.outcome = 'RECEIPT_ACCEPTED')
            ELSE false
        END;
    ELSIF OLD.state = 'SENDING' AND NEW.state IN ('PENDING', 'FAILED') AND NOT NEW.outcome_uncertain THEN
        IF OLD.outcome_uncertain THEN
            want := 'this attempt''s QUERY_NOT_FOUND (the only proof that an uncertain history was not accepted)';
            ok := a.attempt_token = OLD.attempt_token AND a.outcome = 'QUERY_NOT_FOUND';
        ELSE
            want := 'this attempt''s refusal: REJECTED, HTTP_5XX, THROTTLED, CONNECT_FAILED or QUERY_NOT_FOUND';
            ok := a.attempt_token = OLD.attempt_token
                  AND a.outcome IN ('REJECTED', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED', 'QUERY_NOT_FOUND');
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
                  HINT = 'a move and its attempt row are written in one transaction; see schema/010_state_machine.sql';
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION delivery_task_evidence() IS
    'R3, R6: at commit, a counted attempt has its row, and a task written off as not accepted has the observation that proves it';

-- Queued only for the moves that need evidence: a counted attempt (claim, settle, resolve), a finish
-- that writes PENDING or FAILED, an uncertainty written off. A plain finish to SENT or UNKNOWN queues
-- nothing.
CREATE CONSTRAINT TRIGGER delivery_task_evidence
    AFTER UPDATE ON delivery_task
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.attempt_count <> OLD.attempt_count
          OR (OLD.state = 'SENDING' AND NEW.state IN ('PENDING', 'FAILED'))
          OR (OLD.outcome_uncertain AND NOT NEW.outcome_uncertain))
EXECUTE FUNCTION delivery_task_evidence();

COMMENT ON TRIGGER delivery_task_evidence ON delivery_task IS
    'R3, R6: refuses at commit a move whose attempt row is missing or says otherwise';

-- Guards INSERT and UPDATE of delivery_attempt (R3): what an attempt records fits what it did, and a new
-- attempt follows its task.
--   outcome by action   SEND, TOPIC_RESEND: ACCEPTED, ACCEPTED_REPLAY, TIMEOUT, IO_ERROR, IN_FLIGHT,
--                       MALFORMED_RESPONSE, HTTP_5XX, THROTTLED, CONNECT_FAILED, REJECTED, GATEWAY_ERROR
--                       (schema/011), or LEASE_EXPIRED; QUERY: QUERY_FOUND, QUERY_NOT_FOUND, QUERY_FAILED
--                       or LEASE_EXPIRED; SKIP: PREF_DISABLED, TTL_EXPIRED and their _UNCERTAIN forms;
--                       MANUAL: MANUAL_SENT, MANUAL_FAILED; RECEIPT (schema/015): RECEIPT_ACCEPTED.
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
                               'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED', 'REJECTED', 'GATEWAY_ERROR']
        WHEN 'TOPIC_RESEND' THEN ARRAY['ACCEPTED', 'ACCEPTED_REPLAY', 'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE',
                               'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED', 'REJECTED', 'GATEWAY_ERROR']
        WHEN 'QUERY' THEN ARRAY['QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED']
        ELSE ARRAY[]::text[]
    END;
    outcomes constant text[] := CASE NEW.action
        WHEN 'SKIP' THEN ARRAY['PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN']
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
                  HINT = 'see the outcomes by action in schema/010_state_machine.sql';
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
    ELSIF NEW.action = 'SKIP' AND NOT (
            (NEW.outcome = 'PREF_DISABLED' AND t.state = 'SUPPRESSED')
            OR (NEW.outcome = 'TTL_EXPIRED' AND t.state = 'FAILED')
            OR (NEW.outcome IN ('PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN') AND t.state = 'UNKNOWN' AND t.needs_review)) THEN
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
                  HINT = 'attempts are opened by the move that counts them (schema/010_state_machine.sql)';
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION delivery_attempt_fits() IS
    'R3: an attempt''s outcome fits its action, and a new attempt is the one its task''s move just counted';

-- Guards INSERT of delivery_attempt with delivery_attempt_fits().
CREATE TRIGGER delivery_attempt_fits_insert
    AFTER INSERT ON delivery_attempt
    FOR EACH ROW
EXECUTE FUNCTION delivery_attempt_fits();

COMMENT ON TRIGGER delivery_attempt_fits_insert ON delivery_attempt IS
    'R3: refuses an attempt whose outcome does not fit its action or which its task did not just count';

-- Guards UPDATE of delivery_attempt with delivery_attempt_fits(): an outcome or late outcome recorded
-- later fits the action too (005 already makes each written once), and LEASE_EXPIRED closes only a
-- holder that is gone.
CREATE TRIGGER delivery_attempt_fits_update
    AFTER UPDATE ON delivery_attempt
    FOR EACH ROW
    WHEN (NEW.outcome IS DISTINCT FROM OLD.outcome OR NEW.late_outcome IS DISTINCT FROM OLD.late_outcome)
EXECUTE FUNCTION delivery_attempt_fits();

COMMENT ON TRIGGER delivery_attempt_fits_update ON delivery_attempt IS
    'R3: refuses an outcome or late outcome that does not fit the attempt''s action';

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

-- The operator writes only through notifier_resolve: no UPDATE of delivery_task, no INSERT of attempts
-- (a table-level REVOKE also revokes 006's column grants), and their policies go.
DROP POLICY delivery_task_operator_update ON delivery_task;
DROP POLICY delivery_attempt_operator_insert ON delivery_attempt;
REVOKE UPDATE ON delivery_task FROM notifier_operator;
REVOKE INSERT ON delivery_attempt FROM notifier_operator;

-- Guards creation of work (replaces 006's policy): a new task starts PENDING with no attempt made, due
-- now, for a notification this very transaction inserted (a creator cannot add channels to someone
-- else's notification, or to an old one) and a channel its user has enabled. xmin is the inserting
-- transaction's id; the comparison holds for a notification inserted at the top level of the
-- transaction (not in a savepoint), as NotificationInsert and TaskInsertForEnabledPrefs run.
-- next_attempt_at must be now() (its default): a task dated back would jump the queue. The column grant
-- stays, so that a creator still running the previous TaskInsertForEnabledPrefs (which sets it to now())
-- keeps working during an upgrade.
ALTER POLICY delivery_task_creator_insert ON delivery_task
    WITH CHECK (state = 'PENDING' AND attempt_count = 0 AND next_attempt_at = now()
                AND EXISTS (SELECT FROM notification n
                            JOIN channel_pref p ON p.user_id = n.user_id AND p.channel = delivery_task.channel
                            WHERE n.id = delivery_task.notification_id
                              AND n.xmin = pg_current_xact_id()::xid
                              AND p.enabled));

-- migrate:down
ALTER POLICY delivery_task_creator_insert ON delivery_task
    WITH CHECK (state = 'PENDING' AND attempt_count = 0);
GRANT INSERT (task_id, attempt_no, attempt_token, action, worker, finished_at, outcome, provider_msg_id, note)
    ON delivery_attempt TO notifier_operator;
GRANT UPDATE (state, needs_review, attempt_count, provider_msg_id, last_error, updated_at)
    ON delivery_task TO notifier_operator;
CREATE POLICY delivery_attempt_operator_insert ON delivery_attempt FOR INSERT TO notifier_operator
    WITH CHECK (action = 'MANUAL');
CREATE POLICY delivery_task_operator_update ON delivery_task FOR UPDATE TO notifier_operator
    USING (needs_review)
    WITH CHECK (NOT needs_review AND state IN ('SENT', 'FAILED'));
DROP FUNCTION notifier_resolve(bigint, text, text, text, text);
DROP TRIGGER delivery_attempt_fits_update ON delivery_attempt;
DROP TRIGGER delivery_attempt_fits_insert ON delivery_attempt;
DROP FUNCTION delivery_attempt_fits();
DROP TRIGGER delivery_task_evidence ON delivery_task;
DROP FUNCTION delivery_task_evidence();
DROP TRIGGER delivery_task_state_machine ON delivery_task;
DROP FUNCTION delivery_task_state_machine();
ALTER TABLE delivery_task DROP CONSTRAINT delivery_task_unknown_is_uncertain;
