"""The lifecycle units of work end to end through one store, on the in-memory
fake: request-id replay, atomicity of record, event, propagations and remembered
response, the event history and what is published of it, and the propagations a
parent owes its attached children, delivered by the authority.

That the SQL adapters keep the port the same is the conformance suite's
(test_storage.py), so these run on the fake alone."""

from __future__ import annotations

import dataclasses

import pytest

from funnel.auth.principal import Caller
from funnel.runtime.errors import Rejection
from lifecycle_service.authority import PROPAGATION_SOURCE
from lifecycle_service.core import intents as i
from lifecycle_service.core.model import Cause, GenerationState, IntentKind, LinkMode, Outcome, ParentLink, WorkStatus
from lifecycle_service.core.rules import decide
from lifecycle_service.errors import Reason
from lifecycle_service.storage.memory import MemoryLifecycleStore
from lifecycle_service.units import Command, Committed, Discharged, Replayed, Resettled, apply_intent
from tests.lifecycle.units_support import (
    FP_A,
    FP_B,
    POLICY,
    WS,
    Boom,
    Harness,
    activate,
    active_task,
    exploding_render,
    pending,
    plain,
    register,
    render,
    work,
)


@pytest.fixture
def harness(clock):
    return Harness(MemoryLifecycleStore(), clock)


# -- request ids -------------------------------------------------------------------


async def test_a_repeated_request_id_replays_the_original_response(harness):
    first = await harness.ok(register("t1", request_id="req-1"), fingerprint=FP_A)
    await harness.ok(activate("t1"))
    await harness.ok(work("t1"))
    again = await harness.apply(register("t1", request_id="req-1"), fingerprint=FP_A)
    assert again == Replayed(render(first.task, first.event)) == Replayed(first.response)
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
    assert repeat.response == render(repeat.task, settled.event)
    replay = await harness.apply(plain(i.SettleFailure, "t1", request_id="fail-2"), fingerprint=FP_B)
    assert replay == Replayed(repeat.response)


# -- atomicity: a failure anywhere in the transaction stores nothing ----------------


async def test_a_failing_render_stores_neither_record_nor_event_nor_request_id(harness):
    with pytest.raises(Boom):
        await harness.apply(register("t1", request_id="req-1"), render=exploding_render)
    assert await harness.task("t1") is None
    assert await harness.events("t1") == []
    assert await harness.all_events() == []
    assert harness.published == []
    # The request id was not remembered: a different request may use it.
    await harness.ok(register("t1", request_id="req-1"), fingerprint=FP_B)


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
        # An event whose revision already exists: (task, revision) is unique.
        return dataclasses.replace(
            transition, event=dataclasses.replace(transition.event, revision=situation.task.revision)
        )

    with pytest.raises(Exception):  # noqa: B017 - each adapter raises its own integrity error
        await harness.apply(intent, decide_with=duplicate_revision)
    assert await harness.task("t1") == before_task
    assert await harness.all_events() == before_events


async def test_no_event_without_its_record(harness):
    await active_task(harness, "t1")
    before_task, before_events = await harness.task("t1"), await harness.all_events()
    intent = plain(i.SettleFailure, "t1")

    def impossible_record(situation):
        transition = decide(intent, situation, POLICY)
        # TERMINAL without an outcome: the record's checks refuse it.
        return dataclasses.replace(transition, task=dataclasses.replace(transition.task, outcome=None))

    with pytest.raises(Exception):  # noqa: B017 - each adapter raises its own integrity error
        await harness.apply(intent, decide_with=impossible_record)
    assert await harness.task("t1") == before_task
    assert await harness.all_events() == before_events
    assert len(harness.published) == len(before_events)


async def test_a_failed_parent_transition_owes_its_children_nothing(harness):
    await active_task(harness, "parent")
    await harness.ok(register("child", parent=ParentLink("parent", 1, LinkMode.ATTACHED)))
    with pytest.raises(Boom):
        await harness.apply(plain(i.RequestCancellation, "parent", request_id="r"), render=exploding_render)
    assert await pending(harness.store) == []
    assert not (await harness.task("parent")).fenced


