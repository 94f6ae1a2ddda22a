"""Unit tests of the completion transaction's units of work
(completion_service/units/completions.py) on the in-memory store: the snapshot the
gates judge, the duplicate policy, superseding a refused completion, request-id
replay, external-gate answers, and evidence. Refusals change nothing."""

from __future__ import annotations

import dataclasses

import pytest

from completion_service.core.gates import ExternalAnswer, ExternalGate, WorkspacePolicy, snapshot_basis
from completion_service.core.model import (
    AgentAction,
    CompletionEventKind,
    EvidenceRecord,
    LifecycleState,
    RequestedOutcome,
    SettlementStatus,
    Verdict,
)
from completion_service.errors import Reason
from completion_service.storage.port import AttemptRecord
from completion_service.units import completions, runs, settlements
from completion_service.units.completions import AttemptOutcome, CompletionCorrupted, EvidenceCommand, StaleView
from completion_service.units.settlements import Settlement
from funnel.runtime.errors import Rejection
from funnel.runtime.idempotency import Replay
from tests.completion.units_support import ACTIVE, SECOND, START, WS, World, close_command, key


@pytest.fixture
def world() -> World:
    return World()


def refused(result, reason: Reason) -> Rejection:
    assert isinstance(result, Rejection), result
    assert result.reason is reason, result
    return result


async def attempt(world: World, claimed, **changes):
    return await world.run(completions.attempt, **world.attempt_args(claimed, **changes))


# -- the snapshot ---------------------------------------------------------------------


async def test_the_snapshot_holds_the_run_lease_transcript_evidence_attempts_and_lifecycle(world):
    claimed = await world.claimed()
    await world.set_transcript("t-1", 7, "cp-3", open_turn="turn-9")
    evidence = EvidenceRecord("evd-1", WS, "t-1", 1, "tests", True, "cp-3", "", claimed.run.run_id, START)
    await world.store.write(lambda tx: tx.evidence.insert(evidence))
    await world.store.write(
        lambda tx: tx.completions.insert_attempt(
            AttemptRecord(WS, "t-1", 1, claimed.run.run_id, "cp-3", "digest", Verdict.SOFT_BLOCK, 7, START)
        )
    )
    command = world.attempt_command(claimed, state_version=6, result="done")
    snapshot = await world.read(lambda tx: completions.load_snapshot(tx, command, ACTIVE, START + 1))
    assert (snapshot.now, snapshot.run, snapshot.lease, snapshot.claimed_epoch) == (
        START + 1,
        claimed.run.view(),
        claimed.lease,
        1,
    )
    assert (snapshot.transcript.state_version, snapshot.transcript.checkpoint, snapshot.transcript.open_turn) == (
        7,
        "cp-3",
        "turn-9",
    )
    assert snapshot.evaluated_state_version == 6 and snapshot.lifecycle == ACTIVE
    assert [(f.kind, f.passed, f.checkpoint, f.order) for f in snapshot.evidence] == [("tests", True, "cp-3", 0)]
    assert [(a.checkpoint, a.result_digest, a.blocked) for a in snapshot.attempts] == [("cp-3", "digest", True)]
    # Without a state version the agent evaluated the current one.
    current = dataclasses.replace(command, state_version=None)
    assert (
        await world.read(lambda tx: completions.load_snapshot(tx, current, ACTIVE, START))
    ).evaluated_state_version == 7


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"run_id": "run-unknown"}, Reason.RUN_NOT_FOUND),
        ({"task_id": "t-other"}, Reason.RUN_NOT_FOUND),  # the run belongs to another task
        ({"holder": "agent-2"}, Reason.RUN_NOT_HELD),
    ],
)
async def test_an_attempt_on_a_run_it_cannot_name_is_refused_and_changes_nothing(world, changes, reason):
    claimed = await world.claimed()
    before = world.state()
    refused(await attempt(world, claimed, **changes), reason)
    assert world.state() == before


async def test_a_projected_view_of_another_generation_than_the_runs_is_stale_and_changes_nothing(world):
    claimed = await world.claimed()
    before = world.state()
    older = dataclasses.replace(ACTIVE, generation=0)
    stale = await attempt(world, claimed, lifecycle=older, lifecycle_projected=True, request=key("Attempt", "r-1"))
    assert isinstance(stale, StaleView) and world.state() == before
    # The same view read for the attempt is judged: the run's generation is not current.
    blocked = await attempt(world, claimed, lifecycle=older)
    assert blocked.decision.details.decisive_gate == "lifecycle.generation_current"


# -- decisions --------------------------------------------------------------------------


