import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
    reason: TurnEndReason
    def __init__(self, turn_id: _Optional[str] = ..., reason: _Optional[_Union[TurnEndReason, str]] = ...) -> None: ...

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

class AppendTranscriptRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "events", "expected_state_version", "request_id")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    events: _containers.RepeatedCompositeFieldContainer[SessionEvent]
    expected_state_version: int
    request_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[SessionEvent, _Mapping]]] = ..., expected_state_version: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class AppendTranscriptResponse(_message.Message):
    __slots__ = ("state_version", "first_sequence", "generation", "resumed")
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    state_version: int
    first_sequence: int
    generation: int
    resumed: bool
    def __init__(self, state_version: _Optional[int] = ..., first_sequence: _Optional[int] = ..., generation: _Optional[int] = ..., resumed: _Optional[bool] = ...) -> None: ...

class LoadTranscriptRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "page_size", "page_token")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    page_size: int
    page_token: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class LoadTranscriptResponse(_message.Message):
    __slots__ = ("events", "next_page_token", "state_version", "repaired", "turn_in_progress")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    REPAIRED_FIELD_NUMBER: _ClassVar[int]
    TURN_IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[SessionEvent]
    next_page_token: str
    state_version: int
    repaired: bool
    turn_in_progress: bool
    def __init__(self, events: _Optional[_Iterable[_Union[SessionEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., state_version: _Optional[int] = ..., repaired: _Optional[bool] = ..., turn_in_progress: _Optional[bool] = ...) -> None: ...

class ExportTranscriptRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ...) -> None: ...

class ExportTranscriptResponse(_message.Message):
    __slots__ = ("jsonl",)
    JSONL_FIELD_NUMBER: _ClassVar[int]
    jsonl: bytes
    def __init__(self, jsonl: _Optional[bytes] = ...) -> None: ...

class ImportTranscriptRequest(_message.Message):
    __slots__ = ("target", "jsonl_chunk")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    JSONL_CHUNK_FIELD_NUMBER: _ClassVar[int]
    target: ImportTarget
    jsonl_chunk: bytes
    def __init__(self, target: _Optional[_Union[ImportTarget, _Mapping]] = ..., jsonl_chunk: _Optional[bytes] = ...) -> None: ...

class ImportTarget(_message.Message):
    __slots__ = ("workspace_id", "task_id")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ...) -> None: ...

class ImportTranscriptResponse(_message.Message):
    __slots__ = ("imported_events", "state_version", "warnings")
    IMPORTED_EVENTS_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    imported_events: int
    state_version: int
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, imported_events: _Optional[int] = ..., state_version: _Optional[int] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class ResolveResumeRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ...) -> None: ...

class ResolveResumeResponse(_message.Message):
    __slots__ = ("ask", "primary", "secondary", "reason", "generation", "completion_id")
    ASK_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    SECONDARY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_ID_FIELD_NUMBER: _ClassVar[int]
    ask: ResumeAsk
    primary: HostAction
    secondary: HostAction
    reason: str
    generation: int
    completion_id: str
    def __init__(self, ask: _Optional[_Union[ResumeAsk, str]] = ..., primary: _Optional[_Union[HostAction, str]] = ..., secondary: _Optional[_Union[HostAction, str]] = ..., reason: _Optional[str] = ..., generation: _Optional[int] = ..., completion_id: _Optional[str] = ...) -> None: ...