async def test_events_stay_ordered_and_complete_across_failed_transactions(harness):
    await active_task(harness, "t1")
    for n in range(6):
        if n % 2:
            with pytest.raises(Boom):
                await harness.apply(work("t1", WorkStatus.BLOCKED, request_id=f"r{n}"), render=exploding_render)
        else:
            await harness.ok(work("t1", WorkStatus.IN_PROGRESS if n % 4 else WorkStatus.READY))
    events = await harness.all_events()
    sequences = [e.sequence for e in events]
    assert sequences == sorted(set(sequences))
    assert [e.revision for e in events] == list(range(1, (await harness.task("t1")).revision + 1))
    assert harness.published == events


# -- the event history -------------------------------------------------------------


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
    everything_ = await harness.all_events()
    sequences = [e.sequence for e in everything_]
    assert sequences == sorted(set(sequences))
    assert {e.workspace_id for e in everything_} == {WS}
    assert sorted(everything_, key=lambda e: (e.task_id, e.revision)) == sorted(
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
    assert [e for e in harness.published if e.workspace_id == WS] == everything_


async def test_an_applied_event_round_trips_every_field(harness):
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
        caller=Caller("completion", "service"),
    )
    committed = await harness.ok(intent)
    stored = (await harness.events("t1"))[-1]
    assert stored == committed.event
    assert stored.authoritative_at == intent.authoritative_at
    assert stored.cause == intent.cause
    assert stored.caller == intent.caller
    assert stored.cancellation_requested_at is not None
    assert await harness.task("t1") == committed.task


# -- propagations to attached children ------------------------------------------------


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


async def test_only_a_childs_registration_event_names_its_parent(harness):
    await family(harness)
    link = ParentLink("parent", 1, LinkMode.ATTACHED)
    named = {(e.task_id, e.intent): e.parent for e in await harness.events("c1") + await harness.events("d1")}
    assert named == {
        ("c1", IntentKind.REGISTER_TASK): link,
        ("c1", IntentKind.ACTIVATE_GENERATION): None,
        ("d1", IntentKind.REGISTER_TASK): ParentLink("parent", 1, LinkMode.DETACHED),
        ("d1", IntentKind.ACTIVATE_GENERATION): None,
    }
    assert [e.parent for e in await harness.events("parent")] == [None, None]


async def test_parent_cancellation_is_stored_as_pending_and_delivered(harness):
    await family(harness)
    assert [c.task_id for c in await harness.children("parent")] == ["c1", "c2"]

    requested = await harness.ok(plain(i.RequestCancellation, "parent"))
    assert requested.propagations == 2
    owed = await pending(harness.store)
    assert [(p.child.task_id, p.child.generation, p.intent) for p in owed] == [
        ("c1", 1, IntentKind.REQUEST_CANCELLATION),
        ("c2", 1, IntentKind.REQUEST_CANCELLATION),
    ]
    assert {(p.parent_task_id, p.parent_generation, p.parent_sequence) for p in owed} == {
        ("parent", 1, requested.event.sequence)
    }
    # Not applied before delivery.
    assert not (await harness.task("c1")).fenced

    authority = harness.authority
    assert await authority.deliver_pending() == 2
    assert await pending(harness.store) == []
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
        assert harness.published[-2:][("c1", "c2").index(child)] == last
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
    assert await harness.authority.deliver_pending() == 2
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
    assert await harness.authority.deliver_pending() == 1
    assert await pending(harness.store) == []
    assert await harness.task("child") == child_before  # already fenced: nothing to do


async def test_a_propagation_is_discharged_only_once(harness):
    await active_task(harness, "parent")
    await active_task(harness, "child", parent=ParentLink("parent", 1, LinkMode.ATTACHED))
    await harness.ok(plain(i.RequestCancellation, "parent"))
    [owed] = await pending(harness.store)
    intent = plain(i.RequestCancellation, "child")
    command = Command(intent, lambda s: decide(intent, s, POLICY), propagation_id=owed.id)

    def apply_once():
        return harness.store.write(lambda tx: apply_intent(tx, command, harness.clock.now_micros()))

    assert isinstance(await apply_once(), Committed)
    assert await apply_once() == Discharged()
    assert (await harness.task("child")).revision == 3
