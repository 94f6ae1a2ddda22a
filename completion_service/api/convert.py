"""Plain core values <-> contract messages."""

from __future__ import annotations

from completion_service.core.model import (
    AuditEntry,
    BlockDetails,
    CompletionEvent,
    CompletionRecord,
    Decision,
    EvidenceRecord,
    Lease,
    RunRecord,
)
from completion_service.core.settlement import binding_decision
from completion_service.core.transcript import EventKind, SessionEvent, TurnEndReason
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.runtime.proto_enums import proto_enum
from funnel.runtime.timestamps import to_micros, to_timestamp


def lease_to_proto(lease: Lease) -> completion_types.Lease:
    return completion_types.Lease(
        task_id=lease.task_id, run_id=lease.run_id, epoch=lease.epoch, expire_time=to_timestamp(lease.expires_at)
    )


def run_to_proto(run: RunRecord) -> completion_types.Run:
    return completion_types.Run(
        workspace_id=run.workspace_id,
        run_id=run.run_id,
        task_id=run.task_id,
        agent_id=run.agent_id,
        generation=run.generation,
        epoch=run.epoch,
        claim_time=to_timestamp(run.claimed_at),
        lease_expire_time=to_timestamp(run.lease_expires_at),
        finish_time=to_timestamp(run.finished_at),
        outcome=proto_enum(completion_enums.RunOutcome, run.outcome.value if run.outcome else 0),
        tokens_input=run.tokens_input or 0,
        tokens_output=run.tokens_output or 0,
        tokens_total=run.tokens_total or 0,
        notes=run.notes,
        notes_truncated=run.notes_truncated,
        error=run.error,
        final_status=proto_enum(completion_enums.FinalStatus, run.final_status.value if run.final_status else 0),
    )


def decision_to_proto(decision: Decision) -> completion_types.Decision:
    return completion_types.Decision(
        verdict=proto_enum(completion_enums.Verdict, decision.verdict.value),
        next_action=proto_enum(completion_enums.AgentAction, decision.next_action.value),
        forbidden_actions=[proto_enum(completion_enums.AgentAction, a.value) for a in decision.forbidden_actions],
        instruction=decision.instruction,
        trace=[
            completion_types.GateResult(
                gate_id=t.gate_id,
                gate_version=t.version,
                status=proto_enum(completion_enums.GateStatus, t.status.value),
                reason=t.reason,
                decisive=t.decisive,
            )
            for t in decision.trace
        ],
        decision_schema=decision.decision_schema,
        state_version=decision.state_version,
        checkpoint=decision.checkpoint,
        details=details_to_proto(decision.details) if decision.details else None,
    )


class DecisionProtos:
    """One call's decisions, each rendered once. An attempt's decision is in its
    stored response, its reply and the completion inside both; while the
    settlement is pending the agent is told a decision that differs from it only
    in what the agent is to do next (core/settlement.py binding_decision). Built
    field by field, a decision's trace is most of what rendering an attempt's
    answer costs; copied, it costs a few microseconds (docs/performance.md,
    "Render once"). Keeps the decisions it rendered, so identity names them."""

    def __init__(self) -> None:
        self._rendered: list[tuple[Decision, completion_types.Decision]] = []

    def of(self, decision: Decision) -> completion_types.Decision:
        """The decision's proto; the caller copies it (a message field's constructor does)."""
        for rendered, proto in self._rendered:
            if rendered is decision:
                return proto
        proto = decision_to_proto(decision)
        self._rendered.append((decision, proto))
        return proto

    def told(self, decision: Decision, completion: CompletionRecord | None) -> completion_types.Decision:
        """The proto of what the agent is told for `decision` (binding_decision)."""
        return self.binding(decision, binding_decision(decision, completion))

    def completion(self, completion: CompletionRecord) -> completion_types.Completion:
        return completion_to_proto(completion, self.of(completion.decision))

    def binding(self, decision: Decision, binding: Decision) -> completion_types.Decision:
        """The proto of `binding`, the decision the agent is told for `decision`."""
        if binding is decision:
            return self.of(decision)
        if any(getattr(binding, name) != getattr(decision, name) for name in _BEYOND_THE_AGENTS_INSTRUCTIONS):
            return decision_to_proto(binding)
        proto = completion_types.Decision()
        proto.CopyFrom(self.of(decision))
        proto.next_action = proto_enum(completion_enums.AgentAction, binding.next_action.value)
        del proto.forbidden_actions[:]
        proto.forbidden_actions.extend(
            proto_enum(completion_enums.AgentAction, a.value) for a in binding.forbidden_actions
        )
        proto.instruction = binding.instruction
        return proto


