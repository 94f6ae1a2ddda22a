"""Streamed imports on PostgreSQL: each store stages under its own qualified ids,
so that a replica discards only its own staging (and debris older than a day)."""

from __future__ import annotations

from collections.abc import Sequence

from completion_service.core.transcript import SessionEvent
from completion_service.storage.postgres.session import PostgresSession
from completion_service.storage.sqlite.transcripts import SqliteImports

# Staged imports whose last batch is older than this are a vanished replica's debris.
STALE_IMPORT = "1 day"


class PostgresImports(SqliteImports):
    def __init__(self, session: PostgresSession) -> None:
        super().__init__(session)
        self._pg = session

    def _staged(self, import_id: str) -> str:
        return f"{self._pg.instance}/{import_id}"

    def stage(self, import_id: str, events: Sequence[SessionEvent]) -> None:
        super().stage(self._staged(import_id), events)

    def move(self, import_id: str, workspace_id: str, task_id: str) -> None:
        super().move(self._staged(import_id), workspace_id, task_id)

    def discard(self, import_id: str | None) -> None:
        if import_id is not None:
            super().discard(self._staged(import_id))
            return
        # Every import of this store, and those of replicas gone long ago; never
        # another live replica's import in flight.
        self._pg.db.execute(
            "DELETE FROM transcript_staging WHERE starts_with(import_id, ?) OR import_id IN ("
            " SELECT import_id FROM transcript_staging GROUP BY import_id"
            f" HAVING max(staged_at) < now() - interval '{STALE_IMPORT}')",
            (self._staged(""),),
        )
