"""Units of work of the completion transaction (docs/specification.md §5.1-§5.7) and of the
evidence it judges: load one snapshot, let the gates decide, build the identity,
judge duplicates, insert the durable `task_completions` row and its event, all in
one transaction. Plain functions over storage/port.py; no I/O, no clock."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from completion_service.core import gates
from completion_service.core.duplicates import CompletionKey, DuplicateVerdict, place_completion
from completion_service.core.gates import ExternalAnswer, SnapshotBasis, WorkspacePolicy, snapshot_basis
from completion_service.core.identity import IdentityInput, identity_payload, payload_identity
from completion_service.core.model import (
    CompletionEvent,
    CompletionEventKind,
    CompletionRecord,
    Decision,
    EvidenceFact,
    EvidenceRecord,
    LifecycleView,
    PriorAttempt,
    RequestedOutcome,
    RunRecord,
    SettlementStatus,
    Snapshot,
    TranscriptTail,
    Verdict,
)
from completion_service.errors import Reason
from completion_service.storage.port import AttemptRecord, CompletionReadTx, CompletionTx
from completion_service.units.request_ids import answer, recalled
from completion_service.units.runs import not_held, run_not_found
from funnel.runtime.errors import Rejection, reject
from funnel.runtime.idempotency import Replay, RequestKey


@dataclass(frozen=True)
class AttemptCommand:
    """What the request asks: validated by the servicer, never completed later."""

    workspace_id: str
    task_id: str
    run_id: str
    claimed_epoch: int
    outcome: RequestedOutcome
    result: str
    # The state version the agent evaluated; None: the current one.
    state_version: int | None
    request: RequestKey | None = None
    # The agent that must hold the run (a caller acting as an agent), or None.
    holder: str | None = None
    render: Callable[[AttemptOutcome], bytes] | None = None


@dataclass(frozen=True)
class AttemptContext:
    """Everything the shell gathers for one attempt before its transaction, built
    whole in one place (authority/attempts.py)."""

    # The lifecycle view the gates judge, and whether it came from the projection
    # (which may lag by a generation) rather than a read made for this attempt.
    lifecycle: LifecycleView
    lifecycle_projected: bool
    policy: WorkspacePolicy
    # The id a completion this attempt commits gets.
    completion_id: str
    # The attempt's W3C traceparent, stored with the completion it commits.
    traceparent: str | None = None
    # Answers of the policy's external gates, gathered on a snapshot with
    # `external_basis`; the commit fails with SNAPSHOT_CHANGED if that moved.
    external_answers: Mapping[str, ExternalAnswer] | None = None
    external_basis: SnapshotBasis | None = None


@dataclass(frozen=True)
class StaleView:
    """The projected lifecycle view is of another generation than the run's: it
    has not seen that generation yet. Nothing was written; read it and judge again."""


@dataclass(frozen=True)
class AttemptOutcome:
    decision: Decision
    completion: CompletionRecord | None = None
    # True when the completion existed before this attempt.
    existing: bool = False
    # True when this attempt inserted the row (it must now be settled).
    inserted: bool = False
    # The completion events this attempt appended (to publish once committed).
    events: tuple[CompletionEvent, ...] = ()


@dataclass(frozen=True)
class EvidenceCommand:
    # The evidence, with the id it gets (its recorded_at is the commit's `now`).
    record: EvidenceRecord
    # The agent that must hold an open run of the task (a caller acting as an agent), or None.
    holder: str | None = None
    request: RequestKey | None = None
    render: Callable[[EvidenceRecord], bytes] | None = None


@dataclass(frozen=True)
class EvidenceStored:
    """A stored evidence fact and its EVIDENCE_RECORDED event (to publish once committed)."""

    record: EvidenceRecord
    event: CompletionEvent


class CompletionCorrupted(Exception):
    """A stored completion carries this attempt's identity with another payload."""

    def __init__(self, completion_id: str) -> None:
        super().__init__(f"completion {completion_id} has a matching identity but a different payload")
        self.completion_id = completion_id


