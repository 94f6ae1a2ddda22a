from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class RequestedOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REQUESTED_OUTCOME_UNSPECIFIED: _ClassVar[RequestedOutcome]
    REQUESTED_OUTCOME_COMPLETED: _ClassVar[RequestedOutcome]
    REQUESTED_OUTCOME_FAILED: _ClassVar[RequestedOutcome]

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    VERDICT_ALLOW: _ClassVar[Verdict]
    VERDICT_SOFT_BLOCK: _ClassVar[Verdict]
    VERDICT_HARD_BLOCK: _ClassVar[Verdict]

class AgentAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AGENT_ACTION_UNSPECIFIED: _ClassVar[AgentAction]
    AGENT_ACTION_REPORT_COMPLETE: _ClassVar[AgentAction]
    AGENT_ACTION_RESOLVE_OPEN_TOOL_CALLS: _ClassVar[AgentAction]
    AGENT_ACTION_REFRESH_STATE: _ClassVar[AgentAction]
    AGENT_ACTION_RECORD_EVIDENCE: _ClassVar[AgentAction]
    AGENT_ACTION_WAIT_FOR_CHILDREN: _ClassVar[AgentAction]
    AGENT_ACTION_PROVIDE_RESULT: _ClassVar[AgentAction]
    AGENT_ACTION_RETRY_LATER: _ClassVar[AgentAction]
    AGENT_ACTION_STOP_AND_REPORT: _ClassVar[AgentAction]
    AGENT_ACTION_ATTEMPT_COMPLETION: _ClassVar[AgentAction]
    AGENT_ACTION_CONTINUE_WORK: _ClassVar[AgentAction]
    AGENT_ACTION_ADDRESS_GATE_FEEDBACK: _ClassVar[AgentAction]

class GateStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GATE_STATUS_UNSPECIFIED: _ClassVar[GateStatus]
    GATE_STATUS_PASSED: _ClassVar[GateStatus]
    GATE_STATUS_FAILED: _ClassVar[GateStatus]
    GATE_STATUS_SKIPPED: _ClassVar[GateStatus]

class SettlementStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SETTLEMENT_STATUS_UNSPECIFIED: _ClassVar[SettlementStatus]
    SETTLEMENT_STATUS_PENDING: _ClassVar[SettlementStatus]
    SETTLEMENT_STATUS_SETTLED: _ClassVar[SettlementStatus]
    SETTLEMENT_STATUS_REJECTED: _ClassVar[SettlementStatus]

class RunOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_OUTCOME_UNSPECIFIED: _ClassVar[RunOutcome]
    RUN_OUTCOME_SUCCEEDED: _ClassVar[RunOutcome]
    RUN_OUTCOME_FAILED: _ClassVar[RunOutcome]
    RUN_OUTCOME_CANCELLED: _ClassVar[RunOutcome]
    RUN_OUTCOME_STALLED: _ClassVar[RunOutcome]

class FinalStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINAL_STATUS_UNSPECIFIED: _ClassVar[FinalStatus]
    FINAL_STATUS_READY: _ClassVar[FinalStatus]
    FINAL_STATUS_IN_PROGRESS: _ClassVar[FinalStatus]
    FINAL_STATUS_BLOCKED: _ClassVar[FinalStatus]
    FINAL_STATUS_DONE: _ClassVar[FinalStatus]
    FINAL_STATUS_CANCELLED: _ClassVar[FinalStatus]

class EvidenceVerdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVIDENCE_VERDICT_UNSPECIFIED: _ClassVar[EvidenceVerdict]
    EVIDENCE_VERDICT_PASSED: _ClassVar[EvidenceVerdict]
    EVIDENCE_VERDICT_FAILED: _ClassVar[EvidenceVerdict]

class CompletionEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPLETION_EVENT_KIND_UNSPECIFIED: _ClassVar[CompletionEventKind]
    COMPLETION_EVENT_KIND_DECISION_BLOCKED: _ClassVar[CompletionEventKind]
    COMPLETION_EVENT_KIND_COMPLETION_COMMITTED: _ClassVar[CompletionEventKind]
    COMPLETION_EVENT_KIND_COMPLETION_SETTLED: _ClassVar[CompletionEventKind]
    COMPLETION_EVENT_KIND_TERMINALIZATION_ERROR: _ClassVar[CompletionEventKind]
    COMPLETION_EVENT_KIND_RUN_CLAIMED: _ClassVar[CompletionEventKind]
    COMPLETION_EVENT_KIND_RUN_CLOSED: _ClassVar[CompletionEventKind]
    COMPLETION_EVENT_KIND_EVIDENCE_RECORDED: _ClassVar[CompletionEventKind]

