"""Plain core values <-> contract messages."""

from __future__ import annotations

from funnel.lifecycle.v1 import lifecycle_pb2 as pb
from funnel.runtime.proto_enums import proto_enum
from funnel.runtime.timestamps import to_timestamp
from lifecycle_service.core.model import Cause, LifecycleEvent, LinkMode, ParentLink, TaskRecord


def cause_from_proto(cause: pb.Cause) -> Cause:
    return Cause(cause.source, cause.reason, tuple(sorted(cause.originating_ids.items())))


def parent_from_proto(link: pb.ParentLink) -> ParentLink:
    return ParentLink(link.task_id, link.generation, LinkMode(link.mode))


def parent_to_proto(link: ParentLink | None) -> pb.ParentLink | None:
    if link is None:
        return None
    return pb.ParentLink(
        task_id=link.task_id, generation=link.generation, mode=proto_enum(pb.ParentLinkMode, link.mode.value)
    )


def task_to_proto(task: TaskRecord) -> pb.Task:
    return pb.Task(
        workspace_id=task.workspace_id,
        task_id=task.task_id,
        generation=task.generation,
        revision=task.revision,
        state=proto_enum(pb.GenerationState, task.state.value),
        outcome=proto_enum(pb.TerminalOutcome, task.outcome.value if task.outcome else 0),
        cancellation=pb.CANCELLATION_STATE_REQUESTED if task.fenced else pb.CANCELLATION_STATE_NONE,
        cancellation_request_time=to_timestamp(task.cancellation_requested_at),
        work_status=proto_enum(pb.WorkStatus, task.work_status.value),
        completion_id=task.completion_id or "",
        create_time=to_timestamp(task.created_at),
        update_time=to_timestamp(task.updated_at),
        parent=parent_to_proto(task.parent),
    )


def event_to_proto(event: LifecycleEvent) -> pb.LifecycleEvent:
    return pb.LifecycleEvent(
        sequence=event.sequence,
        workspace_id=event.workspace_id,
        task_id=event.task_id,
        generation=event.generation,
        revision=event.revision,
        intent=proto_enum(pb.Intent, event.intent.value),
        from_state=proto_enum(pb.GenerationState, event.from_state.value if event.from_state else 0),
        to_state=proto_enum(pb.GenerationState, event.to_state.value),
        outcome=proto_enum(pb.TerminalOutcome, event.outcome.value if event.outcome else 0),
        cancellation=(
            pb.CANCELLATION_STATE_REQUESTED
            if event.cancellation_requested_at is not None
            else pb.CANCELLATION_STATE_NONE
        ),
        cancellation_request_time=to_timestamp(event.cancellation_requested_at),
        work_status=proto_enum(pb.WorkStatus, event.work_status.value),
        cause=pb.Cause(
            source=event.cause.source, reason=event.cause.reason, originating_ids=dict(event.cause.originating_ids)
        ),
        completion_id=event.completion_id or "",
        authoritative_time=to_timestamp(event.authoritative_at),
        commit_time=to_timestamp(event.committed_at),
        request_id=event.request_id or "",
        caller=pb.Caller(subject=event.caller.subject, role=event.caller.role),
        parent=parent_to_proto(event.parent),
    )
