"""Runs the lifecycle service: `lifecycle-service --help` lists the flags; each
has an environment variable `FUNNEL_LIFECYCLE_<FLAG>`.

`--database` is a SQLite file (the default; one process) or a `postgresql://`
URL, on which any number of replicas may serve at once: each feeds its watchers
from the event table (funnel.runtime.tail) and replays pending propagations."""

from __future__ import annotations

import argparse
import contextlib
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from funnel.auth.pki import COMPLETION_IDENTITY
from funnel.lifecycle.v1 import errors_pb2 as lifecycle_errors
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2 as lifecycle_service_pb2
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.runtime import idempotency
from funnel.runtime import security as security_settings
from funnel.runtime import server as runtime
from funnel.runtime.background import Background
from funnel.runtime.clock import Clock, SystemClock
from funnel.runtime.faults import from_environment
from funnel.runtime.metrics import DEFAULT_REFRESH_INTERVAL, MetricsEndpoint, ServiceMetrics
from funnel.runtime.postgres import is_postgres_url
from funnel.runtime.security import Reloader, ServerSecurity
from funnel.runtime.storage_errors import StorageRefused
from funnel.runtime.tail import Tailer
from funnel.runtime.watch import EventBroker, WatchQuota
from lifecycle_service.api.service import SERVICE_NAME, LifecycleService, publisher
from lifecycle_service.authority import LifecycleAuthority
from lifecycle_service.core.model import LifecycleEvent, Policy
from lifecycle_service.errors import DOMAIN, Reason
from lifecycle_service.metrics import LifecycleMetrics
from lifecycle_service.storage.port import LifecycleStore
from lifecycle_service.storage.postgres import PostgresLifecycleStore
from lifecycle_service.storage.sqlite import SqliteLifecycleStore

ENV_PREFIX = "FUNNEL_LIFECYCLE"
# With replicas, another replica's commit may owe propagations, or a replica that
# stopped may leave claimed ones behind: each replica looks this often as well.
REPLICA_REPLAY_INTERVAL = 5.0


@dataclass(frozen=True)
class LifecycleConfig:
    listen: str = "127.0.0.1:50051"
    database: str = "lifecycle.sqlite3"
    security: ServerSecurity = field(default_factory=lambda: ServerSecurity(completion_identity=COMPLETION_IDENTITY))
    max_clock_offset_ms: int = 500
    max_message_bytes: int = 4 * 1024 * 1024
    reflection: bool = False
    watch_buffer: int = runtime.WATCH_BUFFER
    max_watchers_per_caller: int = runtime.MAX_WATCHERS_PER_CALLER
    max_watchers_per_workspace: int = runtime.MAX_WATCHERS_PER_WORKSPACE
    request_id_retention_seconds: float = idempotency.DEFAULT_RETENTION_SECONDS
    health_interval: float = 2.0
    # SQLite: the full integrity check after SERVING ("after-start") or none ("off").
    integrity_check: str = runtime.INTEGRITY_AFTER_START
    shutdown_grace: float = 5.0
    # Where /metrics is served (None: nowhere); how often database figures are read for it.
    metrics_listen: str | None = None
    metrics_interval: float = DEFAULT_REFRESH_INTERVAL


@dataclass
class RunningLifecycle:
    server: grpc.aio.Server
    port: int
    authority: LifecycleAuthority
    store: LifecycleStore
    health: runtime.Health
    broker: EventBroker[lifecycle_messages.WatchLifecycleEventsResponse]
    background: Background
    reloader: Reloader
    metrics: ServiceMetrics
    metrics_endpoint: MetricsEndpoint | None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace: float | None = None) -> None:
        """Stops accepting calls and lets unary ones finish within `grace`; watch
        streams end at once (SERVER_SHUTTING_DOWN, with their cursor), since
        they would otherwise hold the whole grace and then be cut without one."""
        await self.health.stop()
        self.broker.close()
        await self.server.stop(grace)
        await self.background.stop()
        if self.metrics_endpoint is not None:
            await self.metrics_endpoint.stop()
        await self.store.close()


