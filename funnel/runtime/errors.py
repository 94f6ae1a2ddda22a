"""The error model of docs/specification.md §2.2, free of gRPC so the pure cores can use it.

Each service has one catalogue: an Enum whose members are `ReasonSpec` values.
A member's name is the wire `ErrorInfo.reason`; its `code` is the canonical code.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast


class Code(enum.Enum):
    """The canonical codes this project uses (names equal `grpc.StatusCode` names)."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    ABORTED = "ABORTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    UNAVAILABLE = "UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    DATA_LOSS = "DATA_LOSS"
    INTERNAL = "INTERNAL"


@dataclass(frozen=True)
class ReasonSpec:
    code: Code
    summary: str


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


@dataclass(frozen=True)
class Rejection:
    """A typed refusal: the reason (a catalogue member), a message and its variable parts."""

    reason: enum.Enum
    message: str
    metadata: Mapping[str, str] = field(default_factory=dict)
    violations: tuple[FieldViolation, ...] = ()
    # Sent as google.rpc.RetryInfo: when the caller may try again.
    retry_after_seconds: float | None = None

    @property
    def code(self) -> Code:
        # Enum.value is Any to mypy; every catalogue's members are ReasonSpec values (see above).
        return cast(ReasonSpec, self.reason.value).code


class ServiceError(Exception):
    """Raised by a service shell to end an RPC with a business error."""

    def __init__(self, rejection: Rejection):
        super().__init__(f"{rejection.reason.name}: {rejection.message}")
        self.rejection = rejection


def reject(reason: enum.Enum, message: str, **metadata: object) -> Rejection:
    return Rejection(reason, message, {k: str(v) for k, v in metadata.items() if v is not None})


def storage_unavailable(catalogue: type[enum.Enum], problem: Exception) -> Rejection:
    """What a write that the database could not take answers (its STORAGE_UNAVAILABLE)."""
    return Rejection(
        catalogue["STORAGE_UNAVAILABLE"],
        f"the database is unavailable ({problem}); nothing was applied, retry with the same request_id",
    )


def instant(micros: int) -> str:
    """A point in time as ErrorInfo metadata: RFC 3339 in UTC with microseconds,
    like the JSON form of google.protobuf.Timestamp (`2026-11-30T08:15:00.123456Z`)."""
    moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=micros)
    # isoformat, not strftime: %Y does not pad years below 1000 to four digits.
    return moment.isoformat(timespec="microseconds") + "Z"
