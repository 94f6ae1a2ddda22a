"""OpenTelemetry traces for both services: a SERVER span for every RPC of a
service, a CLIENT span for every call the completion service makes to the
lifecycle service (and to external gates), the W3C `traceparent` carried in gRPC
metadata between them, and a way to continue a trace later from a stored
`traceparent` (the settlement outbox, completion_service/authority/settler.py).

Configured only by the standard OTEL_* environment variables
(`configure_tracing`). With no exporter configured, no SDK is installed and no
span is made at all: a caller's trace context is only passed on (to the
lifecycle service, into the log lines), and a call that carries none costs
nothing here.

The hooks are our own, over the API's propagators, rather than
opentelemetry-instrumentation-grpc's: its aio server interceptor learns a call's
status only through `abort`/`set_code` on its wrapped context, while the
boundary (funnel/runtime/boundary.py) answers every rejection with
`abort_with_status`, so each refused call would be traced as OK. Here the
boundary hands the span the status the call ended with."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import Token
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger(__name__)
# How long a stopping process waits for its last spans to be exported.
SHUTDOWN_SECONDS = 2.0
_TRACER = trace.get_tracer("funnel")
# What a stored `traceparent` is: always W3C, whatever OTEL_PROPAGATORS says for the wire.
_W3C = TraceContextTextMapPropagator()
# Server spans whose gRPC code means the server failed (OpenTelemetry's semantic
# conventions for RPC); other codes are the caller's problem and leave the status unset.
_SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


# -- configuration ------------------------------------------------------------------


class TracingRefused(Exception):
    """OTEL_* settings that name an exporter this installation does not have."""


class Tracing:
    """What `configure_tracing` installed; `shutdown` exports the spans still buffered."""

    def __init__(self, provider: Any = None) -> None:
        self._provider = provider

    @property
    def exporting(self) -> bool:
        return self._provider is not None

    def shutdown(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Exports what is buffered, for at most `timeout` seconds: an exporter
        retrying an unreachable collector must not hold up the process's exit
        (the SDK would wait up to 30 s)."""
        if self._provider is None:
            return
        flushing = threading.Thread(target=self._provider.shutdown, name="tracing-shutdown", daemon=True)
        flushing.start()
        flushing.join(timeout)
        if flushing.is_alive():
            log.warning("spans not exported within %.1fs of stopping were dropped", timeout)


def exporter_names() -> list[str]:
    """The span exporters OTEL_* asks for: OTEL_TRACES_EXPORTER's list, or `otlp`
    when only an OTLP endpoint is set; none unless one of them is (the
    specification's default `otlp` would make every start try to reach a
    collector that nobody asked for)."""
    environ = os.environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = environ.get("OTEL_TRACES_EXPORTER")
    if named is None:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        return ["otlp"] if endpoint else []
    names = [name.strip().lower() for name in named.split(",") if name.strip()]
    return [] if "none" in names else names


def configure_tracing(service_name: str) -> Tracing:
    """Installs the SDK's tracer provider with the exporters OTEL_* configures
    (BatchSpanProcessor, OTEL_BSP_*; sampler OTEL_TRACES_SAMPLER; resource
    OTEL_RESOURCE_ATTRIBUTES), `service_name` being service.name unless
    OTEL_SERVICE_NAME or the resource attributes name it; with no exporter
    configured, nothing at all. Raises TracingRefused."""
    names = exporter_names()
    if not names:
        return Tracing()
    from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporters = [_exporter(name) for name in names]
    named_by_environment = OTELResourceDetector().detect().attributes.get(SERVICE_NAME)
    provider = TracerProvider(
        resource=Resource.create({} if named_by_environment else {SERVICE_NAME: service_name}),
        shutdown_on_exit=False,  # Tracing.shutdown, bounded
    )
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    log.info("exporting traces to %s", ", ".join(names))
    return Tracing(provider)


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # To the service log (stderr), one JSON object a line: stdout carries only
        # the `serving on` line that supervisors read.
        return ConsoleSpanExporter(out=sys.stderr, formatter=_one_json_line)
    if name == "otlp":
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"
        )
        name = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}.get(protocol.strip(), "")
        if not name:
            raise TracingRefused(f"OTLP protocol {protocol!r} is not supported; use grpc or http/protobuf")
    found = importlib.metadata.entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        package = {"otlp_proto_http": "opentelemetry-exporter-otlp-proto-http"}.get(name, f"the {name!r} exporter")
        raise TracingRefused(f"OTEL_TRACES_EXPORTER asks for {name!r}, which is not installed (install {package})")
    return next(iter(found)).load()()


def _one_json_line(span: Any) -> str:
    return json.dumps(json.loads(span.to_json()), separators=(",", ":")) + "\n"


# -- the server side ------------------------------------------------------------------


class ServerSpans:
    """A SERVER span for every call of a service, a child of the caller's span
    when the call carries its context; current while the boundary and the
    handler run (funnel/runtime/boundary.py calls `begin` first and `end` last,
    once per call: no interceptor of its own)."""

    def __init__(self) -> None:
        self._recording = _sdk_installed()
        # The metadata keys the configured propagators read (traceparent, tracestate,
        # baggage): a call that carries none of them has no context to pass on.
        self._fields = frozenset(propagate.get_global_textmap().fields)

    def begin(self, method: str, metadata: Any) -> Begun | None:
        """Makes the call's span (or, with nothing recorded, the caller's context)
        current; None when there is nothing to make current."""
        fields = self._fields
        carried = any(key in fields for key, _ in metadata)
        if not self._recording:
            if not carried:
                return None
            # Nothing would be recorded (a no-op span still costs several times the
            # rest): the caller's context is passed on as it came, for the calls this
            # one makes and for the log lines (trace id).
            return Begun(None, otel_context.attach(propagate.extract(tuple(metadata), getter=_GETTER)))
        parent = propagate.extract(tuple(metadata), getter=_GETTER) if carried else None
        service, name = method.lstrip("/").split("/", 1)
        span = _TRACER.start_span(
            f"{service}/{name}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
            record_exception=False,
            set_status_on_exception=False,
        )
        return Begun(span, otel_context.attach(trace.set_span_in_context(span, parent)))

    @staticmethod
    def end(begun: Begun | None, code: grpc.StatusCode, details: str) -> None:
        """Records the call's gRPC code on its span and ends it."""
        if begun is None:
            return
        span = begun.span
        if span is not None:
            span.set_attribute("rpc.grpc.status_code", code.value[0])
            if code in _SERVER_ERRORS:
                span.set_status(Status(StatusCode.ERROR, f"{code.name}: {details}"))
            span.end()
        otel_context.detach(begun.token)


