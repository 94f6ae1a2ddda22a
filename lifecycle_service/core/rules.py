"""The laws of docs/specification.md §3 as one pure function: `decide(intent, situation, policy)`.

It returns a `Transition` (the next record, its one event, and the propagations the
parent owes its attached children), `AlreadySettled` (the same settlement repeated:
answer with the generation's original terminal event), or a `Rejection`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from funnel.runtime.errors import Rejection, instant, reject
from lifecycle_service.core import intents as i
from lifecycle_service.core.model import (
    SETTABLE_WORK_STATUSES,
    GenerationState,
    IntentKind,
    LifecycleEvent,
    LinkMode,
    Outcome,
    Policy,
    Propagation,
    Situation,
    TaskRecord,
    WorkStatus,
)
from lifecycle_service.errors import Reason

REGISTERED, ACTIVE, SUSPENDED, TERMINAL = (
    GenerationState.REGISTERED,
    GenerationState.ACTIVE,
    GenerationState.SUSPENDED,
    GenerationState.TERMINAL,
)


@dataclass(frozen=True)
class Transition:
    task: TaskRecord
    event: LifecycleEvent
    propagations: tuple[Propagation, ...] = ()


@dataclass(frozen=True)
class AlreadySettled:
    """The intent repeats the settlement the generation already has."""

    task: TaskRecord


Decision = Transition | AlreadySettled | Rejection

# What each settlement makes of a generation: (outcome, work status).
_SETTLEMENT_RESULT = {
    IntentKind.SETTLE_CANCELLATION: (Outcome.CANCELLED, WorkStatus.CANCELLED),
    IntentKind.SETTLE_COMPLETION: (Outcome.COMPLETED, WorkStatus.DONE),
    IntentKind.SETTLE_FAILURE: (Outcome.FAILED, WorkStatus.BLOCKED),
    IntentKind.SETTLE_TIMEOUT: (Outcome.TIMED_OUT, WorkStatus.BLOCKED),
    IntentKind.PROPAGATE_PARENT_TERMINATION: (Outcome.CANCELLED, WorkStatus.CANCELLED),
}


def decide(intent: i.Intent, situation: Situation, policy: Policy) -> Decision:
    if isinstance(intent, i.RegisterTask):
        return _register(intent, situation)
    task = situation.task
    if task is None:
        return reject(Reason.TASK_NOT_FOUND, f"task {intent.task_id!r} does not exist", task_id=intent.task_id)
    if isinstance(intent, i.ResumeWithGeneration) and task.terminal and intent.generation == task.generation + 1:
        return _check_revision(intent, task) or _start_next_generation(intent, task, situation)
    if intent.generation < task.generation:
        return reject(
            Reason.STALE_GENERATION,
            f"generation {intent.generation} was replaced by generation {task.generation}",
            generation=intent.generation,
            current_generation=task.generation,
        )
    if intent.generation > task.generation:
        return reject(
            Reason.FUTURE_GENERATION,
            f"generation {intent.generation} does not exist; the current generation is {task.generation}",
            generation=intent.generation,
            current_generation=task.generation,
        )
    if task.terminal:
        if _repeats_settlement(intent, task):
            return AlreadySettled(task)
        return reject(
            Reason.GENERATION_TERMINAL,
            f"generation {task.generation} is terminal ({_outcome_name(task)}) and immutable",
            generation=task.generation,
            outcome=_outcome_name(task),
        )
    return _check_revision(intent, task) or _HANDLERS[intent.kind](intent, task, situation, policy)


def _outcome_name(task: TaskRecord) -> str:
    """The outcome of a terminal generation: a terminal record always has one."""
    assert task.outcome is not None, f"terminal task {task.task_id!r} without an outcome"
    return task.outcome.name


def _fence_time(task: TaskRecord) -> int:
    """When a fenced generation's cancellation was requested."""
    assert task.cancellation_requested_at is not None, f"task {task.task_id!r} is not fenced"
    return task.cancellation_requested_at


