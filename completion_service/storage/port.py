"""What the completion service needs from storage: each method is one atomic
step. SQLite is the first adapter; a PostgreSQL adapter must pass the same
conformance tests (tests/completion/test_storage.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from google.protobuf.message import Message

from completion_service.core.gates import ExternalAnswer, WorkspacePolicy
from completion_service.core.model import (
    CompletionRecord,
    Decision,
    FinalStatus,
    Lease,
    LifecycleView,
    RequestedOutcome,
    RunOutcome,
    RunRecord,
)


@dataclass(frozen=True)
class Remembered:
    """A request id seen before with an identical request: its stored response."""

    response: bytes


@dataclass(frozen=True)
class ClaimCommand:
    workspace_id: str
    task_id: str
    agent_id: str
    generation: int
    ttl_micros: int
    request_id: str | None
    fingerprint: bytes | None
    render: Callable[[RunRecord, Lease], Message]


@dataclass(frozen=True)
class Claimed:
    run: RunRecord
    lease: Lease


@dataclass(frozen=True)
class AttemptCommand:
    workspace_id: str
    task_id: str
    run_id: str
    claimed_epoch: int
    outcome: RequestedOutcome
    result: str
    # The state version the agent evaluated; None: the current one.
    state_version: int | None
    # Filled in by the authority: the lifecycle view read for this attempt and
    # the workspace's gate policy.
    lifecycle: LifecycleView | None = None
    policy: WorkspacePolicy | None = None
    request_id: str | None = None
    fingerprint: bytes | None = None
    # Answers of the policy's external gates, gathered on a snapshot with
    # `external_basis`; the commit fails with SNAPSHOT_CHANGED if that moved.
    external_answers: Mapping[str, ExternalAnswer] | None = None
    external_basis: tuple | None = None
    render: Callable[["AttemptOutcome"], Message] | None = None


@dataclass(frozen=True)
class AttemptOutcome:
    decision: Decision
    completion: CompletionRecord | None = None
    # True when the completion existed before this attempt.
    existing: bool = False
    # True when this attempt inserted the row (it must now be settled).
    inserted: bool = False


@dataclass(frozen=True)
class CloseCommand:
    workspace_id: str
    run_id: str
    outcome: RunOutcome
    tokens_input: int | None
    tokens_output: int | None
    tokens_total: int
    notes: str
    notes_truncated: bool
    error: str
    final_status: FinalStatus | None
    closed_by: str
    request_id: str | None = None
    fingerprint: bytes | None = None
    render: Callable[[RunRecord], Message] | None = None


@dataclass(frozen=True)
class Page:
    items: list
    more: bool = False


@dataclass(frozen=True)
class Settlement:
    """What the lifecycle service answered to a settle call."""

    lifecycle_revision: int | None = None
    lifecycle_event_sequence: int | None = None
    error_reason: str | None = None
    error_message: str | None = None

    @property
    def rejected(self) -> bool:
        return self.error_reason is not None
