-- Stored responses can exceed 1 KB (a task and its event with long causes). In a
-- WITHOUT ROWID table anything above about a quarter page spills into overflow
-- pages; a rowid table keeps such rows in its leaf pages. The key stays unique
-- through an index.

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
