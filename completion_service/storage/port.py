"""What the completion service needs from storage: a narrow, synchronous
transaction (`CompletionTx`, its read-only subset `CompletionReadTx`) made of one
small protocol per aggregate, and the store that runs one unit of work in one
transaction (`CompletionStore`, the one generic store of funnel.runtime.store).
Plain values only: no protobuf (stored responses are bytes), no driver types.

    tx.requests      request ids and their remembered responses (funnel.runtime.idempotency)
    tx.runs          runs and the task leases they hold
    tx.evidence      evidence facts of a task generation
    tx.completions   a generation's completion, its settlement outbox, and the
                     judged attempts (the circuit breaker's count)
    tx.events        the two append-only logs read by cursor: completion events
                     and the audit log
    tx.transcripts   transcript events, checkpoints and the tail
    tx.imports       the staging area of streamed transcript imports (writes only)
    tx.load_figures  the operator's gauges, across every aggregate

Each read protocol (`RunReads`, …) is what a read transaction offers; each write
protocol (`Runs`, …) adds the writes. The units of work that use them are plain
functions of the application layer (completion_service.units). Adapters only map
rows: `storage.sqlite`, `storage.postgres` (one module per aggregate each) and
`storage.memory` (an in-memory fake); each passes the conformance suite
tests/completion/test_storage.py."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from completion_service.core.model import (
    AuditEntry,
    CompletionEvent,
    CompletionRecord,
    EvidenceRecord,
    Lease,
    RunRecord,
    SettlementStatus,
    Verdict,
)
from completion_service.core.transcript import SessionEvent, Tail
from funnel.runtime.idempotency import RequestIdReads, RequestIds
from funnel.runtime.store import Transactions


@dataclass(frozen=True)
class AttemptRecord:
    """One judged completion attempt (what the circuit breaker counts)."""

    workspace_id: str
    task_id: str
    generation: int
    run_id: str
    checkpoint: str
    result_digest: str
    verdict: Verdict
    state_version: int
    attempted_at: int


@dataclass(frozen=True)
class TranscriptState:
    """A transcript's tail (what is open, its last sequence) and its state version."""

    tail: Tail = field(default_factory=Tail)
    state_version: int = 0


@dataclass(frozen=True)
class CompletionFigures:
    """What an operator watches of the store (the metrics' gauges), in one snapshot."""

    # The settlement outbox: completions still PENDING, and when the oldest was committed.
    pending_settlements: int
    oldest_pending_committed_at: int | None
    open_runs: int
    # Open runs whose lease had not expired at the `now` asked about.
    live_leases: int
    # Request ids remembered for replay.
    request_ids: int
    # Bytes the database takes on disk (its schema on PostgreSQL); None: nothing on disk.
    database_bytes: int | None


class RunReads(Protocol):
    def load(self, workspace_id: str, run_id: str) -> RunRecord | None: ...

    def page(
        self,
        workspace_id: str,
        task_id: str | None,
        before: tuple[int, str] | None,
        limit: int,
        open_only: bool = False,
    ) -> list[RunRecord]:
        """Runs newest first by (claimed_at, run_id), before the cursor; one task's if
        given; only open ones if asked, read from an index of open runs."""
        ...

    def load_lease(self, workspace_id: str, task_id: str) -> Lease | None: ...


class Runs(RunReads, Protocol):
    def insert(self, run: RunRecord) -> None: ...

    def update(self, run: RunRecord) -> None:
        """Stores the run's lease expiry and closing fields."""
        ...

    def save_lease(self, workspace_id: str, lease: Lease) -> None:
        """Inserts or replaces the lease of `lease.task_id`."""
        ...

    def claim_stalled(self, expired_before: int, limit: int) -> list[RunRecord]:
        """Up to `limit` open runs whose lease expired before `expired_before`, oldest
        expiry first, for this transaction to close. (An engine shared by replicas
        skips rows another transaction holds.)"""
        ...


class EvidenceReads(Protocol):
    def load(self, workspace_id: str, task_id: str, generation: int) -> list[EvidenceRecord]:
        """A generation's evidence in the order it was recorded."""
        ...

    def page(
        self, workspace_id: str, task_id: str, generation: int | None, after: tuple[int, str] | None, limit: int
    ) -> list[EvidenceRecord]:
        """A task's evidence (one generation's if given) by (recorded_at, evidence_id), after the cursor."""
        ...


class Evidence(EvidenceReads, Protocol):
    def insert(self, record: EvidenceRecord) -> None: ...


class CompletionReads(Protocol):
    def load(self, workspace_id: str, task_id: str, generation: int) -> CompletionRecord | None: ...

    def page(
        self,
        workspace_id: str,
        task_id: str | None,
        settlement: SettlementStatus | None,
        after: tuple[int, str] | None,
        limit: int,
    ) -> list[CompletionRecord]:
        """Completions by (committed_at, completion_id), after the cursor; one task's
        and those with one settlement status if given. The settlement filter is
        served by an index: the pending ones (the outbox) are found without
        reading the settled ones."""
        ...

    def load_attempts(self, workspace_id: str, task_id: str, generation: int) -> list[AttemptRecord]:
        """A generation's judged attempts in the order they were made."""
        ...


