"""The tailer publishes what the event table holds after its cursor, in order,
once per event, whatever wakes it (a local commit or another replica's)."""

from __future__ import annotations

import asyncio

from funnel.runtime import tail
from funnel.runtime.storage_errors import StorageUnavailable
from funnel.runtime.tail import Tailer


class Table:
    def __init__(self) -> None:
        self.rows: list[int] = []
        self.failures = 0

    async def read_after(self, cursor: int, limit: int) -> list[int]:
        if self.failures:
            self.failures -= 1
            raise StorageUnavailable("the database is restarting")
        return [row for row in self.rows if row > cursor][:limit]


async def quiet():
    await asyncio.Event().wait()
    yield


async def until(condition, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_publishes_the_backlog_after_its_start_in_order_once(monkeypatch):
    monkeypatch.setattr(tail, "BATCH", 3)  # several pages per drain
    table, published = Table(), []
    table.rows = list(range(1, 11))
    tailer = Tailer(table.read_after, lambda e: e, published.append, start_after=4)
    runner = asyncio.create_task(tailer.run(quiet()))
    try:
        tailer.poke()
        await until(lambda: published == [5, 6, 7, 8, 9, 10])
        table.rows += [11, 12]
        tailer.poke()
        tailer.poke()
        await until(lambda: published[-1] == 12)
        assert published == list(range(5, 13))
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_a_notification_from_another_replica_wakes_it_and_failures_are_retried(monkeypatch):
    monkeypatch.setattr(tail, "RETRY_DELAY", 0.01)
    table, published = Table(), []
    notified = asyncio.Queue()

    async def notifications():
        while True:
            await notified.get()
            yield

    tailer = Tailer(table.read_after, lambda e: e, published.append, start_after=0)
    runner = asyncio.create_task(tailer.run(notifications()))
    try:
        table.rows = [1, 2]
        table.failures = 2
        notified.put_nowait(None)
        await until(lambda: published == [1, 2])
        assert tailer.cursor == 2
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
