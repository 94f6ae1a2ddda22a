-- Session transcripts: the append-only event log, the checkpoints it created,
-- the position of its tail, and a staging area for streamed JSONL imports.

CREATE TABLE transcript_events (
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
    PRIMARY KEY (workspace_id, task_id, sequence)
) WITHOUT ROWID;

-- Transcripts are history: events are never changed or removed.
CREATE TRIGGER transcript_events_immutable_update BEFORE UPDATE ON transcript_events
BEGIN SELECT RAISE(ABORT, 'transcript events are immutable'); END;
CREATE TRIGGER transcript_events_immutable_delete BEFORE DELETE ON transcript_events
BEGIN SELECT RAISE(ABORT, 'transcript events are immutable'); END;

CREATE TABLE transcript_checkpoints (
    workspace_id  TEXT    NOT NULL,
    task_id       TEXT    NOT NULL,
    checkpoint_id TEXT    NOT NULL,
    sequence      INTEGER NOT NULL,  -- where the checkpoint was first created
    PRIMARY KEY (workspace_id, task_id, checkpoint_id)
) WITHOUT ROWID;

ALTER TABLE transcript_tails ADD COLUMN last_sequence INTEGER NOT NULL DEFAULT 0;

CREATE TABLE transcript_staging (
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
    PRIMARY KEY (import_id, sequence)
) WITHOUT ROWID;
