"""Feeds a service's watch broker from its event table, in sequence order, when
several replicas write to one database.

With one process, each commit publishes its own event after committing, in
commit order (funnel.runtime.sqlite's group commit). With replicas, an event may
be committed by another process, and concurrent commits of this one finish in
any order on the event loop; publishing them as they come could deliver 12
before 11, and `follow()` would then skip 11. So on PostgreSQL nothing is
published directly: a commit, and a notification from any replica's commit,
only wake the tailer, which reads the table after the last sequence it
published and publishes what it finds in order. The table by cursor is the
truth; the wake-ups only make it prompt. Sequences become visible in commit
order (the storage adapters take them from one locked counter row inside the
writing transaction), so reading by cursor never skips a late commit."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Generic, TypeVar

from funnel.runtime.storage_errors import StorageUnavailable

log = logging.getLogger(__name__)
Event = TypeVar("Event")

BATCH = 1000
RETRY_DELAY = 0.5


class Tailer(Generic[Event]):
    def __init__(
        self,
        read_after: Callable[[int, int], Awaitable[list[Event]]],
        sequence_of: Callable[[Event], int],
        publish: Callable[[Event], None],
        start_after: int,
    ) -> None:
        self._read_after = read_after
        self._sequence_of = sequence_of
        self._publish = publish
        self.cursor = start_after
        self._wakeup = asyncio.Event()

    def poke(self) -> None:
        """Something committed: read the table soon."""
        self._wakeup.set()

    async def run(self, wakeups: AsyncIterator[None]) -> None:
        """Publishes events as they become visible, until cancelled; `wakeups`
        yields on each notification from another replica (and on its poll)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._forward(wakeups))
            group.create_task(self._drain_forever())

    async def _forward(self, wakeups: AsyncIterator[None]) -> None:
        async for _ in wakeups:
            self._wakeup.set()

    async def _drain_forever(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                await self.drain()
            except StorageUnavailable as exc:
                log.warning("event tail postponed: %s", exc)
                await asyncio.sleep(RETRY_DELAY)
                self._wakeup.set()
            except Exception:  # the tail must survive any single failure
                log.exception("event tail failed; retrying")
                await asyncio.sleep(RETRY_DELAY)
                self._wakeup.set()

    async def drain(self) -> int:
        """Publishes every event after the cursor; returns how many."""
        published = 0
        while True:
            events = await self._read_after(self.cursor, BATCH)
            for event in events:
                self._publish(event)
                self.cursor = self._sequence_of(event)
                published += 1
            if len(events) < BATCH:
                return published