async def test_a_blocked_attempt_is_recorded_with_its_event_and_no_completion(world):
    claimed = await world.claimed()
    outcome = await attempt(world, claimed, lifecycle=dataclasses.replace(ACTIVE, cancellation_requested=True))
    assert outcome.decision.verdict is Verdict.HARD_BLOCK and outcome.completion is None
    [event] = outcome.events
    assert (event.kind, event.decision, event.outcome, event.committed_at) == (
        CompletionEventKind.DECISION_BLOCKED,
        outcome.decision,
        RequestedOutcome.COMPLETED,
        START,
    )
    [recorded] = await world.read(lambda tx: tx.completions.load_attempts(WS, "t-1", 1))
    assert (recorded.verdict, recorded.run_id, recorded.attempted_at) == (Verdict.HARD_BLOCK, claimed.run.run_id, START)
    assert await world.read(lambda tx: tx.completions.load(WS, "t-1", 1)) is None


async def test_an_allowed_attempt_inserts_the_named_completion_due_for_settlement_at_once(world):
    claimed = await world.claimed()
    args = world.attempt_args(claimed, outcome=RequestedOutcome.FAILED, result="gave up")
    outcome = await world.run(completions.attempt, **args)
    assert outcome.inserted and not outcome.existing
    completion = outcome.completion
    assert (completion.completion_id, completion.outcome, completion.settlement, completion.committed_at) == (
        args["context"].completion_id,
        RequestedOutcome.FAILED,
        SettlementStatus.PENDING,
        START,
    )
    assert [e.kind for e in outcome.events] == [CompletionEventKind.COMPLETION_COMMITTED]
    assert await world.run(settlements.claim_due, owner="o", lease_micros=SECOND, limit=10) == [completion]
    # The allowed attempt counts too (never as blocked).
    [recorded] = await world.read(lambda tx: tx.completions.load_attempts(WS, "t-1", 1))
    assert recorded.verdict is Verdict.ALLOW


async def test_duplicates_keep_the_stored_completion_and_a_conflict_or_corruption_writes_nothing(world):
    claimed = await world.claimed()
    first = (await attempt(world, claimed)).completion
    # Same identity: the stored row is this attempt's.
    same = await attempt(world, claimed, result="said again")
    assert (same.existing, same.inserted, same.completion, same.events) == (True, False, first, ())
    # Another identity with the same outcome: the stored row stays the completion.
    await world.set_transcript("t-1", 3, "cp-2")
    later = await attempt(world, claimed)
    assert later.existing and later.completion == first
    # Another outcome: a conflict.
    before = world.state()
    refused(await attempt(world, claimed, outcome=RequestedOutcome.FAILED), Reason.COMPLETION_CONFLICT)
    assert world.state() == before
    # The stored identity with another payload: corruption, raised.
    await world.store.write(
        lambda tx: (
            tx.completions.delete(WS, "t-1", 1),
            tx.completions.insert(dataclasses.replace(first, payload=b"{}")),
        )
    )
    await world.set_transcript("t-1", 0, "")
    before = world.state()
    with pytest.raises(CompletionCorrupted) as raised:
        await attempt(world, claimed)
    assert raised.value.completion_id == first.completion_id
    assert world.state() == before


@pytest.mark.parametrize(
    ("refusal", "superseded"),
    [("ACTIVE_ATTACHED_CHILD", True), ("CANCELLATION_FENCED", False), ("STALE_GENERATION", False)],
)
async def test_a_completion_refused_for_a_passing_reason_gives_way_to_a_new_attempt(world, refusal, superseded):
    claimed = await world.claimed()
    first = (await attempt(world, claimed)).completion
    await world.run(
        settlements.record_settlement, completion=first, settlement=Settlement(error_reason=refusal, error_message="no")
    )
    again = await attempt(world, claimed)
    stored = await world.read(lambda tx: tx.completions.load(WS, "t-1", 1))
    if superseded:
        assert again.inserted and again.completion.completion_id != first.completion_id
        assert stored == again.completion and stored.settlement is SettlementStatus.PENDING
    else:
        assert again.existing and again.completion.completion_id == first.completion_id
        assert stored.settlement is SettlementStatus.REJECTED


async def test_external_answers_count_only_on_the_snapshot_they_were_given_for(world):
    gate = ExternalGate("review", "127.0.0.1:1")
    policy = WorkspacePolicy(external_gates=(gate,))
    claimed = await world.claimed()
    command = world.attempt_command(claimed)
    snapshot = await world.read(lambda tx: completions.load_snapshot(tx, command, ACTIVE, START))
    basis = snapshot_basis(snapshot)
    failing = await attempt(
        world,
        claimed,
        policy=policy,
        external_basis=basis,
        external_answers={"review": ExternalAnswer(False, "needs work")},
    )
    assert failing.decision.next_action is AgentAction.ADDRESS_GATE_FEEDBACK
    await world.set_transcript("t-1", 1, "cp-1")  # the transcript moved after the gates answered
    before = world.state()
    refused(
        await attempt(
            world, claimed, policy=policy, external_basis=basis, external_answers={"review": ExternalAnswer(True, "ok")}
        ),
        Reason.SNAPSHOT_CHANGED,
    )
    assert world.state() == before


