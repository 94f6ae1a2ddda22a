"""Fixtures of the lifecycle tests.

`backend`: a fresh `LifecycleStore` of each storage adapter, for the conformance
suite (test_storage.py). Adding an adapter is one entry in BACKENDS:
`async def make(tmp_path, clock) -> LifecycleStore` returning an empty, open store
(the fixture closes it).

`server_backend`: the in-process servers of the end-to-end tests (test_service_e2e.py,
test_watch.py, test_concurrency.py) run on each engine of SERVER_BACKENDS: this
package's `start_lifecycle` gives each server a new database of the test's engine
unless the test names one (`lifecycle_database()` makes one)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psycopg
import pytest

from funnel.runtime.clock import Clock
from funnel.runtime.postgres import is_postgres_url
from lifecycle_service.storage.memory import MemoryLifecycleStore
from lifecycle_service.storage.port import LifecycleStore
from lifecycle_service.storage.postgres import PostgresLifecycleStore
from lifecycle_service.storage.sqlite import SqliteLifecycleStore
from tests.postgres import fresh_database

BackendFactory = Callable[[Path, Clock], Awaitable[LifecycleStore]]


async def make_memory(tmp_path: Path, clock: Clock) -> LifecycleStore:
    return MemoryLifecycleStore()


async def make_sqlite(tmp_path: Path, clock: Clock) -> LifecycleStore:
    return await SqliteLifecycleStore.open(str(tmp_path / "lifecycle.sqlite3"))


async def make_postgresql(tmp_path: Path, clock: Clock) -> LifecycleStore:
    return await PostgresLifecycleStore.open(await asyncio.to_thread(fresh_database))


BACKENDS: dict[str, BackendFactory] = {
    "memory": make_memory,
    "sqlite": make_sqlite,
    "postgresql": make_postgresql,
}


@pytest.fixture(params=list(BACKENDS))
async def backend(request, tmp_path, clock) -> AsyncIterator[LifecycleStore]:
    store = await BACKENDS[request.param](tmp_path, clock)
    try:
        yield store
    finally:
        await store.close()


# -- servers ---------------------------------------------------------------------

SERVER_BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=SERVER_BACKENDS)
def server_backend(request) -> str:
    return request.param


class RecycledDatabases:
    """Empty PostgreSQL databases for this test process. Creating one costs a few
    hundred milliseconds and megabytes; a database a finished test used is emptied
    (its schemas dropped) and handed out again instead."""

    def __init__(self) -> None:
        self._free: list[str] = []

    def take(self) -> str:
        while self._free:
            url = self._free.pop()
            try:
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("SET lock_timeout = 2000")
                    for (schema,) in conn.execute(
                        "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' "
                        "AND nspname NOT IN ('public', 'information_schema')"
                    ).fetchall():
                        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
                return url
            except psycopg.Error:  # still in use (a test left a connection behind): forget it
                continue
        return fresh_database()

    def give_back(self, url: str) -> None:
        self._free.append(url)


RECYCLED = RecycledDatabases()


@pytest.fixture
async def lifecycle_database(server_backend, tmp_path) -> AsyncIterator[Callable[[], Awaitable[str]]]:
    """A factory of empty databases of the test's engine: a new SQLite file under
    tmp_path, or the URL of an empty PostgreSQL database (emptied and handed out
    again only once this test has ended, its servers stopped)."""
    numbers = itertools.count()
    taken: list[str] = []

    async def new() -> str:
        if server_backend == "postgresql":
            taken.append(await asyncio.to_thread(RECYCLED.take))
            return taken[-1]
        return str(tmp_path / f"lifecycle-db-{next(numbers)}.sqlite3")

    yield new
    for url in taken:
        RECYCLED.give_back(url)


async def open_store(database: str) -> LifecycleStore:
    """The store a server would open on `database` (to prepare or inspect it)."""
    if is_postgres_url(database):
        return await PostgresLifecycleStore.open(database)
    return await SqliteLifecycleStore.open(database)


@pytest.fixture
async def start_lifecycle(start_lifecycle, lifecycle_database):
    """tests/conftest.py's factory, on a new database of the test's engine by default."""

    async def _start(**overrides):
        if "database" not in overrides:
            overrides["database"] = await lifecycle_database()
        return await start_lifecycle(**overrides)

    return _start
