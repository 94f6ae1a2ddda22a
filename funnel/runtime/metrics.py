"""The Prometheus metrics of one service process, in a registry of its own (two
services may run in one process, as the tests do), and the plain-HTTP endpoint
that serves them (`--metrics-listen`).

Series both services export:

- per RPC, named as grpc-ecosystem/go-grpc-prometheus names them:
  `grpc_server_started_total`, `grpc_server_handled_total` (with the
  `ErrorInfo` reason beside the code), `grpc_server_handling_seconds`, and
  `grpc_server_in_flight_requests`; recorded by the server boundary
  (funnel.runtime.observe);
- the database: `funnel_db_commit_seconds` and `funnel_db_commit_group_size`
  (SQLite commits writes in groups, PostgreSQL one at a time),
  `funnel_db_size_bytes`, `funnel_request_ids` (the request-id table),
  `funnel_db_integrity_checks_total` by result (`ok`, `damaged`: the full
  integrity check SQLite runs after start);
- `funnel_watch_streams` (open watch streams of this process);
- the process itself (`process_*`, `python_*`) from the library's collectors.

Each service adds its domain series to the same registry
(lifecycle_service.metrics, completion_service.authority.metrics). Gauges that
need a database read are refreshed by a background loop (`refresh_forever`):
scrapes never touch the database."""

from __future__ import annotations

import asyncio
import bisect
import io
import itertools
import logging
import math
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Metric,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.utils import floatToGoString

from funnel.runtime.http import REQUEST_SECONDS
from funnel.runtime.storage_errors import StorageUnavailable

log = logging.getLogger(__name__)

# go-grpc-prometheus has no `_created` series; they would double every scrape.
# prometheus_client leaves this function unannotated; it takes and returns nothing.
cast("Callable[[], None]", disable_created_metrics)()

# go-grpc-prometheus's default buckets.
RPC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Their `le` labels, as the library's Histogram writes them ("0.005" … "+Inf").
_RPC_LE = tuple(cast("Callable[[float], str]", floatToGoString)(bound) for bound in (*RPC_BUCKETS, math.inf))
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# funnel.runtime.sqlite.MAX_GROUP is 64.
GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_REFRESH_INTERVAL = 5.0
INTEGRITY_RESULTS = ("ok", "damaged")


class RpcMetrics:
    """The per-RPC series of go-grpc-prometheus, plus the ErrorInfo reason: a
    collector of its own over plain counts, read when the registry is scraped.

    Each RPC updates them (funnel.runtime.observe): through prometheus_client's
    labelled children that is a lock taken and released for each of four values
    twice per call, a fifth of what the server boundary adds to a call. Here a
    call adds to integers in place, on the event loop's thread, their only
    writer; a scrape (on the metrics endpoint's thread) reads them as they
    stand, as it reads the library's values, one at a time. The in-flight gauge
    is what started less what finished."""

    _CALL = ("grpc_service", "grpc_method", "grpc_type")

    def __init__(self, registry: CollectorRegistry) -> None:
        self._methods: list[MethodMetrics] = []
        registry.register(self)

    def method(self, service: str, method: str, rpc_type: str) -> MethodMetrics:
        """The series of one method (made once, when it is registered)."""
        metrics = MethodMetrics((service, method, rpc_type))
        self._methods.append(metrics)
        return metrics

    def describe(self) -> list[Metric]:
        """The families without their samples: the registry refuses a second
        collector of the same names (prometheus_client's Collector protocol)."""
        return list(self._families())

    def collect(self) -> list[Metric]:
        started, handled, seconds, in_flight = self._families()
        for metrics in self._methods:
            call = list(metrics.call)
            # Finished calls read before started ones: a call that finishes between
            # the two reads counts in both, so in flight is never read below zero.
            finished = 0
            for (code, reason), count in list(metrics.handled.items()):
                handled.add_metric([*call, code, reason], count)
                finished += count
            started.add_metric(call, metrics.started)
            in_flight.add_metric(call, metrics.started - finished)
            cumulative = itertools.accumulate(list(metrics.buckets))
            seconds.add_metric(call, list(zip(_RPC_LE, cumulative, strict=True)), metrics.seconds)
        return [started, handled, seconds, in_flight]

    def _families(self) -> tuple[CounterMetricFamily, CounterMetricFamily, HistogramMetricFamily, GaugeMetricFamily]:
        call = self._CALL
        return (
            CounterMetricFamily("grpc_server_started", "RPCs started on the server.", labels=call),
            CounterMetricFamily(
                "grpc_server_handled",
                "RPCs completed on the server, by gRPC code and ErrorInfo reason (empty for OK).",
                labels=(*call, "grpc_code", "reason"),
            ),
            HistogramMetricFamily(
                "grpc_server_handling_seconds", "Time from the start of an RPC to its status, in seconds.", labels=call
            ),
            GaugeMetricFamily("grpc_server_in_flight_requests", "RPCs started and not finished.", labels=call),
        )


