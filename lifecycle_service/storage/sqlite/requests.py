"""Request ids and their remembered responses (port `RequestIds`)."""

from __future__ import annotations

from typing import cast

from funnel.runtime.idempotency import RequestKey
from lifecycle_service.storage.sqlite.session import Session


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
        forgotten = self._s.db.execute(
            "DELETE FROM request_ids WHERE rowid IN "
            "(SELECT rowid FROM request_ids WHERE created_at < ? ORDER BY created_at LIMIT ?)",
            (created_before, limit),
        )
        return cast(int, forgotten.rowcount)
