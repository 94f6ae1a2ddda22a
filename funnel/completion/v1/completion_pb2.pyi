import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.rpc import error_details_pb2 as _error_details_pb2
from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

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

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    FIELD_REQUIRED: _ClassVar[ErrorReason]
    FIELD_MALFORMED: _ClassVar[ErrorReason]
    FIELD_TOO_LONG: _ClassVar[ErrorReason]
    ENUM_UNSPECIFIED: _ClassVar[ErrorReason]
    VALUE_OUT_OF_RANGE: _ClassVar[ErrorReason]
    REQUEST_ID_REUSED: _ClassVar[ErrorReason]
    RUN_NOT_FOUND: _ClassVar[ErrorReason]
    TASK_NOT_FOUND: _ClassVar[ErrorReason]
    COMPLETION_NOT_FOUND: _ClassVar[ErrorReason]
    LEASE_HELD: _ClassVar[ErrorReason]
    RUN_ALREADY_FINISHED: _ClassVar[ErrorReason]
    LEASE_NOT_CURRENT: _ClassVar[ErrorReason]
    LEASE_EXPIRED: _ClassVar[ErrorReason]
    GENERATION_TERMINAL: _ClassVar[ErrorReason]
    CANCELLATION_REQUESTED: _ClassVar[ErrorReason]
    COMPLETION_CONFLICT: _ClassVar[ErrorReason]
    COMPLETION_CORRUPTED: _ClassVar[ErrorReason]
    SNAPSHOT_CHANGED: _ClassVar[ErrorReason]
    LIFECYCLE_REJECTED: _ClassVar[ErrorReason]
    LIFECYCLE_UNAVAILABLE: _ClassVar[ErrorReason]
    WATCH_OVERFLOW: _ClassVar[ErrorReason]
    STORAGE_UNAVAILABLE: _ClassVar[ErrorReason]
    DEADLINE_EXPIRED: _ClassVar[ErrorReason]
    INTERNAL_FAULT: _ClassVar[ErrorReason]
    STATE_VERSION_MISMATCH: _ClassVar[ErrorReason]
    TRANSCRIPT_GRAMMAR_VIOLATION: _ClassVar[ErrorReason]
    TRANSCRIPT_NOT_EMPTY: _ClassVar[ErrorReason]
    TRANSCRIPT_LINE_INVALID: _ClassVar[ErrorReason]
    CREDENTIALS_MISSING: _ClassVar[ErrorReason]
    CREDENTIALS_INVALID: _ClassVar[ErrorReason]
    CREDENTIALS_EXPIRED: _ClassVar[ErrorReason]
    WORKSPACE_NOT_GRANTED: _ClassVar[ErrorReason]
    ROLE_NOT_PERMITTED: _ClassVar[ErrorReason]
    RATE_LIMITED: _ClassVar[ErrorReason]
    MESSAGE_TOO_LARGE: _ClassVar[ErrorReason]
    WATCHERS_EXHAUSTED: _ClassVar[ErrorReason]
    RUN_NOT_HELD: _ClassVar[ErrorReason]
    AGENT_ID_MISMATCH: _ClassVar[ErrorReason]
    IMPORT_BUFFER_EXHAUSTED: _ClassVar[ErrorReason]
    STREAM_IDLE: _ClassVar[ErrorReason]
    SERVER_SHUTTING_DOWN: _ClassVar[ErrorReason]
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
ERROR_REASON_UNSPECIFIED: ErrorReason
FIELD_REQUIRED: ErrorReason
FIELD_MALFORMED: ErrorReason
FIELD_TOO_LONG: ErrorReason
ENUM_UNSPECIFIED: ErrorReason
VALUE_OUT_OF_RANGE: ErrorReason
REQUEST_ID_REUSED: ErrorReason
RUN_NOT_FOUND: ErrorReason
TASK_NOT_FOUND: ErrorReason
COMPLETION_NOT_FOUND: ErrorReason
LEASE_HELD: ErrorReason
RUN_ALREADY_FINISHED: ErrorReason
LEASE_NOT_CURRENT: ErrorReason
LEASE_EXPIRED: ErrorReason
GENERATION_TERMINAL: ErrorReason
CANCELLATION_REQUESTED: ErrorReason
COMPLETION_CONFLICT: ErrorReason
COMPLETION_CORRUPTED: ErrorReason
SNAPSHOT_CHANGED: ErrorReason
LIFECYCLE_REJECTED: ErrorReason
LIFECYCLE_UNAVAILABLE: ErrorReason
WATCH_OVERFLOW: ErrorReason
STORAGE_UNAVAILABLE: ErrorReason
DEADLINE_EXPIRED: ErrorReason
INTERNAL_FAULT: ErrorReason
STATE_VERSION_MISMATCH: ErrorReason
TRANSCRIPT_GRAMMAR_VIOLATION: ErrorReason
TRANSCRIPT_NOT_EMPTY: ErrorReason
TRANSCRIPT_LINE_INVALID: ErrorReason
CREDENTIALS_MISSING: ErrorReason
CREDENTIALS_INVALID: ErrorReason
CREDENTIALS_EXPIRED: ErrorReason
WORKSPACE_NOT_GRANTED: ErrorReason
ROLE_NOT_PERMITTED: ErrorReason
RATE_LIMITED: ErrorReason
MESSAGE_TOO_LARGE: ErrorReason
WATCHERS_EXHAUSTED: ErrorReason
RUN_NOT_HELD: ErrorReason
AGENT_ID_MISMATCH: ErrorReason
IMPORT_BUFFER_EXHAUSTED: ErrorReason
STREAM_IDLE: ErrorReason
SERVER_SHUTTING_DOWN: ErrorReason

