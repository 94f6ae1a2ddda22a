"""What the lifecycle service needs from storage. SQLite is the first adapter; a
PostgreSQL adapter must pass the same conformance tests (tests/lifecycle/test_storage.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from google.protobuf.message import Message

from funnel.runtime.errors import Rejection
from lifecycle_service.core.intents import Intent
from lifecycle_service.core.model import ChildRef, IntentKind, LifecycleEvent, Situation, TaskRecord
from lifecycle_service.core.rules import Decision


@dataclass(frozen=True)
class Command:
    """One intent to apply atomically.

    `decide` is the pure core bound to the intent and policy; `render` builds the
    response that a repeat of `request_id` must return."""

    intent: Intent
    decide: Callable[[Situation], Decision]
    # Internal commands (propagations) have no caller and no response.
    render: Callable[[TaskRecord, LifecycleEvent], Message] | None = None
    # sha256 over the RPC name and the request; set exactly when intent.request_id is.
    fingerprint: bytes | None = None
    # The pending propagation this command discharges (internal commands only).
    propagation_id: int | None = None
    # The RPC, which with the caller and workspace scopes the intent's request_id.
    method: str = ""


@dataclass(frozen=True)
class Committed:
    task: TaskRecord
    event: LifecycleEvent
    response: Message | None
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


@dataclass(frozen=True)
class Discharged:
    """The propagation was already applied or dropped by someone else."""


ApplyResult = Committed | Replayed | Resettled | Rejection | Discharged


@dataclass(frozen=True)
class PendingPropagation:
    id: int
    workspace_id: str
    parent_task_id: str
    parent_generation: int
    parent_sequence: int
    child: ChildRef
    intent: IntentKind


@dataclass(frozen=True)
class TaskView:
    task: TaskRecord
    open_attached_children: tuple[ChildRef, ...]


class LifecycleStore(Protocol):
    async def apply(self, command: Command) -> ApplyResult:
        """In one write transaction: request-id check, load, decide, write record +
        event + propagations + remembered response, commit, then publish."""
        ...

    async def get_task(self, workspace_id: str, task_id: str) -> TaskView | None: ...

    async def list_tasks(
        self, workspace_id: str, after_task_id: str, limit: int, parent_task_id: str | None
    ) -> list[TaskRecord]: ...

    async def list_events(
        self, workspace_id: str, task_id: str, after_revision: int, limit: int
    ) -> list[LifecycleEvent]: ...

    async def events_after(
        self, workspace_id: str, after_sequence: int, task_id: str | None, limit: int
    ) -> list[LifecycleEvent]: ...

    async def pending_propagations(self, limit: int) -> list[PendingPropagation]: ...

    async def sweep_request_ids(self, created_before: int, limit: int) -> int:
        """Forgets up to `limit` request ids remembered before `created_before`; returns how many."""
        ...

    async def check_writable(self) -> None:
        """Raises StorageUnavailable when a write transaction cannot be taken."""
        ...

    async def close(self) -> None: ...