class MethodMetrics:
    """The per-RPC counts of one method."""

    __slots__ = ("buckets", "call", "handled", "seconds", "started")

    def __init__(self, call: tuple[str, str, str]) -> None:
        self.call = call
        self.started = 0
        # By (code, reason): bounded by the codes and the catalogued reasons.
        self.handled: dict[tuple[str, str], int] = {}
        # Calls per bucket of RPC_BUCKETS (the last: above them all), not cumulative.
        self.buckets = [0] * (len(RPC_BUCKETS) + 1)
        self.seconds = 0.0

    def start(self) -> None:
        self.started += 1

    def finish(self, code: str, reason: str, seconds: float) -> None:
        key = (code, reason)
        self.handled[key] = self.handled.get(key, 0) + 1
        # A bucket counts the calls that took at most its bound: the first bound >= seconds.
        self.buckets[bisect.bisect_left(RPC_BUCKETS, seconds)] += 1
        self.seconds += seconds


class ServiceMetrics:
    """The registry of one running service and the series both services export."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.rpc = RpcMetrics(self.registry)
        self._commit_seconds = Histogram(
            "funnel_db_commit_seconds",
            "Time of one database commit (a group of writes on SQLite), in seconds.",
            buckets=COMMIT_BUCKETS,
            registry=self.registry,
        )
        self._commit_group = Histogram(
            "funnel_db_commit_group_size",
            "Writes committed together in one transaction (always 1 on PostgreSQL).",
            buckets=GROUP_BUCKETS,
            registry=self.registry,
        )
        self.database_bytes = Gauge(
            "funnel_db_size_bytes",
            "Size of the service's database (its schema on PostgreSQL).",
            registry=self.registry,
        )
        self.request_ids = Gauge(
            "funnel_request_ids", "Request ids remembered for replay (the request-id table).", registry=self.registry
        )
        self.watch_streams = Gauge(
            "funnel_watch_streams", "Watch streams open on this process.", registry=self.registry
        )
        self._integrity_checks = Counter(
            "funnel_db_integrity_checks",
            "Full integrity checks of the SQLite database after start, by result (ok, damaged).",
            ("result",),
            registry=self.registry,
        )
        # Both series exist from the start, so that an alert on `damaged` > 0 has a series to watch.
        for result in INTEGRITY_RESULTS:
            self._integrity_checks.labels(result)

    def refresh_store(self, request_ids: int, database_bytes: int | None, watch_streams: int) -> None:
        """Sets the gauges of figures read from the database and of this process's watchers."""
        self.request_ids.set(request_ids)
        if database_bytes is not None:
            self.database_bytes.set(database_bytes)
        self.watch_streams.set(watch_streams)

    def integrity_checked(self, damaged: bool) -> None:
        self._integrity_checks.labels("damaged" if damaged else "ok").inc()

    def commit(self, seconds: float, writes: int) -> None:
        """Records one committed transaction of `writes` units of work (the engines call this)."""
        self._commit_seconds.observe(seconds)
        self._commit_group.observe(writes)


async def refresh_forever(refresh: Callable[[], Awaitable[None]], interval: float) -> None:
    """Refreshes the gauges read from the database every `interval` seconds (a background loop)."""
    while True:
        try:
            await refresh()
        except StorageUnavailable as exc:
            log.warning("metrics refresh postponed: %s", exc)
        except Exception:  # the loop must survive any single failure
            log.exception("metrics refresh failed")
        await asyncio.sleep(interval)


class CannotServeMetrics(RuntimeError):
    pass


class MetricsEndpoint:
    """`/metrics` over plain HTTP, served by a WSGI server on a thread of its own
    (with the request timeout of funnel/runtime/http.py); this object owns the
    thread: `stop` shuts the server down, closes its socket and joins the thread."""

    def __init__(self, server: WSGIServer, thread: threading.Thread, host: str) -> None:
        self._server = server
        self._thread = thread
        self.host = host

    @classmethod
    def start(cls, listen: str, registry: CollectorRegistry) -> MetricsEndpoint:
        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit():
            raise CannotServeMetrics(f"--metrics-listen wants HOST:PORT, not {listen!r}")
        try:
            server, thread = _serve_wsgi(host, int(port), make_wsgi_app(registry))
        except OSError as exc:
            raise CannotServeMetrics(f"cannot serve metrics on {listen}: {exc}") from None
        return cls(server, thread, host)

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def stop(self) -> None:
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _serve_wsgi(host: str, port: int, app: Any) -> tuple[WSGIServer, threading.Thread]:
    """What prometheus_client's start_http_server does, with a handler that ends
    a connection whose request has not arrived whole in time (funnel/runtime/http.py)."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    server = make_server(str(address[0]), port, app, Server, handler_class=_TimedHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return server, thread


class _TimedHandler(WSGIRequestHandler):
    """One request per connection, which must arrive within REQUEST_SECONDS; quiet
    (prometheus_client's handler logs nothing either)."""

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BufferedReader(_ReadBefore(self.connection, time.monotonic() + REQUEST_SECONDS))

    def handle(self) -> None:
        try:
            super().handle()
        except (TimeoutError, ConnectionError):
            self.close_connection = True

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self.connection.settimeout(REQUEST_SECONDS)  # the answer is written without the request's deadline
        return parsed

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _ReadBefore(io.RawIOBase):
    """A socket's reads, none of them past `deadline`."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)
