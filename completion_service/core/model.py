"""Plain values of the completion domain. Enum values equal the contract's numbers."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from funnel.auth.principal import Caller


class RequestedOutcome(enum.Enum):
    COMPLETED = 1
    FAILED = 2


class Verdict(enum.Enum):
    ALLOW = 1
    SOFT_BLOCK = 2
    HARD_BLOCK = 3


class AgentAction(enum.Enum):
    REPORT_COMPLETE = 1
    RESOLVE_OPEN_TOOL_CALLS = 2
    REFRESH_STATE = 3
    RECORD_EVIDENCE = 4
    WAIT_FOR_CHILDREN = 5
    PROVIDE_RESULT = 6
    RETRY_LATER = 7
    STOP_AND_REPORT = 8
    ATTEMPT_COMPLETION = 9
    CONTINUE_WORK = 10
    ADDRESS_GATE_FEEDBACK = 11


class GateStatus(enum.Enum):
    PASSED = 1
    FAILED = 2
    SKIPPED = 3


class SettlementStatus(enum.Enum):
    PENDING = 1
    SETTLED = 2
    REJECTED = 3


class RunOutcome(enum.Enum):
    SUCCEEDED = 1
    FAILED = 2
    CANCELLED = 3
    STALLED = 4


class FinalStatus(enum.Enum):
    READY = 1
    IN_PROGRESS = 2
    BLOCKED = 3
    DONE = 4
    CANCELLED = 5


class LifecycleState(enum.Enum):
    REGISTERED = 1
    ACTIVE = 2
    SUSPENDED = 3
    TERMINAL = 4


@dataclass(frozen=True)
class Lease:
    task_id: str
    run_id: str
    epoch: int
    expires_at: int


@dataclass(frozen=True)
class RunView:
    run_id: str
    task_id: str
    generation: int
    epoch: int
    open: bool


@dataclass(frozen=True)
class TranscriptTail:
    """What the gates need of a transcript: its version and what is still open."""

    state_version: int = 0
    open_turn: str | None = None
    open_step: str | None = None
    open_calls: tuple[str, ...] = ()
    checkpoint: str = ""


@dataclass(frozen=True)
class EvidenceFact:
    kind: str
    passed: bool
    checkpoint: str
    generation: int
    # Insertion order: a later fact about the same kind and checkpoint wins.
    order: int


@dataclass(frozen=True)
class LifecycleView:
    """The lifecycle service's record of the task, as read for this attempt."""

    generation: int
    state: LifecycleState
    outcome: str | None
    cancellation_requested: bool
    open_attached_children: tuple[str, ...] = ()


@dataclass(frozen=True)
class PriorAttempt:
    checkpoint: str
    result_digest: str
    blocked: bool


@dataclass(frozen=True)
class Snapshot:
    """Everything the gates see: one canonical view of the task at one moment."""

    workspace_id: str
    task_id: str
    now: int
    run: RunView
    lease: Lease | None
    claimed_epoch: int
    transcript: TranscriptTail
    evaluated_state_version: int
    evidence: tuple[EvidenceFact, ...]
    lifecycle: LifecycleView
    attempts: tuple[PriorAttempt, ...]
    outcome: RequestedOutcome
    result: str
    result_digest: str


@dataclass(frozen=True)
class GateTrace:
    gate_id: str
    version: int
    status: GateStatus
    reason: str
    decisive: bool = False


@dataclass(frozen=True)
class BlockDetails:
    """What a block is about, in structured form, so that a host acts on it
    without parsing the instruction (which is written from these values)."""

    decisive_gate: str = ""
    missing_evidence_kinds: tuple[str, ...] = ()
    failing_evidence_kinds: tuple[str, ...] = ()
    # The checkpoint evidence must name (set for evidence blocks).
    evidence_checkpoint: str | None = None
    open_tool_call_ids: tuple[str, ...] = ()
    open_step_id: str = ""
    open_turn_id: str = ""
    open_child_task_ids: tuple[str, ...] = ()
    # The lease that superseded the attempt's (None: no lease at all, or not a lease block).
    current_lease: Lease | None = None
    current_state_version: int | None = None
    current_generation: int | None = None
    # The lifecycle service's refusal of the completion's settlement.
    lifecycle_reason: str = ""
    # An external gate's answer (its failure reason, or why it could not answer).
    gate_feedback: str = ""


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    next_action: AgentAction
    forbidden_actions: tuple[AgentAction, ...]
    instruction: str
    trace: tuple[GateTrace, ...]
    decision_schema: str
    state_version: int
    checkpoint: str
    # Set on every block; None when allowed.
    details: BlockDetails | None = None

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.ALLOW


class CompletionEventKind(enum.Enum):
    DECISION_BLOCKED = 1
    COMPLETION_COMMITTED = 2
    COMPLETION_SETTLED = 3
    TERMINALIZATION_ERROR = 4
    # What happens to runs and evidence, for watchers (never terminal).
    RUN_CLAIMED = 5
    RUN_CLOSED = 6
    EVIDENCE_RECORDED = 7


@dataclass(frozen=True)
class RunRecord:
    workspace_id: str
    run_id: str
    task_id: str
    agent_id: str
    generation: int
    epoch: int
    claimed_at: int
    lease_expires_at: int
    finished_at: int | None = None
    outcome: RunOutcome | None = None
    tokens_input: int | None = None
    tokens_output: int | None = None
    tokens_total: int | None = None
    notes: str = ""
    notes_truncated: bool = False
    error: str = ""
    final_status: FinalStatus | None = None

    @property
    def open(self) -> bool:
        return self.finished_at is None

    def view(self) -> RunView:
        return RunView(self.run_id, self.task_id, self.generation, self.epoch, self.open)


