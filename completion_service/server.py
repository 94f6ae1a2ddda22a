"""Runs the completion service: `completion-service --help` lists the flags; each
has an environment variable `FUNNEL_COMPLETION_<FLAG>`.

`--database` is a SQLite file (the default; one process) or a `postgresql://`
URL, on which any number of replicas may serve at once: each feeds its watchers
from the completion event table (funnel.runtime.tail), and each runs the
settlement outbox, the stall sweeper and the request-id sweeper, which claim
their rows in the database (storage/postgres/)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from completion_service.api.service import SERVICE_NAME, CompletionService, publisher
from completion_service.api.transcript_service import SERVICE_NAME as TRANSCRIPT_SERVICE
from completion_service.api.transcript_service import TranscriptService
from completion_service.authority import CompletionAuthority, Metrics
from completion_service.clients.external_gates import ExternalGates
from completion_service.clients.lifecycle_client import LifecycleClient
from completion_service.clients.outbound import GateChannels, LifecycleChannel, OutboundRefused, OutboundSecurity, check
from completion_service.core.model import CompletionEvent
from completion_service.errors import DOMAIN, Reason
from completion_service.policy import PolicyBook, PolicyError, load_policy
from completion_service.storage.port import CompletionStore
from completion_service.storage.postgres import PostgresCompletionStore
from completion_service.storage.sqlite import SqliteCompletionStore
from funnel.auth.tls import ClientTlsFiles, TlsError
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import completion_service_pb2, gate_service_pb2, transcript_service_pb2
from funnel.completion.v1 import completion_service_pb2_grpc as completion_grpc
from funnel.completion.v1 import errors_pb2 as completion_errors
from funnel.completion.v1 import transcript_service_pb2_grpc as transcript_grpc
from funnel.runtime import idempotency
from funnel.runtime import security as security_settings
from funnel.runtime import server as runtime
from funnel.runtime.background import Background
from funnel.runtime.budget import ByteBudget
from funnel.runtime.clock import Clock, IdSource, RandomIds, SystemClock
from funnel.runtime.faults import from_environment
from funnel.runtime.metrics import DEFAULT_REFRESH_INTERVAL, MetricsEndpoint, ServiceMetrics
from funnel.runtime.postgres import is_postgres_url
from funnel.runtime.security import Reloader, SecurityRefused, ServerSecurity
from funnel.runtime.shutdown import Drain
from funnel.runtime.storage_errors import StorageRefused
from funnel.runtime.tail import Tailer
from funnel.runtime.watch import EventBroker, WatchQuota

ENV_PREFIX = "FUNNEL_COMPLETION"


@dataclass(frozen=True)
class CompletionConfig:
    listen: str = "127.0.0.1:50052"
    database: str = "completion.sqlite3"
    security: ServerSecurity = field(default_factory=ServerSecurity)
    lifecycle_address: str = "127.0.0.1:50051"
    outbound: OutboundSecurity = field(default_factory=OutboundSecurity)
    lifecycle_timeout: float = 5.0
    # Seconds between pings on the connection to the lifecycle service while a call
    # is open; a ping unanswered as long ends the connection (outbound.keepalive_options).
    lifecycle_keepalive: float = 20.0
    # Workspaces whose lifecycle records are projected from the event stream (one
    # stream each, under the lifecycle's cap of watchers per caller, which every
    # replica shares); 0: every attempt reads its task from the lifecycle service.
    projected_workspaces: int = 16
    policy_file: str | None = None
    settle_interval: float = 0.5
    stall_after: float | None = None
    max_message_bytes: int = 4 * 1024 * 1024
    reflection: bool = False
    watch_buffer: int = runtime.WATCH_BUFFER
    max_watchers_per_caller: int = runtime.MAX_WATCHERS_PER_CALLER
    max_watchers_per_workspace: int = runtime.MAX_WATCHERS_PER_WORKSPACE
    # What transcript imports in flight may hold together, and one caller's and one
    # workspace's share of it; each import holds at least the message limit.
    import_buffer_bytes: int = 64 * 1024 * 1024
    import_buffer_per_caller_bytes: int = 16 * 1024 * 1024
    import_buffer_per_workspace_bytes: int = 32 * 1024 * 1024
    request_id_retention_seconds: float = idempotency.DEFAULT_RETENTION_SECONDS
    health_interval: float = 2.0
    # SQLite: the full integrity check after SERVING ("after-start") or none ("off").
    integrity_check: str = runtime.INTEGRITY_AFTER_START
    shutdown_grace: float = 5.0
    # Where /metrics is served (None: nowhere); how often database figures are read for it.
    metrics_listen: str | None = None
    metrics_interval: float = DEFAULT_REFRESH_INTERVAL


@dataclass
class RunningCompletion:
    server: grpc.aio.Server
    port: int
    authority: CompletionAuthority
    store: CompletionStore
    health: runtime.Health
    lifecycle_channel: LifecycleChannel
    gate_channels: GateChannels
    background: Background
    reloader: Reloader
    broker: EventBroker[completion_messages.WatchCompletionEventsResponse]
    drain: Drain
    metrics: ServiceMetrics
    metrics_endpoint: MetricsEndpoint | None
    import_budget: ByteBudget

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace: float | None = None) -> None:
        """Stops accepting calls and lets unary ones finish within `grace`; watch
        streams end at once (SERVER_SHUTTING_DOWN, with their cursor), and an
        import still sending ends just before the grace does, importing nothing
        (funnel.runtime.shutdown)."""
        await self.health.stop()
        self.broker.close()
        self.drain.begin(grace)
        await self.server.stop(grace)
        await self.background.stop()
        if self.metrics_endpoint is not None:
            await self.metrics_endpoint.stop()
        await self.gate_channels.close()
        await self.lifecycle_channel.close()
        await self.store.close()


async def start(
    config: CompletionConfig,
    clock: Clock | None = None,
    ids: IdSource | None = None,
    policies: PolicyBook | None = None,
) -> RunningCompletion:
    clock = clock or SystemClock()
    ids = ids or RandomIds()
    policies = policies if policies is not None else load_policy(config.policy_file)
    security = security_settings.prepare(config.security, config.listen, config.max_message_bytes)
    check(config.outbound, config.lifecycle_address, [gate.address for gate in policies.external_gates()])
    try:
        gate_channels = GateChannels(config.outbound)  # opens channels only when a gate is called
        if not config.outbound.lifecycle_insecure:
            config.outbound.lifecycle_tls.load()  # unusable TLS files refuse the start here
    except TlsError as exc:
        raise OutboundRefused(str(exc)) from None
    # What start opens, start closes again if a later step raises: otherwise the
    # database's thread (not a daemon) keeps a process that refused to start alive.
    async with contextlib.AsyncExitStack() as undo:
        undo.push_async_callback(gate_channels.close)
        metrics = ServiceMetrics()
        server, boundary = runtime.new_server(security, DOMAIN, Reason, metrics.rpc)
        port = runtime.bind(server, config.listen, security)
        undo.push_async_callback(runtime.release, server)
        broker: EventBroker[completion_messages.WatchCompletionEventsResponse] = EventBroker(config.watch_buffer)
        faults = from_environment()
        background = Background("completion_service")
        store: CompletionStore
        publish: Callable[[list[CompletionEvent]], None]
        if is_postgres_url(config.database):
            # Replicas: a commit only wakes the tail, which publishes the event table
            # by cursor, in sequence order, whichever replica committed (tail.py).
            postgres = await PostgresCompletionStore.open(config.database, commits=metrics.commit)
            store = postgres
            undo.push_async_callback(postgres.close)
            tailer = Tailer(
                postgres.events_since,
                _sequence_of,
                _one_by_one(publisher(broker)),
                await postgres.latest_sequence(),
                announce=postgres.announcer.announce,
            )
            background.add("event-tail", lambda: tailer.run(postgres.notifications()))
            background.add("event-announce", postgres.announcer.run)
            publish = lambda events: tailer.poke() if events else None  # noqa: E731
        else:
            sqlite = await SqliteCompletionStore.open(config.database, commits=metrics.commit)
            store = sqlite
            undo.push_async_callback(sqlite.close)
            publish = publisher(broker)
            runtime.add_integrity_check(background, config.integrity_check, sqlite.check_integrity, metrics)
        lifecycle_channel = LifecycleChannel(config.lifecycle_address, config.outbound, config.lifecycle_keepalive)
        undo.push_async_callback(lifecycle_channel.close)
        authority = CompletionAuthority(
            store,
            LifecycleClient(lifecycle_channel, timeout=config.lifecycle_timeout),
            policies,
            clock,
            ExternalGates(gate_channels),
            ids=ids,
            publish=publish,
            settle_interval=config.settle_interval,
            # A claimed settlement is another replica's again after a few settle calls' time.
            settle_lease=max(4 * config.lifecycle_timeout, 1.0),
            stall_after=config.stall_after,
            faults=faults,
            projected_workspaces=config.projected_workspaces,
            metrics=Metrics(metrics.registry),
        )
        await authority.transcripts.discard_import(None)
        quota = WatchQuota(Reason, config.max_watchers_per_caller, config.max_watchers_per_workspace)
        completion = CompletionService(authority, broker, quota, config.max_message_bytes)
        boundary.add(server, completion_grpc.add_CompletionServiceServicer_to_server, completion)
        drain = Drain()
        budget = ByteBudget(
            config.import_buffer_bytes, config.import_buffer_per_caller_bytes, config.import_buffer_per_workspace_bytes
        )
        authority.metrics.import_buffer.set_function(lambda: budget.used)
        transcripts = TranscriptService(authority, ids, budget, drain, config.max_message_bytes)
        boundary.add(server, transcript_grpc.add_TranscriptServiceServicer_to_server, transcripts)
        health = runtime.Health(server, [SERVICE_NAME, TRANSCRIPT_SERVICE])
        if config.reflection:
            # The gate's service is described (gates are written against it), not listed.
            described = [
                completion_service_pb2.DESCRIPTOR,
                transcript_service_pb2.DESCRIPTOR,
                gate_service_pb2.DESCRIPTOR,
                completion_errors.DESCRIPTOR,
            ]
            runtime.enable_reflection(server, [SERVICE_NAME, TRANSCRIPT_SERVICE], described)
        reloader = runtime.reloader(security, lifecycle_channel, gate_channels)
        background.add("health-probe", lambda: health.probe_forever(store.check_writable, config.health_interval))
        for name, worker in authority.workers(config.request_id_retention_seconds):
            background.add(name, worker)
        background.add("reload", reloader.run_forever)

        async def refresh() -> None:
            now = clock.now_micros()
            figures = await store.read(lambda tx: tx.load_figures(now))
            metrics.refresh_store(figures.request_ids, figures.database_bytes, broker.subscriber_count)
            authority.metrics.refresh(figures, now)

        endpoint = await runtime.serve_metrics(
            config.metrics_listen, metrics, background, refresh, config.metrics_interval
        )
        if endpoint is not None:
            undo.push_async_callback(endpoint.stop)
        await server.start()
        background.start()
        undo.pop_all()
        return RunningCompletion(
            server,
            port,
            authority,
            store,
            health,
            lifecycle_channel,
            gate_channels,
            background,
            reloader,
            broker,
            drain,
            metrics=metrics,
            metrics_endpoint=endpoint,
            import_budget=budget,
        )


def _sequence_of(event: CompletionEvent) -> int:
    return event.sequence


def _one_by_one(publish: Callable[[list[CompletionEvent]], None]) -> Callable[[CompletionEvent], None]:
    return lambda event: publish([event])


def parse_args(argv: list[str] | None = None) -> CompletionConfig:
    d = CompletionConfig()

    def e(name: str, default: object) -> str:
        return runtime.env_or(ENV_PREFIX, name, str(default))

    parser = argparse.ArgumentParser(prog="completion-service", description="The semantic completion authority (gRPC).")
    runtime.add_common_arguments(parser, ENV_PREFIX, d.listen, d.database)
    parser.add_argument(
        "--lifecycle-address",
        default=e("lifecycle_address", d.lifecycle_address),
        help=f"the lifecycle service ({ENV_PREFIX}_LIFECYCLE_ADDRESS)",
    )
    parser.add_argument(
        "--lifecycle-timeout",
        type=float,
        default=float(e("lifecycle_timeout", d.lifecycle_timeout)),
        help=f"deadline in seconds of each lifecycle call ({ENV_PREFIX}_LIFECYCLE_TIMEOUT)",
    )
    parser.add_argument(
        "--lifecycle-keepalive",
        type=float,
        default=float(e("lifecycle_keepalive", d.lifecycle_keepalive)),
        help="seconds between pings to the lifecycle service while a call is open; one unanswered as long "
        f"ends the connection (a frozen service, a dead link); at least 1 ({ENV_PREFIX}_LIFECYCLE_KEEPALIVE)",
    )
    parser.add_argument(
        "--projected-workspaces",
        type=int,
        default=int(e("projected_workspaces", d.projected_workspaces)),
        help="workspaces whose lifecycle records attempts read from a projection kept current by the lifecycle "
        f"event stream, one stream each; 0 reads every attempt's task from the lifecycle service "
        f"({ENV_PREFIX}_PROJECTED_WORKSPACES)",
    )
    parser.add_argument(
        "--policy-file",
        default=runtime.env_or(ENV_PREFIX, "policy_file", "") or None,
        help=f"TOML gate policy per workspace ({ENV_PREFIX}_POLICY_FILE)",
    )
    parser.add_argument(
        "--settle-interval",
        type=float,
        default=float(e("settle_interval", d.settle_interval)),
        help=f"seconds between outbox settler passes ({ENV_PREFIX}_SETTLE_INTERVAL)",
    )
    parser.add_argument(
        "--stall-after",
        type=float,
        default=float(e("stall_after", 0)) or None,
        help=f"close runs whose lease expired this many seconds ago as STALLED; off when 0 ({ENV_PREFIX}_STALL_AFTER)",
    )
    parser.add_argument(
        "--import-buffer-bytes",
        type=int,
        default=int(e("import_buffer_bytes", d.import_buffer_bytes)),
        help=f"bytes all transcript imports in flight may buffer together ({ENV_PREFIX}_IMPORT_BUFFER_BYTES)",
    )
    for scope in ("caller", "workspace"):
        name = f"import_buffer_per_{scope}_bytes"
        parser.add_argument(
            f"--import-buffer-per-{scope}-bytes",
            type=int,
            default=int(e(name, getattr(d, name))),
            help=f"of those, what the imports of one {scope} may hold ({ENV_PREFIX}_{name.upper()})",
        )
    outbound = parser.add_argument_group("outbound security (docs/security.md)")
    outbound.add_argument(
        "--lifecycle-ca",
        default=e("lifecycle_ca", "") or None,
        help="PEM CA bundle that signed the lifecycle service's certificate (default: system roots)",
    )
    outbound.add_argument(
        "--lifecycle-server-name",
        default=e("lifecycle_server_name", "") or None,
        help="name to verify in the lifecycle service's certificate, if not the address's host",
    )
    outbound.add_argument(
        "--lifecycle-insecure",
        action="store_true",
        default=e("lifecycle_insecure", "") in ("1", "true", "yes"),
        help="plaintext to the lifecycle service; refused unless its address is loopback",
    )
    outbound.add_argument(
        "--identity-cert",
        default=e("identity_cert", "") or None,
        help="this service's client certificate (URI SAN = the lifecycle's --completion-identity)",
    )
    outbound.add_argument("--identity-key", default=e("identity_key", "") or None, help="the key of --identity-cert")
    outbound.add_argument(
        "--identity-token-file",
        default=e("identity_token_file", "") or None,
        help="file with this service's bearer token for the lifecycle service (never sent to gates)",
    )
    outbound.add_argument(
        "--gate-ca", default=e("gate_ca", "") or None, help="PEM CA bundle of external gates (default: system roots)"
    )
    outbound.add_argument(
        "--gates-insecure",
        action="store_true",
        default=e("gates_insecure", "") in ("1", "true", "yes"),
        help="plaintext to external gates; refused unless each gate address is loopback",
    )
    args = parser.parse_args(argv)
    if args.projected_workspaces < 0:
        parser.error("--projected-workspaces must be 0 (off) or more")
    if args.lifecycle_keepalive < 1:
        parser.error("--lifecycle-keepalive must be at least 1 (second)")
    runtime.configure_logging(args.log_level, args.log_format)
    return CompletionConfig(
        listen=args.listen,
        database=args.database,
        security=security_settings.from_arguments(args),
        lifecycle_address=args.lifecycle_address,
        outbound=OutboundSecurity(
            lifecycle_tls=ClientTlsFiles(
                args.lifecycle_ca, args.identity_cert, args.identity_key, args.lifecycle_server_name
            ),
            lifecycle_insecure=args.lifecycle_insecure,
            identity_token_file=args.identity_token_file,
            gate_ca=args.gate_ca,
            gates_insecure=args.gates_insecure,
        ),
        lifecycle_timeout=args.lifecycle_timeout,
        lifecycle_keepalive=args.lifecycle_keepalive,
        projected_workspaces=args.projected_workspaces,
        policy_file=args.policy_file,
        settle_interval=args.settle_interval,
        stall_after=args.stall_after,
        max_message_bytes=args.max_message_bytes,
        reflection=args.reflection,
        watch_buffer=args.watch_buffer,
        max_watchers_per_caller=args.max_watchers_per_caller,
        max_watchers_per_workspace=args.max_watchers_per_workspace,
        import_buffer_bytes=args.import_buffer_bytes,
        import_buffer_per_caller_bytes=args.import_buffer_per_caller_bytes,
        import_buffer_per_workspace_bytes=args.import_buffer_per_workspace_bytes,
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
        "completion_service",
        lambda: start(config),
        config.listen,
        config.shutdown_grace,
        (StorageRefused, PolicyError, OutboundRefused, SecurityRefused),
    )


if __name__ == "__main__":
    main()
