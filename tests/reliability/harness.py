"""Real service processes for the reliability tests: both services started with
`python -m …` over SQLite files, each with a fault control file
(FUNNEL_FAULTS_FILE, see funnel/runtime/faults.py) so that a long-lived process
can be armed and disarmed between runs without a restart; a crashed process is
restarted on the same port, disarmed. Client calls retry with the same request
(and so the same request_id) while a service does not answer."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psycopg

from funnel.completion.v1 import completion_service_pb2_grpc as completion_grpc
from funnel.completion.v1 import transcript_service_pb2_grpc as transcript_grpc
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.runtime.grpc_errors import error_info
from funnel.runtime.postgres import SqliteStyle
from funnel_cli.supervisor import ServiceProcess, completion_tls_arguments, lifecycle_tls_arguments, spawn
from tests import credentials

CALL_TIMEOUT = 5.0
# How long a call keeps retrying while a service does not answer.
RETRY_WINDOW = 30.0
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
FAULT_LINE = b"fault injected: "
# A fresh channel per restart, with its own subchannels (gRPC shares them between
# channels by default, and a shared one may still be backing off from the crash).
CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 50),
    # (Not grpc.min_reconnect_backoff_ms: it is also the time a connection attempt is
    # given, and 50 ms timed out against a service on a loaded machine.)
    ("grpc.max_reconnect_backoff_ms", 500),
]
POLICY = '[defaults]\nrequired_evidence = ["tests"]\nbreaker_threshold = 3\n'


# A crashed service restarts on its port, which must stay free meanwhile: ports
# below the kernel's ephemeral range are never handed to another process's
# outgoing connection or port-0 listener (both common in a parallel test run).
_PORTS = range(20000, 32000)


def unused_port() -> int:
    for _ in range(100):
        port = random.choice(_PORTS)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


class Exhausted(Exception):
    """A call got no answer within RETRY_WINDOW: its fate is unknown."""


@dataclass
class Service:
    name: str
    module: str
    database: Path | PostgresSchema
    log_path: Path
    control: Path
    extra_args: list[str]
    port: int = 0
    process: ServiceProcess | None = None
    starts: int = 0

    def args(self) -> list[str]:
        return ["--listen", f"127.0.0.1:{self.port}", "--database", str(self.database), *self.extra_args]

    def start(self) -> None:
        env = {"FUNNEL_FAULTS_FILE": str(self.control), "FUNNEL_FAULTS": ""}
        if not self.port:
            self.port = unused_port()
        if self.process is not None:  # a restart: reap the one that died, close its pipe
            self.process.kill()
        self.process = spawn(self.name, self.module, self.args(), self.log_path, env)
        self.port = int(self.process.address.rsplit(":", 1)[1])
        self.starts += 1

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.process.poll() is None

    def returncode(self) -> int | None:
        return None if self.process is None else self.process.process.poll()

    def arm(self, spec: str) -> None:
        # A new file (new inode) each time, so the service always sees the change.
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(spec, encoding="utf-8")
        os.replace(tmp, self.control)

    def disarm(self) -> None:
        self.arm("")

    def faults_fired(self) -> int:
        try:
            return self.log_path.read_bytes().count(FAULT_LINE)
        except FileNotFoundError:
            return 0

    def kill(self) -> None:
        if self.process is not None and self.alive():
            self.process.kill()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=5)


class Pair:
    """Both services over SQLite files in `directory` (or, given `database_url`,
    both on that PostgreSQL database, each in its schema), and client stubs to them."""

    def __init__(
        self,
        directory: Path,
        *,
        lifecycle_args: list[str] = (),
        completion_args: list[str] = (),
        database_url: str | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        policy = directory / "policy.toml"
        policy.write_text(POLICY, encoding="utf-8")
        self.lifecycle = Service(
            "lifecycle_service",
            "lifecycle_service",
            PostgresSchema(database_url, "funnel_lifecycle") if database_url else directory / "lifecycle.sqlite3",
            directory / "lifecycle.log",
            directory / "lifecycle.faults",
            [],
        )
        self._lifecycle_args = list(lifecycle_args)
        self.completion = Service(
            "completion_service",
            "completion_service",
            PostgresSchema(database_url, "funnel_completion") if database_url else directory / "completion.sqlite3",
            directory / "completion.log",
            directory / "completion.faults",
            [],
        )
        self._completion_args = list(completion_args)
        self._channels: list[grpc.aio.Channel] = []
        self._retired: list[grpc.aio.Channel] = []
        self._restart_lock = asyncio.Lock()
        self.restarts = 0
        self.crashes = 0
        self.lc = self.cs = self.ts = None

    def service(self, point: str) -> Service:
        return self.lifecycle if point.startswith("lifecycle.") else self.completion

    async def start(self) -> Pair:
        for service in (self.lifecycle, self.completion):
            service.disarm()
        self.lifecycle.extra_args = [*lifecycle_tls_arguments(credentials.PKI), *self._lifecycle_args]
        self.lifecycle.start()
        self.completion.extra_args = [
            *completion_tls_arguments(credentials.PKI),
            "--lifecycle-address",
            self.lifecycle.address,
            "--settle-interval",
            "0.05",
            "--lifecycle-timeout",
            "1",
            "--policy-file",
            str(self.directory / "policy.toml"),
            *self._completion_args,
        ]
        self.completion.start()
        await self._connect()
        return self

    async def _connect(self) -> None:
        # Old channels are closed only at the end: a concurrent call may still be
        # on one, and closing it would cancel that call instead of failing it.
        self._retired += self._channels
        # TLS with the test PKI. Towards the lifecycle service the test presents the
        # completion service's certificate with the test token: every role, so
        # that it can drive each intent a host or the completion service sends.
        lifecycle = credentials.tls_channel(self.lifecycle.address, options=CHANNEL_OPTIONS)
        completion = credentials.tls_channel(self.completion.address, identity=None, options=CHANNEL_OPTIONS)
        self._channels = [lifecycle, completion]
        self.lc = lifecycle_grpc.TaskLifecycleServiceStub(lifecycle)
        self.cs = completion_grpc.CompletionServiceStub(completion)
        self.ts = transcript_grpc.TranscriptServiceStub(completion)

    async def ensure_alive(self) -> bool:
        """Restarts (disarmed, same port) every service that died; True if any did."""
        async with self._restart_lock:
            restarted = False
            for service in (self.lifecycle, self.completion):
                if not service.alive():
                    if service.returncode() == -9:
                        self.crashes += 1
                    service.disarm()
                    service.start()
                    restarted = True
                    self.restarts += 1
            if restarted:
                await self._connect()
            return restarted

    async def call(self, invoke, *, window: float = RETRY_WINDOW):
        """invoke(pair) -> awaitable call; retried with the same request while the
        answer is UNAVAILABLE or DEADLINE_EXCEEDED (restarting dead services).
        Returns the response, or raises the final AioRpcError, or Exhausted."""
        deadline = time.monotonic() + window
        delay = 0.01
        while True:
            try:
                return await invoke(self)
            except grpc.aio.AioRpcError as error:
                if not retryable(error):
                    raise
                last = error
            await self.ensure_alive()
            if time.monotonic() > deadline:
                raise Exhausted(f"{last.code().name}: {last.details()}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    async def stop(self) -> None:
        for channel in self._retired + self._channels:
            await channel.close()
        self._channels, self._retired = [], []
        for service in (self.completion, self.lifecycle):
            service.stop()


def retryable(error: grpc.aio.AioRpcError) -> bool:
    if error.code() in RETRYABLE:
        return True
    # A connection torn down by a killed server can surface as an error without
    # any ErrorInfo of ours; a service's own INTERNAL always carries one.
    return error.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED) and (
        error_info(error) is None
    )


@dataclass(frozen=True)
class PostgresSchema:
    """A service's database on PostgreSQL: the URL and the service's schema."""

    url: str
    schema: str

    def __str__(self) -> str:
        return self.url


class PostgresReader:
    """What the checks need of a read-only sqlite3 connection (`execute` with `?`
    placeholders, iterable results, `close`), over one PostgreSQL snapshot."""

    def __init__(self, location: PostgresSchema) -> None:
        self._conn = psycopg.connect(location.url, autocommit=False, options=f"-c search_path={location.schema}")
        self._conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        self._sql = SqliteStyle(self._conn)

    def execute(self, sql: str, params: tuple = ()) -> psycopg.Cursor:
        return self._sql.execute(sql, params)

    def close(self) -> None:
        self._conn.rollback()
        self._conn.close()


def read_only(database: Path | PostgresSchema) -> sqlite3.Connection | PostgresReader:
    """A read-only connection to a live service's database (WAL: readers never
    block it; PostgreSQL: one snapshot)."""
    if isinstance(database, PostgresSchema):
        return PostgresReader(database)
    db = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10)
    db.execute("PRAGMA query_only=ON")
    return db


@dataclass
class Totals:
    runs: int = 0
    faults: int = 0
    crashes: int = 0
    drops: int = 0
    lost: int = 0
    duplicated: int = 0
    violations: list[str] = field(default_factory=list)

    def add(self, other: Totals) -> None:
        self.runs += other.runs
        self.faults += other.faults
        self.crashes += other.crashes
        self.drops += other.drops
        self.lost += other.lost
        self.duplicated += other.duplicated
        self.violations += other.violations
