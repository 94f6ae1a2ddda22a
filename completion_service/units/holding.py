"""Which open run holds a task's live lease: the read behind an agent's right to
append, the interrupted-turn repair, and whether a cancellation fence still has
a run that will close (runs.close_run, settlements.record_settlement)."""

from __future__ import annotations

from completion_service.core.model import RunRecord
from completion_service.core.runs import judge_renewal
from completion_service.storage.port import CompletionReadTx


def holding_run(tx: CompletionReadTx, workspace_id: str, task_id: str, now: int) -> RunRecord | None:
    """The open run whose lease on the task is current and live at `now`, if any."""
    lease = tx.runs.load_lease(workspace_id, task_id)
    if lease is None:
        return None
    run = tx.runs.load(workspace_id, lease.run_id)
    if run is None or judge_renewal(run.open, run.run_id, run.epoch, lease, now) is not None:
        return None
    return run
