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
truth; the wake-ups only make it prompt.

A read delivers only the events below the database's horizon, the numbers no
transaction still running can take (funnel.runtime.postgres.HORIZON), so
reading by cursor never skips a late commit. An event already committed but
above the horizon is held back until the transactions that started before it
have ended; none of them may announce its end (it may write no event), so the
tail reads again after HELD_BACK_RECHECK while anything is held back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from funnel.runtime.storage_errors import StorageUnavailable

log = logging.getLogger(__name__)
Event = TypeVar("Event")

BATCH = 1000
RETRY_DELAY = 0.5
# Seconds between reads while a committed event waits for the horizon. What
# holds it back is mostly another commit with events, whose wake-up (a local
# poke, another replica's notification) comes first; this bounds the wait for a
# transaction that writes no event (or the other service's, sharing the
# database), at a few reads a second more while commits keep overlapping.
HELD_BACK_RECHECK = 0.02


@dataclass(frozen=True)
class TailRead(Generic[Event]):
    """One read of the event table after a cursor: the deliverable events in
    order, and whether committed events beyond them wait for the horizon."""

    events: Sequence[Event]
    held_back: bool


class Tailer(Generic[Event]):
    def __init__(
        self,
        read_after: Callable[[int, int], Awaitable[TailRead[Event]]],
        sequence_of: Callable[[Event], int],
        publish: Callable[[Event], None],
        start_after: int,
        announce: Callable[[], None] = lambda: None,
    ) -> None:
        self._read_after = read_after
        self._sequence_of = sequence_of
        self._publish = publish
        self._announce = announce
        self.cursor = start_after
        self._wakeup = asyncio.Event()
        self._held_back = False

    def poke(self) -> None:
        """This replica committed events: read the table soon, and announce them
        to the other replicas (`announce`, which the store coalesces)."""
        self._wakeup.set()
        self._announce()

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
            if self._held_back:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), HELD_BACK_RECHECK)
            else:
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
            read = await self._read_after(self.cursor, BATCH)
            for event in read.events:
                self._publish(event)
                self.cursor = self._sequence_of(event)
                published += 1
            self._held_back = read.held_back
            if len(read.events) < BATCH:
                return published
