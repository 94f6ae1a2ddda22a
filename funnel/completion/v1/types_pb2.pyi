import datetime

from funnel.completion.v1 import enums_pb2 as _enums_pb2
from google.api import field_behavior_pb2 as _field_behavior_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
    outcome: _enums_pb2.RunOutcome
    tokens_input: int
    tokens_output: int
    tokens_total: int
    notes: str
    notes_truncated: bool
    error: str
    final_status: _enums_pb2.FinalStatus
    def __init__(self, workspace_id: _Optional[str] = ..., run_id: _Optional[str] = ..., task_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., generation: _Optional[int] = ..., epoch: _Optional[int] = ..., claim_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., outcome: _Optional[_Union[_enums_pb2.RunOutcome, str]] = ..., tokens_input: _Optional[int] = ..., tokens_output: _Optional[int] = ..., tokens_total: _Optional[int] = ..., notes: _Optional[str] = ..., notes_truncated: _Optional[bool] = ..., error: _Optional[str] = ..., final_status: _Optional[_Union[_enums_pb2.FinalStatus, str]] = ...) -> None: ...

class GateResult(_message.Message):
    __slots__ = ("gate_id", "gate_version", "status", "reason", "decisive")
    GATE_ID_FIELD_NUMBER: _ClassVar[int]
    GATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DECISIVE_FIELD_NUMBER: _ClassVar[int]
    gate_id: str
    gate_version: int
    status: _enums_pb2.GateStatus
    reason: str
    decisive: bool
    def __init__(self, gate_id: _Optional[str] = ..., gate_version: _Optional[int] = ..., status: _Optional[_Union[_enums_pb2.GateStatus, str]] = ..., reason: _Optional[str] = ..., decisive: _Optional[bool] = ...) -> None: ...

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
    verdict: _enums_pb2.Verdict
    next_action: _enums_pb2.AgentAction
    forbidden_actions: _containers.RepeatedScalarFieldContainer[_enums_pb2.AgentAction]
    instruction: str
    trace: _containers.RepeatedCompositeFieldContainer[GateResult]
    decision_schema: str
    state_version: int
    checkpoint: str
    details: BlockDetails
    def __init__(self, verdict: _Optional[_Union[_enums_pb2.Verdict, str]] = ..., next_action: _Optional[_Union[_enums_pb2.AgentAction, str]] = ..., forbidden_actions: _Optional[_Iterable[_Union[_enums_pb2.AgentAction, str]]] = ..., instruction: _Optional[str] = ..., trace: _Optional[_Iterable[_Union[GateResult, _Mapping]]] = ..., decision_schema: _Optional[str] = ..., state_version: _Optional[int] = ..., checkpoint: _Optional[str] = ..., details: _Optional[_Union[BlockDetails, _Mapping]] = ...) -> None: ...

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
    outcome: _enums_pb2.RequestedOutcome
    result: str
    run_id: str
    state_version: int
    checkpoint: str
    commit_time: _timestamp_pb2.Timestamp
    settlement: _enums_pb2.SettlementStatus
    lifecycle_revision: int
    lifecycle_event_sequence: int
    settle_time: _timestamp_pb2.Timestamp
    terminalization_error_reason: str
    terminalization_error_message: str
    decision: Decision
    settle_attempts: int
    next_settle_time: _timestamp_pb2.Timestamp
    last_settle_error: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., completion_id: _Optional[str] = ..., identity: _Optional[str] = ..., outcome: _Optional[_Union[_enums_pb2.RequestedOutcome, str]] = ..., result: _Optional[str] = ..., run_id: _Optional[str] = ..., state_version: _Optional[int] = ..., checkpoint: _Optional[str] = ..., commit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., settlement: _Optional[_Union[_enums_pb2.SettlementStatus, str]] = ..., lifecycle_revision: _Optional[int] = ..., lifecycle_event_sequence: _Optional[int] = ..., settle_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., terminalization_error_reason: _Optional[str] = ..., terminalization_error_message: _Optional[str] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ..., settle_attempts: _Optional[int] = ..., next_settle_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_settle_error: _Optional[str] = ...) -> None: ...

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
    verdict: _enums_pb2.EvidenceVerdict
    checkpoint: str
    details: str
    run_id: str
    record_time: _timestamp_pb2.Timestamp
    recorded_by: Caller
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., evidence_id: _Optional[str] = ..., kind: _Optional[str] = ..., verdict: _Optional[_Union[_enums_pb2.EvidenceVerdict, str]] = ..., checkpoint: _Optional[str] = ..., details: _Optional[str] = ..., run_id: _Optional[str] = ..., record_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., recorded_by: _Optional[_Union[Caller, _Mapping]] = ...) -> None: ...

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
    kind: _enums_pb2.CompletionEventKind
    run_id: str
    completion_id: str
    outcome: _enums_pb2.RequestedOutcome
    decision: Decision
    lifecycle_revision: int
    lifecycle_event_sequence: int
    error_reason: str
    error_message: str
    commit_time: _timestamp_pb2.Timestamp
    run_outcome: _enums_pb2.RunOutcome
    evidence_id: str
    def __init__(self, sequence: _Optional[int] = ..., workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., kind: _Optional[_Union[_enums_pb2.CompletionEventKind, str]] = ..., run_id: _Optional[str] = ..., completion_id: _Optional[str] = ..., outcome: _Optional[_Union[_enums_pb2.RequestedOutcome, str]] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ..., lifecycle_revision: _Optional[int] = ..., lifecycle_event_sequence: _Optional[int] = ..., error_reason: _Optional[str] = ..., error_message: _Optional[str] = ..., commit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., run_outcome: _Optional[_Union[_enums_pb2.RunOutcome, str]] = ..., evidence_id: _Optional[str] = ...) -> None: ...

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

