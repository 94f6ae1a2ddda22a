"""Storage conformance tests of the lifecycle store (SQLite on a file and in memory):
migrations and pragmas, refusals, request-id replay, atomicity of record + event +
propagations + remembered response, gapless events, and propagation delivery,
also after a crash between a parent's commit and its children's."""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest

from funnel.lifecycle.v1 import lifecycle_pb2 as pb
from funnel.runtime.errors import Rejection
from funnel.runtime.sqlite import migrations_in
from funnel.runtime.storage_errors import StorageRefused
from lifecycle_service.authority import PROPAGATION_SOURCE, LifecycleAuthority
from lifecycle_service.convert import event_to_proto, task_to_proto
from lifecycle_service.core import intents as i
from lifecycle_service.core.model import (
    Cause,
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
from lifecycle_service.storage.port import Command, Committed, Discharged, Replayed, Resettled
from lifecycle_service.storage.sqlite import MIGRATIONS_PACKAGE, SqliteLifecycleStore

SCHEMA_VERSION = len(migrations_in(MIGRATIONS_PACKAGE))

POLICY = Policy()
WS = "ws"
FP_A = b"A" * 32
FP_B = b"B" * 32


def render(task, event):
    return pb.SetWorkStatusResponse(task=task_to_proto(task), event=event_to_proto(event))


def command(intent, *, fingerprint=None, render=render, decide_with=None):
    if intent.request_id and fingerprint is None:
        fingerprint = FP_A
    return Command(intent, decide_with or (lambda s: decide(intent, s, POLICY)), render, fingerprint)


class Harness:
    """A store plus what it published after each commit."""

    def __init__(self, path, clock):
        self.path = path
        self.clock = clock
        self.published = []
        self.store: SqliteLifecycleStore | None = None

    async def open(self):
        self.store = await SqliteLifecycleStore.open(self.path, self.clock, self.published.append)
        return self

    async def close(self):
        await self.store.close()

    async def apply(self, intent, **kw):
        self.clock.advance(1_000)
        return await self.store.apply(command(intent, **kw))

    async def ok(self, intent, **kw) -> Committed:
        result = await self.apply(intent, **kw)
        assert isinstance(result, Committed), result
        return result

    async def task(self, task_id, workspace=WS):
        view = await self.store.get_task(workspace, task_id)
        return view.task if view else None

    async def events(self, task_id, workspace=WS):
        return await self.store.list_events(workspace, task_id, 0, 1000)

    async def all_events(self, workspace=WS):
        return await self.store.events_after(workspace, 0, None, 10_000)

    async def pragma(self, name):
        return await self.store._writer.run(lambda db: db.execute(f"PRAGMA {name}").fetchone()[0])


@pytest.fixture(params=["file", "memory"])
async def harness(request, tmp_path, clock):
    path = str(tmp_path / "lifecycle.sqlite3") if request.param == "file" else ":memory:"
    h = await Harness(path, clock).open()
    yield h
    await h.close()


@pytest.fixture
async def file_harness(tmp_path, clock):
    h = await Harness(str(tmp_path / "lifecycle.sqlite3"), clock).open()
    yield h
    if h.store is not None:
        await h.close()


def register(task_id, *, parent=None, request_id=None, workspace=WS):
    return i.RegisterTask(workspace_id=workspace, task_id=task_id, parent=parent, request_id=request_id)


def activate(task_id, generation=1, **kw):
    return i.ActivateGeneration(workspace_id=WS, task_id=task_id, generation=generation, **kw)


def work(task_id, status=WorkStatus.IN_PROGRESS, generation=1, **kw):
    return i.SetWorkStatus(workspace_id=WS, task_id=task_id, generation=generation, work_status=status, **kw)


def plain(cls, task_id, generation=1, **kw):
    return cls(workspace_id=WS, task_id=task_id, generation=generation, **kw)


async def active_task(h, task_id, parent=None):
    await h.ok(register(task_id, parent=parent))
    await h.ok(activate(task_id))


# ---------------------------------------------------------------------------
# Migrations, pragmas and refusals.


async def test_migrations_and_pragmas_are_applied(harness):
    assert await harness.pragma("user_version") == SCHEMA_VERSION
    assert await harness.pragma("synchronous") == 2  # FULL
    expected_journal = "memory" if harness.path == ":memory:" else "wal"
    assert (await harness.pragma("journal_mode")).lower() == expected_journal
    tables = await harness.store._writer.run(
        lambda db: {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    )
    assert {"tasks", "lifecycle_events", "request_ids", "pending_propagations"} <= tables


async def test_the_file_is_a_wal_database_at_the_current_schema(file_harness):
    await file_harness.ok(register("t1"))
    with sqlite3.connect(file_harness.path) as other:
        assert other.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_reopening_keeps_the_data_and_migrates_nothing_twice(file_harness):
    await file_harness.ok(register("t1"))
    await file_harness.close()
    await file_harness.open()
    assert await file_harness.pragma("user_version") == SCHEMA_VERSION
    assert (await file_harness.task("t1")).revision == 1
    assert [e.revision for e in await file_harness.events("t1")] == [1]


async def test_refuses_a_database_newer_than_the_code(tmp_path, clock):
    path = tmp_path / "newer.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StorageRefused, match="newer"):
        await SqliteLifecycleStore.open(str(path), clock)
    with sqlite3.connect(path) as db:  # left as it was
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        assert db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] == 0


async def test_refuses_a_file_that_is_not_a_database(tmp_path, clock):
    path = tmp_path / "notes.txt"
    content = b"these are somebody's notes, not a database\n" * 200
    path.write_bytes(content)
    with pytest.raises(StorageRefused):
        await SqliteLifecycleStore.open(str(path), clock)
    assert path.read_bytes() == content


# ---------------------------------------------------------------------------
# Request ids.


async def test_a_repeated_request_id_replays_the_original_response(harness):
    first = await harness.ok(register("t1", request_id="req-1"), fingerprint=FP_A)
    await harness.ok(activate("t1"))
    await harness.ok(work("t1"))
    again = await harness.apply(register("t1", request_id="req-1"), fingerprint=FP_A)
    assert again == Replayed(first.response.SerializeToString())
    # Nothing was applied by the repeat.
    assert (await harness.task("t1")).revision == 3
    assert len(await harness.all_events()) == 3


async def test_the_same_request_id_for_a_different_request_is_refused(harness):
    await harness.ok(register("t1", request_id="req-1"), fingerprint=FP_A)
    before = await harness.all_events()
    result = await harness.apply(activate("t1", request_id="req-1"), fingerprint=FP_B)
    assert isinstance(result, Rejection)
    assert result.reason is Reason.REQUEST_ID_REUSED
    assert result.metadata == {"request_id": "req-1"}
    assert (await harness.task("t1")).state is GenerationState.REGISTERED
    assert await harness.all_events() == before


async def test_request_ids_are_per_workspace(harness):
    await harness.ok(register("t1", request_id="req-1"), fingerprint=FP_A)
    other = await harness.ok(register("t1", request_id="req-1", workspace="other"), fingerprint=FP_B)
    assert other.task.workspace_id == "other"


async def test_a_rejected_request_is_not_remembered(harness):
    await harness.ok(register("t1"))
    refused = await harness.apply(plain(i.SuspendGeneration, "t1", request_id="req-9"), fingerprint=FP_A)
    assert isinstance(refused, Rejection) and refused.reason is Reason.INVALID_TRANSITION
    # The id is still free: a different request may use it.
    await harness.ok(activate("t1", request_id="req-9"), fingerprint=FP_B)


async def test_a_repeated_settlement_is_remembered_under_its_own_request_id(harness):
    await active_task(harness, "t1")
    settled = await harness.ok(plain(i.SettleFailure, "t1", request_id="fail-1"))
    repeat = await harness.apply(plain(i.SettleFailure, "t1", request_id="fail-2"), fingerprint=FP_B)
    assert isinstance(repeat, Resettled)
    assert repeat.event == settled.event
    replay = await harness.apply(plain(i.SettleFailure, "t1", request_id="fail-2"), fingerprint=FP_B)
    assert isinstance(replay, Replayed)
    assert pb.SetWorkStatusResponse.FromString(replay.response).event == event_to_proto(settled.event)


# ---------------------------------------------------------------------------
# Atomicity: a failure anywhere in the transaction stores nothing.


class Boom(Exception):
    pass


def exploding_render(task, event):
    raise Boom("render failed")


async def test_a_failing_render_stores_neither_record_nor_event_nor_request_id(harness):
    with pytest.raises(Boom):
        await harness.apply(register("t1", request_id="req-1"), render=exploding_render)
    assert await harness.task("t1") is None
    assert await harness.events("t1") == []
    assert await harness.all_events() == []
    assert harness.published == []
    # The request id was not remembered: a different request may use it.
    committed = await harness.ok(register("t1", request_id="req-1"), fingerprint=FP_B)
    assert committed.event.sequence == 1  # and the failed attempt left no gap


async def test_a_failing_decide_changes_nothing(harness):
    await active_task(harness, "t1")
    before_task, before_events = await harness.task("t1"), await harness.all_events()

    def explode(situation):
        raise Boom("decide failed")

    with pytest.raises(Boom):
        await harness.apply(work("t1", request_id="req-1"), decide_with=explode)
    assert await harness.task("t1") == before_task
    assert await harness.all_events() == before_events
    assert len(harness.published) == len(before_events)
    await harness.ok(work("t1", request_id="req-1"), fingerprint=FP_B)


async def test_no_record_change_without_its_event(harness):
    """The record is written before its event: when the event cannot be stored the
    record change is rolled back with it."""
    await active_task(harness, "t1")
    before_task, before_events = await harness.task("t1"), await harness.all_events()
    intent = work("t1", WorkStatus.BLOCKED)

    def duplicate_revision(situation):
        transition = decide(intent, situation, POLICY)
        # An event whose revision already exists: the insert violates UNIQUE(task, revision).
        return dataclasses.replace(
            transition, event=dataclasses.replace(transition.event, revision=situation.task.revision)
        )

    with pytest.raises(sqlite3.IntegrityError):
        await harness.apply(intent, decide_with=duplicate_revision)
    assert await harness.task("t1") == before_task
    assert await harness.all_events() == before_events


async def test_no_event_without_its_record(harness):
    await active_task(harness, "t1")
    before_task, before_events = await harness.task("t1"), await harness.all_events()
    intent = plain(i.SettleFailure, "t1")

    def impossible_record(situation):
        transition = decide(intent, situation, POLICY)
        # TERMINAL without an outcome violates the table's CHECK.
        return dataclasses.replace(transition, task=dataclasses.replace(transition.task, outcome=None))

    with pytest.raises(sqlite3.IntegrityError):
        await harness.apply(intent, decide_with=impossible_record)
    assert await harness.task("t1") == before_task
    assert await harness.all_events() == before_events
    assert len(harness.published) == len(before_events)


async def test_a_failed_parent_transition_owes_its_children_nothing(harness):
    await active_task(harness, "parent")
    await harness.ok(register("child", parent=ParentLink("parent", 1, LinkMode.ATTACHED)))
    with pytest.raises(Boom):
        await harness.apply(plain(i.RequestCancellation, "parent"), render=exploding_render)
    assert await harness.store.pending_propagations(100) == []
    assert not (await harness.task("parent")).fenced


async def test_events_stay_gapless_across_failed_transactions(harness):
    await active_task(harness, "t1")
    for n in range(6):
        if n % 2:
            with pytest.raises(Boom):
                await harness.apply(work("t1", WorkStatus.BLOCKED), render=exploding_render)
        else:
            await harness.ok(work("t1", WorkStatus.IN_PROGRESS if n % 4 else WorkStatus.READY))
    events = await harness.all_events()
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert [e.revision for e in events] == list(range(1, (await harness.task("t1")).revision + 1))


# ---------------------------------------------------------------------------
# The event history.


async def test_events_are_gapless_per_task_ordered_globally_and_published_in_commit_order(harness):
    await harness.ok(register("a"))
    await harness.ok(register("b"))
    await harness.ok(register("a", workspace="other"))
    for n in range(5):
        await harness.ok(work("a", [WorkStatus.IN_PROGRESS, WorkStatus.BLOCKED][n % 2]))
        if n % 2:
            await harness.ok(work("b", [WorkStatus.IN_PROGRESS, WorkStatus.BLOCKED][n // 2 % 2]))
    task_a, task_b = await harness.task("a"), await harness.task("b")
    events_a, events_b = await harness.events("a"), await harness.events("b")
    assert [e.revision for e in events_a] == list(range(1, task_a.revision + 1))
    assert [e.revision for e in events_b] == list(range(1, task_b.revision + 1))
    everything = await harness.all_events()
    sequences = [e.sequence for e in everything]
    assert sequences == sorted(set(sequences))
    assert {e.workspace_id for e in everything} == {WS}
    assert sorted(everything, key=lambda e: (e.task_id, e.revision)) == sorted(
        events_a + events_b, key=lambda e: (e.task_id, e.revision)
    )
    # The last event describes the record.
    last_a = events_a[-1]
    assert (last_a.generation, last_a.revision, last_a.to_state, last_a.work_status) == (
        task_a.generation,
        task_a.revision,
        task_a.state,
        task_a.work_status,
    )
    # Published after commit, in commit order, exactly what was stored.
    assert [e for e in harness.published if e.workspace_id == WS] == everything
    assert await harness.store.events_after(WS, 0, "b", 100) == events_b
    assert await harness.store.events_after(WS, everything[2].sequence, None, 2) == everything[3:5]
    assert await harness.store.list_events(WS, "a", 2, 2) == events_a[2:4]


async def test_an_event_round_trips_every_field(harness):
    await active_task(harness, "t1")
    harness.clock.advance(60_000_000)
    await harness.ok(plain(i.RequestCancellation, "t1"))
    intent = i.SettleCompletion(
        workspace_id=WS,
        task_id="t1",
        generation=1,
        request_id="req-c",
        completion_id="cmp-1",
        authoritative_at=harness.clock.now_micros() - 10_000_000,
        cause=Cause("completion_service", "gates passed", (("completion_id", "cmp-1"), ("run_id", "r-1"))),
    )
    committed = await harness.ok(intent)
    stored = (await harness.events("t1"))[-1]
    assert stored == committed.event
    assert stored.authoritative_at == intent.authoritative_at
    assert stored.cause == intent.cause
    assert stored.cancellation_requested_at is not None
    assert await harness.task("t1") == committed.task


# ---------------------------------------------------------------------------
# Propagations to attached children.


async def family(h):
    """parent (ACTIVE) with attached c1 (ACTIVE), attached c2 (REGISTERED), detached d1,
    and attached c3 already terminal."""
    await active_task(h, "parent")
    link = ParentLink("parent", 1, LinkMode.ATTACHED)
    await active_task(h, "c1", parent=link)
    await h.ok(register("c2", parent=link))
    await active_task(h, "d1", parent=ParentLink("parent", 1, LinkMode.DETACHED))
    await active_task(h, "c3", parent=link)
    await h.ok(plain(i.SettleFailure, "c3"))


async def test_parent_cancellation_is_stored_as_pending_and_delivered(harness):
    await family(harness)
    view = await harness.store.get_task(WS, "parent")
    assert [c.task_id for c in view.open_attached_children] == ["c1", "c2"]

    requested = await harness.ok(plain(i.RequestCancellation, "parent"))
    assert requested.propagations == 2
    pending = await harness.store.pending_propagations(100)
    assert [(p.child.task_id, p.child.generation, p.intent) for p in pending] == [
        ("c1", 1, IntentKind.REQUEST_CANCELLATION),
        ("c2", 1, IntentKind.REQUEST_CANCELLATION),
    ]
    assert {(p.parent_task_id, p.parent_generation, p.parent_sequence) for p in pending} == {
        ("parent", 1, requested.event.sequence)
    }
    # Not applied before delivery.
    assert not (await harness.task("c1")).fenced

    authority = LifecycleAuthority(harness.store, POLICY)
    assert await authority.deliver_pending() == 2
    assert await harness.store.pending_propagations(100) == []
    for child in ("c1", "c2"):
        task = await harness.task(child)
        assert task.fenced and task.state is not GenerationState.TERMINAL
        last = (await harness.events(child))[-1]
        assert last.intent is IntentKind.REQUEST_CANCELLATION
        assert last.cause.source == PROPAGATION_SOURCE
        assert dict(last.cause.originating_ids) == {
            "parent_task_id": "parent",
            "parent_event_sequence": str(requested.event.sequence),
        }
    assert not (await harness.task("d1")).fenced
    assert (await harness.task("c3")).outcome is Outcome.FAILED
    assert await authority.deliver_pending() == 0

    settled = await harness.ok(plain(i.SettleCancellation, "parent"))
    assert settled.propagations == 2
    assert await authority.deliver_pending() == 2
    for child in ("c1", "c2"):
        task = await harness.task(child)
        assert (task.state, task.outcome, task.work_status) == (
            GenerationState.TERMINAL,
            Outcome.CANCELLED,
            WorkStatus.CANCELLED,
        )
    assert (await harness.task("d1")).state is GenerationState.ACTIVE


async def test_parent_failure_terminates_attached_descendants(harness):
    await active_task(harness, "parent")
    await active_task(harness, "child", parent=ParentLink("parent", 1, LinkMode.ATTACHED))
    await active_task(harness, "grandchild", parent=ParentLink("child", 1, LinkMode.ATTACHED))
    failed = await harness.ok(plain(i.SettleTimeout, "parent"))
    assert failed.propagations == 1
    # One pass delivers the child's termination and the one it owes the grandchild.
    assert await LifecycleAuthority(harness.store, POLICY).deliver_pending() == 2
    for task_id in ("child", "grandchild"):
        task = await harness.task(task_id)
        assert (task.outcome, task.work_status) == (Outcome.CANCELLED, WorkStatus.CANCELLED)
        assert (await harness.events(task_id))[-1].intent is IntentKind.PROPAGATE_PARENT_TERMINATION


async def test_a_propagation_the_child_refuses_is_dropped(harness):
    await active_task(harness, "parent")
    await active_task(harness, "child", parent=ParentLink("parent", 1, LinkMode.ATTACHED))
    await harness.ok(plain(i.RequestCancellation, "child"))
    child_before = await harness.task("child")
    await harness.ok(plain(i.RequestCancellation, "parent"))
    assert await LifecycleAuthority(harness.store, POLICY).deliver_pending() == 1
    assert await harness.store.pending_propagations(100) == []
    assert await harness.task("child") == child_before  # already fenced: nothing to do


async def test_a_propagation_is_discharged_only_once(harness):
    await active_task(harness, "parent")
    await active_task(harness, "child", parent=ParentLink("parent", 1, LinkMode.ATTACHED))
    await harness.ok(plain(i.RequestCancellation, "parent"))
    [pending] = await harness.store.pending_propagations(100)
    intent = plain(i.RequestCancellation, "child")

    def apply_once():
        return harness.store.apply(Command(intent, lambda s: decide(intent, s, POLICY), propagation_id=pending.id))

    assert isinstance(await apply_once(), Committed)
    assert await apply_once() == Discharged()
    assert (await harness.task("child")).revision == 3


async def test_pending_propagations_survive_a_crash_and_are_replayed(file_harness, clock):
    h = file_harness
    await active_task(h, "parent")
    link = ParentLink("parent", 1, LinkMode.ATTACHED)
    await active_task(h, "c1", parent=link)
    await active_task(h, "c2", parent=link)
    await h.ok(plain(i.SettleFailure, "parent"))
    # The process dies after the parent's commit, before any child's.
    await h.close()
    h.store = None

    reopened = await Harness(h.path, clock).open()
    try:
        pending = await reopened.store.pending_propagations(100)
        assert [(p.child.task_id, p.intent) for p in pending] == [
            ("c1", IntentKind.PROPAGATE_PARENT_TERMINATION),
            ("c2", IntentKind.PROPAGATE_PARENT_TERMINATION),
        ]
        assert (await reopened.task("c1")).state is GenerationState.ACTIVE
        assert await LifecycleAuthority(reopened.store, POLICY).deliver_pending() == 2
        for child in ("c1", "c2"):
            assert (await reopened.task(child)).outcome is Outcome.CANCELLED
        assert await reopened.store.pending_propagations(100) == []
        # Each child terminated exactly once.
        assert [e.intent for e in await reopened.events("c1")].count(IntentKind.PROPAGATE_PARENT_TERMINATION) == 1
    finally:
        await reopened.close()


async def test_check_writable_passes_on_a_healthy_store(harness):
    await harness.store.check_writable()
    # The probe changes nothing.
    assert await harness.all_events() == []
    assert await harness.pragma("user_version") == SCHEMA_VERSION
