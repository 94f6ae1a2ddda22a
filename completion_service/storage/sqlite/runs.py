"""Runs and the task leases they hold (port `Runs`)."""

from __future__ import annotations

from completion_service.core.model import Lease, RunRecord
from completion_service.storage.sqlite import rows
from completion_service.storage.sqlite.rows import RUN_COLUMNS
from completion_service.storage.sqlite.session import Session


class SqliteRuns:
    def __init__(self, session: Session) -> None:
        self._s = session

    def load(self, workspace_id: str, run_id: str) -> RunRecord | None:
        row = self._s.db.execute(
            f"SELECT {RUN_COLUMNS} FROM agent_runs WHERE workspace_id = ? AND run_id = ?{self._s.locking()}",
            (workspace_id, run_id),
        ).fetchone()
        return rows.run(self._s, row) if row else None

    def page(
        self,
        workspace_id: str,
        task_id: str | None,
        before: tuple[int, str] | None,
        limit: int,
        open_only: bool = False,
    ) -> list[RunRecord]:
        sql = f"SELECT {RUN_COLUMNS} FROM agent_runs WHERE workspace_id = ?"
        params: list[object] = [workspace_id]
        if task_id:
            sql += " AND task_id = ?"
            params.append(task_id)
        if open_only:
            sql += " AND finished_at IS NULL"  # agent_runs_open_by_claim's condition, as written there
        if before is not None:
            sql += " AND (claimed_at, run_id) < (?, ?)"
            params += list(before)
        sql += " ORDER BY claimed_at DESC, run_id DESC LIMIT ?"
        params.append(limit)
        return [rows.run(self._s, r) for r in self._s.db.execute(sql, params)]

    def insert(self, run: RunRecord) -> None:
        self._s.db.execute(
            f"INSERT INTO agent_runs ({RUN_COLUMNS}) VALUES ({', '.join('?' * 17)})", rows.run_values(self._s, run)
        )

    def update(self, run: RunRecord) -> None:
        self._s.db.execute(
            "UPDATE agent_runs SET lease_expires_at = ?, finished_at = ?, outcome = ?, tokens_input = ?, "
            "tokens_output = ?, tokens_total = ?, notes = ?, notes_truncated = ?, error = ?, final_status = ? "
            "WHERE workspace_id = ? AND run_id = ?",
            # The columns from lease_expires_at on, as run_values orders them.
            (*rows.run_values(self._s, run)[7:], run.workspace_id, run.run_id),
        )

    def claim_stalled(self, expired_before: int, limit: int) -> list[RunRecord]:
        # The claim is the lock on the rows until this transaction closes them (here
        # the database's write lock; see Session.skip_locked).
        found = self._s.db.execute(
            f"SELECT {RUN_COLUMNS} FROM agent_runs WHERE finished_at IS NULL AND lease_expires_at <= ? "
            f"ORDER BY lease_expires_at LIMIT ?{self._s.skip_locked()}",
            (expired_before, limit),
        )
        return [rows.run(self._s, r) for r in found]

    def load_lease(self, workspace_id: str, task_id: str) -> Lease | None:
        self._s.lock_task(workspace_id, task_id)
        row = self._s.db.execute(
            "SELECT task_id, run_id, epoch, expires_at FROM task_leases WHERE workspace_id = ? AND task_id = ?"
            f"{self._s.locking()}",
            (workspace_id, task_id),
        ).fetchone()
        return Lease(*row) if row else None

    def save_lease(self, workspace_id: str, lease: Lease) -> None:
        self._s.db.execute(
            "INSERT INTO task_leases (workspace_id, task_id, run_id, epoch, expires_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (workspace_id, task_id) DO UPDATE SET run_id = excluded.run_id, epoch = excluded.epoch, "
            "expires_at = excluded.expires_at",
            (workspace_id, lease.task_id, lease.run_id, lease.epoch, lease.expires_at),
        )
