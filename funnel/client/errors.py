"""The one exception a `funnel.client` call raises: a failed call's gRPC code
with what the service said about it in `google.rpc.ErrorInfo` (reason, domain,
metadata), so that a host matches `reason` by name instead of parsing text."""

from __future__ import annotations

from collections.abc import Mapping

import grpc

from funnel.runtime.grpc_errors import error_info, field_violations, retry_delay


class FunnelError(Exception):
    """A call that failed, after any retries the client made.

    `code` is the gRPC status code; `reason` the `ErrorReason` name the service
    sent (e.g. `LEASE_HELD`), or "" when the failure never reached a service
    (no connection, a deadline that ran out in the client); `domain` is
    `funnel.lifecycle.v1` or `funnel.completion.v1` (or ""); `metadata` holds
    the variable parts (`task_id`, points in time as RFC 3339, ...);
    `violations` the (field, description) pairs of a `BadRequest`;
    `retry_after` the seconds of a `RetryInfo`, if one came. `message` is the
    status message, meant for people."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        domain: str = "",
        metadata: Mapping[str, str] | None = None,
        violations: tuple[tuple[str, str], ...] = (),
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{reason} ({code.name}): {message}" if reason else f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.metadata: dict[str, str] = dict(metadata or {})
        self.violations = violations
        self.retry_after = retry_after

    @classmethod
    def from_rpc_error(cls, error: grpc.aio.AioRpcError) -> FunnelError:
        """The error of a failed call, with the details its status carries."""
        info = error_info(error)
        return cls(
            error.code(),
            error.details() or "",
            reason=info.reason if info is not None else "",
            domain=info.domain if info is not None else "",
            metadata=dict(info.metadata) if info is not None else None,
            violations=tuple(field_violations(error)),
            retry_after=retry_delay(error),
        )
