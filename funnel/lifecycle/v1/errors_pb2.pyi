from google.rpc import error_details_pb2 as _error_details_pb2
from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
