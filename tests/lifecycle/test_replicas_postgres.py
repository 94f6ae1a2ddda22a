"""Two replicas of the lifecycle service on one PostgreSQL database: what must hold
when they receive the same or conflicting requests at the same moment.

Store level: two `PostgresLifecycleStore`s (two connection pools, as two processes
have) with an authority each. Server level: two in-process lifecycle servers on one
database URL, a watcher on one and writers on both. Units of work are widened with a
slow render (inside the transaction) so that the races really overlap."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.runtime.clock import ManualClock
from funnel.runtime.errors import Rejection
from lifecycle_service.authority import LifecycleAuthority
from lifecycle_service.core import intents as i
from lifecycle_service.core.model import (
    Cause,
    ChildRef,
    GenerationState,
    IntentKind,
    LifecycleEvent,
    LinkMode,
    ParentLink,
    Policy,
    Propagation,
    TaskRecord,
    WorkStatus,
)
from lifecycle_service.storage.postgres import PostgresLifecycleStore
from lifecycle_service.units import ApplyResult, Committed, Replayed
from tests.lifecycle.grpc_support import WS, Client
from tests.lifecycle.test_watch import watch
from tests.postgres import fresh_database

LEASE = 60_000_000


@pytest.fixture
def server_backend() -> str:
    """The servers of this module run on PostgreSQL only (tests/lifecycle/conftest.py)."""
    return "postgresql"


@pytest.fixture
async def url() -> str:
    return await asyncio.to_thread(fresh_database)


class Replica:
    """One replica's store and authority."""

    def __init__(self, store: PostgresLifecycleStore, clock: ManualClock, name: str) -> None:
        self.store = store
        self.authority = LifecycleAuthority(store, Policy(), clock, owner=name)

    async def apply(self, intent: i.Intent, method: str = "SetWorkStatus", fingerprint: bytes = b"F" * 32):
        return await self.authority.apply(intent, method, slow_render, fingerprint if intent.request_id else None)


def slow_render(task: TaskRecord, event: LifecycleEvent) -> bytes:
    time.sleep(0.01)  # inside the transaction: keeps it open while the other replica arrives
    return repr((task, event)).encode()


@pytest.fixture
async def replicas(url, clock) -> AsyncIterator[tuple[Replica, Replica]]:
    # Replicas starting together: the migrations are applied once, under a lock.
    stores = await asyncio.gather(PostgresLifecycleStore.open(url), PostgresLifecycleStore.open(url))
    try:
        yield Replica(stores[0], clock, "replica-a"), Replica(stores[1], clock, "replica-b")
    finally:
        for store in stores:
            await store.close()


def register(task_id: str, **kw) -> i.RegisterTask:
    return i.RegisterTask(workspace_id=WS, task_id=task_id, **kw)


def activate(task_id: str, **kw) -> i.ActivateGeneration:
    return i.ActivateGeneration(workspace_id=WS, task_id=task_id, generation=1, **kw)


def work(task_id: str, status: WorkStatus = WorkStatus.IN_PROGRESS, **kw) -> i.SetWorkStatus:
    return i.SetWorkStatus(workspace_id=WS, task_id=task_id, generation=1, work_status=status, **kw)


def suspend(task_id: str, **kw) -> i.SuspendGeneration:
    return i.SuspendGeneration(workspace_id=WS, task_id=task_id, generation=1, **kw)


async def ok(replica: Replica, intent: i.Intent) -> Committed:
    result = await replica.apply(intent)
    assert isinstance(result, Committed), result
    return result


async def history(replica: Replica, task_id: str) -> list[LifecycleEvent]:
    return await replica.store.read(lambda tx: tx.events.history(WS, task_id, 0, 1000))


async def both(a: Replica, b: Replica, intent_a: i.Intent, intent_b: i.Intent | None = None) -> list[ApplyResult]:
    return list(await asyncio.gather(a.apply(intent_a), b.apply(intent_b or intent_a)))


def reasons(results: list[ApplyResult]) -> Counter:
    return Counter(type(r).__name__ if not isinstance(r, Rejection) else r.reason.name for r in results)


# -- request ids -----------------------------------------------------------------


async def test_the_same_request_id_at_both_replicas_has_one_effect_and_one_answer(replicas):
    a, b = replicas
    for n in range(6):
        await ok(a, register(f"t{n}"))
        await ok(b, activate(f"t{n}"))

    # Registers, status changes and transitions that a second application would
    # refuse (a suspension): the second replica must replay, not decide again.
    cases = [register(f"new{n}", request_id=f"reg-{n}") for n in range(6)]
    cases += [work(f"t{n}", request_id=f"work-{n}") for n in range(3)]
    cases += [suspend(f"t{n}", request_id=f"suspend-{n}") for n in range(3, 6)]
    results = await asyncio.gather(*(both(a, b, intent) for intent in cases))

    for intent, pair in zip(cases, results, strict=True):
        assert sorted(type(r).__name__ for r in pair) == ["Committed", "Replayed"], (intent, pair)
        committed = next(r for r in pair if isinstance(r, Committed))
        replayed = next(r for r in pair if isinstance(r, Replayed))
        assert committed.response is not None and replayed.response == committed.response
        events = await history(a, intent.task_id)
        assert [e.request_id for e in events].count(intent.request_id) == 1
        assert [e.revision for e in events] == list(range(1, len(events) + 1))


