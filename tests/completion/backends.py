"""The completion store's adapters, for the conformance suite (test_storage.py) and
any test that runs against every backend.

Adding an adapter is one entry in BACKENDS: `async def make(tmp_path, clock) -> CompletionStore`
returning an empty, open store (the caller closes it). "postgresql" gets a new, empty
schema on the test process's server (tests/postgres.py)."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from completion_service.storage.memory import MemoryCompletionStore
from completion_service.storage.port import CompletionStore
from completion_service.storage.postgres import PostgresCompletionStore
from completion_service.storage.sqlite import SqliteCompletionStore
from funnel.runtime.clock import Clock
from tests.postgres import fresh_database

BackendFactory = Callable[[Path, Clock], Awaitable[CompletionStore]]


async def make_memory(tmp_path: Path, clock: Clock) -> CompletionStore:
    return MemoryCompletionStore()


async def make_sqlite(tmp_path: Path, clock: Clock) -> CompletionStore:
    return await SqliteCompletionStore.open(str(tmp_path / "completion.sqlite3"))


@functools.cache
def _shared_database() -> str:
    return fresh_database()


async def make_postgresql(tmp_path: Path, clock: Clock) -> CompletionStore:
    """A new, empty schema in a database of the test process's PostgreSQL
    (tests/postgres.py): cheaper than a database per store, as alone."""
    url = await asyncio.to_thread(_shared_database)
    return await PostgresCompletionStore.open(url, schema=f"t_{uuid.uuid4().hex[:16]}", pool_size=4)


BACKENDS: dict[str, BackendFactory] = {
    "memory": make_memory,
    "sqlite": make_sqlite,
    "postgresql": make_postgresql,
}
# The adapters whose writes run one at a time, so that concurrent writes commit
# in the order they were submitted (PostgreSQL's run at once, on a pool).
ONE_WRITER = {"memory", "sqlite"}
