"""Unit tests of the runs-and-leases units of work (completion_service/units/runs.py) on
the in-memory store: claim, renew, close a run, close stalled
runs. Refusals change nothing."""

from __future__ import annotations

import dataclasses

import pytest

from completion_service.core.model import FinalStatus, Lease, RunOutcome, SettlementStatus
from completion_service.core.transcript import EventKind, SessionEvent
from completion_service.errors import Reason
from completion_service.units import completions, runs, settlements, transcripts
from completion_service.units.runs import Claimed, RenewCommand
from completion_service.units.settlements import Settlement
from completion_service.units.transcripts import AppendCommand
from funnel.runtime.errors import Rejection, instant
from funnel.runtime.idempotency import Replay
from tests.completion.units_support import SECOND, START, WS, World, close_command, key


@pytest.fixture
def world() -> World:
    return World()


def refused(result, reason: Reason) -> Rejection:
    assert isinstance(result, Rejection), result
    assert result.reason is reason, result
    return result


# -- claim ------------------------------------------------------------------------


async def test_a_claim_opens_a_run_of_the_reported_generation_with_the_given_id(world):
    command = world.claim_command(generation=3, ttl=5 * SECOND)
    claimed = await world.run(runs.claim, command=command)
    assert claimed.run.run_id == command.run_id and claimed.run.generation == 3
    assert (claimed.run.epoch, claimed.run.claimed_at, claimed.run.lease_expires_at) == (1, START, START + 5 * SECOND)
    assert claimed.lease == Lease("t-1", command.run_id, 1, START + 5 * SECOND)
    assert not claimed.repaired
    assert await world.read(lambda tx: tx.runs.load_lease(WS, "t-1")) == claimed.lease


@pytest.mark.parametrize(
    ("advance", "close_holder", "granted"),
    [
        (9, False, False),  # the holder's lease is live and its run open
        (10, False, True),  # the lease expired (expiry is exclusive)
        (1, True, True),  # the holder's run closed
    ],
)
async def test_a_claim_is_granted_unless_an_open_run_holds_a_live_lease(world, advance, close_holder, granted):
    holder = await world.claimed(ttl=10 * SECOND)
    if close_holder:
        await world.run(runs.close_run, command=close_command(holder.run.run_id))
    world.clock.advance(advance * SECOND)
    before = world.state()
    result = await world.run(runs.claim, command=world.claim_command(agent="agent-2"))
    if granted:
        assert isinstance(result, Claimed) and result.lease.epoch == 2
    else:
        rejection = refused(result, Reason.LEASE_HELD)
        assert rejection.metadata == {
            "holder_run_id": holder.run.run_id,
            "lease_expire_time": instant(holder.lease.expires_at),
        }
        assert world.state() == before


async def test_a_claim_closes_the_turn_the_previous_holder_left_open(world):
    first = await world.claimed(ttl=SECOND)
    opened = [SessionEvent(EventKind.TURN_START, ref="turn-1"), SessionEvent(EventKind.STEP_START, ref="step-1")]
    await world.run(transcripts.append, command=AppendCommand(WS, "t-1", opened, 1, holder="agent-1"))
    world.clock.advance(2 * SECOND)
    second = await world.claimed(agent="agent-2")
    assert second.repaired and second.lease.epoch == first.lease.epoch + 1
    closers = await world.read(lambda tx: tx.transcripts.page(WS, "t-1", 2, 10))
    assert [(e.kind, e.synthetic, e.recorded_at) for e in closers] == [
        (EventKind.STEP_END, True, START + 2 * SECOND),
        (EventKind.TURN_END, True, START + 2 * SECOND),
    ]


async def test_a_claim_request_id_replays_and_refuses_another_request(world):
    request = key("ClaimTask", "claim-1", b"first")
    claimed = await world.claimed(request=request)
    before = world.state()
    assert await world.run(runs.claim, command=world.claim_command(request=request)) == Replay(
        claimed.run.run_id.encode()
    )
    other = key("ClaimTask", "claim-1", b"another request")
    refused(await world.run(runs.claim, command=world.claim_command(request=other)), Reason.REQUEST_ID_REUSED)
    assert world.state() == before


# -- renew ------------------------------------------------------------------------


def renew(run_id: str, epoch: int = 1, ttl: int = 30 * SECOND, holder: str | None = None) -> RenewCommand:
    return RenewCommand(WS, run_id, epoch, ttl, holder, None, None)


async def test_renew_moves_the_expiry_of_the_lease_and_the_run_together(world):
    claimed = await world.claimed(ttl=10 * SECOND)
    world.clock.advance(4 * SECOND)
    renewed = await world.run(runs.renew, command=renew(claimed.run.run_id, holder="agent-1"))
    assert renewed == dataclasses.replace(claimed.lease, expires_at=START + 34 * SECOND)
    assert (await world.read(lambda tx: tx.runs.load(WS, claimed.run.run_id))).lease_expires_at == renewed.expires_at


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("unknown run", Reason.RUN_NOT_FOUND),
        ("another agent", Reason.RUN_NOT_HELD),
        ("closed run", Reason.RUN_ALREADY_FINISHED),
        ("older epoch", Reason.LEASE_NOT_CURRENT),
        ("expired", Reason.LEASE_EXPIRED),
    ],
)
async def test_renew_refusals_change_nothing(world, case, reason):
    claimed = await world.claimed(ttl=10 * SECOND)
    command = renew(claimed.run.run_id, holder="agent-1")
    if case == "unknown run":
        command = renew("run-unknown")
    elif case == "another agent":
        command = renew(claimed.run.run_id, holder="agent-2")
    elif case == "closed run":
        await world.run(runs.close_run, command=close_command(claimed.run.run_id))
    elif case == "older epoch":
        command = renew(claimed.run.run_id, epoch=2)
    else:
        world.clock.advance(10 * SECOND)
    before = world.state()
    refused(await world.run(runs.renew, command=command), reason)
    assert world.state() == before


