"""The health probe (funnel.runtime.server.Health.probe_forever): NOT_SERVING
while the database probe fails or hangs, SERVING again once it passes, and a
probe still running when the loop stops is stopped and waited for with it (the
loop owns it: nothing of a stopped service runs on)."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2

from funnel.runtime.server import Health

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Statuses(Health):
    """Health on a server that is never started, keeping what it was told."""

    def __init__(self) -> None:
        super().__init__(grpc.aio.server(), ["svc"])
        self.told: list[int] = []

    async def set(self, status: int) -> None:
        self.told.append(status)


async def until(condition, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_failing_probe_reports_not_serving_and_a_passing_one_serving_again():
    health, failing = Statuses(), [True]

    async def probe() -> None:
        if failing[0]:
            raise OSError("disk full")

    loop = asyncio.create_task(health.probe_forever(probe, 0.01))
    await until(lambda: health.told == [NOT_SERVING])
    failing[0] = False
    await until(lambda: health.told == [NOT_SERVING, SERVING])
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)


async def test_a_probe_running_when_the_loop_stops_is_stopped_and_waited_for():
    health, finished = Statuses(), asyncio.Event()

    async def stuck() -> None:
        try:
            await asyncio.Event().wait()  # behind a lock that is never let go
        finally:
            await asyncio.sleep(0.05)  # its answer takes a moment to come back
            finished.set()

    loop = asyncio.create_task(health.probe_forever(stuck, 0.01))
    await until(lambda: health.told == [NOT_SERVING])  # did not finish in time
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)
    assert finished.is_set()
