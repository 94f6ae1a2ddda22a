"""Mutual exclusion per key, in one process: for a sequence of awaits that must
not interleave with another sequence for the same key (a claim that asks the
lifecycle service before it commits, see completion_service/authority/leases.py).
An entry lives only while its key is held or awaited, so the keys may be many."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable


class KeyedLocks:
    def __init__(self) -> None:
        # key -> (its lock, how many hold or await it)
        self._entries: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, *keys: tuple[str, ...]) -> AsyncIterator[None]:
        """Holds every key, taken in one global order so that two holders of
        overlapping keys cannot deadlock."""
        async with contextlib.AsyncExitStack() as stack:
            for key in sorted(set(keys)):
                await stack.enter_async_context(self._one(key))
            yield

    @contextlib.asynccontextmanager
    async def _one(self, key: tuple[str, ...]) -> AsyncIterator[None]:
        lock, users = self._entries.get(key) or (asyncio.Lock(), 0)
        self._entries[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._entries[key]
            if users == 1:
                del self._entries[key]
            else:
                self._entries[key] = (lock, users - 1)

    def __len__(self) -> int:
        """Keys held or awaited now."""
        return len(self._entries)
