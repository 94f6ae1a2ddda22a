"""Builders of plain core values (records, intents) shared by the core tests."""

from __future__ import annotations

from lifecycle_service.core import intents as i
from lifecycle_service.core.model import GenerationState, IntentKind, Outcome, Policy, TaskRecord, WorkStatus

WORKSPACE = "ws"
NOW = 1_700_000_100_000_000
CREATED = NOW - 3_600_000_000
OFFSET = 500_000
POLICY = Policy(max_clock_offset_micros=OFFSET)

SETTLED_WORK_STATUS = {
    Outcome.COMPLETED: WorkStatus.DONE,
    Outcome.CANCELLED: WorkStatus.CANCELLED,
    Outcome.FAILED: WorkStatus.BLOCKED,
    Outcome.TIMED_OUT: WorkStatus.BLOCKED,
}


def record(
    state: GenerationState,
    *,
    generation: int = 1,
    revision: int = 5,
    outcome: Outcome | None = None,
    fenced_at: int | None = None,
    work_status: WorkStatus | None = None,
    parent=None,
    completion_id: str | None = None,
    task_id: str = "task",
    workspace_id: str = WORKSPACE,
    created_at: int = CREATED,
    updated_at: int = CREATED + 1,
) -> TaskRecord:
    if work_status is None:
        work_status = SETTLED_WORK_STATUS[outcome] if outcome else WorkStatus.IN_PROGRESS
    return TaskRecord(
        workspace_id=workspace_id,
        task_id=task_id,
        generation=generation,
        revision=revision,
        state=state,
        outcome=outcome,
        cancellation_requested_at=fenced_at,
        work_status=work_status,
        parent=parent,
        completion_id=completion_id,
        created_at=created_at,
        updated_at=updated_at,
    )


def make_intent(
    kind: IntentKind, *, generation: int = 1, task_id: str = "task", workspace_id: str = WORKSPACE, **fields
) -> i.Intent:
    """An intent of `kind` with sensible defaults for its own fields."""
    if kind is IntentKind.SETTLE_COMPLETION:
        fields.setdefault("completion_id", "cmp-1")
        fields.setdefault("authoritative_at", NOW)
    elif kind is IntentKind.SET_WORK_STATUS:
        fields.setdefault("work_status", WorkStatus.BLOCKED)
    if kind is not IntentKind.REGISTER_TASK:
        fields["generation"] = generation
    return i.BY_KIND[kind](workspace_id=workspace_id, task_id=task_id, **fields)
