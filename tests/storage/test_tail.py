"""The tailer publishes what the event table holds after its cursor and below
the horizon, in order, once per event, whatever wakes it (a local commit or
another replica's), and reads again by itself while events are held back."""

from __future__ import annotations

import asyncio

from funnel.runtime import tail
from funnel.runtime.storage_errors import StorageUnavailable
from funnel.runtime.tail import Tailer, TailRead


class Table:
    """Committed rows, and the horizon below which they may be delivered."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.horizon = float("inf")
        self.failures = 0
        self.reads = 0

    async def read_after(self, cursor: int, limit: int) -> TailRead[int]:
        self.reads += 1
        if self.failures:
            self.failures -= 1
            raise StorageUnavailable("the database is restarting")
        after = sorted(row for row in self.rows if row > cursor)[:limit]
        deliverable = [row for row in after if row < self.horizon]
        return TailRead(deliverable, held_back=len(deliverable) < len(after))


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


async def test_held_back_events_are_read_again_without_a_wake_up_and_a_late_commit_is_not_skipped(monkeypatch):
    monkeypatch.setattr(tail, "HELD_BACK_RECHECK", 0.01)
    table, published = Table(), []
    tailer = Tailer(table.read_after, lambda e: e, published.append, start_after=0)
    runner = asyncio.create_task(tailer.run(quiet()))
    try:
        # 20 committed while the transaction that will write 10 still runs: the
        # horizon stays at 10, so 20 waits.
        table.rows, table.horizon = [5, 20], 10
        tailer.poke()
        await until(lambda: published == [5])
        reads = table.reads
        await until(lambda: table.reads >= reads + 3)  # polled, no wake-up needed
        assert published == [5]
        # That transaction commits 10 and ends without a wake-up reaching this
        # tail (another replica's, its notification lost): both follow, in order.
        table.rows, table.horizon = [5, 10, 20], float("inf")
        await until(lambda: published == [5, 10, 20])
        reads = table.reads
        await asyncio.sleep(0.1)
        assert table.reads == reads, "nothing held back: the tail waits for a wake-up"
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_a_local_commit_announces_itself_to_the_other_replicas():
    table, announced = Table(), []
    tailer = Tailer(table.read_after, lambda e: e, lambda e: None, start_after=0, announce=lambda: announced.append(1))
    tailer.poke()
    assert announced == [1]
