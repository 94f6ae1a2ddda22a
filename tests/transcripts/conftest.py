"""Fixtures of the transcript tests: both real servers (lifecycle and completion) on
127.0.0.1:0 in the test process, the lifecycle over a SQLite file under tmp_path and
the completion service on each engine (`completion_engine`: a SQLite file, or a new
PostgreSQL database), on one manual clock (the `Funnel` of
tests/completion/e2e_support.py), plus a TranscriptService stub."""

from __future__ import annotations

import dataclasses

import pytest

from completion_service.server import CompletionConfig
from funnel.completion.v1 import transcript_service_pb2_grpc as transcript_grpc
from lifecycle_service.server import LifecycleConfig
from tests import credentials
from tests.completion.e2e_support import ENGINES, LIFECYCLE_TIMEOUT, Funnel, completion_database


@dataclasses.dataclass
class Both:
    """Both services of one test and the stubs a host uses."""

    f: Funnel
    ts: transcript_grpc.TranscriptServiceStub

    @property
    def address(self) -> str:
        return self.f.completion.address


@pytest.fixture(params=ENGINES)
def completion_engine(request) -> str:
    """The engine the completion server of a test runs on (each test runs on each)."""
    return request.param


@pytest.fixture
async def both(tmp_path, clock, completion_engine) -> Both:
    lifecycle_config = LifecycleConfig(
        listen="127.0.0.1:0",
        database=str(tmp_path / "lifecycle.sqlite3"),
        security=credentials.server_security(),
        health_interval=5.0,
    )
    completion_config = CompletionConfig(
        listen="127.0.0.1:0",
        database=await completion_database(completion_engine, tmp_path, "completion"),
        security=credentials.server_security(),
        outbound=credentials.outbound_security(),
        lifecycle_timeout=LIFECYCLE_TIMEOUT,
        settle_interval=0.05,
        health_interval=5.0,
    )
    funnel = Funnel(clock, tmp_path, lifecycle_config, completion_config, {})
    await funnel.start()
    channel = credentials.insecure_channel(funnel.completion.address)
    try:
        yield Both(funnel, transcript_grpc.TranscriptServiceStub(channel))
    finally:
        await channel.close()
        await funnel.close()
