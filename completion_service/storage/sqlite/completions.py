"""A generation's completion, its settlement outbox and the judged attempts (port `Completions`)."""

from __future__ import annotations

from completion_service.core.model import CompletionRecord, SettlementStatus
from completion_service.storage.port import AttemptRecord
from completion_service.storage.sqlite import rows
from completion_service.storage.sqlite.rows import ATTEMPT_COLUMNS, COMPLETION_COLUMNS
from completion_service.storage.sqlite.session import Session


class SqliteCompletions:
    def __init__(self, session: Session) -> None:
        self._s = session

    def load(self, workspace_id: str, task_id: str, generation: int) -> CompletionRecord | None:
        self._s.lock_task(workspace_id, task_id)
        row = self._s.db.execute(
            f"SELECT {COMPLETION_COLUMNS} FROM task_completions "
            f"WHERE workspace_id = ? AND task_id = ? AND generation = ?{self._s.locking()}",
            (workspace_id, task_id, generation),
        ).fetchone()
        return rows.completion(self._s, row) if row else None

    def page(
        self,
        workspace_id: str,
        task_id: str | None,
        settlement: SettlementStatus | None,
        after: tuple[int, str] | None,
        limit: int,
    ) -> list[CompletionRecord]:
        sql = f"SELECT {COMPLETION_COLUMNS} FROM task_completions WHERE workspace_id = ?"
        params: list[object] = [workspace_id]
        if task_id:
            sql += " AND task_id = ?"
            params.append(task_id)
        if settlement is not None:  # task_completions_by_settlement
            sql += " AND settlement = ?"
            params.append(settlement.name)
        if after is not None:
            sql += " AND (committed_at, completion_id) > (?, ?)"
            params += list(after)
        sql += " ORDER BY committed_at, completion_id LIMIT ?"
        params.append(limit)
        return [rows.completion(self._s, r) for r in self._s.db.execute(sql, params)]

    def insert(self, record: CompletionRecord) -> None:
        self._s.db.execute(
            f"INSERT INTO task_completions ({COMPLETION_COLUMNS}) VALUES ({', '.join('?' * 23)})",
            rows.completion_values(self._s, record),
        )

    def delete(self, workspace_id: str, task_id: str, generation: int) -> None:
        self._s.db.execute(
            "DELETE FROM task_completions WHERE workspace_id = ? AND task_id = ? AND generation = ?",
            (workspace_id, task_id, generation),
        )

    def update(self, record: CompletionRecord) -> None:
        self._s.db.execute(
            # next_settle_at is NOT NULL: a settled row keeps its last due time,
            # which nothing reads (see rows.completion).
            "UPDATE task_completions SET settlement = ?, settle_attempts = ?, "
            "next_settle_at = coalesce(?, next_settle_at), last_settle_error = ?, lifecycle_revision = ?, "
            "lifecycle_event_sequence = ?, settled_at = ?, error_reason = ?, error_message = ? "
            "WHERE workspace_id = ? AND task_id = ? AND generation = ?",
            (
                record.settlement.name,
                record.settle_attempts,
                record.next_settle_at,
                self._s.put_text(record.last_settle_error),
                record.lifecycle_revision,
                record.lifecycle_event_sequence,
                record.settled_at,
                record.error_reason,
                self._s.put_text(record.error_message),
                record.workspace_id,
                record.task_id,
                record.generation,
            ),
        )

    def claim_due(self, now: int, owner: str, lease_micros: int, limit: int) -> list[CompletionRecord]:
        # One process owns the file: no claim is recorded (see the port).
        found = self._s.db.execute(
            f"SELECT {COMPLETION_COLUMNS} FROM task_completions WHERE settlement = 'PENDING' AND next_settle_at <= ? "
            "ORDER BY next_settle_at LIMIT ?",
            (now, limit),
        )
        return [rows.completion(self._s, r) for r in found]

    def load_attempts(self, workspace_id: str, task_id: str, generation: int) -> list[AttemptRecord]:
        self._s.lock_task(workspace_id, task_id)
        found = self._s.db.execute(
            f"SELECT {ATTEMPT_COLUMNS} FROM completion_attempts "
            "WHERE workspace_id = ? AND task_id = ? AND generation = ? ORDER BY id",
            (workspace_id, task_id, generation),
        )
        return [rows.attempt(r) for r in found]

    def insert_attempt(self, attempt: AttemptRecord) -> None:
        self._s.db.execute(
            f"INSERT INTO completion_attempts ({ATTEMPT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows.attempt_values(attempt),
        )
