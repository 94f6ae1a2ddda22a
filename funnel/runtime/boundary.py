"""The server boundary every RPC of both services passes, before and after its
handler runs:

1. a request that cannot be decoded, or is larger than the service's message
   limit, is refused with `ErrorInfo` (gRPC itself would answer without one);
2. the caller is authenticated: a client certificate naming the completion
   service's identity, or a bearer JWT (`UNAUTHENTICATED` otherwise);
3. the caller's request rate is limited (`RESOURCE_EXHAUSTED` with `RetryInfo`);
4. the request's `workspace_id` and the RPC are checked against the caller's
   grants and the authorization table (`PERMISSION_DENIED`), before anything
   is read, so a foreign workspace's contents never leak;
5. the handler runs with the admitted call in `funnel.runtime.calls`;
6. whatever it raises leaves as a status with exactly one `ErrorInfo`: business
   rejections as they are, storage faults as `UNAVAILABLE`, anything unexpected
   as `INTERNAL` with a generic message (the stack stays in the log).

Each call's start and finish (code, ErrorInfo reason, caller, duration) are
reported to the service's `CallObserver` (funnel.runtime.observe: the RPC
metrics and the request's log line), denied calls included.

Client streams (transcript imports) are admitted on their first message and
ended when the client sends nothing for the idle timeout, or less than the
minimum rate (funnel/runtime/pace.py). Health and reflection are outside the
boundary: they answer anyone.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from funnel.auth.principal import ALL_WORKSPACES, Principal, Role, completion_service, unauthenticated_operator
from funnel.auth.table import Denied, Granted, authorize
from funnel.auth.tokens import TokenVerifier, Unauthenticated, bearer_token
from funnel.runtime import calls
from funnel.runtime.errors import Rejection, ServiceError, reject, storage_unavailable
from funnel.runtime.faults import DroppedReply
from funnel.runtime.grpc_errors import to_status
from funnel.runtime.observe import CallObserver, ObservedMethod
from funnel.runtime.pace import Late, Pace
from funnel.runtime.ratelimit import RateLimiter
from funnel.runtime.registration import add_generic, handlers_of
from funnel.runtime.storage_errors import StorageUnavailable
from funnel.runtime.tracing import Begun, ServerSpans
from funnel.runtime.validation import Checker

log = logging.getLogger(__name__)
# gRPC's own limit on incoming messages is this multiple of the service's limit:
# up to it, an oversize message is answered with ErrorInfo (MESSAGE_TOO_LARGE);
# beyond it gRPC refuses the message before the service sees it. gRPC receives a
# message whole before the service sees it, so this is also the most one call
# can make the process hold for a single message.
TRANSPORT_LIMIT_FACTOR = 2
# A write gives up waiting for the database lock this long before the caller's
# deadline, so that the UNAVAILABLE answer still reaches the caller in time. A
# quarter of what is left, up to a second: on a loaded 2-core machine the
# answer's way back (database thread -> event loop -> gRPC) took more than the
# tenth (0.1 s of a 1 s deadline) this used to leave, and under a load average
# of 14 more than half a second, and the caller saw DEADLINE_EXCEEDED instead of
# STORAGE_UNAVAILABLE.
_LOCK_MARGIN_MAX = 1.0
_LOCK_MARGIN_SHARE = 0.25
# The auth-context property of a client certificate's URI SANs (gRPC core's
# GRPC_PEER_URI_PROPERTY_NAME). Only a URI SAN names the completion service:
# `x509_subject_alternative_name` mixes every SAN type, so a DNS, email or IP
# SAN spelling the identity would pass for it.
_URI_SANS = "peer_uri"


class Authenticator:
    """Who is calling.

    `verifier` None means authentication is off (loopback only): every caller
    is the anonymous operator. With `trust_certificates` (the listener verifies
    client certificates), a certificate one of whose URI SANs is exactly
    `completion_identity` (no other SAN type counts) identifies the completion
    service (with a token, only one of that subject, whose permissions add to
    its role); otherwise the completion service sends a token whose `sub` is
    that identity (see TokenVerifier)."""

    def __init__(
        self, verifier: TokenVerifier | None, completion_identity: str | None, trust_certificates: bool
    ) -> None:
        self.verifier = verifier
        self._identity = completion_identity.encode() if completion_identity else None
        self._trust_certificates = trust_certificates
        # One principal each, not one per call: the boundary's decisions are
        # remembered per principal (_Decisions).
        self._anonymous = unauthenticated_operator()
        self._service = completion_service(completion_identity) if completion_identity else None

    def principal(self, context: grpc.aio.ServicerContext[Any, Any], metadata: Any) -> Principal:
        """`metadata`: the call's invocation metadata."""
        if self.verifier is None:
            return self._anonymous
        if self._trust_certificates and self._service is not None:
            names = context.auth_context().get(_URI_SANS, ())
            if self._identity is not None and self._identity in names:
                if not any(key == "authorization" for key, _ in metadata):
                    return self._service
                return self.verifier.verify(bearer_token(metadata), certified=self._service.subject)
        return self.verifier.verify(bearer_token(metadata))


