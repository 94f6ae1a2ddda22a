"""Unit tests of the lifecycle application layer on the in-memory store: the shared
request-id rule, the `apply_intent` unit of work (outcomes, what it writes and
remembers, propagation commands), `task_view`, and the authority shell (publishing,
fault points, propagation delivery under the background owner, the sweep)."""

from __future__ import annotations

import asyncio

import pytest

from funnel.auth.principal import Caller
from funnel.runtime.background import Background
from funnel.runtime.errors import Rejection
from funnel.runtime.faults import DroppedReply, Faults
from funnel.runtime.idempotency import Replay, RequestKey, Reused, recall, remember
from lifecycle_service import units
from lifecycle_service.authority import LifecycleAuthority
from lifecycle_service.core import intents as i
from lifecycle_service.core.model import (
    ChildRef,
    GenerationState,
    IntentKind,
    LinkMode,
    Outcome,
    ParentLink,
    Policy,
    WorkStatus,
)
from lifecycle_service.core.rules import decide
from lifecycle_service.errors import Reason
from lifecycle_service.storage.memory import MemoryLifecycleStore
from lifecycle_service.storage.port import TaskQuery
from lifecycle_service.units import (
    Command,
    Committed,
    Discharged,
    Dropped,
    Replayed,
    Resettled,
    TaskView,
    apply_intent,
    task_view,
)

POLICY = Policy()
WS = "ws"
NOW = 1_700_000_000_000_000
ATTACHED = ParentLink("p", 1, LinkMode.ATTACHED)
ME = Caller("agent-1", "agent")


def render(task, event) -> bytes:
    return f"{task.task_id}@{task.revision}#{event.sequence}".encode()


def command(intent, *, fingerprint=b"F", method="M", render=render, propagation_id=None):
    request = (
        RequestKey(intent.workspace_id, intent.caller.subject, method, intent.request_id, fingerprint)
        if intent.request_id
        else None
    )
    return Command(intent, lambda s: decide(intent, s, POLICY), render, request, propagation_id)


class World:
    """A memory store and a clock that moves by one millisecond per write."""

    def __init__(self) -> None:
        self.store = MemoryLifecycleStore()
        self.now = NOW

    async def apply(self, intent, **kw):
        self.now += 1_000
        cmd = command(intent, **kw)
        now = self.now
        return await self.store.write(lambda tx: apply_intent(tx, cmd, now))

    async def snapshot(self):
        def read(tx):
            tasks = tx.tasks.page(WS, TaskQuery(), "", 1000)
            return tasks, tx.events.page(WS, 0, None, 1000)

        return await self.store.read(read)

    async def task(self, task_id):
        return await self.store.read(lambda tx: tx.tasks.load(WS, task_id))

    async def pending(self):
        return await self.store.write(lambda tx: tx.propagations.claim(self.now, "t", 1, 100))


def reg(task_id, *, parent=None, **kw):
    return i.RegisterTask(workspace_id=WS, task_id=task_id, parent=parent, **kw)


def do(cls, task_id, generation=1, **kw):
    return cls(workspace_id=WS, task_id=task_id, generation=generation, **kw)


SETUPS = {
    "nothing": [],
    "registered": [reg("t")],
    "active": [reg("t"), do(i.ActivateGeneration, "t")],
    "failed": [reg("t"), do(i.ActivateGeneration, "t"), do(i.SettleFailure, "t")],
    "active parent": [reg("p"), do(i.ActivateGeneration, "p")],
    "parent of two": [
        reg("p"),
        do(i.ActivateGeneration, "p"),
        reg("c1", parent=ATTACHED),
        reg("c2", parent=ATTACHED),
        reg("d", parent=ParentLink("p", 1, LinkMode.DETACHED)),
    ],
}
# Its children's terminations are owed, not yet delivered.
SETUPS["failed parent of two"] = [*SETUPS["parent of two"], do(i.SettleFailure, "p")]


@pytest.fixture
async def world() -> World:
    return World()


async def given(world: World, setup: str) -> None:
    for intent in SETUPS[setup]:
        assert isinstance(await world.apply(intent), Committed)


# ---------------------------------------------------------------------------
# The shared request-id rule (funnel.runtime.idempotency).


