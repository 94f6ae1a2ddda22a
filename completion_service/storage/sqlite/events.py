"""The two append-only logs read by cursor: completion events and the audit log
(port `Events`). Both are numbered in their INSERT (Session.number) and read
below the horizon where an engine numbers rows out of commit order
(Session.deliverable); neither is ever changed."""

from __future__ import annotations

import dataclasses

from completion_service.core.model import AuditEntry, CompletionEvent
from completion_service.storage.sqlite import rows
from completion_service.storage.sqlite.rows import AUDIT_COLUMNS, EVENT_COLUMNS
from completion_service.storage.sqlite.session import Session


class SqliteEvents:
    def __init__(self, session: Session) -> None:
        self._s = session

    def append(self, event: CompletionEvent) -> CompletionEvent:
        number, numbering = self._s.number("completion_events", event.workspace_id, event.task_id)
        row = self._s.db.execute(
            f"INSERT INTO completion_events ({EVENT_COLUMNS}) VALUES ({number}, {', '.join('?' * 15)}) "
            "RETURNING sequence",
            (*numbering, *rows.event_values(self._s, event)),
        ).fetchone()
        return dataclasses.replace(event, sequence=row[0])

    def page(self, workspace_id: str, after_sequence: int, task_id: str | None, limit: int) -> list[CompletionEvent]:
        if task_id:
            # Nothing to hold back: a task's events are numbered under its lock, each
            # above the task's last (see Session.number), so in its commit order.
            sql = (
                f"SELECT {EVENT_COLUMNS} FROM completion_events "
                "WHERE workspace_id = ? AND task_id = ? AND sequence > ? ORDER BY sequence LIMIT ?"
            )
            params: tuple[object, ...] = (workspace_id, task_id, after_sequence, limit)
        else:
            sql = (
                f"SELECT {EVENT_COLUMNS} FROM completion_events WHERE workspace_id = ? AND sequence > ?"
                f"{self._s.deliverable('sequence')} ORDER BY sequence LIMIT ?"
            )
            params = (workspace_id, after_sequence, limit)
        return [rows.event(self._s, r) for r in self._s.db.execute(sql, params)]

    def append_audit(self, entry: AuditEntry) -> None:
        number, numbering = self._s.number("audit_log", entry.workspace_id, entry.task_id)
        self._s.db.execute(
            f"INSERT INTO audit_log ({AUDIT_COLUMNS}) VALUES ({number}, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*numbering, *rows.audit_values(entry)),
        )

    def audit_page(
        self, workspace_id: str, task_id: str | None, run_id: str | None, after_id: int, limit: int
    ) -> list[AuditEntry]:
        sql = (
            f"SELECT {AUDIT_COLUMNS} FROM audit_log WHERE workspace_id = ? AND audit_id > ?"
            f"{self._s.deliverable('audit_id')}"
        )
        params: list[object] = [workspace_id, after_id]
        if task_id:
            sql += " AND task_id = ?"
            params.append(task_id)
        if run_id:
            sql += " AND run_id = ?"
            params.append(run_id)
        sql += " ORDER BY audit_id LIMIT ?"
        params.append(limit)
        return [rows.audit(r) for r in self._s.db.execute(sql, params)]
