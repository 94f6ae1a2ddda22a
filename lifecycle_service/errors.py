"""The lifecycle service's catalogue of error reasons (mirrors `ErrorReason` in
protos/funnel/lifecycle/v1/errors.proto; a test keeps the two equal)."""

from __future__ import annotations

import enum

from funnel.runtime.errors import Code, ReasonSpec

# ErrorInfo.domain (AIP-193): the name of the API whose ErrorReason catalogue the
# reason belongs to.
DOMAIN = "funnel.lifecycle.v1"


class Reason(enum.Enum):
    FIELD_REQUIRED = ReasonSpec(Code.INVALID_ARGUMENT, "a required field is empty")
    FIELD_MALFORMED = ReasonSpec(Code.INVALID_ARGUMENT, "a field does not have the documented form")
    FIELD_TOO_LONG = ReasonSpec(Code.INVALID_ARGUMENT, "a text field is longer than allowed")
    ENUM_UNSPECIFIED = ReasonSpec(Code.INVALID_ARGUMENT, "an enum field is unspecified or unknown")
    VALUE_OUT_OF_RANGE = ReasonSpec(Code.INVALID_ARGUMENT, "a number is outside its range")
    REQUEST_ID_REUSED = ReasonSpec(Code.INVALID_ARGUMENT, "request_id was used for a different request")
    WORK_STATUS_RESERVED = ReasonSpec(Code.INVALID_ARGUMENT, "DONE and CANCELLED are reached only by settlements")
    TASK_NOT_FOUND = ReasonSpec(Code.NOT_FOUND, "no such task in this workspace")
    PARENT_NOT_FOUND = ReasonSpec(Code.NOT_FOUND, "no such parent task in this workspace")
    TASK_ALREADY_EXISTS = ReasonSpec(Code.ALREADY_EXISTS, "the task is already registered")
    REVISION_MISMATCH = ReasonSpec(Code.ABORTED, "expected_revision differs; re-read and retry")
    STALE_GENERATION = ReasonSpec(Code.FAILED_PRECONDITION, "the generation is older than the current one")
    FUTURE_GENERATION = ReasonSpec(Code.FAILED_PRECONDITION, "the generation does not exist yet")
    GENERATION_TERMINAL = ReasonSpec(Code.FAILED_PRECONDITION, "the generation is terminal")
    INVALID_TRANSITION = ReasonSpec(Code.FAILED_PRECONDITION, "the generation's state does not allow this intent")
    CANCELLATION_FENCED = ReasonSpec(Code.FAILED_PRECONDITION, "the cancellation fence forbids this intent")
    CANCELLATION_NOT_REQUESTED = ReasonSpec(Code.FAILED_PRECONDITION, "no cancellation request is recorded")
    CANCELLATION_ALREADY_REQUESTED = ReasonSpec(Code.FAILED_PRECONDITION, "the cancellation fence is already committed")
    ACTIVE_ATTACHED_CHILD = ReasonSpec(Code.FAILED_PRECONDITION, "an attached child is not terminal")
    PARENT_GENERATION_MISMATCH = ReasonSpec(Code.FAILED_PRECONDITION, "the parent's current generation differs")
    PARENT_NOT_ACTIVE = ReasonSpec(Code.FAILED_PRECONDITION, "the attached parent generation is not active")
    PARENT_CANCELLATION_FENCED = ReasonSpec(Code.FAILED_PRECONDITION, "the attached parent generation is fenced")
    PARENT_TERMINAL = ReasonSpec(Code.FAILED_PRECONDITION, "the attached parent generation is terminal")
    PARENT_NOT_TERMINAL = ReasonSpec(Code.FAILED_PRECONDITION, "the parent generation is not terminal")
    NOT_ATTACHED_CHILD = ReasonSpec(Code.FAILED_PRECONDITION, "the task has no attached parent")
    WATCH_OVERFLOW = ReasonSpec(Code.RESOURCE_EXHAUSTED, "the watcher fell behind its buffer; resume from the cursor")
    STORAGE_UNAVAILABLE = ReasonSpec(Code.UNAVAILABLE, "the database is unavailable; nothing was applied")
    DEADLINE_EXPIRED = ReasonSpec(Code.DEADLINE_EXCEEDED, "the caller's deadline expired before applying")
    INTERNAL_FAULT = ReasonSpec(Code.INTERNAL, "an unexpected fault")
    CREDENTIALS_MISSING = ReasonSpec(Code.UNAUTHENTICATED, "no bearer token (and no client certificate identity)")
    CREDENTIALS_INVALID = ReasonSpec(
        Code.UNAUTHENTICATED, "the token is malformed, badly signed, or not for this issuer and audience"
    )
    CREDENTIALS_EXPIRED = ReasonSpec(Code.UNAUTHENTICATED, "the token has expired")
    WORKSPACE_NOT_GRANTED = ReasonSpec(
        Code.PERMISSION_DENIED, "the credential grants no role in the request's workspace"
    )
    ROLE_NOT_PERMITTED = ReasonSpec(
        Code.PERMISSION_DENIED, "the caller's roles in the workspace do not permit this RPC"
    )
    RATE_LIMITED = ReasonSpec(
        Code.RESOURCE_EXHAUSTED, "the caller exceeded its request rate; retry after RetryInfo's delay"
    )
    MESSAGE_TOO_LARGE = ReasonSpec(Code.RESOURCE_EXHAUSTED, "the request is larger than the service accepts")
    WATCHERS_EXHAUSTED = ReasonSpec(Code.RESOURCE_EXHAUSTED, "too many open watch streams for the caller or workspace")
    SERVER_SHUTTING_DOWN = ReasonSpec(
        Code.UNAVAILABLE, "the server is stopping; watch again from the last sequence received"
    )