class ErrorDetails(_message.Message):
    __slots__ = ("status", "error_info", "bad_request", "retry_info")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_INFO_FIELD_NUMBER: _ClassVar[int]
    BAD_REQUEST_FIELD_NUMBER: _ClassVar[int]
    RETRY_INFO_FIELD_NUMBER: _ClassVar[int]
    status: _status_pb2.Status
    error_info: _error_details_pb2.ErrorInfo
    bad_request: _error_details_pb2.BadRequest
    retry_info: _error_details_pb2.RetryInfo
    def __init__(self, status: _Optional[_Union[_status_pb2.Status, _Mapping]] = ..., error_info: _Optional[_Union[_error_details_pb2.ErrorInfo, _Mapping]] = ..., bad_request: _Optional[_Union[_error_details_pb2.BadRequest, _Mapping]] = ..., retry_info: _Optional[_Union[_error_details_pb2.RetryInfo, _Mapping]] = ...) -> None: ...

class Caller(_message.Message):
    __slots__ = ("subject", "role")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    subject: str
    role: str
    def __init__(self, subject: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("task_id", "run_id", "epoch", "expire_time")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    run_id: str
    epoch: int
    expire_time: _timestamp_pb2.Timestamp
    def __init__(self, task_id: _Optional[str] = ..., run_id: _Optional[str] = ..., epoch: _Optional[int] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("workspace_id", "run_id", "task_id", "agent_id", "generation", "epoch", "claim_time", "lease_expire_time", "finish_time", "outcome", "tokens_input", "tokens_output", "tokens_total", "notes", "notes_truncated", "error", "final_status")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CLAIM_TIME_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TOKENS_INPUT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    NOTES_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FINAL_STATUS_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    run_id: str
    task_id: str
    agent_id: str
    generation: int
    epoch: int
    claim_time: _timestamp_pb2.Timestamp
    lease_expire_time: _timestamp_pb2.Timestamp
    finish_time: _timestamp_pb2.Timestamp
    outcome: RunOutcome
    tokens_input: int
    tokens_output: int
    tokens_total: int
    notes: str
    notes_truncated: bool
    error: str
    final_status: FinalStatus
    def __init__(self, workspace_id: _Optional[str] = ..., run_id: _Optional[str] = ..., task_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., generation: _Optional[int] = ..., epoch: _Optional[int] = ..., claim_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., outcome: _Optional[_Union[RunOutcome, str]] = ..., tokens_input: _Optional[int] = ..., tokens_output: _Optional[int] = ..., tokens_total: _Optional[int] = ..., notes: _Optional[str] = ..., notes_truncated: _Optional[bool] = ..., error: _Optional[str] = ..., final_status: _Optional[_Union[FinalStatus, str]] = ...) -> None: ...

class GateResult(_message.Message):
    __slots__ = ("gate_id", "gate_version", "status", "reason", "decisive")
    GATE_ID_FIELD_NUMBER: _ClassVar[int]
    GATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DECISIVE_FIELD_NUMBER: _ClassVar[int]
    gate_id: str
    gate_version: int
    status: GateStatus
    reason: str
    decisive: bool
    def __init__(self, gate_id: _Optional[str] = ..., gate_version: _Optional[int] = ..., status: _Optional[_Union[GateStatus, str]] = ..., reason: _Optional[str] = ..., decisive: _Optional[bool] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("verdict", "next_action", "forbidden_actions", "instruction", "trace", "decision_schema", "state_version", "checkpoint", "details")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    NEXT_ACTION_FIELD_NUMBER: _ClassVar[int]
    FORBIDDEN_ACTIONS_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    DECISION_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    verdict: Verdict
    next_action: AgentAction
    forbidden_actions: _containers.RepeatedScalarFieldContainer[AgentAction]
    instruction: str
    trace: _containers.RepeatedCompositeFieldContainer[GateResult]
    decision_schema: str
    state_version: int
    checkpoint: str
    details: BlockDetails
    def __init__(self, verdict: _Optional[_Union[Verdict, str]] = ..., next_action: _Optional[_Union[AgentAction, str]] = ..., forbidden_actions: _Optional[_Iterable[_Union[AgentAction, str]]] = ..., instruction: _Optional[str] = ..., trace: _Optional[_Iterable[_Union[GateResult, _Mapping]]] = ..., decision_schema: _Optional[str] = ..., state_version: _Optional[int] = ..., checkpoint: _Optional[str] = ..., details: _Optional[_Union[BlockDetails, _Mapping]] = ...) -> None: ...

class BlockDetails(_message.Message):
    __slots__ = ("decisive_gate", "missing_evidence_kinds", "failing_evidence_kinds", "evidence_checkpoint", "open_tool_call_ids", "open_step_id", "open_turn_id", "open_child_task_ids", "current_lease", "current_state_version", "current_generation", "lifecycle_reason", "gate_feedback")
    DECISIVE_GATE_FIELD_NUMBER: _ClassVar[int]
    MISSING_EVIDENCE_KINDS_FIELD_NUMBER: _ClassVar[int]
    FAILING_EVIDENCE_KINDS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    OPEN_TOOL_CALL_IDS_FIELD_NUMBER: _ClassVar[int]
    OPEN_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    OPEN_TURN_ID_FIELD_NUMBER: _ClassVar[int]
    OPEN_CHILD_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEASE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_GENERATION_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_REASON_FIELD_NUMBER: _ClassVar[int]
    GATE_FEEDBACK_FIELD_NUMBER: _ClassVar[int]
    decisive_gate: str
    missing_evidence_kinds: _containers.RepeatedScalarFieldContainer[str]
    failing_evidence_kinds: _containers.RepeatedScalarFieldContainer[str]
    evidence_checkpoint: str
    open_tool_call_ids: _containers.RepeatedScalarFieldContainer[str]
    open_step_id: str
    open_turn_id: str
    open_child_task_ids: _containers.RepeatedScalarFieldContainer[str]
    current_lease: Lease
    current_state_version: int
    current_generation: int
    lifecycle_reason: str
    gate_feedback: str
    def __init__(self, decisive_gate: _Optional[str] = ..., missing_evidence_kinds: _Optional[_Iterable[str]] = ..., failing_evidence_kinds: _Optional[_Iterable[str]] = ..., evidence_checkpoint: _Optional[str] = ..., open_tool_call_ids: _Optional[_Iterable[str]] = ..., open_step_id: _Optional[str] = ..., open_turn_id: _Optional[str] = ..., open_child_task_ids: _Optional[_Iterable[str]] = ..., current_lease: _Optional[_Union[Lease, _Mapping]] = ..., current_state_version: _Optional[int] = ..., current_generation: _Optional[int] = ..., lifecycle_reason: _Optional[str] = ..., gate_feedback: _Optional[str] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation", "completion_id", "identity", "outcome", "result", "run_id", "state_version", "checkpoint", "commit_time", "settlement", "lifecycle_revision", "lifecycle_event_sequence", "settle_time", "terminalization_error_reason", "terminalization_error_message", "decision", "settle_attempts", "next_settle_time", "last_settle_error")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_ID_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    SETTLEMENT_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_REVISION_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_EVENT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SETTLE_TIME_FIELD_NUMBER: _ClassVar[int]
    TERMINALIZATION_ERROR_REASON_FIELD_NUMBER: _ClassVar[int]
    TERMINALIZATION_ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    SETTLE_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_SETTLE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_SETTLE_ERROR_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    completion_id: str
    identity: str
    outcome: RequestedOutcome
    result: str
    run_id: str
    state_version: int
    checkpoint: str
    commit_time: _timestamp_pb2.Timestamp
    settlement: SettlementStatus
    lifecycle_revision: int
    lifecycle_event_sequence: int
    settle_time: _timestamp_pb2.Timestamp
    terminalization_error_reason: str
    terminalization_error_message: str
    decision: Decision
    settle_attempts: int
    next_settle_time: _timestamp_pb2.Timestamp
    last_settle_error: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., completion_id: _Optional[str] = ..., identity: _Optional[str] = ..., outcome: _Optional[_Union[RequestedOutcome, str]] = ..., result: _Optional[str] = ..., run_id: _Optional[str] = ..., state_version: _Optional[int] = ..., checkpoint: _Optional[str] = ..., commit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., settlement: _Optional[_Union[SettlementStatus, str]] = ..., lifecycle_revision: _Optional[int] = ..., lifecycle_event_sequence: _Optional[int] = ..., settle_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., terminalization_error_reason: _Optional[str] = ..., terminalization_error_message: _Optional[str] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ..., settle_attempts: _Optional[int] = ..., next_settle_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_settle_error: _Optional[str] = ...) -> None: ...

class CompletionIdentity(_message.Message):
    __slots__ = ("schema", "workspace_id", "task_id", "generation", "state_version", "checkpoint", "outcome", "decision_schema")
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DECISION_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    schema: str
    workspace_id: str
    task_id: str
    generation: int
    state_version: int
    checkpoint: str
    outcome: str
    decision_schema: str
    def __init__(self, schema: _Optional[str] = ..., workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., state_version: _Optional[int] = ..., checkpoint: _Optional[str] = ..., outcome: _Optional[str] = ..., decision_schema: _Optional[str] = ...) -> None: ...

class Evidence(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation", "evidence_id", "kind", "verdict", "checkpoint", "details", "run_id", "record_time", "recorded_by")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_TIME_FIELD_NUMBER: _ClassVar[int]
    RECORDED_BY_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    evidence_id: str
    kind: str
    verdict: EvidenceVerdict
    checkpoint: str
    details: str
    run_id: str
    record_time: _timestamp_pb2.Timestamp
    recorded_by: Caller
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., evidence_id: _Optional[str] = ..., kind: _Optional[str] = ..., verdict: _Optional[_Union[EvidenceVerdict, str]] = ..., checkpoint: _Optional[str] = ..., details: _Optional[str] = ..., run_id: _Optional[str] = ..., record_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., recorded_by: _Optional[_Union[Caller, _Mapping]] = ...) -> None: ...

class CompletionEvent(_message.Message):
    __slots__ = ("sequence", "workspace_id", "task_id", "generation", "kind", "run_id", "completion_id", "outcome", "decision", "lifecycle_revision", "lifecycle_event_sequence", "error_reason", "error_message", "commit_time", "run_outcome", "evidence_id")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_REVISION_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_EVENT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ERROR_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    RUN_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_ID_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    workspace_id: str
    task_id: str
    generation: int
    kind: CompletionEventKind
    run_id: str
    completion_id: str
    outcome: RequestedOutcome
    decision: Decision
    lifecycle_revision: int
    lifecycle_event_sequence: int
    error_reason: str
    error_message: str
    commit_time: _timestamp_pb2.Timestamp
    run_outcome: RunOutcome
    evidence_id: str
    def __init__(self, sequence: _Optional[int] = ..., workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., kind: _Optional[_Union[CompletionEventKind, str]] = ..., run_id: _Optional[str] = ..., completion_id: _Optional[str] = ..., outcome: _Optional[_Union[RequestedOutcome, str]] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ..., lifecycle_revision: _Optional[int] = ..., lifecycle_event_sequence: _Optional[int] = ..., error_reason: _Optional[str] = ..., error_message: _Optional[str] = ..., commit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., run_outcome: _Optional[_Union[RunOutcome, str]] = ..., evidence_id: _Optional[str] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("audit_id", "workspace_id", "action", "run_id", "task_id", "metadata", "record_time", "caller")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    RECORD_TIME_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    audit_id: int
    workspace_id: str
    action: str
    run_id: str
    task_id: str
    metadata: _containers.ScalarMap[str, str]
    record_time: _timestamp_pb2.Timestamp
    caller: Caller
    def __init__(self, audit_id: _Optional[int] = ..., workspace_id: _Optional[str] = ..., action: _Optional[str] = ..., run_id: _Optional[str] = ..., task_id: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., record_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., caller: _Optional[_Union[Caller, _Mapping]] = ...) -> None: ...

class ClaimTaskRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "agent_id", "lease_ttl", "request_id")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    agent_id: str
    lease_ttl: _duration_pb2.Duration
    request_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., lease_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ClaimTaskResponse(_message.Message):
    __slots__ = ("run", "lease")
    RUN_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    run: Run
    lease: Lease
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("workspace_id", "run_id", "epoch", "lease_ttl", "request_id")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    run_id: str
    epoch: int
    lease_ttl: _duration_pb2.Duration
    request_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., run_id: _Optional[str] = ..., epoch: _Optional[int] = ..., lease_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class RenewLeaseResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class CompleteRunRequest(_message.Message):
    __slots__ = ("workspace_id", "run_id", "outcome", "tokens_input", "tokens_output", "tokens_total", "notes", "error", "final_status", "request_id")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TOKENS_INPUT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FINAL_STATUS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    run_id: str
    outcome: RunOutcome
    tokens_input: int
    tokens_output: int
    tokens_total: int
    notes: str
    error: str
    final_status: FinalStatus
    request_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., run_id: _Optional[str] = ..., outcome: _Optional[_Union[RunOutcome, str]] = ..., tokens_input: _Optional[int] = ..., tokens_output: _Optional[int] = ..., tokens_total: _Optional[int] = ..., notes: _Optional[str] = ..., error: _Optional[str] = ..., final_status: _Optional[_Union[FinalStatus, str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class CompleteRunResponse(_message.Message):
    __slots__ = ("run_id", "finish_time", "final_status", "tokens_total", "notes_truncated", "decision", "completion", "task_effect", "task_effect_reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    FINAL_STATUS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NOTES_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    TASK_EFFECT_FIELD_NUMBER: _ClassVar[int]
    TASK_EFFECT_REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    finish_time: _timestamp_pb2.Timestamp
    final_status: FinalStatus
    tokens_total: int
    notes_truncated: bool
    decision: Decision
    completion: Completion
    task_effect: TaskEffect
    task_effect_reason: str
    def __init__(self, run_id: _Optional[str] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., final_status: _Optional[_Union[FinalStatus, str]] = ..., tokens_total: _Optional[int] = ..., notes_truncated: _Optional[bool] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ..., completion: _Optional[_Union[Completion, _Mapping]] = ..., task_effect: _Optional[_Union[TaskEffect, str]] = ..., task_effect_reason: _Optional[str] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("workspace_id", "run_id")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    run_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "page_size", "page_token", "open_only")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OPEN_ONLY_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    page_size: int
    page_token: str
    open_only: bool
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., open_only: _Optional[bool] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RecordEvidenceRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation", "kind", "verdict", "checkpoint", "details", "run_id", "request_id")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    kind: str
    verdict: EvidenceVerdict
    checkpoint: str
    details: str
    run_id: str
    request_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., kind: _Optional[str] = ..., verdict: _Optional[_Union[EvidenceVerdict, str]] = ..., checkpoint: _Optional[str] = ..., details: _Optional[str] = ..., run_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class RecordEvidenceResponse(_message.Message):
    __slots__ = ("evidence",)
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    evidence: Evidence
    def __init__(self, evidence: _Optional[_Union[Evidence, _Mapping]] = ...) -> None: ...

class ListEvidenceRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation", "page_size", "page_token")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    page_size: int
    page_token: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListEvidenceResponse(_message.Message):
    __slots__ = ("evidence", "next_page_token")
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    evidence: _containers.RepeatedCompositeFieldContainer[Evidence]
    next_page_token: str
    def __init__(self, evidence: _Optional[_Iterable[_Union[Evidence, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AttemptCompletionRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "run_id", "epoch", "outcome", "result", "state_version", "request_id")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    run_id: str
    epoch: int
    outcome: RequestedOutcome
    result: str
    state_version: int
    request_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., run_id: _Optional[str] = ..., epoch: _Optional[int] = ..., outcome: _Optional[_Union[RequestedOutcome, str]] = ..., result: _Optional[str] = ..., state_version: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class AttemptCompletionResponse(_message.Message):
    __slots__ = ("decision", "completion", "existing_completion")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    EXISTING_COMPLETION_FIELD_NUMBER: _ClassVar[int]
    decision: Decision
    completion: Completion
    existing_completion: bool
    def __init__(self, decision: _Optional[_Union[Decision, _Mapping]] = ..., completion: _Optional[_Union[Completion, _Mapping]] = ..., existing_completion: _Optional[bool] = ...) -> None: ...

class GetCompletionRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class GetCompletionResponse(_message.Message):
    __slots__ = ("completion",)
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    completion: Completion
    def __init__(self, completion: _Optional[_Union[Completion, _Mapping]] = ...) -> None: ...

class ListCompletionsRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "page_size", "page_token", "settlement")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SETTLEMENT_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    page_size: int
    page_token: str
    settlement: SettlementStatus
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., settlement: _Optional[_Union[SettlementStatus, str]] = ...) -> None: ...

class ListCompletionsResponse(_message.Message):
    __slots__ = ("completions", "next_page_token")
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    next_page_token: str
    def __init__(self, completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListAuditLogRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "run_id", "page_size", "page_token")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    run_id: str
    page_size: int
    page_token: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., run_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListAuditLogResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchCompletionEventsRequest(_message.Message):
    __slots__ = ("workspace_id", "after_sequence", "task_id")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    after_sequence: int
    task_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., after_sequence: _Optional[int] = ..., task_id: _Optional[str] = ...) -> None: ...

class ListCompletionEventsRequest(_message.Message):
    __slots__ = ("workspace_id", "after_sequence", "task_id", "page_size")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    after_sequence: int
    task_id: str
    page_size: int
    def __init__(self, workspace_id: _Optional[str] = ..., after_sequence: _Optional[int] = ..., task_id: _Optional[str] = ..., page_size: _Optional[int] = ...) -> None: ...

class ListCompletionEventsResponse(_message.Message):
    __slots__ = ("events", "has_more")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[CompletionEvent]
    has_more: bool
    def __init__(self, events: _Optional[_Iterable[_Union[CompletionEvent, _Mapping]]] = ..., has_more: _Optional[bool] = ...) -> None: ...

class WatchCompletionEventsResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: CompletionEvent
    def __init__(self, event: _Optional[_Union[CompletionEvent, _Mapping]] = ...) -> None: ...

class EvaluateGateRequest(_message.Message):
    __slots__ = ("gate_id", "workspace_id", "task_id", "generation", "run_id", "outcome", "result", "state_version", "checkpoint", "evidence")
    GATE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    gate_id: str
    workspace_id: str
    task_id: str
    generation: int
    run_id: str
    outcome: RequestedOutcome
    result: str
    state_version: int
    checkpoint: str
    evidence: _containers.RepeatedCompositeFieldContainer[Evidence]
    def __init__(self, gate_id: _Optional[str] = ..., workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., run_id: _Optional[str] = ..., outcome: _Optional[_Union[RequestedOutcome, str]] = ..., result: _Optional[str] = ..., state_version: _Optional[int] = ..., checkpoint: _Optional[str] = ..., evidence: _Optional[_Iterable[_Union[Evidence, _Mapping]]] = ...) -> None: ...

class EvaluateGateResponse(_message.Message):
    __slots__ = ("status", "reason")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    status: GateStatus
    reason: str
    def __init__(self, status: _Optional[_Union[GateStatus, str]] = ..., reason: _Optional[str] = ...) -> None: ...