class Completions(CompletionReads, Protocol):
    def insert(self, record: CompletionRecord) -> None:
        """A new completion of its task generation, due for settlement at `record.next_settle_at`."""
        ...

    def delete(self, workspace_id: str, task_id: str, generation: int) -> None: ...

    def update(self, record: CompletionRecord) -> None:
        """Stores the completion's settlement fields (settlement, attempts, when the
        outbox tries next and the last error, the lifecycle answer, its error)."""
        ...

    def claim_due(self, now: int, owner: str, lease_micros: int, limit: int) -> list[CompletionRecord]:
        """Up to `limit` pending completions due at `now`, earliest first, for `owner` to settle.

        Rows another owner claimed less than `lease_micros` ago are skipped. Single-process
        adapters (SQLite, memory) keep no claim and return the due rows. Settling is
        idempotent either way: the lifecycle deduplicates the settle request id and a
        settlement is recorded only while the row is pending."""
        ...

    def insert_attempt(self, attempt: AttemptRecord) -> None: ...


class EventReads(Protocol):
    def page(self, workspace_id: str, after_sequence: int, task_id: str | None, limit: int) -> list[CompletionEvent]:
        """A workspace's completion events (one task's if given) by sequence."""
        ...

    def audit_page(
        self, workspace_id: str, task_id: str | None, run_id: str | None, after_id: int, limit: int
    ) -> list[AuditEntry]:
        """Audit rows by audit_id, after `after_id`, filtered by task and run if given."""
        ...


class Events(EventReads, Protocol):
    def append(self, event: CompletionEvent) -> CompletionEvent:
        """Stores the event; returns it with the sequence the store assigned (strictly
        increasing in commit order). At most one terminal event per completion."""
        ...

    def append_audit(self, entry: AuditEntry) -> None: ...


class TranscriptReads(Protocol):
    def load_tail(self, workspace_id: str, task_id: str) -> TranscriptState:
        """The transcript's tail and state version (empty and 0 without a transcript)."""
        ...

    def load_checkpoints(self, workspace_id: str, task_id: str, ids: Collection[str]) -> dict[str, int]:
        """Where each of the named checkpoints was first created (unknown ones are left out)."""
        ...

    def page(self, workspace_id: str, task_id: str, after_sequence: int, limit: int) -> list[SessionEvent]:
        """Transcript events by sequence, after `after_sequence`."""
        ...


class Transcripts(TranscriptReads, Protocol):
    def append(self, workspace_id: str, task_id: str, events: Sequence[SessionEvent]) -> None:
        """Appends stamped events (their sequences follow the tail's last sequence)."""
        ...

    def insert_checkpoints(self, workspace_id: str, task_id: str, checkpoints: Mapping[str, int]) -> None:
        """Records where new checkpoints were created."""
        ...

    def save_tail(self, workspace_id: str, task_id: str, state: TranscriptState) -> None: ...


class Imports(Protocol):
    def stage(self, import_id: str, events: Sequence[SessionEvent]) -> None:
        """Adds validated events of a streamed import to its staging area."""
        ...

    def move(self, import_id: str, workspace_id: str, task_id: str) -> None:
        """Appends the import's staged events to the (empty) transcript and empties its staging area."""
        ...

    def discard(self, import_id: str | None) -> None:
        """Empties the staging area of one import, or of every import (None)."""
        ...


class CompletionReadTx(Protocol):
    """Reads inside one transaction: a consistent snapshot across calls."""

    @property
    def requests(self) -> RequestIdReads: ...

    @property
    def runs(self) -> RunReads: ...

    @property
    def evidence(self) -> EvidenceReads: ...

    @property
    def completions(self) -> CompletionReads: ...

    @property
    def events(self) -> EventReads: ...

    @property
    def transcripts(self) -> TranscriptReads: ...

    def load_figures(self, now: int) -> CompletionFigures:
        """The store's figures for the metrics (counts over every workspace)."""
        ...


class CompletionTx(CompletionReadTx, Protocol):
    """One write transaction. What the unit of work wrote commits when it returns,
    unless it returns a Rejection; nothing of it is applied when it raises or
    returns a Rejection (funnel.runtime.store). Violated keys raise the adapter's
    own error."""

    @property
    def requests(self) -> RequestIds: ...

    @property
    def runs(self) -> Runs: ...

    @property
    def evidence(self) -> Evidence: ...

    @property
    def completions(self) -> Completions: ...

    @property
    def events(self) -> Events: ...

    @property
    def transcripts(self) -> Transcripts: ...

    @property
    def imports(self) -> Imports: ...


# What a shell holds: runs a unit in a write or a read transaction (funnel.runtime.store).
CompletionStore = Transactions[CompletionTx, CompletionReadTx]