# What a binding decision shares with the gates' decision when only the agent's
# instructions differ (every field of Decision but next_action, forbidden_actions
# and instruction; tests/completion/test_render_once.py keeps the list whole).
_BEYOND_THE_AGENTS_INSTRUCTIONS = (
    "verdict",
    "trace",
    "decision_schema",
    "state_version",
    "checkpoint",
    "details",
)


def details_to_proto(d: BlockDetails) -> completion_types.BlockDetails:
    return completion_types.BlockDetails(
        decisive_gate=d.decisive_gate,
        missing_evidence_kinds=d.missing_evidence_kinds,
        failing_evidence_kinds=d.failing_evidence_kinds,
        evidence_checkpoint=d.evidence_checkpoint,
        open_tool_call_ids=d.open_tool_call_ids,
        open_step_id=d.open_step_id,
        open_turn_id=d.open_turn_id,
        open_child_task_ids=d.open_child_task_ids,
        current_lease=lease_to_proto(d.current_lease) if d.current_lease else None,
        current_state_version=d.current_state_version,
        current_generation=d.current_generation,
        lifecycle_reason=d.lifecycle_reason,
        gate_feedback=d.gate_feedback,
    )


def completion_to_proto(
    c: CompletionRecord, decision: completion_types.Decision | None = None
) -> completion_types.Completion:
    """`decision`: the proto of c.decision when the caller has it (DecisionProtos)."""
    return completion_types.Completion(
        workspace_id=c.workspace_id,
        task_id=c.task_id,
        generation=c.generation,
        completion_id=c.completion_id,
        identity=c.identity,
        outcome=proto_enum(completion_enums.RequestedOutcome, c.outcome.value),
        result=c.result,
        run_id=c.run_id,
        state_version=c.state_version,
        checkpoint=c.checkpoint,
        commit_time=to_timestamp(c.committed_at),
        settlement=proto_enum(completion_enums.SettlementStatus, c.settlement.value),
        lifecycle_revision=c.lifecycle_revision or 0,
        lifecycle_event_sequence=c.lifecycle_event_sequence or 0,
        settle_time=to_timestamp(c.settled_at),
        terminalization_error_reason=c.error_reason or "",
        terminalization_error_message=c.error_message or "",
        decision=decision if decision is not None else decision_to_proto(c.decision),
        settle_attempts=c.settle_attempts,
        # Both None once answered: record_settlement clears them, the stores read them so.
        next_settle_time=to_timestamp(c.next_settle_at),
        last_settle_error=c.last_settle_error or "",
    )


def evidence_to_proto(e: EvidenceRecord) -> completion_types.Evidence:
    return completion_types.Evidence(
        workspace_id=e.workspace_id,
        task_id=e.task_id,
        generation=e.generation,
        evidence_id=e.evidence_id,
        kind=e.kind,
        verdict=completion_enums.EVIDENCE_VERDICT_PASSED if e.passed else completion_enums.EVIDENCE_VERDICT_FAILED,
        checkpoint=e.checkpoint,
        details=e.details,
        run_id=e.run_id or "",
        record_time=to_timestamp(e.recorded_at),
        recorded_by=completion_types.Caller(subject=e.recorded_by.subject, role=e.recorded_by.role),
    )


