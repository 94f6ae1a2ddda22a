"""A stopping server ends watch streams at once (EventBroker.close): a stream
waiting for live events, one still reading its backlog and one that opens after
the close each end with the shutdown error naming the last sequence delivered.
A client stream still sending is cut by the drain just before the grace ends
(funnel.runtime.shutdown.Drain)."""

from __future__ import annotations

import asyncio
import enum

import pytest

from funnel.runtime import watch
from funnel.runtime.errors import Code, ReasonSpec, ServiceError
from funnel.runtime.shutdown import Drain
from funnel.runtime.watch import EventBroker, WatchEnds, follow


class Reason(enum.Enum):
    WATCH_OVERFLOW = ReasonSpec(Code.RESOURCE_EXHAUSTED, "behind")
    SERVER_SHUTTING_DOWN = ReasonSpec(Code.UNAVAILABLE, "stopping")


class Table:
    """An event table of sequences; counts its reads."""

    def __init__(self, rows: list[int]) -> None:
        self.rows = rows
        self.reads = 0

    async def read_after(self, cursor: int, limit: int) -> list[int]:
        self.reads += 1
        await asyncio.sleep(0)
        return [row for row in self.rows if row > cursor][:limit]


def stream(table: Table, broker: EventBroker[int], after: int = 0):
    return follow(table.read_after, broker, "ws", None, after, lambda e: e, lambda e: e, WatchEnds(Reason, 8))


async def collect(events, into: list[int]) -> None:
    async for event in events:
        into.append(event)


def shutdown_cursor(error: BaseException) -> int:
    assert isinstance(error, ServiceError)
    rejection = error.rejection
    assert rejection.reason is Reason.SERVER_SHUTTING_DOWN and rejection.code is Code.UNAVAILABLE
    return int(rejection.metadata["resume_after_sequence"])


async def test_a_stream_waiting_for_live_events_ends_at_once_with_its_cursor():
    table, broker = Table([1, 2, 3]), EventBroker[int](8)
    delivered: list[int] = []
    reader = asyncio.create_task(collect(stream(table, broker), delivered))
    async with asyncio.timeout(30):
        while broker.subscriber_count == 0 or delivered != [1, 2, 3]:
            await asyncio.sleep(0.01)
    table.rows.append(4)
    broker.publish("ws", "task", lambda: 4)
    async with asyncio.timeout(30):
        while delivered != [1, 2, 3, 4]:
            await asyncio.sleep(0.01)
    broker.close()
    # Published after the close, and so never delivered: the client reads it again from its cursor.
    broker.publish("ws", "task", lambda: 5)
    with pytest.raises(ServiceError) as ended:
        async with asyncio.timeout(30):
            await reader
    assert shutdown_cursor(ended.value) == 4
    assert delivered == [1, 2, 3, 4]
    assert broker.subscriber_count == 0


async def test_buffered_events_are_dropped_rather_than_delivered_after_the_close():
    table, broker = Table([]), EventBroker[int](8)
    events = stream(table, broker)
    first = asyncio.create_task(anext(events))
    async with asyncio.timeout(30):
        while broker.subscriber_count == 0:
            await asyncio.sleep(0.01)
    broker.publish("ws", "task", lambda: 1)
    assert await first == 1
    for sequence in (2, 3):  # buffered, not yet read by the stream
        broker.publish("ws", "task", lambda s=sequence: s)
    broker.close()
    with pytest.raises(ServiceError) as ended:
        await anext(events)
    assert shutdown_cursor(ended.value) == 1


async def test_a_stream_reading_its_backlog_ends_between_two_batches(monkeypatch):
    monkeypatch.setattr(watch, "WATCH_BATCH", 2)
    table, broker = Table(list(range(1, 11))), EventBroker[int](8)
    events = stream(table, broker)
    assert [await anext(events) for _ in range(3)] == [1, 2, 3]  # two batches read
    broker.close()
    assert await anext(events) == 4  # the rest of the batch in hand
    with pytest.raises(ServiceError) as ended:
        await anext(events)
    assert shutdown_cursor(ended.value) == 4
    assert table.reads == 2


async def test_a_stream_opened_after_the_close_ends_before_reading_anything():
    table, broker = Table([1, 2]), EventBroker[int](8)
    broker.close()
    with pytest.raises(ServiceError) as ended:
        await anext(stream(table, broker, after=1))
    assert shutdown_cursor(ended.value) == 1
    assert table.reads == 0
    # A subscription made after the close is closed.
    with broker.subscribe("ws", None) as late, pytest.raises(watch.WatchClosed):
        await late.next()


class Cut(Exception):
    pass


async def test_the_drain_cuts_a_block_still_running_shortly_before_the_grace_ends():
    drain = Drain()
    loop = asyncio.get_running_loop()

    entered = asyncio.Event()

    async def sending_forever() -> None:
        async with drain.bounded(Cut):
            entered.set()
            await asyncio.Event().wait()

    sender = asyncio.create_task(sending_forever())
    await entered.wait()
    assert not sender.done() and drain.deadline is None  # no deadline before the server stops
    before = loop.time()
    drain.begin(1.0)
    after = loop.time()
    # Cut before gRPC would cancel it at 1.0, with time for the status: the deadline
    # the block's timeout now has, whenever a loaded loop gets round to it.
    assert drain.deadline is not None and before + 0.7 <= drain.deadline < after + 1.0
    with pytest.raises(Cut):
        await sender


async def test_the_drain_leaves_a_block_that_finishes_in_time_and_its_own_timeouts_alone():
    drain = Drain()

    async def finishing(after: float) -> str:
        async with drain.bounded(Cut):
            await asyncio.sleep(after)
            return "done"

    sender = asyncio.create_task(finishing(0.1))
    await asyncio.sleep(0)
    drain.begin(30.0)
    assert await sender == "done"
    with pytest.raises(TimeoutError):  # the block's own timeout is not the drain's
        async with drain.bounded(Cut):
            async with asyncio.timeout(0.01):
                await asyncio.sleep(1)


async def test_a_stream_from_the_head_opened_after_the_close_ends_at_the_head_it_announced():
    broker = EventBroker[int](8)
    broker.close()

    async def head() -> int:
        return 5

    delivered: list[int] = []
    events = watch.follow_from_head(head, broker, "ws", None, lambda h: -h, lambda e: e, WatchEnds(Reason, 8))
    with pytest.raises(ServiceError) as ended:
        await collect(events, delivered)
    # The marker, then the shutdown: resuming after the head misses nothing and replays nothing.
    assert delivered == [-5] and shutdown_cursor(ended.value) == 5
