"""What the tools answer: pure maps from the services' protobuf responses to the
tools' JSON shapes (camelCase, lower-case enum words, RFC 3339 instants), and
from the tools' words back to the protobuf enums. No I/O here."""

from __future__ import annotations

import re
from typing import Any, Literal

from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import BaseModel, ConfigDict, Field

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.runtime import errors
from funnel_mcp import closing

# --- the tools' vocabularies --------------------------------------------------

RunOutcomeWord = Literal["succeeded", "failed", "cancelled", "stalled"]
FinalStatusWord = Literal["done", "blocked", "ready", "in_progress", "cancelled"]
EvidenceVerdictWord = Literal["passed", "failed"]
# One vocabulary: attempt_completion and get_task say what complete_task (seed 001) says.
RequestedOutcomeWord = Literal["succeeded", "failed"]

RUN_OUTCOMES = {
    "succeeded": completion_enums.RUN_OUTCOME_SUCCEEDED,
    "failed": completion_enums.RUN_OUTCOME_FAILED,
    "cancelled": completion_enums.RUN_OUTCOME_CANCELLED,
    "stalled": completion_enums.RUN_OUTCOME_STALLED,
}
FINAL_STATUSES = {
    "done": completion_enums.FINAL_STATUS_DONE,
    "blocked": completion_enums.FINAL_STATUS_BLOCKED,
    "ready": completion_enums.FINAL_STATUS_READY,
    "in_progress": completion_enums.FINAL_STATUS_IN_PROGRESS,
    "cancelled": completion_enums.FINAL_STATUS_CANCELLED,
}
EVIDENCE_VERDICTS = {
    "passed": completion_enums.EVIDENCE_VERDICT_PASSED,
    "failed": completion_enums.EVIDENCE_VERDICT_FAILED,
}
REQUESTED_OUTCOMES = {
    "succeeded": completion_enums.REQUESTED_OUTCOME_COMPLETED,
    "failed": completion_enums.REQUESTED_OUTCOME_FAILED,
}
# attempt_completion's word before 0.2.0, still accepted (not listed in the schema).
FORMER_REQUESTED_OUTCOMES = {"completed": "succeeded"}
TERMINAL_OUTCOMES = {
    lifecycle_enums.TERMINAL_OUTCOME_COMPLETED: "succeeded",
    lifecycle_enums.TERMINAL_OUTCOME_FAILED: "failed",
    lifecycle_enums.TERMINAL_OUTCOME_CANCELLED: "cancelled",
    lifecycle_enums.TERMINAL_OUTCOME_TIMED_OUT: "timed_out",
}


def former_requested_outcome(value: Any) -> Any:
    return FORMER_REQUESTED_OUTCOMES.get(value, value) if isinstance(value, str) else value


