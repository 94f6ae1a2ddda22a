"""Bounded everything: request rates, watchers per caller and per workspace,
streams per connection, the buffer that transcript imports share, silent client
streams. The two floods of the issue run against real service processes (TLS,
tokens) and print the memory they cost."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from completion_service.api.imports import least_held_bytes
from completion_service.api.jsonl import to_line
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import transcript_service_pb2_grpc as transcript_grpc
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.runtime.grpc_errors import error_info, retry_delay
from tests import credentials
from tests.security.support import OTHER_WS, WS, rss_bytes

Code = grpc.StatusCode
T = 10.0
HOST = credentials.token("host-1", [f"{WS}:host"])
MB = 1024 * 1024
# What an import holds at least, with the default 4 MiB message limit.
LEAST = least_held_bytes(4 * MB)


async def failure(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


# -- rates ----------------------------------------------------------------------


async def test_a_caller_above_its_rate_gets_resource_exhausted_with_retry_info(secured):
    funnel = await secured(lifecycle={"security": credentials.server_security(rate_limit=5.0, rate_burst=5.0)})
    host = funnel.clients(HOST)
    other = funnel.clients(credentials.token("host-2", [f"{WS}:host"]))
    request = lifecycle_messages.ListTasksRequest(workspace_id=WS)
    for _ in range(5):
        await host.lc.ListTasks(request, timeout=T)
    error = await failure(host.lc.ListTasks(request, timeout=T))
    info = error_info(error)
    assert (error.code(), info.reason) == (Code.RESOURCE_EXHAUSTED, "RATE_LIMITED")
    assert dict(info.metadata) == {"limit_per_second": "5", "burst": "5"}
    delay = retry_delay(error)
    assert delay is not None and 0 < delay <= 0.25, delay
    await other.lc.ListTasks(request, timeout=T)  # per caller: another caller is not held back
    await asyncio.sleep(delay)
    await host.lc.ListTasks(request, timeout=T)  # after the advertised delay it is served


async def test_the_completion_service_is_not_rate_limited_by_the_lifecycle_service(secured):
    funnel = await secured(lifecycle={"security": credentials.server_security(rate_limit=1.0, rate_burst=1.0)})
    f = funnel.f  # the test's own client is the superuser; its calls to the lifecycle are limited
    await f.register("t-1")
    await asyncio.sleep(1.0)
    # A claim and an attempt make several lifecycle calls in a burst, all as the completion service.
    claim = await f.claim("t-1")
    answer = await f.attempt(claim)
    assert answer.completion.settlement != 0


# -- watchers and streams --------------------------------------------------------------


async def test_watchers_are_capped_per_caller_and_per_workspace(secured):
    funnel = await secured(lifecycle={"max_watchers_per_caller": 2, "max_watchers_per_workspace": 3})
    await funnel.f.register("t-1")
    host, other = funnel.clients(HOST), funnel.clients(credentials.token("viewer-2", [f"{WS}:viewer"]))
    opened = []

    async def watch(clients):
        call = clients.lc.WatchLifecycleEvents(
            lifecycle_messages.WatchLifecycleEventsRequest(workspace_id=WS), timeout=30
        )
        assert (await call.read()).event.task_id == "t-1"  # admitted: the backlog arrives
        opened.append(call)
        return call

    first = await watch(host)
    await watch(host)
    error = await failure(
        host.lc.WatchLifecycleEvents(lifecycle_messages.WatchLifecycleEventsRequest(workspace_id=WS), timeout=30).read()
    )
    assert (error.code(), error_info(error).reason) == (Code.RESOURCE_EXHAUSTED, "WATCHERS_EXHAUSTED")
    assert dict(error_info(error).metadata) == {"scope": "per_caller", "limit": "2"}
    await watch(other)  # the workspace's third
    error = await failure(
        other.lc.WatchLifecycleEvents(
            lifecycle_messages.WatchLifecycleEventsRequest(workspace_id=WS), timeout=30
        ).read()
    )
    assert dict(error_info(error).metadata) == {"scope": "per_workspace", "limit": "3"}
    first.cancel()
    # Admitted again once the server has seen the cancellation and freed the slot.
    deadline = time.monotonic() + T
    while True:
        try:
            await watch(host)
            break
        except grpc.aio.AioRpcError as refused:
            assert error_info(refused).reason == "WATCHERS_EXHAUSTED" and time.monotonic() < deadline, refused
            await asyncio.sleep(0.05)
    for call in opened:
        call.cancel()


async def test_a_connection_has_a_bounded_number_of_concurrent_streams(secured):
    funnel = await secured(lifecycle={"security": credentials.server_security(max_streams_per_connection=3)})
    await funnel.f.register("t-1")
    host = funnel.clients(HOST)
    calls = [
        host.lc.WatchLifecycleEvents(lifecycle_messages.WatchLifecycleEventsRequest(workspace_id=WS), timeout=30)
        for _ in range(4)
    ]
    firsts = [asyncio.ensure_future(call.read()) for call in calls]
    async with asyncio.timeout(T):
        while sum(first.done() for first in firsts) < 3:
            await asyncio.wait([first for first in firsts if not first.done()], return_when=asyncio.FIRST_COMPLETED)
    waiting = [first for first in firsts if not first.done()]
    assert len(waiting) == 1  # the fourth stream waits for a slot on this connection
    calls[next(n for n, first in enumerate(firsts) if first.done())].cancel()
    await asyncio.wait(waiting, timeout=T)
    assert all(f.done() for f in firsts)
    for call in calls:
        call.cancel()


# -- client streams ------------------------------------------------------------------------


async def stalled_import(ts, task_id: str, stop: asyncio.Event, chunk: bytes = b'{"sequence":"1"', workspace=WS):
    async def requests():
        yield transcript_messages.ImportTranscriptRequest(
            target=transcript_messages.ImportTarget(workspace_id=workspace, task_id=task_id)
        )
        yield transcript_messages.ImportTranscriptRequest(jsonl_chunk=chunk)
        await stop.wait()

    return await ts.ImportTranscript(requests(), timeout=60)


async def test_a_silent_client_stream_is_ended(secured):
    # Without a minimum rate: the 30 bytes it sent would not pay for its 0.5 s.
    security = credentials.server_security(stream_idle_seconds=0.5, stream_min_bytes_per_second=0)
    funnel = await secured(completion={"security": security})
    await funnel.f.register("t-1")
    host = funnel.clients(HOST)
    started = time.monotonic()
    error = await failure(stalled_import(host.ts, "t-1", asyncio.Event()))
    assert 0.4 < time.monotonic() - started < 3.0
    info = error_info(error)
    assert (error.code(), info.reason, dict(info.metadata)) == (
        Code.DEADLINE_EXCEEDED,
        "STREAM_IDLE",
        {"idle_timeout_seconds": "0.5"},
    )
    page = await host.ts.LoadTranscript(
        transcript_messages.LoadTranscriptRequest(workspace_id=WS, task_id="t-1"), timeout=T
    )
    assert list(page.events) == []


async def test_imports_in_flight_share_a_bounded_buffer(secured):
    """Each import holds at least room for a message (4 MiB) and 1 MiB: a buffer
    of 11 MiB admits two stalled imports, and one whose own buffering outgrows
    what is left is refused the same way."""
    limit = 11 * MB
    # The caller's and the workspace's shares are larger: the whole buffer runs out first.
    funnel = await secured(
        completion={
            "import_buffer_bytes": limit,
            "import_buffer_per_caller_bytes": 2 * limit,
            "import_buffer_per_workspace_bytes": 2 * limit,
        }
    )
    for task in ("t-1", "t-2", "t-3"):
        await funnel.f.register(task)
    host = funnel.clients(HOST)
    stop = asyncio.Event()
    held = [asyncio.ensure_future(stalled_import(host.ts, task, stop)) for task in ("t-1", "t-2")]
    await until_buffer_holds(funnel, 2 * LEAST)
    error = await failure(stalled_import(host.ts, "t-3", stop))
    info = error_info(error)
    assert (error.code(), info.reason, dict(info.metadata)) == (
        Code.RESOURCE_EXHAUSTED,
        "IMPORT_BUFFER_EXHAUSTED",
        {"scope": "global", "limit_bytes": str(limit)},
    )
    held[0].cancel()
    await until_buffer_holds(funnel, LEAST)
    # Admitted beside the other (5 MiB of 11 are taken), its 3 MiB line would take 12.
    big_line = b'{"sequence":"1","generation":"1","user_message":{"text":"' + b"x" * (3 * MB)
    error = await failure(stalled_import(host.ts, "t-3", stop, chunk=big_line))
    assert error_info(error).reason == "IMPORT_BUFFER_EXHAUSTED"
    await until_buffer_holds(funnel, LEAST)  # the refused import gave back what it held
    stop.set()
    held[1].cancel()


async def test_an_import_is_charged_for_its_decoded_events_not_their_bytes_on_the_wire(secured):
    """A text of 1 Mi characters is 1 MiB on the wire either way; with one
    character above U+FFFF it is 4 MiB in memory, twice while it is staged: with
    room for a message, 12 MiB, more than the 11 MiB buffer. The plain one, 6 MiB,
    is imported."""
    limit = 11 * MB
    funnel = await secured(
        completion={
            "import_buffer_bytes": limit,
            "import_buffer_per_caller_bytes": 2 * limit,
            "import_buffer_per_workspace_bytes": 2 * limit,
        }
    )
    await funnel.f.register("t-wide")
    await funnel.f.register("t-plain")
    host = funnel.clients(HOST)

    def one_event(text: str) -> bytes:
        return to_line(
            completion_types.SessionEvent(
                sequence=1, generation=1, user_message=completion_types.UserMessage(text=text)
            )
        )

    wide, plain = one_event("w" * (MB - 1) + "\U0001f600"), one_event("p" * MB)
    assert len(wide) - len(plain) == 3  # the same size on the wire, within a character
    error = await failure(send_file(host.ts, "t-wide", wide))
    info = error_info(error)
    assert (info.reason, dict(info.metadata)) == (
        "IMPORT_BUFFER_EXHAUSTED",
        {"scope": "global", "limit_bytes": str(limit)},
    )
    await until_buffer_holds(funnel, 0)
    assert (await send_file(host.ts, "t-plain", plain)).imported_events == 1


async def send_file(ts, task_id: str, data: bytes, chunk: int = 256 * 1024):
    """Imports `data` in chunks; the line ends in the last one, so that a refusal
    comes after every write (grpc-aio hides one that comes before a write: grpc/grpc#36066)."""

    async def requests():
        yield transcript_messages.ImportTranscriptRequest(
            target=transcript_messages.ImportTarget(workspace_id=WS, task_id=task_id)
        )
        for start in range(0, len(data), chunk):
            yield transcript_messages.ImportTranscriptRequest(jsonl_chunk=data[start : start + chunk])

    return await ts.ImportTranscript(requests(), timeout=60)


async def test_a_caller_and_a_workspace_hold_at_most_their_share_of_the_import_buffer(secured):
    """The defaults: 64 MiB in all, 16 MiB per caller, 32 MiB per workspace, 5 MiB
    per import at least. One caller's stalled imports fill its share; another
    caller of the workspace is still admitted until the workspace's share is
    full; a host of another workspace is admitted all along."""
    funnel = await secured()
    for workspace in (WS, OTHER_WS):
        await funnel.f.register("t-1", workspace=workspace)
    a, b, c = (funnel.clients(credentials.token(f"host-{n}", [f"{WS}:host"])) for n in "abc")
    elsewhere = funnel.clients(credentials.token("host-d", [f"{OTHER_WS}:host"]))
    stop = asyncio.Event()
    held = [asyncio.ensure_future(stalled_import(a.ts, "t-1", stop)) for _ in range(3)]
    await until_buffer_holds(funnel, 3 * LEAST)
    error = await failure(stalled_import(a.ts, "t-1", stop))
    assert (error.code(), error_info(error).reason, dict(error_info(error).metadata)) == (
        Code.RESOURCE_EXHAUSTED,
        "IMPORT_BUFFER_EXHAUSTED",
        {"scope": "per_caller", "limit_bytes": str(16 * MB)},
    )
    held += [asyncio.ensure_future(stalled_import(b.ts, "t-1", stop)) for _ in range(3)]
    await until_buffer_holds(funnel, 6 * LEAST)
    error = await failure(stalled_import(c.ts, "t-1", stop))
    assert dict(error_info(error).metadata) == {"scope": "per_workspace", "limit_bytes": str(32 * MB)}
    held.append(asyncio.ensure_future(stalled_import(elsewhere.ts, "t-1", stop, workspace=OTHER_WS)))
    await until_buffer_holds(funnel, 7 * LEAST)
    for call in held[:3]:  # the first caller's imports end: their shares are free again
        call.cancel()
    await until_buffer_holds(funnel, 4 * LEAST)
    held.append(asyncio.ensure_future(stalled_import(c.ts, "t-1", stop)))
    await until_buffer_holds(funnel, 5 * LEAST)
    for call in held:
        call.cancel()
    await until_buffer_holds(funnel, 0)


async def test_an_import_that_trickles_below_the_minimum_rate_is_ended(secured):
    """A byte every 0.2 s is never silent for the idle timeout (1 s), yet far below
    the minimum rate (200 bytes per second once the first second is over): it is
    ended, imports nothing and gives its share back. A file sent at 500 bytes per
    second, for longer, is imported."""
    security = credentials.server_security(stream_idle_seconds=1.0, stream_min_bytes_per_second=200)
    funnel = await secured(completion={"security": security})
    await funnel.f.register("t-1")
    await funnel.f.register("t-2")
    host = funnel.clients(HOST)

    def events(count: int) -> bytes:
        return b"".join(
            to_line(
                completion_types.SessionEvent(
                    sequence=n, generation=1, user_message=completion_types.UserMessage(text=f"e{n}")
                )
            )
            for n in range(1, count + 1)
        )

    async def paced(task_id: str, data: bytes, size: int):
        async def requests():
            yield transcript_messages.ImportTranscriptRequest(
                target=transcript_messages.ImportTarget(workspace_id=WS, task_id=task_id)
            )
            for start in range(0, len(data), size):
                await asyncio.sleep(0.2)
                yield transcript_messages.ImportTranscriptRequest(jsonl_chunk=data[start : start + size])

        return await asyncio.wait_for(host.ts.ImportTranscript(requests(), timeout=60), 30)

    error = await failure(paced("t-1", events(100), 1))
    info = error_info(error)
    assert (error.code(), info.reason, info.metadata["min_bytes_per_second"]) == (
        Code.DEADLINE_EXCEEDED,
        "STREAM_IDLE",
        "200",
    )
    assert int(info.metadata["received_bytes"]) < 200, info.metadata
    await until_buffer_holds(funnel, 0)
    page = await host.ts.LoadTranscript(
        transcript_messages.LoadTranscriptRequest(workspace_id=WS, task_id="t-1"), timeout=T
    )
    assert list(page.events) == []
    data = events(30)
    assert len(data) > 1000  # sent for over 2 s: past the first idle timeout
    answer = await paced("t-2", data, 100)
    assert answer.imported_events == 30


async def until_buffer_holds(funnel, size: int) -> None:
    """Waits until the imports in flight hold `size` bytes of the import buffer."""
    budget = funnel.f.completion.import_budget
    deadline = time.monotonic() + 10
    while budget.used != size:
        assert time.monotonic() < deadline, f"the imports hold {budget.used} bytes, not {size}"
        await asyncio.sleep(0.02)


# -- floods against real processes -----------------------------------------------------------


async def test_stalled_imports_are_bounded_in_memory_and_ended(pair):
    """300 client-streamed imports of one caller that never finish: its share of
    the buffer admits 3 (16 MiB, 5 MiB each), the rest are refused at once, before
    any of them asks the lifecycle service about its task; the admitted ones end
    after the idle timeout, nothing is imported, and the process stays small."""
    p = await pair(completion_args=["--stream-idle-seconds", "3", "--lifecycle-timeout", "30"])
    pid = p.completion.process.process.pid
    await p.lc.RegisterTask(lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id="stall"), timeout=T)
    channels = [credentials.tls_channel(p.completion.address, HOST, identity=None) for _ in range(6)]
    stubs = [transcript_grpc.TranscriptServiceStub(c) for c in channels]
    stop = asyncio.Event()
    chunk = b'{"sequence":"1","generation":"1","user_message":{"text":"' + b"y" * (60 * 1024)
    baseline = rss_bytes(pid)
    calls = [asyncio.ensure_future(stalled_import(stubs[i % 6], "stall", stop, chunk)) for i in range(300)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    after = rss_bytes(pid)
    reasons = [error_info(r).reason if error_info(r) is not None else r.code().name for r in results]
    print(
        f"\nstalled imports: 300 opened, {reasons.count('STREAM_IDLE')} ended idle; completion RSS "
        f"{baseline / MB:.0f} MB before, {after / MB:.0f} MB after"
    )
    # A refusal that came while the client was writing its chunk reaches it as
    # INTERNAL without ErrorInfo (grpc/grpc#36066).
    assert reasons.count("STREAM_IDLE") == 3
    assert reasons.count("IMPORT_BUFFER_EXHAUSTED") + reasons.count("INTERNAL") == 297
    assert after - baseline < 64 * MB
    page = await p.ts.LoadTranscript(
        transcript_messages.LoadTranscriptRequest(workspace_id=WS, task_id="stall"), timeout=T
    )
    assert list(page.events) == []
    for channel in channels:
        await channel.close()


async def test_a_watcher_flood_is_capped_with_a_clear_error(pair):
    """One caller opening 300 watch streams gets its 64; many callers together
    stop at the workspace's cap; the process stays small."""
    p = await pair(lifecycle_args=["--max-watchers-per-workspace", "256"])
    pid = p.lifecycle.process.process.pid
    await p.lc.RegisterTask(lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id="t-1"), timeout=T)
    baseline = rss_bytes(pid)
    channels = []

    async def flood(subject: str, count: int) -> list:
        token = credentials.token(subject, [f"{WS}:viewer"])
        per_channel = []
        for _ in range((count + 89) // 90):  # under the 100 streams a connection may carry
            channel = credentials.tls_channel(p.lifecycle.address, token, identity="client")
            channels.append(channel)
            per_channel.append(lifecycle_grpc.TaskLifecycleServiceStub(channel))
        streams = [
            per_channel[i // 90].WatchLifecycleEvents(
                lifecycle_messages.WatchLifecycleEventsRequest(workspace_id=WS), timeout=60
            )
            for i in range(count)
        ]
        return streams, await asyncio.gather(*(s.read() for s in streams), return_exceptions=True)

    def tally(answers) -> tuple[int, dict]:
        admitted = sum(1 for a in answers if not isinstance(a, Exception))
        scopes: dict[str, int] = {}
        for a in answers:
            if isinstance(a, Exception):
                info = error_info(a)
                assert (a.code(), info.reason) == (Code.RESOURCE_EXHAUSTED, "WATCHERS_EXHAUSTED"), a
                scopes[info.metadata["scope"]] = scopes.get(info.metadata["scope"], 0) + 1
        return admitted, scopes

    streams, answers = await flood("flooder", 300)
    assert tally(answers) == (64, {"per_caller": 236})
    all_streams = list(streams)
    admitted_total = 64
    for n in range(5):  # five more callers of 64 each: the workspace's cap of 256 ends it
        more, answers = await flood(f"viewer-{n}", 64)
        all_streams += more
        admitted, _scopes = tally(answers)
        admitted_total += admitted
    assert admitted_total == 256
    peak = rss_bytes(pid)
    print(
        f"\nwatcher flood: 620 streams asked, {admitted_total} admitted (64 per caller, 256 per workspace); "
        f"lifecycle RSS {baseline / MB:.0f} MB before, {peak / MB:.0f} MB with the streams open "
        f"(+{(peak - baseline) / MB:.0f} MB)"
    )
    assert peak - baseline < 100 * MB
    for stream in all_streams:
        stream.cancel()
    for channel in channels:
        await channel.close()