def _repeats_settlement(intent: i.Intent, task: TaskRecord) -> bool:
    result = _SETTLEMENT_RESULT.get(intent.kind)
    if result is None or result[0] is not task.outcome:
        return False
    if isinstance(intent, i.SettleCompletion):
        return intent.completion_id == task.completion_id
    return True


def _check_revision(intent: i.Intent, task: TaskRecord) -> Rejection | None:
    if intent.expected_revision is not None and intent.expected_revision != task.revision:
        return reject(
            Reason.REVISION_MISMATCH,
            f"expected revision {intent.expected_revision}, the task is at revision {task.revision}",
            expected_revision=intent.expected_revision,
            actual_revision=task.revision,
        )
    return None


def _register(intent: i.RegisterTask, s: Situation) -> Decision:
    if s.task is not None:
        mismatch = _check_revision(intent, s.task) if intent.expected_revision not in (None, 0) else None
        return mismatch or reject(
            Reason.TASK_ALREADY_EXISTS, f"task {intent.task_id!r} already exists", task_id=intent.task_id
        )
    if intent.expected_revision not in (None, 0):
        return reject(
            Reason.REVISION_MISMATCH,
            f"expected revision {intent.expected_revision}, the task does not exist",
            expected_revision=intent.expected_revision,
            actual_revision=0,
        )
    link = intent.parent
    if link is not None:
        if s.parent is None:
            return reject(
                Reason.PARENT_NOT_FOUND, f"parent task {link.task_id!r} does not exist", parent_task_id=link.task_id
            )
        problem = (
            _parent_admits_new_work(link.generation, s.parent)
            if link.mode is LinkMode.ATTACHED
            else _detached_parent_problem(link.generation, s.parent)
        )
        if problem:
            return problem
    task = TaskRecord(
        workspace_id=intent.workspace_id,
        task_id=intent.task_id,
        generation=1,
        revision=1,
        state=REGISTERED,
        outcome=None,
        cancellation_requested_at=None,
        work_status=WorkStatus.READY,
        parent=link,
        completion_id=None,
        created_at=s.now,
        updated_at=s.now,
    )
    return Transition(task, _event(intent, None, task, s.now))


def _detached_parent_problem(generation: int, parent: TaskRecord) -> Rejection | None:
    if generation > parent.generation:
        return _parent_generation_mismatch(generation, parent)
    return None


def _parent_generation_mismatch(generation: int, parent: TaskRecord) -> Rejection:
    return reject(
        Reason.PARENT_GENERATION_MISMATCH,
        f"parent {parent.task_id!r} is at generation {parent.generation}, not {generation}",
        parent_task_id=parent.task_id,
        parent_generation=generation,
        current_parent_generation=parent.generation,
    )


def _parent_admits_new_work(generation: int, parent: TaskRecord) -> Rejection | None:
    """An attached child may start work only under the exact active, unfenced parent generation."""
    if generation != parent.generation:
        return _parent_generation_mismatch(generation, parent)
    if parent.terminal:
        return reject(
            Reason.PARENT_TERMINAL,
            f"parent {parent.task_id!r} generation {generation} is terminal",
            parent_task_id=parent.task_id,
            parent_outcome=_outcome_name(parent),
        )
    if parent.fenced:
        return reject(
            Reason.PARENT_CANCELLATION_FENCED,
            f"parent {parent.task_id!r} generation {generation} has a cancellation request",
            parent_task_id=parent.task_id,
        )
    if parent.state is not ACTIVE:
        return reject(
            Reason.PARENT_NOT_ACTIVE,
            f"parent {parent.task_id!r} generation {generation} is {parent.state.name}",
            parent_task_id=parent.task_id,
            parent_state=parent.state.name,
        )
    return None


def _attached_parent_problem(task: TaskRecord, s: Situation) -> Rejection | None:
    link = task.attached_parent
    if link is None:
        return None
    if s.parent is None:
        return reject(
            Reason.PARENT_NOT_FOUND, f"parent task {link.task_id!r} does not exist", parent_task_id=link.task_id
        )
    return _parent_admits_new_work(link.generation, s.parent)