@pytest.mark.parametrize(
    "stored, asked, expected",
    [
        (None, RequestKey(WS, "c", "M", "r", b"F"), None),
        (b"F", None, None),
        (b"F", RequestKey(WS, "c", "M", "r", b"F"), Replay(b"response")),
        (b"F", RequestKey(WS, "c", "M", "r", b"G"), Reused("r")),
        (b"F", RequestKey(WS, "c", "M", "other", b"G"), None),
        (b"F", RequestKey(WS, "c", "N", "r", b"G"), None),
        (b"F", RequestKey(WS, "d", "M", "r", b"G"), None),
        (b"F", RequestKey("ws2", "c", "M", "r", b"G"), None),
    ],
)
async def test_the_request_id_rule(stored, asked, expected):
    store = MemoryLifecycleStore()
    if stored is not None:
        await store.write(lambda tx: remember(tx.requests, RequestKey(WS, "c", "M", "r", stored), b"response", NOW))
    assert await store.read(lambda tx: recall(tx.requests, asked)) == expected


async def test_remember_without_a_key_remembers_nothing_and_reused_names_the_id():
    store = MemoryLifecycleStore()
    await store.write(lambda tx: remember(tx.requests, None, b"response", NOW))
    assert await store.write(lambda tx: tx.requests.forget(NOW + 1, 10)) == 0
    refusal = Reused("r-1").rejection(Reason.REQUEST_ID_REUSED)
    assert (refusal.reason, refusal.metadata) == (Reason.REQUEST_ID_REUSED, {"request_id": "r-1"})


# ---------------------------------------------------------------------------
# apply_intent: outcomes. A rejection leaves the state as it was.


