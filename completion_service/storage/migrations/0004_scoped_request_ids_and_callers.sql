-- Request ids are scoped to the caller and the RPC (issue 9) and kept for a
-- retention period, swept by age. Ids remembered before this migration had no
-- caller; they are dropped (a retry across the upgrade is applied as new).
DROP TABLE request_ids;
CREATE TABLE request_ids (
    workspace_id TEXT    NOT NULL,
    caller       TEXT    NOT NULL,
    method       TEXT    NOT NULL,
    request_id   TEXT    NOT NULL,
    fingerprint  BLOB    NOT NULL,
    response     BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    UNIQUE (workspace_id, caller, method, request_id)
);
CREATE INDEX request_ids_by_age ON request_ids (created_at);

-- Every audit row records the authenticated caller that closed the run.
ALTER TABLE audit_log ADD COLUMN caller_subject TEXT NOT NULL DEFAULT '';
ALTER TABLE audit_log ADD COLUMN caller_role TEXT NOT NULL DEFAULT '';
