import datetime

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

class GenerationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GENERATION_STATE_UNSPECIFIED: _ClassVar[GenerationState]
    GENERATION_STATE_REGISTERED: _ClassVar[GenerationState]
    GENERATION_STATE_ACTIVE: _ClassVar[GenerationState]
    GENERATION_STATE_SUSPENDED: _ClassVar[GenerationState]
    GENERATION_STATE_TERMINAL: _ClassVar[GenerationState]

class TerminalOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TERMINAL_OUTCOME_UNSPECIFIED: _ClassVar[TerminalOutcome]
    TERMINAL_OUTCOME_COMPLETED: _ClassVar[TerminalOutcome]
    TERMINAL_OUTCOME_CANCELLED: _ClassVar[TerminalOutcome]
    TERMINAL_OUTCOME_FAILED: _ClassVar[TerminalOutcome]
    TERMINAL_OUTCOME_TIMED_OUT: _ClassVar[TerminalOutcome]

class CancellationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CANCELLATION_STATE_UNSPECIFIED: _ClassVar[CancellationState]
    CANCELLATION_STATE_NONE: _ClassVar[CancellationState]
    CANCELLATION_STATE_REQUESTED: _ClassVar[CancellationState]

class WorkStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORK_STATUS_UNSPECIFIED: _ClassVar[WorkStatus]
    WORK_STATUS_READY: _ClassVar[WorkStatus]
    WORK_STATUS_IN_PROGRESS: _ClassVar[WorkStatus]
    WORK_STATUS_BLOCKED: _ClassVar[WorkStatus]
    WORK_STATUS_DONE: _ClassVar[WorkStatus]
    WORK_STATUS_CANCELLED: _ClassVar[WorkStatus]

class TaskOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_ORDER_UNSPECIFIED: _ClassVar[TaskOrder]
    TASK_ORDER_TASK_ID: _ClassVar[TaskOrder]
    TASK_ORDER_LAST_CHANGE: _ClassVar[TaskOrder]

class ParentLinkMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PARENT_LINK_MODE_UNSPECIFIED: _ClassVar[ParentLinkMode]
    PARENT_LINK_MODE_ATTACHED: _ClassVar[ParentLinkMode]
    PARENT_LINK_MODE_DETACHED: _ClassVar[ParentLinkMode]

