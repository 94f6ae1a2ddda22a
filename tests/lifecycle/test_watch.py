"""WatchLifecycleEvents over real gRPC: backlog then live, no gaps and no duplicates,
task filter, workspace isolation, resumption from a cursor, and overflow of a
watcher that does not read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any

import grpc
import pytest

from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.grpc_errors import error_info
from tests import credentials
from tests.lifecycle.grpc_support import WS, Client, Code

OTHER_WS = "ws-2"
STATUSES = [lifecycle_enums.WORK_STATUS_IN_PROGRESS, lifecycle_enums.WORK_STATUS_BLOCKED]


@pytest.fixture
def c(lifecycle) -> Client:
    return Client(lifecycle[1])


class Watcher:
    """One WatchLifecycleEvents stream, read continuously into a queue.

    (Timing out a pending `read()` would cancel the whole call, so the tests never
    do that; they wait on the queue instead.)"""

    _END = object()

    def __init__(self, call) -> None:
        self.call = call
        self.error: grpc.aio.AioRpcError | None = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._pump = asyncio.create_task(self._read_all())

    async def _read_all(self) -> None:
        try:
            async for message in self.call:
                self._queue.put_nowait(message)
        except grpc.aio.AioRpcError as error:
            self.error = error
        finally:
            self._queue.put_nowait(self._END)

    async def take(self, n: int, timeout: float = 10.0) -> list[lifecycle_types.LifecycleEvent]:
        found = []
        for _ in range(n):
            item = await asyncio.wait_for(self._queue.get(), timeout)
            assert item is not self._END, f"the stream ended after {len(found)} events: {self.error}"
            assert item.HasField("event"), item
            found.append(item.event)
        return found

    async def head(self, timeout: float = 10.0) -> int:
        """The head marker, the first message of a `from_head` stream."""
        item = await asyncio.wait_for(self._queue.get(), timeout)
        assert item is not self._END, f"the stream ended before its head marker: {self.error}"
        assert not item.HasField("event"), item
        return item.head_sequence

    async def ended(self, timeout: float = 10.0) -> grpc.aio.AioRpcError:
        """The error the stream ended with, once it has."""
        await asyncio.wait_for(self._pump, timeout)
        assert self.error is not None, "the stream ended without an error"
        return self.error

    async def nothing_before(self, commit: Awaitable[Any]) -> lifecycle_types.LifecycleEvent:
        """Nothing more arrives, shown without a fixed wait: `commit` writes one event
        the stream must deliver, after all it was due, so any extra event would come
        before it. Returns that event."""
        task = (await commit).task
        [event] = await self.take(1)
        assert (event.task_id, event.revision) == (task.task_id, task.revision), event
        return event

    async def close(self) -> None:
        self.call.cancel()
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump


def watch(c: Client, after: int = 0, task_id: str = "", workspace: str = WS, from_head: bool = False) -> Watcher:
    return Watcher(
        c.stub.WatchLifecycleEvents(
            lifecycle_messages.WatchLifecycleEventsRequest(
                workspace_id=workspace, after_sequence=after, task_id=task_id, from_head=from_head
            )
        )
    )


async def history(c: Client, workspace: str = WS) -> list[lifecycle_types.LifecycleEvent]:
    """Every event of a workspace in sequence order, as the listing RPCs report them."""
    client = Client(c.stub, workspace)
    tasks = (await c.ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=workspace, page_size=1000))).tasks
    events = [e for t in tasks for e in await client.events(t.task_id)]
    return sorted(events, key=lambda e: e.sequence)


async def bump(c: Client, task_id: str, n: int) -> None:
    for k in range(n):
        await c.work(task_id, STATUSES[k % 2])


async def test_backlog_then_live_events(c):
    await c.active("t1")
    await c.work("t1")
    stream = watch(c)
    try:
        backlog = await stream.take(3)
        assert [e.revision for e in backlog] == [1, 2, 3]
        live = [await stream.nothing_before(c.work("t1", lifecycle_enums.WORK_STATUS_BLOCKED))]
        await c.suspend("t1")
        await c.register("t2")
        live += await stream.take(2)
        live.append(await stream.nothing_before(c.register("t3")))
    finally:
        await stream.close()
    assert backlog + live == await history(c)
    sequences = [e.sequence for e in backlog + live]
    assert sequences == sorted(set(sequences))


async def test_a_cursor_skips_what_the_watcher_has_seen(c):
    await c.active("t1")
    await bump(c, "t1", 3)
    everything = await history(c)
    stream = watch(c, after=everything[1].sequence)
    try:
        assert await stream.take(3) == everything[2:]
        await stream.nothing_before(c.work("t1", lifecycle_enums.WORK_STATUS_BLOCKED))
    finally:
        await stream.close()


async def test_the_task_filter(c):
    await c.active("t1")
    await c.active("t2")
    stream = watch(c, task_id="t1")
    try:
        first = await stream.take(2)
        await c.work("t2")
        await c.work("t1")
        await c.work("t2", lifecycle_enums.WORK_STATUS_BLOCKED)
        await c.suspend("t1")
        rest = await stream.take(2)
        await c.work("t2")  # filtered out too
        rest.append(await stream.nothing_before(c.request_cancellation("t1")))
    finally:
        await stream.close()
    assert first + rest == await c.events("t1")
    assert {e.task_id for e in first + rest} == {"t1"}


async def test_workspaces_are_isolated(c):
    other = Client(c.stub, OTHER_WS)
    await c.active("t1")
    await other.active("t1")
    mine, theirs = watch(c), watch(c, workspace=OTHER_WS)
    try:
        await other.work("t1")
        await c.work("t1", lifecycle_enums.WORK_STATUS_BLOCKED)
        got_mine = await mine.take(3)
        got_theirs = await theirs.take(3)
        await other.register("theirs-only")
        got_theirs += await theirs.take(1)
        got_mine.append(await mine.nothing_before(c.register("marker")))  # and not theirs-only before it
        got_theirs.append(await theirs.nothing_before(other.register("marker")))
    finally:
        await mine.close()
        await theirs.close()
    assert got_mine == await history(c)
    assert got_theirs == await history(c, OTHER_WS)
    assert {e.workspace_id for e in got_mine} == {WS} and {e.workspace_id for e in got_theirs} == {OTHER_WS}
    # A task filter naming another workspace's task sees nothing of it.
    stream = watch(c, task_id="only-elsewhere")
    try:
        await other.register("only-elsewhere")
        await stream.nothing_before(c.register("only-elsewhere"))  # its own workspace's, first
    finally:
        await stream.close()


async def test_resume_after_a_disconnect_has_no_gap_and_no_duplicate(c):
    await c.active("t1")
    stream = watch(c)
    seen = await stream.take(2)
    await c.work("t1")
    seen += await stream.take(1)
    await stream.close()  # the client goes away
    await bump(c, "t1", 4)
    resumed = watch(c, after=seen[-1].sequence)
    try:
        seen += await resumed.take(4)
        seen.append(await resumed.nothing_before(c.work("t1")))
    finally:
        await resumed.close()
    assert seen == await history(c)


async def test_watchers_joining_during_a_burst_of_commits_miss_nothing(c):
    """Watchers subscribe while commits keep arriving: each sees every event once, in order."""
    tasks = ["a", "b", "c"]
    for task_id in tasks:
        await c.active(task_id)
    per_task = 40

    async def watcher(delay: float) -> list[lifecycle_types.LifecycleEvent]:
        await asyncio.sleep(delay)
        stream = watch(c)
        try:
            return await stream.take(len(tasks) * (2 + per_task))
        finally:
            await stream.close()

    watchers = [asyncio.create_task(watcher(delay)) for delay in (0.0, 0.01, 0.03, 0.06, 0.1)]
    await asyncio.gather(*(bump(c, task_id, per_task) for task_id in tasks))
    results = await asyncio.gather(*watchers)
    everything = await history(c)
    assert len(everything) == len(tasks) * (2 + per_task)
    for seen in results:
        assert seen == everything


async def test_from_the_head_the_stream_starts_with_the_head_and_delivers_only_later_events(c):
    empty = watch(c, from_head=True)
    try:
        assert await empty.head() == 0
        await c.active("t1")
        assert [e.revision for e in await empty.take(2)] == [1, 2]
    finally:
        await empty.close()
    other = Client(c.stub, OTHER_WS)
    await other.register("elsewhere")  # the head counts every workspace's commits
    stream = watch(c, from_head=True, task_id="t1")
    try:
        head = await stream.head()
        assert head == (await history(c, OTHER_WS))[-1].sequence
        live = [await stream.nothing_before(c.work("t1"))]
        await c.register("t2")  # filtered out
        await c.suspend("t1")
        live += await stream.take(1)
        live.append(await stream.nothing_before(c.request_cancellation("t1")))
    finally:
        await stream.close()
    assert live == (await c.events("t1"))[2:]
    assert all(e.sequence > head for e in live)


async def test_watchers_from_the_head_during_a_burst_of_commits_miss_nothing_after_it(c):
    """Each head marker is exact: the events after it are exactly those committed
    with a greater sequence, whenever during the burst the watcher joined."""
    tasks = ["a", "b"]
    for task_id in tasks:
        await c.active(task_id)
    per_task = 40
    done = asyncio.Event()

    async def watcher(delay: float) -> tuple[int, list[lifecycle_types.LifecycleEvent]]:
        await asyncio.sleep(delay)
        stream = watch(c, from_head=True)
        try:
            head = await stream.head()
            await done.wait()
            total = len(tasks) * (2 + per_task)
            return head, await stream.take(total - sum(1 for e in await history(c) if e.sequence <= head))
        finally:
            await stream.close()

    watchers = [asyncio.create_task(watcher(delay)) for delay in (0.0, 0.01, 0.03, 0.06)]
    await asyncio.gather(*(bump(c, task_id, per_task) for task_id in tasks))
    done.set()
    everything = await history(c)
    for head, seen in await asyncio.gather(*watchers):
        assert seen == [e for e in everything if e.sequence > head]


async def test_from_the_head_there_is_no_cursor_to_start_after(c):
    stream = watch(c, after=3, from_head=True)
    error = await stream.ended()
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(error)
    assert (info.reason, info.metadata["field"]) == ("VALUE_OUT_OF_RANGE", "after_sequence")


async def test_a_watcher_that_does_not_read_overflows_and_resumes_without_a_gap(start_lifecycle):
    running, stub = await start_lifecycle(watch_buffer=8)
    c = Client(stub)
    await c.active("t1")
    # A watcher that stops reading: a tiny HTTP/2 window stops the server from pushing
    # more than a few events into the connection, so the rest queue in its buffer.
    slow_channel = credentials.insecure_channel(
        running.address, options=[("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]
    )
    try:
        slow = lifecycle_grpc.TaskLifecycleServiceStub(slow_channel)
        stream = slow.WatchLifecycleEvents(lifecycle_messages.WatchLifecycleEventsRequest(workspace_id=WS))
        received = []
        async with asyncio.timeout(30):
            received += [(await stream.read()).event for _ in range(2)]  # the stream is up
            # Commits go on at full speed while the watcher sleeps.
            await bump(c, "t1", 300)
            assert (await c.task("t1")).revision == 302
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                while True:
                    message = await stream.read()
                    assert message is not grpc.aio.EOF
                    received.append(message.event)
        error = caught.value
        assert error.code() == Code.RESOURCE_EXHAUSTED
        info = error_info(error)
        assert (info.reason, info.domain) == ("WATCH_OVERFLOW", "funnel.lifecycle.v1")
        assert set(info.metadata) == {"resume_after_sequence"}
        cursor = int(info.metadata["resume_after_sequence"])
        assert cursor == received[-1].sequence
        assert len(received) < 302  # it really fell behind
    finally:
        await slow_channel.close()
    everything = await history(c)
    assert received == everything[: len(received)]
    # Resuming from the cursor delivers the rest, with no gap.
    resumed = watch(c, after=cursor)
    try:
        rest = await resumed.take(len(everything) - len(received))
        rest.append(await resumed.nothing_before(c.work("t1")))
    finally:
        await resumed.close()
    assert received + rest == await history(c)
    # Ended and cancelled streams leave no subscription behind.
    for _ in range(100):
        if running.broker.subscriber_count == 0:
            break
        await asyncio.sleep(0.02)
    assert running.broker.subscriber_count == 0


async def test_stopping_the_server_ends_every_watcher_at_once_with_its_cursor(start_lifecycle):
    running, stub = await start_lifecycle()
    c = Client(stub)
    await c.active("t1")
    await c.active("t2")
    everything = await history(c)
    watchers = [watch(c), watch(c, after=everything[1].sequence), watch(c, task_id="t1")]
    seen = [await w.take(n) for w, n in zip(watchers, (4, 2, 2), strict=True)]
    # A grace far longer than the streams may take: they must not wait for it
    # (ended within a third of it, however loaded the machine).
    stopping = asyncio.create_task(running.stop(30.0))
    try:
        for w, events in zip(watchers, seen, strict=True):
            async with asyncio.timeout(10):
                await w._pump
            assert w.error is not None and w.error.code() == Code.UNAVAILABLE, w.error
            info = error_info(w.error)
            assert (info.reason, info.domain) == ("SERVER_SHUTTING_DOWN", "funnel.lifecycle.v1")
            assert info.metadata["resume_after_sequence"] == str(events[-1].sequence)
        async with asyncio.timeout(10):
            await stopping
    finally:
        for w in watchers:
            await w.close()
    assert running.broker.subscriber_count == 0
