"""Evidence facts of a task generation (port `Evidence`)."""

from __future__ import annotations

from completion_service.core.model import EvidenceRecord
from completion_service.storage.sqlite import rows
from completion_service.storage.sqlite.rows import EVIDENCE_COLUMNS
from completion_service.storage.sqlite.session import Session


class SqliteEvidence:
    def __init__(self, session: Session) -> None:
        self._s = session

    def load(self, workspace_id: str, task_id: str, generation: int) -> list[EvidenceRecord]:
        self._s.lock_task(workspace_id, task_id)
        found = self._s.db.execute(
            f"SELECT {EVIDENCE_COLUMNS} FROM evidence WHERE workspace_id = ? AND task_id = ? AND generation = ? "
            "ORDER BY sequence",
            (workspace_id, task_id, generation),
        )
        return [rows.evidence(self._s, r) for r in found]

    def page(
        self, workspace_id: str, task_id: str, generation: int | None, after: tuple[int, str] | None, limit: int
    ) -> list[EvidenceRecord]:
        sql = f"SELECT {EVIDENCE_COLUMNS} FROM evidence WHERE workspace_id = ? AND task_id = ?"
        params: list[object] = [workspace_id, task_id]
        if generation is not None:
            sql += " AND generation = ?"
            params.append(generation)
        if after is not None:
            sql += " AND (recorded_at, evidence_id) > (?, ?)"
            params += list(after)
        sql += " ORDER BY recorded_at, evidence_id LIMIT ?"
        params.append(limit)
        return [rows.evidence(self._s, r) for r in self._s.db.execute(sql, params)]

    def insert(self, record: EvidenceRecord) -> None:
        self._s.db.execute(
            f"INSERT INTO evidence ({EVIDENCE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows.evidence_values(self._s, record),
        )
