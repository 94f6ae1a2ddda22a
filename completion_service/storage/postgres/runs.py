"""Runs on PostgreSQL: the task's lock comes before the run row's, and the stall
sweeper takes only the runs whose task lock it gets at once."""

from __future__ import annotations

from completion_service.core.model import RunRecord
from completion_service.storage.postgres.session import PostgresSession
from completion_service.storage.sqlite.runs import SqliteRuns


class PostgresRuns(SqliteRuns):
    def __init__(self, session: PostgresSession) -> None:
        super().__init__(session)
        self._pg = session

    def load(self, workspace_id: str, run_id: str) -> RunRecord | None:
        if self._pg.writable:
            # The task's lock comes before the run row's (one lock order for all writers).
            row = self._pg.db.execute(
                "SELECT task_id FROM agent_runs WHERE workspace_id = ? AND run_id = ?", (workspace_id, run_id)
            ).fetchone()
            if row is None:
                return None
            self._pg.lock_task(workspace_id, row[0])
        return super().load(workspace_id, run_id)

    def claim_stalled(self, expired_before: int, limit: int) -> list[RunRecord]:
        # The run rows come locked; of those, the runs whose task another writer
        # holds are left to the next sweep (see the package's docstring).
        return [
            run
            for run in super().claim_stalled(expired_before, limit)
            if self._pg.try_lock_task(run.workspace_id, run.task_id)
        ]
