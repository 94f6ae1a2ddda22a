"""The lifecycle service's units of work: plain synchronous functions over one
transaction (`LifecycleTx`), run by `LifecycleStore.write` or `.read`. Everything
between the request and the rows is decided here: request ids (the shared rule),
what to load, the pure core's decision, what to write and remember.

A unit touches nothing but its `tx` and its arguments (an engine may run it again
after a conflict); the time is passed in as `now`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from funnel.runtime.errors import Rejection
from funnel.runtime.idempotency import Replay, RequestKey, Reused, recall, remember
from lifecycle_service.core.intents import Intent, RegisterTask
from lifecycle_service.core.model import ChildRef, LifecycleEvent, Situation, TaskRecord
from lifecycle_service.core.rules import AlreadySettled, Decision
from lifecycle_service.errors import Reason
from lifecycle_service.storage.port import LifecycleReadTx, LifecycleTx

# GetTask reports at most this many open children; enough to explain a block.
OPEN_CHILDREN_LIMIT = 1000


@dataclass(frozen=True)
class Command:
    """One intent to apply atomically.

    `decide` is the pure core bound to the intent and policy; `render` serializes the
    response that a repeat of the request id must return (called only when `request`
    is set, inside the transaction, so the response can carry the event's sequence)."""

    intent: Intent
    decide: Callable[[Situation], Decision]
    render: Callable[[TaskRecord, LifecycleEvent], bytes] | None = None
    # The request id in its scope, with the request's fingerprint; set exactly when intent.request_id is.
    request: RequestKey | None = None
    # The pending propagation this command discharges (internal commands only).
    propagation_id: int | None = None


@dataclass(frozen=True)
class Committed:
    task: TaskRecord
    event: LifecycleEvent
    # The remembered response (when the intent had a request id).
    response: bytes | None
    propagations: int


@dataclass(frozen=True)
class Replayed:
    """The request id was seen with an identical request: its original response."""

    response: bytes


@dataclass(frozen=True)
class Resettled:
    """The settlement repeated the one recorded: the current record and the original terminal event."""

    task: TaskRecord
    event: LifecycleEvent
    response: bytes | None = None


@dataclass(frozen=True)
class Discharged:
    """The propagation was already applied or dropped by someone else."""


@dataclass(frozen=True)
class Dropped:
    """The child refused the propagation: it is discharged, and nothing else changes.
    Not a Rejection, which the store would roll back, discharge and all."""

    rejection: Rejection


ApplyResult = Committed | Replayed | Resettled | Rejection | Discharged | Dropped


@dataclass(frozen=True)
class TaskView:
    task: TaskRecord
    open_attached_children: tuple[ChildRef, ...]


def apply_intent(tx: LifecycleTx, command: Command, now: int) -> ApplyResult:
    """Request-id recall, load, decide, then write record + event + propagations and
    remember the response. A rejection writes nothing (the store rolls it back); a
    propagation command the child refuses is Dropped: its propagation is discharged
    all the same, and nothing else is written."""
    intent = command.intent
    if command.propagation_id is not None and not tx.propagations.discharge(command.propagation_id):
        return Discharged()
    seen = recall(tx.requests, command.request)
    if isinstance(seen, Replay):
        return Replayed(seen.response)
    if isinstance(seen, Reused):
        return seen.rejection(Reason.REQUEST_ID_REUSED)
    task = tx.tasks.load(intent.workspace_id, intent.task_id)
    link = intent.parent if isinstance(intent, RegisterTask) else (task.parent if task else None)
    parent = tx.tasks.load_parent(intent.workspace_id, link.task_id) if link else None
    children = tx.tasks.open_attached_children(task) if task else ()
    decision = command.decide(Situation(now=now, task=task, parent=parent, open_attached_children=children))
    if isinstance(decision, Rejection):
        return decision if command.propagation_id is None else Dropped(decision)
    if isinstance(decision, AlreadySettled):
        original = tx.events.terminal(decision.task)
        return Resettled(decision.task, original, _remember(tx, command, decision.task, original, now))
    if task is None:
        tx.tasks.insert(decision.task)
    else:
        tx.tasks.update(decision.task)
    event = tx.events.append(decision.event)
    if decision.propagations:
        tx.propagations.insert(event, decision.propagations, now)
    return Committed(
        decision.task, event, _remember(tx, command, decision.task, event, now), len(decision.propagations)
    )


def _remember(tx: LifecycleTx, command: Command, task: TaskRecord, event: LifecycleEvent, now: int) -> bytes | None:
    if command.request is None:
        return None
    assert command.render is not None, "a request id comes with the rendering of its response"
    response = command.render(task, event)
    remember(tx.requests, command.request, response, now)
    return response


def task_view(tx: LifecycleReadTx, workspace_id: str, task_id: str) -> TaskView | None:
    """A task with (up to OPEN_CHILDREN_LIMIT of) its open attached children."""
    task = tx.tasks.load(workspace_id, task_id)
    if task is None:
        return None
    return TaskView(task, tx.tasks.open_attached_children(task, OPEN_CHILDREN_LIMIT))