@pytest.mark.parametrize(
    "setup, intent, outcome, detail",
    [
        ("nothing", reg("t"), Committed, {"revision": 1, "propagations": 0}),
        ("registered", reg("t"), Reason.TASK_ALREADY_EXISTS, None),
        ("nothing", do(i.ActivateGeneration, "t"), Reason.TASK_NOT_FOUND, None),
        ("registered", do(i.ActivateGeneration, "t"), Committed, {"revision": 2, "propagations": 0}),
        ("registered", do(i.SuspendGeneration, "t"), Reason.INVALID_TRANSITION, None),
        ("active", do(i.ActivateGeneration, "t", generation=2), Reason.FUTURE_GENERATION, None),
        ("failed", do(i.SettleFailure, "t"), Resettled, {"revision": 3}),
        ("failed", do(i.SettleTimeout, "t"), Reason.GENERATION_TERMINAL, None),
        ("nothing", reg("c", parent=ATTACHED), Reason.PARENT_NOT_FOUND, None),
        ("active parent", reg("c", parent=ATTACHED), Committed, {"revision": 1, "propagations": 0}),
        ("parent of two", do(i.RequestCancellation, "p"), Committed, {"revision": 3, "propagations": 2}),
        ("parent of two", do(i.SettleFailure, "p"), Committed, {"revision": 3, "propagations": 2}),
        ("active", do(i.ResumeWithGeneration, "t", generation=2), Reason.FUTURE_GENERATION, None),
        ("failed", do(i.ResumeWithGeneration, "t", generation=2), Committed, {"revision": 4, "propagations": 0}),
        ("failed parent of two", do(i.ResumeWithGeneration, "p", generation=2), Reason.ACTIVE_ATTACHED_CHILD, None),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
async def test_apply_intent_outcomes(world, setup, intent, outcome, detail):
    await given(world, setup)
    before = await world.snapshot()
    result = await world.apply(intent)
    if isinstance(outcome, Reason):
        assert isinstance(result, Rejection) and result.reason is outcome, result
        assert await world.snapshot() == before
        return
    assert type(result) is outcome
    assert result.task.revision == detail["revision"]
    assert await world.task(intent.task_id) == result.task
    if isinstance(result, Committed):
        assert result.propagations == detail["propagations"] == len(await world.pending())
        assert result.event.committed_at == world.now  # the unit's time is the one passed in
        assert result.event.sequence == len(before[1]) + 1
        assert (await world.snapshot())[1][-1] == result.event
    else:  # the original terminal event, and nothing new
        assert result.event.to_state is GenerationState.TERMINAL
        assert await world.snapshot() == before


async def test_the_event_records_the_caller_and_the_request_id(world):
    result = await world.apply(reg("t", request_id="r-1", caller=ME))
    assert (result.event.caller, result.event.request_id) == (ME, "r-1")


# ---------------------------------------------------------------------------
# apply_intent: request ids.


@pytest.mark.parametrize(
    "second, outcome",
    [
        ({}, Replayed),  # the same request again
        ({"fingerprint": b"G"}, Reason.REQUEST_ID_REUSED),
        ({"method": "Other"}, Committed),  # ids are per RPC…
        ({"caller": Caller("agent-2", "agent")}, Committed),  # …per caller…
        ({"request_id": "r-2"}, Committed),
    ],
)
async def test_request_ids(world, second, outcome):
    await given(world, "registered")
    first = await world.apply(do(i.SetWorkStatus, "t", work_status=WorkStatus.BLOCKED, request_id="r-1", caller=ME))
    assert first.response == render(first.task, first.event)
    fields = {"request_id": "r-1", "caller": ME, **{k: v for k, v in second.items() if k in ("caller", "request_id")}}
    repeat = do(i.SetWorkStatus, "t", work_status=WorkStatus.BLOCKED, **fields)
    before = await world.snapshot()
    result = await world.apply(repeat, fingerprint=second.get("fingerprint", b"F"), method=second.get("method", "M"))
    if outcome is Replayed:
        assert result == Replayed(first.response)
        assert await world.snapshot() == before
    elif isinstance(outcome, Reason):
        assert isinstance(result, Rejection) and result.reason is outcome
        assert await world.snapshot() == before
    else:  # a new request: SetWorkStatus to the same status still commits a revision
        assert isinstance(result, Committed) and result.task.revision == first.task.revision + 1


async def test_render_is_called_only_to_remember_a_response(world):
    calls = []

    def counting(task, event):
        calls.append((task.revision, event.sequence))
        return b"r"

    plain = await world.apply(reg("a"), render=counting)
    assert plain.response is None and calls == []
    remembered = await world.apply(reg("b", request_id="r"), render=counting)
    assert remembered.response == b"r" and calls == [(1, remembered.event.sequence)]


async def test_a_repeated_settlement_remembers_the_original_event_under_its_request_id(world):
    await given(world, "failed")
    terminal = (await world.snapshot())[1][-1]
    repeat = await world.apply(do(i.SettleFailure, "t", request_id="again"))
    assert isinstance(repeat, Resettled) and repeat.event == terminal
    assert repeat.response == render(repeat.task, terminal)
    assert await world.apply(do(i.SettleFailure, "t", request_id="again")) == Replayed(repeat.response)


async def test_a_refused_request_is_not_remembered(world):
    await given(world, "registered")
    refused = await world.apply(do(i.SuspendGeneration, "t", request_id="r"))
    assert isinstance(refused, Rejection)
    assert isinstance(await world.apply(do(i.ActivateGeneration, "t", request_id="r"), fingerprint=b"G"), Committed)


async def test_a_unit_that_raises_remembers_nothing(world):
    def explode(task, event):
        raise RuntimeError("render failed")

    with pytest.raises(RuntimeError):
        await world.apply(reg("t", request_id="r"), render=explode)
    assert await world.snapshot() == ([], [])
    assert isinstance(await world.apply(reg("t", request_id="r"), fingerprint=b"G"), Committed)


# ---------------------------------------------------------------------------
# apply_intent: propagation commands.


async def test_a_propagation_command_discharges_its_propagation(world):
    await given(world, "parent of two")
    await world.apply(do(i.RequestCancellation, "p"))
    first, second = await world.pending()
    delivered = await world.apply(do(i.RequestCancellation, "c1"), propagation_id=first.id)
    assert isinstance(delivered, Committed) and delivered.task.fenced
    assert await world.pending() == [second]
    # Again: someone else already applied it; nothing is decided or written.
    before = await world.snapshot()
    assert await world.apply(do(i.RequestCancellation, "c1"), propagation_id=first.id) == Discharged()
    assert await world.snapshot() == before


async def test_a_propagation_the_child_refuses_is_dropped_and_nothing_else_changes(world):
    await given(world, "parent of two")
    await world.apply(do(i.RequestCancellation, "c2"))
    await world.apply(do(i.RequestCancellation, "p"))
    c2 = next(p for p in await world.pending() if p.child.task_id == "c2")
    before = await world.snapshot()
    refused = await world.apply(do(i.RequestCancellation, "c2"), propagation_id=c2.id)
    assert isinstance(refused, Dropped) and refused.rejection.reason is Reason.CANCELLATION_ALREADY_REQUESTED
    assert await world.snapshot() == before
    assert [p.child.task_id for p in await world.pending()] == ["c1"]


# ---------------------------------------------------------------------------
# task_view.


async def test_task_view(world, monkeypatch):
    assert await world.store.read(lambda tx: task_view(tx, WS, "p")) is None
    await given(world, "parent of two")
    await world.apply(reg("c0", parent=ATTACHED))
    view = await world.store.read(lambda tx: task_view(tx, WS, "p"))
    assert view == TaskView(await world.task("p"), (ChildRef("c0", 1), ChildRef("c1", 1), ChildRef("c2", 1)))
    monkeypatch.setattr(units, "OPEN_CHILDREN_LIMIT", 2)
    view = await world.store.read(lambda tx: task_view(tx, WS, "p"))
    assert [c.task_id for c in view.open_attached_children] == ["c0", "c1"]


# ---------------------------------------------------------------------------
# The authority: the shell around the units.


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def now_micros(self) -> int:
        self.now += 1_000
        return self.now


def authority(store=None, **kw) -> tuple[LifecycleAuthority, list]:
    published: list = []
    shell = LifecycleAuthority(store or MemoryLifecycleStore(), POLICY, Clock(), publish=published.append, **kw)
    return shell, published


async def test_the_authority_publishes_what_committed_in_commit_order():
    shell, published = authority()
    results = [
        await shell.apply(reg("t"), "RegisterTask", render),
        await shell.apply(reg("t"), "RegisterTask", render),  # refused
        await shell.apply(do(i.ActivateGeneration, "t", request_id="r"), "Activate", render, b"F"),
        await shell.apply(do(i.ActivateGeneration, "t", request_id="r"), "Activate", render, b"F"),  # replayed
    ]
    assert [type(r).__name__ for r in results] == ["Committed", "Rejection", "Committed", "Replayed"]
    assert published == [results[0].event, results[2].event]
    assert [e.committed_at for e in published] == sorted(e.committed_at for e in published)


async def test_the_before_commit_fault_point_is_hit_only_by_transitions_and_undoes_them():
    shell, published = authority(faults=Faults({"lifecycle.before_commit": ("drop", 2)}))
    await shell.apply(reg("t"), "RegisterTask", render)
    assert isinstance(await shell.apply(reg("t"), "RegisterTask", render), Rejection)  # not a hit
    with pytest.raises(DroppedReply):
        await shell.apply(do(i.ActivateGeneration, "t"), "Activate", render)  # the 2nd hit: dropped, not applied
    assert (await shell.store.read(lambda tx: tx.tasks.load(WS, "t"))).state is GenerationState.REGISTERED
    assert len(published) == 1


async def test_propagations_are_delivered_by_the_background_loop():
    shell, published = authority()
    for intent in SETUPS["parent of two"]:
        await shell.apply(intent, "M", render)
    background = Background("test")
    background.add("propagations", shell.deliver_forever)
    background.start()
    try:
        await shell.apply(do(i.SettleFailure, "p"), "SettleFailure", render)
        for _ in range(3000):  # 30 s of polls: enough on a loaded machine
            children = [await shell.store.read(lambda tx, c=c: tx.tasks.load(WS, c)) for c in ("c1", "c2")]
            if all(child.terminal for child in children):
                break
            await asyncio.sleep(0.01)
        assert [(c.outcome, c.work_status) for c in children] == [(Outcome.CANCELLED, WorkStatus.CANCELLED)] * 2
        assert [e.intent for e in published[-2:]] == [IntentKind.PROPAGATE_PARENT_TERMINATION] * 2
        assert await shell.store.write(lambda tx: tx.propagations.claim(NOW, "x", 1, 10)) == []
    finally:
        await background.stop()


async def test_delivery_survives_a_failing_store_and_retries(monkeypatch):
    store = MemoryLifecycleStore()
    shell, _ = authority(store, retry_delay=0.01)
    for intent in SETUPS["parent of two"]:
        await shell.apply(intent, "M", render)
    await shell.apply(do(i.RequestCancellation, "p"), "M", render)
    real_write, failures = store.write, [RuntimeError("disk on fire")]

    async def flaky_write(fn, after_commit=None):
        if failures:
            raise failures.pop()
        return await real_write(fn, after_commit)

    monkeypatch.setattr(store, "write", flaky_write)
    loop = asyncio.create_task(shell.deliver_forever())
    try:
        for _ in range(3000):
            children = [await store.read(lambda tx, c=c: tx.tasks.load(WS, c)) for c in ("c1", "c2")]
            if all(child.fenced for child in children):
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the propagations were not delivered after the failure")
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop


async def test_the_sweep_forgets_old_request_ids():
    shell, _ = authority()
    await shell.apply(reg("a", request_id="r1"), "RegisterTask", render, b"F")
    await shell.apply(reg("b", request_id="r2"), "RegisterTask", render, b"F")
    first_time = (await shell.store.read(lambda tx: tx.tasks.load(WS, "a"))).created_at
    assert await shell.sweep_request_ids(first_time + 1, 10) == 1
    again = await shell.apply(reg("a", request_id="r1"), "RegisterTask", render, b"F")
    assert isinstance(again, Rejection) and again.reason is Reason.TASK_ALREADY_EXISTS  # applied as new
    replay = await shell.apply(reg("b", request_id="r2"), "RegisterTask", render, b"F")
    assert isinstance(replay, Replayed)
