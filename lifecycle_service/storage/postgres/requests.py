"""Request ids on PostgreSQL: held by a transaction advisory lock from their recall to the commit."""

from __future__ import annotations

import hashlib

from lifecycle_service.storage.sqlite.requests import SqliteRequestIds

# The first key of the two-key advisory locks that hold request ids (the second is
# a hash of the id's scope). Two-key locks never collide with one-key ones, such as
# the engine's migration lock.
REQUEST_ID_LOCKS = 0x6C6963  # "lic"


class PostgresRequestIds(SqliteRequestIds):
    def recall(self, workspace_id: str, caller: str, method: str, request_id: str) -> tuple[bytes, bytes] | None:
        # Held until this transaction ends; the SELECT that follows runs after the
        # wait, so it sees what a concurrent transaction with this id committed.
        self._s.db.execute(
            "SELECT pg_advisory_xact_lock(?, ?)",
            (REQUEST_ID_LOCKS, _lock_key(workspace_id, caller, method, request_id)),
        )
        found = super().recall(workspace_id, caller, method, request_id)
        return (bytes(found[0]), bytes(found[1])) if found else None

    def forget(self, created_before: int, limit: int) -> int:
        return int(
            self._s.db.execute(
                "DELETE FROM request_ids WHERE (workspace_id, caller, method, request_id) IN "
                "(SELECT workspace_id, caller, method, request_id FROM request_ids WHERE created_at < ? "
                "ORDER BY created_at LIMIT ? FOR UPDATE SKIP LOCKED)",
                (created_before, limit),
            ).rowcount
        )


def _lock_key(*scope: str) -> int:
    """A signed 32-bit hash of a request id's scope (a collision only makes two ids wait for each other)."""
    digest = hashlib.blake2b("\x1f".join(scope).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)
