"""Fixtures of the lifecycle tests: `backend`, a fresh `LifecycleStore` of each
storage adapter, for the conformance suite (test_storage.py).

Adding an adapter is one entry in BACKENDS: `async def make(tmp_path, clock) -> LifecycleStore`
returning an empty, open store (the fixture closes it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from funnel.runtime.clock import Clock
from lifecycle_service.storage.memory import MemoryLifecycleStore
from lifecycle_service.storage.port import LifecycleStore
from lifecycle_service.storage.sqlite import SqliteLifecycleStore

BackendFactory = Callable[[Path, Clock], Awaitable[LifecycleStore]]


async def make_memory(tmp_path: Path, clock: Clock) -> LifecycleStore:
    return MemoryLifecycleStore()


async def make_sqlite(tmp_path: Path, clock: Clock) -> LifecycleStore:
    return await SqliteLifecycleStore.open(str(tmp_path / "lifecycle.sqlite3"))


BACKENDS: dict[str, BackendFactory] = {
    "memory": make_memory,
    "sqlite": make_sqlite,
}


@pytest.fixture(params=list(BACKENDS))
async def backend(request, tmp_path, clock) -> AsyncIterator[LifecycleStore]:
    store = await BACKENDS[request.param](tmp_path, clock)
    try:
        yield store
    finally:
        await store.close()
