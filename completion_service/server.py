"""Runs the completion service: `completion-service --help` lists the flags; each
has an environment variable `FUNNEL_COMPLETION_<FLAG>`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import grpc

from completion_service.authority import CompletionAuthority
from completion_service.errors import DOMAIN, Reason
from completion_service.lifecycle_client import LifecycleClient
from completion_service.policy import PolicyBook, PolicyError, load_policy
from completion_service.service import SERVICE_NAME, CompletionService, publisher
from completion_service.storage.sqlite import SqliteCompletionStore
from completion_service.transcript_service import SERVICE_NAME as TRANSCRIPT_SERVICE
from completion_service.transcript_service import TranscriptService
from funnel.completion.v1 import completion_pb2_grpc, transcript_pb2_grpc
from funnel.runtime import server as runtime
from funnel.runtime.clock import Clock, IdSource, RandomIds, SystemClock
from funnel.runtime.faults import from_environment
from funnel.runtime.storage_errors import StorageRefused
from funnel.runtime.watch import EventBroker

ENV_PREFIX = "FUNNEL_COMPLETION"
# gRPC's default reconnect backoff grows to 120 s: after a lifecycle outage the
# settlement outbox and every claim would keep failing fast for up to two minutes
# although the lifecycle service is back. Reconnect within a second or two instead.
LIFECYCLE_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


@dataclass(frozen=True)
class CompletionConfig:
    listen: str = "127.0.0.1:50052"
    database: str = "completion.sqlite3"
    lifecycle_address: str = "127.0.0.1:50051"
    lifecycle_timeout: float = 5.0
    policy_file: str | None = None
    settle_interval: float = 0.5
    stall_after: float | None = None
    max_message_bytes: int = 4 * 1024 * 1024
    reflection: bool = False
    watch_buffer: int = 1024
    health_interval: float = 2.0
    shutdown_grace: float = 5.0


@dataclass
class RunningCompletion:
    server: grpc.aio.Server
    port: int
    authority: CompletionAuthority
    store: SqliteCompletionStore
    health: runtime.Health
    lifecycle_channel: grpc.aio.Channel

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace: float | None = None) -> None:
        await self.health.stop()
        await self.server.stop(grace)
        await self.authority.stop()
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
    server = runtime.new_server(config.max_message_bytes, DOMAIN, Reason, "/funnel.completion.v1.")
    port = runtime.bind(server, config.listen)
    broker: EventBroker = EventBroker(config.watch_buffer)
    faults = from_environment()
    store = await SqliteCompletionStore.open(config.database, clock, ids, publisher(broker), faults)
    await store.discard_all_imports()
    channel = grpc.aio.insecure_channel(config.lifecycle_address, options=LIFECYCLE_CHANNEL_OPTIONS)
    authority = CompletionAuthority(
        store,
        LifecycleClient(channel, timeout=config.lifecycle_timeout),
        policies,
        clock,
        settle_interval=config.settle_interval,
        stall_after=config.stall_after,
        faults=faults,
    )
    completion = CompletionService(authority, broker, config.max_message_bytes)
    completion_pb2_grpc.add_CompletionServiceServicer_to_server(completion, server)
    transcripts = TranscriptService(authority, ids, config.max_message_bytes)
    transcript_pb2_grpc.add_TranscriptServiceServicer_to_server(transcripts, server)
    health = runtime.Health(server, [SERVICE_NAME, TRANSCRIPT_SERVICE])
    if config.reflection:
        runtime.enable_reflection(server, [SERVICE_NAME, TRANSCRIPT_SERVICE])
    await server.start()
    health.start(store.check_writable, config.health_interval)
    authority.start()
    return RunningCompletion(server, port, authority, store, health, channel)


def parse_args(argv: list[str] | None = None) -> CompletionConfig:
    d = CompletionConfig()
    e = lambda name, default: runtime.env_or(ENV_PREFIX, name, str(default))  # noqa: E731
    parser = argparse.ArgumentParser(prog="completion-service", description="The semantic completion authority (gRPC).")
    runtime.add_common_arguments(parser, ENV_PREFIX, d.listen, d.database)
    parser.add_argument("--lifecycle-address", default=e("lifecycle_address", d.lifecycle_address),
                        help=f"the lifecycle service ({ENV_PREFIX}_LIFECYCLE_ADDRESS)")
    parser.add_argument("--lifecycle-timeout", type=float, default=float(e("lifecycle_timeout", d.lifecycle_timeout)),
                        help=f"deadline in seconds of each lifecycle call ({ENV_PREFIX}_LIFECYCLE_TIMEOUT)")
    parser.add_argument("--policy-file", default=runtime.env_or(ENV_PREFIX, "policy_file", "") or None,
                        help=f"TOML gate policy per workspace ({ENV_PREFIX}_POLICY_FILE)")
    parser.add_argument("--settle-interval", type=float, default=float(e("settle_interval", d.settle_interval)),
                        help=f"seconds between outbox settler passes ({ENV_PREFIX}_SETTLE_INTERVAL)")
    parser.add_argument("--stall-after", type=float, default=float(e("stall_after", 0)) or None,
                        help="close runs whose lease expired this many seconds ago as STALLED; off when 0 "
                        f"({ENV_PREFIX}_STALL_AFTER)")
    parser.add_argument("--watch-buffer", type=int, default=int(e("watch_buffer", d.watch_buffer)),
                        help=f"events a watch stream may fall behind before it is ended ({ENV_PREFIX}_WATCH_BUFFER)")
    args = parser.parse_args(argv)
    runtime.configure_logging(args.log_level)
    return CompletionConfig(
        listen=args.listen,
        database=args.database,
        lifecycle_address=args.lifecycle_address,
        lifecycle_timeout=args.lifecycle_timeout,
        policy_file=args.policy_file,
        settle_interval=args.settle_interval,
        stall_after=args.stall_after,
        max_message_bytes=args.max_message_bytes,
        reflection=args.reflection,
        watch_buffer=args.watch_buffer,
        health_interval=args.health_interval,
        shutdown_grace=args.shutdown_grace,
    )


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    runtime.serve_process(
        "completion_service", lambda: start(config), config.listen, config.shutdown_grace, (StorageRefused, PolicyError)
    )


if __name__ == "__main__":
    main()