def attempt(
    tx: CompletionTx, command: AttemptCommand, context: AttemptContext, now: int, inline_settle_micros: int = 0
) -> AttemptOutcome | Replay | Rejection | StaleView:
    """Steps 1-5 under one write lock: the snapshot is loaded, judged and committed
    against the same state. Raises CompletionCorrupted (nothing is written).

    A committed completion is due for the outbox `inline_settle_micros` after the
    commit: the attempt settles it itself right after committing, within that
    time, and an outbox pass that took it meanwhile would send the same
    settlement a second time. If the process dies first, the outbox takes it then."""
    seen = recalled(tx.requests, command.request)
    if seen is not None:
        return seen
    snapshot = load_snapshot(tx, command, context.lifecycle, now)
    if isinstance(snapshot, Rejection):
        return snapshot
    # A projected view only ever holds what would let the attempt through (see
    # core/projection.py) but the generation, which a lagging view may hold old.
    if context.lifecycle_projected and snapshot.run.generation != snapshot.lifecycle.generation:
        return StaleView()
    if context.external_basis is not None and snapshot_basis(snapshot) != context.external_basis:
        return reject(
            Reason.SNAPSHOT_CHANGED,
            "the lease or the state version changed while external gates were consulted; retry",
            what="lease_or_state_version",
        )
    decision = gates.decide(snapshot, context.policy, context.external_answers)
    generation = snapshot.run.generation
    if not decision.allowed:
        _record_attempt(tx, snapshot, decision)
        blocked = tx.events.append(
            CompletionEvent(
                command.workspace_id,
                command.task_id,
                generation,
                CompletionEventKind.DECISION_BLOCKED,
                command.run_id,
                now,
                outcome=command.outcome,
                decision=decision,
            )
        )
        return answer(tx.requests, command.request, command.render, AttemptOutcome(decision, events=(blocked,)), now)
    identity_input = IdentityInput(
        workspace_id=command.workspace_id,
        task_id=command.task_id,
        generation=generation,
        state_version=snapshot.evaluated_state_version,
        checkpoint=snapshot.transcript.checkpoint,
        outcome=command.outcome.name,
        decision_schema=decision.decision_schema,
    )
    payload = identity_payload(identity_input)
    key = CompletionKey(payload_identity(payload), payload, command.outcome.name)
    stored = tx.completions.load(command.workspace_id, command.task_id, generation)
    placement = place_completion(stored, key)
    if stored is not None and placement is not DuplicateVerdict.REPLACE:
        return _meets_stored(tx, command, snapshot, decision, stored, placement, now)
    record = CompletionRecord(
        workspace_id=command.workspace_id,
        task_id=command.task_id,
        generation=generation,
        completion_id=context.completion_id,
        identity=key.identity,
        payload=key.payload,
        outcome=command.outcome,
        result=command.result,
        run_id=command.run_id,
        state_version=snapshot.evaluated_state_version,
        checkpoint=snapshot.transcript.checkpoint,
        decision=decision,
        committed_at=now,
        settlement=SettlementStatus.PENDING,
        next_settle_at=now + inline_settle_micros,
        traceparent=context.traceparent,
    )
    _record_attempt(tx, snapshot, decision)
    if placement is DuplicateVerdict.REPLACE:
        tx.completions.delete(record.workspace_id, record.task_id, record.generation)
    tx.completions.insert(record)
    committed = tx.events.append(
        CompletionEvent(
            record.workspace_id,
            record.task_id,
            record.generation,
            CompletionEventKind.COMPLETION_COMMITTED,
            record.run_id,
            now,
            completion_id=record.completion_id,
            outcome=record.outcome,
            decision=decision,
        )
    )
    outcome = AttemptOutcome(decision, record, inserted=True, events=(committed,))
    return answer(tx.requests, command.request, command.render, outcome, now)


def _meets_stored(
    tx: CompletionTx,
    command: AttemptCommand,
    snapshot: Snapshot,
    decision: Decision,
    stored: CompletionRecord,
    placement: DuplicateVerdict,
    now: int,
) -> AttemptOutcome | Replay | Rejection:
    """An allowed attempt of a generation whose completion is already stored (and stays)."""
    if placement is DuplicateVerdict.CORRUPTED:
        raise CompletionCorrupted(stored.completion_id)
    if placement is DuplicateVerdict.CONFLICT:
        return reject(
            Reason.COMPLETION_CONFLICT,
            f"generation {stored.generation} already has a {stored.outcome.name} completion",
            completion_id=stored.completion_id,
            outcome=stored.outcome.name,
        )
    _record_attempt(tx, snapshot, decision)
    return answer(tx.requests, command.request, command.render, AttemptOutcome(decision, stored, existing=True), now)


