"""Runs the lifecycle service: `lifecycle-service --help` lists the flags; each
has an environment variable `FUNNEL_LIFECYCLE_<FLAG>`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import grpc

from funnel.lifecycle.v1 import lifecycle_pb2_grpc
from funnel.runtime import server as runtime
from funnel.runtime.clock import Clock, SystemClock
from funnel.runtime.faults import from_environment
from funnel.runtime.storage_errors import StorageRefused
from funnel.runtime.watch import EventBroker
from lifecycle_service.authority import LifecycleAuthority
from lifecycle_service.core.model import Policy
from lifecycle_service.errors import DOMAIN, Reason
from lifecycle_service.service import SERVICE_NAME, LifecycleService, publisher
from lifecycle_service.storage.sqlite import SqliteLifecycleStore

ENV_PREFIX = "FUNNEL_LIFECYCLE"


@dataclass(frozen=True)
class LifecycleConfig:
    listen: str = "127.0.0.1:50051"
    database: str = "lifecycle.sqlite3"
    max_clock_offset_ms: int = 500
    max_message_bytes: int = 4 * 1024 * 1024
    reflection: bool = False
    watch_buffer: int = 1024
    health_interval: float = 2.0
    shutdown_grace: float = 5.0


@dataclass
class RunningLifecycle:
    server: grpc.aio.Server
    port: int
    authority: LifecycleAuthority
    store: SqliteLifecycleStore
    health: runtime.Health
    broker: EventBroker

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace: float | None = None) -> None:
        await self.health.stop()
        await self.server.stop(grace)
        await self.authority.stop()
        await self.store.close()


async def start(config: LifecycleConfig, clock: Clock | None = None) -> RunningLifecycle:
    """Opens the database (refusing unsafe ones), starts serving and replays pending propagations."""
    server = runtime.new_server(config.max_message_bytes, DOMAIN, Reason, f"/{SERVICE_NAME}/")
    port = runtime.bind(server, config.listen)
    broker: EventBroker = EventBroker(config.watch_buffer)
    faults = from_environment()
    store = await SqliteLifecycleStore.open(config.database, clock or SystemClock(), publisher(broker), faults)
    authority = LifecycleAuthority(store, Policy(max_clock_offset_micros=config.max_clock_offset_ms * 1000), faults=faults)
    service = LifecycleService(authority, broker, config.max_message_bytes)
    lifecycle_pb2_grpc.add_TaskLifecycleServiceServicer_to_server(service, server)
    health = runtime.Health(server, [SERVICE_NAME])
    if config.reflection:
        runtime.enable_reflection(server, [SERVICE_NAME])
    await server.start()
    health.start(store.check_writable, config.health_interval)
    authority.start()
    return RunningLifecycle(server, port, authority, store, health, broker)


def parse_args(argv: list[str] | None = None) -> LifecycleConfig:
    defaults = LifecycleConfig()
    parser = argparse.ArgumentParser(prog="lifecycle-service", description="The task lifecycle authority (gRPC).")
    runtime.add_common_arguments(parser, ENV_PREFIX, defaults.listen, defaults.database)
    parser.add_argument(
        "--max-clock-offset-ms",
        type=int,
        default=int(runtime.env_or(ENV_PREFIX, "max_clock_offset_ms", str(defaults.max_clock_offset_ms))),
        help="a completion passes a cancellation fence only if it predates it by more than this "
        f"({ENV_PREFIX}_MAX_CLOCK_OFFSET_MS)",
    )
    parser.add_argument(
        "--watch-buffer",
        type=int,
        default=int(runtime.env_or(ENV_PREFIX, "watch_buffer", str(defaults.watch_buffer))),
        help=f"events a watch stream may fall behind before it is ended ({ENV_PREFIX}_WATCH_BUFFER)",
    )
    args = parser.parse_args(argv)
    runtime.configure_logging(args.log_level)
    if args.max_clock_offset_ms < 0:
        parser.error("--max-clock-offset-ms must not be negative")
    return LifecycleConfig(
        listen=args.listen,
        database=args.database,
        max_clock_offset_ms=args.max_clock_offset_ms,
        max_message_bytes=args.max_message_bytes,
        reflection=args.reflection,
        watch_buffer=args.watch_buffer,
        health_interval=args.health_interval,
        shutdown_grace=args.shutdown_grace,
    )


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    runtime.serve_process(
        "lifecycle_service", lambda: start(config), config.listen, config.shutdown_grace, (StorageRefused,)
    )


if __name__ == "__main__":
    main()
