"""Unit tests of the settlement outbox's units of work
(completion_service/units/settlements.py) on the in-memory store: a settlement is
recorded once, for the completion it names, with one terminal event; an
unanswered one is postponed; due completions are claimed earliest first."""

from __future__ import annotations

import dataclasses

import pytest

from completion_service.core.model import AgentAction, CompletionEventKind, SettlementStatus
from completion_service.units import completions, runs, settlements
from completion_service.units.settlements import Recorded, Settlement
from tests.completion.units_support import SECOND, START, WS, World, close_command


@pytest.fixture
def world() -> World:
    return World()


async def committed(world: World, task_id: str = "t-1"):
    claimed = await world.claimed(task_id)
    return (await world.run(completions.attempt, **world.attempt_args(claimed))).completion


@pytest.mark.parametrize(
    ("settlement", "status", "kind"),
    [
        (
            Settlement(lifecycle_revision=4, lifecycle_event_sequence=9),
            SettlementStatus.SETTLED,
            CompletionEventKind.COMPLETION_SETTLED,
        ),
        (
            Settlement(error_reason="CANCELLATION_FENCED", error_message="fenced"),
            SettlementStatus.REJECTED,
            CompletionEventKind.TERMINALIZATION_ERROR,
        ),
    ],
)
async def test_the_lifecycles_answer_is_recorded_once_with_its_terminal_event(world, settlement, status, kind):
    completion = await committed(world)
    world.clock.advance(SECOND)
    recorded = await world.run(settlements.record_settlement, completion=completion, settlement=settlement)
    assert isinstance(recorded, Recorded)
    stored = recorded.completion
    assert (stored.settlement, stored.settle_attempts, stored.settled_at) == (status, 1, START + SECOND)
    assert (stored.lifecycle_revision, stored.error_reason) == (settlement.lifecycle_revision, settlement.error_reason)
    assert await world.read(lambda tx: tx.completions.load(WS, "t-1", 1)) == stored
    event = recorded.event
    assert (event.kind, event.completion_id, event.committed_at) == (kind, completion.completion_id, START + SECOND)
    if settlement.rejected:
        assert event.decision.next_action is AgentAction.STOP_AND_REPORT
    else:
        assert event.decision is None
    # Once recorded, any later answer changes nothing.
    before = world.state()
    again = await world.run(
        settlements.record_settlement,
        completion=completion,
        settlement=Settlement(lifecycle_revision=5, lifecycle_event_sequence=10),
    )
    assert again == stored and world.state() == before


async def test_an_answer_for_another_or_unknown_completion_changes_nothing(world):
    completion = await committed(world)
    before = world.state()
    stale = dataclasses.replace(completion, completion_id="cmp-replaced")
    assert (
        await world.run(
            settlements.record_settlement,
            completion=stale,
            settlement=Settlement(lifecycle_revision=1, lifecycle_event_sequence=1),
        )
        == completion
    )
    missing = dataclasses.replace(completion, task_id="t-unknown")
    assert (
        await world.run(
            settlements.record_settlement,
            completion=missing,
            settlement=Settlement(lifecycle_revision=1, lifecycle_event_sequence=1),
        )
        is None
    )
    assert (
        await world.store.write(lambda tx: settlements.postpone_settlement(tx, stale, next_attempt_at=START, error="x"))
        == completion
    )
    assert world.state() == before


async def test_a_postponed_settlement_counts_the_attempt_and_is_due_again_at_its_time(world):
    completion = await committed(world)
    postponed = await world.store.write(
        lambda tx: settlements.postpone_settlement(
            tx, completion, next_attempt_at=START + 3 * SECOND, error="UNAVAILABLE: down"
        )
    )
    assert (postponed.settle_attempts, postponed.settlement) == (1, SettlementStatus.PENDING)
    assert (postponed.next_settle_at, postponed.last_settle_error) == (START + 3 * SECOND, "UNAVAILABLE: down")

    def due(now: int):
        return world.store.write(lambda tx: settlements.claim_due(tx, now, "settler-1", 10 * SECOND, 10))

    assert await due(START + 3 * SECOND - 1) == []
    assert await due(START + 3 * SECOND) == [postponed]
    settled = await world.run(
        settlements.record_settlement,
        completion=postponed,
        settlement=Settlement(lifecycle_revision=2, lifecycle_event_sequence=3),
    )
    assert settled.completion.settle_attempts == 2
    assert (settled.completion.next_settle_at, settled.completion.last_settle_error) == (None, None)
    assert await due(START + 100 * SECOND) == []
    # A settled row is not postponed any more.
    assert (
        await world.store.write(lambda tx: settlements.postpone_settlement(tx, completion, START + 9 * SECOND, "x"))
        == settled.completion
    )


async def test_due_completions_are_claimed_earliest_first_up_to_the_limit(world):
    first = await committed(world, "t-1")
    world.clock.advance(SECOND)
    second = await committed(world, "t-2")
    await world.store.write(lambda tx: settlements.postpone_settlement(tx, first, START + 5 * SECOND, "x"))
    claim = lambda limit: world.store.write(  # noqa: E731
        lambda tx: settlements.claim_due(tx, START + 5 * SECOND, "settler-1", SECOND, limit)
    )
    assert [c.completion_id for c in await claim(10)] == [second.completion_id, first.completion_id]
    assert [c.completion_id for c in await claim(1)] == [second.completion_id]


# -- a fenced refusal after the run closed (issue 21) --------------------------------------

FENCED = Settlement(error_reason="CANCELLATION_FENCED", error_message="fenced")


@pytest.mark.parametrize("how", ["closed", "lease expired"])
async def test_a_fenced_refusal_with_no_run_holding_the_task_owes_the_cancellation_first(world, how):
    claimed = await world.claimed(ttl=10 * SECOND)
    completion = (await world.run(completions.attempt, **world.attempt_args(claimed))).completion
    if how == "closed":
        await world.run(
            runs.close_run,
            command=close_command(
                claimed.run.run_id, completion_seen=(completion.completion_id, SettlementStatus.PENDING)
            ),
        )
    else:
        world.clock.advance(11 * SECOND)
    before = world.state()
    owed = await world.run(settlements.record_settlement, completion=completion, settlement=FENCED)
    assert isinstance(owed, settlements.CancellationOwed)
    assert world.state() == before  # still pending: the outbox retries until the fence is ended
    # Once the shell settled the cancellation, the refusal is recorded.
    ended = dataclasses.replace(FENCED, fence_ended=True)
    recorded = await world.run(settlements.record_settlement, completion=completion, settlement=ended)
    assert isinstance(recorded, Recorded)
    assert (recorded.completion.settlement, recorded.completion.error_reason) == (
        SettlementStatus.REJECTED,
        "CANCELLATION_FENCED",
    )


@pytest.mark.parametrize("settlement", [FENCED, Settlement(error_reason="STALE_GENERATION", error_message="old")])
async def test_a_refusal_while_a_run_holds_the_task_is_recorded_at_once(world, settlement):
    completion = await committed(world)
    recorded = await world.run(settlements.record_settlement, completion=completion, settlement=settlement)
    assert isinstance(recorded, Recorded)
