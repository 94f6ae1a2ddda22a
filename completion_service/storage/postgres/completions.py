"""The settlement outbox on PostgreSQL: claimed with FOR UPDATE SKIP LOCKED and a lease."""

from __future__ import annotations

from completion_service.core.model import CompletionRecord
from completion_service.storage.sqlite import rows
from completion_service.storage.sqlite.completions import SqliteCompletions
from completion_service.storage.sqlite.rows import COMPLETION_COLUMNS


class PostgresCompletions(SqliteCompletions):
    def claim_due(self, now: int, owner: str, lease_micros: int, limit: int) -> list[CompletionRecord]:
        # Rows locked by another transaction are skipped, not waited for; a claim
        # lasts until its lease runs out, and its owner may take its rows again.
        columns = ", ".join(f"c.{column}" for column in COMPLETION_COLUMNS.split(", "))
        found = self._s.db.execute(
            "WITH due AS ("
            " SELECT workspace_id, task_id, generation FROM task_completions"
            " WHERE settlement = 'PENDING' AND next_settle_at <= ?"
            " AND (claimed_by IS NULL OR claimed_by = ? OR claimed_until <= ?)"
            " ORDER BY next_settle_at LIMIT ? FOR UPDATE SKIP LOCKED)"
            " UPDATE task_completions AS c SET claimed_by = ?, claimed_until = ? FROM due"
            " WHERE (c.workspace_id, c.task_id, c.generation) = (due.workspace_id, due.task_id, due.generation)"
            f" RETURNING c.next_settle_at, {columns}",
            (now, owner, now, limit, owner, now + lease_micros),
        ).fetchall()
        found.sort(key=lambda r: (r[0], r[1], r[2], r[3]))
        return [rows.completion(self._s, r[1:]) for r in found]
