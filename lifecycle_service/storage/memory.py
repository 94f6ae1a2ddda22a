"""The in-memory fake of the lifecycle store: dicts and tuples with the port's
transaction semantics (funnel.runtime.store.MemoryEngine: a write works on a
copy of the state, so a unit that raises or refuses leaves nothing behind). It
keeps the invariants the SQLite schema enforces (unique keys, the record's
checks), raising InvariantViolated.

For the application-layer unit tests and the conformance suite; not durable."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from funnel.runtime.idempotency import RequestKey
from funnel.runtime.store import MemoryEngine, Store
from lifecycle_service.core.model import (
    ChildRef,
    GenerationState,
    LifecycleEvent,
    LinkMode,
    Outcome,
    Propagation,
    TaskRecord,
)
from lifecycle_service.storage.port import (
    InvariantViolated,
    LifecycleFigures,
    LifecycleStore,
    PendingPropagation,
    TaskCount,
    TaskQuery,
)

_TaskKey = tuple[str, str]
_RequestScope = tuple[str, str, str, str]


@dataclass(frozen=True)
class _Remembered:
    fingerprint: bytes
    response: bytes
    created_at: int


@dataclass
class _State:
    """Containers hold immutable values only: a shallow copy is a snapshot."""

    tasks: dict[_TaskKey, TaskRecord] = field(default_factory=dict)
    # Per task, its events in revision order; `events` is every event in sequence order.
    history: dict[_TaskKey, tuple[LifecycleEvent, ...]] = field(default_factory=dict)
    events: list[LifecycleEvent] = field(default_factory=list)
    last_sequence: int = 0
    propagations: dict[int, PendingPropagation] = field(default_factory=dict)
    last_propagation_id: int = 0
    requests: dict[_RequestScope, _Remembered] = field(default_factory=dict)

    def copy(self) -> _State:
        return _State(
            dict(self.tasks),
            dict(self.history),
            list(self.events),
            self.last_sequence,
            dict(self.propagations),
            self.last_propagation_id,
            dict(self.requests),
        )


class _Aggregate:
    """What the fake's aggregates share: the state of their transaction, and
    whether it is a write (a write transaction works on its own copy)."""

    def __init__(self, state: _State, *, writable: bool) -> None:
        self._s = state
        self._writable = writable

    def _check_writable(self) -> None:
        if not self._writable:
            raise RuntimeError("a write in a read transaction")


class MemoryRequestIds(_Aggregate):
    def recall(self, workspace_id: str, caller: str, method: str, request_id: str) -> tuple[bytes, bytes] | None:
        found = self._s.requests.get((workspace_id, caller, method, request_id))
        return (found.fingerprint, found.response) if found else None

    def remember(self, key: RequestKey, response: bytes, created_at: int) -> None:
        self._check_writable()
        scope = (key.workspace_id, key.caller, key.method, key.request_id)
        if scope in self._s.requests:
            raise InvariantViolated(f"request id {key.request_id!r} is already remembered")
        self._s.requests[scope] = _Remembered(key.fingerprint, bytes(response), created_at)

    def forget(self, created_before: int, limit: int) -> int:
        self._check_writable()
        old = sorted(
            (remembered.created_at, scope)
            for scope, remembered in self._s.requests.items()
            if remembered.created_at < created_before
        )[:limit]
        for _, scope in old:
            del self._s.requests[scope]
        return len(old)


class MemoryTasks(_Aggregate):
    def load(self, workspace_id: str, task_id: str) -> TaskRecord | None:
        return self._s.tasks.get((workspace_id, task_id))

    def load_parent(self, workspace_id: str, task_id: str) -> TaskRecord | None:
        return self._s.tasks.get((workspace_id, task_id))

    def open_attached_children(self, task: TaskRecord, limit: int | None = None) -> tuple[ChildRef, ...]:
        children = sorted(
            (
                ChildRef(child.task_id, child.generation)
                for child in self._s.tasks.values()
                if child.workspace_id == task.workspace_id
                and child.parent is not None
                and (child.parent.task_id, child.parent.generation, child.parent.mode)
                == (task.task_id, task.generation, LinkMode.ATTACHED)
                and child.state is not GenerationState.TERMINAL
            ),
            key=lambda child: child.task_id,
        )
        return tuple(children[:limit] if limit is not None else children)

    def page(self, workspace_id: str, query: TaskQuery, after_task_id: str, limit: int) -> list[TaskRecord]:
        found = sorted(
            (
                task
                for (workspace, task_id), task in self._s.tasks.items()
                if workspace == workspace_id and task_id > after_task_id and query.matches(task)
            ),
            key=lambda task: task.task_id,
        )
        return found[:limit]

    def page_by_change(
        self, workspace_id: str, query: TaskQuery, before_sequence: int | None, limit: int
    ) -> list[tuple[int, TaskRecord]]:
        found: list[tuple[int, TaskRecord]] = []
        for event in reversed(self._s.events):
            if len(found) == limit:
                break
            if event.workspace_id != workspace_id or event.sequence >= (before_sequence or event.sequence + 1):
                continue
            task = self._s.tasks[(workspace_id, event.task_id)]
            if task.revision == event.revision and query.matches(task):
                found.append((event.sequence, task))
        return found

    def count(self, workspace_id: str) -> list[TaskCount]:
        counted = collections.Counter(
            (task.state, task.outcome, task.work_status)
            for (workspace, _), task in self._s.tasks.items()
            if workspace == workspace_id
        )
        return sorted(
            (TaskCount(state, outcome, work, n) for (state, outcome, work), n in counted.items()),
            key=lambda c: (c.state.value, c.outcome.value if c.outcome else 0, c.work_status.value),
        )

    def insert(self, task: TaskRecord) -> None:
        self._check_writable()
        key = (task.workspace_id, task.task_id)
        if key in self._s.tasks:
            raise InvariantViolated(f"task {task.task_id!r} already exists")
        self._s.tasks[key] = _checked(task)

    def update(self, task: TaskRecord) -> None:
        self._check_writable()
        key = (task.workspace_id, task.task_id)
        stored = self._s.tasks.get(key)
        if stored is None or stored.revision != task.revision - 1:
            raise InvariantViolated(f"task {task.task_id!r} changed under its write lock")
        self._s.tasks[key] = _checked(task)


class MemoryEvents(_Aggregate):
    def append(self, event: LifecycleEvent) -> LifecycleEvent:
        self._check_writable()
        key = (event.workspace_id, event.task_id)
        history = self._s.history.get(key, ())
        if any(e.revision == event.revision for e in history):
            raise InvariantViolated(f"task {event.task_id!r} already has an event of revision {event.revision}")
        self._s.last_sequence += 1
        stored = dataclasses.replace(event, sequence=self._s.last_sequence)
        self._s.history[key] = tuple(sorted(history + (stored,), key=lambda e: e.revision))
        self._s.events.append(stored)
        return stored

    def history(self, workspace_id: str, task_id: str, after_revision: int, limit: int) -> list[LifecycleEvent]:
        history = self._s.history.get((workspace_id, task_id), ())
        return [event for event in history if event.revision > after_revision][:limit]

    def page(self, workspace_id: str, after_sequence: int, task_id: str | None, limit: int) -> list[LifecycleEvent]:
        found: list[LifecycleEvent] = []
        for event in self._s.events:
            if len(found) == limit:
                break
            if (
                event.sequence > after_sequence
                and event.workspace_id == workspace_id
                and (not task_id or event.task_id == task_id)
            ):
                found.append(event)
        return found

    def terminal(self, task: TaskRecord) -> LifecycleEvent:
        for event in self._s.history.get((task.workspace_id, task.task_id), ()):
            if event.generation == task.generation and event.to_state is GenerationState.TERMINAL:
                return event
        raise InvariantViolated(f"terminal task {task.task_id!r} has no terminal event")

    def last_sequence(self) -> int:
        return self._s.events[-1].sequence if self._s.events else 0


class MemoryPropagations(_Aggregate):
    def insert(self, parent_event: LifecycleEvent, propagations: Sequence[Propagation], created_at: int) -> None:
        self._check_writable()
        if not any(e.sequence == parent_event.sequence for e in reversed(self._s.events)):
            raise InvariantViolated(f"no event of sequence {parent_event.sequence}")
        for propagation in propagations:
            self._s.last_propagation_id += 1
            self._s.propagations[self._s.last_propagation_id] = PendingPropagation(
                self._s.last_propagation_id,
                parent_event.workspace_id,
                parent_event.task_id,
                parent_event.generation,
                parent_event.sequence,
                propagation.child,
                propagation.intent,
            )

    def discharge(self, propagation_id: int) -> bool:
        self._check_writable()
        return self._s.propagations.pop(propagation_id, None) is not None

    def claim(self, now: int, owner: str, lease_micros: int, limit: int) -> list[PendingPropagation]:
        # One process: no claim is kept (see the port).
        return [self._s.propagations[key] for key in sorted(self._s.propagations)[:limit]]


class MemoryLifecycleTx:
    def __init__(self, state: _State, *, writable: bool) -> None:
        self._s = state
        self.requests = MemoryRequestIds(state, writable=writable)
        self.tasks = MemoryTasks(state, writable=writable)
        self.events = MemoryEvents(state, writable=writable)
        self.propagations = MemoryPropagations(state, writable=writable)

    def load_figures(self) -> LifecycleFigures:
        return LifecycleFigures(len(self._s.propagations), len(self._s.requests), None)


class MemoryLifecycleStore(Store[_State, MemoryLifecycleTx, MemoryLifecycleTx]):
    def __init__(self) -> None:
        super().__init__(
            MemoryEngine(_State(), hops=False),
            lambda state: MemoryLifecycleTx(state, writable=True),
            lambda state: MemoryLifecycleTx(state, writable=False),
        )


def _checked(task: TaskRecord) -> TaskRecord:
    """The record's checks of the SQLite schema."""
    if (task.state is GenerationState.TERMINAL) != (task.outcome is not None):
        raise InvariantViolated(f"task {task.task_id!r}: a terminal state goes with an outcome, and only it")
    # As in SQL, the second check passes when there is no outcome (NULL = … is not false).
    if task.outcome is not None and (task.outcome is Outcome.COMPLETED) != (task.completion_id is not None):
        raise InvariantViolated(f"task {task.task_id!r}: a completed outcome goes with a completion id, and only it")
    return task


def _conforms(store: MemoryLifecycleStore) -> LifecycleStore:
    """Never called: makes mypy check the store and its transaction against the port."""
    return store
