"""Fixtures of the completion tests: `backend`, a fresh `CompletionStore` of each
storage adapter (tests/completion/backends.py) for the conformance suite; and both
real servers (lifecycle and completion) on 127.0.0.1:0 in the test process, the
lifecycle over a SQLite file under tmp_path and the completion service on each
engine (`completion_engine`: a SQLite file, or a new PostgreSQL database), sharing
one manual clock, with short settle intervals and lifecycle deadlines so that the
outbox tests are fast."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import grpc
import pytest

from completion_service.server import CompletionConfig
from completion_service.storage.port import CompletionStore
from funnel.completion.v1 import gate_service_pb2_grpc as gate_grpc
from funnel.runtime.clock import ManualClock
from lifecycle_service.server import LifecycleConfig
from tests import credentials
from tests.completion.backends import BACKENDS
from tests.completion.e2e_support import CLOCK_START_MICROS, ENGINES, LIFECYCLE_TIMEOUT, Funnel, completion_database


@pytest.fixture(params=list(BACKENDS))
async def backend(request, tmp_path, clock) -> AsyncIterator[CompletionStore]:
    """An empty, open store of each adapter (closed at teardown)."""
    store = await BACKENDS[request.param](tmp_path, clock)
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def manual_clock() -> ManualClock:
    """The one clock both services of a test run on; it moves only when the test says so."""
    return ManualClock(CLOCK_START_MICROS)


@pytest.fixture(params=ENGINES)
def completion_engine(request) -> str:
    """The engine the completion servers of a test run on (each test runs on each)."""
    return request.param


@pytest.fixture
async def start_funnel(tmp_path, manual_clock, completion_engine):
    """A factory: `f = await start_funnel(policy={...}, completion={...}, lifecycle={...})`
    starts a lifecycle server and a completion server pointed at it. `policy` is the
    parsed-TOML dict of `parse_policy`; `completion` / `lifecycle` override config
    fields. Everything is stopped at teardown."""
    started: list[Funnel] = []

    async def _start(
        *,
        policy: dict | None = None,
        completion: dict | None = None,
        lifecycle: dict | None = None,
        clock: ManualClock | None = None,
    ) -> Funnel:
        n = len(started)
        lifecycle_config = dataclasses.replace(
            LifecycleConfig(
                listen="127.0.0.1:0",
                database=str(tmp_path / f"lifecycle-{n}.sqlite3"),
                security=credentials.server_security(),
                health_interval=5.0,
            ),
            **(lifecycle or {}),
        )
        completion_config = dataclasses.replace(
            CompletionConfig(
                listen="127.0.0.1:0",
                database=await completion_database(completion_engine, tmp_path, f"completion-{n}"),
                security=credentials.server_security(),
                outbound=credentials.outbound_security(),
                lifecycle_timeout=LIFECYCLE_TIMEOUT,
                settle_interval=0.05,
                health_interval=5.0,
            ),
            **(completion or {}),
        )
        funnel = Funnel(clock or manual_clock, tmp_path, lifecycle_config, completion_config, policy or {})
        started.append(funnel)
        return await funnel.start()

    yield _start
    for funnel in reversed(started):
        await funnel.close()


@pytest.fixture
async def funnel(start_funnel) -> Funnel:
    """Both services with the default policy (no required evidence)."""
    return await start_funnel()


@pytest.fixture
async def strict_funnel(start_funnel) -> Funnel:
    """Both services; workspace `ws-1` requires passing `tests` evidence."""
    return await start_funnel(policy={"workspaces": {"ws-1": {"required_evidence": ["tests"]}}})


@pytest.fixture
async def gate_server():
    """A factory: `address, calls = await gate_server(answer)` serves a `CompletionGate`
    whose EvaluateGate is `answer(request, context)` (async) on 127.0.0.1:0 and
    records every request it received in `calls`."""
    servers: list = []

    class Gate(gate_grpc.CompletionGateServicer):
        def __init__(self, answer, calls: list) -> None:
            self._answer = answer
            self._calls = calls

        async def EvaluateGate(self, request, context):
            self._calls.append(request)
            return await self._answer(request, context)

    async def _start(answer):
        calls: list = []
        server = grpc.aio.server()
        gate_grpc.add_CompletionGateServicer_to_server(Gate(answer, calls), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        return f"127.0.0.1:{port}", calls

    yield _start
    for server in servers:
        await server.stop(None)