async def test_an_attempt_request_id_replays_its_rendered_answer(world):
    claimed = await world.claimed()
    request = key("AttemptCompletion", "att-1", b"first")

    def render(outcome: AttemptOutcome) -> bytes:
        return f"{outcome.decision.verdict.name}:{outcome.completion.completion_id}".encode()

    first = await attempt(world, claimed, request=request, render=render)
    assert await attempt(world, claimed, request=request, render=render) == Replay(render(first))
    refused(
        await attempt(world, claimed, request=key("AttemptCompletion", "att-1", b"other"), render=render),
        Reason.REQUEST_ID_REUSED,
    )
    assert len(await world.read(lambda tx: tx.completions.load_attempts(WS, "t-1", 1))) == 1


async def test_a_terminal_generation_or_closed_run_blocks_without_a_completion(world):
    claimed = await world.claimed()
    terminal = dataclasses.replace(ACTIVE, state=LifecycleState.TERMINAL, outcome="COMPLETED")
    blocked = await attempt(world, claimed, lifecycle=terminal)
    assert [t.gate_id for t in blocked.decision.trace if t.decisive] == ["lifecycle.generation_current"]
    await world.run(runs.close_run, command=close_command(claimed.run.run_id))
    lost = await attempt(world, claimed)
    assert [t.gate_id for t in lost.decision.trace if t.decisive] == ["lease.live"]
    assert await world.read(lambda tx: tx.completions.load(WS, "t-1", 1)) is None


# -- evidence ---------------------------------------------------------------------------


def evidence(run_id: str | None, task_id: str = "t-1", generation: int = 1) -> EvidenceRecord:
    return EvidenceRecord("evd-1", WS, task_id, generation, "tests", True, "cp-1", "ok", run_id, 0)


# case: (the caller's holder, the evidence given its own run and the other agent's, the refusal or None)
EVIDENCE_CASES = {
    "own open run": ("agent-1", lambda mine, other: evidence(mine), None),
    "no run": ("agent-1", lambda mine, other: evidence(None), Reason.RUN_NOT_HELD),
    "another agent's run": ("agent-1", lambda mine, other: evidence(other, task_id="t-2"), Reason.RUN_NOT_HELD),
    "closed run": ("agent-1", lambda mine, other: evidence(mine), Reason.RUN_NOT_HELD),
    "another task's run": ("agent-1", lambda mine, other: evidence(mine, task_id="t-2"), Reason.RUN_NOT_FOUND),
    "another generation's run": ("agent-1", lambda mine, other: evidence(mine, generation=2), Reason.RUN_NOT_FOUND),
    "an unknown run": ("agent-1", lambda mine, other: evidence("run-unknown"), Reason.RUN_NOT_FOUND),
    "a host (no run)": (None, lambda mine, other: evidence(None), None),
    "a host (an agent's run)": (None, lambda mine, other: evidence(other, task_id="t-2"), None),
    "a host (a closed run)": (None, lambda mine, other: evidence(mine), None),
    "a host (an unknown run)": (None, lambda mine, other: evidence("run-unknown"), Reason.RUN_NOT_FOUND),
    "a host (another task's run)": (None, lambda mine, other: evidence(other), Reason.RUN_NOT_FOUND),
    "a host (another generation's run)": (None, lambda mine, other: evidence(mine, generation=3), Reason.RUN_NOT_FOUND),
}


@pytest.mark.parametrize("case", list(EVIDENCE_CASES))
async def test_evidence_names_an_existing_run_of_its_task_and_an_agent_only_its_own_open_one(world, case):
    mine = await world.claimed()
    other = await world.claimed("t-2", agent="agent-2")
    holder, make, reason = EVIDENCE_CASES[case]
    record = make(mine.run.run_id, other.run.run_id)
    if "closed run" in case:
        await world.run(runs.close_run, command=close_command(mine.run.run_id))
    world.clock.advance(SECOND)
    before = world.state()
    result = await world.run(completions.record_evidence, command=EvidenceCommand(record, holder))
    if reason is None:
        assert result.record == dataclasses.replace(record, recorded_at=START + SECOND)
        assert await world.read(lambda tx: tx.evidence.load(WS, record.task_id, record.generation)) == [result.record]
        # Its event names the fact and the run it vouches for, and is stored with it.
        assert (result.event.kind, result.event.evidence_id, result.event.run_id) == (
            CompletionEventKind.EVIDENCE_RECORDED,
            record.evidence_id,
            record.run_id or "",
        )
        assert (await world.read(lambda tx: tx.events.page(WS, 0, record.task_id, 100)))[-1] == result.event
    else:
        refused(result, reason)
        assert world.state() == before
