"""The conformance suite of the lifecycle store: every adapter (the `backend` fixture
of conftest.py) must pass it, through the port only; what the units of work decide
on top of it is test_unit_flows.py's and test_units.py's, on the in-memory fake.

Part 1, the port itself: records, events and their sequences, request-id memory,
propagations, and transaction semantics (all or nothing, after-commit order).
Part 2 (SQLite and PostgreSQL files, marked so): what only a file can show,
inspected with a raw connection on purpose: migrations, pragmas, refusals,
reopening, propagations that survive a crash, and upgrades."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3

import pytest

from funnel.auth.principal import Caller
from funnel.runtime.errors import Rejection
from funnel.runtime.idempotency import RequestKey
from funnel.runtime.postgres import PostgresDatabase, SqliteStyle
from funnel.runtime.sqlite import Migration, migrations_in
from funnel.runtime.storage_errors import StorageRefused
from lifecycle_service.core import intents as i
from lifecycle_service.core.model import (
    Cause,
    ChildRef,
    GenerationState,
    IntentKind,
    LifecycleEvent,
    LinkMode,
    Outcome,
    ParentLink,
    Propagation,
    TaskRecord,
    WorkStatus,
)
from lifecycle_service.core.rules import decide
from lifecycle_service.errors import Reason
from lifecycle_service.storage.memory import MemoryLifecycleStore
from lifecycle_service.storage.port import InvariantViolated, LifecycleStore, TaskCount, TaskQuery
from lifecycle_service.storage.postgres import MIGRATIONS_PACKAGE as PG_MIGRATIONS_PACKAGE
from lifecycle_service.storage.postgres import SCHEMA as PG_SCHEMA
from lifecycle_service.storage.postgres import PostgresLifecycleStore
from lifecycle_service.storage.sqlite import MIGRATIONS_PACKAGE, SqliteLifecycleStore, SqliteLifecycleTx
from lifecycle_service.units import Command, apply_intent
from tests.lifecycle.units_support import (
    FP_A,
    FP_B,
    POLICY,
    T0,
    WS,
    Boom,
    Harness,
    active_task,
    pending,
    plain,
    register,
)
from tests.postgres import fresh_database

SCHEMA_VERSION = len(migrations_in(MIGRATIONS_PACKAGE))


def record(task_id="t1", *, revision=1, workspace=WS, state=GenerationState.REGISTERED, parent=None, **changes):
    return TaskRecord(
        workspace_id=workspace,
        task_id=task_id,
        generation=changes.pop("generation", 1),
        revision=revision,
        state=state,
        outcome=changes.pop("outcome", None),
        cancellation_requested_at=changes.pop("cancellation_requested_at", None),
        work_status=changes.pop("work_status", WorkStatus.READY),
        parent=parent,
        completion_id=changes.pop("completion_id", None),
        created_at=T0,
        updated_at=T0 + revision,
    )


def event_of(task: TaskRecord, **changes) -> LifecycleEvent:
    fields = dict(
        workspace_id=task.workspace_id,
        task_id=task.task_id,
        generation=task.generation,
        revision=task.revision,
        intent=IntentKind.REGISTER_TASK if task.revision == 1 else IntentKind.SET_WORK_STATUS,
        from_state=None if task.revision == 1 else task.state,
        to_state=task.state,
        outcome=task.outcome,
        cancellation_requested_at=task.cancellation_requested_at,
        work_status=task.work_status,
        cause=Cause("test", "because", (("a", "1"), ("b", "ü"))),
        completion_id=task.completion_id,
        authoritative_at=None,
        committed_at=task.updated_at,
        request_id=None,
        caller=Caller("someone", "agent"),
    )
    fields.update(changes)
    return LifecycleEvent(**fields)


def key(request_id="req-1", fingerprint=FP_A, *, workspace=WS, caller="caller", method="SetWorkStatus"):
    return RequestKey(workspace, caller, method, request_id, fingerprint)


async def put(store: LifecycleStore, task: TaskRecord, **event_changes) -> LifecycleEvent:
    """Writes a record (insert at revision 1, else update) with its event."""

    def unit(tx):
        (tx.tasks.insert if task.revision == 1 else tx.tasks.update)(task)
        return tx.events.append(event_of(task, **event_changes))

    return await store.write(unit)


async def everything(store: LifecycleStore, workspace=WS):
    """What a failed transaction must not have changed."""

    def read(tx):
        tasks = tx.tasks.page(workspace, TaskQuery(), "", 10_000)
        return (
            tasks,
            tx.events.page(workspace, 0, None, 10_000),
            [tx.tasks.open_attached_children(t) for t in tasks],
        )

    return await store.read(read)


# ===========================================================================
# Part 1: the port.

# -- records -------------------------------------------------------------------


async def test_a_record_round_trips_every_field(backend):
    parent = ParentLink("p", 3, LinkMode.DETACHED)
    task = record(
        "t1",
        state=GenerationState.TERMINAL,
        outcome=Outcome.COMPLETED,
        completion_id="cmp-1",
        cancellation_requested_at=T0 - 5,
        work_status=WorkStatus.DONE,
        generation=2,
        parent=parent,
    )
    await backend.write(lambda tx: tx.tasks.insert(task))
    assert await backend.read(lambda tx: tx.tasks.load(WS, "t1")) == task
    assert await backend.read(lambda tx: tx.tasks.load("other", "t1")) is None
    assert await backend.read(lambda tx: tx.tasks.load(WS, "t2")) is None


async def test_an_update_replaces_only_the_previous_revision(backend):
    await put(backend, record("t1"))
    second = record("t1", revision=2, state=GenerationState.ACTIVE, work_status=WorkStatus.IN_PROGRESS)
    await backend.write(lambda tx: tx.tasks.update(second))
    assert await backend.read(lambda tx: tx.tasks.load(WS, "t1")) == second
    for stale in (second, record("t1", revision=5), record("missing", revision=2)):
        with pytest.raises(InvariantViolated):
            await backend.write(lambda tx, stale=stale: tx.tasks.update(stale))
    assert await backend.read(lambda tx: tx.tasks.load(WS, "t1")) == second


async def test_a_task_id_is_inserted_once_per_workspace(backend):
    await backend.write(lambda tx: tx.tasks.insert(record("t1")))
    await backend.write(lambda tx: tx.tasks.insert(record("t1", workspace="other")))
    with pytest.raises(Exception):  # noqa: B017 - each adapter raises its own integrity error
        await backend.write(lambda tx: tx.tasks.insert(record("t1", work_status=WorkStatus.BLOCKED)))
    assert (await backend.read(lambda tx: tx.tasks.load(WS, "t1"))).work_status is WorkStatus.READY


@pytest.mark.parametrize(
    "impossible",
    [
        {"state": GenerationState.TERMINAL},  # terminal without an outcome
        {"outcome": Outcome.FAILED},  # an outcome without being terminal
        {"state": GenerationState.TERMINAL, "outcome": Outcome.COMPLETED},  # completed without a completion id
        {"state": GenerationState.TERMINAL, "outcome": Outcome.FAILED, "completion_id": "c"},
    ],
)
async def test_an_inconsistent_record_is_refused(backend, impossible):
    with pytest.raises(Exception):  # noqa: B017 - each adapter raises its own integrity error
        await backend.write(lambda tx: tx.tasks.insert(record("t1", **impossible)))
    assert await backend.read(lambda tx: tx.tasks.load(WS, "t1")) is None


async def test_listing_tasks_pages_by_task_id_and_filters_by_parent(backend):
    link = ParentLink("p", 1, LinkMode.ATTACHED)
    for task_id in ("c", "a", "p", "b"):
        await put(backend, record(task_id, parent=link if task_id != "p" else None))
    await put(backend, record("a", workspace="other"))

    def ids(after, limit, parent=None, workspace=WS):
        return backend.read(lambda tx: [t.task_id for t in tx.tasks.page(workspace, TaskQuery(parent), after, limit)])

    assert await ids("", 10) == ["a", "b", "c", "p"]
    assert await ids("a", 2) == ["b", "c"]
    assert await ids("", 10, "p") == ["a", "b", "c"]
    assert await ids("b", 10, "p") == ["c"]
    assert await ids("", 10, "nobody") == []
    assert await ids("", 10, workspace="other") == ["a"]


TERMINAL = GenerationState.TERMINAL
# (task id, state, outcome, work status): every kind of task a filter tells apart.
MIXED = [
    ("a-1", GenerationState.REGISTERED, None, WorkStatus.READY),
    ("a-2", GenerationState.ACTIVE, None, WorkStatus.IN_PROGRESS),
    ("a-3", GenerationState.ACTIVE, None, WorkStatus.BLOCKED),
    ("b-1", GenerationState.SUSPENDED, None, WorkStatus.READY),
    ("b-2", TERMINAL, Outcome.COMPLETED, WorkStatus.DONE),
    ("b-3", TERMINAL, Outcome.FAILED, WorkStatus.BLOCKED),
    ("c-1", TERMINAL, Outcome.CANCELLED, WorkStatus.CANCELLED),
    ("c-2", TERMINAL, Outcome.TIMED_OUT, WorkStatus.BLOCKED),
    ("c-3", TERMINAL, Outcome.COMPLETED, WorkStatus.DONE),
]


async def put_mixed(backend) -> None:
    for task_id, state, outcome, work in MIXED:
        await put(
            backend,
            record(
                task_id,
                state=state,
                outcome=outcome,
                work_status=work,
                completion_id="cmp" if outcome is Outcome.COMPLETED else None,
            ),
        )
    await put(backend, record("a-1", workspace="other"))


@pytest.mark.parametrize(
    "query",
    [
        TaskQuery(state=GenerationState.ACTIVE),
        TaskQuery(state=TERMINAL),
        TaskQuery(state=GenerationState.REGISTERED),
        TaskQuery(outcome=Outcome.COMPLETED),
        TaskQuery(outcome=Outcome.FAILED),
        TaskQuery(outcome=Outcome.TIMED_OUT),
        TaskQuery(work_status=WorkStatus.BLOCKED),
        TaskQuery(work_status=WorkStatus.DONE),
        TaskQuery(work_status=WorkStatus.READY),
        TaskQuery(task_id_prefix="b-"),
        TaskQuery(task_id_prefix="c-3"),
        TaskQuery(task_id_prefix="d"),
        TaskQuery(state=TERMINAL, work_status=WorkStatus.BLOCKED),
        TaskQuery(state=GenerationState.ACTIVE, outcome=Outcome.FAILED),
        TaskQuery(outcome=Outcome.FAILED, task_id_prefix="b"),
    ],
    ids=repr,
)
async def test_listing_tasks_filters_by_state_outcome_work_status_and_id_prefix_in_pages(backend, query):
    await put_mixed(backend)
    expected = [
        task_id
        for task_id, state, outcome, work in MIXED
        if query.state in (None, state)
        and query.outcome in (None, outcome)
        and query.work_status in (None, work)
        and task_id.startswith(query.task_id_prefix)
    ]

    def ids(after, limit):
        return backend.read(lambda tx: [t.task_id for t in tx.tasks.page(WS, query, after, limit)])

    assert await ids("", 100) == expected
    paged, after = [], ""
    while page := await ids(after, 2):
        paged, after = paged + page, page[-1]
    assert paged == expected


async def test_listing_tasks_by_last_change_is_newest_change_first_once_each_in_pages(backend):
    await put_mixed(backend)
    # Changes after registration: a-1, then b-2, then a-1 again (each a new revision).
    a1 = record("a-1", revision=2, work_status=WorkStatus.IN_PROGRESS)
    await put(backend, a1)
    await put(
        backend,
        record(
            "b-2",
            revision=2,
            state=TERMINAL,
            outcome=Outcome.COMPLETED,
            work_status=WorkStatus.DONE,
            completion_id="cmp",
        ),
    )
    latest = await put(backend, dataclasses.replace(a1, revision=3, work_status=WorkStatus.BLOCKED, updated_at=T0 + 3))
    registered_newest_first = [task_id for task_id, *_ in reversed(MIXED) if task_id not in ("a-1", "b-2")]

    def listed(query=None, before=None, limit=100):
        return backend.read(lambda tx: tx.tasks.page_by_change(WS, query or TaskQuery(), before, limit))

    everything = await listed()
    assert [task.task_id for _, task in everything] == ["a-1", "b-2", *registered_newest_first]
    assert everything[0] == (
        latest.sequence,
        dataclasses.replace(a1, revision=3, work_status=WorkStatus.BLOCKED, updated_at=T0 + 3),
    )
    sequences = [sequence for sequence, _ in everything]
    assert sequences == sorted(sequences, reverse=True)
    paged, before = [], None
    while page := await listed(before=before, limit=3):
        paged, before = paged + page, page[-1][0]
    assert paged == everything
    blocked = await listed(TaskQuery(work_status=WorkStatus.BLOCKED))
    assert [task.task_id for _, task in blocked] == ["a-1", "c-2", "b-3", "a-3"]
    assert await backend.read(lambda tx: tx.tasks.page_by_change("nobody", TaskQuery(), None, 10)) == []


async def test_tasks_are_counted_by_state_outcome_and_work_status(backend):
    await put_mixed(backend)
    counts = await backend.read(lambda tx: tx.tasks.count(WS))
    assert counts == [
        TaskCount(GenerationState.REGISTERED, None, WorkStatus.READY, 1),
        TaskCount(GenerationState.ACTIVE, None, WorkStatus.IN_PROGRESS, 1),
        TaskCount(GenerationState.ACTIVE, None, WorkStatus.BLOCKED, 1),
        TaskCount(GenerationState.SUSPENDED, None, WorkStatus.READY, 1),
        TaskCount(TERMINAL, Outcome.COMPLETED, WorkStatus.DONE, 2),
        TaskCount(TERMINAL, Outcome.CANCELLED, WorkStatus.CANCELLED, 1),
        TaskCount(TERMINAL, Outcome.FAILED, WorkStatus.BLOCKED, 1),
        TaskCount(TERMINAL, Outcome.TIMED_OUT, WorkStatus.BLOCKED, 1),
    ]
    assert await backend.read(lambda tx: tx.tasks.count("nobody")) == []


async def test_open_attached_children_are_the_current_generations_unsettled_attached_ones(backend):
    parent = record("p", revision=1, generation=2, state=GenerationState.ACTIVE)
    await put(backend, parent)
    attached, detached = ParentLink("p", 2, LinkMode.ATTACHED), ParentLink("p", 2, LinkMode.DETACHED)
    await put(backend, record("c3", parent=attached))
    await put(backend, record("c1", parent=attached, generation=4, state=GenerationState.SUSPENDED))
    await put(backend, record("c2", parent=attached))
    await put(backend, record("d1", parent=detached))
    await put(backend, record("old", parent=ParentLink("p", 1, LinkMode.ATTACHED)))
    await put(backend, record("done", parent=attached, state=GenerationState.TERMINAL, outcome=Outcome.CANCELLED))
    await put(backend, record("c9", parent=attached, workspace="other"))

    children = await backend.read(lambda tx: tx.tasks.open_attached_children(parent))
    assert children == (ChildRef("c1", 4), ChildRef("c2", 1), ChildRef("c3", 1))
    assert await backend.read(lambda tx: tx.tasks.open_attached_children(parent, 2)) == children[:2]
    assert await backend.read(lambda tx: tx.tasks.open_attached_children(record("c1"))) == ()


# -- events --------------------------------------------------------------------


async def test_an_event_round_trips_every_field_with_the_sequence_the_store_assigned(backend):
    task = record("t1")
    event = event_of(task, authoritative_at=T0 - 7, request_id="req-1", completion_id=None)
    stored = await backend.write(lambda tx: (tx.tasks.insert(task), tx.events.append(event))[1])
    assert stored.sequence > 0
    assert stored == dataclasses.replace(event, sequence=stored.sequence)
    assert await backend.read(lambda tx: tx.events.history(WS, "t1", 0, 10)) == [stored]
    assert await backend.read(lambda tx: tx.events.page(WS, 0, None, 10)) == [stored]


async def test_the_last_sequence_is_the_greatest_committed_in_any_workspace(backend):
    assert await backend.read(lambda tx: tx.events.last_sequence()) == 0
    first = await put(backend, record("t1"))
    last = await put(backend, record("t1", workspace="ws-2"))
    assert last.sequence > first.sequence
    assert await backend.read(lambda tx: tx.events.last_sequence()) == last.sequence


async def test_a_registration_event_round_trips_its_parent_link(backend):
    parent = record("parent")
    link = ParentLink("parent", 1, LinkMode.ATTACHED)
    child = record("child", parent=link)

    def unit(tx):
        tx.tasks.insert(parent)
        tx.events.append(event_of(parent))
        tx.tasks.insert(child)
        return tx.events.append(event_of(child, parent=link))

    stored = await backend.write(unit)
    assert stored.parent == link
    events = await backend.read(lambda tx: tx.events.page(WS, 0, None, 10))
    assert [e.parent for e in events] == [None, link]
    assert await backend.read(lambda tx: tx.events.history(WS, "child", 0, 10)) == [stored]


async def next_revision(store: LifecycleStore, workspace: str, task_id: str, committed: list[int]) -> None:
    """Registers the task, or moves it to its next revision, noting the sequence after commit."""

    def unit(tx):
        current = tx.tasks.load(workspace, task_id)
        task = record(task_id, workspace=workspace, revision=current.revision + 1 if current else 1)
        (tx.tasks.insert if current is None else tx.tasks.update)(task)
        return tx.events.append(event_of(task))

    await store.write(unit, after_commit=lambda event: committed.append(event.sequence))


async def test_sequences_increase_strictly_in_commit_order_across_tasks_and_workspaces(backend):
    committed: list[int] = []
    seen: list[list[int]] = []
    tasks = [(workspace, f"t{n}") for workspace in ("a", "b") for n in range(4)]
    writing = True

    def visible(tx) -> list[int]:
        return sorted(e.sequence for workspace in ("a", "b") for e in tx.events.page(workspace, 0, None, 100))

    async def reader() -> None:
        while writing:
            seen.append(await backend.read(visible))
            await asyncio.sleep(0)

    reading = asyncio.create_task(reader())
    for _ in range(3):
        # Concurrent writers: the commit order is the store's, and so are the sequences.
        await asyncio.gather(*(next_revision(backend, workspace, task_id, committed) for workspace, task_id in tasks))
    writing = False
    await reading
    stored = await backend.read(visible)
    # Each committed once; and a reader by cursor never sees a sequence before
    # every earlier one: what is visible is always a prefix (on PostgreSQL through
    # the horizon, since concurrent transactions number out of commit order).
    assert len(stored) == 3 * len(tasks) and stored == sorted(set(stored))
    if not isinstance(backend, PostgresLifecycleStore):
        assert stored == list(range(stored[0], stored[0] + 3 * len(tasks)))  # and gapless
    assert sorted(committed) == stored
    assert seen and all(snapshot == stored[: len(snapshot)] for snapshot in seen)
    if not isinstance(backend, PostgresLifecycleStore):
        # One process: the after-commit hooks also run in commit order (PostgreSQL
        # reports concurrent commits in any order; its watchers read the table).
        assert committed == stored
    for workspace, task_id in tasks:
        history = await backend.read(lambda tx, w=workspace, t=task_id: tx.events.history(w, t, 0, 10))
        assert [e.revision for e in history] == [1, 2, 3]


async def test_a_tasks_revision_has_one_event(backend):
    task = record("t1")
    await put(backend, task)
    with pytest.raises(Exception):  # noqa: B017 - each adapter raises its own integrity error
        await backend.write(lambda tx: tx.events.append(event_of(task, cause=Cause("again"))))
    assert [e.cause.source for e in await backend.read(lambda tx: tx.events.history(WS, "t1", 0, 10))] == ["test"]


async def test_events_are_listed_per_task_by_revision_and_per_workspace_by_sequence(backend):
    a1, b1 = await put(backend, record("a")), await put(backend, record("b"))
    a2 = await put(backend, record("a", revision=2))
    await put(backend, record("a", workspace="other"))
    a3 = await put(backend, record("a", revision=3))

    def read(fn):
        return backend.read(fn)

    assert await read(lambda tx: tx.events.history(WS, "a", 0, 10)) == [a1, a2, a3]
    assert await read(lambda tx: tx.events.history(WS, "a", 1, 1)) == [a2]
    assert await read(lambda tx: tx.events.history(WS, "missing", 0, 10)) == []
    assert await read(lambda tx: tx.events.page(WS, 0, None, 10)) == [a1, b1, a2, a3]
    assert await read(lambda tx: tx.events.page(WS, b1.sequence, None, 10)) == [a2, a3]
    assert await read(lambda tx: tx.events.page(WS, 0, None, 2)) == [a1, b1]
    assert await read(lambda tx: tx.events.page(WS, a1.sequence, "a", 10)) == [a2, a3]


async def test_the_terminal_event_is_the_first_that_ended_the_current_generation(backend):
    await put(backend, record("t1"))
    ended = dict(state=GenerationState.TERMINAL, outcome=Outcome.FAILED, work_status=WorkStatus.BLOCKED)
    terminal = await put(backend, record("t1", revision=2, **ended))
    later = record("t1", revision=3, **{**ended, "work_status": WorkStatus.READY})
    await put(backend, later)
    assert await backend.read(lambda tx: tx.events.terminal(later)) == terminal
    next_generation = record("t1", revision=4, generation=2, state=GenerationState.ACTIVE)
    await put(backend, next_generation)
    with pytest.raises(InvariantViolated):
        await backend.read(lambda tx: tx.events.terminal(next_generation))


# -- request ids -------------------------------------------------------------------


async def test_a_request_id_is_remembered_in_its_scope(backend):
    await backend.write(lambda tx: tx.requests.remember(key(), b"response", T0))
    assert await backend.read(lambda tx: tx.requests.recall(WS, "caller", "SetWorkStatus", "req-1")) == (
        FP_A,
        b"response",
    )
    for scope in [("other", "caller", "SetWorkStatus"), (WS, "else", "SetWorkStatus"), (WS, "caller", "GetTask")]:
        assert await backend.read(lambda tx, scope=scope: tx.requests.recall(*scope, "req-1")) is None
    with pytest.raises(Exception):  # noqa: B017 - each adapter raises its own integrity error
        await backend.write(lambda tx: tx.requests.remember(key(fingerprint=FP_B), b"other", T0))
    assert await backend.read(lambda tx: tx.requests.recall(WS, "caller", "SetWorkStatus", "req-1")) == (
        FP_A,
        b"response",
    )


async def test_request_ids_are_forgotten_oldest_first_in_batches(backend):
    for n in range(5):
        await backend.write(lambda tx, n=n: tx.requests.remember(key(f"req-{n}"), b"r", T0 + 10 * (5 - n)))

    def remembered():
        return backend.read(
            lambda tx: sorted(n for n in range(5) if tx.requests.recall(WS, "caller", "SetWorkStatus", f"req-{n}"))
        )

    assert await backend.write(lambda tx: tx.requests.forget(T0 + 35, 2)) == 2  # the two oldest: 4 and 3
    assert await remembered() == [0, 1, 2]
    assert await backend.write(lambda tx: tx.requests.forget(T0 + 35, 2)) == 1  # 2 (T0 + 30); 1 is not old enough
    assert await backend.write(lambda tx: tx.requests.forget(T0 + 35, 2)) == 0
    assert await remembered() == [0, 1]


# -- propagations --------------------------------------------------------------------


async def test_propagations_are_claimed_oldest_first_and_discharged_once(backend):
    parent = record("p", state=GenerationState.ACTIVE)
    event = await put(backend, parent)
    owed = [
        Propagation(ChildRef("c2", 1), IntentKind.REQUEST_CANCELLATION),
        Propagation(ChildRef("c1", 3), IntentKind.PROPAGATE_PARENT_TERMINATION),
    ]
    await backend.write(lambda tx: tx.propagations.insert(event, owed[:1], T0))
    await backend.write(lambda tx: tx.propagations.insert(event, owed[1:], T0))
    claimed = await pending(backend)
    assert [(p.child, p.intent) for p in claimed] == [(o.child, o.intent) for o in owed]
    assert {(p.workspace_id, p.parent_task_id, p.parent_generation, p.parent_sequence) for p in claimed} == {
        (WS, "p", 1, event.sequence)
    }
    assert claimed[0].id < claimed[1].id
    assert await pending(backend, limit=1) == claimed[:1]
    assert await backend.write(lambda tx: tx.propagations.discharge(claimed[0].id)) is True
    assert await backend.write(lambda tx: tx.propagations.discharge(claimed[0].id)) is False
    assert await pending(backend) == claimed[1:]


async def test_the_figures_count_pending_propagations_and_remembered_request_ids(backend):
    empty = await backend.read(lambda tx: tx.load_figures())
    assert (empty.pending_propagations, empty.request_ids) == (0, 0)
    # Only the in-memory fake has no database on disk.
    assert (empty.database_bytes is None) == isinstance(backend, MemoryLifecycleStore)
    event = await put(backend, record("p", state=GenerationState.ACTIVE))
    owed = [Propagation(ChildRef(f"c{n}", 1), IntentKind.REQUEST_CANCELLATION) for n in range(3)]
    await backend.write(lambda tx: tx.propagations.insert(event, owed, T0))
    for n in range(2):
        await backend.write(lambda tx, n=n: tx.requests.remember(key(f"req-{n}"), b"r", T0))
    figures = await backend.read(lambda tx: tx.load_figures())
    assert (figures.pending_propagations, figures.request_ids) == (3, 2)
    first = (await pending(backend))[0]
    await backend.write(lambda tx: tx.propagations.discharge(first.id))
    assert (await backend.read(lambda tx: tx.load_figures())).pending_propagations == 2
    if empty.database_bytes is not None:
        assert figures.database_bytes is not None and figures.database_bytes > 0


# -- transactions ----------------------------------------------------------------------


async def test_a_write_that_raises_leaves_nothing_behind(backend):
    await put(backend, record("p", state=GenerationState.ACTIVE))
    before = await everything(backend)
    committed_hooks = []

    def unit(tx):
        tx.tasks.insert(record("t1", parent=ParentLink("p", 1, LinkMode.ATTACHED)))
        event = tx.events.append(event_of(record("t1")))
        tx.tasks.update(record("p", revision=2, state=GenerationState.ACTIVE))
        tx.propagations.insert(event, [Propagation(ChildRef("t1", 1), IntentKind.REQUEST_CANCELLATION)], T0)
        tx.requests.remember(key(), b"response", T0)
        raise Boom("after every kind of write")

    with pytest.raises(Boom):
        await backend.write(unit, after_commit=committed_hooks.append)
    assert committed_hooks == []
    assert await everything(backend) == before
    assert await pending(backend) == []
    assert await backend.read(lambda tx: tx.requests.recall(WS, "caller", "SetWorkStatus", "req-1")) is None
    # The store is still usable, and the next event comes after every earlier one.
    after = await put(backend, record("t2"))
    assert after.sequence > max(e.sequence for e in before[1])


async def test_a_write_that_returns_a_rejection_leaves_nothing_behind(backend):
    await put(backend, record("p", state=GenerationState.ACTIVE))
    before = await everything(backend)
    committed_hooks = []
    refusal = Rejection(Reason.INVALID_TRANSITION, "refused after every kind of write")

    def unit(tx):
        tx.tasks.insert(record("t1", parent=ParentLink("p", 1, LinkMode.ATTACHED)))
        event = tx.events.append(event_of(record("t1")))
        tx.tasks.update(record("p", revision=2, state=GenerationState.ACTIVE))
        tx.propagations.insert(event, [Propagation(ChildRef("t1", 1), IntentKind.REQUEST_CANCELLATION)], T0)
        tx.requests.remember(key(), b"response", T0)
        return refusal

    assert await backend.write(unit, after_commit=committed_hooks.append) == refusal
    assert committed_hooks == []
    assert await everything(backend) == before
    assert await pending(backend) == []
    assert await backend.read(lambda tx: tx.requests.recall(WS, "caller", "SetWorkStatus", "req-1")) is None


async def test_a_write_that_returns_commits_and_hands_its_result_to_after_commit(backend):
    seen = []

    def unit(tx):
        tx.tasks.insert(record("t1"))
        return "done"

    assert await backend.write(unit, after_commit=lambda result: seen.append(result)) == "done"
    assert seen == ["done"]
    assert await backend.read(lambda tx: tx.tasks.load(WS, "t1")) == record("t1")


async def test_after_commit_hooks_run_in_commit_order_before_the_writes_return(backend):
    order: list[str] = []

    async def write(n):
        await backend.write(
            lambda tx: tx.tasks.insert(record(f"t{n}")), after_commit=lambda _: order.append(f"commit {n}")
        )
        order.append(f"return {n}")

    await asyncio.gather(*(write(n) for n in range(5)))
    commits = [entry for entry in order if entry.startswith("commit")]
    assert sorted(commits) == [f"commit {n}" for n in range(5)]
    for n in range(5):
        assert order.index(f"commit {n}") < order.index(f"return {n}")


async def test_a_read_sees_what_was_committed(backend):
    assert await backend.read(lambda tx: tx.tasks.load(WS, "t1")) is None
    await put(backend, record("t1"))
    assert await backend.read(lambda tx: tx.tasks.load(WS, "t1")) == record("t1")


async def test_check_writable_passes_on_a_healthy_store_and_changes_nothing(backend):
    await put(backend, record("t1"))
    before = await everything(backend)
    await backend.check_writable()
    assert await everything(backend) == before


# ===========================================================================
# Part 2: the files. What only a file shows, inspected with a raw connection on purpose.


@pytest.fixture
def sqlite_path(tmp_path):
    return str(tmp_path / "lifecycle.sqlite3")


async def committed_register(store, task_id, now=T0):
    intent = register(task_id)
    command = Command(intent, lambda s: decide(intent, s, POLICY))
    return await store.write(lambda tx: apply_intent(tx, command, now))


async def test_sqlite_the_file_is_a_wal_database_at_the_current_schema(sqlite_path):
    store = await SqliteLifecycleStore.open(sqlite_path)
    try:
        await committed_register(store, "t1")
        with sqlite3.connect(sqlite_path) as other:
            assert other.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
            assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            tables = {r[0] for r in other.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            assert {"tasks", "lifecycle_events", "request_ids", "pending_propagations"} <= tables
    finally:
        await store.close()


async def test_sqlite_reopening_keeps_the_data_and_migrates_nothing_twice(sqlite_path):
    store = await SqliteLifecycleStore.open(sqlite_path)
    await committed_register(store, "t1")
    await store.close()
    store = await SqliteLifecycleStore.open(sqlite_path)
    try:
        assert (await store.read(lambda tx: tx.tasks.load(WS, "t1"))).revision == 1
        assert [e.revision for e in await store.read(lambda tx: tx.events.history(WS, "t1", 0, 10))] == [1]
        with sqlite3.connect(sqlite_path) as other:
            assert other.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("query", "by_change", "index"),
    [
        (TaskQuery(), False, "PRIMARY KEY"),
        (TaskQuery(state=GenerationState.ACTIVE), False, "tasks_open_by_state"),
        (TaskQuery(work_status=WorkStatus.BLOCKED), False, "tasks_open_by_work_status"),
        (TaskQuery(outcome=Outcome.FAILED), False, "tasks_ended_by_outcome"),
        (TaskQuery(task_id_prefix="bulk-09"), False, "PRIMARY KEY"),
        # Completed tasks are in no partial index: the key's order, filtered (they are the bulk).
        (TaskQuery(state=TERMINAL), False, "PRIMARY KEY"),
        (TaskQuery(), True, "lifecycle_events_by_workspace"),
        (TaskQuery(state=GenerationState.ACTIVE), True, "lifecycle_events_by_workspace"),
    ],
    ids=repr,
)
async def test_sqlite_a_filtered_page_is_read_from_an_index_in_its_order(sqlite_path, query, by_change, index):
    """What keeps a filtered page as cheap as an unfiltered one: the query walks an
    index in the listing's order (a search, never a scan of the workspace, and no
    sort of what it found)."""
    await (await SqliteLifecycleStore.open(sqlite_path)).close()
    run: list[str] = []
    with sqlite3.connect(sqlite_path) as db:
        db.set_trace_callback(run.append)
        tx = SqliteLifecycleTx.over(db)
        if by_change:
            tx.tasks.page_by_change(WS, query, None, 50)
        else:
            tx.tasks.page(WS, query, "", 50)
        db.set_trace_callback(None)
        [sql] = run
        plan = " / ".join(row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}"))
    assert index in plan and "TEMP B-TREE" not in plan and "SCAN" not in plan, plan


async def test_sqlite_an_in_memory_database_serves_reads_and_writes():
    store = await SqliteLifecycleStore.open(":memory:")
    try:
        committed = await committed_register(store, "t1")
        assert await store.read(lambda tx: tx.events.page(WS, 0, None, 10)) == [committed.event]
        await store.check_writable()
    finally:
        await store.close()


async def test_sqlite_refuses_a_database_newer_than_the_code(tmp_path):
    path = tmp_path / "newer.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StorageRefused, match="newer"):
        await SqliteLifecycleStore.open(str(path))
    with sqlite3.connect(path) as db:  # left as it was
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        assert db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] == 0


async def test_sqlite_refuses_a_file_that_is_not_a_database(tmp_path):
    path = tmp_path / "notes.txt"
    content = b"these are somebody's notes, not a database\n" * 200
    path.write_bytes(content)
    with pytest.raises(StorageRefused):
        await SqliteLifecycleStore.open(str(path))
    assert path.read_bytes() == content


async def test_sqlite_pending_propagations_survive_a_crash_and_are_replayed(sqlite_path, clock):
    h = Harness(await SqliteLifecycleStore.open(sqlite_path), clock)
    await active_task(h, "parent")
    link = ParentLink("parent", 1, LinkMode.ATTACHED)
    await active_task(h, "c1", parent=link)
    await active_task(h, "c2", parent=link)
    await h.ok(plain(i.SettleFailure, "parent"))
    # The process dies after the parent's commit, before any child's.
    await h.store.close()

    reopened = Harness(await SqliteLifecycleStore.open(sqlite_path), clock)
    try:
        assert [(p.child.task_id, p.intent) for p in await pending(reopened.store)] == [
            ("c1", IntentKind.PROPAGATE_PARENT_TERMINATION),
            ("c2", IntentKind.PROPAGATE_PARENT_TERMINATION),
        ]
        assert (await reopened.task("c1")).state is GenerationState.ACTIVE
        assert await reopened.authority.deliver_pending() == 2
        for child in ("c1", "c2"):
            assert (await reopened.task(child)).outcome is Outcome.CANCELLED
        assert await pending(reopened.store) == []
        # Each child terminated exactly once.
        assert [e.intent for e in await reopened.events("c1")].count(IntentKind.PROPAGATE_PARENT_TERMINATION) == 1
    finally:
        await reopened.store.close()


# -- upgrades ----------------------------------------------------------------------


def _before(migrations: list[Migration], name: str) -> list[Migration]:
    """The migrations a database had before the one called `name`."""
    return migrations[: [m.name for m in migrations].index(name)]


async def _upgraded_store(engine: str, tmp_path, upgrade: str, earlier_rows) -> LifecycleStore:
    """A store opened (and so upgraded) on a database at the schema before the
    migration called `upgrade`, holding what `earlier_rows(db, cause_text)` wrote."""
    if engine == "sqlite":
        path = str(tmp_path / "lifecycle.sqlite3")
        with sqlite3.connect(path, isolation_level=None) as db:
            for migration in _before(migrations_in(MIGRATIONS_PACKAGE), upgrade):
                db.executescript(f"BEGIN;\n{migration.sql}\nPRAGMA user_version = {migration.version};\nCOMMIT;")
            db.execute("BEGIN")
            earlier_rows(db, str)
            db.execute("COMMIT")
        return await SqliteLifecycleStore.open(path)
    url = await asyncio.to_thread(fresh_database)
    database = await PostgresDatabase.open(url, PG_SCHEMA, _before(migrations_in(PG_MIGRATIONS_PACKAGE), upgrade))
    try:
        await database.write(lambda conn: earlier_rows(SqliteStyle(conn), str.encode))
        # The counter the adapter takes the next event's sequence from.
        await database.write(
            lambda conn: conn.execute(
                "UPDATE lifecycle_event_sequence SET value = (SELECT COALESCE(MAX(sequence), 0) FROM lifecycle_events)"
            )
        )
    finally:
        await database.close()
    return await PostgresLifecycleStore.open(url)


def _previous_release_rows(db, cause_text) -> None:
    """A parent, its attached child and the child's activation, as the release before
    registration events named the parent stored them."""
    tx = SqliteLifecycleTx.over(db)
    link = ParentLink("parent", 1, LinkMode.ATTACHED)
    rows = [
        (record("parent"), 1, None),
        (record("child", parent=link), 2, None),
        (record("child", revision=2, parent=link, state=GenerationState.ACTIVE), 3, "REGISTERED"),
    ]
    for task, sequence, from_state in rows:
        (tx.tasks.insert if task.revision == 1 else tx.tasks.update)(task)
        db.execute(
            "INSERT INTO lifecycle_events (sequence, workspace_id, task_id, generation, revision, intent, from_state, "
            "to_state, work_status, cause_source, cause_reason, cause_originating_ids, committed_at) "
            "VALUES (?, ?, ?, 1, ?, ?, ?, ?, 'READY', ?, ?, '{}', ?)",
            (
                sequence,
                WS,
                task.task_id,
                task.revision,
                event_of(task).intent.name,
                from_state,
                task.state.name,
                cause_text("test"),
                cause_text("because"),
                T0,
            ),
        )


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
async def test_the_upgrade_names_the_parent_on_earlier_registration_events(engine, tmp_path):
    store = await _upgraded_store(engine, tmp_path, "parent_on_registration_events", _previous_release_rows)
    try:
        events = await store.read(lambda tx: tx.events.page(WS, 0, None, 10))
        assert [(e.task_id, e.revision, e.parent) for e in events] == [
            ("parent", 1, None),
            ("child", 1, ParentLink("parent", 1, LinkMode.ATTACHED)),
            ("child", 2, None),
        ]
        # History is immutable again once the upgrade has filled it in.
        with pytest.raises(Exception, match="immutable"):
            await store.write(lambda tx: tx._s.db.execute("UPDATE lifecycle_events SET parent_task_id = NULL"))
    finally:
        await store.close()


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
async def test_each_caller_is_stored_once_and_earlier_events_keep_theirs(engine, tmp_path):
    def earlier_event(db, cause_text) -> None:
        SqliteLifecycleTx.over(db).tasks.insert(record("old"))
        db.execute(
            "INSERT INTO lifecycle_events (sequence, workspace_id, task_id, generation, revision, intent, to_state, "
            "work_status, cause_source, cause_reason, cause_originating_ids, committed_at, caller_subject, "
            "caller_role) VALUES (1, ?, 'old', 1, 1, 'REGISTER_TASK', 'REGISTERED', 'READY', ?, ?, '{}', ?, "
            "'spiffe://before', 'host')",
            (WS, cause_text("test"), cause_text("because"), T0),
        )

    store = await _upgraded_store(engine, tmp_path, "callers_stored_once", earlier_event)
    agent, service = Caller("someone", "agent"), Caller("completion", "service")

    def append(tx) -> None:
        for n, caller in enumerate([agent, service, agent, service, agent]):
            task = record(f"new-{n}")
            tx.tasks.insert(task)
            tx.events.append(event_of(task, caller=caller))

    try:
        await store.write(append)
        events = await store.read(lambda tx: tx.events.page(WS, 0, None, 10))
        assert [(e.task_id, e.caller) for e in events] == [
            ("old", Caller("spiffe://before", "host")),
            ("new-0", agent),
            ("new-1", service),
            ("new-2", agent),
            ("new-3", service),
            ("new-4", agent),
        ]
        assert [(e.task_id, e.caller) for e in await store.read(lambda tx: tx.events.history(WS, "new-1", 0, 5))] == [
            ("new-1", service)
        ]

        def stored(tx):
            callers = tx._s.db.execute("SELECT subject, role FROM callers ORDER BY caller_id").fetchall()
            texts = tx._s.db.execute(
                "SELECT caller_subject, caller_role, caller_id IS NULL FROM lifecycle_events ORDER BY sequence"
            ).fetchall()
            return [tuple(r) for r in callers], [tuple(r) for r in texts]

        callers, texts = await store.read(stored)
        assert callers == [("someone", "agent"), ("completion", "service")]
        # The text stays in the rows written before; later rows carry only the number.
        assert texts == [("spiffe://before", "host", True)] + [("", "", False)] * 5
    finally:
        await store.close()
