"""The SQLite writer's group commit (funnel/runtime/sqlite.py) under many waves of
concurrent writes: every write is answered, answers and after-commit hooks come
in commit order, and a write that raises fails alone. The database thread starts
the next group itself, still lets other work on its connection run, and however
the writer or the event loop ends, every write given to it is answered."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from funnel.auth.principal import Principal, Role
from funnel.runtime import calls
from funnel.runtime import sqlite as sqlite_module
from funnel.runtime.sqlite import MAX_GROUP, PIPELINE_GROUPS, Database
from funnel.runtime.storage_errors import StorageUnavailable


async def open_scratch(tmp_path, **options) -> Database:
    path = tmp_path / "writer.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
    db.close()
    return await Database.open(str(path), [], **options)


def insert(name: str):
    def fn(db: sqlite3.Connection) -> int:
        return db.execute("INSERT INTO t (name) VALUES (?) RETURNING id", (name,)).fetchone()[0]

    return fn


async def test_many_concurrent_writes_commit_answer_and_publish_in_commit_order(tmp_path):
    database = await open_scratch(tmp_path)
    published: list[int] = []
    try:

        async def wave(n: int) -> list[object]:
            writes = [
                database.write(
                    insert(f"w{n}-{i}") if i != 3 else _failing,
                    after_commit=published.append,
                )
                for i in range(8)
            ]
            return await asyncio.gather(*writes, return_exceptions=True)

        results = [r for rs in await asyncio.gather(*(wave(n) for n in range(25))) for r in rs]
        failed = [r for r in results if isinstance(r, Exception)]
        committed = [r for r in results if not isinstance(r, Exception)]
        assert len(failed) == 25 and all(isinstance(e, ValueError) for e in failed)
        assert sorted(committed) == list(range(1, 176))
        assert published == sorted(published) == list(range(1, 176))  # ids grow in commit order
        rows = await database.read(lambda db: db.execute("SELECT count(*) FROM t").fetchone()[0])
        assert rows == 175
    finally:
        await database.close()


def _failing(db: sqlite3.Connection) -> int:
    db.execute("INSERT INTO t (name) VALUES ('undone')")
    raise ValueError("fails alone")


async def test_the_database_thread_starts_the_next_group_while_the_event_loop_is_busy(tmp_path):
    database = await open_scratch(tmp_path)
    first_running, release_first, second_ran = threading.Event(), threading.Event(), threading.Event()

    def first(db: sqlite3.Connection) -> int:
        first_running.set()
        release_first.wait(5)
        return insert("first")(db)

    def second(db: sqlite3.Connection) -> int:
        second_ran.set()
        return insert("second")(db)

    try:
        one = asyncio.ensure_future(database.write(first))
        assert await asyncio.to_thread(first_running.wait, 5)
        two = asyncio.ensure_future(database.write(second))
        for _ in range(3):  # the second write is queued behind the first group
            await asyncio.sleep(0)
        release_first.set()
        # The event loop blocks here: only the database thread can begin the second group.
        assert second_ran.wait(5), "the second group waited for the event loop to hand it over"
        assert (await one, await two) == (1, 2)
    finally:
        await database.close()


async def test_a_steady_stream_of_writes_does_not_starve_other_work_on_the_connection(tmp_path):
    database = await open_scratch(tmp_path)
    most = 2000
    probed = asyncio.Event()
    writes: list[asyncio.Future[int]] = []

    def slow_insert(name: str):
        def fn(db: sqlite3.Connection) -> int:
            time.sleep(0.002)  # writes arrive faster than they commit: some are always pending
            return insert(name)(db)

        return fn

    async def produce() -> int:
        while not probed.is_set() and len(writes) < most:
            writes.append(asyncio.ensure_future(database.write(slow_insert(f"w{len(writes)}"))))
            await asyncio.sleep(0.001)
        return len(writes)

    async def probe() -> None:
        await asyncio.sleep(0.05)  # the stream is under way
        await database.check_writable()
        probed.set()

    try:
        produced, _ = await asyncio.gather(produce(), probe())
        assert produced < most, "the health probe waited until the writes stopped coming"
        assert sorted(await asyncio.gather(*writes)) == list(range(1, produced + 1))
    finally:
        await database.close()


# Writes queued behind a held group: more than one turn of the database thread takes.
QUEUED = 2 * PIPELINE_GROUPS * MAX_GROUP


@contextlib.contextmanager
def released_at_the_end(release: threading.Event) -> Iterator[None]:
    """However the test ends, the database thread is let go (it is not a daemon)."""
    try:
        yield
    finally:
        release.set()


@contextlib.contextmanager
def thread_failures() -> Iterator[list[threading.ExceptHookArgs]]:
    """The exceptions that end threads meanwhile (a database thread that dies), caught."""
    failures: list[threading.ExceptHookArgs] = []
    previous, threading.excepthook = threading.excepthook, failures.append
    try:
        yield failures
    finally:
        threading.excepthook = previous


def blocker() -> tuple[threading.Event, threading.Event, object]:
    """A write that holds the database thread until released: (running, release, fn)."""
    running, release = threading.Event(), threading.Event()

    def fn(db: sqlite3.Connection) -> int:
        running.set()
        release.wait(10)
        return insert("held")(db)

    return running, release, fn


async def test_a_cancelled_owner_answers_every_write_it_was_given(tmp_path):
    """The database's owner cancelled (the event loop going away) while a group is on
    the database thread and more writes wait: the group commits and is answered with
    its results, the writes behind it and any given later fail unapplied; none is
    left waiting, and the owner closes the connection last."""
    database = await open_scratch(tmp_path)
    running, release, held = blocker()
    try:
        first = asyncio.ensure_future(database.write(held))
        assert await asyncio.to_thread(running.wait, 10)
        # More than one turn of the database thread takes (PIPELINE_GROUPS x MAX_GROUP).
        queued = [asyncio.ensure_future(database.write(insert(f"q{n}"))) for n in range(QUEUED)]
        await asyncio.sleep(0)
        database._owner.cancel()
        await asyncio.sleep(0)
        with pytest.raises(StorageUnavailable):  # while the owner still waits for the turn
            await database.write(insert("late"))
        release.set()
        results = await asyncio.wait_for(asyncio.gather(first, *queued, return_exceptions=True), 30)
        assert results[0] == 1
        committed = [r for r in results[1:] if isinstance(r, int)]
        refused = [r for r in results[1:] if isinstance(r, Exception)]
        assert all(isinstance(r, StorageUnavailable) for r in refused) and len(committed) + len(refused) == QUEUED
        await asyncio.wait_for(database.close(), 30)  # the owner's end, already under way
        with pytest.raises(ValueError, match="no active connection"):  # aiosqlite's word for a closed one
            await database._connection.execute("SELECT 1")
        with contextlib.closing(sqlite3.connect(tmp_path / "writer.sqlite3")) as db:
            rows = db.execute("SELECT count(*) FROM t").fetchone()[0]
        assert rows == 1 + len(committed)  # what was answered committed is there, nothing more
    finally:
        release.set()
        await database.close()


async def test_closing_answers_every_queued_write_and_refuses_later_ones(tmp_path):
    database = await open_scratch(tmp_path)
    running, release, held = blocker()
    first = asyncio.ensure_future(database.write(held))
    assert await asyncio.to_thread(running.wait, 10)
    queued = [asyncio.ensure_future(database.write(insert(f"q{n}"))) for n in range(QUEUED)]
    closing = asyncio.ensure_future(database.close())
    await asyncio.sleep(0)
    with pytest.raises(StorageUnavailable, match="closed"):
        await database.write(insert("late"))
    release.set()
    await asyncio.wait_for(closing, 30)
    assert sorted(await asyncio.gather(first, *queued)) == list(range(1, QUEUED + 2))


async def test_a_cancelled_close_still_closes_and_answers_everything(tmp_path):
    database = await open_scratch(tmp_path)
    running, release, held = blocker()
    first = asyncio.ensure_future(database.write(held))
    assert await asyncio.to_thread(running.wait, 10)
    queued = [asyncio.ensure_future(database.write(insert(f"q{n}"))) for n in range(QUEUED)]
    closing = asyncio.ensure_future(database.close())
    await asyncio.sleep(0)
    closing.cancel()
    release.set()
    assert sorted(await asyncio.wait_for(asyncio.gather(first, *queued), 30)) == list(range(1, QUEUED + 2))
    await asyncio.wait_for(database.close(), 30)  # the one closing, finished
    with pytest.raises(ValueError, match="no active connection"):  # aiosqlite's word for a closed one
        await database._connection.execute("SELECT 1")


class ManualClock:
    """The database's clock, a day ahead of the event loop's, moved by hand."""

    def __init__(self) -> None:
        self.now = 86_400.0 + time.monotonic()

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("waited", "commits"), [(0.4, True), (0.6, False)])
async def test_a_writes_lock_deadline_is_the_time_it_had_left_on_the_databases_clock(tmp_path, waited, commits):
    """The caller's deadline (event-loop time) reaches the database thread as the
    time the write had left, on the database's own clock: a write given 0.5 s that
    waits behind another group for 0.4 s of that clock still commits, one that
    waits 0.6 s fails unapplied. Judged on the loop's clock, or as an event-loop
    time against the database's, both would commit, or both fail."""
    clock = ManualClock()
    database = await open_scratch(tmp_path, clock=clock)
    running, release, held = blocker()
    with released_at_the_end(release):
        first = asyncio.ensure_future(database.write(held))
        assert await asyncio.to_thread(running.wait, 10)

        async def late() -> int:
            calls.enter(calls.Call(Principal("tester"), Role.HOST, False, ""), asyncio.get_running_loop().time() + 0.5)
            return await database.write(insert("late"))

        behind = asyncio.ensure_future(late())
        await asyncio.sleep(0)  # queued behind the held group
        clock.now += waited
        release.set()
        assert await asyncio.wait_for(first, 30) == 1
        if commits:
            assert await asyncio.wait_for(behind, 30) == 2
        else:
            with pytest.raises(StorageUnavailable, match="locked until the caller's deadline"):
                await asyncio.wait_for(behind, 30)
    await database.close()