def event_to_proto(e: CompletionEvent) -> completion_types.CompletionEvent:
    return completion_types.CompletionEvent(
        sequence=e.sequence,
        workspace_id=e.workspace_id,
        task_id=e.task_id,
        generation=e.generation,
        kind=proto_enum(completion_enums.CompletionEventKind, e.kind.value),
        run_id=e.run_id,
        completion_id=e.completion_id or "",
        outcome=proto_enum(completion_enums.RequestedOutcome, e.outcome.value if e.outcome else 0),
        decision=decision_to_proto(e.decision) if e.decision else None,
        lifecycle_revision=e.lifecycle_revision or 0,
        lifecycle_event_sequence=e.lifecycle_event_sequence or 0,
        error_reason=e.error_reason or "",
        error_message=e.error_message or "",
        commit_time=to_timestamp(e.committed_at),
        run_outcome=proto_enum(completion_enums.RunOutcome, e.run_outcome.value if e.run_outcome else 0),
        evidence_id=e.evidence_id or "",
    )


def audit_to_proto(a: AuditEntry) -> completion_types.AuditEntry:
    return completion_types.AuditEntry(
        audit_id=a.audit_id,
        workspace_id=a.workspace_id,
        action=a.action,
        run_id=a.run_id,
        task_id=a.task_id,
        metadata=dict(a.metadata),
        record_time=to_timestamp(a.recorded_at),
        caller=completion_types.Caller(subject=a.caller.subject, role=a.caller.role),
    )


_BODY_FIELDS = {
    EventKind.TURN_START: "turn_start",
    EventKind.TURN_END: "turn_end",
    EventKind.STEP_START: "step_start",
    EventKind.STEP_END: "step_end",
    EventKind.TOOL_CALL: "tool_call",
    EventKind.TOOL_RESULT: "tool_result",
    EventKind.USER_MESSAGE: "user_message",
    EventKind.ASSISTANT_MESSAGE: "assistant_message",
    EventKind.CHECKPOINT: "checkpoint",
    EventKind.CHECKPOINT_RESTORE: "checkpoint_restore",
    EventKind.USER_FEEDBACK: "user_feedback",
    EventKind.PROMPT_RESEND: "prompt_resend",
}
KIND_OF_BODY = {name: kind for kind, name in _BODY_FIELDS.items()}
# The body field that holds each kind's id, and its text field.
_REF_FIELD = {
    "turn_start": "turn_id",
    "turn_end": "turn_id",
    "step_start": "step_id",
    "step_end": "step_id",
    "tool_call": "call_id",
    "tool_result": "call_id",
    "checkpoint": "checkpoint_id",
    "checkpoint_restore": "checkpoint_id",
}
_TEXT_FIELD = {
    "tool_call": "arguments",
    "tool_result": "content",
    "user_message": "text",
    "assistant_message": "text",
    "user_feedback": "text",
    "prompt_resend": "text",
}


def session_event_from_proto(message: completion_types.SessionEvent) -> SessionEvent:
    body_name = message.WhichOneof("body")
    body = getattr(message, body_name)
    return SessionEvent(
        kind=KIND_OF_BODY[body_name],
        ref=getattr(body, _REF_FIELD[body_name]) if body_name in _REF_FIELD else "",
        name=body.tool_name if body_name == "tool_call" else "",
        text=getattr(body, _TEXT_FIELD[body_name]) if body_name in _TEXT_FIELD else "",
        is_error=body.is_error if body_name == "tool_result" else False,
        reason=TurnEndReason(body.reason) if body_name == "turn_end" else None,
        synthetic=message.synthetic,
        generation=message.generation,
        sequence=message.sequence,
        recorded_at=to_micros(message.record_time) if message.HasField("record_time") else 0,
    )


def session_event_to_proto(event: SessionEvent) -> completion_types.SessionEvent:
    body_name = _BODY_FIELDS[event.kind]
    message = completion_types.SessionEvent(
        sequence=event.sequence,
        generation=event.generation,
        synthetic=event.synthetic,
        record_time=to_timestamp(event.recorded_at),
    )
    body = getattr(message, body_name)
    body.SetInParent()
    if body_name in _REF_FIELD:
        setattr(body, _REF_FIELD[body_name], event.ref)
    if body_name in _TEXT_FIELD:
        setattr(body, _TEXT_FIELD[body_name], event.text)
    if body_name == "tool_call":
        body.tool_name = event.name
    if body_name == "tool_result":
        body.is_error = event.is_error
    if body_name == "turn_end":
        assert event.reason is not None, "a turn_end event has its reason"
        body.reason = event.reason.value
    return message