def _record_attempt(tx: CompletionTx, snapshot: Snapshot, decision: Decision) -> None:
    """Every judged attempt is kept: the circuit breaker counts them (in the
    database, so the count holds across restarts and replicas)."""
    tx.completions.insert_attempt(
        AttemptRecord(
            workspace_id=snapshot.workspace_id,
            task_id=snapshot.task_id,
            generation=snapshot.run.generation,
            run_id=snapshot.run.run_id,
            checkpoint=snapshot.transcript.checkpoint,
            result_digest=snapshot.result_digest,
            verdict=decision.verdict,
            state_version=snapshot.evaluated_state_version,
            attempted_at=snapshot.now,
        )
    )


def load_snapshot(
    tx: CompletionReadTx, command: AttemptCommand, lifecycle: LifecycleView, now: int
) -> Snapshot | Rejection:
    """The one canonical view the gates judge (docs/specification.md §5.2)."""
    run = tx.runs.load(command.workspace_id, command.run_id)
    if run is None or run.task_id != command.task_id:
        return run_not_found(command.run_id)
    if command.holder is not None and run.agent_id != command.holder:
        return not_held(run)
    return _snapshot(tx, command, run, lifecycle, now)


def _snapshot(
    tx: CompletionReadTx, command: AttemptCommand, run: RunRecord, lifecycle: LifecycleView, now: int
) -> Snapshot:
    state = tx.transcripts.load_tail(command.workspace_id, command.task_id)
    tail = state.tail
    transcript = TranscriptTail(state.state_version, tail.open_turn, tail.open_step, tail.open_calls, tail.checkpoint)
    evidence = tuple(
        EvidenceFact(e.kind, e.passed, e.checkpoint, e.generation, order)
        for order, e in enumerate(tx.evidence.load(command.workspace_id, command.task_id, run.generation))
    )
    attempts = tuple(
        PriorAttempt(a.checkpoint, a.result_digest, a.verdict is not Verdict.ALLOW)
        for a in tx.completions.load_attempts(command.workspace_id, command.task_id, run.generation)
    )
    return Snapshot(
        workspace_id=command.workspace_id,
        task_id=command.task_id,
        now=now,
        run=run.view(),
        lease=tx.runs.load_lease(command.workspace_id, command.task_id),
        claimed_epoch=command.claimed_epoch,
        transcript=transcript,
        evaluated_state_version=state.state_version if command.state_version is None else command.state_version,
        evidence=evidence,
        lifecycle=lifecycle,
        attempts=attempts,
        outcome=command.outcome,
        result=command.result,
        result_digest=hashlib.sha256(command.result.encode("utf-8")).hexdigest(),
    )


def record_evidence(tx: CompletionTx, command: EvidenceCommand, now: int) -> EvidenceStored | Replay | Rejection:
    seen = recalled(tx.requests, command.request)
    if seen is not None:
        return seen
    record = command.record
    run = tx.runs.load(record.workspace_id, record.run_id) if record.run_id else None
    # Evidence names the run that produced it: a run of the same task generation,
    # never a made-up one (every caller), so that what it vouches for is real.
    if record.run_id and (run is None or (run.task_id, run.generation) != (record.task_id, record.generation)):
        return reject(
            Reason.RUN_NOT_FOUND,
            f"run {record.run_id!r} is not a run of task {record.task_id!r} generation {record.generation}",
            run_id=record.run_id,
        )
    # An agent vouches only for its own open run.
    if command.holder is not None and (run is None or run.agent_id != command.holder or not run.open):
        return reject(
            Reason.RUN_NOT_HELD,
            "an agent records evidence only with an open run of the task that it holds (run_id)",
            run_id=record.run_id or "",
        )
    assert record.evidence_id, "the shell names the evidence"
    stored = dataclasses.replace(record, recorded_at=now)
    tx.evidence.insert(stored)
    event = tx.events.append(
        CompletionEvent(
            stored.workspace_id,
            stored.task_id,
            stored.generation,
            CompletionEventKind.EVIDENCE_RECORDED,
            stored.run_id or "",
            now,
            evidence_id=stored.evidence_id,
        )
    )
    answer(tx.requests, command.request, command.render, stored, now)
    return EvidenceStored(stored, event)
