-- Stored responses and completion rows often exceed 1 KB. In a WITHOUT ROWID
-- table anything above about a quarter page spills into overflow pages, which
-- tripled the file size (measured: 17 KB per completed task); rowid tables keep
-- such rows in their leaf pages. The keys stay unique through an index.

CREATE TABLE request_ids_by_rowid (
    workspace_id TEXT    NOT NULL,
    request_id   TEXT    NOT NULL,
    fingerprint  BLOB    NOT NULL,
    response     BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    UNIQUE (workspace_id, request_id)
);
INSERT INTO request_ids_by_rowid (workspace_id, request_id, fingerprint, response, created_at)
    SELECT workspace_id, request_id, fingerprint, response, created_at FROM request_ids;
DROP TABLE request_ids;
ALTER TABLE request_ids_by_rowid RENAME TO request_ids;

CREATE TABLE task_completions_by_rowid (
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
    UNIQUE (workspace_id, task_id, generation)
);
INSERT INTO task_completions_by_rowid SELECT
    workspace_id, task_id, generation, completion_id, identity, payload, outcome, result, run_id, state_version,
    checkpoint, decision, committed_at, settlement, settle_attempts, next_settle_at, lifecycle_revision,
    lifecycle_event_sequence, settled_at, error_reason, error_message
    FROM task_completions;
DROP TABLE task_completions;
ALTER TABLE task_completions_by_rowid RENAME TO task_completions;
CREATE INDEX task_completions_pending ON task_completions (next_settle_at) WHERE settlement = 'PENDING';
CREATE INDEX task_completions_by_commit ON task_completions (workspace_id, committed_at, completion_id);

-- Runs carry notes of up to 2000 characters.
CREATE TABLE agent_runs_by_rowid (
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
    UNIQUE (workspace_id, run_id),
    CHECK ((finished_at IS NULL) = (outcome IS NULL))
);
INSERT INTO agent_runs_by_rowid SELECT
    workspace_id, run_id, task_id, agent_id, generation, epoch, claimed_at, lease_expires_at, finished_at, outcome,
    tokens_input, tokens_output, tokens_total, notes, notes_truncated, error, final_status
    FROM agent_runs;
DROP TABLE agent_runs;
ALTER TABLE agent_runs_by_rowid RENAME TO agent_runs;
CREATE INDEX agent_runs_by_task ON agent_runs (workspace_id, task_id, claimed_at);
CREATE INDEX agent_runs_open_by_expiry ON agent_runs (lease_expires_at) WHERE finished_at IS NULL;

-- Transcript events carry messages and tool output of up to 1 MiB.
CREATE TABLE transcript_events_by_rowid (
    workspace_id TEXT    NOT NULL,
    task_id      TEXT    NOT NULL,
    sequence     INTEGER NOT NULL CHECK (sequence >= 1),
    generation   INTEGER NOT NULL CHECK (generation >= 1),
    kind         TEXT    NOT NULL,
    ref          TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    body         TEXT    NOT NULL,
    is_error     INTEGER NOT NULL,
    reason       TEXT,
    synthetic    INTEGER NOT NULL,
    recorded_at  INTEGER NOT NULL,
    UNIQUE (workspace_id, task_id, sequence)
);
INSERT INTO transcript_events_by_rowid SELECT
    workspace_id, task_id, sequence, generation, kind, ref, name, body, is_error, reason, synthetic, recorded_at
    FROM transcript_events;
DROP TABLE transcript_events;
ALTER TABLE transcript_events_by_rowid RENAME TO transcript_events;
CREATE TRIGGER transcript_events_immutable_update BEFORE UPDATE ON transcript_events
BEGIN SELECT RAISE(ABORT, 'transcript events are immutable'); END;
CREATE TRIGGER transcript_events_immutable_delete BEFORE DELETE ON transcript_events
BEGIN SELECT RAISE(ABORT, 'transcript events are immutable'); END;

CREATE TABLE transcript_staging_by_rowid (
    import_id    TEXT    NOT NULL,
    sequence     INTEGER NOT NULL,
    generation   INTEGER NOT NULL,
    kind         TEXT    NOT NULL,
    ref          TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    body         TEXT    NOT NULL,
    is_error     INTEGER NOT NULL,
    reason       TEXT,
    synthetic    INTEGER NOT NULL,
    recorded_at  INTEGER NOT NULL,
    UNIQUE (import_id, sequence)
);
DROP TABLE transcript_staging;
ALTER TABLE transcript_staging_by_rowid RENAME TO transcript_staging;
