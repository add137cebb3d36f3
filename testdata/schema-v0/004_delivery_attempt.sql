-- migrate:up
-- One row per attempt: every channel call, every claim-time decision not to call, every manual resolution.
-- outcome is what this attempt observed, written once; an observation that arrives after the attempt was
-- superseded goes to late_outcome and never overwrites outcome.
CREATE TABLE delivery_attempt (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id         bigint      NOT NULL REFERENCES delivery_task (id),
    attempt_no      integer     NOT NULL CHECK (attempt_no >= 1),
    attempt_token   uuid        NOT NULL,
    action          text        NOT NULL CHECK (action IN ('SEND', 'QUERY', 'SKIP', 'MANUAL')),
    worker          text        NOT NULL CHECK (worker <> '' AND length(worker) <= 200),
    started_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    outcome         text        CHECK (outcome IN (
                        'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
                        'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
                        'REJECTED', 'LEASE_EXPIRED',
                        'PREF_DISABLED', 'TTL_EXPIRED', 'PREF_DISABLED_UNCERTAIN', 'TTL_EXPIRED_UNCERTAIN',
                        'MANUAL_SENT', 'MANUAL_FAILED')),
    provider_msg_id text        CHECK (length(provider_msg_id) <= 500),
    error           text        CHECK (length(error) <= 2000),
    late_outcome    text        CHECK (late_outcome IN (
                        'ACCEPTED', 'ACCEPTED_REPLAY', 'QUERY_FOUND', 'QUERY_NOT_FOUND', 'QUERY_FAILED',
                        'TIMEOUT', 'IO_ERROR', 'IN_FLIGHT', 'MALFORMED_RESPONSE', 'HTTP_5XX', 'THROTTLED', 'CONNECT_FAILED',
                        'REJECTED')),
    late_at         timestamptz,
    note            text        CHECK (length(note) <= 2000),
    CONSTRAINT delivery_attempt_attempt_token_key UNIQUE (attempt_token),
    CONSTRAINT delivery_attempt_task_attempt_no_key UNIQUE (task_id, attempt_no),
    CONSTRAINT delivery_attempt_finished_iff_outcome CHECK ((outcome IS NULL) = (finished_at IS NULL)),
    CONSTRAINT delivery_attempt_late_has_time CHECK ((late_outcome IS NULL) = (late_at IS NULL)),
    CONSTRAINT delivery_attempt_manual_has_note CHECK (action <> 'MANUAL' OR (note IS NOT NULL AND note <> ''))
);

-- migrate:down
DROP TABLE delivery_attempt;
