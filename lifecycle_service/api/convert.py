"""Plain core values <-> contract messages."""

from __future__ import annotations

from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.proto_enums import proto_enum
from funnel.runtime.timestamps import to_timestamp
from lifecycle_service.core.model import Cause, LifecycleEvent, LinkMode, ParentLink, TaskRecord


def cause_from_proto(cause: lifecycle_types.Cause) -> Cause:
    return Cause(cause.source, cause.reason, tuple(sorted(cause.originating_ids.items())))


def parent_from_proto(link: lifecycle_types.ParentLink) -> ParentLink:
    return ParentLink(link.task_id, link.generation, LinkMode(link.mode))


def parent_to_proto(link: ParentLink | None) -> lifecycle_types.ParentLink | None:
    if link is None:
        return None
    return lifecycle_types.ParentLink(
        task_id=link.task_id,
        generation=link.generation,
        mode=proto_enum(lifecycle_enums.ParentLinkMode, link.mode.value),
    )


def task_to_proto(task: TaskRecord) -> lifecycle_types.Task:
    return lifecycle_types.Task(
        workspace_id=task.workspace_id,
        task_id=task.task_id,
        generation=task.generation,
        revision=task.revision,
        state=proto_enum(lifecycle_enums.GenerationState, task.state.value),
        outcome=proto_enum(lifecycle_enums.TerminalOutcome, task.outcome.value if task.outcome else 0),
        cancellation=lifecycle_enums.CANCELLATION_STATE_REQUESTED
        if task.fenced
        else lifecycle_enums.CANCELLATION_STATE_NONE,
        cancellation_request_time=to_timestamp(task.cancellation_requested_at),
        work_status=proto_enum(lifecycle_enums.WorkStatus, task.work_status.value),
        completion_id=task.completion_id or "",
        create_time=to_timestamp(task.created_at),
        update_time=to_timestamp(task.updated_at),
        parent=parent_to_proto(task.parent),
    )


def event_to_proto(event: LifecycleEvent) -> lifecycle_types.LifecycleEvent:
    return lifecycle_types.LifecycleEvent(
        sequence=event.sequence,
        workspace_id=event.workspace_id,
        task_id=event.task_id,
        generation=event.generation,
        revision=event.revision,
        intent=proto_enum(lifecycle_enums.Intent, event.intent.value),
        from_state=proto_enum(lifecycle_enums.GenerationState, event.from_state.value if event.from_state else 0),
        to_state=proto_enum(lifecycle_enums.GenerationState, event.to_state.value),
        outcome=proto_enum(lifecycle_enums.TerminalOutcome, event.outcome.value if event.outcome else 0),
        cancellation=(
            lifecycle_enums.CANCELLATION_STATE_REQUESTED
            if event.cancellation_requested_at is not None
            else lifecycle_enums.CANCELLATION_STATE_NONE
        ),
        cancellation_request_time=to_timestamp(event.cancellation_requested_at),
        work_status=proto_enum(lifecycle_enums.WorkStatus, event.work_status.value),
        cause=lifecycle_types.Cause(
            source=event.cause.source, reason=event.cause.reason, originating_ids=dict(event.cause.originating_ids)
        ),
        completion_id=event.completion_id or "",
        authoritative_time=to_timestamp(event.authoritative_at),
        commit_time=to_timestamp(event.committed_at),
        request_id=event.request_id or "",
        caller=lifecycle_types.Caller(subject=event.caller.subject, role=event.caller.role),
        parent=parent_to_proto(event.parent),
    )
