"""What a parent's committed transition owes its attached children (port `Propagations`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from lifecycle_service.core.model import LifecycleEvent, Propagation
from lifecycle_service.storage.port import PendingPropagation
from lifecycle_service.storage.sqlite import rows
from lifecycle_service.storage.sqlite.rows import PROPAGATION_COLUMNS
from lifecycle_service.storage.sqlite.session import Session


class SqlitePropagations:
    def __init__(self, session: Session) -> None:
        self._s = session

    def insert(self, parent_event: LifecycleEvent, propagations: Sequence[Propagation], created_at: int) -> None:
        self._s.db.executemany(
            "INSERT INTO pending_propagations (workspace_id, parent_task_id, parent_generation, parent_sequence, "
            "child_task_id, child_generation, intent, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    parent_event.workspace_id,
                    parent_event.task_id,
                    parent_event.generation,
                    parent_event.sequence,
                    propagation.child.task_id,
                    propagation.child.generation,
                    propagation.intent.name,
                    created_at,
                )
                for propagation in propagations
            ],
        )

    def discharge(self, propagation_id: int) -> bool:
        deleted = self._s.db.execute("DELETE FROM pending_propagations WHERE id = ?", (propagation_id,))
        return cast(int, deleted.rowcount) == 1

    def claim(self, now: int, owner: str, lease_micros: int, limit: int) -> list[PendingPropagation]:
        # One process owns the file: no claim is recorded (see the port).
        found = self._s.db.execute(
            f"SELECT {PROPAGATION_COLUMNS} FROM pending_propagations ORDER BY id LIMIT ?", (limit,)
        )
        return [rows.propagation(r) for r in found]
