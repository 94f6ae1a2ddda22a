"""A start that fails after the service opened its database undoes what it opened
(issue 23): the database's thread ends (it is not a daemon: left running, it kept a
service that printed its refusal alive), the gRPC port is free again and the
database file can be opened by the next start. Shown in-process, where the threads
and the port can be looked at, with a real cause: the metrics address is taken."""

from __future__ import annotations

import socket

import pytest

from completion_service.server import CompletionConfig
from completion_service.server import start as start_completion
from funnel.runtime.metrics import CannotServeMetrics
from lifecycle_service.server import LifecycleConfig
from lifecycle_service.server import start as start_lifecycle
from tests import credentials
from tests.threads import database_threads, database_threads_left

pytestmark = pytest.mark.asyncio


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def start_service(service: str, tmp_path, listen: str, metrics_listen: str | None):
    if service == "lifecycle":
        config = LifecycleConfig(
            listen=listen,
            database=str(tmp_path / "lifecycle.sqlite3"),
            security=credentials.server_security(),
            metrics_listen=metrics_listen,
        )
        return await start_lifecycle(config)
    config = CompletionConfig(
        listen=listen,
        database=str(tmp_path / "completion.sqlite3"),
        security=credentials.server_security(),
        outbound=credentials.outbound_security(),
        metrics_listen=metrics_listen,
    )
    return await start_completion(config)


@pytest.mark.parametrize("service", ["lifecycle", "completion"])
async def test_a_start_refused_after_the_database_opened_leaves_nothing_open(tmp_path, service):
    before = database_threads()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        metrics_listen = f"127.0.0.1:{taken.getsockname()[1]}"
        listen = f"127.0.0.1:{free_port()}"  # while the metrics port is taken: another one
        with pytest.raises(CannotServeMetrics):
            await start_service(service, tmp_path, listen, metrics_listen)
    assert database_threads_left(before) == []
    # The same port and database serve the next start at once.
    running = await start_service(service, tmp_path, listen, None)
    try:
        assert running.port == int(listen.rsplit(":", 1)[1])
    finally:
        await running.stop(None)
    assert database_threads_left(before) == []
