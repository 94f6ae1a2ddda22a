"""The completion store's adapters, for the conformance suite (test_storage.py) and
any test that runs against every backend.

Adding an adapter is one entry in BACKENDS: `async def make(tmp_path, clock) -> CompletionStore`
returning an empty, open store (the caller closes it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from completion_service.storage.memory import MemoryCompletionStore
from completion_service.storage.port import CompletionStore
from completion_service.storage.sqlite import SqliteCompletionStore
from funnel.runtime.clock import Clock

BackendFactory = Callable[[Path, Clock], Awaitable[CompletionStore]]


async def make_memory(tmp_path: Path, clock: Clock) -> CompletionStore:
    return MemoryCompletionStore()


async def make_sqlite(tmp_path: Path, clock: Clock) -> CompletionStore:
    return await SqliteCompletionStore.open(str(tmp_path / "completion.sqlite3"))


BACKENDS: dict[str, BackendFactory] = {
    "memory": make_memory,
    "sqlite": make_sqlite,
}