async def start(config: LifecycleConfig, clock: Clock | None = None) -> RunningLifecycle:
    """Opens the database (refusing unsafe ones), starts serving and replays pending propagations."""
    clock = clock or SystemClock()
    security = security_settings.prepare(config.security, config.listen, config.max_message_bytes)
    # What start opens, start closes again if a later step raises: otherwise the
    # database's thread (not a daemon) keeps a process that refused to start alive.
    async with contextlib.AsyncExitStack() as undo:
        metrics = ServiceMetrics()
        server, boundary = runtime.new_server(security, DOMAIN, Reason, metrics.rpc)
        port = runtime.bind(server, config.listen, security)
        undo.push_async_callback(runtime.release, server)
        broker: EventBroker[lifecycle_messages.WatchLifecycleEventsResponse] = EventBroker(config.watch_buffer)
        faults = from_environment()
        background = Background("lifecycle_service")
        store: LifecycleStore
        publish: Callable[[LifecycleEvent], None]
        if is_postgres_url(config.database):
            # Replicas: a commit only wakes the tail, which publishes the event table
            # by cursor, in sequence order, whichever replica committed (tail.py).
            postgres = await PostgresLifecycleStore.open(config.database, commits=metrics.commit)
            store = postgres
            undo.push_async_callback(postgres.close)
            start_after = await postgres.latest_sequence()
            announcer = postgres.announcer
            tailer = Tailer(postgres.events_since, _sequence_of, publisher(broker), start_after, announcer.announce)
            background.add("event-announce", announcer.run)
            background.add("event-tail", lambda: tailer.run(postgres.notifications()))
            publish, replay_interval = (lambda event: tailer.poke()), REPLICA_REPLAY_INTERVAL
        else:
            sqlite = await SqliteLifecycleStore.open(config.database, commits=metrics.commit)
            store = sqlite
            undo.push_async_callback(sqlite.close)
            publish, replay_interval = publisher(broker), None
            runtime.add_integrity_check(background, config.integrity_check, sqlite.check_integrity, metrics)
        authority = LifecycleAuthority(
            store,
            Policy(max_clock_offset_micros=config.max_clock_offset_ms * 1000),
            clock,
            publish=publish,
            faults=faults,
            replay_interval=replay_interval,
            metrics=LifecycleMetrics(metrics.registry),
            # Stable across restarts in place (one process per host and port): a replica
            # restarted after a crash takes its claimed propagations back at once;
            # those of a replica that is gone lapse with their lease.
            owner=f"lifecycle@{socket.gethostname()}:{port}",
        )
        quota = WatchQuota(Reason, config.max_watchers_per_caller, config.max_watchers_per_workspace)
        service = LifecycleService(authority, broker, quota, config.max_message_bytes)
        boundary.add(server, lifecycle_grpc.add_TaskLifecycleServiceServicer_to_server, service)
        health = runtime.Health(server, [SERVICE_NAME])
        if config.reflection:
            runtime.enable_reflection(
                server, [SERVICE_NAME], [lifecycle_service_pb2.DESCRIPTOR, lifecycle_errors.DESCRIPTOR]
            )
        reloader = runtime.reloader(security)
        background.add("health-probe", lambda: health.probe_forever(store.check_writable, config.health_interval))
        background.add("propagations", authority.deliver_forever)
        background.add(
            "request-id-sweeper",
            idempotency.sweeper(authority.sweep_request_ids, clock, config.request_id_retention_seconds),
        )
        background.add("reload", reloader.run_forever)

        async def refresh() -> None:
            figures = await store.read(lambda tx: tx.load_figures())
            metrics.refresh_store(figures.request_ids, figures.database_bytes, broker.subscriber_count)
            authority.metrics.refresh(figures)

        endpoint = await runtime.serve_metrics(
            config.metrics_listen, metrics, background, refresh, config.metrics_interval
        )
        if endpoint is not None:
            undo.push_async_callback(endpoint.stop)
        await server.start()
        background.start()
        undo.pop_all()
        return RunningLifecycle(
            server,
            port,
            authority,
            store,
            health,
            broker,
            background,
            reloader,
            metrics=metrics,
            metrics_endpoint=endpoint,
        )


def _sequence_of(event: LifecycleEvent) -> int:
    return event.sequence


def parse_args(argv: list[str] | None = None) -> LifecycleConfig:
    defaults = LifecycleConfig()

    def e(name: str, default: object) -> str:
        return runtime.env_or(ENV_PREFIX, name, str(default))

    parser = argparse.ArgumentParser(prog="lifecycle-service", description="The task lifecycle authority (gRPC).")
    runtime.add_common_arguments(parser, ENV_PREFIX, defaults.listen, defaults.database)
    parser.add_argument(
        "--completion-identity",
        default=e("completion_identity", defaults.security.completion_identity),
        help="the completion service's identity: the URI SAN of its client certificate (or the `sub` of its "
        f"service token where client certificates are not verified) ({ENV_PREFIX}_COMPLETION_IDENTITY)",
    )
    parser.add_argument(
        "--max-clock-offset-ms",
        type=int,
        default=int(e("max_clock_offset_ms", defaults.max_clock_offset_ms)),
        help="a completion passes a cancellation fence only if it predates it by more than this "
        f"({ENV_PREFIX}_MAX_CLOCK_OFFSET_MS)",
    )
    args = parser.parse_args(argv)
    runtime.configure_logging(args.log_level, args.log_format)
    if args.max_clock_offset_ms < 0:
        parser.error("--max-clock-offset-ms must not be negative")
    return LifecycleConfig(
        listen=args.listen,
        database=args.database,
        security=security_settings.from_arguments(args, args.completion_identity),
        max_clock_offset_ms=args.max_clock_offset_ms,
        max_message_bytes=args.max_message_bytes,
        reflection=args.reflection,
        watch_buffer=args.watch_buffer,
        max_watchers_per_caller=args.max_watchers_per_caller,
        max_watchers_per_workspace=args.max_watchers_per_workspace,
        request_id_retention_seconds=args.request_id_retention,
        health_interval=args.health_interval,
        integrity_check=args.integrity_check,
        shutdown_grace=args.shutdown_grace,
        metrics_listen=args.metrics_listen,
        metrics_interval=args.metrics_interval,
    )


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    runtime.serve_process(
        "lifecycle_service", lambda: start(config), config.listen, config.shutdown_grace, (StorageRefused,)
    )


if __name__ == "__main__":
    main()
