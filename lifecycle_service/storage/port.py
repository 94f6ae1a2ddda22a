"""What the lifecycle service needs from storage: a narrow, synchronous transaction
(`LifecycleTx`, read-only subset `LifecycleReadTx`) made of one small protocol per
aggregate, the same shape as the completion service's, and the store that runs a
unit of work in one transaction (`LifecycleStore`, the one generic store of
funnel.runtime.store). Plain values only: no protobuf, no driver types.

    tx.requests      request ids and their remembered responses (funnel.runtime.idempotency)
    tx.tasks         task records: the one a unit changes, its parent, listings
    tx.events        the immutable event history
    tx.propagations  what a parent's committed transition owes its attached children (writes only)
    tx.load_figures  the operator's gauges, across the aggregates

The units of work live in `lifecycle_service.units`. Adapters: `storage.sqlite`
(SQLite), `storage.postgres` (PostgreSQL, several replicas on one database), one
module per aggregate each, and `storage.memory` (an in-memory fake); each passes
the conformance suite tests/lifecycle/test_storage.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from funnel.runtime.idempotency import RequestIdReads, RequestIds
from funnel.runtime.store import Transactions
from lifecycle_service.core.model import (
    ChildRef,
    GenerationState,
    IntentKind,
    LifecycleEvent,
    Outcome,
    Propagation,
    TaskRecord,
    WorkStatus,
)


class InvariantViolated(Exception):
    """A write would break, or a read found broken, an invariant the store keeps
    (a record changed under its write lock, a terminal task without its terminal
    event). Violated key or check constraints raise the adapter's own error."""


@dataclass(frozen=True)
class PendingPropagation:
    """An intent a parent's committed transition owes one attached child."""

    id: int
    workspace_id: str
    parent_task_id: str
    parent_generation: int
    parent_sequence: int
    child: ChildRef
    intent: IntentKind


@dataclass(frozen=True)
class TaskQuery:
    """Which tasks a listing wants: every filter given must hold (None, "": any)."""

    parent_task_id: str | None = None
    state: GenerationState | None = None
    outcome: Outcome | None = None
    work_status: WorkStatus | None = None
    task_id_prefix: str = ""

    def matches(self, task: TaskRecord) -> bool:
        return (
            (self.parent_task_id is None or (task.parent is not None and task.parent.task_id == self.parent_task_id))
            and self.state in (None, task.state)
            and self.outcome in (None, task.outcome)
            and self.work_status in (None, task.work_status)
            and task.task_id.startswith(self.task_id_prefix)
        )


@dataclass(frozen=True)
class TaskCount:
    """How many tasks of a workspace share one (state, outcome, work status)."""

    state: GenerationState
    outcome: Outcome | None
    work_status: WorkStatus
    tasks: int


@dataclass(frozen=True)
class LifecycleFigures:
    """What an operator watches of the store (the metrics' gauges), in one snapshot."""

    pending_propagations: int
    # Request ids remembered for replay.
    request_ids: int
    # Bytes the database takes on disk (its schema on PostgreSQL); None: nothing on disk.
    database_bytes: int | None


class TaskReads(Protocol):
    def load(self, workspace_id: str, task_id: str) -> TaskRecord | None:
        """In a write transaction, the record of the task the unit may change: nobody
        else changes it before this transaction ends (PostgreSQL: FOR UPDATE)."""
        ...

    def open_attached_children(self, task: TaskRecord, limit: int | None = None) -> tuple[ChildRef, ...]:
        """Attached children of the task's current generation that are not terminal, by task id."""
        ...

    def page(self, workspace_id: str, query: TaskQuery, after_task_id: str, limit: int) -> list[TaskRecord]:
        """Tasks matching `query` by task id, after `after_task_id`. Served from
        indexes: the primary key's order, or an index of the state, the outcome or
        the work status (open tasks and abnormal endings; completed tasks are in
        none, their filters read the key's order)."""
        ...

    def page_by_change(
        self, workspace_id: str, query: TaskQuery, before_sequence: int | None, limit: int
    ) -> list[tuple[int, TaskRecord]]:
        """Tasks matching `query`, most recent change first: (the sequence of its
        latest event, the task), before `before_sequence`. Read from the event
        history newest first, so a page costs the changes it passes over."""
        ...

    def count(self, workspace_id: str) -> list[TaskCount]:
        """The workspace's tasks counted by (state, outcome, work status), in that order."""
        ...


