-- Lifecycle records, their immutable event history, remembered request ids and
-- the propagations parents owe their attached children.

CREATE TABLE tasks (
    workspace_id              TEXT    NOT NULL,
    task_id                   TEXT    NOT NULL,
    generation                INTEGER NOT NULL CHECK (generation >= 1),
    revision                  INTEGER NOT NULL CHECK (revision >= 1),
    state                     TEXT    NOT NULL CHECK (state IN ('REGISTERED', 'ACTIVE', 'SUSPENDED', 'TERMINAL')),
    outcome                   TEXT    CHECK (outcome IN ('COMPLETED', 'CANCELLED', 'FAILED', 'TIMED_OUT')),
    cancellation_requested_at INTEGER,
    work_status               TEXT    NOT NULL,
    parent_task_id            TEXT,
    parent_generation         INTEGER,
    parent_mode               TEXT    CHECK (parent_mode IN ('ATTACHED', 'DETACHED')),
    completion_id             TEXT,
    created_at                INTEGER NOT NULL,
    updated_at                INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, task_id),
    CHECK ((state = 'TERMINAL') = (outcome IS NOT NULL)),
    CHECK ((outcome = 'COMPLETED') = (completion_id IS NOT NULL))
) WITHOUT ROWID;

CREATE INDEX tasks_by_parent ON tasks (workspace_id, parent_task_id, parent_generation)
    WHERE parent_task_id IS NOT NULL;

CREATE TABLE lifecycle_events (
    sequence                  INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace_id              TEXT    NOT NULL,
    task_id                   TEXT    NOT NULL,
    generation                INTEGER NOT NULL,
    revision                  INTEGER NOT NULL,
    intent                    TEXT    NOT NULL,
    from_state                TEXT,
    to_state                  TEXT    NOT NULL,
    outcome                   TEXT,
    cancellation_requested_at INTEGER,
    work_status               TEXT    NOT NULL,
    cause_source              TEXT    NOT NULL,
    cause_reason              TEXT    NOT NULL,
    cause_originating_ids     TEXT    NOT NULL,  -- JSON object
    completion_id             TEXT,
    authoritative_at          INTEGER,
    committed_at              INTEGER NOT NULL,
    request_id                TEXT,
    UNIQUE (workspace_id, task_id, revision)
);

CREATE INDEX lifecycle_events_by_workspace ON lifecycle_events (workspace_id, sequence);

-- Events are history: they are never updated or deleted.
CREATE TRIGGER lifecycle_events_immutable_update BEFORE UPDATE ON lifecycle_events
BEGIN SELECT RAISE(ABORT, 'lifecycle events are immutable'); END;
CREATE TRIGGER lifecycle_events_immutable_delete BEFORE DELETE ON lifecycle_events
BEGIN SELECT RAISE(ABORT, 'lifecycle events are immutable'); END;

CREATE TABLE request_ids (
    workspace_id TEXT    NOT NULL,
    request_id   TEXT    NOT NULL,
    fingerprint  BLOB    NOT NULL,
    response     BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, request_id)
) WITHOUT ROWID;

CREATE TABLE pending_propagations (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace_id      TEXT    NOT NULL,
    parent_task_id    TEXT    NOT NULL,
    parent_generation INTEGER NOT NULL,
    parent_sequence   INTEGER NOT NULL REFERENCES lifecycle_events (sequence),
    child_task_id     TEXT    NOT NULL,
    child_generation  INTEGER NOT NULL,
    intent            TEXT    NOT NULL,
    created_at        INTEGER NOT NULL
);