@dataclass(frozen=True)
class Admission:
    authenticator: Authenticator
    limiter: RateLimiter | None
    max_message_bytes: int
    # When a client stream's next message is due (funnel/runtime/pace.py).
    stream_pace: Pace = field(default_factory=lambda: Pace(30.0))


class Boundary:
    """Applies admission, the error model, tracing and observation to every
    handler of the services it registers. Each handler is wrapped once, when its
    service is added (`add`), not per call as a gRPC server interceptor would:
    the per-call work is only what the call itself needs."""

    def __init__(
        self,
        domain: str,
        catalogue: type[enum.Enum],
        admission: Admission,
        observer: CallObserver | None = None,
        spans: ServerSpans | None = None,
    ) -> None:
        self._domain = domain
        self._catalogue = catalogue
        self._admission = admission
        self._observer = observer or CallObserver(None)
        self._spans = spans or ServerSpans()
        self._decisions = _Decisions()

    def add(self, server: grpc.aio.Server, add_servicer: Callable[[Any, Any], None], servicer: Any) -> None:
        """Registers `servicer` on `server` as `add_servicer` (a generated
        `add_…Servicer_to_server`) would, with every handler behind the boundary."""
        for service, handlers in handlers_of(add_servicer, servicer):
            add_generic(server, service, {name: self._wrap(f"/{service}/{name}", h) for name, h in handlers.items()})

    def _wrap(self, method: str, handler: Any) -> Any:
        """`handler`: a grpc.RpcMethodHandler whose behaviours are coroutines (types-grpcio
        types them as the synchronous API's)."""
        deserializer = _guarded(handler.request_deserializer, self._admission.max_message_bytes)
        serializer = handler.response_serializer
        if handler.unary_unary is not None:
            inner = handler.unary_unary
            observed = self._observer.method(method, "unary")

            async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                seen = self._started(method, observed, request, context)
                escaped = None
                try:
                    try:
                        self._admit(method, seen, request, context)
                        return await inner(request, context)
                    except Exception as exc:  # noqa: BLE001 - translated, never leaked
                        failure = self._failure(seen, context, method, exc)
                    await _abort(context, failure)
                except BaseException as exc:
                    escaped = exc
                    raise
                finally:
                    self._finished(seen, observed, context, escaped)
                    escaped = None  # not kept in a cycle with this frame

            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=deserializer, response_serializer=serializer
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream
            observed = self._observer.method(method, "server_stream")

            async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                seen = self._started(method, observed, request, context)
                escaped = None
                try:
                    try:
                        self._admit(method, seen, request, context)
                        async for item in inner_stream(request, context):
                            yield item
                        return
                    except Exception as exc:  # noqa: BLE001 - translated, never leaked
                        failure = self._failure(seen, context, method, exc)
                    await _abort(context, failure)
                except BaseException as exc:
                    escaped = exc
                    raise
                finally:
                    self._finished(seen, observed, context, escaped)
                    escaped = None  # not kept in a cycle with this frame

            return grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=deserializer, response_serializer=serializer
            )
        if handler.stream_unary is not None:
            inner_upload = handler.stream_unary
            observed = self._observer.method(method, "client_stream")

            async def upload(request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                seen = self._started(method, observed, None, context)
                escaped = None
                try:
                    try:
                        principal = self._authenticate(seen, context)
                        stream = _ClientStream(asyncio.get_running_loop().time())
                        first = await self._next(context, stream)
                        request = None if first is None else self._decoded(first)
                        self._authorize(method, seen, principal, request, context)
                        return await inner_upload(self._rest(context, stream, first), context)
                    except Exception as exc:  # noqa: BLE001 - translated, never leaked
                        failure = self._failure(seen, context, method, exc)
                    await _abort(context, failure)
                except BaseException as exc:
                    escaped = exc
                    raise
                finally:
                    self._finished(seen, observed, context, escaped)
                    escaped = None  # not kept in a cycle with this frame

            return grpc.stream_unary_rpc_method_handler(
                upload, request_deserializer=deserializer, response_serializer=serializer
            )
        return handler

    # -- observation -------------------------------------------------------

    def _started(
        self, method: str, observed: ObservedMethod, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> _Seen:
        """The call's record, its span begun and its start observed."""
        metadata = context.invocation_metadata() or ()
        seen = _Seen(None if isinstance(request, _Refused) else request, metadata)
        # Read now: a stream's context must not be touched once its call has ended.
        seen.peer = context.peer()
        seen.span = self._spans.begin(method, metadata)
        observed.started()
        return seen

    def _finished(
        self,
        seen: _Seen,
        observed: ObservedMethod,
        context: grpc.aio.ServicerContext[Any, Any],
        escaped: BaseException | None,
    ) -> None:
        """Reports how the call ended, however it ended: to its span and the observer."""
        span_code = seen.code
        if isinstance(escaped, grpc.aio.AbortError):
            pass  # the status it carries was noted when it was raised
        elif isinstance(escaped, (asyncio.CancelledError, GeneratorExit)):
            seen.status(grpc.StatusCode.CANCELLED)
            remaining = context.time_remaining() if isinstance(escaped, asyncio.CancelledError) else None
            span_code = (
                grpc.StatusCode.DEADLINE_EXCEEDED
                if remaining is not None and remaining <= 0
                else grpc.StatusCode.CANCELLED
            )
        elif escaped is not None:
            seen.status(grpc.StatusCode.UNKNOWN)
            span_code = seen.code
        call = calls.current()
        observed.finished(
            seen.code.name,
            seen.reason,
            seen.detail,
            time.perf_counter() - seen.started,
            seen.principal.subject if seen.principal is not None else None,
            call.role.value if call is not None else None,
            seen.peer,
            seen.request,
        )
        self._spans.end(seen.span, span_code, seen.detail)

    # -- admission ---------------------------------------------------------

    def _admit(self, method: str, seen: _Seen, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        principal = self._authenticate(seen, context)
        self._authorize(method, seen, principal, self._decoded(request), context)

    def _authenticate(self, seen: _Seen, context: grpc.aio.ServicerContext[Any, Any]) -> Principal:
        try:
            principal = self._admission.authenticator.principal(context, seen.metadata)
        except Unauthenticated as exc:
            raise ServiceError(reject(self._catalogue[exc.problem.value], exc.message)) from None
        seen.principal = principal
        limiter = self._admission.limiter
        if limiter is not None and Role.COMPLETION_SERVICE not in principal.grants.get(ALL_WORKSPACES, ()):
            wait = limiter.take(principal.subject)
            if wait is not None:
                raise ServiceError(
                    Rejection(
                        self._catalogue["RATE_LIMITED"],
                        f"more than {limiter.rate:g} requests per second from {principal.subject!r}; retry after the "
                        "delay",
                        {"limit_per_second": f"{limiter.rate:g}", "burst": f"{limiter.burst:g}"},
                        retry_after_seconds=wait,
                    )
                )
        return principal

    def _authorize(
        self, method: str, seen: _Seen, principal: Principal, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        seen.request = request
        field_path, workspace = _workspace_of(request)
        decision = self._decisions.known(principal, method, workspace)
        if decision is None:
            checker = Checker()
            checker.identifier(field_path, workspace)
            checker.raise_for(self._catalogue)
            decision = self._decisions.decide(principal, method, workspace)
        if isinstance(decision, Denied):
            metadata = {"workspace_id": workspace}
            if decision.permitted_roles:
                metadata["permitted_roles"] = ",".join(decision.permitted_roles)
            raise ServiceError(Rejection(self._catalogue[decision.reason], decision.message, metadata))
        calls.enter(
            calls.Call(principal, decision.role, decision.holder_only, method.rsplit("/", 1)[1]),
            lock_deadline(context),
        )

    # -- client streams ----------------------------------------------------

    async def _next(self, context: grpc.aio.ServicerContext[Any, Any], stream: _ClientStream) -> Any:
        """The next message of a client stream (None at its end), read with
        `context.read()`: gRPC's request iterator would keep the last message it
        gave alive until the next one arrives, a second copy of every chunk."""
        pace = self._admission.stream_pace
        loop = asyncio.get_running_loop()
        deadline, late = pace.due(stream.started, stream.received, loop.time())
        try:
            # asyncio.timeout, not wait_for: the read stays in the handler's own task,
            # where gRPC's cancellation of a broken-off stream must arrive.
            async with asyncio.timeout_at(deadline):
                message = await context.read()
        except TimeoutError:
            pass
        else:
            if message is grpc.aio.EOF:
                return None
            stream.received += (message.size or 0) if isinstance(message, _Refused) else message.ByteSize()
            return message
        # Raised outside the except block: as the TimeoutError's context it would keep
        # the timeout's frame, and through it the task and every buffer of the call,
        # in a reference cycle that only the garbage collector frees.
        raise ServiceError(self._late(late, stream, loop.time()))

    def _late(self, late: Late, stream: _ClientStream, now: float) -> Rejection:
        pace = self._admission.stream_pace
        if late is Late.IDLE:
            idle = pace.idle_seconds
            return reject(
                self._catalogue["STREAM_IDLE"],
                f"the client stream sent nothing for {idle:g} seconds; it was ended and nothing was applied",
                idle_timeout_seconds=f"{idle:g}",
            )
        rate = pace.min_bytes_per_second
        return reject(
            self._catalogue["STREAM_IDLE"],
            f"the client stream sent {stream.received} bytes in {now - stream.started:.0f} seconds, less than "
            f"{rate:g} bytes per second; it was ended and nothing was applied",
            min_bytes_per_second=f"{rate:g}",
            received_bytes=stream.received,
        )

    async def _rest(
        self, context: grpc.aio.ServicerContext[Any, Any], stream: _ClientStream, first: Any
    ) -> AsyncIterator[Any]:
        # The message given out is not kept here while the handler works on it (a
        # suspended generator keeps its locals): the handler alone decides how long
        # a chunk lives.
        held = [first]
        while held[0] is not None:
            yield self._decoded(held.pop())
            held.append(await self._next(context, stream))

    # -- errors ------------------------------------------------------------

    def _decoded(self, request: Any) -> Any:
        if isinstance(request, _Refused):
            raise ServiceError(request.rejection(self._catalogue, self._admission.max_message_bytes))
        return request

    def _failure(
        self, seen: _Seen, context: grpc.aio.ServicerContext[Any, Any], method: str, exc: Exception
    ) -> grpc.Status:
        """The status a failed handler ends with (an abort of its own passes through)."""
        if isinstance(exc, grpc.aio.AbortError):
            seen.status(context.code() or grpc.StatusCode.UNKNOWN)
            raise exc
        if isinstance(exc, DroppedReply):
            seen.status(grpc.StatusCode.UNAVAILABLE)
            return _Dropped(f"reply dropped by fault injection at {exc}")
        if isinstance(exc, ServiceError):
            rejection = exc.rejection
        elif isinstance(exc, StorageUnavailable):
            log.warning("%s: storage unavailable: %s", method, exc)
            rejection = storage_unavailable(self._catalogue, exc)
        else:
            log.exception("%s: unexpected fault", method)
            rejection = Rejection(self._catalogue["INTERNAL_FAULT"], "internal fault; see the server log")
        seen.status(grpc.StatusCode[rejection.code.name], rejection.reason.name, rejection.message)
        return to_status(rejection, self._domain)


async def _abort(context: grpc.aio.ServicerContext[Any, Any], status: grpc.Status) -> None:
    """Ends the call with `status`. Called after the handler's except block, never in
    it: gRPC keeps the abort's exception in the call's state, which its traceback
    refers back to, a cycle only the garbage collector breaks; chained to the
    handler's exception it would keep every frame of the handler, and the buffers
    they hold (a transcript import's chunks), alive until then."""
    await context.abort_with_status(status)


@dataclass(frozen=True)
class _Dropped(grpc.Status):
    """What a reply dropped by fault injection ends with: UNAVAILABLE, without ErrorInfo."""

    details: str
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    trailing_metadata: tuple[tuple[str, str | bytes], ...] = ()


@dataclass
class _ClientStream:
    """When a client stream opened, and the bytes it has sent since."""

    started: float
    received: int = 0


class _Seen:
    """What the boundary learned about the call it serves, for the observer."""

    __slots__ = ("code", "detail", "metadata", "peer", "principal", "reason", "request", "span", "started")

    def __init__(self, request: Any, metadata: Any) -> None:
        self.started = time.perf_counter()
        self.request = request
        self.metadata = metadata
        self.principal: Principal | None = None
        self.peer = ""
        self.span: Begun | None = None
        self.code = grpc.StatusCode.OK
        self.reason = ""
        self.detail = ""

    def status(self, code: grpc.StatusCode, reason: str = "", detail: str = "") -> None:
        self.code = code
        self.reason = reason
        self.detail = detail


class _Decisions:
    """The authorization table's answers (funnel.auth.table.authorize, a pure
    function of the principal, the RPC and the workspace), remembered: a caller's
    principal is one object for as long as its token is cached (TokenVerifier),
    and it asks the same few questions call after call. Only a workspace id that
    passed validation is ever remembered. Keyed by the principal's identity, which
    the entry keeps alive, so an id is never reused while its entry stands."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._known: dict[tuple[int, str, str], tuple[Principal, Granted | Denied]] = {}

    def known(self, principal: Principal, method: str, workspace: str) -> Granted | Denied | None:
        entry = self._known.get((id(principal), method, workspace))
        return entry[1] if entry is not None and entry[0] is principal else None

    def decide(self, principal: Principal, method: str, workspace: str) -> Granted | Denied:
        decision = authorize(principal, method, workspace)
        if len(self._known) >= self.LIMIT:
            self._known.clear()
        self._known[(id(principal), method, workspace)] = (principal, decision)
        return decision


def _workspace_of(request: Any) -> tuple[str, str]:
    """(field path, value) of the workspace a request names (None: a client
    stream that ended before its first message)."""
    if request is not None and hasattr(request, "workspace_id"):
        return "workspace_id", request.workspace_id
    if request is not None and request.HasField("target"):  # the first message of a transcript import
        return "target.workspace_id", request.target.workspace_id
    return "target", ""


def lock_deadline(context: grpc.aio.ServicerContext[Any, Any]) -> float | None:
    """By when the call's writes stop waiting for the database lock (the lock
    margin before its deadline); None without a deadline."""
    remaining = context.time_remaining()
    if remaining is None:
        return None
    margin = min(_LOCK_MARGIN_MAX, max(remaining, 0) * _LOCK_MARGIN_SHARE)
    return asyncio.get_running_loop().time() + remaining - margin


class _Refused:
    """Stands in for request bytes the service will not decode."""

    def __init__(self, problem: str, size: int | None = None) -> None:
        self.problem = problem
        self.size = size

    def rejection(self, catalogue: type[enum.Enum], limit: int) -> Rejection:
        if self.size is not None:
            return reject(
                catalogue["MESSAGE_TOO_LARGE"],
                f"the request is {self.size} bytes; this service accepts at most {limit}",
                size_bytes=self.size,
                max_bytes=limit,
            )
        # Without this, gRPC answers an unparsable request with UNKNOWN and the parser's text.
        return Rejection(catalogue["FIELD_MALFORMED"], f"the request could not be decoded: {self.problem}")


def _guarded(deserializer: Callable[[bytes], Any] | None, limit: int) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        if len(data) > limit:
            return _Refused("too large", len(data))
        try:
            return deserializer(data)
        except Exception as exc:  # noqa: BLE001 - reported to the principal as INVALID_ARGUMENT
            return _Refused(type(exc).__name__)

    return deserialize