class Intent(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INTENT_UNSPECIFIED: _ClassVar[Intent]
    INTENT_REGISTER_TASK: _ClassVar[Intent]
    INTENT_ACTIVATE_GENERATION: _ClassVar[Intent]
    INTENT_SUSPEND_GENERATION: _ClassVar[Intent]
    INTENT_RESUME_WITH_GENERATION: _ClassVar[Intent]
    INTENT_REQUEST_CANCELLATION: _ClassVar[Intent]
    INTENT_SETTLE_CANCELLATION: _ClassVar[Intent]
    INTENT_SETTLE_COMPLETION: _ClassVar[Intent]
    INTENT_SETTLE_FAILURE: _ClassVar[Intent]
    INTENT_SETTLE_TIMEOUT: _ClassVar[Intent]
    INTENT_PROPAGATE_PARENT_TERMINATION: _ClassVar[Intent]
    INTENT_SET_WORK_STATUS: _ClassVar[Intent]

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    FIELD_REQUIRED: _ClassVar[ErrorReason]
    FIELD_MALFORMED: _ClassVar[ErrorReason]
    FIELD_TOO_LONG: _ClassVar[ErrorReason]
    ENUM_UNSPECIFIED: _ClassVar[ErrorReason]
    VALUE_OUT_OF_RANGE: _ClassVar[ErrorReason]
    REQUEST_ID_REUSED: _ClassVar[ErrorReason]
    WORK_STATUS_RESERVED: _ClassVar[ErrorReason]
    TASK_NOT_FOUND: _ClassVar[ErrorReason]
    PARENT_NOT_FOUND: _ClassVar[ErrorReason]
    TASK_ALREADY_EXISTS: _ClassVar[ErrorReason]
    REVISION_MISMATCH: _ClassVar[ErrorReason]
    STALE_GENERATION: _ClassVar[ErrorReason]
    FUTURE_GENERATION: _ClassVar[ErrorReason]
    GENERATION_TERMINAL: _ClassVar[ErrorReason]
    INVALID_TRANSITION: _ClassVar[ErrorReason]
    CANCELLATION_FENCED: _ClassVar[ErrorReason]
    CANCELLATION_NOT_REQUESTED: _ClassVar[ErrorReason]
    CANCELLATION_ALREADY_REQUESTED: _ClassVar[ErrorReason]
    ACTIVE_ATTACHED_CHILD: _ClassVar[ErrorReason]
    PARENT_GENERATION_MISMATCH: _ClassVar[ErrorReason]
    PARENT_NOT_ACTIVE: _ClassVar[ErrorReason]
    PARENT_CANCELLATION_FENCED: _ClassVar[ErrorReason]
    PARENT_TERMINAL: _ClassVar[ErrorReason]
    PARENT_NOT_TERMINAL: _ClassVar[ErrorReason]
    NOT_ATTACHED_CHILD: _ClassVar[ErrorReason]
    WATCH_OVERFLOW: _ClassVar[ErrorReason]
    STORAGE_UNAVAILABLE: _ClassVar[ErrorReason]
    DEADLINE_EXPIRED: _ClassVar[ErrorReason]
    INTERNAL_FAULT: _ClassVar[ErrorReason]
    CREDENTIALS_MISSING: _ClassVar[ErrorReason]
    CREDENTIALS_INVALID: _ClassVar[ErrorReason]
    CREDENTIALS_EXPIRED: _ClassVar[ErrorReason]
    WORKSPACE_NOT_GRANTED: _ClassVar[ErrorReason]
    ROLE_NOT_PERMITTED: _ClassVar[ErrorReason]
    RATE_LIMITED: _ClassVar[ErrorReason]
    MESSAGE_TOO_LARGE: _ClassVar[ErrorReason]
    WATCHERS_EXHAUSTED: _ClassVar[ErrorReason]
    SERVER_SHUTTING_DOWN: _ClassVar[ErrorReason]
GENERATION_STATE_UNSPECIFIED: GenerationState
GENERATION_STATE_REGISTERED: GenerationState
GENERATION_STATE_ACTIVE: GenerationState
GENERATION_STATE_SUSPENDED: GenerationState
GENERATION_STATE_TERMINAL: GenerationState
TERMINAL_OUTCOME_UNSPECIFIED: TerminalOutcome
TERMINAL_OUTCOME_COMPLETED: TerminalOutcome
TERMINAL_OUTCOME_CANCELLED: TerminalOutcome
TERMINAL_OUTCOME_FAILED: TerminalOutcome
TERMINAL_OUTCOME_TIMED_OUT: TerminalOutcome
CANCELLATION_STATE_UNSPECIFIED: CancellationState
CANCELLATION_STATE_NONE: CancellationState
CANCELLATION_STATE_REQUESTED: CancellationState
WORK_STATUS_UNSPECIFIED: WorkStatus
WORK_STATUS_READY: WorkStatus
WORK_STATUS_IN_PROGRESS: WorkStatus
WORK_STATUS_BLOCKED: WorkStatus
WORK_STATUS_DONE: WorkStatus
WORK_STATUS_CANCELLED: WorkStatus
TASK_ORDER_UNSPECIFIED: TaskOrder
TASK_ORDER_TASK_ID: TaskOrder
TASK_ORDER_LAST_CHANGE: TaskOrder
PARENT_LINK_MODE_UNSPECIFIED: ParentLinkMode
PARENT_LINK_MODE_ATTACHED: ParentLinkMode
PARENT_LINK_MODE_DETACHED: ParentLinkMode
INTENT_UNSPECIFIED: Intent
INTENT_REGISTER_TASK: Intent
INTENT_ACTIVATE_GENERATION: Intent
INTENT_SUSPEND_GENERATION: Intent
INTENT_RESUME_WITH_GENERATION: Intent
INTENT_REQUEST_CANCELLATION: Intent
INTENT_SETTLE_CANCELLATION: Intent
INTENT_SETTLE_COMPLETION: Intent
INTENT_SETTLE_FAILURE: Intent
INTENT_SETTLE_TIMEOUT: Intent
INTENT_PROPAGATE_PARENT_TERMINATION: Intent
INTENT_SET_WORK_STATUS: Intent
ERROR_REASON_UNSPECIFIED: ErrorReason
FIELD_REQUIRED: ErrorReason
FIELD_MALFORMED: ErrorReason
FIELD_TOO_LONG: ErrorReason
ENUM_UNSPECIFIED: ErrorReason
VALUE_OUT_OF_RANGE: ErrorReason
REQUEST_ID_REUSED: ErrorReason
WORK_STATUS_RESERVED: ErrorReason
TASK_NOT_FOUND: ErrorReason
PARENT_NOT_FOUND: ErrorReason
TASK_ALREADY_EXISTS: ErrorReason
REVISION_MISMATCH: ErrorReason
STALE_GENERATION: ErrorReason
FUTURE_GENERATION: ErrorReason
GENERATION_TERMINAL: ErrorReason
INVALID_TRANSITION: ErrorReason
CANCELLATION_FENCED: ErrorReason
CANCELLATION_NOT_REQUESTED: ErrorReason
CANCELLATION_ALREADY_REQUESTED: ErrorReason
ACTIVE_ATTACHED_CHILD: ErrorReason
PARENT_GENERATION_MISMATCH: ErrorReason
PARENT_NOT_ACTIVE: ErrorReason
PARENT_CANCELLATION_FENCED: ErrorReason
PARENT_TERMINAL: ErrorReason
PARENT_NOT_TERMINAL: ErrorReason
NOT_ATTACHED_CHILD: ErrorReason
WATCH_OVERFLOW: ErrorReason
STORAGE_UNAVAILABLE: ErrorReason
DEADLINE_EXPIRED: ErrorReason
INTERNAL_FAULT: ErrorReason
CREDENTIALS_MISSING: ErrorReason
CREDENTIALS_INVALID: ErrorReason
CREDENTIALS_EXPIRED: ErrorReason
WORKSPACE_NOT_GRANTED: ErrorReason
ROLE_NOT_PERMITTED: ErrorReason
RATE_LIMITED: ErrorReason
MESSAGE_TOO_LARGE: ErrorReason
WATCHERS_EXHAUSTED: ErrorReason
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
    mode: ParentLinkMode
    def __init__(self, task_id: _Optional[str] = ..., generation: _Optional[int] = ..., mode: _Optional[_Union[ParentLinkMode, str]] = ...) -> None: ...

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
    state: GenerationState
    outcome: TerminalOutcome
    cancellation: CancellationState
    cancellation_request_time: _timestamp_pb2.Timestamp
    work_status: WorkStatus
    parent: ParentLink
    completion_id: str
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., revision: _Optional[int] = ..., state: _Optional[_Union[GenerationState, str]] = ..., outcome: _Optional[_Union[TerminalOutcome, str]] = ..., cancellation: _Optional[_Union[CancellationState, str]] = ..., cancellation_request_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., work_status: _Optional[_Union[WorkStatus, str]] = ..., parent: _Optional[_Union[ParentLink, _Mapping]] = ..., completion_id: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

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
    intent: Intent
    from_state: GenerationState
    to_state: GenerationState
    outcome: TerminalOutcome
    cancellation: CancellationState
    cancellation_request_time: _timestamp_pb2.Timestamp
    work_status: WorkStatus
    cause: Cause
    completion_id: str
    authoritative_time: _timestamp_pb2.Timestamp
    commit_time: _timestamp_pb2.Timestamp
    request_id: str
    caller: Caller
    parent: ParentLink
    def __init__(self, sequence: _Optional[int] = ..., workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., revision: _Optional[int] = ..., intent: _Optional[_Union[Intent, str]] = ..., from_state: _Optional[_Union[GenerationState, str]] = ..., to_state: _Optional[_Union[GenerationState, str]] = ..., outcome: _Optional[_Union[TerminalOutcome, str]] = ..., cancellation: _Optional[_Union[CancellationState, str]] = ..., cancellation_request_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., work_status: _Optional[_Union[WorkStatus, str]] = ..., cause: _Optional[_Union[Cause, _Mapping]] = ..., completion_id: _Optional[str] = ..., authoritative_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., commit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., request_id: _Optional[str] = ..., caller: _Optional[_Union[Caller, _Mapping]] = ..., parent: _Optional[_Union[ParentLink, _Mapping]] = ...) -> None: ...

class RegisterTaskRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "request_id", "expected_revision", "cause", "parent")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    request_id: str
    expected_revision: int
    cause: Cause
    parent: ParentLink
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[Cause, _Mapping]] = ..., parent: _Optional[_Union[ParentLink, _Mapping]] = ...) -> None: ...

class RegisterTaskResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: Task
    event: LifecycleEvent
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., event: _Optional[_Union[LifecycleEvent, _Mapping]] = ...) -> None: ...

class ActivateGenerationRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation", "request_id", "expected_revision", "cause", "work_status")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    WORK_STATUS_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    request_id: str
    expected_revision: int
    cause: Cause
    work_status: WorkStatus
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[Cause, _Mapping]] = ..., work_status: _Optional[_Union[WorkStatus, str]] = ...) -> None: ...

class ActivateGenerationResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: Task
    event: LifecycleEvent
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., event: _Optional[_Union[LifecycleEvent, _Mapping]] = ...) -> None: ...

class SuspendGenerationRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation", "request_id", "expected_revision", "cause")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    request_id: str
    expected_revision: int
    cause: Cause
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[Cause, _Mapping]] = ...) -> None: ...

class SuspendGenerationResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: Task
    event: LifecycleEvent
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., event: _Optional[_Union[LifecycleEvent, _Mapping]] = ...) -> None: ...

class ResumeWithGenerationRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation", "request_id", "expected_revision", "cause", "on_behalf_of")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    ON_BEHALF_OF_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    request_id: str
    expected_revision: int
    cause: Cause
    on_behalf_of: Caller
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[Cause, _Mapping]] = ..., on_behalf_of: _Optional[_Union[Caller, _Mapping]] = ...) -> None: ...

class ResumeWithGenerationResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: Task
    event: LifecycleEvent
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., event: _Optional[_Union[LifecycleEvent, _Mapping]] = ...) -> None: ...

class RequestCancellationRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation", "request_id", "expected_revision", "cause")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    request_id: str
    expected_revision: int
    cause: Cause
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[Cause, _Mapping]] = ...) -> None: ...

class RequestCancellationResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: Task
    event: LifecycleEvent
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., event: _Optional[_Union[LifecycleEvent, _Mapping]] = ...) -> None: ...

class SettleCancellationRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation", "request_id", "expected_revision", "cause")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    request_id: str
    expected_revision: int
    cause: Cause
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[Cause, _Mapping]] = ...) -> None: ...

class SettleCancellationResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: Task
    event: LifecycleEvent
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., event: _Optional[_Union[LifecycleEvent, _Mapping]] = ...) -> None: ...

class SettleCompletionRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation", "request_id", "expected_revision", "cause", "completion_id", "authoritative_time")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_ID_FIELD_NUMBER: _ClassVar[int]
    AUTHORITATIVE_TIME_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    request_id: str
    expected_revision: int
    cause: Cause
    completion_id: str
    authoritative_time: _timestamp_pb2.Timestamp
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[Cause, _Mapping]] = ..., completion_id: _Optional[str] = ..., authoritative_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SettleCompletionResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: Task
    event: LifecycleEvent
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., event: _Optional[_Union[LifecycleEvent, _Mapping]] = ...) -> None: ...

class SettleCompletionsRequest(_message.Message):
    __slots__ = ("workspace_id", "items")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    items: _containers.RepeatedCompositeFieldContainer[SettleCompletionRequest]
    def __init__(self, workspace_id: _Optional[str] = ..., items: _Optional[_Iterable[_Union[SettleCompletionRequest, _Mapping]]] = ...) -> None: ...

class SettleCompletionsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SettleCompletionsResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SettleCompletionsResult, _Mapping]]] = ...) -> None: ...

class SettleCompletionsResult(_message.Message):
    __slots__ = ("settled", "error")
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    settled: SettleCompletionResponse
    error: _status_pb2.Status
    def __init__(self, settled: _Optional[_Union[SettleCompletionResponse, _Mapping]] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...

class SettleFailureRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation", "request_id", "expected_revision", "cause")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    request_id: str
    expected_revision: int
    cause: Cause
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[Cause, _Mapping]] = ...) -> None: ...

class SettleFailureResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: Task
    event: LifecycleEvent
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., event: _Optional[_Union[LifecycleEvent, _Mapping]] = ...) -> None: ...

class SettleTimeoutRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation", "request_id", "expected_revision", "cause")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    request_id: str
    expected_revision: int
    cause: Cause
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[Cause, _Mapping]] = ...) -> None: ...

class SettleTimeoutResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: Task
    event: LifecycleEvent
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., event: _Optional[_Union[LifecycleEvent, _Mapping]] = ...) -> None: ...

class PropagateParentTerminationRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation", "request_id", "expected_revision", "cause")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    request_id: str
    expected_revision: int
    cause: Cause
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[Cause, _Mapping]] = ...) -> None: ...

class PropagateParentTerminationResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: Task
    event: LifecycleEvent
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., event: _Optional[_Union[LifecycleEvent, _Mapping]] = ...) -> None: ...

class SetWorkStatusRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id", "generation", "request_id", "expected_revision", "cause", "work_status")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    WORK_STATUS_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    generation: int
    request_id: str
    expected_revision: int
    cause: Cause
    work_status: WorkStatus
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[Cause, _Mapping]] = ..., work_status: _Optional[_Union[WorkStatus, str]] = ...) -> None: ...

class SetWorkStatusResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: Task
    event: LifecycleEvent
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., event: _Optional[_Union[LifecycleEvent, _Mapping]] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("workspace_id", "task_id")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    task_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("task", "open_attached_child_task_ids")
    TASK_FIELD_NUMBER: _ClassVar[int]
    OPEN_ATTACHED_CHILD_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    task: Task
    open_attached_child_task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., open_attached_child_task_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("workspace_id", "page_size", "page_token", "parent_task_id", "state", "outcome", "work_status", "task_id_prefix", "order")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PARENT_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    WORK_STATUS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    page_size: int
    page_token: str
    parent_task_id: str
    state: GenerationState
    outcome: TerminalOutcome
    work_status: WorkStatus
    task_id_prefix: str
    order: TaskOrder
    def __init__(self, workspace_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., parent_task_id: _Optional[str] = ..., state: _Optional[_Union[GenerationState, str]] = ..., outcome: _Optional[_Union[TerminalOutcome, str]] = ..., work_status: _Optional[_Union[WorkStatus, str]] = ..., task_id_prefix: _Optional[str] = ..., order: _Optional[_Union[TaskOrder, str]] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_page_token")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    next_page_token: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CountTasksRequest(_message.Message):
    __slots__ = ("workspace_id",)
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    def __init__(self, workspace_id: _Optional[str] = ...) -> None: ...

class TaskCount(_message.Message):
    __slots__ = ("state", "outcome", "work_status", "tasks")
    STATE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    WORK_STATUS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    state: GenerationState
    outcome: TerminalOutcome
    work_status: WorkStatus
    tasks: int
    def __init__(self, state: _Optional[_Union[GenerationState, str]] = ..., outcome: _Optional[_Union[TerminalOutcome, str]] = ..., work_status: _Optional[_Union[WorkStatus, str]] = ..., tasks: _Optional[int] = ...) -> None: ...

class CountTasksResponse(_message.Message):
    __slots__ = ("counts", "total")
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    counts: _containers.RepeatedCompositeFieldContainer[TaskCount]
    total: int
    def __init__(self, counts: _Optional[_Iterable[_Union[TaskCount, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...

class ListLifecycleEventsRequest(_message.Message):
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

class ListLifecycleEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[LifecycleEvent]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[LifecycleEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchLifecycleEventsRequest(_message.Message):
    __slots__ = ("workspace_id", "after_sequence", "task_id", "from_head")
    WORKSPACE_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_HEAD_FIELD_NUMBER: _ClassVar[int]
    workspace_id: str
    after_sequence: int
    task_id: str
    from_head: bool
    def __init__(self, workspace_id: _Optional[str] = ..., after_sequence: _Optional[int] = ..., task_id: _Optional[str] = ..., from_head: _Optional[bool] = ...) -> None: ...

class WatchLifecycleEventsResponse(_message.Message):
    __slots__ = ("event", "head_sequence")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    HEAD_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    event: LifecycleEvent
    head_sequence: int
    def __init__(self, event: _Optional[_Union[LifecycleEvent, _Mapping]] = ..., head_sequence: _Optional[int] = ...) -> None: ...
