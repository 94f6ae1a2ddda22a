"""The projection of one workspace's lifecycle records (issue 13): what the
lifecycle service last said about each task, kept current by its event stream,
so that an attempt is judged without asking it again.

Only a view the gates would let through is served (not terminal, no cancellation
request, no open attached child): the lifecycle service fences every settlement
again, so a projection that lags behind a change can cost a refused settlement,
never a wrong block, and anything that would block is read fresh.

A record enters only from a read (GetTask) that no change overtook: a change
delivered while the read was under way that the read may not reflect (a newer
revision of the task, a child opened that it does not list, the end of a child
it lists) makes the read count for its own attempt only. A child opens when it
registers and when it resumes into a new generation: both events name its parent
link (LifecycleEvent.parent), so an ended child of a projected task that resumes
is seen as open again. The shell starts a new projection each time its event
stream goes live from the head, and keeps none while the stream is down.

Plain data only: the shell (authority/projection.py) converts events and reads."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from completion_service.core.model import LifecycleState, LifecycleView

# GetTask lists at most this many open attached children: a full list may be cut short.
LISTED_CHILDREN = 1000


@dataclass(frozen=True, slots=True)
class Change:
    """One lifecycle event, as the projection reads it."""

    task_id: str
    generation: int
    revision: int
    state: LifecycleState
    outcome: str | None
    cancellation_requested: bool
    # An attached child opening (registered, or resumed into a new generation):
    # its parent's (task id, generation).
    attached_to: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)  # one per projected task: kept small
class Record:
    """One task's lifecycle record as read or as changed since."""

    generation: int
    revision: int
    state: LifecycleState
    outcome: str | None
    cancellation_requested: bool
    open_children: frozenset[str] = frozenset()

    def view(self) -> LifecycleView:
        return LifecycleView(
            generation=self.generation,
            state=self.state,
            outcome=self.outcome,
            cancellation_requested=self.cancellation_requested,
            open_attached_children=tuple(sorted(self.open_children)),
        )


@dataclass(eq=False)  # each read is itself: two reads of one task are two readings
class Reading:
    """A read of one task under way, and the changes delivered meanwhile."""

    task_id: str
    # Per task, the greatest revision a change delivered meanwhile carried.
    revisions: dict[str, int] = field(default_factory=dict)
    # (parent, child) of the attached children opened meanwhile.
    opened: set[tuple[str, str]] = field(default_factory=set)
    # The tasks that ended meanwhile.
    ended: set[str] = field(default_factory=set)

    def note(self, change: Change) -> None:
        self.revisions[change.task_id] = max(change.revision, self.revisions.get(change.task_id, 0))
        if change.attached_to is not None:
            self.opened.add((change.attached_to[0], change.task_id))
        if change.state is LifecycleState.TERMINAL:
            self.ended.add(change.task_id)

    def overtaken(self, record: Record) -> bool:
        """Whether a change delivered meanwhile may be missing from what it read."""
        return (
            self.revisions.get(self.task_id, 0) > record.revision
            or any(parent == self.task_id and child not in record.open_children for parent, child in self.opened)
            or bool(self.ended & record.open_children)
        )


class WorkspaceProjection:
    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._records: collections.OrderedDict[str, Record] = collections.OrderedDict()
        # Attached children of each projected task's current generation, open or
        # not (a terminal child may resume), and the way back.
        self._children: dict[str, set[str]] = {}
        self._parent: dict[str, str] = {}
        self._readings: list[Reading] = []

    def __len__(self) -> int:
        return len(self._records)

    def view(self, task_id: str) -> LifecycleView | None:
        """The task's view if it may be served without a read, else None."""
        record = self._records.get(task_id)
        if record is None or not servable(record):
            return None
        self._records.move_to_end(task_id)
        return record.view()

    def begin_read(self, task_id: str) -> Reading:
        reading = Reading(task_id)
        self._readings.append(reading)
        return reading

    def end_read(self, reading: Reading, record: Record | None) -> None:
        """Takes what the read returned (None: it failed) if no change overtook it."""
        self._readings.remove(reading)
        if record is None:
            return
        self._forget(reading.task_id)
        if reading.overtaken(record) or len(record.open_children) >= LISTED_CHILDREN:
            return
        self._records[reading.task_id] = record
        if record.open_children:
            self._children[reading.task_id] = set(record.open_children)
        for child in record.open_children:
            self._parent[child] = reading.task_id
        while len(self._records) > self._capacity:
            self._forget(next(iter(self._records)))

    def apply(self, change: Change) -> None:
        for reading in self._readings:
            reading.note(change)
        parent = self._parent.get(change.task_id)
        record = self._records.get(change.task_id)
        if record is not None and change.revision > record.revision:
            if change.generation != record.generation:  # the children were the old generation's
                self._drop_children(change.task_id)
                record = after(record, change, frozenset())
            else:
                record = after(record, change, record.open_children)
            self._records[change.task_id] = record
        if change.attached_to is not None:
            self._child_opened(change)
        elif parent is not None:
            self._child_changed(parent, change)

    def _child_opened(self, change: Change) -> None:
        assert change.attached_to is not None
        parent_id, generation = change.attached_to
        parent = self._records.get(parent_id)
        if parent is None or parent.generation != generation:
            return
        self._children.setdefault(parent_id, set()).add(change.task_id)
        self._parent[change.task_id] = parent_id
        self._child_changed(parent_id, change)

    def _child_changed(self, parent_id: str, change: Change) -> None:
        parent = self._records[parent_id]
        open_children = set(parent.open_children)
        if change.state is LifecycleState.TERMINAL:
            open_children.discard(change.task_id)
        else:
            open_children.add(change.task_id)
        self._records[parent_id] = Record(
            parent.generation,
            parent.revision,
            parent.state,
            parent.outcome,
            parent.cancellation_requested,
            frozenset(open_children),
        )

    def _forget(self, task_id: str) -> None:
        self._records.pop(task_id, None)
        self._drop_children(task_id)

    def _drop_children(self, task_id: str) -> None:
        for child in self._children.pop(task_id, ()):
            self._parent.pop(child, None)


def servable(record: Record) -> bool:
    """Whether the gates may be run on the record without a read: nothing in it
    would block, so a lagging record can only let through what the lifecycle
    service's own fences then refuse."""
    return (
        record.state is not LifecycleState.TERMINAL and not record.cancellation_requested and not record.open_children
    )


def after(record: Record, change: Change, open_children: frozenset[str]) -> Record:
    return Record(
        change.generation,
        change.revision,
        change.state,
        change.outcome,
        change.cancellation_requested,
        open_children,
    )
