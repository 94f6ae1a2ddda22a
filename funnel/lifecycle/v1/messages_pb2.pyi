import datetime

from funnel.lifecycle.v1 import enums_pb2 as _enums_pb2
from funnel.lifecycle.v1 import types_pb2 as _types_pb2
from google.api import field_behavior_pb2 as _field_behavior_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
    cause: _types_pb2.Cause
    parent: _types_pb2.ParentLink
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[_types_pb2.Cause, _Mapping]] = ..., parent: _Optional[_Union[_types_pb2.ParentLink, _Mapping]] = ...) -> None: ...

class RegisterTaskResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    event: _types_pb2.LifecycleEvent
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ..., event: _Optional[_Union[_types_pb2.LifecycleEvent, _Mapping]] = ...) -> None: ...

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
    cause: _types_pb2.Cause
    work_status: _enums_pb2.WorkStatus
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[_types_pb2.Cause, _Mapping]] = ..., work_status: _Optional[_Union[_enums_pb2.WorkStatus, str]] = ...) -> None: ...

class ActivateGenerationResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    event: _types_pb2.LifecycleEvent
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ..., event: _Optional[_Union[_types_pb2.LifecycleEvent, _Mapping]] = ...) -> None: ...

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
    cause: _types_pb2.Cause
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[_types_pb2.Cause, _Mapping]] = ...) -> None: ...

class SuspendGenerationResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    event: _types_pb2.LifecycleEvent
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ..., event: _Optional[_Union[_types_pb2.LifecycleEvent, _Mapping]] = ...) -> None: ...

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
    cause: _types_pb2.Cause
    on_behalf_of: _types_pb2.Caller
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[_types_pb2.Cause, _Mapping]] = ..., on_behalf_of: _Optional[_Union[_types_pb2.Caller, _Mapping]] = ...) -> None: ...

class ResumeWithGenerationResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    event: _types_pb2.LifecycleEvent
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ..., event: _Optional[_Union[_types_pb2.LifecycleEvent, _Mapping]] = ...) -> None: ...

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
    cause: _types_pb2.Cause
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[_types_pb2.Cause, _Mapping]] = ...) -> None: ...

class RequestCancellationResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    event: _types_pb2.LifecycleEvent
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ..., event: _Optional[_Union[_types_pb2.LifecycleEvent, _Mapping]] = ...) -> None: ...

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
    cause: _types_pb2.Cause
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[_types_pb2.Cause, _Mapping]] = ...) -> None: ...

class SettleCancellationResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    event: _types_pb2.LifecycleEvent
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ..., event: _Optional[_Union[_types_pb2.LifecycleEvent, _Mapping]] = ...) -> None: ...

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
    cause: _types_pb2.Cause
    completion_id: str
    authoritative_time: _timestamp_pb2.Timestamp
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[_types_pb2.Cause, _Mapping]] = ..., completion_id: _Optional[str] = ..., authoritative_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SettleCompletionResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    event: _types_pb2.LifecycleEvent
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ..., event: _Optional[_Union[_types_pb2.LifecycleEvent, _Mapping]] = ...) -> None: ...

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
    cause: _types_pb2.Cause
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[_types_pb2.Cause, _Mapping]] = ...) -> None: ...

class SettleFailureResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    event: _types_pb2.LifecycleEvent
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ..., event: _Optional[_Union[_types_pb2.LifecycleEvent, _Mapping]] = ...) -> None: ...

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
    cause: _types_pb2.Cause
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[_types_pb2.Cause, _Mapping]] = ...) -> None: ...

class SettleTimeoutResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    event: _types_pb2.LifecycleEvent
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ..., event: _Optional[_Union[_types_pb2.LifecycleEvent, _Mapping]] = ...) -> None: ...

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
    cause: _types_pb2.Cause
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[_types_pb2.Cause, _Mapping]] = ...) -> None: ...

class PropagateParentTerminationResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    event: _types_pb2.LifecycleEvent
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ..., event: _Optional[_Union[_types_pb2.LifecycleEvent, _Mapping]] = ...) -> None: ...

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
    cause: _types_pb2.Cause
    work_status: _enums_pb2.WorkStatus
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ..., expected_revision: _Optional[int] = ..., cause: _Optional[_Union[_types_pb2.Cause, _Mapping]] = ..., work_status: _Optional[_Union[_enums_pb2.WorkStatus, str]] = ...) -> None: ...

class SetWorkStatusResponse(_message.Message):
    __slots__ = ("task", "event")
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    event: _types_pb2.LifecycleEvent
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ..., event: _Optional[_Union[_types_pb2.LifecycleEvent, _Mapping]] = ...) -> None: ...

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
    task: _types_pb2.Task
    open_attached_child_task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ..., open_attached_child_task_ids: _Optional[_Iterable[str]] = ...) -> None: ...

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
    state: _enums_pb2.GenerationState
    outcome: _enums_pb2.TerminalOutcome
    work_status: _enums_pb2.WorkStatus
    task_id_prefix: str
    order: _enums_pb2.TaskOrder
    def __init__(self, workspace_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., parent_task_id: _Optional[str] = ..., state: _Optional[_Union[_enums_pb2.GenerationState, str]] = ..., outcome: _Optional[_Union[_enums_pb2.TerminalOutcome, str]] = ..., work_status: _Optional[_Union[_enums_pb2.WorkStatus, str]] = ..., task_id_prefix: _Optional[str] = ..., order: _Optional[_Union[_enums_pb2.TaskOrder, str]] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_page_token")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_types_pb2.Task]
    next_page_token: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[_types_pb2.Task, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

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
    state: _enums_pb2.GenerationState
    outcome: _enums_pb2.TerminalOutcome
    work_status: _enums_pb2.WorkStatus
    tasks: int
    def __init__(self, state: _Optional[_Union[_enums_pb2.GenerationState, str]] = ..., outcome: _Optional[_Union[_enums_pb2.TerminalOutcome, str]] = ..., work_status: _Optional[_Union[_enums_pb2.WorkStatus, str]] = ..., tasks: _Optional[int] = ...) -> None: ...

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
    events: _containers.RepeatedCompositeFieldContainer[_types_pb2.LifecycleEvent]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[_types_pb2.LifecycleEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

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
    event: _types_pb2.LifecycleEvent
    head_sequence: int
    def __init__(self, event: _Optional[_Union[_types_pb2.LifecycleEvent, _Mapping]] = ..., head_sequence: _Optional[int] = ...) -> None: ...
