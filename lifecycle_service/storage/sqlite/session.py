"""One transaction's connection and the hooks where the engines differ: the
PostgreSQL adapter runs the same statements over a psycopg connection in
`funnel.runtime.postgres.SqliteStyle`, with a `Session` of its own
(storage/postgres/session.py) that overrides only these hooks: row locks
(`task_lock`, `parent_lock`), the planner's hint (`tasks_by_parent`), which
events a reader by cursor may see yet (`deliverable`), how caller free text is
kept (`put_text`, `get_text`), and the size on disk."""

from __future__ import annotations

import sqlite3
from typing import Any, Protocol

from funnel.runtime.sqlite import database_bytes


class Connection(Protocol):
    """What the row mapping needs of a connection: `sqlite3.Connection`, or a
    psycopg connection in `funnel.runtime.postgres.SqliteStyle`."""

    def execute(self, sql: str, params: Any = (), /) -> Any: ...

    def executemany(self, sql: str, rows: Any, /) -> Any: ...


class Session:
    """A connection already in a transaction, shared by the transaction's aggregates."""

    # INDEXED BY: without statistics SQLite's planner prefers walking the whole
    # workspace by primary key (measured: 30% of the service's CPU at 6k tasks).
    tasks_by_parent = "tasks INDEXED BY tasks_by_parent"

    def __init__(self, db: sqlite3.Connection | Connection) -> None:
        self.db: Connection = db

    def task_lock(self) -> str:
        """The clause that holds the record of the task a unit changes for the rest
        of a write transaction; none here: BEGIN IMMEDIATE holds the database's
        write lock already."""
        return ""

    def parent_lock(self) -> str:
        """The clause that keeps the record of a task a unit depends on (its parent)
        from changing for the rest of a write transaction; none here, as above."""
        return ""

    def deliverable(self, column: str) -> str:
        """The condition (` AND …`) a read by cursor across tasks adds so that it
        returns no event a later commit could still number below; none here: the
        writer holds the database's write lock to its commit, so events are
        numbered in commit order."""
        return ""

    def put_text(self, text: str) -> object:
        """A caller's free text (an event's cause source and reason), as stored."""
        return text

    def get_text(self, stored: Any) -> Any:
        """Free text as `put_text` stored it."""
        return stored

    def database_bytes(self) -> int | None:
        """Bytes the database takes on disk."""
        return database_bytes(self.db)
