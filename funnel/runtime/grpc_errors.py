"""Turns `Rejection`s into gRPC statuses with one `google.rpc.ErrorInfo`, and makes
sure nothing else leaves a server: storage faults become `UNAVAILABLE`, anything
unexpected becomes `INTERNAL` with a generic message (the stack stays in the log)."""

from __future__ import annotations

import enum
import logging
from typing import Any, Callable

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from funnel.runtime.errors import Code, Rejection, ServiceError
from funnel.runtime.faults import DroppedReply
from funnel.runtime.storage_errors import StorageUnavailable

log = logging.getLogger(__name__)


def grpc_code(code: Code) -> grpc.StatusCode:
    return grpc.StatusCode[code.name]


# A status travels in trailing metadata (grpc-message percent-encoded, the details
# base64-encoded), and gRPC clients refuse metadata above 8 KiB by default: a larger
# error would reach the caller as RESOURCE_EXHAUSTED "Stream removed", its reason
# lost. Errors echo caller input (field paths with map keys, up to 1000 events of a
# batch), so they are shrunk to fit: fewer field violations, shorter texts.
MAX_STATUS_BYTES = 6 * 1024
# (field violations kept, UTF-8 bytes per text), tried in order until the status fits.
_SHRINK_STEPS = ((None, None), (20, 512), (10, 256), (5, 128), (1, 64), (0, 32))


def to_status(rejection: Rejection, domain: str) -> grpc.Status:
    for max_violations, max_bytes in _SHRINK_STEPS:
        status = _status(rejection, domain, max_violations, max_bytes)
        if _encoded_size(status) <= MAX_STATUS_BYTES:
            break
    return rpc_status.to_status(status)


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


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo of a failed call, if it carries one (client side)."""
    status = rpc_status.from_call(error)
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None


def field_violations(error: grpc.RpcError) -> list[tuple[str, str]]:
    status = rpc_status.from_call(error)
    found: list[tuple[str, str]] = []
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            request = error_details_pb2.BadRequest()
            detail.Unpack(request)
            found += [(v.field, v.description) for v in request.field_violations]
    return found


class ErrorTranslation(grpc.aio.ServerInterceptor):
    """Applies the error model to every handler of the services under `method_prefix`."""

    def __init__(self, domain: str, catalogue: type[enum.Enum], method_prefix: str) -> None:
        self._domain = domain
        self._internal = catalogue["INTERNAL_FAULT"]
        self._storage = catalogue["STORAGE_UNAVAILABLE"]
        self._catalogue = catalogue
        self._prefix = method_prefix

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self._prefix):
            return handler
        method = details.method
        deserializer = _tolerant(handler.request_deserializer)
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    if isinstance(request, _Undecodable):
                        raise ServiceError(self._undecodable(request))
                    return await inner(request, context)
                except Exception as exc:  # noqa: BLE001 - translated, never leaked
                    await self._abort(context, method, exc)

            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=deserializer, response_serializer=handler.response_serializer
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    if isinstance(request, _Undecodable):
                        raise ServiceError(self._undecodable(request))
                    async for item in inner_stream(request, context):
                        yield item
                except Exception as exc:  # noqa: BLE001 - translated, never leaked
                    await self._abort(context, method, exc)

            return grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=deserializer, response_serializer=handler.response_serializer
            )
        if handler.stream_unary is not None:
            inner_upload = handler.stream_unary

            async def upload(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
                async def checked() -> Any:
                    async for request in request_iterator:
                        if isinstance(request, _Undecodable):
                            raise ServiceError(self._undecodable(request))
                        yield request

                try:
                    return await inner_upload(checked(), context)
                except Exception as exc:  # noqa: BLE001 - translated, never leaked
                    await self._abort(context, method, exc)

            return grpc.stream_unary_rpc_method_handler(
                upload, request_deserializer=deserializer, response_serializer=handler.response_serializer
            )
        return handler

    def _undecodable(self, request: "_Undecodable") -> Rejection:
        # Without this, grpc answers an unparsable request with UNKNOWN and the parser's text.
        return Rejection(self._catalogue["FIELD_MALFORMED"], f"the request could not be decoded: {request.problem}")

    async def _abort(self, context: grpc.aio.ServicerContext, method: str, exc: Exception) -> None:
        if isinstance(exc, grpc.aio.AbortError):
            raise exc
        if isinstance(exc, DroppedReply):
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"reply dropped by fault injection at {exc}")
        if isinstance(exc, ServiceError):
            rejection = exc.rejection
        elif isinstance(exc, StorageUnavailable):
            log.warning("%s: storage unavailable: %s", method, exc)
            rejection = Rejection(self._storage, "the database is unavailable; nothing was applied, retry with the same request_id")
        else:
            log.exception("%s: unexpected fault", method)
            rejection = Rejection(self._internal, "internal fault; see the server log")
        await context.abort_with_status(to_status(rejection, self._domain))


class _Undecodable:
    """Stands in for a request whose bytes are not a valid message."""

    def __init__(self, problem: str) -> None:
        self.problem = problem


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # noqa: BLE001 - reported to the caller as INVALID_ARGUMENT
            return _Undecodable(type(exc).__name__)

    return deserialize