# -- close a run -----------------------------------------------------------------------


async def test_closing_a_run_stores_what_the_agent_reported_and_an_audit_row(world):
    claimed = await world.claimed()
    world.clock.advance(SECOND)
    request = key("CompleteRun", "close-1")
    command = close_command(
        claimed.run.run_id,
        outcome=RunOutcome.FAILED,
        final_status=FinalStatus.BLOCKED,
        notes="n" * 10,
        notes_truncated=True,
        error="boom",
        request=request,
        render=lambda run: f"closed {run.run_id}".encode(),
    )
    closed = (await world.run(runs.close_run, command=command)).run
    assert (closed.finished_at, closed.outcome, closed.final_status, closed.notes_truncated, closed.error) == (
        START + SECOND,
        RunOutcome.FAILED,
        FinalStatus.BLOCKED,
        True,
        "boom",
    )
    assert await world.read(lambda tx: tx.runs.load(WS, claimed.run.run_id)) == closed
    [audit] = await world.read(lambda tx: tx.events.audit_page(WS, None, None, 0, 10))
    assert (audit.action, dict(audit.metadata), audit.caller.subject, audit.recorded_at) == (
        "task.completed",
        {"outcome": "FAILED", "final_status": "BLOCKED", "closed_by": "agent"},
        "agent-1",
        START + SECOND,
    )
    assert await world.run(runs.close_run, command=command) == Replay(f"closed {claimed.run.run_id}".encode())


async def test_closing_a_closed_or_unknown_run_is_refused_and_changes_nothing(world):
    claimed = await world.claimed()
    await world.run(runs.close_run, command=close_command(claimed.run.run_id))
    before = world.state()
    refused(await world.run(runs.close_run, command=close_command(claimed.run.run_id)), Reason.RUN_ALREADY_FINISHED)
    refused(await world.run(runs.close_run, command=close_command("run-unknown")), Reason.RUN_NOT_FOUND)
    assert world.state() == before


# -- stalled runs ------------------------------------------------------------------------


async def test_stalled_runs_close_as_stalled_only_after_the_grace_and_in_batches(world):
    stalled = [await world.claimed(f"t-{i}", ttl=(i + 1) * SECOND) for i in range(3)]
    renewed = await world.claimed("t-live", ttl=60 * SECOND)
    world.clock.advance(4 * SECOND)
    # Expired at 1, 2 and 3 s; 4 s in, with a 2 s grace, only the first two are stalled; one per batch.
    first = await world.run(runs.close_stalled_runs, stall_after_micros=2 * SECOND, limit=1)
    second = await world.run(runs.close_stalled_runs, stall_after_micros=2 * SECOND, limit=1)
    assert [c.run.run_id for c in first + second] == [stalled[0].run.run_id, stalled[1].run.run_id]
    assert await world.run(runs.close_stalled_runs, stall_after_micros=2 * SECOND, limit=10) == []
    assert [c.run.outcome for c in first + second] == [RunOutcome.STALLED, RunOutcome.STALLED]
    assert (await world.read(lambda tx: tx.runs.load(WS, stalled[2].run.run_id))).open
    assert (await world.read(lambda tx: tx.runs.load(WS, renewed.run.run_id))).open
    audit = await world.read(lambda tx: tx.events.audit_page(WS, None, None, 0, 10))
    assert [(a.run_id, a.caller) for a in audit] == [
        (stalled[0].run.run_id, runs.SELF),
        (stalled[1].run.run_id, runs.SELF),
    ]


# -- a close overtaken by a fenced refusal (issue 21) -------------------------------------

FENCED = Settlement(error_reason="CANCELLATION_FENCED", error_message="fenced")


async def test_a_close_overtaken_by_a_fenced_refusal_is_decided_again_and_writes_nothing(world):
    claimed = await world.claimed()
    completion = (await world.run(completions.attempt, **world.attempt_args(claimed))).completion
    # The outbox records the fence's refusal while the run still holds the task...
    recorded = await world.run(settlements.record_settlement, completion=completion, settlement=FENCED)
    assert isinstance(recorded, settlements.Recorded)
    before = world.state()
    # ...after the close was decided on the pending completion (or on none): decided again.
    for seen in ((completion.completion_id, SettlementStatus.PENDING), None):
        replan = await world.run(runs.close_run, command=close_command(claimed.run.run_id, completion_seen=seen))
        assert isinstance(replan, runs.Replan)
        assert world.state() == before
    # Decided on the refusal, it closes.
    seen = (completion.completion_id, SettlementStatus.REJECTED)
    closed = await world.run(runs.close_run, command=close_command(claimed.run.run_id, completion_seen=seen))
    assert isinstance(closed, runs.Closed) and not closed.run.open


async def test_a_close_decided_on_a_pending_completion_that_is_still_pending_closes(world):
    claimed = await world.claimed()
    completion = (await world.run(completions.attempt, **world.attempt_args(claimed))).completion
    seen = (completion.completion_id, SettlementStatus.PENDING)
    closed = await world.run(runs.close_run, command=close_command(claimed.run.run_id, completion_seen=seen))
    assert isinstance(closed, runs.Closed) and not closed.run.open
