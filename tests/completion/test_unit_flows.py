"""The completion units of work end to end through one store, on the in-memory
fake: claims, renewals and leases, closing runs with their audit rows, the
completion transaction's duplicate policy, blocked decisions for lost, expired
or superseded leases and stale state versions, settlement exactly once,
request-id replay, evidence and the circuit breaker, transcripts, repair and
staged imports. Every refused request leaves the store exactly as it was.

That the SQL adapters keep the port the same is the conformance suite's
(test_storage.py), so these decisions run on the fake alone."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from completion_service.api.convert import completion_to_proto, decision_to_proto, lease_to_proto, run_to_proto
from completion_service.core.gates import WorkspacePolicy
from completion_service.core.identity import IdentityInput, completion_identity
from completion_service.core.model import (
    AgentAction,
    AuditEntry,
    CompletionEventKind,
    EvidenceRecord,
    LifecycleState,
    LifecycleView,
    RequestedOutcome,
    RunOutcome,
    SettlementStatus,
    Verdict,
)
from completion_service.core.transcript import EventKind, SessionEvent, Tail, TurnEndReason
from completion_service.errors import Reason
from completion_service.storage.memory import MemoryCompletionStore
from completion_service.storage.port import CompletionStore, CompletionTx, TranscriptState
from completion_service.units import completions, runs, settlements, transcripts
from completion_service.units.completions import AttemptOutcome, CompletionCorrupted, EvidenceCommand
from completion_service.units.request_ids import peek
from completion_service.units.runs import ClaimCommand, Claimed, CloseCommand, RenewCommand
from completion_service.units.settlements import Recorded, Settlement
from completion_service.units.transcripts import AppendCommand, Appended
from funnel.auth.principal import Caller
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.runtime.clock import ManualClock, SequentialIds
from funnel.runtime.errors import Rejection, instant
from funnel.runtime.idempotency import Replay, RequestKey, fingerprint
from tests.completion.units_support import attempt_parts

START = 1_700_000_000_000_000
SECOND = 1_000_000
WS = "ws-1"
TASKS = ("t-1", "t-2")
ACTIVE = LifecycleView(generation=1, state=LifecycleState.ACTIVE, outcome=None, cancellation_requested=False)
CALLER = "host-1"


def key(method: str, request_id: str, digest: bytes, workspace: str = WS, caller: str = CALLER) -> RequestKey:
    return RequestKey(workspace, caller, method, request_id, digest)


def render_claim(claimed: Claimed) -> bytes:
    return completion_messages.ClaimTaskResponse(
        run=run_to_proto(claimed.run), lease=lease_to_proto(claimed.lease)
    ).SerializeToString()


def render_attempt(outcome: AttemptOutcome) -> bytes:
    return completion_messages.AttemptCompletionResponse(
        decision=decision_to_proto(outcome.decision),
        completion=completion_to_proto(outcome.completion) if outcome.completion else None,
        existing_completion=outcome.existing,
    ).SerializeToString()


def render_run(run) -> bytes:
    return completion_messages.CompleteRunResponse(
        run_id=run.run_id, tokens_total=run.tokens_total or 0
    ).SerializeToString()


def render_lease(lease) -> bytes:
    return completion_messages.RenewLeaseResponse(lease=lease_to_proto(lease)).SerializeToString()


class Env:
    """A store with a clock and ids: runs the units of work as the shells do."""

    def __init__(self, store: CompletionStore, clock: ManualClock) -> None:
        self.store = store
        self.clock = clock
        self.ids = SequentialIds()
        # The scope of every request id a test used: the state below includes what each recalls.
        self.scopes: set[tuple[str, str, str, str]] = set()

    def used(self, request: RequestKey | None) -> RequestKey | None:
        if request is not None:
            self.scopes.add((request.workspace_id, request.caller, request.method, request.request_id))
        return request

    async def write(self, unit, *args, **kwargs):
        return await self.store.write(functools.partial(unit, *args, **kwargs, now=self.clock.now_micros()))

    async def read(self, fn):
        return await self.store.read(fn)

    # -- everything the tests touch, read through the port -------------------------

    async def state(self) -> dict:
        scopes = sorted(self.scopes)

        def read(tx) -> dict:
            found: dict = {
                "runs": tx.runs.page(WS, None, None, 10_000),
                "completions": tx.completions.page(WS, None, None, None, 10_000),
                "events": tx.events.page(WS, 0, None, 10_000),
                "audit": tx.events.audit_page(WS, None, None, 0, 10_000),
                "requests": [tx.requests.recall(*scope) for scope in scopes],
            }
            for task_id in TASKS:
                found[task_id] = (
                    tx.runs.load_lease(WS, task_id),
                    tx.transcripts.load_tail(WS, task_id),
                    tx.transcripts.page(WS, task_id, 0, 10_000),
                    [(tx.evidence.load(WS, task_id, g), tx.completions.load_attempts(WS, task_id, g)) for g in (1, 2)],
                )
            return found

        return await self.store.read(read)

    async def attempts(self, task_id: str = "t-1") -> int:
        return len(await self.read(lambda tx: tx.completions.load_attempts(WS, task_id, 1)))

    async def set_state_version(self, task_id: str, state_version: int, checkpoint: str = "") -> None:
        """Moves the transcript's version and checkpoint as a host's appends would."""
        await self.store.write(
            lambda tx: tx.transcripts.save_tail(
                WS, task_id, TranscriptState(Tail(checkpoint=checkpoint), state_version)
            )
        )

    # -- commands --------------------------------------------------------------------

    async def claim(self, task_id: str = "t-1", *, ttl: int = 60 * SECOND, request_id=None, agent="agent-1"):
        request = None
        if request_id:
            request = self.used(
                key("ClaimTask", request_id, fingerprint("ClaimTask", f"{task_id}/{agent}/{ttl}".encode()))
            )
        command = ClaimCommand(WS, task_id, agent, 1, ttl, self.ids.new_id("run"), request, render_claim)
        return await self.write(runs.claim, command=command)

    async def claimed(self, task_id: str = "t-1", **kw) -> Claimed:
        result = await self.claim(task_id, **kw)
        assert isinstance(result, Claimed), result
        return result

    async def renew(self, run_id: str, epoch: int, ttl: int, request: RequestKey | None = None):
        return await self.write(runs.renew, command=RenewCommand(WS, run_id, epoch, ttl, None, request, render_lease))

    async def attempt(self, claimed: Claimed, **changes):
        self.used(changes.get("request"))
        command, context = attempt_parts(claimed, self.ids.new_id("cmp"), **changes)
        return await self.write(completions.attempt, command=command, context=context)

    def close_command(self, run_id: str, **changes) -> CloseCommand:
        self.used(changes.get("request"))
        command = CloseCommand(
            workspace_id=WS,
            run_id=run_id,
            outcome=RunOutcome.SUCCEEDED,
            tokens_input=10,
            tokens_output=5,
            tokens_total=15,
            notes="done",
            notes_truncated=False,
            error="",
            final_status=None,
            closed_by="agent",
            caller=Caller("agent-1", "agent"),
        )
        return dataclasses.replace(command, **changes)

    async def close(self, run_id: str, **changes):
        return await self.write(runs.close_run, command=self.close_command(run_id, **changes))

    async def settle(self, completion, settlement: Settlement):
        return await self.write(settlements.record_settlement, completion=completion, settlement=settlement)

    async def due(self, now: int, limit: int = 10):
        return await self.store.write(
            lambda tx: settlements.claim_due(tx, now=now, owner="settler-1", lease_micros=10 * SECOND, limit=limit)
        )

    async def evidence(self, record: EvidenceRecord, request: RequestKey | None = None):
        command = EvidenceCommand(
            dataclasses.replace(record, evidence_id=self.ids.new_id("evd")), None, request, lambda stored: b""
        )
        return await self.write(completions.record_evidence, command=command)

    async def events(self, task_id: str | None = None):
        return await self.read(lambda tx: tx.events.page(WS, 0, task_id, 1000))

    async def run(self, run_id: str):
        return await self.read(lambda tx: tx.runs.load(WS, run_id))

    async def lease(self, task_id: str):
        return await self.read(lambda tx: tx.runs.load_lease(WS, task_id))

    async def completion(self, task_id: str = "t-1", generation: int = 1):
        return await self.read(lambda tx: tx.completions.load(WS, task_id, generation))


async def peeked(env: Env, request: RequestKey):
    """What a request id stands for, read without the write lock (as the shells check it)."""
    return await env.read(functools.partial(peek, key=request))


@pytest.fixture
async def env(clock) -> Env:
    return Env(MemoryCompletionStore(), clock)


def assert_rejected(result, reason: Reason, **metadata) -> Rejection:
    assert isinstance(result, Rejection), result
    assert result.reason is reason, result
    for name, value in metadata.items():
        assert result.metadata[name] == str(value), result.metadata
    return result


# -- runs and leases ---------------------------------------------------------------------


async def test_claim_opens_a_run_and_a_lease_whose_epoch_grows_on_every_claim(env):
    first = await env.claimed(ttl=10 * SECOND)
    assert (first.lease.epoch, first.lease.run_id, first.lease.expires_at) == (1, first.run.run_id, START + 10 * SECOND)
    assert first.run.open and first.run.epoch == 1 and first.run.claimed_at == START
    assert await env.lease("t-1") == first.lease
    assert await env.run(first.run.run_id) == first.run

    env.clock.advance(11 * SECOND)  # the first lease expired; its run is still open
    second = await env.claimed(ttl=10 * SECOND, agent="agent-2")
    assert second.lease.epoch == 2 and second.run.run_id != first.run.run_id

    await env.close(second.run.run_id)  # a closed holder does not hold the lease, even before expiry
    third = await env.claimed(ttl=10 * SECOND)
    assert third.lease.epoch == 3
    assert await env.lease("t-1") == third.lease
    # Epochs are per task.
    assert (await env.claimed("t-2")).lease.epoch == 1


async def test_claim_while_another_open_run_holds_a_live_lease_is_lease_held_and_changes_nothing(env):
    holder = await env.claimed(ttl=10 * SECOND)
    env.clock.advance(9 * SECOND)
    before = await env.state()
    result = await env.claim(agent="agent-2")
    assert_rejected(
        result, Reason.LEASE_HELD, holder_run_id=holder.run.run_id, lease_expire_time=instant(holder.lease.expires_at)
    )
    assert await env.state() == before


async def test_renew_extends_a_live_lease_of_the_current_epoch(env):
    claimed = await env.claimed(ttl=10 * SECOND)
    env.clock.advance(5 * SECOND)
    renewed = await env.renew(claimed.run.run_id, 1, 30 * SECOND)
    assert renewed.expires_at == START + 35 * SECOND and renewed.epoch == 1
    assert (await env.run(claimed.run.run_id)).lease_expires_at == START + 35 * SECOND
    assert (await env.lease("t-1")).expires_at == START + 35 * SECOND


async def test_renew_refusals_change_nothing(env):
    old = await env.claimed(ttl=10 * SECOND)
    env.clock.advance(11 * SECOND)
    before = await env.state()
    assert_rejected(
        await env.renew(old.run.run_id, 1, 30 * SECOND),
        Reason.LEASE_EXPIRED,
        lease_expire_time=instant(START + 10 * SECOND),
    )
    assert_rejected(await env.renew("run-unknown", 1, 30 * SECOND), Reason.RUN_NOT_FOUND)
    assert await env.state() == before

    new = await env.claimed(ttl=10 * SECOND)  # supersedes the old run's lease
    before = await env.state()
    assert_rejected(await env.renew(old.run.run_id, 1, 30 * SECOND), Reason.LEASE_NOT_CURRENT, epoch=1, current_epoch=2)
    assert_rejected(await env.renew(new.run.run_id, 1, 30 * SECOND), Reason.LEASE_NOT_CURRENT)
    assert await env.state() == before

    await env.close(new.run.run_id)
    before = await env.state()
    assert_rejected(await env.renew(new.run.run_id, 2, 30 * SECOND), Reason.RUN_ALREADY_FINISHED, run_id=new.run.run_id)
    assert await env.state() == before


async def test_stalled_runs_are_claimed_oldest_expiry_first_and_closed_with_an_audit_row(env):
    late = await env.claimed("t-1", ttl=5 * SECOND)
    early = await env.claimed("t-2", ttl=2 * SECOND)
    env.clock.advance(4 * SECOND)
    # Only t-2's lease expired more than one second ago.
    closed = await env.write(runs.close_stalled_runs, stall_after_micros=SECOND, limit=10)
    assert [c.run.run_id for c in closed] == [early.run.run_id]
    assert [(e.kind, e.run_outcome) for e in await env.events("t-2")] == [
        (CompletionEventKind.RUN_CLAIMED, None),
        (CompletionEventKind.RUN_CLOSED, RunOutcome.STALLED),
    ]
    assert (await env.events("t-2"))[-1] == closed[0].event
    stored = await env.run(early.run.run_id)
    assert (stored.outcome, stored.finished_at, stored.tokens_total) == (RunOutcome.STALLED, START + 4 * SECOND, 0)
    assert (await env.run(late.run.run_id)).open
    [audit] = await env.read(lambda tx: tx.events.audit_page(WS, None, None, 0, 10))
    assert (audit.run_id, dict(audit.metadata), audit.caller) == (
        early.run.run_id,
        {"outcome": "STALLED", "final_status": "UNCHANGED", "closed_by": "stall_sweeper"},
        runs.SELF,
    )
    assert await env.write(runs.close_stalled_runs, stall_after_micros=SECOND, limit=10) == []


# -- closing runs ------------------------------------------------------------------------


async def test_close_run_closes_the_run_and_writes_its_audit_row(env):
    claimed = await env.claimed()
    env.clock.advance(3 * SECOND)
    closed = (
        await env.close(
            claimed.run.run_id,
            tokens_input=100,
            tokens_output=50,
            tokens_total=1000,
            notes="n",
            error="e",
            outcome=RunOutcome.FAILED,
        )
    ).run
    assert closed.finished_at == START + 3 * SECOND and not closed.open
    stored = await env.run(claimed.run.run_id)
    assert stored == closed
    assert (
        stored.outcome,
        stored.tokens_input,
        stored.tokens_output,
        stored.tokens_total,
        stored.notes,
        stored.error,
    ) == (RunOutcome.FAILED, 100, 50, 1000, "n", "e")
    audit = await env.read(lambda tx: tx.events.audit_page(WS, None, None, 0, 10))
    assert [(a.action, a.run_id, a.task_id, dict(a.metadata), a.recorded_at, a.caller) for a in audit] == [
        (
            "task.completed",
            claimed.run.run_id,
            "t-1",
            {"outcome": "FAILED", "final_status": "UNCHANGED", "closed_by": "agent"},
            START + 3 * SECOND,
            Caller("agent-1", "agent"),
        )
    ]

    before = await env.state()
    assert_rejected(await env.close(claimed.run.run_id), Reason.RUN_ALREADY_FINISHED, run_id=claimed.run.run_id)
    assert_rejected(await env.close("run-unknown"), Reason.RUN_NOT_FOUND)
    assert await env.state() == before


async def test_close_run_and_its_audit_row_commit_together_or_not_at_all(env):
    claimed = await env.claimed()

    class FullAuditLog:
        def __init__(self, events) -> None:
            self._events = events

        def __getattr__(self, name: str):
            return getattr(self._events, name)

        def append_audit(self, entry: AuditEntry) -> None:
            raise OSError("audit log is full")

    class AuditFails:
        def __init__(self, tx: CompletionTx) -> None:
            self._tx = tx
            self.events = FullAuditLog(tx.events)

        def __getattr__(self, name: str):
            return getattr(self._tx, name)

    with pytest.raises(OSError, match="audit log is full"):
        await env.store.write(lambda tx: runs.close_run(AuditFails(tx), env.close_command(claimed.run.run_id), START))
    assert (await env.run(claimed.run.run_id)).open
    assert await env.read(lambda tx: tx.events.audit_page(WS, None, None, 0, 10)) == []

    assert not (await env.close(claimed.run.run_id)).run.open
    assert len(await env.read(lambda tx: tx.events.audit_page(WS, None, None, 0, 10))) == 1


# -- the completion transaction ----------------------------------------------------------


async def test_an_allowed_attempt_commits_one_pending_completion_and_a_committed_event(env):
    claimed = await env.claimed()
    outcome = await env.attempt(claimed)
    assert outcome.decision.verdict is Verdict.ALLOW and outcome.inserted and not outcome.existing
    completion = outcome.completion
    assert completion.settlement is SettlementStatus.PENDING and completion.committed_at == START
    assert completion.identity == completion_identity(
        IdentityInput(WS, "t-1", 1, 0, "", "COMPLETED", outcome.decision.decision_schema)
    )
    assert await env.completion() == completion
    events = await env.events()
    assert [(e.kind, e.completion_id) for e in events] == [
        (CompletionEventKind.RUN_CLAIMED, None),
        (CompletionEventKind.COMPLETION_COMMITTED, completion.completion_id),
    ]
    assert list(claimed.events) + list(outcome.events) == events
    assert await env.due(START) == [completion]


async def test_same_identity_returns_the_existing_completion(env):
    claimed = await env.claimed()
    first = (await env.attempt(claimed)).completion
    again = await env.attempt(claimed, result="said differently")  # the result is not part of the identity
    assert again.decision.verdict is Verdict.ALLOW
    assert again.existing and not again.inserted and again.events == ()
    assert again.completion == first
    assert len(await env.read(lambda tx: tx.completions.page(WS, None, None, None, 10))) == 1
    assert [e.kind for e in await env.events()] == [
        CompletionEventKind.RUN_CLAIMED,
        CompletionEventKind.COMPLETION_COMMITTED,
    ]


async def test_different_identity_with_the_same_outcome_keeps_the_existing_completion(env):
    claimed = await env.claimed()
    first = (await env.attempt(claimed)).completion
    await env.set_state_version("t-1", 4, "cp-2")
    later = await env.attempt(claimed)
    assert later.decision.verdict is Verdict.ALLOW and later.decision.state_version == 4
    assert later.existing and not later.inserted
    assert later.completion == first  # the stored row stays the completion
    assert (await env.completion()).state_version == 0
    assert len(await env.read(lambda tx: tx.completions.page(WS, None, None, None, 10))) == 1


async def test_different_outcome_is_a_conflict_and_writes_nothing(env):
    claimed = await env.claimed()
    first = (await env.attempt(claimed)).completion
    before = await env.state()
    result = await env.attempt(claimed, outcome=RequestedOutcome.FAILED, result="gave up")
    assert_rejected(result, Reason.COMPLETION_CONFLICT, completion_id=first.completion_id, outcome="COMPLETED")
    assert await env.state() == before


async def test_same_identity_with_a_different_payload_is_corruption_and_writes_nothing(env):
    claimed = await env.claimed()
    first = (await env.attempt(claimed)).completion
    # Damage on purpose, through the port: the stored row keeps its identity with another payload.
    tampered = dataclasses.replace(first, payload=b'{"tampered":true}')

    def tamper(tx: CompletionTx) -> None:
        tx.completions.delete(WS, "t-1", 1)
        tx.completions.insert(tampered)

    await env.store.write(tamper)
    before = await env.state()
    with pytest.raises(CompletionCorrupted) as raised:
        await env.attempt(claimed)
    assert raised.value.completion_id == first.completion_id
    assert await env.state() == before


async def test_snapshot_changed_since_external_gates_answered_is_refused_and_writes_nothing(env):
    claimed = await env.claimed()
    basis = (("run-other", 9), 0, "")
    before = await env.state()
    result = await env.attempt(claimed, external_basis=basis, external_answers={})
    assert_rejected(result, Reason.SNAPSHOT_CHANGED)
    assert await env.state() == before


# -- blocked decisions: lease lost, expired, superseded; stale state version -------------


def assert_blocked(outcome: AttemptOutcome, verdict: Verdict, gate_id: str, action: AgentAction) -> None:
    assert isinstance(outcome, AttemptOutcome), outcome
    decision = outcome.decision
    assert decision.verdict is verdict, decision.instruction
    assert decision.next_action is action
    assert [t.gate_id for t in decision.trace if t.decisive] == [gate_id], decision.trace
    assert outcome.completion is None and not outcome.inserted


async def blocked_and_recorded(env: Env, claimed: Claimed, verdict, gate_id, action, **changes) -> None:
    attempts = await env.attempts(claimed.run.task_id)
    outcome = await env.attempt(claimed, **changes)
    assert_blocked(outcome, verdict, gate_id, action)
    assert await env.completion(claimed.run.task_id) is None
    assert await env.attempts(claimed.run.task_id) == attempts + 1
    last = (await env.events())[-1]
    assert (last.kind, last.run_id, last.decision) == (
        CompletionEventKind.DECISION_BLOCKED,
        claimed.run.run_id,
        outcome.decision,
    )
    assert list(outcome.events) == [last]


async def test_an_expired_lease_hard_blocks(env):
    claimed = await env.claimed(ttl=10 * SECOND)
    env.clock.advance(10 * SECOND)
    await blocked_and_recorded(env, claimed, Verdict.HARD_BLOCK, "lease.live", AgentAction.STOP_AND_REPORT)


async def test_a_superseded_lease_hard_blocks_and_the_new_holder_may_complete(env):
    old = await env.claimed(ttl=10 * SECOND)
    env.clock.advance(11 * SECOND)
    new = await env.claimed(ttl=10 * SECOND, agent="agent-2")
    await blocked_and_recorded(env, old, Verdict.HARD_BLOCK, "lease.live", AgentAction.STOP_AND_REPORT)
    # Claiming the newer epoch with the old run does not help either.
    await blocked_and_recorded(
        env, old, Verdict.HARD_BLOCK, "lease.live", AgentAction.STOP_AND_REPORT, claimed_epoch=new.lease.epoch
    )
    outcome = await env.attempt(new)
    assert outcome.decision.verdict is Verdict.ALLOW and outcome.completion.run_id == new.run.run_id


async def test_a_lost_lease_hard_blocks(env):
    closed = await env.claimed()
    await env.close(closed.run.run_id)
    await blocked_and_recorded(env, closed, Verdict.HARD_BLOCK, "lease.live", AgentAction.STOP_AND_REPORT)

    other = await env.claimed("t-2")
    await blocked_and_recorded(
        env, other, Verdict.HARD_BLOCK, "lease.live", AgentAction.STOP_AND_REPORT, claimed_epoch=other.lease.epoch + 1
    )


async def test_a_stale_state_version_soft_blocks_with_refresh_state(env):
    claimed = await env.claimed()
    await env.set_state_version("t-1", 5, "cp-5")
    await blocked_and_recorded(
        env, claimed, Verdict.SOFT_BLOCK, "transcript.state_version_current", AgentAction.REFRESH_STATE, state_version=4
    )
    current = await env.attempt(claimed, state_version=5)
    assert current.decision.verdict is Verdict.ALLOW
    assert (current.completion.state_version, current.completion.checkpoint) == (5, "cp-5")


# -- settlement --------------------------------------------------------------------------


async def test_settlement_is_recorded_exactly_once_with_one_terminal_event(env):
    claimed = await env.claimed()
    completion = (await env.attempt(claimed)).completion
    env.clock.advance(SECOND)
    recorded = await env.settle(completion, Settlement(lifecycle_revision=3, lifecycle_event_sequence=7))
    assert isinstance(recorded, Recorded)
    settled = recorded.completion
    assert settled.settlement is SettlementStatus.SETTLED and settled.settle_attempts == 1
    assert (settled.lifecycle_revision, settled.lifecycle_event_sequence, settled.settled_at) == (3, 7, START + SECOND)
    assert await env.completion() == settled
    assert await env.due(START + 100 * SECOND) == []

    before = await env.state()
    assert await env.settle(completion, Settlement(lifecycle_revision=4, lifecycle_event_sequence=8)) == settled
    assert await env.settle(completion, Settlement(error_reason="CANCELLATION_FENCED", error_message="x")) == settled
    assert await env.state() == before
    events = await env.events()
    assert [e.kind for e in events] == [
        CompletionEventKind.RUN_CLAIMED,
        CompletionEventKind.COMPLETION_COMMITTED,
        CompletionEventKind.COMPLETION_SETTLED,
    ]
    assert (events[2].lifecycle_revision, events[2].lifecycle_event_sequence) == (3, 7)
    assert recorded.event == events[2]


async def test_a_rejected_settlement_records_a_terminalization_error_and_never_a_settled_event(env):
    claimed = await env.claimed()
    completion = (await env.attempt(claimed)).completion
    recorded = await env.settle(completion, Settlement(error_reason="CANCELLATION_FENCED", error_message="fenced at t"))
    rejected = recorded.completion
    assert rejected.settlement is SettlementStatus.REJECTED
    assert (rejected.error_reason, rejected.error_message) == ("CANCELLATION_FENCED", "fenced at t")
    assert recorded.event.decision.next_action is AgentAction.STOP_AND_REPORT
    assert await env.settle(completion, Settlement(lifecycle_revision=3, lifecycle_event_sequence=7)) == rejected
    assert [e.kind for e in await env.events()] == [
        CompletionEventKind.RUN_CLAIMED,
        CompletionEventKind.COMPLETION_COMMITTED,
        CompletionEventKind.TERMINALIZATION_ERROR,
    ]


async def test_a_postponed_settlement_is_due_again_only_at_its_time(env):
    claimed = await env.claimed()
    completion = (await env.attempt(claimed)).completion
    postponed = await env.store.write(
        lambda tx: settlements.postpone_settlement(
            tx, completion=completion, next_attempt_at=START + 5 * SECOND, error="UNAVAILABLE: down"
        )
    )
    assert (postponed.settle_attempts, postponed.settlement) == (1, SettlementStatus.PENDING)
    assert await env.due(START + 4 * SECOND) == []
    [due] = await env.due(START + 5 * SECOND)
    assert due == postponed == await env.completion()


async def test_a_postponed_settlement_keeps_its_attempts_next_time_and_error_until_settled(env):
    completion = (await env.attempt(await env.claimed())).completion
    # Just committed: due at once, no call made yet.
    assert (completion.settle_attempts, completion.next_settle_at, completion.last_settle_error) == (0, START, None)
    assert await env.completion() == completion
    for attempt, error in enumerate(("UNAVAILABLE: connection refused", "DEADLINE_EXCEEDED: \x00late"), start=1):
        postponed = await env.store.write(
            lambda tx, e=error, a=attempt: settlements.postpone_settlement(
                tx, completion=completion, next_attempt_at=START + a * 10 * SECOND, error=e
            )
        )
        stored = await env.completion()
        assert stored == postponed
        assert (stored.settle_attempts, stored.next_settle_at, stored.last_settle_error) == (
            attempt,
            START + attempt * 10 * SECOND,
            error,
        )
    [listed] = await env.read(lambda tx: tx.completions.page(WS, None, SettlementStatus.PENDING, None, 10))
    assert listed == stored

    env.clock.advance(30 * SECOND)
    settled = (await env.settle(completion, Settlement(lifecycle_revision=3, lifecycle_event_sequence=7))).completion
    # The answered call counts too; nothing is due and no error stands any more.
    assert (settled.settle_attempts, settled.next_settle_at, settled.last_settle_error) == (3, None, None)
    assert await env.completion() == settled
    assert await env.read(lambda tx: tx.completions.page(WS, None, SettlementStatus.PENDING, None, 10)) == []


async def test_the_traceparent_of_the_committing_attempt_stays_with_the_completion_through_the_outbox(env):
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    committed = await env.attempt(await env.claimed("t-1"), traceparent=traceparent)
    untraced = await env.attempt(await env.claimed("t-2"))
    assert committed.completion.traceparent == traceparent and untraced.completion.traceparent is None
    postponed = await env.store.write(
        lambda tx: settlements.postpone_settlement(
            tx, completion=committed.completion, next_attempt_at=START + SECOND, error="x"
        )
    )
    assert [c.traceparent for c in await env.due(START + SECOND)] == [None, traceparent]
    settled = (await env.settle(postponed, Settlement(lifecycle_revision=1, lifecycle_event_sequence=1))).completion
    assert settled.traceparent == traceparent == (await env.completion("t-1")).traceparent
    listed = await env.read(lambda tx: tx.completions.page(WS, None, None, None, 10))
    assert {c.task_id: c.traceparent for c in listed} == {"t-1": traceparent, "t-2": None}


# -- request ids -------------------------------------------------------------------------


async def test_a_claim_request_id_replays_the_original_response_and_refuses_another_request(env):
    first = await env.claimed(request_id="req-1")
    before = await env.state()
    replay = await env.claim(request_id="req-1")
    assert isinstance(replay, Replay)
    assert replay.response == render_claim(first)
    digest = fingerprint("ClaimTask", f"t-1/agent-1/{60 * SECOND}".encode())
    recall = functools.partial(peeked, env)
    assert await recall(key("ClaimTask", "req-1", digest)) == replay
    assert_rejected(await env.claim(request_id="req-1", agent="agent-2"), Reason.REQUEST_ID_REUSED, request_id="req-1")
    assert_rejected(await recall(key("ClaimTask", "req-1", b"another request")), Reason.REQUEST_ID_REUSED)
    assert await env.state() == before
    # Request ids are per workspace.
    assert await recall(key("ClaimTask", "req-1", b"another request", workspace="ws-other")) is None
    # The scope is (workspace, caller, RPC): another caller or another RPC owns the same id afresh.
    assert await recall(key("ClaimTask", "req-1", digest, caller="host-2")) is None
    assert await recall(key("RenewLease", "req-1", digest)) is None


async def test_an_attempt_request_id_replays_the_original_decision(env):
    claimed = await env.claimed()
    fp = key("AttemptCompletion", "att-1", fingerprint("AttemptCompletion", b"first"))
    first = await env.attempt(claimed, request=fp, render=render_attempt)
    assert first.inserted
    before = await env.state()
    replay = await env.attempt(claimed, request=fp, render=render_attempt)
    assert isinstance(replay, Replay)
    assert replay.response == render_attempt(first)
    reused = await env.attempt(
        claimed,
        request=key("AttemptCompletion", "att-1", fingerprint("AttemptCompletion", b"other")),
        render=render_attempt,
    )
    assert_rejected(reused, Reason.REQUEST_ID_REUSED)
    assert await env.state() == before


async def test_a_close_request_id_replays_and_refuses_another_request(env):
    claimed = await env.claimed()
    fp = key("CompleteRun", "close-1", fingerprint("CompleteRun", b"close"))
    closed = (await env.close(claimed.run.run_id, request=fp, render=render_run)).run
    before = await env.state()
    replay = await env.close(claimed.run.run_id, request=fp, render=render_run)
    assert isinstance(replay, Replay)
    assert replay.response == render_run(closed)
    reused = await env.close(claimed.run.run_id, request=key("CompleteRun", "close-1", b"other"), render=render_run)
    assert_rejected(reused, Reason.REQUEST_ID_REUSED)
    assert await env.state() == before


async def test_a_renew_request_id_replays_the_original_lease(env):
    claimed = await env.claimed(ttl=10 * SECOND)
    fp = env.used(key("RenewLease", "renew-1", b"renew"))
    renewed = await env.renew(claimed.run.run_id, 1, 30 * SECOND, fp)
    env.clock.advance(SECOND)
    replay = await env.renew(claimed.run.run_id, 1, 30 * SECOND, fp)
    assert replay == Replay(render_lease(renewed))
    assert (await env.lease("t-1")).expires_at == renewed.expires_at


# -- evidence ----------------------------------------------------------------------------


async def test_evidence_counts_for_its_generation_and_is_listed_in_order(env):
    def record(kind, generation=1, passed=True):
        return EvidenceRecord("", WS, "t-1", generation, kind, passed, "cp-1", "details", None, 0)

    first = (await env.evidence(record("tests"))).record
    await env.evidence(record("lint", passed=False))
    await env.evidence(record("tests", generation=2))
    listed = await env.read(lambda tx: tx.evidence.load(WS, "t-1", 1))
    assert [(e.kind, e.passed, e.generation) for e in listed] == [("tests", True, 1), ("lint", False, 1)]
    assert listed[0] == first and first.recorded_at == START and first.evidence_id
    # One event per fact, naming it.
    events = await env.events("t-1")
    assert [(e.kind, e.generation) for e in events] == [(CompletionEventKind.EVIDENCE_RECORDED, g) for g in (1, 1, 2)]
    assert events[0].evidence_id == first.evidence_id and len({e.evidence_id for e in events}) == 3


async def test_evidence_counts_only_at_the_checkpoint_it_names(env):
    policy = WorkspacePolicy(required_evidence=("tests",))
    claimed = await env.claimed()
    await env.set_state_version("t-1", 2, "cp-2")

    def record(checkpoint, passed=True, generation=1):
        return EvidenceRecord("", WS, "t-1", generation, "tests", passed, checkpoint, "", None, 0)

    await env.evidence(record("cp-1"))  # an older checkpoint
    await env.evidence(record("cp-2", generation=2))  # another generation
    await blocked_and_recorded(
        env,
        claimed,
        Verdict.SOFT_BLOCK,
        "evidence.required",
        AgentAction.RECORD_EVIDENCE,
        policy=policy,
        result="first",
    )
    await env.evidence(record("cp-2", passed=False))
    await blocked_and_recorded(
        env,
        claimed,
        Verdict.SOFT_BLOCK,
        "evidence.required",
        AgentAction.RECORD_EVIDENCE,
        policy=policy,
        result="second",
    )
    await env.evidence(record("cp-2"))  # the latest fact wins
    assert (await env.attempt(claimed, policy=policy, result="third")).decision.verdict is Verdict.ALLOW


async def test_the_circuit_breaker_holds_until_the_checkpoint_changes(env):
    policy = WorkspacePolicy(required_evidence=("tests",), breaker_threshold=2)
    claimed = await env.claimed()
    await env.set_state_version("t-1", 1, "cp-1")
    for _ in range(2):
        await blocked_and_recorded(
            env, claimed, Verdict.SOFT_BLOCK, "evidence.required", AgentAction.RECORD_EVIDENCE, policy=policy
        )
    await blocked_and_recorded(
        env, claimed, Verdict.HARD_BLOCK, "completion.circuit_breaker", AgentAction.STOP_AND_REPORT, policy=policy
    )
    await env.set_state_version("t-1", 2, "cp-2")
    await blocked_and_recorded(
        env, claimed, Verdict.SOFT_BLOCK, "evidence.required", AgentAction.RECORD_EVIDENCE, policy=policy
    )


# -- transcripts -------------------------------------------------------------------------


def ev(kind: EventKind, ref: str = "", **fields) -> SessionEvent:
    return SessionEvent(kind, ref=ref, **fields)


async def test_appended_events_are_stamped_kept_in_order_and_checkpoints_remembered(env):
    batch = [
        ev(EventKind.TURN_START, "turn-1"),
        ev(EventKind.CHECKPOINT, "cp-1"),
        ev(EventKind.ASSISTANT_MESSAGE, text="hello é"),
        ev(EventKind.TURN_END, "turn-1", reason=TurnEndReason.COMPLETED),
    ]
    appended = await env.write(transcripts.append, command=AppendCommand(WS, "t-1", batch, 1))
    assert appended == Appended(1, 1)
    env.clock.advance(SECOND)
    again = await env.write(
        transcripts.append, command=AppendCommand(WS, "t-1", [ev(EventKind.CHECKPOINT, "cp-1")], 2, 1)
    )
    assert again == Appended(2, 5)
    stored = await env.read(lambda tx: tx.transcripts.page(WS, "t-1", 0, 100))
    assert [(e.sequence, e.generation, e.kind, e.recorded_at) for e in stored] == [
        (1, 1, EventKind.TURN_START, START),
        (2, 1, EventKind.CHECKPOINT, START),
        (3, 1, EventKind.ASSISTANT_MESSAGE, START),
        (4, 1, EventKind.TURN_END, START),
        (5, 2, EventKind.CHECKPOINT, START + SECOND),
    ]
    assert stored[2].text == "hello é" and stored[3].reason is TurnEndReason.COMPLETED
    assert await env.read(lambda tx: tx.transcripts.page(WS, "t-1", 3, 1)) == stored[3:4]
    # A checkpoint is where it was first created.
    assert await env.read(lambda tx: tx.transcripts.load_checkpoints(WS, "t-1", {"cp-1", "cp-none"})) == {"cp-1": 2}
    state = await env.read(lambda tx: tx.transcripts.load_tail(WS, "t-1"))
    assert state == TranscriptState(Tail(checkpoint="cp-1", last_sequence=5), 2)


async def test_a_refused_append_changes_nothing(env):
    await env.write(transcripts.append, command=AppendCommand(WS, "t-1", [ev(EventKind.TURN_START, "turn-1")], 1))
    before = await env.state()
    stale = await env.write(transcripts.append, command=AppendCommand(WS, "t-1", [ev(EventKind.USER_MESSAGE)], 1, 0))
    assert_rejected(stale, Reason.STATE_VERSION_MISMATCH, expected=0, actual=1)
    broken = await env.write(transcripts.append, command=AppendCommand(WS, "t-1", [ev(EventKind.TURN_START, "t2")], 1))
    assert_rejected(broken, Reason.TRANSCRIPT_GRAMMAR_VIOLATION)
    assert await env.state() == before


async def test_repair_closes_an_interrupted_turn_once_and_the_claim_repairs_at_the_hand_over(env):
    events = [
        ev(EventKind.TURN_START, "turn-1"),
        ev(EventKind.STEP_START, "step-1"),
        ev(EventKind.TOOL_CALL, "call-1", name="run"),
    ]
    await env.write(transcripts.append, command=AppendCommand(WS, "t-1", events, 1))
    await env.write(transcripts.append, command=AppendCommand(WS, "t-2", events, 1))
    repaired = await env.write(transcripts.repair, workspace_id=WS, task_id="t-1")
    assert repaired.repaired and not repaired.turn_in_progress
    stored = await env.read(lambda tx: tx.transcripts.page(WS, "t-1", 3, 100))
    assert [(e.kind, e.synthetic, e.sequence) for e in stored] == [
        (EventKind.TOOL_RESULT, True, 4),
        (EventKind.STEP_END, True, 5),
        (EventKind.TURN_END, True, 6),
    ]
    assert (await env.read(lambda tx: tx.transcripts.load_tail(WS, "t-1"))).state_version == 2
    before = await env.state()
    assert not (await env.write(transcripts.repair, workspace_id=WS, task_id="t-1")).repaired
    assert await env.state() == before

    claimed = await env.claimed("t-2")
    assert claimed.repaired
    assert (await env.read(lambda tx: tx.transcripts.load_tail(WS, "t-2"))).tail.open_turn is None


async def test_a_staged_import_becomes_the_transcript_in_one_commit_or_is_discarded(env):
    events = [
        ev(EventKind.TURN_START, "turn-1", sequence=1, generation=1, recorded_at=5),
        ev(EventKind.CHECKPOINT, "cp-1", sequence=2, generation=1, recorded_at=6),
        ev(EventKind.TURN_END, "turn-1", sequence=3, generation=1, recorded_at=7, reason=TurnEndReason.COMPLETED),
    ]
    await env.store.write(lambda tx: tx.imports.stage("import-1", events[:2]))
    await env.store.write(lambda tx: tx.imports.stage("import-1", events[2:]))
    await env.store.write(lambda tx: tx.imports.stage("import-2", events))
    final = Tail(checkpoint="cp-1", last_sequence=3)
    version = await env.store.write(lambda tx: transcripts.commit_import(tx, "import-1", WS, "t-1", final, {"cp-1": 2}))
    assert version == 1
    assert await env.read(lambda tx: tx.transcripts.page(WS, "t-1", 0, 10)) == events
    assert await env.read(lambda tx: tx.transcripts.load_checkpoints(WS, "t-1", {"cp-1"})) == {"cp-1": 2}
    assert await env.read(lambda tx: tx.transcripts.load_tail(WS, "t-1")) == TranscriptState(final, 1)

    before = await env.state()
    refused = await env.store.write(lambda tx: transcripts.commit_import(tx, "import-2", WS, "t-1", final, {}))
    assert_rejected(refused, Reason.TRANSCRIPT_NOT_EMPTY)
    assert await env.state() == before
    # Discarded staging leaves nothing behind: a later commit of it imports nothing.
    await env.store.write(lambda tx: tx.imports.discard(None))
    assert await env.store.write(lambda tx: transcripts.commit_import(tx, "import-2", WS, "t-2", Tail(), {})) == 1
    assert await env.read(lambda tx: tx.transcripts.page(WS, "t-2", 0, 10)) == []
