-- Runs and leases, evidence, completion attempts, the durable task_completions
-- record with its settlement outbox, the completion event history and the audit log.

CREATE TABLE task_leases (
    workspace_id TEXT    NOT NULL,
    task_id      TEXT    NOT NULL,
    run_id       TEXT    NOT NULL,
    epoch        INTEGER NOT NULL CHECK (epoch >= 1),
    expires_at   INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, task_id)
) WITHOUT ROWID;

CREATE TABLE agent_runs (
    workspace_id     TEXT    NOT NULL,
    run_id           TEXT    NOT NULL,
    task_id          TEXT    NOT NULL,
    agent_id         TEXT    NOT NULL,
    generation       INTEGER NOT NULL,
    epoch            INTEGER NOT NULL,
    claimed_at       INTEGER NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    finished_at      INTEGER,
    outcome          TEXT CHECK (outcome IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'STALLED')),
    tokens_input     INTEGER,
    tokens_output    INTEGER,
    tokens_total     INTEGER,
    notes            TEXT,
    notes_truncated  INTEGER NOT NULL DEFAULT 0,
    error            TEXT,
    final_status     TEXT,
    PRIMARY KEY (workspace_id, run_id),
    CHECK ((finished_at IS NULL) = (outcome IS NULL))
) WITHOUT ROWID;

CREATE INDEX agent_runs_by_task ON agent_runs (workspace_id, task_id, claimed_at);
CREATE INDEX agent_runs_open_by_expiry ON agent_runs (lease_expires_at) WHERE finished_at IS NULL;

CREATE TABLE evidence (
    sequence     INTEGER PRIMARY KEY AUTOINCREMENT,
    evidence_id  TEXT    NOT NULL UNIQUE,
    workspace_id TEXT    NOT NULL,
    task_id      TEXT    NOT NULL,
    generation   INTEGER NOT NULL,
    kind         TEXT    NOT NULL,
    passed       INTEGER NOT NULL CHECK (passed IN (0, 1)),
    checkpoint   TEXT    NOT NULL,
    details      TEXT    NOT NULL,
    run_id       TEXT,
    recorded_at  INTEGER NOT NULL
);

CREATE INDEX evidence_by_task ON evidence (workspace_id, task_id, generation);

CREATE TABLE completion_attempts (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace_id   TEXT    NOT NULL,
    task_id        TEXT    NOT NULL,
    generation     INTEGER NOT NULL,
    run_id         TEXT    NOT NULL,
    checkpoint     TEXT    NOT NULL,
    result_digest  TEXT    NOT NULL,
    verdict        TEXT    NOT NULL,
    state_version  INTEGER NOT NULL,
    attempted_at   INTEGER NOT NULL
);

CREATE INDEX completion_attempts_by_task ON completion_attempts (workspace_id, task_id, generation);

CREATE TABLE task_completions (
    workspace_id             TEXT    NOT NULL,
    task_id                  TEXT    NOT NULL,
    generation               INTEGER NOT NULL,
    completion_id            TEXT    NOT NULL UNIQUE,
    identity                 TEXT    NOT NULL,
    payload                  BLOB    NOT NULL,
    outcome                  TEXT    NOT NULL CHECK (outcome IN ('COMPLETED', 'FAILED')),
    result                   TEXT    NOT NULL,
    run_id                   TEXT    NOT NULL,
    state_version            INTEGER NOT NULL,
    checkpoint               TEXT    NOT NULL,
    decision                 TEXT    NOT NULL,  -- JSON
    committed_at             INTEGER NOT NULL,
    settlement               TEXT    NOT NULL CHECK (settlement IN ('PENDING', 'SETTLED', 'REJECTED')),
    settle_attempts          INTEGER NOT NULL DEFAULT 0,
    next_settle_at           INTEGER NOT NULL,
    lifecycle_revision       INTEGER,
    lifecycle_event_sequence INTEGER,
    settled_at               INTEGER,
    error_reason             TEXT,
    error_message            TEXT,
    PRIMARY KEY (workspace_id, task_id, generation)
) WITHOUT ROWID;

CREATE INDEX task_completions_pending ON task_completions (next_settle_at) WHERE settlement = 'PENDING';

CREATE TABLE completion_events (
    sequence                 INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace_id             TEXT    NOT NULL,
    task_id                  TEXT    NOT NULL,
    generation               INTEGER NOT NULL,
    kind                     TEXT    NOT NULL,
    run_id                   TEXT    NOT NULL,
    completion_id            TEXT,
    outcome                  TEXT,
    decision                 TEXT,      -- JSON
    lifecycle_revision       INTEGER,
    lifecycle_event_sequence INTEGER,
    error_reason             TEXT,
    error_message            TEXT,
    committed_at             INTEGER NOT NULL
);

CREATE INDEX completion_events_by_workspace ON completion_events (workspace_id, sequence);
CREATE INDEX completion_events_by_task ON completion_events (workspace_id, task_id, sequence);
-- At most one terminal event per completion, whatever races happen.
CREATE UNIQUE INDEX completion_events_one_terminal ON completion_events (completion_id)
    WHERE kind IN ('COMPLETION_SETTLED', 'TERMINALIZATION_ERROR');

CREATE TRIGGER completion_events_immutable_update BEFORE UPDATE ON completion_events
BEGIN SELECT RAISE(ABORT, 'completion events are immutable'); END;
CREATE TRIGGER completion_events_immutable_delete BEFORE DELETE ON completion_events
BEGIN SELECT RAISE(ABORT, 'completion events are immutable'); END;

CREATE TABLE audit_log (
    audit_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace_id TEXT    NOT NULL,
    action       TEXT    NOT NULL,
    run_id       TEXT    NOT NULL,
    task_id      TEXT    NOT NULL,
    metadata     TEXT    NOT NULL,  -- JSON object
    recorded_at  INTEGER NOT NULL
);

CREATE INDEX audit_log_by_workspace ON audit_log (workspace_id, audit_id);

CREATE TABLE request_ids (
    workspace_id TEXT    NOT NULL,
    request_id   TEXT    NOT NULL,
    fingerprint  BLOB    NOT NULL,
    response     BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, request_id)
) WITHOUT ROWID;

-- The transcript's version and open work, kept current with every append.
CREATE TABLE transcript_tails (
    workspace_id  TEXT    NOT NULL,
    task_id       TEXT    NOT NULL,
    state_version INTEGER NOT NULL,
    open_turn     TEXT,
    open_step     TEXT,
    open_calls    TEXT    NOT NULL DEFAULT '[]',  -- JSON array of call ids
    checkpoint    TEXT    NOT NULL DEFAULT '',
    PRIMARY KEY (workspace_id, task_id)
) WITHOUT ROWID;
