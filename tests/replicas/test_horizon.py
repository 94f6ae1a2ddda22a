"""Numbers on PostgreSQL without a hot row (docs/architecture.md, "Numbers on
PostgreSQL"), for each service, on two replicas' stores of one database.

The first transaction takes its number and is held open before its commit; the
second, on the other replica, commits meanwhile. With a counter row the second
would wait for the first's commit, and this test would hang at its first step.
Here it commits at once and its writer reads its own event; the tails (what
feeds every watcher of a replica) hold it back while the first is open, then
deliver both in one order, and a tail that started between the two commits
misses neither."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from completion_service.core.model import CompletionEvent, CompletionEventKind
from completion_service.storage.postgres import PostgresCompletionStore
from funnel.runtime.tail import Tailer
from lifecycle_service.storage.postgres import PostgresLifecycleStore
from tests.lifecycle.test_storage import event_of, record
from tests.postgres import fresh_database

WS = "horizon"
T = 30.0  # s: a bound for what must happen, never a wait for what must not


@dataclass
class Service:
    """What the test does with one service's store."""

    open: Callable[[str], Awaitable[Any]]
    # A unit of work writing one event of the task; `hold`, when given, is waited
    # for inside the transaction, after the event is numbered.
    unit: Callable[[str, threading.Event | None], Callable[[Any], Any]]
    own_events: Callable[[Any, str], Awaitable[list[int]]]


def lifecycle_unit(task_id: str, hold: threading.Event | None):
    def unit(tx):
        task = record(task_id, workspace=WS)
        tx.tasks.insert(task)
        event = tx.events.append(event_of(task))
        if hold is not None:
            assert hold.wait(T), "the test never released the first transaction"
        return event

    return unit


def completion_unit(task_id: str, hold: threading.Event | None):
    def unit(tx):
        event = tx.events.append(CompletionEvent(WS, task_id, 1, CompletionEventKind.RUN_CLAIMED, f"run-{task_id}", 1))
        if hold is not None:
            assert hold.wait(T), "the test never released the first transaction"
        return event

    return unit


async def lifecycle_own(store, task_id: str) -> list[int]:
    return [e.sequence for e in await store.read(lambda tx: tx.events.history(WS, task_id, 0, 10))]


async def completion_own(store, task_id: str) -> list[int]:
    return [e.sequence for e in await store.read(lambda tx: tx.events.page(WS, 0, task_id, 10))]


SERVICES = {
    "lifecycle": Service(PostgresLifecycleStore.open, lifecycle_unit, lifecycle_own),
    "completion": Service(PostgresCompletionStore.open, completion_unit, completion_own),
}


class Watcher:
    """A replica's tail, as its server runs it, publishing into a list."""

    def __init__(self, store, start_after: int) -> None:
        self.sequences: list[int] = []
        self.tailer = Tailer(
            store.events_since, lambda e: e.sequence, lambda e: self.sequences.append(e.sequence), start_after
        )
        self._task = asyncio.create_task(self.tailer.run(store.notifications(poll=0.2)))

    async def until(self, expected: list[int]) -> None:
        async with asyncio.timeout(T):
            while self.sequences != expected:
                assert len(self.sequences) < len(expected), self.sequences
                self.tailer.poke()
                await asyncio.sleep(0.02)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


@pytest.mark.parametrize("name", sorted(SERVICES))
async def test_a_commit_does_not_wait_for_an_open_one_and_every_watcher_delivers_both_in_one_order(name):
    service = SERVICES[name]
    url = await asyncio.to_thread(fresh_database)
    first_store, second_store = await service.open(url), await service.open(url)
    watchers: list[Watcher] = []
    hold = threading.Event()
    try:
        # A first event makes what is made once per database (the lifecycle's row
        # of the caller, whose unique key a second writer would rightly wait on).
        before = (await first_store.write(service.unit("before", None))).sequence
        watchers += [Watcher(first_store, before), Watcher(second_store, before)]
        first = asyncio.create_task(first_store.write(service.unit("first", hold)))
        # The first has numbered its event (its transaction id is assigned) before the second starts.
        async with asyncio.timeout(T):
            while not await second_store.read(lambda tx: _running_writers(tx)):
                await asyncio.sleep(0.01)

        second = await asyncio.wait_for(second_store.write(service.unit("second", None)), T)
        assert not first.done()
        # Its writer sees it at once, in its task's own listing.
        assert await service.own_events(second_store, "second") == [second.sequence]
        # A watcher joining now starts below both: the second is committed but above the horizon.
        joined_at = await second_store.latest_sequence()
        assert joined_at == before
        read = await second_store.events_since(before, 10)
        assert read.events == [] and read.held_back
        watchers.append(Watcher(second_store, joined_at))
        for watcher in watchers:
            assert watcher.sequences == []

        hold.set()
        first_event = await asyncio.wait_for(first, T)
        assert first_event.sequence < second.sequence  # numbered from its earlier transaction id
        both = [first_event.sequence, second.sequence]
        for watcher in watchers:
            await watcher.until(both)
        assert [e.sequence for e in (await first_store.events_since(before, 10)).events] == both
    finally:
        hold.set()
        for watcher in watchers:
            await watcher.close()
        await first_store.close()
        await second_store.close()


def _running_writers(tx) -> bool:
    """Whether a transaction with an id, other than this reader's, is running in the database."""
    (count,) = tx._s.db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()"
        " AND datname = current_database()"
    ).fetchone()
    return count > 0