def title(name: str, *_: object) -> str:
    """A field's title from its name: `tokensTotal` -> `Tokens total`, `runId` -> `Run ID`."""
    words = [part.lower() for part in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", name)]
    text = " ".join("ID" if part == "id" else "IDs" if part == "ids" else part for part in words)
    return text[:1].upper() + text[1:]


class Answer(BaseModel):
    """A tool's answer; its fields' titles are words, not pydantic's `Runid`."""

    model_config = ConfigDict(field_title_generator=title)


def word(enum_name: str, prefix: str) -> str:
    """`FINAL_STATUS_IN_PROGRESS` -> `in_progress`; the unspecified value -> ``."""
    rest = enum_name.removeprefix(prefix)
    return "" if rest == "UNSPECIFIED" else rest.lower()


def instant(timestamp: Timestamp) -> str:
    """RFC 3339 in UTC with microseconds, e.g. `2026-11-30T09:15:00.123456Z`: the
    form of the services' error metadata."""
    return errors.instant(timestamp.seconds * 1_000_000 + timestamp.nanos // 1000)


# --- claim_task ---------------------------------------------------------------


class ClaimedRun(Answer):
    runId: str = Field(description="The run this agent now holds; pass it to every other tool.")
    taskId: str
    generation: int = Field(description="The task generation the run works on.")
    leaseEpoch: int = Field(description="The lease's fencing epoch; a newer claim of the task supersedes it.")
    leaseExpiresAt: str = Field(
        description="When the lease lapses unless renewed (this server renews it while the run is open)."
    )


def claimed_run(response: completion_messages.ClaimTaskResponse) -> ClaimedRun:
    return ClaimedRun(
        runId=response.run.run_id,
        taskId=response.run.task_id,
        generation=response.run.generation,
        leaseEpoch=response.lease.epoch,
        leaseExpiresAt=instant(response.lease.expire_time),
    )


# --- complete_task ------------------------------------------------------------


class Missing(Answer):
    """What a block is about, in structured form (empty lists when not relevant)."""

    decisiveGate: str = Field(description="The gate that decided, e.g. `evidence.required` or `lifecycle.settlement`.")
    missingEvidenceKinds: list[str] = Field(description="Required evidence kinds with no fact at `evidenceCheckpoint`.")
    failingEvidenceKinds: list[str] = Field(description="Required kinds whose latest fact failed.")
    evidenceCheckpoint: str | None = Field(description="The checkpoint evidence must name (null: name none).")
    openToolCallIds: list[str] = Field(description="Tool calls in the transcript that have no result yet.")
    openChildTaskIds: list[str] = Field(description="Attached child tasks that are not finished.")
    currentLeaseRunId: str | None = Field(
        description="The run that holds the task's lease now, when it is not this one."
    )
    currentStateVersion: int | None = Field(
        description="The transcript's state version, when this attempt's was stale."
    )
    lifecycleReason: str | None = Field(description="Why the lifecycle service refused the settlement, if it did.")
    gateFeedback: str | None = Field(description="An external gate's feedback, if one decided.")


class DecisionAnswer(Answer):
    verdict: Literal["allow", "soft_block", "hard_block"]
    nextAction: str = Field(description="The single action to take now, e.g. `record_evidence` or `report_complete`.")
    instruction: str = Field(description="One line saying what to do.")
    forbiddenActions: list[str] = Field(description="Actions not to take now.")
    missing: Missing | None = Field(description="Set on every block: what it is about.")


def decision_answer(decision: completion_types.Decision) -> DecisionAnswer:
    details = decision.details if decision.HasField("details") else None
    missing = None
    if details is not None:
        missing = Missing(
            decisiveGate=details.decisive_gate,
            missingEvidenceKinds=list(details.missing_evidence_kinds),
            failingEvidenceKinds=list(details.failing_evidence_kinds),
            evidenceCheckpoint=details.evidence_checkpoint if details.HasField("evidence_checkpoint") else None,
            openToolCallIds=list(details.open_tool_call_ids),
            openChildTaskIds=list(details.open_child_task_ids),
            currentLeaseRunId=details.current_lease.run_id if details.HasField("current_lease") else None,
            currentStateVersion=details.current_state_version if details.HasField("current_state_version") else None,
            lifecycleReason=details.lifecycle_reason or None,
            gateFeedback=details.gate_feedback or None,
        )
    return DecisionAnswer(
        verdict=word(completion_enums.Verdict.Name(decision.verdict), "VERDICT_"),  # type: ignore[arg-type]
        nextAction=word(completion_enums.AgentAction.Name(decision.next_action), "AGENT_ACTION_"),
        instruction=decision.instruction,
        forbiddenActions=[
            word(completion_enums.AgentAction.Name(a), "AGENT_ACTION_") for a in decision.forbidden_actions
        ],
        missing=missing,
    )


class GatesVerdict(Answer):
    """What the completion gates decided when a close ran them: no action, the run is closed."""

    verdict: Literal["allow", "soft_block", "hard_block"]
    missing: Missing | None = Field(description="Set on every block: what it is about.")


class ClosedRun(Answer):
    runId: str
    finishedAt: str = Field(description="When the run closed (RFC 3339).")
    finalStatus: str = Field(description="The task's real backlog status after the close.")
    tokensTotal: int = Field(description="The recorded total: the reported total, else input + output.")
    notesTruncated: bool = Field(description="True when the notes were cut at 2000 characters.")
    taskEffect: str = Field(
        description="What the close did to the task: done, settling (done once the lifecycle service settles), "
        "not_completed (the completion gates refused; the task stays open), status_set, cancelled or unchanged."
    )
    taskEffectReason: str = Field(description="One line saying why.")
    nextStep: str = Field(description="What, if anything, is left to do about the task, and by whom.")
    decision: GatesVerdict | None = Field(
        description="Set when the close ran the completion gates (a succeeded close)."
    )


def closed_run(response: completion_messages.CompleteRunResponse) -> ClosedRun:
    final_status = word(completion_enums.FinalStatus.Name(response.final_status), "FINAL_STATUS_")
    gates = decision_answer(response.decision) if response.HasField("decision") else None
    return ClosedRun(
        runId=response.run_id,
        finishedAt=instant(response.finish_time),
        finalStatus=final_status,
        tokensTotal=response.tokens_total,
        notesTruncated=response.notes_truncated,
        taskEffect=closing.effect_word(response),
        taskEffectReason=closing.effect_reason(response, final_status),
        nextStep=closing.next_step(response, final_status),
        decision=GatesVerdict(verdict=gates.verdict, missing=gates.missing) if gates else None,
    )


# --- record_evidence ----------------------------------------------------------


class RecordedEvidence(Answer):
    evidenceId: str
    taskId: str
    generation: int
    kind: str
    verdict: EvidenceVerdictWord
    checkpoint: str = Field(description="The checkpoint the evidence counts for (empty: none).")
    recordedAt: str


def recorded_evidence(response: completion_messages.RecordEvidenceResponse) -> RecordedEvidence:
    evidence = response.evidence
    return RecordedEvidence(
        evidenceId=evidence.evidence_id,
        taskId=evidence.task_id,
        generation=evidence.generation,
        kind=evidence.kind,
        verdict=word(completion_enums.EvidenceVerdict.Name(evidence.verdict), "EVIDENCE_VERDICT_"),  # type: ignore[arg-type]
        checkpoint=evidence.checkpoint,
        recordedAt=instant(evidence.record_time),
    )


# --- attempt_completion -------------------------------------------------------


class AttemptAnswer(DecisionAnswer):
    completionId: str | None = Field(description="The committed completion, when the attempt was allowed.")
    settlement: str | None = Field(description="pending, settled or rejected: whether the task is finished yet.")


def attempt_answer(response: completion_messages.AttemptCompletionResponse) -> AttemptAnswer:
    decision = decision_answer(response.decision)
    completion = response.completion if response.HasField("completion") else None
    return AttemptAnswer(
        **decision.model_dump(),
        completionId=completion.completion_id if completion else None,
        settlement=word(completion_enums.SettlementStatus.Name(completion.settlement), "SETTLEMENT_STATUS_")
        if completion
        else None,
    )


# --- get_task -----------------------------------------------------------------


class TaskTruth(Answer):
    taskId: str
    generation: int
    revision: int
    state: str = Field(description="registered, active, suspended or terminal.")
    terminalOutcome: str | None = Field(description="succeeded, failed, cancelled or timed_out once terminal.")
    cancellationRequested: bool = Field(
        description="True once cancellation of this generation is requested: stop work."
    )
    workStatus: str = Field(description="The backlog status: ready, in_progress, blocked, done or cancelled.")
    completionId: str | None = Field(description="The settled completion, when the outcome is succeeded.")
    openChildTaskIds: list[str] = Field(
        description="Attached children that are not terminal; the task cannot complete before them."
    )


def task_truth(response: lifecycle_messages.GetTaskResponse) -> TaskTruth:
    task = response.task
    terminal = task.state == lifecycle_enums.GENERATION_STATE_TERMINAL
    return TaskTruth(
        taskId=task.task_id,
        generation=task.generation,
        revision=task.revision,
        state=word(lifecycle_enums.GenerationState.Name(task.state), "GENERATION_STATE_"),
        terminalOutcome=TERMINAL_OUTCOMES.get(task.outcome) if terminal else None,
        cancellationRequested=task.cancellation == lifecycle_enums.CANCELLATION_STATE_REQUESTED,
        workStatus=word(lifecycle_enums.WorkStatus.Name(task.work_status), "WORK_STATUS_"),
        completionId=task.completion_id or None,
        openChildTaskIds=list(response.open_attached_child_task_ids),
    )
