"""SIGTERM on the real service processes (issue 14 §5), with TLS and tokens, on
SQLite and on PostgreSQL: open watch streams end at once with `UNAVAILABLE`
(`SERVER_SHUTTING_DOWN`, the cursor in `resume_after_sequence`), an in-flight
unary call still finishes (it is held in flight by a write lock the test takes
on the service's database and releases only after the streams have ended), the
process exits 0 within its grace, and watchers that reconnect to the restarted
service from their cursors receive what follows, with no gap and no duplicate.
"At once" and "within its grace" are shown by order, not by the clock: the
streams end while the held call is still in flight (the grace would have ended
it), and each wait is for what the service reports (a call in flight on its
metrics, the "stopping" line of its log).
A transcript import still sending when the grace is about to end is ended with
the same reason and imports nothing; one that finishes sending in the grace
commits whole."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import grpc
import psycopg
import pytest
from google.protobuf.duration_pb2 import Duration

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.runtime.grpc_errors import error_info
from tests.completion.e2e_support import eventually
from tests.lifecycle.grpc_support import Client
from tests.postgres import fresh_database
from tests.prometheus import scrape
from tests.reliability.harness import Pair, PostgresSchema, Service
from tests.transcripts.support import P, a_full_turn

WS = "shutdown"
# The services' --shutdown-grace: what the held call and the finishing import may take after
# SIGTERM on a loaded machine (the cut import waits for its end).
GRACE = 10.0
T = 10.0
BACKENDS = ["sqlite", "postgresql"]
# The logs every event-writing commit inserts into, whose table lock holds it on
# PostgreSQL (SQLite: the whole file).
EVENT_LOGS = {
    "lifecycle_service": ["lifecycle_events"],
    "completion_service": ["completion_events", "audit_log"],
}


async def started_pair(tmp_path: Path, backend: str) -> Pair:
    url = await asyncio.to_thread(fresh_database) if backend == "postgresql" else None
    grace = ["--shutdown-grace", str(GRACE), "--metrics-listen", "127.0.0.1:0"]
    return await Pair(tmp_path, lifecycle_args=grace, completion_args=grace, database_url=url).start()


@contextlib.contextmanager
def writes_held(service: Service) -> Iterator[None]:
    """Holds the lock every event-writing commit of `service` needs, so that such
    a call stays in flight until the block ends."""
    database = service.database
    if isinstance(database, PostgresSchema):
        with psycopg.connect(database.url) as conn:
            tables = ", ".join(f"{database.schema}.{table}" for table in EVENT_LOGS[service.name])
            conn.execute(f"LOCK TABLE {tables} IN EXCLUSIVE MODE")
            yield
            conn.rollback()
        return
    db = sqlite3.connect(database, isolation_level=None, timeout=10)
    try:
        db.execute("BEGIN IMMEDIATE")
        yield
        db.execute("ROLLBACK")
    finally:
        db.close()


def in_flight(service: Service, method: str) -> float:
    """How many `method` calls the service is handling now (its metrics)."""
    assert service.process is not None and service.process.metrics_url is not None
    samples = scrape(service.process.metrics_url)
    return sum(
        count
        for (name, labels), count in samples.items()
        if name == "grpc_server_in_flight_requests" and dict(labels)["grpc_method"] == method
    )


async def until_in_flight(service: Service, method: str, calls: int = 1) -> None:
    await eventually(lambda: asyncio.to_thread(lambda: in_flight(service, method) >= calls), timeout=T)


async def until_stopping(service: Service) -> None:
    """Until the service has logged that it stops (SIGTERM reached it)."""
    await eventually(lambda: asyncio.to_thread(lambda: b"stopping: " in service.log_path.read_bytes()), timeout=T)


class Watcher:
    """One watch stream, read continuously; remembers what it saw and how it ended."""

    def __init__(self, open_stream: Callable[[int], grpc.aio.UnaryStreamCall], after: int = 0) -> None:
        self._open = open_stream
        self.seen: list[int] = []
        self.cursor = after
        self.error: grpc.aio.AioRpcError | None = None
        self._arrived = asyncio.Condition()
        self._start()

    def _start(self) -> None:
        self.error = None
        self._call = self._open(self.cursor)
        self._pump = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for message in self._call:
                async with self._arrived:
                    self.seen.append(message.event.sequence)
                    self.cursor = message.event.sequence
                    self._arrived.notify_all()
        except grpc.aio.AioRpcError as error:
            self.error = error

    async def caught_up(self, sequences: list[int], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout), self._arrived:
            await self._arrived.wait_for(lambda: len(self.seen) >= len(sequences))
        assert self.seen == sequences

    async def ended(self, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            await asyncio.shield(self._pump)

    def resume(self) -> None:
        self._start()

    async def close(self) -> None:
        self._call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump


def assert_ended_for_shutdown(watcher: Watcher, domain: str) -> None:
    error = watcher.error
    assert error is not None and error.code() == grpc.StatusCode.UNAVAILABLE, error
    info = error_info(error)
    assert info is not None, error.details()
    assert (info.reason, info.domain) == ("SERVER_SHUTTING_DOWN", domain)
    # The cursor to resume from: the last event this stream delivered.
    assert info.metadata["resume_after_sequence"] == str(watcher.cursor)


# -- the two services' events ------------------------------------------------------


async def lifecycle_history(pair: Pair, task_id: str = "") -> list[int]:
    c = Client(pair.lc, WS)
    tasks = (
        [task_id]
        if task_id
        else [
            t.task_id
            for t in (
                await pair.lc.ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=WS, page_size=1000))
            ).tasks
        ]
    )
    sequences = []
    for t in tasks:
        sequences += [e.sequence for e in await c.events(t)]
    return sorted(sequences)


async def completion_history(pair: Pair, task_id: str = "") -> list[int]:
    found: list[int] = []
    while True:
        page = await pair.cs.ListCompletionEvents(
            completion_messages.ListCompletionEventsRequest(
                workspace_id=WS, task_id=task_id, after_sequence=found[-1] if found else 0, page_size=1000
            ),
            timeout=T,
        )
        found += [e.sequence for e in page.events]
        if not page.has_more:
            return found


class Agent:
    """Claims tasks and attempts their completion without evidence: each attempt
    is a DECISION_BLOCKED completion event."""

    def __init__(self, pair: Pair) -> None:
        self.pair = pair
        self.runs: dict[str, tuple[str, int]] = {}

    async def claim(self, task_id: str) -> None:
        await Client(self.pair.lc, WS).register(task_id)
        claimed = await self.pair.cs.ClaimTask(
            completion_messages.ClaimTaskRequest(
                workspace_id=WS, task_id=task_id, agent_id="agent", lease_ttl=Duration(seconds=600)
            ),
            timeout=T,
        )
        self.runs[task_id] = (claimed.run.run_id, claimed.lease.epoch)

    async def attempt(self, task_id: str) -> completion_messages.AttemptCompletionResponse:
        run_id, epoch = self.runs[task_id]
        return await self.pair.cs.AttemptCompletion(
            completion_messages.AttemptCompletionRequest(
                workspace_id=WS,
                task_id=task_id,
                run_id=run_id,
                epoch=epoch,
                outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
                result="done",
            ),
            timeout=T,
        )


# -- the test ----------------------------------------------------------------------


async def sigterm_with_open_watchers(
    pair: Pair,
    service: Service,
    domain: str,
    open_stream: Callable[[str], Callable[[int], grpc.aio.UnaryStreamCall]],
    history: Callable[[str], Awaitable[list[int]]],
    slow_call: tuple[str, Callable[[], Awaitable[object]]],
    more_events: Callable[[], Awaitable[None]],
    one_more_event: Callable[[], Awaitable[None]],
    filtered_task: str,
) -> None:
    """`slow_call` is (the method, a call of it that writes an event); `one_more_event`
    writes one event of `filtered_task`."""
    everything = await history("")
    assert len(everything) >= 3
    watchers = [
        Watcher(open_stream("")),
        Watcher(open_stream(""), after=everything[1]),
        Watcher(open_stream(filtered_task)),
    ]
    try:
        for watcher, expected in zip(watchers, [everything, everything[2:], await history(filtered_task)], strict=True):
            await watcher.caught_up(expected)
        process = service.process
        assert process is not None
        method, call = slow_call
        with writes_held(service):
            held = asyncio.ensure_future(call())
            await until_in_flight(service, method)  # it reached the service and waits for the lock
            assert not held.done()
            process.process.send_signal(signal.SIGTERM)
            for watcher in watchers:
                await watcher.ended(timeout=T)
                assert_ended_for_shutdown(watcher, domain)
            # The streams did not wait for the unary call, which is still in flight:
            # not ended by the grace either, which would have ended that call too.
            assert not held.done()
        await asyncio.wait_for(held, T)  # OK once the lock is released: within the grace
        returncode = await asyncio.to_thread(process.process.wait, T)
        assert returncode == 0
        assert b"Traceback" not in service.log_path.read_bytes()

        service.start()  # the same port and database
        await pair._connect()
        await more_events()
        for watcher in watchers:
            watcher.resume()
        everything = await history("")
        for watcher, expected in zip(watchers, [everything, everything[2:], await history(filtered_task)], strict=True):
            await watcher.caught_up(expected)  # all of it: no gap, no duplicate across the restart
        # A duplicate sent after the last event would come before the next one.
        await one_more_event()
        everything = await history("")
        for watcher, expected in zip(watchers, [everything, everything[2:], await history(filtered_task)], strict=True):
            await watcher.caught_up(expected)
            assert watcher.error is None
    finally:
        for watcher in watchers:
            await watcher.close()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_sigterm_ends_lifecycle_watchers_at_once_and_they_resume_without_a_gap(tmp_path, backend):
    pair = await started_pair(tmp_path, backend)
    c = Client(pair.lc, WS)
    try:
        await c.active("t1")
        await c.active("t2")

        def open_stream(task_id: str) -> Callable[[int], grpc.aio.UnaryStreamCall]:
            return lambda after: pair.lc.WatchLifecycleEvents(
                lifecycle_messages.WatchLifecycleEventsRequest(workspace_id=WS, task_id=task_id, after_sequence=after)
            )

        async def slow_call() -> None:
            await pair.lc.SetWorkStatus(
                lifecycle_messages.SetWorkStatusRequest(
                    workspace_id=WS, task_id="t1", generation=1, work_status=lifecycle_enums.WORK_STATUS_IN_PROGRESS
                ),
                timeout=T,
            )

        async def more_events() -> None:
            await Client(pair.lc, WS).work("t1", lifecycle_enums.WORK_STATUS_BLOCKED)
            await Client(pair.lc, WS).active("t3")

        async def one_more_event() -> None:
            await Client(pair.lc, WS).work("t1", lifecycle_enums.WORK_STATUS_IN_PROGRESS)

        await sigterm_with_open_watchers(
            pair,
            pair.lifecycle,
            "funnel.lifecycle.v1",
            open_stream,
            lambda task_id: lifecycle_history(pair, task_id),
            ("SetWorkStatus", slow_call),
            more_events,
            one_more_event,
            "t1",
        )
        assert (await c.task("t3")).state == lifecycle_enums.GENERATION_STATE_ACTIVE
    finally:
        await pair.stop()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_sigterm_ends_completion_watchers_at_once_and_they_resume_without_a_gap(tmp_path, backend):
    pair = await started_pair(tmp_path, backend)
    agent = Agent(pair)
    try:
        for task_id in ("c1", "c2"):
            await agent.claim(task_id)
        for task_id in ("c1", "c2", "c1"):
            await agent.attempt(task_id)

        def open_stream(task_id: str) -> Callable[[int], grpc.aio.UnaryStreamCall]:
            return lambda after: pair.cs.WatchCompletionEvents(
                completion_messages.WatchCompletionEventsRequest(workspace_id=WS, task_id=task_id, after_sequence=after)
            )

        async def slow_call() -> None:
            blocked = await agent.attempt("c1")
            assert blocked.decision.verdict == completion_enums.VERDICT_SOFT_BLOCK

        async def more_events() -> None:
            await agent.attempt("c1")
            await agent.claim("c3")
            await agent.attempt("c3")

        async def one_more_event() -> None:
            await agent.attempt("c1")

        await sigterm_with_open_watchers(
            pair,
            pair.completion,
            "funnel.completion.v1",
            open_stream,
            lambda task_id: completion_history(pair, task_id),
            ("AttemptCompletion", slow_call),
            more_events,
            one_more_event,
            "c1",
        )
    finally:
        await pair.stop()


async def test_sigterm_lets_an_import_finish_in_the_grace_and_cuts_one_still_sending(tmp_path):
    pair = await started_pair(tmp_path, "sqlite")
    lc = Client(pair.lc, WS)
    try:
        for task_id in ("source", "finishes", "cut"):
            await lc.register(task_id)
        await pair.ts.AppendTranscript(
            transcript_messages.AppendTranscriptRequest(
                workspace_id=WS, task_id="source", events=[P.user_message(), *a_full_turn()]
            ),
            timeout=T,
        )
        exported = b"".join(
            [
                chunk.jsonl
                async for chunk in pair.ts.ExportTranscript(
                    transcript_messages.ExportTranscriptRequest(workspace_id=WS, task_id="source"), timeout=T
                )
            ]
        )
        half = exported.index(b"\n") + 1  # a first line, the rest later

        # Their deadline outlasts the grace from the SIGTERM on, which comes only after
        # this setup: the cut one waits for the grace's end (a deadline of T alone ran
        # out first in a loaded run, the setup having taken longer than the drain's margin).
        imports = {name: pair.ts.ImportTranscript(timeout=T + GRACE) for name in ("finishes", "cut")}
        for name, call in imports.items():
            await call.write(
                transcript_messages.ImportTranscriptRequest(
                    target=transcript_messages.ImportTarget(workspace_id=WS, task_id=name)
                )
            )
            await call.write(transcript_messages.ImportTranscriptRequest(jsonl_chunk=exported[:half]))
        await until_in_flight(pair.completion, "ImportTranscript", calls=2)

        process = pair.completion.process
        assert process is not None
        process.process.send_signal(signal.SIGTERM)
        await until_stopping(pair.completion)
        finishing = imports["finishes"]
        await finishing.write(transcript_messages.ImportTranscriptRequest(jsonl_chunk=exported[half:]))
        await finishing.done_writing()
        done = await finishing
        assert done.imported_events == exported.count(b"\n")

        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await imports["cut"]
        # Cut by the service before the grace ended it (that would be CANCELLED, no reason).
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
        info = error_info(caught.value)
        assert info is not None and (info.reason, info.domain) == ("SERVER_SHUTTING_DOWN", "funnel.completion.v1")
        assert await asyncio.to_thread(process.process.wait, T) == 0

        pair.completion.start()
        await pair._connect()
        states = {}
        for task_id in ("source", "finishes", "cut"):
            page = await pair.ts.LoadTranscript(
                transcript_messages.LoadTranscriptRequest(workspace_id=WS, task_id=task_id, page_size=1000), timeout=T
            )
            states[task_id] = len(page.events)
        # All or nothing: the finished import is whole, the cut one left nothing behind.
        assert states == {"source": states["source"], "finishes": states["source"], "cut": 0}
    finally:
        await pair.stop()
