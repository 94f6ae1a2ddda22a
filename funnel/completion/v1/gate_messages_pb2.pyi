from funnel.completion.v1 import enums_pb2 as _enums_pb2
from funnel.completion.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
    outcome: _enums_pb2.RequestedOutcome
    result: str
    state_version: int
    checkpoint: str
    evidence: _containers.RepeatedCompositeFieldContainer[_types_pb2.Evidence]
    def __init__(self, gate_id: _Optional[str] = ..., workspace_id: _Optional[str] = ..., task_id: _Optional[str] = ..., generation: _Optional[int] = ..., run_id: _Optional[str] = ..., outcome: _Optional[_Union[_enums_pb2.RequestedOutcome, str]] = ..., result: _Optional[str] = ..., state_version: _Optional[int] = ..., checkpoint: _Optional[str] = ..., evidence: _Optional[_Iterable[_Union[_types_pb2.Evidence, _Mapping]]] = ...) -> None: ...

class EvaluateGateResponse(_message.Message):
    __slots__ = ("status", "reason")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    status: _enums_pb2.GateStatus
    reason: str
    def __init__(self, status: _Optional[_Union[_enums_pb2.GateStatus, str]] = ..., reason: _Optional[str] = ...) -> None: ...
