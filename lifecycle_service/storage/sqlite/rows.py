"""The row mapping every aggregate of both SQL engines shares: the columns of each
table in one order, and the core's values from a row and back (a caller's free
text through the session's hooks)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from funnel.auth.principal import Caller
from lifecycle_service.core.model import (
    Cause,
    ChildRef,
    GenerationState,
    IntentKind,
    LifecycleEvent,
    LinkMode,
    Outcome,
    ParentLink,
    TaskRecord,
    WorkStatus,
)
from lifecycle_service.storage.port import PendingPropagation
from lifecycle_service.storage.sqlite.session import Session

TASK_COLUMNS = (
    "workspace_id, task_id, generation, revision, state, outcome, cancellation_requested_at, work_status, "
    "parent_task_id, parent_generation, parent_mode, completion_id, created_at, updated_at"
)
TASK_COLUMNS_OF_T = ", ".join(f"t.{column.strip()}" for column in TASK_COLUMNS.split(","))
_EVENT_FIELDS = (
    "workspace_id, task_id, generation, revision, intent, from_state, to_state, outcome, "
    "cancellation_requested_at, work_status, cause_source, cause_reason, cause_originating_ids, "
    "completion_id, authoritative_at, committed_at, request_id, {caller}, parent_task_id, parent_generation, "
    "parent_mode"
)
# An event names its caller by number (callers holds each subject and role once);
# events written before migration 0006 carry the text in their own row instead.
EVENT_VALUES = _EVENT_FIELDS.format(caller="caller_id")
EVENT_COLUMNS = "sequence, " + _EVENT_FIELDS.format(
    caller="COALESCE(callers.subject, caller_subject), COALESCE(callers.role, caller_role)"
)
EVENTS = "lifecycle_events LEFT JOIN callers USING (caller_id)"
PROPAGATION_COLUMNS = (
    "id, workspace_id, parent_task_id, parent_generation, parent_sequence, child_task_id, child_generation, intent"
)


def task_values(task: TaskRecord) -> tuple[str | int | None, ...]:
    """Values for the columns of Tasks.insert and Tasks.update, keys last."""
    parent = task.parent
    return (
        task.generation,
        task.revision,
        task.state.name,
        task.outcome.name if task.outcome else None,
        task.cancellation_requested_at,
        task.work_status.name,
        parent.task_id if parent else None,
        parent.generation if parent else None,
        parent.mode.name if parent else None,
        task.completion_id,
        task.created_at,
        task.updated_at,
        task.workspace_id,
        task.task_id,
    )


def task(r: Sequence[Any]) -> TaskRecord:
    return TaskRecord(
        workspace_id=r[0],
        task_id=r[1],
        generation=r[2],
        revision=r[3],
        state=GenerationState[r[4]],
        outcome=Outcome[r[5]] if r[5] else None,
        cancellation_requested_at=r[6],
        work_status=WorkStatus[r[7]],
        parent=_link_from(r[8:11]),
        completion_id=r[11],
        created_at=r[12],
        updated_at=r[13],
    )


def event_values(s: Session, event: LifecycleEvent, caller_id: int) -> tuple[object, ...]:
    """Values for EVENT_VALUES (the event's fields but its sequence)."""
    return (
        event.workspace_id,
        event.task_id,
        event.generation,
        event.revision,
        event.intent.name,
        event.from_state.name if event.from_state else None,
        event.to_state.name,
        event.outcome.name if event.outcome else None,
        event.cancellation_requested_at,
        event.work_status.name,
        s.put_text(event.cause.source),
        s.put_text(event.cause.reason),
        json.dumps(dict(event.cause.originating_ids), sort_keys=True, ensure_ascii=False),
        event.completion_id,
        event.authoritative_at,
        event.committed_at,
        event.request_id,
        caller_id,
        *_link_values(event.parent),
    )


def event(s: Session, r: Sequence[Any]) -> LifecycleEvent:
    """An event from EVENT_COLUMNS."""
    return LifecycleEvent(
        sequence=r[0],
        workspace_id=r[1],
        task_id=r[2],
        generation=r[3],
        revision=r[4],
        intent=IntentKind[r[5]],
        from_state=GenerationState[r[6]] if r[6] else None,
        to_state=GenerationState[r[7]],
        outcome=Outcome[r[8]] if r[8] else None,
        cancellation_requested_at=r[9],
        work_status=WorkStatus[r[10]],
        cause=Cause(s.get_text(r[11]), s.get_text(r[12]), tuple(sorted(json.loads(r[13]).items()))),
        completion_id=r[14],
        authoritative_at=r[15],
        committed_at=r[16],
        request_id=r[17],
        caller=Caller(r[18], r[19]),
        parent=_link_from(r[20:23]),
    )


def propagation(r: Sequence[Any]) -> PendingPropagation:
    """A pending propagation from PROPAGATION_COLUMNS."""
    return PendingPropagation(r[0], r[1], r[2], r[3], r[4], ChildRef(r[5], r[6]), IntentKind[r[7]])


def _link_values(link: ParentLink | None) -> tuple[str, int, str] | tuple[None, None, None]:
    return (link.task_id, link.generation, link.mode.name) if link else (None, None, None)


def _link_from(r: Sequence[Any]) -> ParentLink | None:
    """A parent link from its three columns (task, generation, mode)."""
    return ParentLink(r[0], r[1], LinkMode[r[2]]) if r[0] else None