class Tasks(TaskReads, Protocol):
    def load_parent(self, workspace_id: str, task_id: str) -> TaskRecord | None:
        """The record of a task the unit depends on but does not change (the parent of
        the task it changes): it does not change before this transaction ends, while
        other such readers go on (PostgreSQL: FOR SHARE). So a child's transition and
        its parent's never decide on each other's stale state."""
        ...

    def insert(self, task: TaskRecord) -> None:
        """A new record (revision 1 of a new task id)."""
        ...

    def update(self, task: TaskRecord) -> None:
        """Replaces the record whose revision is `task.revision - 1` (InvariantViolated otherwise)."""
        ...


class EventReads(Protocol):
    def history(self, workspace_id: str, task_id: str, after_revision: int, limit: int) -> list[LifecycleEvent]:
        """One task's events by revision."""
        ...

    def page(self, workspace_id: str, after_sequence: int, task_id: str | None, limit: int) -> list[LifecycleEvent]:
        """A workspace's events (one task's if given) by sequence, after `after_sequence`."""
        ...

    def terminal(self, task: TaskRecord) -> LifecycleEvent:
        """The event that made the task's current generation terminal (InvariantViolated if none)."""
        ...

    def last_sequence(self) -> int:
        """The greatest sequence committed in any workspace; 0 before the first event."""
        ...


class Events(EventReads, Protocol):
    def append(self, event: LifecycleEvent) -> LifecycleEvent:
        """Stores the event; returns it with the sequence the store assigned: global and
        strictly increasing in commit order. (workspace, task, revision) is unique."""
        ...


class Propagations(Protocol):
    def insert(self, parent_event: LifecycleEvent, propagations: Sequence[Propagation], created_at: int) -> None:
        """Records what the committed `parent_event` owes each attached child."""
        ...

    def discharge(self, propagation_id: int) -> bool:
        """Removes a pending propagation; False when it was already discharged."""
        ...

    def claim(self, now: int, owner: str, lease_micros: int, limit: int) -> list[PendingPropagation]:
        """Up to `limit` pending propagations for `owner` to deliver, oldest first.

        The rows are claimed for `owner` until `now + lease_micros`: rows another owner
        claimed are skipped until its lease has run out; rows this owner claimed are
        returned again. Single-process adapters (SQLite, memory) keep no claim and
        return the oldest pending rows. Delivery is idempotent either way: applying a
        propagation discharges it in the child's transaction."""
        ...


class LifecycleReadTx(Protocol):
    """Reads inside one transaction: a consistent snapshot across calls."""

    @property
    def requests(self) -> RequestIdReads: ...

    @property
    def tasks(self) -> TaskReads: ...

    @property
    def events(self) -> EventReads: ...

    def load_figures(self) -> LifecycleFigures:
        """The store's figures for the metrics (counts over every workspace)."""
        ...


class LifecycleTx(LifecycleReadTx, Protocol):
    """One write transaction. Everything written commits together when the unit of
    work returns, or nothing does when it raises or returns a Rejection
    (funnel.runtime.store).

    `requests.recall` holds the request id until this transaction ends: a concurrent
    transaction with the same id (another replica) waits, then sees what this one
    remembered (PostgreSQL: a transaction-scoped advisory lock)."""

    @property
    def requests(self) -> RequestIds: ...

    @property
    def tasks(self) -> Tasks: ...

    @property
    def events(self) -> Events: ...

    @property
    def propagations(self) -> Propagations: ...


# What a shell holds: runs a unit in a write or a read transaction (funnel.runtime.store).
LifecycleStore = Transactions[LifecycleTx, LifecycleReadTx]