class TaskEffect(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_EFFECT_UNSPECIFIED: _ClassVar[TaskEffect]
    TASK_EFFECT_DONE: _ClassVar[TaskEffect]
    TASK_EFFECT_SETTLING: _ClassVar[TaskEffect]
    TASK_EFFECT_BLOCKED: _ClassVar[TaskEffect]
    TASK_EFFECT_STATUS_SET: _ClassVar[TaskEffect]
    TASK_EFFECT_CANCELLED: _ClassVar[TaskEffect]
    TASK_EFFECT_UNCHANGED: _ClassVar[TaskEffect]

class TurnEndReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TURN_END_REASON_UNSPECIFIED: _ClassVar[TurnEndReason]
    TURN_END_REASON_COMPLETED: _ClassVar[TurnEndReason]
    TURN_END_REASON_INTERRUPTED: _ClassVar[TurnEndReason]
    TURN_END_REASON_ERROR: _ClassVar[TurnEndReason]
    TURN_END_REASON_CANCELLED: _ClassVar[TurnEndReason]

class ResumeAsk(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESUME_ASK_UNSPECIFIED: _ClassVar[ResumeAsk]
    RESUME_ASK_RESUME_TASK: _ClassVar[ResumeAsk]
    RESUME_ASK_RESUME_COMPLETED_TASK: _ClassVar[ResumeAsk]
    RESUME_ASK_RESUME_ENDED_TASK: _ClassVar[ResumeAsk]

class HostAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HOST_ACTION_UNSPECIFIED: _ClassVar[HostAction]
    HOST_ACTION_RESUME_TASK: _ClassVar[HostAction]
    HOST_ACTION_NEW_TASK: _ClassVar[HostAction]
REQUESTED_OUTCOME_UNSPECIFIED: RequestedOutcome
REQUESTED_OUTCOME_COMPLETED: RequestedOutcome
REQUESTED_OUTCOME_FAILED: RequestedOutcome
VERDICT_UNSPECIFIED: Verdict
VERDICT_ALLOW: Verdict
VERDICT_SOFT_BLOCK: Verdict
VERDICT_HARD_BLOCK: Verdict
AGENT_ACTION_UNSPECIFIED: AgentAction
AGENT_ACTION_REPORT_COMPLETE: AgentAction
AGENT_ACTION_RESOLVE_OPEN_TOOL_CALLS: AgentAction
AGENT_ACTION_REFRESH_STATE: AgentAction
AGENT_ACTION_RECORD_EVIDENCE: AgentAction
AGENT_ACTION_WAIT_FOR_CHILDREN: AgentAction
AGENT_ACTION_PROVIDE_RESULT: AgentAction
AGENT_ACTION_RETRY_LATER: AgentAction
AGENT_ACTION_STOP_AND_REPORT: AgentAction
AGENT_ACTION_ATTEMPT_COMPLETION: AgentAction
AGENT_ACTION_CONTINUE_WORK: AgentAction
AGENT_ACTION_ADDRESS_GATE_FEEDBACK: AgentAction
GATE_STATUS_UNSPECIFIED: GateStatus
GATE_STATUS_PASSED: GateStatus
GATE_STATUS_FAILED: GateStatus
GATE_STATUS_SKIPPED: GateStatus
SETTLEMENT_STATUS_UNSPECIFIED: SettlementStatus
SETTLEMENT_STATUS_PENDING: SettlementStatus
SETTLEMENT_STATUS_SETTLED: SettlementStatus
SETTLEMENT_STATUS_REJECTED: SettlementStatus
RUN_OUTCOME_UNSPECIFIED: RunOutcome
RUN_OUTCOME_SUCCEEDED: RunOutcome
RUN_OUTCOME_FAILED: RunOutcome
RUN_OUTCOME_CANCELLED: RunOutcome
RUN_OUTCOME_STALLED: RunOutcome
FINAL_STATUS_UNSPECIFIED: FinalStatus
FINAL_STATUS_READY: FinalStatus
FINAL_STATUS_IN_PROGRESS: FinalStatus
FINAL_STATUS_BLOCKED: FinalStatus
FINAL_STATUS_DONE: FinalStatus
FINAL_STATUS_CANCELLED: FinalStatus
EVIDENCE_VERDICT_UNSPECIFIED: EvidenceVerdict
EVIDENCE_VERDICT_PASSED: EvidenceVerdict
EVIDENCE_VERDICT_FAILED: EvidenceVerdict
COMPLETION_EVENT_KIND_UNSPECIFIED: CompletionEventKind
COMPLETION_EVENT_KIND_DECISION_BLOCKED: CompletionEventKind
COMPLETION_EVENT_KIND_COMPLETION_COMMITTED: CompletionEventKind
COMPLETION_EVENT_KIND_COMPLETION_SETTLED: CompletionEventKind
COMPLETION_EVENT_KIND_TERMINALIZATION_ERROR: CompletionEventKind
COMPLETION_EVENT_KIND_RUN_CLAIMED: CompletionEventKind
COMPLETION_EVENT_KIND_RUN_CLOSED: CompletionEventKind
COMPLETION_EVENT_KIND_EVIDENCE_RECORDED: CompletionEventKind
TASK_EFFECT_UNSPECIFIED: TaskEffect
TASK_EFFECT_DONE: TaskEffect
TASK_EFFECT_SETTLING: TaskEffect
TASK_EFFECT_BLOCKED: TaskEffect
TASK_EFFECT_STATUS_SET: TaskEffect
TASK_EFFECT_CANCELLED: TaskEffect
TASK_EFFECT_UNCHANGED: TaskEffect
TURN_END_REASON_UNSPECIFIED: TurnEndReason
TURN_END_REASON_COMPLETED: TurnEndReason
TURN_END_REASON_INTERRUPTED: TurnEndReason
TURN_END_REASON_ERROR: TurnEndReason
TURN_END_REASON_CANCELLED: TurnEndReason
RESUME_ASK_UNSPECIFIED: ResumeAsk
RESUME_ASK_RESUME_TASK: ResumeAsk
RESUME_ASK_RESUME_COMPLETED_TASK: ResumeAsk
RESUME_ASK_RESUME_ENDED_TASK: ResumeAsk
HOST_ACTION_UNSPECIFIED: HostAction
HOST_ACTION_RESUME_TASK: HostAction
HOST_ACTION_NEW_TASK: HostAction
