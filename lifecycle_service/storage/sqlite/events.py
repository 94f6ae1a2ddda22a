"""The immutable event history (port `Events`)."""

from __future__ import annotations

import dataclasses
from typing import cast

from funnel.auth.principal import Caller
from lifecycle_service.core.model import LifecycleEvent, TaskRecord
from lifecycle_service.storage.port import InvariantViolated
from lifecycle_service.storage.sqlite import rows
from lifecycle_service.storage.sqlite.rows import EVENT_COLUMNS, EVENT_VALUES, EVENTS
from lifecycle_service.storage.sqlite.session import Session

INSERT_EVENT = f"INSERT INTO lifecycle_events ({EVENT_VALUES}) VALUES ({', '.join(['?'] * 21)})"


class SqliteEvents:
    def __init__(self, session: Session) -> None:
        self._s = session

    def append(self, event: LifecycleEvent) -> LifecycleEvent:
        # AUTOINCREMENT: the writer holds the database's write lock until it commits.
        cursor = self._s.db.execute(INSERT_EVENT, rows.event_values(self._s, event, self._caller_id(event.caller)))
        assert cursor.lastrowid is not None, "an INSERT sets lastrowid"
        return dataclasses.replace(event, sequence=cursor.lastrowid)

    def _caller_id(self, caller: Caller) -> int:
        """The caller's number, made with its first event. Read first: after that
        first event, a caller costs one indexed lookup and no write."""
        find = "SELECT caller_id FROM callers WHERE subject = ? AND role = ?"
        row = self._s.db.execute(find, (caller.subject, caller.role)).fetchone()
        if row is None:
            # Two first events of one caller at once (replicas on PostgreSQL): the
            # second's insert waits for the first's to commit, then does nothing
            # and finds its row (or, if that rolled back, makes it).
            self._s.db.execute(
                "INSERT INTO callers (subject, role) VALUES (?, ?) ON CONFLICT (subject, role) DO NOTHING",
                (caller.subject, caller.role),
            )
            row = self._s.db.execute(find, (caller.subject, caller.role)).fetchone()
        return int(row[0])

    def history(self, workspace_id: str, task_id: str, after_revision: int, limit: int) -> list[LifecycleEvent]:
        sql = (
            f"SELECT {EVENT_COLUMNS} FROM {EVENTS} WHERE workspace_id = ? AND task_id = ? AND revision > ? "
            "ORDER BY revision LIMIT ?"
        )
        return [rows.event(self._s, r) for r in self._s.db.execute(sql, (workspace_id, task_id, after_revision, limit))]

    def page(self, workspace_id: str, after_sequence: int, task_id: str | None, limit: int) -> list[LifecycleEvent]:
        if task_id:
            sql = (
                f"SELECT {EVENT_COLUMNS} FROM {EVENTS} WHERE workspace_id = ? AND task_id = ? "
                "AND sequence > ? ORDER BY sequence LIMIT ?"
            )
            params: tuple[str | int, ...] = (workspace_id, task_id, after_sequence, limit)
        else:
            sql = (
                f"SELECT {EVENT_COLUMNS} FROM {EVENTS} WHERE workspace_id = ? AND sequence > ?"
                f"{self._s.deliverable('sequence')} ORDER BY sequence LIMIT ?"
            )
            params = (workspace_id, after_sequence, limit)
        return [rows.event(self._s, r) for r in self._s.db.execute(sql, params)]

    def terminal(self, task: TaskRecord) -> LifecycleEvent:
        row = self._s.db.execute(
            f"SELECT {EVENT_COLUMNS} FROM {EVENTS} WHERE workspace_id = ? AND task_id = ? "
            "AND generation = ? AND to_state = 'TERMINAL' ORDER BY sequence LIMIT 1",
            (task.workspace_id, task.task_id, task.generation),
        ).fetchone()
        if row is None:
            raise InvariantViolated(f"terminal task {task.task_id!r} has no terminal event")
        return rows.event(self._s, row)

    def last_sequence(self) -> int:
        return cast(int, self._s.db.execute("SELECT COALESCE(MAX(sequence), 0) FROM lifecycle_events").fetchone()[0])
