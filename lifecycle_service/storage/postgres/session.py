"""The PostgreSQL session: the SQLite session's hooks (storage/sqlite/session.py)
as this engine needs them (see the package's docstring)."""

from __future__ import annotations

from typing import Any

import psycopg

from funnel.runtime.postgres import HORIZON, SCHEMA_BYTES, SqliteStyle
from lifecycle_service.storage.sqlite.session import Session


class PostgresSession(Session):
    """A psycopg connection in a transaction, `writable` or read-only."""

    tasks_by_parent = "tasks"

    def __init__(self, conn: psycopg.Connection[Any], *, writable: bool) -> None:
        super().__init__(SqliteStyle(conn))
        self.writable = writable

    def task_lock(self) -> str:
        return " FOR UPDATE" if self.writable else ""

    def parent_lock(self) -> str:
        return " FOR SHARE" if self.writable else ""

    def deliverable(self, column: str) -> str:
        return f" AND {column} < {HORIZON}"

    def put_text(self, text: str) -> object:
        return text.encode()

    def get_text(self, stored: Any) -> Any:
        return bytes(stored).decode()

    def database_bytes(self) -> int | None:
        (size,) = self.db.execute(SCHEMA_BYTES).fetchone()
        return int(size)
