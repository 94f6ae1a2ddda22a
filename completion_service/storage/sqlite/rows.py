"""The row mapping every aggregate of both SQL engines shares: the columns of each
table in one order, and the core's values from a row and back (free text and
decisions through the session's hooks)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from completion_service.core.model import (
    AuditEntry,
    CompletionEvent,
    CompletionEventKind,
    CompletionRecord,
    EvidenceRecord,
    FinalStatus,
    RequestedOutcome,
    RunOutcome,
    RunRecord,
    SettlementStatus,
    Verdict,
)
from completion_service.core.transcript import EventKind, SessionEvent, TurnEndReason
from completion_service.storage import compact
from completion_service.storage.port import AttemptRecord
from completion_service.storage.sqlite.session import Session
from funnel.auth.principal import Caller

RUN_COLUMNS = (
    "workspace_id, run_id, task_id, agent_id, generation, epoch, claimed_at, lease_expires_at, finished_at, outcome, "
    "tokens_input, tokens_output, tokens_total, notes, notes_truncated, error, final_status"
)
COMPLETION_COLUMNS = (
    "workspace_id, task_id, generation, completion_id, identity, payload, outcome, result, run_id, state_version, "
    "checkpoint, decision, committed_at, settlement, settle_attempts, lifecycle_revision, lifecycle_event_sequence, "
    "settled_at, error_reason, error_message, traceparent, next_settle_at, last_settle_error"
)
EVENT_COLUMNS = (
    "sequence, workspace_id, task_id, generation, kind, run_id, completion_id, outcome, decision, lifecycle_revision, "
    "lifecycle_event_sequence, error_reason, error_message, committed_at, run_outcome, evidence_id"
)
EVIDENCE_COLUMNS = (
    "evidence_id, workspace_id, task_id, generation, kind, passed, checkpoint, details, run_id, recorded_at, "
    "caller_subject, caller_role"
)
ATTEMPT_COLUMNS = (
    "workspace_id, task_id, generation, run_id, checkpoint, result_digest, verdict, state_version, attempted_at"
)
AUDIT_COLUMNS = "audit_id, workspace_id, action, run_id, task_id, metadata, recorded_at, caller_subject, caller_role"
TRANSCRIPT_COLUMNS = "sequence, generation, kind, ref, name, body, is_error, reason, synthetic, recorded_at"


def run_values(s: Session, run: RunRecord) -> tuple[object, ...]:
    """Values for RUN_COLUMNS."""
    return (
        run.workspace_id,
        run.run_id,
        run.task_id,
        run.agent_id,
        run.generation,
        run.epoch,
        run.claimed_at,
        run.lease_expires_at,
        run.finished_at,
        run.outcome.name if run.outcome else None,
        run.tokens_input,
        run.tokens_output,
        run.tokens_total,
        s.put_text(run.notes),
        int(run.notes_truncated),
        s.put_text(run.error),
        run.final_status.name if run.final_status else None,
    )


def run(s: Session, r: Sequence[Any]) -> RunRecord:
    return RunRecord(
        workspace_id=r[0],
        run_id=r[1],
        task_id=r[2],
        agent_id=r[3],
        generation=r[4],
        epoch=r[5],
        claimed_at=r[6],
        lease_expires_at=r[7],
        finished_at=r[8],
        outcome=RunOutcome[r[9]] if r[9] else None,
        tokens_input=r[10],
        tokens_output=r[11],
        tokens_total=r[12],
        notes=s.get_text(r[13]) or "",
        notes_truncated=bool(r[14]),
        error=s.get_text(r[15]) or "",
        final_status=FinalStatus[r[16]] if r[16] else None,
    )


def evidence_values(s: Session, e: EvidenceRecord) -> tuple[object, ...]:
    """Values for EVIDENCE_COLUMNS."""
    return (
        e.evidence_id,
        e.workspace_id,
        e.task_id,
        e.generation,
        e.kind,
        int(e.passed),
        e.checkpoint,
        s.put_text(e.details),
        e.run_id,
        e.recorded_at,
        e.recorded_by.subject,
        e.recorded_by.role,
    )


def evidence(s: Session, r: Sequence[Any]) -> EvidenceRecord:
    return EvidenceRecord(
        r[0], r[1], r[2], r[3], r[4], bool(r[5]), r[6], s.get_text(r[7]), r[8], r[9], Caller(r[10], r[11])
    )


def attempt_values(a: AttemptRecord) -> tuple[object, ...]:
    """Values for ATTEMPT_COLUMNS."""
    return (
        a.workspace_id,
        a.task_id,
        a.generation,
        a.run_id,
        a.checkpoint,
        a.result_digest,
        a.verdict.name,
        a.state_version,
        a.attempted_at,
    )


def attempt(r: Sequence[Any]) -> AttemptRecord:
    return AttemptRecord(r[0], r[1], r[2], r[3], r[4], r[5], Verdict[r[6]], r[7], r[8])


def completion_values(s: Session, c: CompletionRecord) -> tuple[object, ...]:
    """Values for COMPLETION_COLUMNS."""
    return (
        c.workspace_id,
        c.task_id,
        c.generation,
        c.completion_id,
        c.identity,
        compact.encode_payload(c.payload),
        c.outcome.name,
        s.put_text(c.result),
        c.run_id,
        c.state_version,
        c.checkpoint,
        s.put_decision(c.decision),
        c.committed_at,
        c.settlement.name,
        c.settle_attempts,
        c.lifecycle_revision,
        c.lifecycle_event_sequence,
        c.settled_at,
        c.error_reason,
        s.put_text(c.error_message),
        c.traceparent,
        c.next_settle_at,
        s.put_text(c.last_settle_error),
    )


def completion(s: Session, r: Sequence[Any]) -> CompletionRecord:
    settlement = SettlementStatus[r[13]]
    return CompletionRecord(
        workspace_id=r[0],
        task_id=r[1],
        generation=r[2],
        completion_id=r[3],
        identity=r[4],
        payload=compact.decode_payload(r[5]),
        outcome=RequestedOutcome[r[6]],
        result=s.get_text(r[7]),
        run_id=r[8],
        state_version=r[9],
        checkpoint=r[10],
        decision=s.get_decision(r[11]),
        committed_at=r[12],
        settlement=settlement,
        settle_attempts=r[14],
        lifecycle_revision=r[15],
        lifecycle_event_sequence=r[16],
        settled_at=r[17],
        error_reason=r[18],
        error_message=s.get_text(r[19]),
        traceparent=r[20],
        # A settled row keeps its last due time (next_settle_at is NOT NULL), which nothing reads.
        next_settle_at=r[21] if settlement is SettlementStatus.PENDING else None,
        last_settle_error=s.get_text(r[22]),
    )


def event_values(s: Session, e: CompletionEvent) -> tuple[object, ...]:
    """Values for EVENT_COLUMNS but the sequence (which the INSERT numbers)."""
    return (
        e.workspace_id,
        e.task_id,
        e.generation,
        e.kind.name,
        e.run_id,
        e.completion_id,
        e.outcome.name if e.outcome else None,
        s.put_decision(e.decision) if e.decision else None,
        e.lifecycle_revision,
        e.lifecycle_event_sequence,
        e.error_reason,
        s.put_text(e.error_message),
        e.committed_at,
        e.run_outcome.name if e.run_outcome else None,
        e.evidence_id,
    )


def event(s: Session, r: Sequence[Any]) -> CompletionEvent:
    return CompletionEvent(
        sequence=r[0],
        workspace_id=r[1],
        task_id=r[2],
        generation=r[3],
        kind=CompletionEventKind[r[4]],
        run_id=r[5],
        completion_id=r[6],
        outcome=RequestedOutcome[r[7]] if r[7] else None,
        decision=s.get_decision(r[8]) if r[8] else None,
        lifecycle_revision=r[9],
        lifecycle_event_sequence=r[10],
        error_reason=r[11],
        error_message=s.get_text(r[12]),
        committed_at=r[13],
        run_outcome=RunOutcome[r[14]] if r[14] else None,
        evidence_id=r[15],
    )


def audit_values(entry: AuditEntry) -> tuple[object, ...]:
    """Values for AUDIT_COLUMNS but the audit id (which the INSERT numbers)."""
    return (
        entry.workspace_id,
        entry.action,
        entry.run_id,
        entry.task_id,
        json.dumps(dict(entry.metadata), sort_keys=True),
        entry.recorded_at,
        entry.caller.subject,
        entry.caller.role,
    )


def audit(r: Sequence[Any]) -> AuditEntry:
    return AuditEntry(
        r[1], r[2], r[3], r[4], tuple(sorted(json.loads(r[5]).items())), r[6], audit_id=r[0], caller=Caller(r[7], r[8])
    )


def transcript_event_values(s: Session, e: SessionEvent) -> tuple[object, ...]:
    """Values for TRANSCRIPT_COLUMNS."""
    return (
        e.sequence,
        e.generation,
        e.kind.name,
        e.ref,
        s.put_text(e.name),
        s.put_text(e.text),
        int(e.is_error),
        e.reason.name if e.reason else None,
        int(e.synthetic),
        e.recorded_at,
    )


def transcript_event(s: Session, r: Sequence[Any]) -> SessionEvent:
    return SessionEvent(
        sequence=r[0],
        generation=r[1],
        kind=EventKind[r[2]],
        ref=r[3],
        name=s.get_text(r[4]),
        text=s.get_text(r[5]),
        is_error=bool(r[6]),
        reason=TurnEndReason[r[7]] if r[7] else None,
        synthetic=bool(r[8]),
        recorded_at=r[9],
    )
