"""Request ids and their remembered responses (port `RequestIds`)."""

from __future__ import annotations

from typing import cast

from completion_service.storage.sqlite.session import Session
from funnel.runtime.idempotency import RequestKey


class SqliteRequestIds:
    def __init__(self, session: Session) -> None:
        self._s = session

    def recall(self, workspace_id: str, caller: str, method: str, request_id: str) -> tuple[bytes, bytes] | None:
        row = self._s.db.execute(
            "SELECT fingerprint, response FROM request_ids "
            "WHERE workspace_id = ? AND caller = ? AND method = ? AND request_id = ?",
            (workspace_id, caller, method, request_id),
        ).fetchone()
        return (row[0], row[1]) if row else None

    def remember(self, key: RequestKey, response: bytes, created_at: int) -> None:
        self._s.db.execute(
            "INSERT INTO request_ids (workspace_id, caller, method, request_id, fingerprint, response, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (key.workspace_id, key.caller, key.method, key.request_id, key.fingerprint, response, created_at),
        )

    def forget(self, created_before: int, limit: int) -> int:
        deleted = self._s.db.execute(
            "DELETE FROM request_ids WHERE (workspace_id, caller, method, request_id) IN "
            "(SELECT workspace_id, caller, method, request_id FROM request_ids WHERE created_at < ? "
            f"ORDER BY created_at LIMIT ?{self._s.skip_locked()})",
            (created_before, limit),
        )
        # Connection.execute answers Any (sqlite3's cursor or psycopg's); the row count of both is an int.
        return cast(int, deleted.rowcount)