# -- compare-and-set -----------------------------------------------------------------


async def test_conflicting_revisions_at_both_replicas_let_exactly_one_win(replicas):
    a, b = replicas
    await ok(a, register("t1"))
    await ok(a, activate("t1"))
    for _ in range(5):
        revision = (await a.store.read(lambda tx: tx.tasks.load(WS, "t1"))).revision
        status = WorkStatus.BLOCKED if revision % 2 else WorkStatus.IN_PROGRESS
        contenders = [work("t1", status, expected_revision=revision) for _ in range(4)]
        results = await asyncio.gather(*(r.apply(c) for r, c in zip([a, b, a, b], contenders, strict=True)))
        assert reasons(results) == Counter({"Committed": 1, "REVISION_MISMATCH": 3}), results
    events = await history(b, "t1")
    assert [e.revision for e in events] == list(range(1, 8))


async def test_concurrent_registers_of_one_task_at_both_replicas_let_one_win(replicas):
    a, b = replicas
    for n in range(5):
        results = await asyncio.gather(*(r.apply(register(f"t{n}")) for r in [a, b, a, b]))
        assert reasons(results) == Counter({"Committed": 1, "TASK_ALREADY_EXISTS": 3}), results
        assert [e.revision for e in await history(a, f"t{n}")] == [1]


async def test_a_child_registering_while_its_parent_ends_is_never_left_open(replicas):
    """The child's unit reads its parent under a share lock: either it registers
    first and the parent's end propagates to it, or it sees the parent ended."""
    a, b = replicas
    for n in range(5):
        parent = f"p{n}"
        await ok(a, register(parent))
        await ok(a, activate(parent))
        child = register(f"c{n}", parent=ParentLink(parent, 1, LinkMode.ATTACHED))
        failure = i.SettleFailure(workspace_id=WS, task_id=parent, generation=1)
        results = await asyncio.gather(b.apply(child), a.apply(failure))
        assert isinstance(results[1], Committed)
        if isinstance(results[0], Committed):
            assert results[1].propagations == 1
        else:
            assert isinstance(results[0], Rejection), results[0]
    await asyncio.gather(a.authority.deliver_pending(), b.authority.deliver_pending())
    for n in range(5):
        task = await a.store.read(lambda tx, n=n: tx.tasks.load(WS, f"c{n}"))
        assert task is None or task.state is GenerationState.TERMINAL


# -- propagations -------------------------------------------------------------------


async def owe(replica: Replica, children: int) -> None:
    parent = TaskRecord(
        workspace_id=WS,
        task_id="p",
        generation=1,
        revision=1,
        state=GenerationState.ACTIVE,
        outcome=None,
        cancellation_requested_at=None,
        work_status=WorkStatus.READY,
        parent=None,
        completion_id=None,
        created_at=1,
        updated_at=1,
    )
    event = LifecycleEvent(
        sequence=0,
        workspace_id=WS,
        task_id="p",
        generation=1,
        revision=1,
        intent=IntentKind.REGISTER_TASK,
        from_state=None,
        to_state=GenerationState.ACTIVE,
        outcome=None,
        cancellation_requested_at=None,
        work_status=WorkStatus.READY,
        cause=Cause(),
        completion_id=None,
        authoritative_at=None,
        committed_at=1,
        request_id=None,
    )
    owed = [Propagation(ChildRef(f"c{n:03}", 1), IntentKind.REQUEST_CANCELLATION) for n in range(children)]

    def unit(tx):
        tx.tasks.insert(parent)
        tx.propagations.insert(tx.events.append(event), owed, 1)

    await replica.store.write(unit)


async def claim(replica: Replica, owner: str, now: int, limit: int) -> set[int]:
    claimed = await replica.store.write(lambda tx: tx.propagations.claim(now, owner, LEASE, limit))
    return {p.id for p in claimed}


async def test_propagations_are_never_claimed_by_two_replicas(replicas, clock):
    a, b = replicas
    await owe(a, 50)
    now = clock.now_micros()
    everything = await claim(a, "nobody-yet", now - 2 * LEASE, 100)  # an old claim, long lapsed
    assert len(everything) == 50

    mine, theirs = await asyncio.gather(claim(a, "a", now, 30), claim(b, "b", now, 30))
    assert not mine & theirs
    assert mine | theirs == everything
    # Each owner gets its own claims back, and nothing the other holds.
    assert await claim(a, "a", now + 1, 100) == mine
    assert await claim(b, "b", now + 1, 100) == theirs
    assert await claim(b, "c", now + 1, 100) == set()
    # Once a lease has run out, another replica may take the rows over.
    assert await claim(b, "b", now + 1 + LEASE, 100) == everything


