from funnel.completion.v1 import enums_pb2 as _enums_pb2
from funnel.completion.v1 import types_pb2 as _types_pb2
from google.api import field_behavior_pb2 as _field_behavior_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AppendTranscriptRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "events", "expected_state_version", "request_id")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    events: _containers.RepeatedCompositeFieldContainer[_types_pb2.SessionEvent]
    expected_state_version: int
    request_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[_types_pb2.SessionEvent, _Mapping]]] = ..., expected_state_version: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

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
    events: _containers.RepeatedCompositeFieldContainer[_types_pb2.SessionEvent]
    next_page_token: str
    state_version: int
    repaired: bool
    turn_in_progress: bool
    def __init__(self, events: _Optional[_Iterable[_Union[_types_pb2.SessionEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., state_version: _Optional[int] = ..., repaired: _Optional[bool] = ..., turn_in_progress: _Optional[bool] = ...) -> None: ...

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
    ask: _enums_pb2.ResumeAsk
    primary: _enums_pb2.HostAction
    secondary: _enums_pb2.HostAction
    reason: str
    generation: int
    completion_id: str
    def __init__(self, ask: _Optional[_Union[_enums_pb2.ResumeAsk, str]] = ..., primary: _Optional[_Union[_enums_pb2.HostAction, str]] = ..., secondary: _Optional[_Union[_enums_pb2.HostAction, str]] = ..., reason: _Optional[str] = ..., generation: _Optional[int] = ..., completion_id: _Optional[str] = ...) -> None: ...
