-- Completion event sequences and audit ids are numbered from the writing
-- transaction's id, and readers by cursor deliver only below the horizon of the
-- transactions still running (funnel.runtime.postgres, docs/architecture.md
-- "Numbers on PostgreSQL"): the counter rows, whose lock made every writer wait
-- for the previous one's commit, go. A replica of an earlier release still
-- numbering from them now fails its writes instead of numbering below the
-- horizon: stop those before this migration runs.
--
-- Every new number is above every old one: a transaction's position is its id
-- times 65,536, and the old numbers count rows, fewer than 65,536 for each
-- transaction that wrote them.
DROP TABLE completion_event_sequence;
DROP TABLE audit_sequence;

-- The notification moves out of the writing transaction (PostgresDatabase.
-- notify_forever): a NOTIFY there takes the database's notification lock at
-- commit and holds it through the commit's flush, one notifying commit at a time.
DROP TRIGGER completion_events_notify ON completion_events;
DROP FUNCTION completion_events_notify();

COMMENT ON COLUMN completion_events.sequence IS
    'pg_current_xact_id() << 16 plus an ordinal, above the task''s last; read across tasks only below the horizon';
COMMENT ON COLUMN audit_log.audit_id IS
    'pg_current_xact_id() << 16 plus an ordinal; read only below the horizon';