@dataclass(frozen=True)
class CompletionRecord:
    workspace_id: str
    task_id: str
    generation: int
    completion_id: str
    identity: str
    payload: bytes
    outcome: RequestedOutcome
    result: str
    run_id: str
    state_version: int
    checkpoint: str
    decision: Decision
    committed_at: int
    settlement: SettlementStatus
    # Settle calls made so far: while PENDING those that got no answer; once
    # settled or rejected all of them, the answered one included.
    settle_attempts: int = 0
    # While PENDING: when the outbox calls the lifecycle service next. None once
    # settled or rejected (nothing is due any more).
    next_settle_at: int | None = None
    # While PENDING: why the last settle call got no answer (None before the
    # first and once settled or rejected): what an operator needs to act on.
    last_settle_error: str | None = None
    lifecycle_revision: int | None = None
    lifecycle_event_sequence: int | None = None
    settled_at: int | None = None
    error_reason: str | None = None
    error_message: str | None = None
    # The W3C traceparent of the call that committed it (None outside a trace):
    # a settlement retried later by the outbox joins that call's trace.
    traceparent: str | None = None


@dataclass(frozen=True)
class EvidenceRecord:
    evidence_id: str
    workspace_id: str
    task_id: str
    generation: int
    kind: str
    passed: bool
    checkpoint: str
    details: str
    run_id: str | None
    recorded_at: int
    # Who recorded it (empty for facts stored before callers were).
    recorded_by: Caller = Caller()


@dataclass(frozen=True)
class CompletionEvent:
    workspace_id: str
    task_id: str
    generation: int
    kind: CompletionEventKind
    run_id: str
    committed_at: int
    completion_id: str | None = None
    outcome: RequestedOutcome | None = None
    decision: Decision | None = None
    lifecycle_revision: int | None = None
    lifecycle_event_sequence: int | None = None
    error_reason: str | None = None
    error_message: str | None = None
    sequence: int = 0
    # RUN_CLOSED: how the run closed.
    run_outcome: RunOutcome | None = None
    # EVIDENCE_RECORDED: the fact stored.
    evidence_id: str | None = None


@dataclass(frozen=True)
class AuditEntry:
    workspace_id: str
    action: str
    run_id: str
    task_id: str
    metadata: tuple[tuple[str, str], ...]
    recorded_at: int
    audit_id: int = 0
    caller: Caller = Caller()


def decision_to_json(decision: Decision) -> str:
    return json.dumps(
        {
            "verdict": decision.verdict.name,
            "next_action": decision.next_action.name,
            "forbidden_actions": [a.name for a in decision.forbidden_actions],
            "instruction": decision.instruction,
            "trace": [
                {
                    "gate_id": t.gate_id,
                    "version": t.version,
                    "status": t.status.name,
                    "reason": t.reason,
                    "decisive": t.decisive,
                }
                for t in decision.trace
            ],
            "decision_schema": decision.decision_schema,
            "state_version": decision.state_version,
            "checkpoint": decision.checkpoint,
            **({"details": _details_to_json(decision.details)} if decision.details else {}),
        },
        ensure_ascii=False,
        sort_keys=True,
    )


def _details_to_json(d: BlockDetails) -> dict[str, Any]:
    lease = d.current_lease
    return {
        "decisive_gate": d.decisive_gate,
        "missing_evidence_kinds": list(d.missing_evidence_kinds),
        "failing_evidence_kinds": list(d.failing_evidence_kinds),
        "evidence_checkpoint": d.evidence_checkpoint,
        "open_tool_call_ids": list(d.open_tool_call_ids),
        "open_step_id": d.open_step_id,
        "open_turn_id": d.open_turn_id,
        "open_child_task_ids": list(d.open_child_task_ids),
        "current_lease": [lease.task_id, lease.run_id, lease.epoch, lease.expires_at] if lease else None,
        "current_state_version": d.current_state_version,
        "current_generation": d.current_generation,
        "lifecycle_reason": d.lifecycle_reason,
        "gate_feedback": d.gate_feedback,
    }


def _details_from_json(raw: dict[str, Any]) -> BlockDetails:
    lease = raw["current_lease"]
    return BlockDetails(
        decisive_gate=raw["decisive_gate"],
        missing_evidence_kinds=tuple(raw["missing_evidence_kinds"]),
        failing_evidence_kinds=tuple(raw["failing_evidence_kinds"]),
        evidence_checkpoint=raw["evidence_checkpoint"],
        open_tool_call_ids=tuple(raw["open_tool_call_ids"]),
        open_step_id=raw["open_step_id"],
        open_turn_id=raw["open_turn_id"],
        open_child_task_ids=tuple(raw["open_child_task_ids"]),
        current_lease=Lease(*lease) if lease else None,
        current_state_version=raw["current_state_version"],
        current_generation=raw["current_generation"],
        lifecycle_reason=raw["lifecycle_reason"],
        gate_feedback=raw["gate_feedback"],
    )


def decision_from_json(text: str) -> Decision:
    raw = json.loads(text)
    return Decision(
        verdict=Verdict[raw["verdict"]],
        next_action=AgentAction[raw["next_action"]],
        forbidden_actions=tuple(AgentAction[a] for a in raw["forbidden_actions"]),
        instruction=raw["instruction"],
        trace=tuple(
            GateTrace(t["gate_id"], t["version"], GateStatus[t["status"]], t["reason"], t["decisive"])
            for t in raw["trace"]
        ),
        decision_schema=raw["decision_schema"],
        state_version=raw["state_version"],
        checkpoint=raw["checkpoint"],
        # Decisions stored before blocks carried details have none.
        details=_details_from_json(raw["details"]) if "details" in raw else None,
    )
