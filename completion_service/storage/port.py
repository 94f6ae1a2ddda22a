"""What the completion service needs from storage: each method is one atomic
step. SQLite is the first adapter; a PostgreSQL adapter must pass the same
conformance tests (tests/completion/test_storage.py, tests/transcripts)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from google.protobuf.message import Message

from completion_service.core.gates import ExternalAnswer, SnapshotBasis, WorkspacePolicy
from completion_service.core.model import (
    CompletionEvent,
    CompletionRecord,
    Decision,
    EvidenceRecord,
    FinalStatus,
    Lease,
    LifecycleView,
    RequestedOutcome,
    RunOutcome,
    RunRecord,
    Snapshot,
)
from completion_service.core.transcript import SessionEvent, Tail
from funnel.auth.principal import Caller
from funnel.runtime.errors import Rejection
from funnel.runtime.idempotency import RequestKey


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
    request: RequestKey | None
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
    request: RequestKey | None = None
    # The agent that must hold the run (a caller acting as an agent), or None.
    holder: str | None = None
    # Answers of the policy's external gates, gathered on a snapshot with
    # `external_basis`; the commit fails with SNAPSHOT_CHANGED if that moved.
    external_answers: Mapping[str, ExternalAnswer] | None = None
    external_basis: SnapshotBasis | None = None
    render: Callable[[AttemptOutcome], Message] | None = None


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
    # Who closed it, recorded on the audit row.
    caller: Caller
    request: RequestKey | None = None
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


class CompletionCorrupted(Exception):
    """A stored completion carries this attempt's identity with another payload."""

    def __init__(self, completion_id: str) -> None:
        super().__init__(f"completion {completion_id} has a matching identity but a different payload")
        self.completion_id = completion_id


@dataclass(frozen=True)
class Appended:
    state_version: int
    first_sequence: int


@dataclass(frozen=True)
class TranscriptPage:
    events: list[SessionEvent]
    state_version: int
    more: bool
    repaired: bool = False
    turn_in_progress: bool = False


class CompletionStore(Protocol):
    """Mutations return their result, a Rejection (nothing changed), or Remembered
    (the stored response of a repeated request id). Events a mutation appends are
    published after its commit, in commit order."""

    async def recall(self, request: RequestKey | None) -> Remembered | Rejection | None: ...
    async def claim(self, command: ClaimCommand) -> Claimed | Remembered | Rejection: ...
    async def withdraw_claim(self, workspace_id: str, run_id: str, request: RequestKey | None, reason: str) -> None: ...
    async def renew(
        self,
        workspace_id: str,
        run_id: str,
        epoch: int,
        ttl_micros: int,
        holder: str | None,
        request: RequestKey | None,
        render: Callable[[Lease], Message],
    ) -> Lease | Remembered | Rejection: ...
    async def close_run(self, command: CloseCommand) -> RunRecord | Remembered | Rejection: ...
    async def get_run(self, workspace_id: str, run_id: str) -> RunRecord | None: ...
    async def list_runs(self, workspace_id: str, task_id: str | None, before: tuple | None, limit: int) -> Page: ...
    async def stalled_runs(self, now: int, stall_after_micros: int, limit: int) -> list[RunRecord]: ...
    async def record_evidence(
        self,
        record: EvidenceRecord,
        holder: str | None,
        request: RequestKey | None,
        render: Callable[[EvidenceRecord], Message],
    ) -> EvidenceRecord | Remembered | Rejection: ...
    async def list_evidence(self, workspace_id: str, task_id: str, generation: int) -> list[EvidenceRecord]: ...
    async def snapshot(self, command: AttemptCommand) -> Snapshot | Rejection: ...
    async def attempt(self, command: AttemptCommand) -> AttemptOutcome | Remembered | Rejection:
        """Steps 1-5 of the completion transaction; raises CompletionCorrupted."""
        ...

    async def record_settlement(
        self, completion: CompletionRecord, settlement: Settlement
    ) -> CompletionRecord | None: ...
    async def postpone_settlement(self, completion: CompletionRecord, next_attempt_at: int) -> None: ...
    async def due_settlements(self, now: int, limit: int) -> list[CompletionRecord]: ...
    async def get_completion(self, workspace_id: str, task_id: str, generation: int) -> CompletionRecord | None: ...
    async def settled_completion(self, workspace_id: str, task_id: str, generation: int) -> CompletionRecord | None: ...
    async def list_completions(
        self, workspace_id: str, task_id: str | None, after: tuple | None, limit: int
    ) -> Page: ...
    async def events_after(
        self, workspace_id: str, after_sequence: int, task_id: str | None, limit: int
    ) -> list[CompletionEvent]: ...
    async def list_audit(
        self, workspace_id: str, task_id: str | None, run_id: str | None, after_id: int, limit: int
    ) -> Page: ...
    async def transcript_tail(self, workspace_id: str, task_id: str) -> tuple[Tail, int]: ...
    async def checkpoint_sequences(self, workspace_id: str, task_id: str, ids: set[str]) -> dict[str, int]: ...
    async def append_transcript(self, workspace_id: str, task_id: str, events: Sequence[SessionEvent], generation: int,
                                expected_state_version: int | None, holder: str | None, request: RequestKey | None,
                                render: Callable[[Appended], Message]) -> Appended | Remembered | Rejection: ...
    async def load_transcript(self, workspace_id: str, task_id: str, after_sequence: int, limit: int, *,
                              repair_first: bool) -> TranscriptPage: ...
    async def transcript_events_after(
        self, workspace_id: str, task_id: str, after_sequence: int, limit: int
    ) -> list[SessionEvent]: ...
    async def stage_import(self, import_id: str, events: Sequence[SessionEvent]) -> None: ...
    async def discard_import(self, import_id: str) -> None: ...
    async def discard_all_imports(self) -> None: ...
    async def commit_import(self, import_id: str, workspace_id: str, task_id: str, final_tail: Tail,
                            checkpoints: dict[str, int]) -> int | Rejection: ...
    async def sweep_request_ids(self, created_before: int, limit: int) -> int: ...
    async def check_writable(self) -> None: ...
    async def close(self) -> None: ...