async def test_two_replicas_delivering_at_once_apply_each_propagation_once(replicas):
    a, b = replicas
    await ok(a, register("parent"))
    await ok(a, activate("parent"))
    children = [f"c{n:02}" for n in range(20)]
    for child in children:
        await ok(b, register(child, parent=ParentLink("parent", 1, LinkMode.ATTACHED)))
    cancelled = await ok(a, i.RequestCancellation(workspace_id=WS, task_id="parent", generation=1))
    assert cancelled.propagations == 20

    handled = await asyncio.gather(a.authority.deliver_pending(), b.authority.deliver_pending())
    assert sum(handled) == 20
    for child in children:
        intents = [e.intent for e in await history(a, child)]
        assert intents == [IntentKind.REGISTER_TASK, IntentKind.REQUEST_CANCELLATION]
    assert await a.store.write(lambda tx: tx.propagations.claim(0, "check", 0, 100)) == []


# -- watchers across replicas, over gRPC ------------------------------------------------


async def test_a_watcher_on_one_replica_receives_every_event_of_both_in_order(start_lifecycle, url):
    _, stub_a = await start_lifecycle(database=url)
    _, stub_b = await start_lifecycle(database=url)
    a, b = Client(stub_a), Client(stub_b)
    await a.active("seed")
    everything = watch(a)
    one_task = watch(b, task_id="t0")
    try:
        await everything.take(2)

        async def writer(client: Client, task_id: str) -> None:
            await client.active(task_id)
            for n in range(10):
                await client.work(
                    task_id, [lifecycle_enums.WORK_STATUS_BLOCKED, lifecycle_enums.WORK_STATUS_IN_PROGRESS][n % 2]
                )

        # Concurrent commits through both replicas, mostly through the other one.
        await asyncio.gather(*(writer(b if n % 3 else a, f"t{n}") for n in range(6)))
        received = await everything.take(6 * 12)
        sequences = [e.sequence for e in received]
        # In order, each event once: what the table holds, by sequence.
        assert sequences == sorted(set(sequences))
        listed = sorted([e for n in range(6) for e in await b.events(f"t{n}")], key=lambda e: e.sequence)
        assert received == listed
        assert await one_task.take(12) == [e for e in listed if e.task_id == "t0"]
        # Nothing more on either, through the other replica: the next event of each is a new one.
        await everything.nothing_before(b.register("marker"))
        await one_task.nothing_before(a.work("t0"))
    finally:
        await everything.close()
        await one_task.close()


async def test_a_watcher_from_the_head_on_one_replica_receives_every_later_event_of_both(start_lifecycle, url):
    _, stub_a = await start_lifecycle(database=url)
    _, stub_b = await start_lifecycle(database=url)
    a, b = Client(stub_a), Client(stub_b)
    await a.active("seed")

    async def writer(client: Client, task_id: str) -> None:
        await client.active(task_id)
        for n in range(20):
            await client.work(
                task_id, [lifecycle_enums.WORK_STATUS_BLOCKED, lifecycle_enums.WORK_STATUS_IN_PROGRESS][n % 2]
            )

    # The watcher joins while both replicas commit: its head splits their events exactly.
    writers = asyncio.gather(*(writer(b if n % 3 else a, f"t{n}") for n in range(4)))
    await asyncio.sleep(0.02)
    stream = watch(a, from_head=True)
    try:
        head = await stream.head()
        await writers
        await b.work("seed")  # at least one event after the head, through the other replica
        listed = sorted(
            [e for task_id in ("seed", "t0", "t1", "t2", "t3") for e in await b.events(task_id)],
            key=lambda e: e.sequence,
        )
        later = [e for e in listed if e.sequence > head]
        assert head >= 2 and later
        assert await stream.take(len(later)) == later
        await stream.nothing_before(b.work("seed"))
    finally:
        await stream.close()


async def test_the_same_request_id_at_two_servers_gets_the_same_bytes(start_lifecycle, url):
    _, stub_a = await start_lifecycle(database=url)
    _, stub_b = await start_lifecycle(database=url)
    a, b = Client(stub_a), Client(stub_b)
    for n in range(8):
        await a.active(f"t{n}")
    answers = await asyncio.gather(*(client.work(f"t{n}", request_id=f"r{n}") for n in range(8) for client in (a, b)))
    for n in range(8):
        first, second = answers[2 * n], answers[2 * n + 1]
        assert first.SerializeToString(deterministic=True) == second.SerializeToString(deterministic=True)
        assert [e.revision for e in await a.events(f"t{n}")] == [1, 2, 3]
