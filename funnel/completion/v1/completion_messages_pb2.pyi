import datetime

from funnel.completion.v1 import enums_pb2 as _enums_pb2
from funnel.completion.v1 import types_pb2 as _types_pb2
from google.api import field_behavior_pb2 as _field_behavior_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
    run: _types_pb2.Run
    lease: _types_pb2.Lease
    def __init__(self, run: _Optional[_Union[_types_pb2.Run, _Mapping]] = ..., lease: _Optional[_Union[_types_pb2.Lease, _Mapping]] = ...) -> None: ...

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
    lease: _types_pb2.Lease
    def __init__(self, lease: _Optional[_Union[_types_pb2.Lease, _Mapping]] = ...) -> None: ...

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
    outcome: _enums_pb2.RunOutcome
    tokens_input: int
    tokens_output: int
    tokens_total: int
    notes: str
    error: str
    final_status: _enums_pb2.FinalStatus
    request_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., run_id: _Optional[str] = ..., outcome: _Optional[_Union[_enums_pb2.RunOutcome, str]] = ..., tokens_input: _Optional[int] = ..., tokens_output: _Optional[int] = ..., tokens_total: _Optional[int] = ..., notes: _Optional[str] = ..., error: _Optional[str] = ..., final_status: _Optional[_Union[_enums_pb2.FinalStatus, str]] = ..., request_id: _Optional[str] = ...) -> None: ...

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
    final_status: _enums_pb2.FinalStatus
    tokens_total: int
    notes_truncated: bool
    decision: _types_pb2.Decision
    completion: _types_pb2.Completion
    task_effect: _enums_pb2.TaskEffect
    task_effect_reason: str
    def __init__(self, run_id: _Optional[str] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., final_status: _Optional[_Union[_enums_pb2.FinalStatus, str]] = ..., tokens_total: _Optional[int] = ..., notes_truncated: _Optional[bool] = ..., decision: _Optional[_Union[_types_pb2.Decision, _Mapping]] = ..., completion: _Optional[_Union[_types_pb2.Completion, _Mapping]] = ..., task_effect: _Optional[_Union[_enums_pb2.TaskEffect, str]] = ..., task_effect_reason: _Optional[str] = ...) -> None: ...

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
    run: _types_pb2.Run
    def __init__(self, run: _Optional[_Union[_types_pb2.Run, _Mapping]] = ...) -> None: ...

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
    runs: _containers.RepeatedCompositeFieldContainer[_types_pb2.Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[_types_pb2.Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

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
    verdict: _enums_pb2.EvidenceVerdict
    checkpoint: str
    details: str
    run_id: str
    request_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., kind: _Optional[str] = ..., verdict: _Optional[_Union[_enums_pb2.EvidenceVerdict, str]] = ..., checkpoint: _Optional[str] = ..., details: _Optional[str] = ..., run_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class RecordEvidenceResponse(_message.Message):
    __slots__ = ("evidence",)
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    evidence: _types_pb2.Evidence
    def __init__(self, evidence: _Optional[_Union[_types_pb2.Evidence, _Mapping]] = ...) -> None: ...

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
    evidence: _containers.RepeatedCompositeFieldContainer[_types_pb2.Evidence]
    next_page_token: str
    def __init__(self, evidence: _Optional[_Iterable[_Union[_types_pb2.Evidence, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

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
    outcome: _enums_pb2.RequestedOutcome
    result: str
    state_version: int
    request_id: str
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., run_id: _Optional[str] = ..., epoch: _Optional[int] = ..., outcome: _Optional[_Union[_enums_pb2.RequestedOutcome, str]] = ..., result: _Optional[str] = ..., state_version: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class AttemptCompletionResponse(_message.Message):
    __slots__ = ("decision", "completion", "existing_completion")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    EXISTING_COMPLETION_FIELD_NUMBER: _ClassVar[int]
    decision: _types_pb2.Decision
    completion: _types_pb2.Completion
    existing_completion: bool
    def __init__(self, decision: _Optional[_Union[_types_pb2.Decision, _Mapping]] = ..., completion: _Optional[_Union[_types_pb2.Completion, _Mapping]] = ..., existing_completion: _Optional[bool] = ...) -> None: ...

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
    completion: _types_pb2.Completion
    def __init__(self, completion: _Optional[_Union[_types_pb2.Completion, _Mapping]] = ...) -> None: ...

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
    settlement: _enums_pb2.SettlementStatus
    def __init__(self, workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., settlement: _Optional[_Union[_enums_pb2.SettlementStatus, str]] = ...) -> None: ...

class ListCompletionsResponse(_message.Message):
    __slots__ = ("completions", "next_page_token")
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[_types_pb2.Completion]
    next_page_token: str
    def __init__(self, completions: _Optional[_Iterable[_Union[_types_pb2.Completion, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

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
    entries: _containers.RepeatedCompositeFieldContainer[_types_pb2.AuditEntry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[_types_pb2.AuditEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

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
    events: _containers.RepeatedCompositeFieldContainer[_types_pb2.CompletionEvent]
    has_more: bool
    def __init__(self, events: _Optional[_Iterable[_Union[_types_pb2.CompletionEvent, _Mapping]]] = ..., has_more: _Optional[bool] = ...) -> None: ...

class WatchCompletionEventsResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: _types_pb2.CompletionEvent
    def __init__(self, event: _Optional[_Union[_types_pb2.CompletionEvent, _Mapping]] = ...) -> None: ...
