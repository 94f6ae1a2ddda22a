"""Request ids on PostgreSQL: held by a transaction advisory lock from their recall to the commit."""

from __future__ import annotations

from completion_service.storage.postgres.session import REQUEST_ID_LOCKS, PostgresSession, lock_key
from completion_service.storage.sqlite.requests import SqliteRequestIds


class PostgresRequestIds(SqliteRequestIds):
    def __init__(self, session: PostgresSession) -> None:
        super().__init__(session)
        self._pg = session

    def recall(self, workspace_id: str, caller: str, method: str, request_id: str) -> tuple[bytes, bytes] | None:
        if self._pg.writable:
            # Held until this transaction ends; the SELECT that follows runs after the
            # wait, so it sees what a concurrent transaction with this id committed.
            self._pg.db.execute(
                "SELECT pg_advisory_xact_lock(?, ?)",
                (REQUEST_ID_LOCKS, lock_key(workspace_id, caller, method, request_id)),
            )
        found = super().recall(workspace_id, caller, method, request_id)
        return (bytes(found[0]), bytes(found[1])) if found else None
