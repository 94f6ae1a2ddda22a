import datetime

from funnel.lifecycle.v1 import enums_pb2 as _enums_pb2
from google.api import field_behavior_pb2 as _field_behavior_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Caller(_message.Message):
    __slots__ = ("subject", "role")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    subject: str
    role: str
    def __init__(self, subject: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class Cause(_message.Message):
    __slots__ = ("source", "reason", "originating_ids")
    class OriginatingIdsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ORIGINATING_IDS_FIELD_NUMBER: _ClassVar[int]
    source: str
    reason: str
    originating_ids: _containers.ScalarMap[str, str]
    def __init__(self, source: _Optional[str] = ..., reason: _Optional[str] = ..., originating_ids: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ParentLink(_message.Message):
    __slots__ = ("task_id", "generation", "mode")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    generation: int
    mode: _enums_pb2.ParentLinkMode
    def __init__(self, task_id: _Optional[str] = ..., generation: _Optional[int] = ..., mode: _Optional[_Union[_enums_pb2.ParentLinkMode, str]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation", "revision", "state", "outcome", "cancellation", "cancellation_request_time", "work_status", "parent", "completion_id", "create_time", "update_time")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CANCELLATION_FIELD_NUMBER: _ClassVar[int]
    CANCELLATION_REQUEST_TIME_FIELD_NUMBER: _ClassVar[int]
    WORK_STATUS_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    revision: int
    state: _enums_pb2.GenerationState
    outcome: _enums_pb2.TerminalOutcome
    cancellation: _enums_pb2.CancellationState
    cancellation_request_time: _timestamp_pb2.Timestamp
    work_status: _enums_pb2.WorkStatus
    parent: ParentLink
    completion_id: str
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., revision: _Optional[int] = ..., state: _Optional[_Union[_enums_pb2.GenerationState, str]] = ..., outcome: _Optional[_Union[_enums_pb2.TerminalOutcome, str]] = ..., cancellation: _Optional[_Union[_enums_pb2.CancellationState, str]] = ..., cancellation_request_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., work_status: _Optional[_Union[_enums_pb2.WorkStatus, str]] = ..., parent: _Optional[_Union[ParentLink, _Mapping]] = ..., completion_id: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class LifecycleEvent(_message.Message):
    __slots__ = ("sequence", "workspace_id", "task_id", "generation", "revision", "intent", "from_state", "to_state", "outcome", "cancellation", "cancellation_request_time", "work_status", "cause", "completion_id", "authoritative_time", "commit_time", "request_id", "caller", "parent")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CANCELLATION_FIELD_NUMBER: _ClassVar[int]
    CANCELLATION_REQUEST_TIME_FIELD_NUMBER: _ClassVar[int]
    WORK_STATUS_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_ID_FIELD_NUMBER: _ClassVar[int]
    AUTHORITATIVE_TIME_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    workspace_id: str
    task_id: str
    generation: int
    revision: int
    intent: _enums_pb2.Intent
    from_state: _enums_pb2.GenerationState
    to_state: _enums_pb2.GenerationState
    outcome: _enums_pb2.TerminalOutcome
    cancellation: _enums_pb2.CancellationState
    cancellation_request_time: _timestamp_pb2.Timestamp
    work_status: _enums_pb2.WorkStatus
    cause: Cause
    completion_id: str
    authoritative_time: _timestamp_pb2.Timestamp
    commit_time: _timestamp_pb2.Timestamp
    request_id: str
    caller: Caller
    parent: ParentLink
    def __init__(self, sequence: _Optional[int] = ..., workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., revision: _Optional[int] = ..., intent: _Optional[_Union[_enums_pb2.Intent, str]] = ..., from_state: _Optional[_Union[_enums_pb2.GenerationState, str]] = ..., to_state: _Optional[_Union[_enums_pb2.GenerationState, str]] = ..., outcome: _Optional[_Union[_enums_pb2.TerminalOutcome, str]] = ..., cancellation: _Optional[_Union[_enums_pb2.CancellationState, str]] = ..., cancellation_request_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., work_status: _Optional[_Union[_enums_pb2.WorkStatus, str]] = ..., cause: _Optional[_Union[Cause, _Mapping]] = ..., completion_id: _Optional[str] = ..., authoritative_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., commit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., request_id: _Optional[str] = ..., caller: _Optional[_Union[Caller, _Mapping]] = ..., parent: _Optional[_Union[ParentLink, _Mapping]] = ...) -> None: ...
