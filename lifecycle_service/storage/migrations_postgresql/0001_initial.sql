-- The lifecycle schema on PostgreSQL: the end state of the SQLite migrations
-- 0001-0004, plus what several replicas on one database need (an event sequence
-- counter, event notifications, claims on pending propagations). Applied in the
-- schema `funnel_lifecycle` (the connection's search_path).
--
-- Keys and ids compare byte by byte (COLLATE "C"), as in SQLite: listings page
-- in the same order on both engines. Free text a caller sends (cause source and
-- reason) is stored as UTF-8 in BYTEA: it may contain U+0000, which TEXT cannot.

CREATE TABLE tasks (
    workspace_id              TEXT COLLATE "C" NOT NULL,
    task_id                   TEXT COLLATE "C" NOT NULL,
    generation                BIGINT NOT NULL CHECK (generation >= 1),
    revision                  BIGINT NOT NULL CHECK (revision >= 1),
    state                     TEXT   NOT NULL CHECK (state IN ('REGISTERED', 'ACTIVE', 'SUSPENDED', 'TERMINAL')),
    outcome                   TEXT   CHECK (outcome IN ('COMPLETED', 'CANCELLED', 'FAILED', 'TIMED_OUT')),
    cancellation_requested_at BIGINT,
    work_status               TEXT   NOT NULL,
    parent_task_id            TEXT COLLATE "C",
    parent_generation         BIGINT,
    parent_mode               TEXT   CHECK (parent_mode IN ('ATTACHED', 'DETACHED')),
    completion_id             TEXT,
    created_at                BIGINT NOT NULL,
    updated_at                BIGINT NOT NULL,
    PRIMARY KEY (workspace_id, task_id),
    CHECK ((state = 'TERMINAL') = (outcome IS NOT NULL)),
    CHECK ((outcome = 'COMPLETED') = (completion_id IS NOT NULL))
);

-- Open attached children of a parent generation, in task id order.
CREATE INDEX tasks_by_parent ON tasks (workspace_id, parent_task_id, parent_generation, task_id)
    WHERE parent_task_id IS NOT NULL;

CREATE TABLE lifecycle_events (
    -- Assigned from lifecycle_event_sequence inside the writing transaction.
    sequence                  BIGINT PRIMARY KEY CHECK (sequence >= 1),
    workspace_id              TEXT COLLATE "C" NOT NULL,
    task_id                   TEXT COLLATE "C" NOT NULL,
    generation                BIGINT NOT NULL,
    revision                  BIGINT NOT NULL,
    intent                    TEXT   NOT NULL,
    from_state                TEXT,
    to_state                  TEXT   NOT NULL,
    outcome                   TEXT,
    cancellation_requested_at BIGINT,
    work_status               TEXT   NOT NULL,
    cause_source              BYTEA  NOT NULL,  -- UTF-8
    cause_reason              BYTEA  NOT NULL,  -- UTF-8
    cause_originating_ids     TEXT   NOT NULL,  -- JSON object (control characters escaped)
    completion_id             TEXT,
    authoritative_at          BIGINT,
    committed_at              BIGINT NOT NULL,
    request_id                TEXT,
    caller_subject            TEXT   NOT NULL DEFAULT '',
    caller_role               TEXT   NOT NULL DEFAULT '',
    UNIQUE (workspace_id, task_id, revision)
);

CREATE INDEX lifecycle_events_by_workspace ON lifecycle_events (workspace_id, sequence);
-- One task's history in commit order.
CREATE INDEX lifecycle_events_by_task ON lifecycle_events (workspace_id, task_id, sequence);

-- The last event sequence handed out. A writing transaction takes the next one
-- with `UPDATE … SET value = value + 1 RETURNING value`: the row lock it holds
-- until it commits makes the next writer wait, so sequences become visible in
-- commit order and without gaps (a rolled-back transaction gives its number
-- back). A reader by cursor never skips an event that commits late.
CREATE TABLE lifecycle_event_sequence (
    single BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (single),
    value  BIGINT  NOT NULL CHECK (value >= 0)
);
INSERT INTO lifecycle_event_sequence (single, value) VALUES (TRUE, 0);

-- Events are history: they are never updated or deleted.
CREATE FUNCTION lifecycle_events_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'lifecycle events are immutable';
END;
$$;
CREATE TRIGGER lifecycle_events_immutable BEFORE UPDATE OR DELETE ON lifecycle_events
    FOR EACH ROW EXECUTE FUNCTION lifecycle_events_immutable();
CREATE TRIGGER lifecycle_events_not_truncated BEFORE TRUNCATE ON lifecycle_events
    FOR EACH STATEMENT EXECUTE FUNCTION lifecycle_events_immutable();

-- Every replica's event tailer listens: a committed event wakes them all (the
-- notification is sent at commit; the table by cursor stays the truth).
CREATE FUNCTION lifecycle_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('funnel_lifecycle_events', NEW.sequence::text);
    RETURN NULL;
END;
$$;
CREATE TRIGGER lifecycle_events_notify AFTER INSERT ON lifecycle_events
    FOR EACH ROW EXECUTE FUNCTION lifecycle_events_notify();

-- Request ids are scoped to the caller and the RPC; swept by age.
CREATE TABLE request_ids (
    workspace_id TEXT   NOT NULL,
    caller       TEXT   NOT NULL,
    method       TEXT   NOT NULL,
    request_id   TEXT   NOT NULL,
    fingerprint  BYTEA  NOT NULL,
    response     BYTEA  NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (workspace_id, caller, method, request_id)
);
CREATE INDEX request_ids_by_age ON request_ids (created_at);

-- What a parent's committed transition owes its attached children. A replica
-- claims rows for a lease (claimed_by, claimed_until) with FOR UPDATE SKIP
-- LOCKED; applying one deletes it in the child's transaction.
CREATE TABLE pending_propagations (
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id      TEXT   NOT NULL,
    parent_task_id    TEXT   NOT NULL,
    parent_generation BIGINT NOT NULL,
    parent_sequence   BIGINT NOT NULL REFERENCES lifecycle_events (sequence),
    child_task_id     TEXT   NOT NULL,
    child_generation  BIGINT NOT NULL,
    intent            TEXT   NOT NULL,
    created_at        BIGINT NOT NULL,
    claimed_by        TEXT,
    claimed_until     BIGINT,
    CHECK ((claimed_by IS NULL) = (claimed_until IS NULL))
);
