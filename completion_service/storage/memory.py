"""The in-memory fake of the completion store: dicts and tuples with the port's
transaction semantics (funnel.runtime.store.MemoryEngine: a write works on a
copy of the state, so a unit that raises or refuses leaves nothing behind). It
keeps the keys the SQLite schema keeps unique, raising DuplicateKey.

For the application-layer unit tests and the conformance suite; not durable."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from completion_service.core.model import (
    AuditEntry,
    CompletionEvent,
    CompletionEventKind,
    CompletionRecord,
    EvidenceRecord,
    Lease,
    RunRecord,
    SettlementStatus,
)
from completion_service.core.transcript import SessionEvent
from completion_service.storage.port import AttemptRecord, CompletionFigures, CompletionStore, TranscriptState
from funnel.runtime.idempotency import RequestKey
from funnel.runtime.store import MemoryEngine, Store

_TaskKey = tuple[str, str]
_GenerationKey = tuple[str, str, int]
_RequestScope = tuple[str, str, str, str]
_TERMINAL = (CompletionEventKind.COMPLETION_SETTLED, CompletionEventKind.TERMINALIZATION_ERROR)


class DuplicateKey(Exception):
    """A write would break a key the schema keeps unique."""


@dataclass(frozen=True)
class _Remembered:
    fingerprint: bytes
    response: bytes
    created_at: int


@dataclass
class _State:
    """Containers hold immutable values only: a shallow copy of each is a snapshot."""

    requests: dict[_RequestScope, _Remembered] = field(default_factory=dict)
    runs: dict[_TaskKey, RunRecord] = field(default_factory=dict)
    leases: dict[_TaskKey, Lease] = field(default_factory=dict)
    evidence: dict[_GenerationKey, tuple[EvidenceRecord, ...]] = field(default_factory=dict)
    evidence_ids: frozenset[str] = frozenset()
    attempts: dict[_GenerationKey, tuple[AttemptRecord, ...]] = field(default_factory=dict)
    completions: dict[_GenerationKey, CompletionRecord] = field(default_factory=dict)
    events: tuple[CompletionEvent, ...] = ()
    last_sequence: int = 0
    terminal: frozenset[str] = frozenset()
    audit: tuple[AuditEntry, ...] = ()
    tails: dict[_TaskKey, TranscriptState] = field(default_factory=dict)
    transcripts: dict[_TaskKey, tuple[SessionEvent, ...]] = field(default_factory=dict)
    checkpoints: dict[_TaskKey, dict[str, int]] = field(default_factory=dict)
    staging: dict[str, tuple[SessionEvent, ...]] = field(default_factory=dict)

    def copy(self) -> _State:
        return dataclasses.replace(
            self,
            requests=dict(self.requests),
            runs=dict(self.runs),
            leases=dict(self.leases),
            evidence=dict(self.evidence),
            attempts=dict(self.attempts),
            completions=dict(self.completions),
            tails=dict(self.tails),
            transcripts=dict(self.transcripts),
            checkpoints={key: dict(found) for key, found in self.checkpoints.items()},
            staging=dict(self.staging),
        )


class _Aggregate:
    """What the fake's aggregates share: the state of their transaction, and
    whether it is a write (a write transaction works on its own copy)."""

    def __init__(self, state: _State, read_only: bool) -> None:
        self._s = state
        self._read_only = read_only

    def _writing(self) -> _State:
        if self._read_only:
            raise TypeError("a read transaction writes nothing")
        return self._s


class MemoryRequestIds(_Aggregate):
    def recall(self, workspace_id: str, caller: str, method: str, request_id: str) -> tuple[bytes, bytes] | None:
        found = self._s.requests.get((workspace_id, caller, method, request_id))
        return (found.fingerprint, found.response) if found else None

    def remember(self, key: RequestKey, response: bytes, created_at: int) -> None:
        scope = (key.workspace_id, key.caller, key.method, key.request_id)
        requests = self._writing().requests
        if scope in requests:
            raise DuplicateKey(f"request id {scope}")
        requests[scope] = _Remembered(key.fingerprint, response, created_at)

    def forget(self, created_before: int, limit: int) -> int:
        requests = self._writing().requests
        old = sorted((r.created_at, scope) for scope, r in requests.items() if r.created_at < created_before)
        for _, scope in old[:limit]:
            del requests[scope]
        return len(old[:limit])


class MemoryRuns(_Aggregate):
    def load(self, workspace_id: str, run_id: str) -> RunRecord | None:
        return self._s.runs.get((workspace_id, run_id))

    def page(
        self,
        workspace_id: str,
        task_id: str | None,
        before: tuple[int, str] | None,
        limit: int,
        open_only: bool = False,
    ) -> list[RunRecord]:
        runs = sorted(
            (
                r
                for (ws, _), r in self._s.runs.items()
                if ws == workspace_id
                and (not task_id or r.task_id == task_id)
                and (not open_only or r.open)
                and (before is None or (r.claimed_at, r.run_id) < before)
            ),
            key=lambda r: (r.claimed_at, r.run_id),
            reverse=True,
        )
        return runs[:limit]

    def insert(self, run: RunRecord) -> None:
        runs = self._writing().runs
        if (run.workspace_id, run.run_id) in runs:
            raise DuplicateKey(f"run {run.run_id}")
        runs[(run.workspace_id, run.run_id)] = run

    def update(self, run: RunRecord) -> None:
        runs = self._writing().runs
        stored = runs.get((run.workspace_id, run.run_id))
        if stored is None:
            return
        runs[(run.workspace_id, run.run_id)] = dataclasses.replace(
            stored,
            lease_expires_at=run.lease_expires_at,
            finished_at=run.finished_at,
            outcome=run.outcome,
            tokens_input=run.tokens_input,
            tokens_output=run.tokens_output,
            tokens_total=run.tokens_total,
            notes=run.notes,
            notes_truncated=run.notes_truncated,
            error=run.error,
            final_status=run.final_status,
        )

    def claim_stalled(self, expired_before: int, limit: int) -> list[RunRecord]:
        stalled = [r for r in self._s.runs.values() if r.open and r.lease_expires_at <= expired_before]
        return sorted(stalled, key=lambda r: r.lease_expires_at)[:limit]

    def load_lease(self, workspace_id: str, task_id: str) -> Lease | None:
        return self._s.leases.get((workspace_id, task_id))

    def save_lease(self, workspace_id: str, lease: Lease) -> None:
        self._writing().leases[(workspace_id, lease.task_id)] = lease


class MemoryEvidence(_Aggregate):
    def load(self, workspace_id: str, task_id: str, generation: int) -> list[EvidenceRecord]:
        return list(self._s.evidence.get((workspace_id, task_id, generation), ()))

    def page(
        self, workspace_id: str, task_id: str, generation: int | None, after: tuple[int, str] | None, limit: int
    ) -> list[EvidenceRecord]:
        facts = sorted(
            (
                record
                for (ws, task, gen), records in self._s.evidence.items()
                if (ws, task) == (workspace_id, task_id) and generation in (None, gen)
                for record in records
            ),
            key=lambda r: (r.recorded_at, r.evidence_id),
        )
        return [r for r in facts if after is None or (r.recorded_at, r.evidence_id) > after][:limit]

    def insert(self, record: EvidenceRecord) -> None:
        state = self._writing()
        if record.evidence_id in state.evidence_ids:
            raise DuplicateKey(f"evidence {record.evidence_id}")
        state.evidence_ids = state.evidence_ids | {record.evidence_id}
        key = (record.workspace_id, record.task_id, record.generation)
        state.evidence[key] = state.evidence.get(key, ()) + (record,)


class MemoryCompletions(_Aggregate):
    def load(self, workspace_id: str, task_id: str, generation: int) -> CompletionRecord | None:
        found = self._s.completions.get((workspace_id, task_id, generation))
        return _as_read(found) if found else None

    def page(
        self,
        workspace_id: str,
        task_id: str | None,
        settlement: SettlementStatus | None,
        after: tuple[int, str] | None,
        limit: int,
    ) -> list[CompletionRecord]:
        found = sorted(
            (
                c
                for (ws, _, _), c in self._s.completions.items()
                if ws == workspace_id
                and (not task_id or c.task_id == task_id)
                and (settlement is None or c.settlement is settlement)
                and (after is None or (c.committed_at, c.completion_id) > after)
            ),
            key=lambda c: (c.committed_at, c.completion_id),
        )
        return [_as_read(c) for c in found[:limit]]

    def insert(self, record: CompletionRecord) -> None:
        completions = self._writing().completions
        key = (record.workspace_id, record.task_id, record.generation)
        if key in completions or any(c.completion_id == record.completion_id for c in completions.values()):
            raise DuplicateKey(f"completion {record.completion_id} of {key}")
        completions[key] = record

    def delete(self, workspace_id: str, task_id: str, generation: int) -> None:
        self._writing().completions.pop((workspace_id, task_id, generation), None)

    def update(self, record: CompletionRecord) -> None:
        completions = self._writing().completions
        key = (record.workspace_id, record.task_id, record.generation)
        stored = completions.get(key)
        if stored is None:
            return
        completions[key] = dataclasses.replace(
            stored,
            settlement=record.settlement,
            settle_attempts=record.settle_attempts,
            # As the SQL schema: the due time is kept when none is given (_as_read hides it).
            next_settle_at=stored.next_settle_at if record.next_settle_at is None else record.next_settle_at,
            last_settle_error=record.last_settle_error,
            lifecycle_revision=record.lifecycle_revision,
            lifecycle_event_sequence=record.lifecycle_event_sequence,
            settled_at=record.settled_at,
            error_reason=record.error_reason,
            error_message=record.error_message,
        )

    def claim_due(self, now: int, owner: str, lease_micros: int, limit: int) -> list[CompletionRecord]:
        # One process: no claim is recorded (see the port).
        due = [
            c
            for c in self._s.completions.values()
            if c.settlement is SettlementStatus.PENDING and c.next_settle_at is not None and c.next_settle_at <= now
        ]
        return [_as_read(c) for c in sorted(due, key=lambda c: c.next_settle_at or 0)[:limit]]

    def load_attempts(self, workspace_id: str, task_id: str, generation: int) -> list[AttemptRecord]:
        return list(self._s.attempts.get((workspace_id, task_id, generation), ()))

    def insert_attempt(self, attempt: AttemptRecord) -> None:
        attempts = self._writing().attempts
        key = (attempt.workspace_id, attempt.task_id, attempt.generation)
        attempts[key] = attempts.get(key, ()) + (attempt,)


class MemoryEvents(_Aggregate):
    def append(self, event: CompletionEvent) -> CompletionEvent:
        state = self._writing()
        if event.kind in _TERMINAL:
            if event.completion_id in state.terminal:
                raise DuplicateKey(f"a terminal event of completion {event.completion_id}")
            state.terminal = state.terminal | {event.completion_id or ""}
        state.last_sequence += 1
        stored = dataclasses.replace(event, sequence=state.last_sequence)
        state.events = state.events + (stored,)
        return stored

    def page(self, workspace_id: str, after_sequence: int, task_id: str | None, limit: int) -> list[CompletionEvent]:
        found = [
            e
            for e in self._s.events
            if e.workspace_id == workspace_id and e.sequence > after_sequence and (not task_id or e.task_id == task_id)
        ]
        return found[:limit]

    def append_audit(self, entry: AuditEntry) -> None:
        state = self._writing()
        stored = dataclasses.replace(entry, audit_id=len(state.audit) + 1)
        state.audit = state.audit + (stored,)

    def audit_page(
        self, workspace_id: str, task_id: str | None, run_id: str | None, after_id: int, limit: int
    ) -> list[AuditEntry]:
        found = [
            a
            for a in self._s.audit
            if a.workspace_id == workspace_id
            and a.audit_id > after_id
            and (not task_id or a.task_id == task_id)
            and (not run_id or a.run_id == run_id)
        ]
        return found[:limit]


class MemoryTranscripts(_Aggregate):
    def load_tail(self, workspace_id: str, task_id: str) -> TranscriptState:
        return self._s.tails.get((workspace_id, task_id), TranscriptState())

    def save_tail(self, workspace_id: str, task_id: str, state: TranscriptState) -> None:
        self._writing().tails[(workspace_id, task_id)] = state

    def load_checkpoints(self, workspace_id: str, task_id: str, ids: Collection[str]) -> dict[str, int]:
        known = self._s.checkpoints.get((workspace_id, task_id), {})
        return {checkpoint: known[checkpoint] for checkpoint in ids if checkpoint in known}

    def insert_checkpoints(self, workspace_id: str, task_id: str, checkpoints: Mapping[str, int]) -> None:
        known = self._writing().checkpoints.setdefault((workspace_id, task_id), {})
        for checkpoint, sequence in checkpoints.items():
            if checkpoint in known:
                raise DuplicateKey(f"checkpoint {checkpoint}")
            known[checkpoint] = sequence

    def page(self, workspace_id: str, task_id: str, after_sequence: int, limit: int) -> list[SessionEvent]:
        events = self._s.transcripts.get((workspace_id, task_id), ())
        # Sequences are 1, 2, 3…: the event with sequence n is at index n - 1.
        return list(events[max(after_sequence, 0) : max(after_sequence, 0) + limit])

    def append(self, workspace_id: str, task_id: str, events: Sequence[SessionEvent]) -> None:
        transcripts = self._writing().transcripts
        stored = transcripts.get((workspace_id, task_id), ())
        for offset, event in enumerate(events):
            if event.sequence != len(stored) + offset + 1:
                raise DuplicateKey(f"transcript event {event.sequence} after {len(stored) + offset}")
        transcripts[(workspace_id, task_id)] = stored + tuple(events)


class MemoryImports(_Aggregate):
    def stage(self, import_id: str, events: Sequence[SessionEvent]) -> None:
        staging = self._writing().staging
        staging[import_id] = staging.get(import_id, ()) + tuple(events)

    def move(self, import_id: str, workspace_id: str, task_id: str) -> None:
        staged = sorted(self._writing().staging.get(import_id, ()), key=lambda e: e.sequence)
        MemoryTranscripts(self._s, self._read_only).append(workspace_id, task_id, staged)
        self.discard(import_id)

    def discard(self, import_id: str | None) -> None:
        staging = self._writing().staging
        if import_id is None:
            staging.clear()
        else:
            staging.pop(import_id, None)


class MemoryCompletionTx:
    def __init__(self, state: _State, read_only: bool = False) -> None:
        self._s = state
        self.requests = MemoryRequestIds(state, read_only)
        self.runs = MemoryRuns(state, read_only)
        self.evidence = MemoryEvidence(state, read_only)
        self.completions = MemoryCompletions(state, read_only)
        self.events = MemoryEvents(state, read_only)
        self.transcripts = MemoryTranscripts(state, read_only)
        self.imports = MemoryImports(state, read_only)

    def load_figures(self, now: int) -> CompletionFigures:
        pending = [c.committed_at for c in self._s.completions.values() if c.settlement is SettlementStatus.PENDING]
        open_runs = [run for run in self._s.runs.values() if run.finished_at is None]
        return CompletionFigures(
            len(pending),
            min(pending, default=None),
            len(open_runs),
            sum(1 for run in open_runs if run.lease_expires_at > now),
            len(self._s.requests),
            None,
        )


class MemoryCompletionStore(Store[_State, MemoryCompletionTx, MemoryCompletionTx]):
    def __init__(self) -> None:
        self._memory = MemoryEngine(_State(), hops=True)
        super().__init__(self._memory, MemoryCompletionTx, lambda state: MemoryCompletionTx(state, read_only=True))

    def snapshot(self) -> object:
        """The committed state as one comparable value (for tests that check a
        refused unit of work changed nothing)."""
        return dataclasses.asdict(self._memory.state)


def _as_read(stored: CompletionRecord) -> CompletionRecord:
    """A completion as the SQL adapters read it: a due time only while pending."""
    if stored.settlement is SettlementStatus.PENDING:
        return stored
    return dataclasses.replace(stored, next_settle_at=None)


def _conforms(store: MemoryCompletionStore) -> CompletionStore:
    """Never called: makes mypy check the store and its transaction against the port."""
    return store
