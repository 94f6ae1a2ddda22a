"""Server bootstrap shared by both services: message limits, the boundary every
RPC passes (funnel/runtime/boundary.py), TLS listeners, health (NOT_SERVING
while the database is not writable, and for good once the integrity check after
start found damage), optional reflection, certificate reloads on SIGHUP, and
graceful shutdown on SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import enum
import gc
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FileDescriptor, ServiceDescriptor
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from funnel.runtime import logs, memory, registration
from funnel.runtime import security as security_settings
from funnel.runtime.background import Background
from funnel.runtime.boundary import TRANSPORT_LIMIT_FACTOR, Boundary
from funnel.runtime.idempotency import DEFAULT_RETENTION_SECONDS
from funnel.runtime.logs import fields
from funnel.runtime.metrics import (
    DEFAULT_REFRESH_INTERVAL,
    CannotServeMetrics,
    MetricsEndpoint,
    RpcMetrics,
    ServiceMetrics,
    refresh_forever,
)
from funnel.runtime.observe import CallObserver
from funnel.runtime.security import PreparedSecurity, Reloader, SecurityRefused
from funnel.runtime.storage_errors import StorageUnavailable
from funnel.runtime.tracing import ServerSpans, TracingRefused, configure_tracing

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


WATCH_BUFFER = 1024
# `--integrity-check`: the full SQLite integrity check right after SERVING, or none
# (then `funnel check FILE` is the operator's to run).
INTEGRITY_AFTER_START = "after-start"
INTEGRITY_CHECK_CHOICES = (INTEGRITY_AFTER_START, "off")
# When the check itself could not run (not damage: nothing is known), it tries again.
INTEGRITY_RETRY_INTERVAL = 60.0
MAX_WATCHERS_PER_CALLER = 64
MAX_WATCHERS_PER_WORKSPACE = 1024


def env_or(prefix: str, name: str, default: str) -> str:
    return os.environ.get(f"{prefix}_{name.upper()}", default)


def add_common_arguments(
    parser: argparse.ArgumentParser, env_prefix: str, default_listen: str, default_db: str
) -> None:
    """Flags every service takes; each defaults to an environment variable `<PREFIX>_<NAME>`."""

    def e(name: str, default: str) -> str:
        return env_or(env_prefix, name, default)

    parser.add_argument("--listen", default=e("listen", default_listen), help=f"host:port ({env_prefix}_LISTEN)")
    parser.add_argument(
        "--database",
        default=e("database", default_db),
        help=f"SQLite file or postgresql:// URL ({env_prefix}_DATABASE; the environment keeps a password off the "
        "command line)",
    )
    parser.add_argument(
        "--max-message-bytes",
        type=int,
        default=int(e("max_message_bytes", str(4 * 1024 * 1024))),
        help=f"largest request accepted; larger ones get RESOURCE_EXHAUSTED ({env_prefix}_MAX_MESSAGE_BYTES)",
    )
    parser.add_argument(
        "--reflection",
        action=argparse.BooleanOptionalAction,
        default=e("reflection", "false").lower() in ("1", "true", "yes"),
        help=f"serve gRPC reflection ({env_prefix}_REFLECTION)",
    )
    parser.add_argument(
        "--health-interval",
        type=float,
        default=float(e("health_interval", "2.0")),
        help=f"seconds between database writability probes ({env_prefix}_HEALTH_INTERVAL)",
    )
    parser.add_argument(
        "--integrity-check",
        choices=INTEGRITY_CHECK_CHOICES,
        default=e("integrity_check", INTEGRITY_AFTER_START),
        help="SQLite: run the full integrity check in the background once serving (start-up checks only what "
        "costs the same at any size); damage found turns health NOT_SERVING and refuses writes. PostgreSQL: "
        f"ignored ({env_prefix}_INTEGRITY_CHECK)",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=float,
        default=float(e("shutdown_grace", "5.0")),
        help=f"seconds in-flight calls get on SIGTERM ({env_prefix}_SHUTDOWN_GRACE)",
    )
    parser.add_argument("--log-level", default=e("log_level", "INFO"), help=f"({env_prefix}_LOG_LEVEL)")
    parser.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default=e("log_format", "") or logs.default_format(),
        help="one JSON object per line, or readable text; one line per request (method, code, reason, caller, "
        "workspace, task, run, duration, trace id) and per piece of background work (default: text when stderr "
        f"is a terminal, json otherwise) ({env_prefix}_LOG_FORMAT)",
    )
    parser.add_argument(
        "--metrics-listen",
        default=e("metrics_listen", "") or None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (plain HTTP; port 0: any free one); off "
        f"when not given ({env_prefix}_METRICS_LISTEN)",
    )
    parser.add_argument(
        "--metrics-interval",
        type=float,
        default=float(e("metrics_interval", str(DEFAULT_REFRESH_INTERVAL))),
        help=f"seconds between refreshes of the metrics read from the database ({env_prefix}_METRICS_INTERVAL)",
    )
    parser.add_argument(
        "--watch-buffer",
        type=int,
        default=int(e("watch_buffer", str(WATCH_BUFFER))),
        help=f"events a watch stream may fall behind before it is ended ({env_prefix}_WATCH_BUFFER)",
    )
    parser.add_argument(
        "--max-watchers-per-caller",
        type=int,
        default=int(e("max_watchers_per_caller", str(MAX_WATCHERS_PER_CALLER))),
        help=f"open watch streams one caller may hold ({env_prefix}_MAX_WATCHERS_PER_CALLER)",
    )
    parser.add_argument(
        "--max-watchers-per-workspace",
        type=int,
        default=int(e("max_watchers_per_workspace", str(MAX_WATCHERS_PER_WORKSPACE))),
        help=f"open watch streams on one workspace ({env_prefix}_MAX_WATCHERS_PER_WORKSPACE)",
    )
    parser.add_argument(
        "--request-id-retention",
        type=float,
        default=float(e("request_id_retention", str(DEFAULT_RETENTION_SECONDS))),
        help=f"seconds a request id is remembered ({env_prefix}_REQUEST_ID_RETENTION)",
    )
    security_settings.add_arguments(parser, e)


def new_server(
    security: PreparedSecurity,
    domain: str,
    catalogue: type[enum.Enum],
    rpc_metrics: RpcMetrics | None = None,
) -> tuple[grpc.aio.Server, Boundary]:
    """The server, and the boundary its services are added through
    (`boundary.add(server, add_…Servicer_to_server, servicer)`); what is added to
    the server directly (health, reflection) answers anyone."""
    limit = security.admission.max_message_bytes
    boundary = Boundary(domain, catalogue, security.admission, CallObserver(rpc_metrics), ServerSpans())
    server = grpc.aio.server(
        options=[
            # Up to this, an oversize request reaches the boundary and is answered
            # with ErrorInfo (MESSAGE_TOO_LARGE); beyond it gRPC refuses it alone,
            # from its length prefix, before receiving it.
            ("grpc.max_receive_message_length", limit * TRANSPORT_LIMIT_FACTOR),
            ("grpc.max_send_message_length", limit),
            ("grpc.max_concurrent_streams", security.settings.max_streams_per_connection),
            # A second process on the same port must fail, not silently share it.
            ("grpc.so_reuseport", 0),
            # Clients may ping every second while a call is open (the completion
            # service's keepalive toward its lifecycle streams); gRPC's default
            # would end their connections for pinging more often than every 5 min.
            ("grpc.http2.min_ping_interval_without_data_ms", 1000),
            # Without bandwidth probing the flow-control windows stay small: gRPC
            # then holds little for a stream whose handler is not reading (a
            # refused import's client still sending), instead of up to megabytes
            # for each once a fast connection has grown them.
            ("grpc.http2.bdp_probe", 0),
            *connection_options(security.settings),
        ],
    )
    return server, boundary


def connection_options(settings: security_settings.ServerSecurity) -> list[tuple[str, int]]:
    """Connections end instead of lingering: one that does not finish its TLS and
    HTTP/2 handshake in time (a client that connects and sends nothing), one
    without a call for the idle timeout (the client reconnects when it needs to),
    and one whose peer stops answering pings (gone without closing, with its
    watch streams still open)."""

    def ms(seconds: float) -> int:
        return int(seconds * 1000)

    return [
        ("grpc.server_handshake_timeout_ms", ms(settings.handshake_timeout_seconds)),
        ("grpc.max_connection_idle_ms", ms(settings.connection_idle_seconds)),
        ("grpc.keepalive_time_ms", ms(settings.keepalive_seconds)),
        ("grpc.keepalive_timeout_ms", ms(settings.keepalive_timeout_seconds)),
        # gRPC also waits this long for any ping's answer (a minute by default).
        ("grpc.http2.ping_timeout_ms", ms(settings.keepalive_timeout_seconds)),
        # Keepalive pings go on while only quiet streams are open, not just twice.
        ("grpc.http2.max_pings_without_data", 0),
    ]


class Health:
    """The standard health service, driven by a periodic probe of the database."""

    def __init__(self, server: grpc.aio.Server, service_names: Sequence[str]) -> None:
        self.servicer = health_async.HealthServicer()
        registration.add_servicer(server, health_pb2_grpc.add_HealthServicer_to_server, self.servicer)
        self._names = ["", *service_names]

    async def set(self, status: int) -> None:
        for name in self._names:
            await self.servicer.set(name, status)

    async def probe_forever(self, probe: Callable[[], Awaitable[None]], interval: float) -> None:
        """Sets SERVING or NOT_SERVING from a periodic database probe (a background
        loop). The probe runs in this loop's own task group: a probe stuck behind a
        lock outlives one round (it is waited for again rather than joined by more
        probes queueing on the database thread), never the loop."""
        serving: bool | None = None
        running: asyncio.Task[Exception | None] | None = None
        async with asyncio.TaskGroup() as probes:
            while True:
                if running is None:
                    running = probes.create_task(_failure_of(probe))
                done, _ = await asyncio.wait({running}, timeout=max(interval, 1.0))
                problem = running.result() if done else "the probe did not finish in time"
                if done:
                    running = None
                healthy = problem is None
                if not healthy and serving is not False:
                    log.error("database not writable, reporting NOT_SERVING: %s", problem)
                if healthy != serving:
                    await self.set(SERVING if healthy else NOT_SERVING)
                    serving = healthy
                await asyncio.sleep(interval)

    async def stop(self) -> None:
        await self.servicer.enter_graceful_shutdown()


async def _failure_of(probe: Callable[[], Awaitable[None]]) -> Exception | None:
    """What the probe raised, or None: a failed probe is a finding, not a failure
    of the task group it runs in."""
    try:
        await probe()
    except Exception as exc:  # noqa: BLE001 - every failure means: not writable
        return exc
    return None


def add_integrity_check(
    background: Background, mode: str, check: Callable[[], Awaitable[str | None]], metrics: ServiceMetrics
) -> None:
    """With `--integrity-check after-start`, the full check joins the other background
    loops, which start after the server: start-up itself did only O(1) checks."""
    if mode == INTEGRITY_AFTER_START:
        background.add("integrity-check", lambda: check_integrity_after_start(check, metrics))


async def check_integrity_after_start(
    check: Callable[[], Awaitable[str | None]],
    metrics: ServiceMetrics,
    retry_interval: float = INTEGRITY_RETRY_INTERVAL,
) -> None:
    """Runs the database's full integrity check once, after the service serves (a
    one-shot background task). Damage is logged at ERROR and counted; the store then
    refuses writes and its health probe fails, so health turns NOT_SERVING within
    one probe interval and stays so until the file is restored and the service
    restarted. A check that could not run is tried again later."""
    while True:
        started = time.monotonic()
        try:
            damage = await check()
        except StorageUnavailable as exc:
            log.warning(
                "integrity check could not run, trying again in %.0fs: %s",
                retry_interval,
                exc,
                extra=fields(event="integrity_check", result="postponed"),
            )
            await asyncio.sleep(retry_interval)
            continue
        except Exception:  # raised out of here, it would stop every other background loop
            log.exception(
                "integrity check failed to run, trying again in %.0fs",
                retry_interval,
                extra=fields(event="integrity_check", result="postponed"),
            )
            await asyncio.sleep(retry_interval)
            continue
        seconds = time.monotonic() - started
        metrics.integrity_checked(damaged=damage is not None)
        if damage is None:
            log.info(
                "integrity check passed in %.1fs",
                seconds,
                extra=fields(event="integrity_check", result="ok", seconds=round(seconds, 3)),
            )
        else:
            log.error(
                "integrity check found damage, refusing writes and reporting NOT_SERVING: %s",
                damage,
                extra=fields(event="integrity_check", result="damaged", seconds=round(seconds, 3)),
            )
        return


REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


def file_containing_symbol(pool: descriptor_pool.DescriptorPool, name: str) -> FileDescriptor:
    """The file that defines the fully qualified `name`: a message, enum, service,
    field or extension as the pool finds them, and also what protobuf's upb pool
    does not look up (grpc/grpc#34743): a service's method
    (`pkg.Service.Method`, what `grpcurl describe` asks for), a nested message's
    or enum's member, an enum value under its enum's name or, as protobuf scopes
    it, beside the enum. Raises KeyError for a name nothing in the pool defines."""
    try:
        return pool.FindFileContainingSymbol(name)
    except KeyError:
        pass
    parent, _, member = name.rpartition(".")
    if parent:
        finders: list[Callable[[str], Descriptor | EnumDescriptor | ServiceDescriptor]] = [
            pool.FindServiceByName,
            pool.FindMessageTypeByName,
            pool.FindEnumTypeByName,
        ]
        for find in finders:
            try:
                container = find(parent)
            except KeyError:
                continue
            members: list[dict[str, Any]] = [
                getattr(container, attribute)
                for attribute in (
                    "methods_by_name",
                    "fields_by_name",
                    "nested_types_by_name",
                    "enum_types_by_name",
                    "oneofs_by_name",
                    "extensions_by_name",
                    "values_by_name",
                )
                if hasattr(container, attribute)
            ]
            if any(member in found for found in members):
                return container.file
    raise KeyError(name)


class ReflectionServicer(reflection.aio.ReflectionServicer):
    """grpcio-reflection's servicer, answering `file_containing_symbol` for every
    kind of symbol (file_containing_symbol above). Each answer holds the file and
    every file it imports, transitively (google/protobuf/*, google/rpc/*), so a
    client resolves any type from one answer."""

    # Overrides the base class's (private) handler of `file_containing_symbol`.
    def _file_containing_symbol(
        self, request: reflection_pb2.ServerReflectionRequest, fully_qualified_name: str
    ) -> reflection_pb2.ServerReflectionResponse:
        try:
            found = file_containing_symbol(descriptor_pool.Default(), fully_qualified_name)
        except KeyError:
            return reflection_pb2.ServerReflectionResponse(
                original_request=request,
                error_response=reflection_pb2.ErrorResponse(
                    error_code=grpc.StatusCode.NOT_FOUND.value[0],
                    error_message=f"symbol {fully_qualified_name!r} is not defined by the files this server serves",
                ),
            )
        return reflection_pb2.ServerReflectionResponse(
            original_request=request,
            file_descriptor_response=reflection_pb2.FileDescriptorResponse(
                file_descriptor_proto=[_serialized(file) for file in with_dependencies(found)]
            ),
        )


def _describe_reflection_v1() -> None:
    """Adds `grpc/reflection/v1/reflection.proto` to the pool, so that the v1
    service listed is described too: the v1alpha file under the v1 package (the
    messages are the same), since grpcio-reflection ships only v1alpha."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName("grpc/reflection/v1/reflection.proto")
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = "grpc/reflection/v1/reflection.proto"
    proto.package = "grpc.reflection.v1"
    for message in proto.message_type:
        for field in message.field:
            if field.HasField("type_name"):
                field.type_name = field.type_name.replace(".grpc.reflection.v1alpha.", ".grpc.reflection.v1.")
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(".grpc.reflection.v1alpha.", ".grpc.reflection.v1.")
            method.output_type = method.output_type.replace(".grpc.reflection.v1alpha.", ".grpc.reflection.v1.")
    pool.Add(proto)


def with_dependencies(file: FileDescriptor) -> list[FileDescriptor]:
    """The file and every file it imports, transitively, the file first."""
    found: dict[str, FileDescriptor] = {}
    pending = [file]
    while pending:
        current = pending.pop()
        if current.name not in found:
            found[current.name] = current
            pending.extend(current.dependencies)
    return list(found.values())


def _serialized(file: FileDescriptor) -> bytes:
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    return proto.SerializeToString()


def enable_reflection(server: grpc.aio.Server, service_names: Sequence[str], files: Sequence[FileDescriptor]) -> None:
    """Serves gRPC reflection as `grpc.reflection.v1` (what current tools ask for)
    and `grpc.reflection.v1alpha`. grpcio-reflection implements only v1alpha; the
    v1 protocol has the same messages under another package name, so the same
    servicer answers both (the bytes on the wire are identical).

    Reflection lists `service_names` and describes what the default descriptor pool
    holds. `files` are the contract's files that the generated stubs do not load:
    those that declare the services listed (the stubs import only the messages),
    and those no service file imports (errors.proto). Raises ValueError when no
    file of `files` declares a service listed."""
    declared = {service.full_name for file in files for service in file.services_by_name.values()}
    if undeclared := sorted(set(service_names) - declared):
        raise ValueError(f"no file given to describe declares {undeclared}")
    names = [*service_names, REFLECTION_V1, reflection.SERVICE_NAME, "grpc.health.v1.Health"]
    _describe_reflection_v1()
    servicer = ReflectionServicer(names)
    # v1 has v1alpha's messages under another package name: the same handlers serve both.
    add_reflection = reflection_pb2_grpc.add_ServerReflectionServicer_to_server
    for service, handlers in registration.handlers_of(add_reflection, servicer):
        registration.add_generic(server, service, handlers)
        registration.add_generic(server, REFLECTION_V1, handlers)


class CannotListen(RuntimeError):
    pass


def bind(server: grpc.aio.Server, listen: str, security: PreparedSecurity) -> int:
    """Binds the listening address (TLS unless the security settings allowed
    plaintext on loopback); done before any database is opened, so a busy port
    refuses the start without leaving connections (and their threads) behind."""
    try:
        if security.tls is not None:
            port = server.add_secure_port(listen, security.tls.credentials())
        else:
            port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise CannotListen(f"cannot listen on {listen}: {exc}") from None
    if port == 0:
        raise CannotListen(f"cannot listen on {listen}")
    return port


async def release(server: grpc.aio.Server) -> None:
    """Lets go of the port of a server whose start was refused after bind(). gRPC
    core closes the listeners only in the shutdown of a started server: stop()
    alone, or dropping the server, leaves the port taken for the life of the
    process. So it is started and stopped at once, with no grace: nothing was
    announced, no caller is there to be cut."""
    await server.start()
    await server.stop(None)


async def serve_metrics(
    listen: str | None,
    metrics: ServiceMetrics,
    background: Background,
    refresh: Callable[[], Awaitable[None]],
    interval: float,
) -> MetricsEndpoint | None:
    """The metrics endpoint, if `--metrics-listen` asked for one, with the loop that
    refreshes the gauges read from the database (only while someone can scrape
    them). Raises CannotServeMetrics when the endpoint cannot be served: the
    service refuses to start (and its start undoes what it opened)."""
    if not listen:
        return None
    endpoint = MetricsEndpoint.start(listen, metrics.registry)
    background.add("metrics-refresh", lambda: refresh_forever(refresh, interval))
    return endpoint


def announce(service: str, listen: str, port: int, metrics: MetricsEndpoint | None = None) -> None:
    """The lines on stdout that process supervisors (`funnel up`, tests) wait for:
    where metrics are served (if they are), then the one that says the service serves."""
    host = listen.rsplit(":", 1)[0]
    if metrics is not None:
        print(f"{service} metrics on {metrics.url}", flush=True)
    print(f"{service} serving on {host}:{port}", flush=True)


def install_signal_handlers(reload: Callable[[], None] | None = None) -> asyncio.Event:
    """SIGTERM and SIGINT set the returned event; SIGHUP calls `reload`
    (certificates, key sets). Installed before the service announces itself, so
    that a signal sent right after the announcement is never fatal."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if reload is not None:
        loop.add_signal_handler(signal.SIGHUP, reload)
    return stop


class SlowProtobuf(RuntimeError):
    pass


def require_fast_protobuf() -> str:
    """The pure-Python protobuf backend is many times slower; running on it by
    accident would silently cost most of the throughput, so it is refused unless
    FUNNEL_ALLOW_PYTHON_PROTOBUF=1 says it is deliberate."""
    from google.protobuf.internal import api_implementation

    backend = api_implementation.Type()
    if backend != "upb" and os.environ.get("FUNNEL_ALLOW_PYTHON_PROTOBUF") != "1":
        raise SlowProtobuf(
            f"protobuf runs its {backend!r} backend, not the C (upb) one; reinstall protobuf "
            "from a wheel, or set FUNNEL_ALLOW_PYTHON_PROTOBUF=1 to run slowly on purpose"
        )
    return backend


def run(main: Coroutine[Any, Any, None]) -> None:
    """Runs a service's main coroutine on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


class RunningService(Protocol):
    """What serve_process uses of a started service (each service's Running… class)."""

    @property
    def port(self) -> int: ...

    @property
    def reloader(self) -> Reloader: ...

    @property
    def metrics_endpoint(self) -> MetricsEndpoint | None: ...

    async def stop(self, grace: float | None = None) -> None: ...


def serve_process(
    name: str,
    start: Callable[[], Awaitable[RunningService]],
    listen: str,
    grace: float,
    refusals: tuple[type[Exception], ...],
) -> None:
    """The whole life of a service process: start, announce, serve until SIGTERM
    or SIGINT, stop gracefully. A refusal to start exits non-zero with its reason."""

    async def serve() -> None:
        running = await start()
        stop = install_signal_handlers(running.reloader.trigger)
        endpoint = running.metrics_endpoint
        # What start-up made (modules, descriptors, the server, its stores) lives as
        # long as the process: out of the collector's full passes, which would walk
        # it each time, stalling every call in flight for ~30 ms (the attempt's p99).
        gc.freeze()
        announce(name, listen, running.port, endpoint)
        log.info(
            "%s serving on port %d",
            name,
            running.port,
            extra=fields(
                event="start",
                service=name,
                port=running.port,
                metrics=endpoint.url if endpoint is not None else None,
                frozen_objects=gc.get_freeze_count(),
            ),
        )
        await stop.wait()
        log.info(
            "stopping: letting in-flight calls finish for up to %.1fs",
            grace,
            extra=fields(event="stopping", service=name, grace_seconds=grace),
        )
        await running.stop(grace)
        log.info("%s stopped", name, extra=fields(event="stopped", service=name))

    refused: tuple[type[Exception], ...] = (
        *refusals,
        SlowProtobuf,
        CannotListen,
        SecurityRefused,
        TracingRefused,
        CannotServeMetrics,
    )
    try:
        require_fast_protobuf()
        memory.return_freed_memory()
        tracing = configure_tracing(name)  # the process's name is its default service.name
        try:
            run(serve())
        finally:
            tracing.shutdown()
    except refused as exc:
        raise SystemExit(f"{name} refuses to start: {exc}") from None


def reloader(security: PreparedSecurity, *more: security_settings.Reloadable) -> Reloader:
    return Reloader([*security.reloadables, *more], security.settings.reload_interval)


def configure_logging(level: str, log_format: str) -> None:
    """The service's logging; in JSON mode the gRPC core's own lines too
    (logs.capture_native_stderr), so that every line of the log is JSON."""
    if log_format == "json":
        logs.capture_native_stderr()
    logs.configure(level, log_format)
