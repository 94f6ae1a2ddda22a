"""The completion service's catalogue of error reasons (mirrors `ErrorReason` in
protos/funnel/completion/v1/errors.proto; a test keeps the two equal)."""

from __future__ import annotations

import enum

from funnel.runtime.errors import Code, ReasonSpec

# ErrorInfo.domain (AIP-193): the name of the API whose ErrorReason catalogue the
# reason belongs to (CompletionService and TranscriptService share it).
DOMAIN = "funnel.completion.v1"


class Reason(enum.Enum):
    FIELD_REQUIRED = ReasonSpec(Code.INVALID_ARGUMENT, "a required field is empty")
    FIELD_MALFORMED = ReasonSpec(Code.INVALID_ARGUMENT, "a field does not have the documented form")
    FIELD_TOO_LONG = ReasonSpec(Code.INVALID_ARGUMENT, "a text field is too long")
    ENUM_UNSPECIFIED = ReasonSpec(Code.INVALID_ARGUMENT, "an enum field is unspecified or unknown")
    VALUE_OUT_OF_RANGE = ReasonSpec(Code.INVALID_ARGUMENT, "a number or duration is out of range")
    REQUEST_ID_REUSED = ReasonSpec(Code.INVALID_ARGUMENT, "request_id was used for a different request")
    RUN_NOT_FOUND = ReasonSpec(Code.NOT_FOUND, "no such run in this workspace")
    TASK_NOT_FOUND = ReasonSpec(Code.NOT_FOUND, "no such task in this workspace")
    COMPLETION_NOT_FOUND = ReasonSpec(Code.NOT_FOUND, "no completion for that task generation")
    LEASE_HELD = ReasonSpec(Code.FAILED_PRECONDITION, "another open run holds a live lease")
    RUN_ALREADY_FINISHED = ReasonSpec(Code.FAILED_PRECONDITION, "the run was already closed")
    LEASE_NOT_CURRENT = ReasonSpec(Code.FAILED_PRECONDITION, "a newer claim superseded the lease")
    LEASE_EXPIRED = ReasonSpec(Code.FAILED_PRECONDITION, "the lease expired")
    GENERATION_TERMINAL = ReasonSpec(Code.FAILED_PRECONDITION, "the task's generation is terminal")
    CANCELLATION_REQUESTED = ReasonSpec(Code.FAILED_PRECONDITION, "the task's generation has a cancellation request")
    COMPLETION_CONFLICT = ReasonSpec(Code.FAILED_PRECONDITION, "a completion with another outcome exists")
    COMPLETION_CORRUPTED = ReasonSpec(Code.DATA_LOSS, "stored completion has this identity but another payload")
    SNAPSHOT_CHANGED = ReasonSpec(Code.ABORTED, "the lease or state version changed before commit")
    LIFECYCLE_REJECTED = ReasonSpec(Code.FAILED_PRECONDITION, "the lifecycle service rejected a needed intent")
    LIFECYCLE_UNAVAILABLE = ReasonSpec(Code.UNAVAILABLE, "the lifecycle service did not answer in time")
    WATCH_OVERFLOW = ReasonSpec(Code.RESOURCE_EXHAUSTED, "the watcher fell behind its buffer")
    STORAGE_UNAVAILABLE = ReasonSpec(Code.UNAVAILABLE, "the database is unavailable; nothing was applied")
    DEADLINE_EXPIRED = ReasonSpec(Code.DEADLINE_EXCEEDED, "the caller's deadline expired before applying")
    INTERNAL_FAULT = ReasonSpec(Code.INTERNAL, "an unexpected fault")
    STATE_VERSION_MISMATCH = ReasonSpec(Code.ABORTED, "expected_state_version is stale; reload and retry")
    TRANSCRIPT_GRAMMAR_VIOLATION = ReasonSpec(Code.FAILED_PRECONDITION, "the events break the transcript grammar")
    TRANSCRIPT_NOT_EMPTY = ReasonSpec(Code.FAILED_PRECONDITION, "imports need an empty transcript")
    TRANSCRIPT_LINE_INVALID = ReasonSpec(Code.INVALID_ARGUMENT, "a JSONL line is not a valid event")
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
    RUN_NOT_HELD = ReasonSpec(Code.PERMISSION_DENIED, "an agent acted on a run (or task lease) it does not hold")
    AGENT_ID_MISMATCH = ReasonSpec(Code.PERMISSION_DENIED, "an agent may claim only under its own subject as agent_id")
    IMPORT_BUFFER_EXHAUSTED = ReasonSpec(Code.RESOURCE_EXHAUSTED, "the imports in flight hold all the import buffer")
    STREAM_IDLE = ReasonSpec(Code.DEADLINE_EXCEEDED, "the client stream sent nothing for too long")
    SERVER_SHUTTING_DOWN = ReasonSpec(
        Code.UNAVAILABLE, "the server is stopping; watch again from the cursor, or import the whole file again"
    )
