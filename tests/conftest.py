"""Fixtures shared by the test suites: a manual clock and lifecycle servers on port 0."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.runtime.clock import ManualClock
from lifecycle_service.server import LifecycleConfig, start
from tests import credentials
from tests.threads import database_threads, database_threads_left

# 2023-11-14T22:13:20Z: a fixed, round start so that commit times are predictable.
CLOCK_START_MICROS = 1_700_000_000_000_000
# Every unary call of a test client has a deadline: a stuck server fails a test, not the run.
DEFAULT_DEADLINE_SECONDS = 15.0


class DefaultDeadline(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, seconds: float) -> None:
        self._seconds = seconds

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        if client_call_details.timeout is None:
            client_call_details = client_call_details._replace(timeout=self._seconds)
        return await continuation(client_call_details, request)


@pytest.fixture(autouse=True)
def no_database_left_open():
    """Every SQLite connection a test opens is closed when the test ends. One left
    open is a leak in the code under test (a start that raised after opening its
    database kept the process alive) or in the test, and its thread, answering an
    event loop closed by then, died later in whichever test ran next."""
    before = database_threads()
    yield
    assert not (left := database_threads_left(before)), f"SQLite connections left open: {left}"


def client_channel(address: str, bearer: str | None = credentials.SUPERUSER, **kwargs) -> grpc.aio.Channel:
    """A client channel that authenticates as `bearer` and whose unary calls
    default to a deadline."""
    return credentials.insecure_channel(
        address, bearer, interceptors=[DefaultDeadline(DEFAULT_DEADLINE_SECONDS)], **kwargs
    )


@pytest.fixture
def clock() -> ManualClock:
    """The clock the servers of a test run on; it moves only when the test says so."""
    return ManualClock(CLOCK_START_MICROS)


@pytest.fixture
async def start_lifecycle(tmp_path, clock):
    """A factory: `running, stub = await start_lifecycle(**config_overrides)` starts a
    lifecycle server on 127.0.0.1:0 over a fresh SQLite file under tmp_path (unless
    `database=` is given) and a client channel to it. Everything is stopped at teardown."""
    started: list[tuple[object, grpc.aio.Channel]] = []

    async def _start(**overrides):
        fields = {
            "listen": "127.0.0.1:0",
            "database": str(tmp_path / f"lifecycle-{len(started)}.sqlite3"),
            "security": credentials.server_security(),
        }
        fields.update(overrides)
        config = dataclasses.replace(LifecycleConfig(), **fields)
        running = await start(config, clock=clock)
        channel = client_channel(running.address)
        started.append((running, channel))
        return running, lifecycle_grpc.TaskLifecycleServiceStub(channel)

    yield _start
    for running, channel in reversed(started):
        await channel.close()
        await running.stop(None)


@pytest.fixture
async def lifecycle(start_lifecycle):
    """(running, stub) for a lifecycle server with the default configuration."""
    return await start_lifecycle()
