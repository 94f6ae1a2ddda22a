"""One transaction's connection and the hooks where the engines differ.

The SQL of the aggregates keeps to what PostgreSQL also understands (`INSERT … ON
CONFLICT`, `RETURNING`, row values, no SQLite-only functions), so the PostgreSQL
adapter runs the same statements over a psycopg connection in
`funnel.runtime.postgres.SqliteStyle`, with a `Session` of its own
(storage/postgres/session.py) that overrides only these hooks: row locks
(`locking`), the task lock (`lock_task`), claims that skip rows others hold
(`skip_locked`), where event and audit numbers come from (`number`) and which of
them a reader by cursor may see yet (`deliverable`), how caller free text and
decisions are kept (`put_text`, `get_text`, `put_decision`), and the size on disk."""

from __future__ import annotations

import sqlite3
from typing import Any, Protocol

from completion_service.core.model import Decision
from completion_service.storage import compact
from funnel.runtime.sqlite import database_bytes


class Connection(Protocol):
    """What the row mapping needs of a connection: `sqlite3.Connection`, or a
    psycopg connection in `funnel.runtime.postgres.SqliteStyle`."""

    def execute(self, sql: str, params: Any = (), /) -> Any: ...

    def executemany(self, sql: str, rows: Any, /) -> Any: ...


class Session:
    """A connection already in a transaction, shared by the transaction's aggregates."""

    def __init__(self, db: sqlite3.Connection | Connection) -> None:
        self.db: Connection = db

    def locking(self) -> str:
        """The clause that locks the rows a load returns for the rest of a write
        transaction; none here: BEGIN IMMEDIATE holds the database's write lock."""
        return ""

    def lock_task(self, workspace_id: str, task_id: str) -> None:
        """Holds the task for the rest of a write transaction, rows of it that do
        not exist yet included; taken at the first load of the task's state (lease,
        run, completion, tail, attempts, evidence) and before numbering its event.
        Nothing here: BEGIN IMMEDIATE holds the database's write lock."""

    def skip_locked(self) -> str:
        """The clause with which a claim locks the rows it selects and skips those
        another transaction holds; none here: one writer at a time."""
        return ""

    def number(self, log: str, workspace_id: str, task_id: str) -> tuple[str, tuple[object, ...]]:
        """The SQL value (and its parameters) that numbers the next row of an
        append-only log read by cursor (`completion_events`, `audit_log`) about a
        task, inside its INSERT; here NULL, which the INTEGER PRIMARY KEY replaces
        (the writer holds the database's write lock to its commit, so numbers are
        given in commit order, without gaps)."""
        return "?", (None,)

    def deliverable(self, column: str) -> str:
        """The condition (` AND …`) a read by cursor adds so that it returns no
        row a later commit could still number below; none here: numbers are
        given in commit order."""
        return ""

    def put_text(self, text: str | None) -> object:
        """Free text a caller sent (notes, errors, results, details, transcript
        text), as stored: it may hold U+0000, which SQLite's TEXT keeps."""
        return text

    def get_text(self, stored: Any) -> Any:
        """Free text as `put_text` stored it."""
        return stored

    def put_decision(self, decision: Decision) -> object:
        """A decision as stored: deflated (storage/compact.py)."""
        return compact.encode_decision(decision)

    def get_decision(self, stored: Any) -> Decision:
        return compact.decode_decision(stored)

    def database_bytes(self) -> int | None:
        """Bytes the database takes on disk."""
        return database_bytes(self.db)