async def test_a_write_behind_a_longer_lock_wait_fails_at_its_own_deadline(tmp_path):
    """Another connection holds the write lock, and a write without a caller (a
    background pass: it may wait DEFAULT_LOCK_WAIT for the lock) is already waiting
    for it when a caller's write with 0.5 s left comes. The caller's write fails
    unapplied at its own deadline, not once the write ahead of it gives up. Found by
    tests/security/test_attacks.py under load: the outbox's pass, every 0.5 s,
    queued a RecordEvidence behind its own 5 s wait, past the call's deadline."""
    database = await open_scratch(tmp_path)
    holder = sqlite3.connect(database.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        background = asyncio.ensure_future(database.write(insert("background")))
        await asyncio.sleep(0.3)  # its group is on the database thread, waiting for the lock

        async def called() -> int:
            calls.enter(calls.Call(Principal("tester"), Role.HOST, False, ""), asyncio.get_running_loop().time() + 0.5)
            return await database.write(insert("called"))

        started = time.monotonic()
        with pytest.raises(StorageUnavailable, match="locked until the caller's deadline"):
            await asyncio.wait_for(called(), 30)
        assert time.monotonic() - started < 2.0  # 0.5 s, one slice of the lock wait, and a loaded machine's slack
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert await asyncio.wait_for(background, 30) == 1  # the background write commits once the lock is free
    await database.close()


@pytest.mark.parametrize("operation", ["write", "run"])
def test_answers_for_a_closed_event_loop_do_not_end_the_database_thread(tmp_path, operation):
    """The event loop closes while a group (or a read, a probe: `run`) is on the
    database thread: its answer has no loop to go to, and the thread (aiosqlite's,
    shared by every later operation on the connection) must survive posting it.
    A full suite under load met the `run` case: a thread ended by "Event loop is
    closed", reported in whichever test ran next."""
    running, release, held = blocker()
    with thread_failures() as failures, released_at_the_end(release):
        loop = asyncio.new_event_loop()
        database = loop.run_until_complete(open_scratch(tmp_path))
        # A write's group, or any other operation on the thread (a read, a probe).
        writes = [loop.create_task(database.write(held) if operation == "write" else database.run(held))]
        loop.run_until_complete(asyncio.to_thread(running.wait, 10))
        writes.append(loop.create_task(database.write(insert("behind"))))
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()  # with the group still on the database thread
        release.set()
        thread = database._connection._thread
        thread.join(0.5)
        assert thread.is_alive() and failures == []
        # The thread still runs work: the connection is closed from a new loop.
        fresh = asyncio.new_event_loop()
        fresh.run_until_complete(database._connection.close())
        fresh.close()
        thread.join(10)
        assert not thread.is_alive() and failures == []


def test_an_owner_finalized_while_another_event_loop_runs_ends_quietly(tmp_path):
    """An owner left pending by a closed event loop is finalized by the garbage
    collector, whenever it runs: with another loop running, it once took that loop
    for its own and awaited its connection's close while being finalized ("coroutine
    ignored GeneratorExit", reported in whichever test ran then)."""
    loop = asyncio.new_event_loop()
    database = loop.run_until_complete(open_scratch(tmp_path))
    connection = database._connection
    loop.close()  # the owner still pending
    del database, loop
    ignored: list[object] = []
    previous, sys.unraisablehook = sys.unraisablehook, ignored.append
    fresh = asyncio.new_event_loop()
    try:
        fresh.run_until_complete(asyncio.to_thread(lambda: None))  # a loop running...
        fresh.run_until_complete(_collect_garbage())  # ...while the owner is finalized
    finally:
        sys.unraisablehook = previous
    fresh.run_until_complete(asyncio.wait_for(connection.close(), 10))
    fresh.close()
    connection._thread.join(10)
    assert not connection._thread.is_alive()
    assert [hook.exc_value for hook in ignored if "_own" in repr(hook.object)] == []  # type: ignore[attr-defined]


async def _collect_garbage() -> None:
    gc.collect()


@pytest.mark.parametrize("cancels", [1, 2])
def test_a_close_cancelled_meanwhile_waits_for_the_database_threads_answers(tmp_path, cancels):
    """aiosqlite answers a close (and its thread's stop) on the event loop: a close
    whose task stopped waiting let the loop close first, and the thread died posting
    to it. A loaded run met it in an integrity check cancelled twice while it closed
    its connection; the close now ends only once the thread has answered."""
    running, release, held = blocker()
    with thread_failures() as failures, released_at_the_end(release):
        loop = asyncio.new_event_loop()
        database = loop.run_until_complete(open_scratch(tmp_path))
        connection = database._connection
        busy = loop.create_task(database.run(held))  # the close queues behind it
        loop.run_until_complete(asyncio.to_thread(running.wait, 10))
        closing = loop.create_task(sqlite_module._close_connection(connection))
        loop.run_until_complete(asyncio.sleep(0))
        for _ in range(cancels):
            closing.cancel()
            loop.run_until_complete(asyncio.sleep(0.01))
        assert not closing.done()  # still waiting for the thread
        release.set()
        with pytest.raises(asyncio.CancelledError):
            loop.run_until_complete(closing)
        loop.run_until_complete(busy)
        loop.close()
        connection._thread.join(10)
        assert not connection._thread.is_alive() and failures == []