def _fenced(task: TaskRecord, intent: i.Intent) -> Rejection | None:
    if not task.fenced:
        return None
    return _fence_rejection(task, intent, fenced_task=task)


def _fence_rejection(
    task: TaskRecord, intent: i.Intent, fenced_task: TaskRecord, offset: int | None = None
) -> Rejection:
    whose = "its" if fenced_task is task else f"its attached parent {fenced_task.task_id!r}'s"
    return reject(
        Reason.CANCELLATION_FENCED,
        f"{intent.kind.name} is refused after {whose} cancellation request",
        cancellation_request_time=instant(_fence_time(fenced_task)),
        fenced_task_id=fenced_task.task_id,
        max_clock_offset_ms=None if offset is None else offset // 1000,
    )


def _invalid_transition(task: TaskRecord, intent: i.Intent) -> Rejection:
    return reject(
        Reason.INVALID_TRANSITION,
        f"{intent.kind.name} is not allowed while generation {task.generation} is {task.state.name}",
        state=task.state.name,
        intent=intent.kind.name,
    )


def _children_block(task: TaskRecord, s: Situation) -> Rejection | None:
    if not s.open_attached_children:
        return None
    ids = sorted(child.task_id for child in s.open_attached_children)
    return reject(
        Reason.ACTIVE_ATTACHED_CHILD,
        f"{len(ids)} attached child task(s) of generation {task.generation} are not terminal",
        child_task_ids=",".join(ids[:10]),
    )


def _activate(intent: i.ActivateGeneration, task: TaskRecord, s: Situation, policy: Policy) -> Decision:
    problem = _fenced(task, intent) or (None if task.state is REGISTERED else _invalid_transition(task, intent))
    problem = problem or _attached_parent_problem(task, s)
    if problem:
        return problem
    if intent.work_status is not None and intent.work_status not in SETTABLE_WORK_STATUSES:
        return _reserved_status(intent.work_status)
    return _move(intent, task, s, state=ACTIVE, work_status=intent.work_status or task.work_status)


def _suspend(intent: i.SuspendGeneration, task: TaskRecord, s: Situation, policy: Policy) -> Decision:
    problem = _fenced(task, intent) or (None if task.state is ACTIVE else _invalid_transition(task, intent))
    return problem or _move(intent, task, s, state=SUSPENDED)


def _resume_same_generation(intent: i.ResumeWithGeneration, task: TaskRecord, s: Situation, policy: Policy) -> Decision:
    problem = _fenced(task, intent) or (None if task.state is SUSPENDED else _invalid_transition(task, intent))
    problem = problem or _attached_parent_problem(task, s)
    return problem or _move(intent, task, s, state=ACTIVE)


def _start_next_generation(intent: i.ResumeWithGeneration, task: TaskRecord, s: Situation) -> Decision:
    problem = _children_block(task, s) or _attached_parent_problem(task, s)
    if problem:
        return problem
    following = dataclasses.replace(
        task,
        generation=task.generation + 1,
        revision=task.revision + 1,
        state=ACTIVE,
        outcome=None,
        cancellation_requested_at=None,
        work_status=WorkStatus.READY,
        completion_id=None,
        updated_at=s.now,
    )
    return Transition(following, _event(intent, task.state, following, s.now))


def _request_cancellation(intent: i.RequestCancellation, task: TaskRecord, s: Situation, policy: Policy) -> Decision:
    if task.fenced:
        return reject(
            Reason.CANCELLATION_ALREADY_REQUESTED,
            f"generation {task.generation} already has a cancellation request",
            cancellation_request_time=instant(_fence_time(task)),
        )
    return _move(intent, task, s, cancellation_requested_at=s.now, propagate=IntentKind.REQUEST_CANCELLATION)


def _settle_cancellation(intent: i.SettleCancellation, task: TaskRecord, s: Situation, policy: Policy) -> Decision:
    if not task.fenced:
        return reject(
            Reason.CANCELLATION_NOT_REQUESTED, "settling a cancellation requires a recorded cancellation request"
        )
    return _settle(intent, task, s, propagate=IntentKind.SETTLE_CANCELLATION)


