"""Pending propagations on PostgreSQL: claimed with FOR UPDATE SKIP LOCKED and a lease."""

from __future__ import annotations

from lifecycle_service.storage.port import PendingPropagation
from lifecycle_service.storage.sqlite import rows
from lifecycle_service.storage.sqlite.propagations import SqlitePropagations
from lifecycle_service.storage.sqlite.rows import PROPAGATION_COLUMNS


class PostgresPropagations(SqlitePropagations):
    def claim(self, now: int, owner: str, lease_micros: int, limit: int) -> list[PendingPropagation]:
        # Rows locked by a concurrent claim are skipped, not waited for; a claim
        # lasts until its lease runs out, and its owner gets its rows back.
        found = self._s.db.execute(
            "WITH claimable AS ("
            " SELECT id FROM pending_propagations"
            " WHERE claimed_by IS NULL OR claimed_by = ? OR claimed_until <= ?"
            " ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED)"
            " UPDATE pending_propagations AS p SET claimed_by = ?, claimed_until = ?"
            " FROM claimable WHERE p.id = claimable.id"
            f" RETURNING {', '.join('p.' + column for column in PROPAGATION_COLUMNS.split(', '))}",
            (owner, now, limit, owner, now + lease_micros),
        )
        return sorted((rows.propagation(r) for r in found), key=lambda p: p.id)
