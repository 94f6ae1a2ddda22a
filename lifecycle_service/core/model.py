"""Plain values of the lifecycle domain. Enum values equal the contract's numbers."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from funnel.auth.principal import Caller


class GenerationState(enum.Enum):
    REGISTERED = 1
    ACTIVE = 2
    SUSPENDED = 3
    TERMINAL = 4


class Outcome(enum.Enum):
    COMPLETED = 1
    CANCELLED = 2
    FAILED = 3
    TIMED_OUT = 4


class WorkStatus(enum.Enum):
    READY = 1
    IN_PROGRESS = 2
    BLOCKED = 3
    DONE = 4
    CANCELLED = 5


SETTABLE_WORK_STATUSES = frozenset({WorkStatus.READY, WorkStatus.IN_PROGRESS, WorkStatus.BLOCKED})


class LinkMode(enum.Enum):
    ATTACHED = 1
    DETACHED = 2


class IntentKind(enum.Enum):
    REGISTER_TASK = 1
    ACTIVATE_GENERATION = 2
    SUSPEND_GENERATION = 3
    RESUME_WITH_GENERATION = 4
    REQUEST_CANCELLATION = 5
    SETTLE_CANCELLATION = 6
    SETTLE_COMPLETION = 7
    SETTLE_FAILURE = 8
    SETTLE_TIMEOUT = 9
    PROPAGATE_PARENT_TERMINATION = 10
    SET_WORK_STATUS = 11


@dataclass(frozen=True)
class Cause:
    source: str = ""
    reason: str = ""
    # Sorted (key, value) pairs, so equal causes compare equal.
    originating_ids: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ParentLink:
    task_id: str
    generation: int
    mode: LinkMode


@dataclass(frozen=True)
class TaskRecord:
    workspace_id: str
    task_id: str
    generation: int
    revision: int
    state: GenerationState
    outcome: Outcome | None
    cancellation_requested_at: int | None
    work_status: WorkStatus
    parent: ParentLink | None
    completion_id: str | None
    created_at: int
    updated_at: int

    @property
    def terminal(self) -> bool:
        return self.state is GenerationState.TERMINAL

    @property
    def fenced(self) -> bool:
        return self.cancellation_requested_at is not None

    @property
    def attached_parent(self) -> ParentLink | None:
        return self.parent if self.parent and self.parent.mode is LinkMode.ATTACHED else None


@dataclass(frozen=True)
class LifecycleEvent:
    """One committed transition. `sequence` is 0 until the store assigns it."""

    workspace_id: str
    task_id: str
    generation: int
    revision: int
    intent: IntentKind
    from_state: GenerationState | None
    to_state: GenerationState
    outcome: Outcome | None
    cancellation_requested_at: int | None
    work_status: WorkStatus
    cause: Cause
    completion_id: str | None
    authoritative_at: int | None
    committed_at: int
    request_id: str | None
    caller: Caller = Caller()
    # Set on a child task's registration event: watchers learn its parent from it.
    parent: ParentLink | None = None
    sequence: int = 0


@dataclass(frozen=True)
class ChildRef:
    task_id: str
    generation: int


@dataclass(frozen=True)
class Propagation:
    """An intent the parent's transition owes to one attached child, applied in the
    child's own transaction after the parent's commit (and replayed after a crash)."""

    child: ChildRef
    intent: IntentKind


@dataclass(frozen=True)
class Policy:
    # Clocks of two services are never assumed equal: a completion passes a
    # cancellation fence only when it predates it by more than this.
    max_clock_offset_micros: int = 500_000


@dataclass(frozen=True)
class Situation:
    """What the shell loaded inside the write transaction, for one intent."""

    now: int
    task: TaskRecord | None
    # The parent named by the task's link (or by a RegisterTask intent), if any.
    parent: TaskRecord | None = None
    # Attached children of the task's current generation that are not terminal.
    open_attached_children: tuple[ChildRef, ...] = field(default_factory=tuple)
