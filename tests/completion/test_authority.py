"""Direct tests of the completion authority's shells (completion_service/authority)
on the in-memory store with a scripted lifecycle service: the settler and its
outbox, the completion transaction (inline settlement, corruption alarm, external
gates), claims (the lifecycle's part first), closing runs and the cancellation
fences they end, the stall sweeper, and the background workers the authority
hands to its owner."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import pytest

from completion_service.authority import CompletionAuthority
from completion_service.clients.lifecycle_client import LifecycleRejected
from completion_service.core.gates import ExternalAnswer, ExternalGate, WorkspacePolicy
from completion_service.core.model import (
    AgentAction,
    CompletionEventKind,
    EvidenceRecord,
    FinalStatus,
    RequestedOutcome,
    RunOutcome,
    SettlementStatus,
    Verdict,
)
from completion_service.core.runs import TaskEffect
from completion_service.core.transcript import EventKind, SessionEvent
from completion_service.errors import Reason
from completion_service.policy import PolicyBook
from completion_service.units.completions import AttemptOutcome
from completion_service.units.runs import Claimed, RenewCommand
from completion_service.units.transcripts import AppendCommand
from funnel.auth.principal import Caller
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.runtime.background import Background
from funnel.runtime.errors import ServiceError
from funnel.runtime.idempotency import Replay
from tests.completion.units_support import SECOND, START, UNAVAILABLE, WS, FakeLifecycle, World, key


class FakeGates:
    def __init__(self) -> None:
        self.answers: dict[str, ExternalAnswer] = {}
        self.asked: list = []
        self.while_asked = None

    async def ask_all(self, gates, snapshot, evidence):
        self.asked.append((gates, snapshot, evidence))
        if self.while_asked is not None:
            await self.while_asked()
        return dict(self.answers)


class Shells:
    def __init__(self, policy: WorkspacePolicy = WorkspacePolicy(), stall_after: float | None = None) -> None:
        self.world = World()
        self.lifecycle = FakeLifecycle()
        self.gates = FakeGates()
        self.published: list = []
        self.authority = self.replica(policy, stall_after)

    def replica(self, policy: WorkspacePolicy = WorkspacePolicy(), stall_after: float | None = None):
        """An authority over the same store and lifecycle service, as another replica has."""
        return CompletionAuthority(
            self.world.store,
            self.lifecycle,
            PolicyBook(defaults=policy),
            self.world.clock,
            self.gates,
            ids=self.world.ids,
            publish=self.published.extend,
            settle_interval=0.01,
            stall_after=stall_after,
        )

    @property
    def store(self):
        return self.world.store

    async def claim(
        self,
        task_id: str = "t-1",
        agent: str = "agent-1",
        ttl: int = 60 * SECOND,
        request=None,
        authority: CompletionAuthority | None = None,
    ) -> Claimed | Replay:
        return await (authority or self.authority).runs.claim(
            WS, task_id, agent, ttl, request, lambda claimed: claimed.run.run_id.encode(), lambda raw: raw.decode()
        )

    async def attempt(self, claimed: Claimed, **changes) -> AttemptOutcome | Replay:
        return await self.authority.completions.attempt(self.world.attempt_command(claimed, **changes))

    async def completion(self, task_id: str = "t-1"):
        return await self.store.read(lambda tx: tx.completions.load(WS, task_id, 1))

    async def run(self, run_id: str):
        return await self.store.read(lambda tx: tx.runs.load(WS, run_id))

    async def close(self, claimed: Claimed, outcome=RunOutcome.SUCCEEDED, final_status=None, request=None):
        return await self.authority.closer.complete_run(
            WS,
            claimed.run.run_id,
            outcome,
            (10, 5, None),
            "notes",
            "",
            final_status,
            Caller("agent-1", "agent"),
            None,
            request,
            lambda closed: f"{closed.run.run_id}:{closed.effect.name}".encode(),
        )


@pytest.fixture
def shells() -> Shells:
    shells = Shells()
    shells.lifecycle.register("t-1")
    shells.lifecycle.register("t-2")
    return shells


def kinds(events) -> list[CompletionEventKind]:
    return [e.kind for e in events]


async def raises(awaitable, reason: Reason) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        await awaitable
    assert caught.value.rejection.reason is reason, caught.value.rejection
    return caught.value


# -- the completion transaction and its settlement --------------------------------------


async def test_an_allowed_attempt_commits_settles_and_publishes_in_commit_order(shells):
    claimed = await shells.claim()
    outcome = await shells.attempt(claimed)
    assert outcome.inserted and outcome.completion.settlement is SettlementStatus.SETTLED
    assert outcome.completion == await shells.completion()
    assert shells.lifecycle.called("settle_completion") == [("t-1", outcome.completion.completion_id)]
    assert kinds(shells.published) == [
        CompletionEventKind.RUN_CLAIMED,
        CompletionEventKind.COMPLETION_COMMITTED,
        CompletionEventKind.COMPLETION_SETTLED,
    ]
    assert shells.published == await shells.store.read(lambda tx: tx.events.page(WS, 0, None, 10))
    assert counted(shells.authority, "funnel_completion_settlements_total", {"status": "SETTLED"}) == 1


async def test_an_attempt_reads_the_lifecycle_view_itself_when_none_is_given(shells):
    shells.lifecycle.tasks["t-1"].cancellation = lifecycle_enums.CANCELLATION_STATE_REQUESTED
    claimed = await shells.world.claimed()  # the claim's unit alone: the shell would refuse a fenced task
    outcome = await shells.attempt(claimed)
    assert outcome.decision.verdict is Verdict.HARD_BLOCK
    assert [t.gate_id for t in outcome.decision.trace if t.decisive] == ["lifecycle.no_cancellation"]
    assert kinds(shells.published) == [CompletionEventKind.DECISION_BLOCKED]


async def test_a_refused_settlement_is_recorded_and_counted(shells):
    claimed = await shells.claim()
    shells.lifecycle.fail["settle_completion"] = LifecycleRejected("CANCELLATION_FENCED", "fenced")
    outcome = await shells.attempt(claimed)
    assert outcome.completion.settlement is SettlementStatus.REJECTED
    assert outcome.completion.error_reason == "CANCELLATION_FENCED"
    assert kinds(shells.published)[-1] is CompletionEventKind.TERMINALIZATION_ERROR
    assert counted(shells.authority, "funnel_completion_settlements_total", {"status": "REJECTED"}) == 1


async def test_an_unanswered_settlement_stays_pending_and_the_outbox_settles_it_when_due(shells):
    claimed = await shells.claim()
    shells.lifecycle.fail["settle_completion"] = UNAVAILABLE
    outcome = await shells.attempt(claimed)
    pending = outcome.completion
    assert (pending.settlement, pending.settle_attempts) == (SettlementStatus.PENDING, 1)
    assert counted(shells.authority, "funnel_completion_settlement_retries_total", None) == 1
    assert kinds(shells.published) == [CompletionEventKind.RUN_CLAIMED, CompletionEventKind.COMPLETION_COMMITTED]
    # Not due before its backoff; then settled once, by the outbox.
    settler = shells.authority.settler
    assert await settler.settle_due() == 0
    shells.world.clock.advance(SECOND)
    assert await settler.settle_due() == 1
    assert (await shells.completion()).settlement is SettlementStatus.SETTLED
    assert await settler.settle_due() == 0
    assert len(shells.lifecycle.called("settle_completion")) == 2
    assert kinds(shells.published)[-1] is CompletionEventKind.COMPLETION_SETTLED


async def test_a_failed_outcome_is_settled_as_a_failure(shells):
    claimed = await shells.claim()
    outcome = await shells.attempt(claimed, outcome=RequestedOutcome.FAILED, result="gave up")
    assert outcome.completion.settlement is SettlementStatus.SETTLED
    assert shells.lifecycle.called("settle_failure") == [("t-1", outcome.completion.completion_id)]


async def test_a_corrupted_completion_fails_closed_with_an_alarm(shells, caplog):
    claimed = await shells.claim()
    shells.lifecycle.fail["settle_completion"] = UNAVAILABLE
    first = (await shells.attempt(claimed)).completion
    await shells.store.write(
        lambda tx: (
            tx.completions.delete(WS, "t-1", 1),
            tx.completions.insert(dataclasses.replace(first, payload=b"{}")),
        )
    )
    before = shells.store.snapshot()
    with caplog.at_level(logging.ERROR, logger="completion_service"):
        error = await raises(shells.attempt(claimed), Reason.COMPLETION_CORRUPTED)
    assert error.rejection.metadata["completion_id"] == first.completion_id
    assert counted(shells.authority, "funnel_completion_corruptions_total", None) == 1
    assert any("ALARM" in r.getMessage() for r in caplog.records)
    assert shells.store.snapshot() == before


async def test_external_gates_are_asked_on_a_snapshot_that_must_hold_until_the_commit():
    gate = ExternalGate("review", "127.0.0.1:1")
    shells = Shells(WorkspacePolicy(external_gates=(gate,)))
    shells.lifecycle.register("t-1")
    claimed = await shells.claim()
    await shells.authority.completions.record_evidence(
        EvidenceRecord("", WS, "t-1", 1, "tests", True, "", "ok", None, 0), None, None, lambda e: b""
    )
    shells.gates.answers = {"review": ExternalAnswer(True, "looks good")}
    allowed = await shells.attempt(claimed)
    assert allowed.decision.verdict is Verdict.ALLOW
    [(gates, snapshot, evidence)] = shells.gates.asked
    assert gates == (gate,) and snapshot.run.run_id == claimed.run.run_id
    assert [e.kind for e in evidence] == ["tests"]

    # While the gates deliberate, the transcript moves: the commit refuses.
    shells.lifecycle.register("t-2")
    other = await shells.claim("t-2")

    async def transcript_moves():
        await shells.world.set_transcript("t-2", 1, "cp-1")

    shells.gates.while_asked = transcript_moves
    await raises(shells.attempt(other), Reason.SNAPSHOT_CHANGED)
    assert await shells.completion("t-2") is None


async def test_gates_are_not_asked_when_a_built_in_gate_blocks():
    shells = Shells(WorkspacePolicy(external_gates=(ExternalGate("review", "127.0.0.1:1"),)))
    shells.lifecycle.register("t-1")
    claimed = await shells.claim()
    blocked = await shells.attempt(claimed, result="")
    assert blocked.decision.next_action is AgentAction.PROVIDE_RESULT
    assert shells.gates.asked == []


# -- claims -----------------------------------------------------------------------------------


async def test_a_claim_activates_a_registered_generation_and_marks_it_in_progress(shells):
    shells.lifecycle.register("t-3", state=lifecycle_enums.GENERATION_STATE_REGISTERED)
    claimed = await shells.claim("t-3")
    assert shells.lifecycle.called("activate") == [("t-3", 1, claimed.run.run_id)]
    assert shells.lifecycle.called("set_work_status") == []
    # An active task is only marked in progress, once per run.
    other = await shells.claim("t-1")
    assert shells.lifecycle.called("set_work_status") == [
        ("t-1", lifecycle_enums.WORK_STATUS_IN_PROGRESS, f"{other.run.run_id}:in-progress")
    ]


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (
            {"state": lifecycle_enums.GENERATION_STATE_TERMINAL, "outcome": lifecycle_enums.TERMINAL_OUTCOME_COMPLETED},
            Reason.GENERATION_TERMINAL,
        ),
        ({"cancellation": lifecycle_enums.CANCELLATION_STATE_REQUESTED}, Reason.CANCELLATION_REQUESTED),
    ],
)
async def test_a_claim_of_an_ended_or_fenced_generation_is_refused_before_anything_is_written(shells, fields, reason):
    shells.lifecycle.register("t-3", **fields)
    before = shells.store.snapshot()
    await raises(shells.claim("t-3"), reason)
    assert shells.store.snapshot() == before


@pytest.mark.parametrize("step", ["activate", "set_work_status"])
@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (LifecycleRejected("CANCELLATION_FENCED", "fenced"), Reason.CANCELLATION_REQUESTED),
        (LifecycleRejected("GENERATION_TERMINAL", "ended"), Reason.LIFECYCLE_REJECTED),
        (UNAVAILABLE, Reason.LIFECYCLE_UNAVAILABLE),
    ],
)
async def test_a_claim_the_lifecycle_refuses_or_does_not_answer_writes_nothing(shells, step, failure, reason):
    request = key("ClaimTask", "claim-1")
    if step == "activate":
        shells.lifecycle.register("t-1", state=lifecycle_enums.GENERATION_STATE_REGISTERED)
    shells.lifecycle.fail[step] = failure
    before = shells.store.snapshot()
    await raises(shells.claim(request=request), reason)
    assert shells.store.snapshot() == before
    # The retry is a new claim, and this time it holds.
    retried = await shells.claim(request=request)
    assert isinstance(retried, Claimed) and retried.lease.epoch == 1


@pytest.mark.parametrize(
    ("rival", "reason"),
    [
        (("t-1", key("ClaimTask", "claim-2")), Reason.LEASE_HELD),  # the same task
        (("t-2", key("ClaimTask", "claim-1", digest=b"other")), Reason.REQUEST_ID_REUSED),  # the same request id
    ],
)
async def test_rival_claims_take_turns_so_the_refused_one_asks_the_lifecycle_nothing(shells, rival, reason):
    # The first claim is held up inside its lifecycle call; without turns the rival
    # would pass its checks meanwhile, ask the lifecycle too, and be refused at its
    # commit with the lifecycle's part applied.
    entered, release = asyncio.Event(), asyncio.Event()
    real_set_work_status = shells.lifecycle.set_work_status

    async def set_work_status(*args, **kwargs):
        entered.set()
        await release.wait()
        return await real_set_work_status(*args, **kwargs)

    shells.lifecycle.set_work_status = set_work_status
    first = asyncio.create_task(shells.claim("t-1", request=key("ClaimTask", "claim-1")))
    await entered.wait()
    second = asyncio.create_task(shells.claim(rival[0], request=rival[1]))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not second.done()
    release.set()
    assert isinstance(await first, Claimed)
    await raises(second, reason)
    assert [args[0] for args in shells.lifecycle.called("set_work_status")] == ["t-1"]
    assert len(shells.authority.runs._claiming) == 0


async def test_a_claim_whose_request_id_committed_meanwhile_is_a_replay_not_a_held_lease(shells):
    # Two replicas serving one retried request: the other one commits the claim
    # after this one's first look at the request id.
    request = key("ClaimTask", "claim-1")
    real_get_task, first = shells.lifecycle.get_task, []

    async def get_task(workspace_id: str, task_id: str):
        if not first:
            shells.lifecycle.get_task = real_get_task
            first.append(await shells.claim(request=request, authority=shells.replica()))
        return await real_get_task(workspace_id, task_id)

    shells.lifecycle.get_task = get_task
    assert await shells.claim(request=request) == Replay(first[0].run.run_id.encode())


async def test_a_replayed_claim_completes_a_missing_confirmation_but_never_undoes_the_claim(shells):
    request = key("ClaimTask", "claim-1")
    shells.lifecycle.register("t-3", state=lifecycle_enums.GENERATION_STATE_REGISTERED)
    # What a claim committed before its process died: the run, without the activation.
    committed = await shells.authority.runs.commit_claim(shells.world.claim_command("t-3", request=request))
    replay = await shells.claim("t-3", request=request)
    assert replay == Replay(committed.run.run_id.encode())
    assert shells.lifecycle.called("activate") == [("t-3", 1, committed.run.run_id)]
    # A refusal of the confirmation leaves the replayed claim as it is.
    shells.lifecycle.tasks["t-3"].work_status = lifecycle_enums.WORK_STATUS_BLOCKED
    shells.lifecycle.fail["set_work_status"] = LifecycleRejected("CANCELLATION_FENCED", "fenced")
    assert await shells.claim("t-3", request=request) == replay
    assert (await shells.run(committed.run.run_id)).open


async def test_renewals_go_through_the_unit_and_refusals_raise(shells):
    claimed = await shells.claim(ttl=10 * SECOND)
    renewed = await shells.authority.runs.renew(RenewCommand(WS, claimed.run.run_id, 1, 20 * SECOND))
    assert renewed.expires_at == START + 20 * SECOND
    await raises(shells.authority.runs.renew(RenewCommand(WS, claimed.run.run_id, 2, SECOND)), Reason.LEASE_NOT_CURRENT)


async def test_claims_closes_evidence_and_sweeps_publish_their_events_as_stored():
    """What a watcher follows a task's runs and evidence by: each committed change
    is published once it committed, exactly as stored; a replay, a refusal and a
    renewal publish nothing."""
    shells = Shells(stall_after=1.0)
    shells.lifecycle.register("t-1")
    shells.lifecycle.register("t-2")
    request = key("ClaimTask", "claim-1")
    claimed = await shells.claim(ttl=SECOND, request=request)
    await shells.claim(ttl=SECOND, request=request)  # a replay
    await raises(shells.claim(), Reason.LEASE_HELD)
    await shells.authority.runs.renew(RenewCommand(WS, claimed.run.run_id, 1, SECOND))
    evidence = EvidenceRecord("", WS, "t-1", 1, "tests", True, "", "ok", claimed.run.run_id, 0)
    stored = await shells.authority.completions.record_evidence(evidence, None, None, lambda e: b"")
    await shells.close(claimed, RunOutcome.FAILED)
    stalled = await shells.claim("t-2", ttl=SECOND)
    shells.world.clock.advance(3 * SECOND)
    assert await shells.authority.sweeper.sweep() == 1
    assert [(e.kind, e.run_id, e.run_outcome, e.evidence_id) for e in shells.published] == [
        (CompletionEventKind.RUN_CLAIMED, claimed.run.run_id, None, None),
        (CompletionEventKind.EVIDENCE_RECORDED, claimed.run.run_id, None, stored.evidence_id),
        (CompletionEventKind.RUN_CLOSED, claimed.run.run_id, RunOutcome.FAILED, None),
        (CompletionEventKind.RUN_CLAIMED, stalled.run.run_id, None, None),
        (CompletionEventKind.RUN_CLOSED, stalled.run.run_id, RunOutcome.STALLED, None),
    ]
    assert shells.published == await shells.store.read(lambda tx: tx.events.page(WS, 0, None, 100))


# -- closing runs ---------------------------------------------------------------------------------


async def test_a_close_overtaken_by_the_outboxs_fenced_refusal_is_decided_again_and_ends_the_task(shells):
    # The race of issue 21, ordered: the close decides on a pending completion (its
    # own settle gets no answer), then the outbox records the fence's refusal while
    # the run still holds the task, then the close's transaction comes.
    claimed = await shells.claim()
    shells.lifecycle.fail["settle_completion"] = UNAVAILABLE
    pending = (await shells.attempt(claimed)).completion
    assert pending.settlement is SettlementStatus.PENDING
    shells.lifecycle.fail["settle_completion"] = UNAVAILABLE
    real_get_task, reads = shells.lifecycle.get_task, []

    async def get_task(workspace_id: str, task_id: str):
        reads.append(task_id)
        if len(reads) == 2:  # the close has decided on the pending completion, and not committed
            shells.lifecycle.tasks[task_id].cancellation = lifecycle_enums.CANCELLATION_STATE_REQUESTED
            shells.lifecycle.fail["settle_completion"] = LifecycleRejected("CANCELLATION_FENCED", "fenced")
            stored = await shells.authority.settler.settle(pending)
            assert (stored.settlement, stored.error_reason) == (SettlementStatus.REJECTED, "CANCELLATION_FENCED")
        return await real_get_task(workspace_id, task_id)

    shells.lifecycle.get_task = get_task
    closed = await shells.close(claimed)
    assert closed.effect is TaskEffect.CANCELLED
    assert shells.lifecycle.called("settle_cancellation") == [("t-1",)]
    task = shells.lifecycle.tasks["t-1"]
    assert (task.state, task.outcome) == (
        lifecycle_enums.GENERATION_STATE_TERMINAL,
        lifecycle_enums.TERMINAL_OUTCOME_CANCELLED,
    )
    assert not (await shells.run(claimed.run.run_id)).open


async def test_the_outbox_settles_the_cancellation_of_a_fenced_refusal_after_the_run_closed(shells):
    claimed = await shells.claim()
    shells.lifecycle.fail["settle_completion"] = UNAVAILABLE
    pending = (await shells.attempt(claimed)).completion
    shells.lifecycle.fail["settle_completion"] = UNAVAILABLE
    assert (await shells.close(claimed)).effect is TaskEffect.SETTLING
    shells.lifecycle.tasks["t-1"].cancellation = lifecycle_enums.CANCELLATION_STATE_REQUESTED
    # Its cancellation's settlement gets no answer the first time: the refusal waits, pending.
    shells.lifecycle.fail["settle_completion"] = LifecycleRejected("CANCELLATION_FENCED", "fenced")
    shells.lifecycle.fail["settle_cancellation"] = UNAVAILABLE
    stored = await shells.authority.settler.settle(pending)
    assert stored.settlement is SettlementStatus.PENDING
    shells.lifecycle.fail["settle_completion"] = LifecycleRejected("CANCELLATION_FENCED", "fenced")
    stored = await shells.authority.settler.settle(stored)
    assert (stored.settlement, stored.error_reason) == (SettlementStatus.REJECTED, "CANCELLATION_FENCED")
    assert shells.lifecycle.called("settle_cancellation") == [("t-1",), ("t-1",)]
    assert shells.lifecycle.tasks["t-1"].outcome == lifecycle_enums.TERMINAL_OUTCOME_CANCELLED


async def test_closing_a_succeeded_run_completes_the_task_through_the_completion_transaction(shells):
    claimed = await shells.claim()
    closed = await shells.close(claimed)
    assert closed.effect is TaskEffect.DONE and closed.completion.settlement is SettlementStatus.SETTLED
    assert (closed.run.final_status, closed.run.outcome) == (FinalStatus.DONE, RunOutcome.SUCCEEDED)
    assert closed.run == await shells.run(claimed.run.run_id)
    [audit] = await shells.store.read(lambda tx: tx.events.audit_page(WS, None, None, 0, 10))
    assert dict(audit.metadata)["final_status"] == "DONE"


@pytest.mark.parametrize(
    ("outcome", "final_status", "effect", "lifecycle_calls"),
    [
        (RunOutcome.FAILED, None, TaskEffect.STATUS_SET, ["set_work_status"]),
        (RunOutcome.CANCELLED, None, TaskEffect.CANCELLED, ["request_cancellation", "settle_cancellation"]),
        (RunOutcome.STALLED, None, TaskEffect.UNCHANGED, []),
        (RunOutcome.SUCCEEDED, FinalStatus.READY, TaskEffect.STATUS_SET, ["set_work_status"]),
    ],
)
async def test_closing_a_run_applies_its_plan_to_the_task_first(shells, outcome, final_status, effect, lifecycle_calls):
    claimed = await shells.claim()
    shells.lifecycle.calls.clear()
    closed = await shells.close(claimed, outcome, final_status)
    assert closed.effect is effect and not closed.run.open
    assert [name for name, _ in shells.lifecycle.calls if name != "get_task"] == lifecycle_calls
    assert shells.lifecycle.called("settle_completion") == []


async def test_a_close_the_lifecycle_refuses_leaves_the_run_open(shells):
    claimed = await shells.claim()
    shells.lifecycle.fail["set_work_status"] = LifecycleRejected("GENERATION_TERMINAL", "ended")
    await raises(shells.close(claimed, RunOutcome.FAILED), Reason.LIFECYCLE_REJECTED)
    assert (await shells.run(claimed.run.run_id)).open
    shells.lifecycle.fail["get_task"] = UNAVAILABLE
    await raises(shells.close(claimed, RunOutcome.FAILED), Reason.LIFECYCLE_UNAVAILABLE)
    assert (await shells.run(claimed.run.run_id)).open


async def test_a_close_request_id_replays_and_a_closed_run_is_refused(shells):
    claimed = await shells.claim()
    request = key("CompleteRun", "close-1")
    closed = await shells.close(claimed, RunOutcome.STALLED, request=request)
    calls = len(shells.lifecycle.calls)
    assert await shells.close(claimed, RunOutcome.STALLED, request=request) == Replay(
        f"{closed.run.run_id}:UNCHANGED".encode()
    )
    assert len(shells.lifecycle.calls) == calls  # a replay asks the lifecycle nothing
    await raises(shells.close(claimed, RunOutcome.STALLED), Reason.RUN_ALREADY_FINISHED)


# -- background workers --------------------------------------------------------------------------


async def test_the_stall_sweeper_closes_stalled_runs_only_when_enabled():
    shells = Shells(stall_after=2.0)
    shells.lifecycle.register("t-1")
    claimed = await shells.claim(ttl=SECOND)
    sweeper = shells.authority.sweeper
    shells.world.clock.advance(2 * SECOND)
    assert await sweeper.sweep() == 0
    shells.world.clock.advance(SECOND)
    assert await sweeper.sweep() == 1
    assert (await shells.run(claimed.run.run_id)).outcome is RunOutcome.STALLED
    assert await Shells().authority.sweeper.sweep() == 0


async def test_the_authority_lists_its_workers_and_they_run_under_one_owner():
    shells = Shells(stall_after=1.0)
    shells.lifecycle.register("t-1")
    names = [name for name, _ in shells.authority.workers(3600.0)]
    assert names == ["settlement-outbox", "stall-sweeper", "request-id-sweeper"]
    assert [name for name, _ in Shells().authority.workers(3600.0)] == ["settlement-outbox", "request-id-sweeper"]

    claimed = await shells.claim()
    shells.lifecycle.fail["settle_completion"] = UNAVAILABLE
    await shells.attempt(claimed)
    shells.world.clock.advance(SECOND)
    owner = Background("test")
    for name, worker in shells.authority.workers(3600.0):
        owner.add(name, worker)
    owner.start()
    try:
        deadline = time.monotonic() + 30  # the settler's first pass, on a loaded machine too
        while (await shells.completion()).settlement is not SettlementStatus.SETTLED and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        await owner.stop()
    assert (await shells.completion()).settlement is SettlementStatus.SETTLED


async def test_transcript_loads_repair_an_interrupted_turn_first(shells):
    transcripts = shells.authority.transcripts
    await transcripts.append(AppendCommand(WS, "t-1", [SessionEvent(EventKind.TURN_START, ref="turn-1")], 1))
    page = await transcripts.load(WS, "t-1", 0, 10, repair_first=True)
    assert page.repaired and [e.kind for e in page.events] == [EventKind.TURN_START, EventKind.TURN_END]
    again = await transcripts.load(WS, "t-1", 0, 10, repair_first=True)
    assert not again.repaired and again.events == page.events
    await raises(
        transcripts.append(AppendCommand(WS, "t-1", [SessionEvent(EventKind.TURN_END, ref="x")], 1)),
        Reason.TRANSCRIPT_GRAMMAR_VIOLATION,
    )


def counted(authority, name: str, labels: dict[str, str] | None) -> float:
    """A counter of the authority's metrics (0 before it first counts)."""
    return authority.metrics.registry.get_sample_value(name, labels) or 0.0
