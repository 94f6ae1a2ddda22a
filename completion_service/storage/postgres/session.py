"""The PostgreSQL session: the SQLite session's hooks (storage/sqlite/session.py)
as this engine needs them, and the task lock every write of a task's state holds
(see the package's docstring)."""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg

from completion_service.core.model import Decision, decision_to_json
from completion_service.storage.sqlite.session import Session
from funnel.runtime.postgres import HORIZON, OWN_POSITION, SCHEMA_BYTES, SqliteStyle, task_number

# The first keys of the two-key advisory locks (the second is a hash of what is
# locked). Two-key locks never collide with one-key ones (the engine's migration
# lock), nor with the lifecycle service's ("lic") when both share a database.
TASK_LOCKS = 0x636D74  # "cmt"
REQUEST_ID_LOCKS = 0x636D72  # "cmr"
# The number of a task's next event, computed in its INSERT: no round trip of its own.
_EVENT_NUMBER = task_number("completion_events")


class PostgresSession(Session):
    """A psycopg connection in a transaction, `writable` or read-only; `instance`
    qualifies the staged imports of the store that opened it."""

    def __init__(self, conn: psycopg.Connection[Any], *, writable: bool, instance: str = "") -> None:
        super().__init__(SqliteStyle(conn))
        self.writable = writable
        self.instance = instance
        self._locked_tasks: set[tuple[str, str]] = set()
        self._ordinal = 0  # rows this transaction has numbered

    def locking(self) -> str:
        return " FOR UPDATE" if self.writable else ""

    def skip_locked(self) -> str:
        return " FOR UPDATE SKIP LOCKED" if self.writable else ""

    def lock_task(self, workspace_id: str, task_id: str) -> None:
        if not self.writable or (workspace_id, task_id) in self._locked_tasks:
            return
        self.db.execute("SELECT pg_advisory_xact_lock(?, ?)", (TASK_LOCKS, lock_key(workspace_id, task_id)))
        self._locked_tasks.add((workspace_id, task_id))

    def try_lock_task(self, workspace_id: str, task_id: str) -> bool:
        """Takes the task's lock if no other transaction holds it; never waits."""
        if (workspace_id, task_id) not in self._locked_tasks:
            (taken,) = self.db.execute(
                "SELECT pg_try_advisory_xact_lock(?, ?)", (TASK_LOCKS, lock_key(workspace_id, task_id))
            ).fetchone()
            if not taken:
                return False
            self._locked_tasks.add((workspace_id, task_id))
        return True

    def number(self, log: str, workspace_id: str, task_id: str) -> tuple[str, tuple[object, ...]]:
        # The transaction's own position plus an ordinal (funnel.runtime.postgres);
        # an event also above the task's last (task_number), under the task's lock.
        ordinal = self._ordinal
        self._ordinal += 1
        if log != "completion_events":
            return f"{OWN_POSITION} + ?", (ordinal,)
        self.lock_task(workspace_id, task_id)
        return _EVENT_NUMBER, (ordinal, workspace_id, task_id)

    def deliverable(self, column: str) -> str:
        return f" AND {column} < {HORIZON}"

    def put_text(self, text: str | None) -> object:
        return None if text is None else text.encode("utf-8")

    def get_text(self, stored: Any) -> Any:
        return None if stored is None else bytes(stored).decode("utf-8")

    def put_decision(self, decision: Decision) -> object:
        # The column is JSON text; the server compresses large values itself (TOAST).
        return decision_to_json(decision)

    def database_bytes(self) -> int | None:
        (size,) = self.db.execute(SCHEMA_BYTES).fetchone()
        return int(size)


def lock_key(*scope: str) -> int:
    """A signed 32-bit hash of what is locked (a collision only makes two writers wait for each other)."""
    digest = hashlib.blake2b("\x1f".join(scope).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)
