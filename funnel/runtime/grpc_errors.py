"""`Rejection`s as gRPC statuses: exactly one `google.rpc.ErrorInfo`, a
`google.rpc.BadRequest` for malformed input and a `google.rpc.RetryInfo` where
the caller should wait; and the client-side readers of those details."""

from __future__ import annotations

from typing import Any, cast

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from funnel.runtime.errors import Rejection

# A status travels in trailing metadata (grpc-message percent-encoded, the details
# base64-encoded), and gRPC clients refuse metadata above 8 KiB by default: a larger
# error would reach the caller as RESOURCE_EXHAUSTED "Stream removed", its reason
# lost. Errors echo caller input (field paths with map keys, up to 1000 events of a
# batch), so they are shrunk to fit: fewer field violations, shorter texts.
MAX_STATUS_BYTES = 6 * 1024
# (field violations kept, UTF-8 bytes per text), tried in order until the status fits.
_SHRINK_STEPS = ((None, None), (20, 512), (10, 256), (5, 128), (1, 64), (0, 32))


def to_status(rejection: Rejection, domain: str) -> grpc.Status:
    return rpc_status.to_status(status_message(rejection, domain))


def status_message(rejection: Rejection, domain: str) -> status_pb2.Status:
    """The rejection as the `google.rpc.Status` a failed call carries (shrunk to
    fit a trailer), also what a batch answers for an item it refused."""
    for max_violations, max_bytes in _SHRINK_STEPS:
        status = _status(rejection, domain, max_violations, max_bytes)
        if _encoded_size(status) <= MAX_STATUS_BYTES:
            break
    return status


def _status(rejection: Rejection, domain: str, max_violations: int | None, max_bytes: int | None) -> status_pb2.Status:
    cut = (lambda text: text) if max_bytes is None else (lambda text: _truncate(text, max_bytes))
    info = error_details_pb2.ErrorInfo(
        reason=rejection.reason.name, domain=domain, metadata={k: cut(v) for k, v in rejection.metadata.items()}
    )
    details = [_pack(info)]
    # The message of a rejection with several violations says how many there are.
    violations = rejection.violations[:max_violations] if max_violations is not None else rejection.violations
    if violations:
        details.append(
            _pack(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(field=cut(v.field), description=cut(v.description))
                        for v in violations
                    ]
                )
            )
        )
    if rejection.retry_after_seconds is not None:
        delay = duration_pb2.Duration()
        delay.FromMicroseconds(max(1, int(rejection.retry_after_seconds * 1_000_000)))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    message = rejection.message if max_bytes is None else _truncate(rejection.message, max_bytes * 2)
    return status_pb2.Status(code=getattr(code_pb2, rejection.code.name), message=message, details=details)


def _encoded_size(status: status_pb2.Status) -> int:
    """Bytes the status takes on the wire: grpc-message percent-encodes all but
    printable ASCII; grpc-status-details-bin is base64."""
    message = status.message.encode("utf-8")
    percent_encoded = sum(1 if 0x20 <= b <= 0x7E and b != 0x25 else 3 for b in message)
    return percent_encoded + (status.ByteSize() + 2) // 3 * 4


def _truncate(text: str, max_bytes: int) -> str:
    encoded = text.encode("utf-8")
    if len(encoded) <= max_bytes:
        return text
    return encoded[: max(max_bytes - 3, 0)].decode("utf-8", errors="ignore") + "..."


def _pack(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _status_of(error: grpc.RpcError) -> status_pb2.Status | None:
    # The errors gRPC raises for a failed call (_InactiveRpcError, aio's
    # AioRpcError) carry its code, details and trailing metadata, which is all
    # from_call reads; the stubs type grpc.RpcError as no grpc.Call, though.
    # from_call is unannotated in the stubs; it returns the decoded
    # grpc-status-details-bin trailer, or None when the call sent none.
    return cast("status_pb2.Status | None", rpc_status.from_call(error))  # type: ignore[arg-type]


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo of a failed call, if it carries one (client side)."""
    status = _status_of(error)
    return None if status is None else status_error_info(status)


def status_error_info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo among a status's details (a failed call's, a batch item's)."""
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):  # False: a detail of another type
            return info
    return None


def field_violations(error: grpc.RpcError) -> list[tuple[str, str]]:
    status = _status_of(error)
    found: list[tuple[str, str]] = []
    for detail in status.details if status else ():
        request = error_details_pb2.BadRequest()
        if detail.Unpack(request):
            found += [(v.field, v.description) for v in request.field_violations]
    return found


def retry_delay(error: grpc.RpcError) -> float | None:
    """Seconds the server's RetryInfo asks the caller to wait, if it sent one."""
    status = _status_of(error)
    for detail in status.details if status else ():
        retry = error_details_pb2.RetryInfo()
        if detail.Unpack(retry):
            return retry.retry_delay.ToMicroseconds() / 1_000_000
    return None