def _settle_completion(intent: i.SettleCompletion, task: TaskRecord, s: Situation, policy: Policy) -> Decision:
    offset = policy.max_clock_offset_micros

    def proven_before(fence: TaskRecord) -> bool:
        # Fail closed: only a durable time earlier than the fence by more than the
        # allowed clock offset proves the completion came first; no time proves nothing.
        if intent.authoritative_at is None:
            return False
        return intent.authoritative_at + offset < _fence_time(fence)

    if task.fenced and not proven_before(task):
        return _fence_rejection(task, intent, task, offset)
    link = task.attached_parent
    if link is not None:
        parent = s.parent
        if parent is None:
            return reject(
                Reason.PARENT_NOT_FOUND, f"parent task {link.task_id!r} does not exist", parent_task_id=link.task_id
            )
        if parent.generation != link.generation:
            return _parent_generation_mismatch(link.generation, parent)
        if parent.terminal:
            return reject(
                Reason.PARENT_TERMINAL,
                f"parent {parent.task_id!r} generation {parent.generation} is terminal",
                parent_task_id=parent.task_id,
                parent_outcome=_outcome_name(parent),
            )
        if parent.fenced and not proven_before(parent):
            return _fence_rejection(task, intent, parent, offset)
    return _children_block(task, s) or _settle(
        intent, task, s, completion_id=intent.completion_id, authoritative_at=intent.authoritative_at
    )


def _settle_failure(intent: i.Intent, task: TaskRecord, s: Situation, policy: Policy) -> Decision:
    problem = _fenced(task, intent)
    link, parent = task.attached_parent, s.parent
    if problem is None and link is not None and parent is not None and parent.generation == link.generation:
        if parent.fenced:
            problem = _fence_rejection(task, intent, parent)
        elif parent.terminal:
            # The parent's termination decides the child's fate (PropagateParentTermination).
            problem = reject(
                Reason.PARENT_TERMINAL,
                f"parent {parent.task_id!r} generation {parent.generation} is terminal",
                parent_task_id=parent.task_id,
                parent_outcome=_outcome_name(parent),
            )
    return problem or _settle(intent, task, s, propagate=IntentKind.PROPAGATE_PARENT_TERMINATION)


def _propagate_parent_termination(
    intent: i.PropagateParentTermination, task: TaskRecord, s: Situation, policy: Policy
) -> Decision:
    link = task.attached_parent
    if link is None:
        return reject(Reason.NOT_ATTACHED_CHILD, f"task {task.task_id!r} has no attached parent")
    parent = s.parent
    if parent is None:
        return reject(
            Reason.PARENT_NOT_FOUND, f"parent task {link.task_id!r} does not exist", parent_task_id=link.task_id
        )
    # A later parent generation exists only after the linked one ended.
    if parent.generation == link.generation and not parent.terminal:
        return reject(
            Reason.PARENT_NOT_TERMINAL,
            f"parent {parent.task_id!r} generation {link.generation} is {parent.state.name}",
            parent_task_id=parent.task_id,
        )
    return _settle(intent, task, s, propagate=IntentKind.PROPAGATE_PARENT_TERMINATION)


def _set_work_status(intent: i.SetWorkStatus, task: TaskRecord, s: Situation, policy: Policy) -> Decision:
    if intent.work_status not in SETTABLE_WORK_STATUSES:
        return _reserved_status(intent.work_status)
    problem = _fenced(task, intent)
    if problem is None and intent.work_status is not WorkStatus.BLOCKED:
        problem = _parent_fence_forbids_new_work(task, s)
    return problem or _move(intent, task, s, work_status=intent.work_status)


def _parent_fence_forbids_new_work(task: TaskRecord, s: Situation) -> Rejection | None:
    """An attached child's own fence arrives by propagation, after its parent's
    commit; until then the parent's fence already forbids starting new work."""
    link, parent = task.attached_parent, s.parent
    if link is None or parent is None or parent.generation != link.generation or not parent.fenced:
        return None
    return reject(
        Reason.PARENT_CANCELLATION_FENCED,
        f"parent {parent.task_id!r} generation {parent.generation} has a cancellation request",
        parent_task_id=parent.task_id,
    )