class TurnStart(_message.Message):
    __slots__ = ("turn_id",)
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    def __init__(self, turn_id: _Optional[str] = ...) -> None: ...

class TurnEnd(_message.Message):
    __slots__ = ("turn_id", "reason")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    reason: _enums_pb2.TurnEndReason
    def __init__(self, turn_id: _Optional[str] = ..., reason: _Optional[_Union[_enums_pb2.TurnEndReason, str]] = ...) -> None: ...

class StepStart(_message.Message):
    __slots__ = ("step_id",)
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    step_id: str
    def __init__(self, step_id: _Optional[str] = ...) -> None: ...

class StepEnd(_message.Message):
    __slots__ = ("step_id",)
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    step_id: str
    def __init__(self, step_id: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("call_id", "tool_name", "arguments")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    tool_name: str
    arguments: str
    def __init__(self, call_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class ToolResult(_message.Message):
    __slots__ = ("call_id", "is_error", "content")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    is_error: bool
    content: str
    def __init__(self, call_id: _Optional[str] = ..., is_error: _Optional[bool] = ..., content: _Optional[str] = ...) -> None: ...

class UserMessage(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class AssistantMessage(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("checkpoint_id",)
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    def __init__(self, checkpoint_id: _Optional[str] = ...) -> None: ...

class CheckpointRestore(_message.Message):
    __slots__ = ("checkpoint_id",)
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    def __init__(self, checkpoint_id: _Optional[str] = ...) -> None: ...

class UserFeedback(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class PromptResend(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("sequence", "generation", "synthetic", "record_time", "turn_start", "turn_end", "step_start", "step_end", "tool_call", "tool_result", "user_message", "assistant_message", "checkpoint", "checkpoint_restore", "user_feedback", "prompt_resend")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    SYNTHETIC_FIELD_NUMBER: _ClassVar[int]
    RECORD_TIME_FIELD_NUMBER: _ClassVar[int]
    TURN_START_FIELD_NUMBER: _ClassVar[int]
    TURN_END_FIELD_NUMBER: _ClassVar[int]
    STEP_START_FIELD_NUMBER: _ClassVar[int]
    STEP_END_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULT_FIELD_NUMBER: _ClassVar[int]
    USER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ASSISTANT_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_RESTORE_FIELD_NUMBER: _ClassVar[int]
    USER_FEEDBACK_FIELD_NUMBER: _ClassVar[int]
    PROMPT_RESEND_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    generation: int
    synthetic: bool
    record_time: _timestamp_pb2.Timestamp
    turn_start: TurnStart
    turn_end: TurnEnd
    step_start: StepStart
    step_end: StepEnd
    tool_call: ToolCall
    tool_result: ToolResult
    user_message: UserMessage
    assistant_message: AssistantMessage
    checkpoint: Checkpoint
    checkpoint_restore: CheckpointRestore
    user_feedback: UserFeedback
    prompt_resend: PromptResend
    def __init__(self, sequence: _Optional[int] = ..., generation: _Optional[int] = ..., synthetic: _Optional[bool] = ..., record_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., turn_start: _Optional[_Union[TurnStart, _Mapping]] = ..., turn_end: _Optional[_Union[TurnEnd, _Mapping]] = ..., step_start: _Optional[_Union[StepStart, _Mapping]] = ..., step_end: _Optional[_Union[StepEnd, _Mapping]] = ..., tool_call: _Optional[_Union[ToolCall, _Mapping]] = ..., tool_result: _Optional[_Union[ToolResult, _Mapping]] = ..., user_message: _Optional[_Union[UserMessage, _Mapping]] = ..., assistant_message: _Optional[_Union[AssistantMessage, _Mapping]] = ..., checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., checkpoint_restore: _Optional[_Union[CheckpointRestore, _Mapping]] = ..., user_feedback: _Optional[_Union[UserFeedback, _Mapping]] = ..., prompt_resend: _Optional[_Union[PromptResend, _Mapping]] = ...) -> None: ...
