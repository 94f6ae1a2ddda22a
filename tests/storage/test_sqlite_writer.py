"""The SQLite writer's group commit (funnel/runtime/sqlite.py) under many waves of
concurrent writes: every write is answered, answers and after-commit hooks come
in commit order, and a write that raises fails alone."""

from __future__ import annotations

import asyncio
import sqlite3

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
