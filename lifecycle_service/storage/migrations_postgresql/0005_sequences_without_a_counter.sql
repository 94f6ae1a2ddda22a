-- Event sequences are numbered from the writing transaction's id, and readers by
-- cursor across tasks deliver only below the horizon of the transactions still
-- running (funnel.runtime.postgres, docs/architecture.md "Numbers on
-- PostgreSQL"): the counter row, whose lock made every writer wait for the
-- previous one's commit, goes. A replica of an earlier release still numbering
-- from it now fails its writes instead of numbering below the horizon: stop those
-- before this migration runs.
--
-- Every new number is above every old one: a transaction's position is its id
-- times 65,536, and the old numbers count events, fewer than 65,536 for each
-- transaction that wrote them.
DROP TABLE lifecycle_event_sequence;

-- The notification moves out of the writing transaction (PostgresDatabase.
-- notify_forever): a NOTIFY there takes the database's notification lock at
-- commit and holds it through the commit's flush, one notifying commit at a time.
DROP TRIGGER lifecycle_events_notify ON lifecycle_events;
DROP FUNCTION lifecycle_events_notify();

COMMENT ON COLUMN lifecycle_events.sequence IS
    'pg_current_xact_id() << 16 plus an ordinal, above the task''s last; read across tasks only below the horizon';