class Begun:
    __slots__ = ("span", "token")

    def __init__(self, span: Span | None, token: Token[otel_context.Context]) -> None:
        self.span = span
        self.token = token


class _MetadataGetter(Getter[Sequence[tuple[str, Any]]]):
    def get(self, carrier: Sequence[tuple[str, Any]], key: str) -> list[str] | None:
        found = [value for name, value in carrier if name == key and isinstance(value, str)]
        return found or None

    def keys(self, carrier: Sequence[tuple[str, Any]]) -> list[str]:
        return [name for name, _ in carrier]


_GETTER = _MetadataGetter()


def _sdk_installed() -> bool:
    """Whether spans are recorded: `configure_tracing` (called before a service
    builds its server and channels) installed the SDK's provider."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


# -- the client side -------------------------------------------------------------------


class ClientSpans(grpc.aio.UnaryUnaryClientInterceptor):
    """A CLIENT span for every unary call of a channel, a child of the current
    span, whose context goes with the call as `traceparent` metadata.
    `tracer_provider` None: the global one (what `configure_tracing` installed)."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = _TRACER if tracer_provider is None else tracer_provider.get_tracer("funnel")
        self._recording = tracer_provider is not None or _sdk_installed()

    async def intercept_unary_unary(
        self, continuation: Callable[..., Awaitable[Any]], details: Any, request: Any
    ) -> Any:
        if not self._recording:  # the current context (a caller's) goes on as it is
            return await continuation(_with_context(details, None), request)
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        service, name = method.lstrip("/").split("/", 1)
        span = self._tracer.start_span(
            f"{service}/{name}",
            kind=SpanKind.CLIENT,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
        )
        try:
            call = await continuation(_with_context(details, span), request)
            code = await call.code()
        except grpc.aio.AioRpcError as error:
            _client_ended(span, error.code())
            raise
        except BaseException:
            _client_ended(span, grpc.StatusCode.CANCELLED)
            raise
        _client_ended(span, code)
        return call


class OutboundCalls:
    """CLIENT spans and the trace context for unary calls a service makes through
    a stub, without a client interceptor: grpc.aio runs each intercepted call
    through a task and call objects of its own, most of what a small call costs
    on the caller's side. `tracer_provider` None: the global one."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = _TRACER if tracer_provider is None else tracer_provider.get_tracer("funnel")
        self._recording = tracer_provider is not None or _sdk_installed()

    async def unary(
        self,
        service: str,
        name: str,
        method: Any,
        request: Any,
        timeout: float,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> Any:
        """`method(request, timeout=…, metadata=…)` (the multi-callable of the RPC
        `service`/`name` on a stub), in a CLIENT span when spans are recorded, with
        the trace context in its metadata."""
        if not self._recording:  # the current context (a caller's) goes on as it is
            return await method(request, timeout=timeout, metadata=metadata + _context_metadata(None))
        span = self._tracer.start_span(
            f"{service}/{name}",
            kind=SpanKind.CLIENT,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
        )
        try:
            response = await method(request, timeout=timeout, metadata=metadata + _context_metadata(span))
        except grpc.aio.AioRpcError as error:
            _client_ended(span, error.code())
            raise
        except BaseException:
            _client_ended(span, grpc.StatusCode.CANCELLED)
            raise
        _client_ended(span, grpc.StatusCode.OK)
        return response


def _context_metadata(span: Span | None) -> tuple[tuple[str, str], ...]:
    """The trace context of `span` (None: the current one) as call metadata."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=None if span is None else trace.set_span_in_context(span))
    return tuple(carrier.items())


def _with_context(details: Any, span: Span | None) -> Any:
    """The call's details with the trace context of `span` (None: the current one) in its metadata."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=None if span is None else trace.set_span_in_context(span))
    if not carrier:
        return details
    # ClientCallDetails is a namedtuple at run time; types-grpcio leaves out its _replace.
    return details._replace(metadata=[*(details.metadata or ()), *carrier.items()])


def _client_ended(span: Span, code: grpc.StatusCode) -> None:
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code is not grpc.StatusCode.OK:
        span.set_status(Status(StatusCode.ERROR, code.name))
    span.end()


# -- a trace continued later -------------------------------------------------------------


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the current span (None outside a trace), to be
    stored with work that is finished later (`continued`)."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier.get("traceparent")


@contextmanager
def continued(traceparent: str | None, name: str, attributes: dict[str, str | int]) -> Iterator[Span]:
    """A span for work done on behalf of an earlier call, a child of the span
    that `traceparent` names (which may have ended minutes ago), so the work
    joins that call's trace; a new trace without one."""
    parent = _W3C.extract({"traceparent": traceparent} if traceparent else {}, context=otel_context.Context())
    with _TRACER.start_as_current_span(name, context=parent, kind=SpanKind.INTERNAL, attributes=attributes) as span:
        yield span
