"""The SQLite writer's group commit (funnel/runtime/sqlite.py) under many waves of
concurrent writes: every write is answered, answers and after-commit hooks come
in commit order, and a write that raises fails alone. The database thread starts
the next group itself, and still lets other work on its connection run."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time

from funnel.runtime.sqlite import Database


async def open_scratch(tmp_path) -> Database:
    path = tmp_path / "writer.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
    db.close()
    return await Database.open(str(path), [])


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