def _reserved_status(status: WorkStatus) -> Rejection:
    return Rejection(
        Reason.WORK_STATUS_RESERVED,
        f"work status {status.name} is reached only through a settlement",
        {"field": "work_status"},
    )


class _Changes(TypedDict, total=False):
    """The fields of a task record that a transition may change besides its revision."""

    state: GenerationState
    outcome: Outcome | None
    cancellation_requested_at: int | None
    work_status: WorkStatus
    completion_id: str | None


def _settle(
    intent: i.Intent,
    task: TaskRecord,
    s: Situation,
    *,
    propagate: IntentKind | None = None,
    authoritative_at: int | None = None,
    completion_id: str | None = None,
) -> Transition:
    outcome, work_status = _SETTLEMENT_RESULT[intent.kind]
    changes: _Changes = {"state": TERMINAL, "outcome": outcome, "work_status": work_status}
    if completion_id is not None:
        changes["completion_id"] = completion_id
    return _move(intent, task, s, propagate=propagate, authoritative_at=authoritative_at, **changes)


def _move(
    intent: i.Intent,
    task: TaskRecord,
    s: Situation,
    *,
    propagate: IntentKind | None = None,
    authoritative_at: int | None = None,
    **changes: Unpack[_Changes],
) -> Transition:
    following = dataclasses.replace(task, revision=task.revision + 1, updated_at=s.now, **changes)
    propagations = tuple(Propagation(child, propagate) for child in s.open_attached_children) if propagate else ()
    return Transition(following, _event(intent, task.state, following, s.now, authoritative_at), propagations)


def _event(
    intent: i.Intent,
    from_state: GenerationState | None,
    task: TaskRecord,
    now: int,
    authoritative_at: int | None = None,
) -> LifecycleEvent:
    return LifecycleEvent(
        workspace_id=task.workspace_id,
        task_id=task.task_id,
        generation=task.generation,
        revision=task.revision,
        intent=intent.kind,
        from_state=from_state,
        to_state=task.state,
        outcome=task.outcome,
        cancellation_requested_at=task.cancellation_requested_at,
        work_status=task.work_status,
        cause=intent.cause,
        completion_id=task.completion_id,
        authoritative_at=authoritative_at,
        committed_at=now,
        request_id=intent.request_id,
        caller=intent.caller,
        parent=task.parent if _opens_to_parent(intent.kind, from_state) else None,
    )


def _opens_to_parent(kind: IntentKind, from_state: GenerationState | None) -> bool:
    """Whether the event names the task's parent link: a registration, and a resume
    into a new generation (a child that had ended is open again). A watcher learns
    from either that a parent has an open attached child, without reading the task."""
    return kind is IntentKind.REGISTER_TASK or from_state is GenerationState.TERMINAL


# Each handler takes the intent class of its kind (intents.BY_KIND), which a
# mapping's type cannot say: the intent is typed Any here.
_Handler = Callable[[Any, TaskRecord, Situation, Policy], Decision]
_HANDLERS: dict[IntentKind, _Handler] = {
    IntentKind.ACTIVATE_GENERATION: _activate,
    IntentKind.SUSPEND_GENERATION: _suspend,
    IntentKind.RESUME_WITH_GENERATION: _resume_same_generation,
    IntentKind.REQUEST_CANCELLATION: _request_cancellation,
    IntentKind.SETTLE_CANCELLATION: _settle_cancellation,
    IntentKind.SETTLE_COMPLETION: _settle_completion,
    IntentKind.SETTLE_FAILURE: _settle_failure,
    IntentKind.SETTLE_TIMEOUT: _settle_failure,
    IntentKind.PROPAGATE_PARENT_TERMINATION: _propagate_parent_termination,
    IntentKind.SET_WORK_STATUS: _set_work_status,
}
