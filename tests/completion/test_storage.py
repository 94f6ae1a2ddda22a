"""Storage conformance tests of the completion store, on a SQLite file and in
memory: runs and leases, closing a run with its audit row, the completion
transaction's duplicate policy, settlement exactly once, request-id replay, and
blocked decisions for lost, expired or superseded leases and stale state
versions. Every refused request leaves the database exactly as it was.

A PostgreSQL adapter must pass the same tests (storage/port.py)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

import pytest

from completion_service.convert import completion_to_proto, decision_to_proto, lease_to_proto, run_to_proto
from completion_service.core.gates import WorkspacePolicy
from completion_service.core.identity import IdentityInput, completion_identity
from completion_service.core.model import (
    AgentAction,
    CompletionEventKind,
    EvidenceRecord,
    LifecycleState,
    LifecycleView,
    RequestedOutcome,
    RunOutcome,
    SettlementStatus,
    Verdict,
)
from completion_service.errors import Reason
from completion_service.storage.port import (
    AttemptCommand,
    AttemptOutcome,
    ClaimCommand,
    Claimed,
    CloseCommand,
    CompletionCorrupted,
    Remembered,
    Settlement,
)
from completion_service.storage.sqlite import SqliteCompletionStore
from funnel.auth.principal import Caller
from funnel.completion.v1 import completion_pb2 as pb
from funnel.runtime.clock import ManualClock, SequentialIds
from funnel.runtime.errors import Rejection, instant
from funnel.runtime.idempotency import RequestKey, fingerprint

START = 1_700_000_000_000_000
SECOND = 1_000_000
WS = "ws-1"
ACTIVE = LifecycleView(generation=1, state=LifecycleState.ACTIVE, outcome=None, cancellation_requested=False)
POLICY = WorkspacePolicy()
CALLER = "host-1"


def key(method: str, request_id: str, digest: bytes, workspace: str = WS, caller: str = CALLER) -> RequestKey:
    return RequestKey(workspace, caller, method, request_id, digest)


def render_claim(run, lease):
    return pb.ClaimTaskResponse(run=run_to_proto(run), lease=lease_to_proto(lease))


def render_attempt(outcome: AttemptOutcome):
    return pb.AttemptCompletionResponse(
        decision=decision_to_proto(outcome.decision),
        completion=completion_to_proto(outcome.completion) if outcome.completion else None,
        existing_completion=outcome.existing,
    )


def render_run(run):
    return pb.CompleteRunResponse(run_id=run.run_id, tokens_total=run.tokens_total or 0)


class Env:
    def __init__(self, store: SqliteCompletionStore, clock: ManualClock, path: str, published: list) -> None:
        self.store = store
        self.clock = clock
        self.path = path
        self.published = published

    # -- raw SQL, as an operator (or corruption) would touch the database ----

    async def execute(self, sql: str, params: tuple = ()) -> None:
        if self.path == ":memory:":
            await self.store._writer.run(lambda db: db.execute(sql, params))
            return
        db = sqlite3.connect(self.path)
        try:
            with db:
                db.execute(sql, params)
        finally:
            db.close()

    async def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        return await self.store._writer.run(lambda db: db.execute(sql, params).fetchall())

    async def count(self, table: str) -> int:
        return (await self.rows(f"SELECT COUNT(*) FROM {table}"))[0][0]

    async def dump(self) -> dict[str, list[tuple]]:
        def read(db: sqlite3.Connection) -> dict[str, list[tuple]]:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
            return {t: sorted(db.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}

        return await self.store._writer.run(read)

    async def set_state_version(self, task_id: str, state_version: int, checkpoint: str = "") -> None:
        await self.execute(
            "INSERT INTO transcript_tails (workspace_id, task_id, state_version, checkpoint) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (workspace_id, task_id) DO UPDATE SET state_version = excluded.state_version, "
            "checkpoint = excluded.checkpoint",
            (WS, task_id, state_version, checkpoint),
        )

    # -- commands ------------------------------------------------------------

    async def claim(self, task_id: str = "t-1", *, ttl: int = 60 * SECOND, request_id=None, agent="agent-1"):
        request = (
            key("ClaimTask", request_id, fingerprint("ClaimTask", f"{task_id}/{agent}/{ttl}".encode()))
            if request_id
            else None
        )
        return await self.store.claim(ClaimCommand(WS, task_id, agent, 1, ttl, request, render_claim))

    async def claimed(self, task_id: str = "t-1", **kw) -> Claimed:
        result = await self.claim(task_id, **kw)
        assert isinstance(result, Claimed), result
        return result

    def attempt_command(self, claimed: Claimed, **changes) -> AttemptCommand:
        command = AttemptCommand(
            workspace_id=WS,
            task_id=claimed.run.task_id,
            run_id=claimed.run.run_id,
            claimed_epoch=claimed.lease.epoch,
            outcome=RequestedOutcome.COMPLETED,
            result="all tests pass",
            state_version=None,
            lifecycle=ACTIVE,
            policy=POLICY,
        )
        return dataclasses.replace(command, **changes)

    async def attempt(self, claimed: Claimed, **changes):
        return await self.store.attempt(self.attempt_command(claimed, **changes))

    async def close(self, run_id: str, **changes):
        command = CloseCommand(
            workspace_id=WS, run_id=run_id, outcome=RunOutcome.SUCCEEDED, tokens_input=10, tokens_output=5,
            tokens_total=15, notes="done", notes_truncated=False, error="", final_status=None, closed_by="agent",
            caller=Caller("agent-1", "agent"),
        )
        return await self.store.close_run(dataclasses.replace(command, **changes))

    async def events(self, task_id: str | None = None):
        return await self.store.events_after(WS, 0, task_id, 1000)


@pytest.fixture(params=["file", "memory"])
async def env(request, tmp_path):
    clock = ManualClock(START)
    path = str(tmp_path / "completion.sqlite3") if request.param == "file" else ":memory:"
    published: list = []
    store = await SqliteCompletionStore.open(path, clock, SequentialIds(), published.extend)
    yield Env(store, clock, path, published)
    await store.close()


def assert_rejected(result, reason: Reason, **metadata) -> Rejection:
    assert isinstance(result, Rejection), result
    assert result.reason is reason, result
    for key, value in metadata.items():
        assert result.metadata[key] == str(value), result.metadata
    return result


# -- runs and leases ----------------------------------------------------------


async def test_claim_opens_a_run_and_a_lease_whose_epoch_grows_on_every_claim(env):
    first = await env.claimed(ttl=10 * SECOND)
    assert (first.lease.epoch, first.lease.run_id, first.lease.expires_at) == (1, first.run.run_id, START + 10 * SECOND)
    assert first.run.open and first.run.epoch == 1 and first.run.claimed_at == START
    assert await env.store.get_lease(WS, "t-1") == first.lease

    env.clock.advance(11 * SECOND)  # the first lease expired; its run is still open
    second = await env.claimed(ttl=10 * SECOND, agent="agent-2")
    assert second.lease.epoch == 2 and second.run.run_id != first.run.run_id

    await env.close(second.run.run_id)  # a closed holder does not hold the lease, even before expiry
    third = await env.claimed(ttl=10 * SECOND)
    assert third.lease.epoch == 3
    assert await env.store.get_lease(WS, "t-1") == third.lease
    # Epochs are per task.
    assert (await env.claimed("t-2")).lease.epoch == 1


async def test_claim_while_another_open_run_holds_a_live_lease_is_lease_held_and_changes_nothing(env):
    holder = await env.claimed(ttl=10 * SECOND)
    env.clock.advance(9 * SECOND)
    before = await env.dump()
    result = await env.claim(agent="agent-2")
    assert_rejected(
        result, Reason.LEASE_HELD, holder_run_id=holder.run.run_id, lease_expire_time=instant(holder.lease.expires_at)
    )
    assert await env.dump() == before


async def test_renew_extends_a_live_lease_of_the_current_epoch(env):
    claimed = await env.claimed(ttl=10 * SECOND)
    env.clock.advance(5 * SECOND)
    renewed = await env.store.renew(WS, claimed.run.run_id, 1, 30 * SECOND, None, None, lease_to_proto)
    assert renewed.expires_at == START + 35 * SECOND and renewed.epoch == 1
    assert (await env.store.get_run(WS, claimed.run.run_id)).lease_expires_at == START + 35 * SECOND
    assert (await env.store.get_lease(WS, "t-1")).expires_at == START + 35 * SECOND


async def test_renew_refusals_change_nothing(env):
    old = await env.claimed(ttl=10 * SECOND)
    env.clock.advance(11 * SECOND)
    before = await env.dump()
    assert_rejected(
        await env.store.renew(WS, old.run.run_id, 1, 30 * SECOND, None, None, lease_to_proto),
        Reason.LEASE_EXPIRED,
        lease_expire_time=instant(START + 10 * SECOND),
    )
    assert_rejected(
        await env.store.renew(WS, "run-unknown", 1, 30 * SECOND, None, None, lease_to_proto), Reason.RUN_NOT_FOUND
    )
    assert await env.dump() == before

    new = await env.claimed(ttl=10 * SECOND)  # supersedes the old run's lease
    before = await env.dump()
    assert_rejected(
        await env.store.renew(WS, old.run.run_id, 1, 30 * SECOND, None, None, lease_to_proto),
        Reason.LEASE_NOT_CURRENT,
        epoch=1,
        current_epoch=2,
    )
    assert_rejected(
        await env.store.renew(WS, new.run.run_id, 1, 30 * SECOND, None, None, lease_to_proto),
        Reason.LEASE_NOT_CURRENT,
    )
    assert await env.dump() == before

    await env.close(new.run.run_id)
    before = await env.dump()
    assert_rejected(
        await env.store.renew(WS, new.run.run_id, 2, 30 * SECOND, None, None, lease_to_proto),
        Reason.RUN_ALREADY_FINISHED,
        run_id=new.run.run_id,
    )
    assert await env.dump() == before


# -- closing runs -------------------------------------------------------------


async def test_close_run_closes_the_run_and_writes_its_audit_row(env):
    claimed = await env.claimed()
    env.clock.advance(3 * SECOND)
    closed = await env.close(claimed.run.run_id, tokens_input=100, tokens_output=50, tokens_total=1000, notes="n",
                             error="e", outcome=RunOutcome.FAILED)
    assert closed.finished_at == START + 3 * SECOND and not closed.open
    stored = await env.store.get_run(WS, claimed.run.run_id)
    assert stored == closed
    assert (
        stored.outcome,
        stored.tokens_input,
        stored.tokens_output,
        stored.tokens_total,
        stored.notes,
        stored.error,
    ) == (RunOutcome.FAILED, 100, 50, 1000, "n", "e")
    audit = (await env.store.list_audit(WS, None, None, 0, 10)).items
    assert [(a.action, a.run_id, a.task_id, dict(a.metadata), a.recorded_at) for a in audit] == [
        ("task.completed", claimed.run.run_id, "t-1",
         {"outcome": "FAILED", "final_status": "UNCHANGED", "closed_by": "agent"}, START + 3 * SECOND)
    ]

    before = await env.dump()
    assert_rejected(await env.close(claimed.run.run_id), Reason.RUN_ALREADY_FINISHED, run_id=claimed.run.run_id)
    assert_rejected(await env.close("run-unknown"), Reason.RUN_NOT_FOUND)
    assert await env.dump() == before


async def test_close_run_and_its_audit_row_commit_together_or_not_at_all(env):
    claimed = await env.claimed()
    await env.execute(
        "CREATE TRIGGER audit_broken BEFORE INSERT ON audit_log BEGIN SELECT RAISE(ABORT, 'audit log is full'); END"
    )
    with pytest.raises(sqlite3.DatabaseError, match="audit log is full"):
        await env.close(claimed.run.run_id)
    assert (await env.store.get_run(WS, claimed.run.run_id)).open
    assert await env.count("audit_log") == 0

    await env.execute("DROP TRIGGER audit_broken")
    assert not (await env.close(claimed.run.run_id)).open
    assert await env.count("audit_log") == 1


# -- the completion transaction ------------------------------------------------


async def test_an_allowed_attempt_commits_one_pending_completion_and_a_committed_event(env):
    claimed = await env.claimed()
    outcome = await env.attempt(claimed)
    assert outcome.decision.verdict is Verdict.ALLOW and outcome.inserted and not outcome.existing
    completion = outcome.completion
    assert completion.settlement is SettlementStatus.PENDING and completion.committed_at == START
    assert completion.identity == completion_identity(
        IdentityInput(WS, "t-1", 1, 0, "", "COMPLETED", outcome.decision.decision_schema)
    )
    assert await env.store.get_completion(WS, "t-1", 1) == completion
    events = await env.events()
    assert [(e.kind, e.completion_id) for e in events] == [
        (CompletionEventKind.COMPLETION_COMMITTED, completion.completion_id)
    ]
    assert env.published == events
    assert await env.store.due_settlements(START, 10) == [completion]


async def test_same_identity_returns_the_existing_completion(env):
    claimed = await env.claimed()
    first = (await env.attempt(claimed)).completion
    again = await env.attempt(claimed, result="said differently")  # the result is not part of the identity
    assert again.decision.verdict is Verdict.ALLOW
    assert again.existing and not again.inserted
    assert again.completion == first
    assert await env.count("task_completions") == 1
    assert [e.kind for e in await env.events()] == [CompletionEventKind.COMPLETION_COMMITTED]


async def test_different_identity_with_the_same_outcome_keeps_the_existing_completion(env):
    claimed = await env.claimed()
    first = (await env.attempt(claimed)).completion
    await env.set_state_version("t-1", 4, "cp-2")
    later = await env.attempt(claimed)
    assert later.decision.verdict is Verdict.ALLOW and later.decision.state_version == 4
    assert later.existing and not later.inserted
    assert later.completion == first  # the stored row stays the completion
    assert (await env.store.get_completion(WS, "t-1", 1)).state_version == 0
    assert await env.count("task_completions") == 1


async def test_different_outcome_is_a_conflict_and_writes_nothing(env):
    claimed = await env.claimed()
    first = (await env.attempt(claimed)).completion
    before = await env.dump()
    attempts = await env.count("completion_attempts")
    published = list(env.published)
    result = await env.attempt(claimed, outcome=RequestedOutcome.FAILED, result="gave up")
    assert_rejected(result, Reason.COMPLETION_CONFLICT, completion_id=first.completion_id, outcome="COMPLETED")
    assert await env.count("completion_attempts") == attempts
    assert await env.dump() == before
    assert env.published == published


async def test_same_identity_with_a_different_payload_is_corruption_and_writes_nothing(env):
    claimed = await env.claimed()
    first = (await env.attempt(claimed)).completion
    await env.execute(
        "UPDATE task_completions SET payload = ? WHERE completion_id = ?", (b'{"tampered":true}', first.completion_id)
    )
    before = await env.dump()
    with pytest.raises(CompletionCorrupted) as raised:
        await env.attempt(claimed)
    assert raised.value.completion_id == first.completion_id
    assert await env.dump() == before


async def test_snapshot_changed_since_external_gates_answered_is_refused_and_writes_nothing(env):
    claimed = await env.claimed()
    basis = (("run-other", 9), 0, "")
    before = await env.dump()
    result = await env.attempt(claimed, external_basis=basis, external_answers={})
    assert_rejected(result, Reason.SNAPSHOT_CHANGED)
    assert await env.dump() == before


# -- blocked decisions: lease lost, expired, superseded; stale state version ----


def assert_blocked(outcome: AttemptOutcome, verdict: Verdict, gate_id: str, action: AgentAction) -> None:
    assert isinstance(outcome, AttemptOutcome), outcome
    decision = outcome.decision
    assert decision.verdict is verdict, decision.instruction
    assert decision.next_action is action
    assert [t.gate_id for t in decision.trace if t.decisive] == [gate_id], decision.trace
    assert outcome.completion is None and not outcome.inserted


async def blocked_and_recorded(env: Env, claimed: Claimed, verdict, gate_id, action, **changes) -> None:
    attempts = await env.count("completion_attempts")
    outcome = await env.attempt(claimed, **changes)
    assert_blocked(outcome, verdict, gate_id, action)
    assert await env.store.get_completion(WS, claimed.run.task_id, 1) is None
    assert await env.count("completion_attempts") == attempts + 1
    last = (await env.events())[-1]
    assert (last.kind, last.run_id, last.decision) == (
        CompletionEventKind.DECISION_BLOCKED, claimed.run.run_id, outcome.decision)


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


# -- settlement -----------------------------------------------------------------


async def test_settlement_is_recorded_exactly_once_with_one_terminal_event(env):
    claimed = await env.claimed()
    completion = (await env.attempt(claimed)).completion
    env.clock.advance(SECOND)
    settled = await env.store.record_settlement(
        completion, Settlement(lifecycle_revision=3, lifecycle_event_sequence=7)
    )
    assert settled.settlement is SettlementStatus.SETTLED
    assert (settled.lifecycle_revision, settled.lifecycle_event_sequence, settled.settled_at) == (3, 7, START + SECOND)
    assert await env.store.settled_completion(WS, "t-1", 1) == settled
    assert await env.store.due_settlements(START + 100 * SECOND, 10) == []

    before = await env.dump()
    assert (
        await env.store.record_settlement(completion, Settlement(lifecycle_revision=4, lifecycle_event_sequence=8))
        is None
    )
    assert (
        await env.store.record_settlement(completion, Settlement(error_reason="CANCELLATION_FENCED", error_message="x"))
        is None
    )
    assert await env.dump() == before
    events = await env.events()
    assert [e.kind for e in events] == [
        CompletionEventKind.COMPLETION_COMMITTED,
        CompletionEventKind.COMPLETION_SETTLED,
    ]
    assert (events[1].lifecycle_revision, events[1].lifecycle_event_sequence) == (3, 7)
    assert env.published == events


async def test_a_rejected_settlement_records_a_terminalization_error_and_never_a_settled_event(env):
    claimed = await env.claimed()
    completion = (await env.attempt(claimed)).completion
    rejected = await env.store.record_settlement(
        completion, Settlement(error_reason="CANCELLATION_FENCED", error_message="fenced at t")
    )
    assert rejected.settlement is SettlementStatus.REJECTED
    assert (rejected.error_reason, rejected.error_message) == ("CANCELLATION_FENCED", "fenced at t")
    assert await env.store.settled_completion(WS, "t-1", 1) is None
    assert (
        await env.store.record_settlement(completion, Settlement(lifecycle_revision=3, lifecycle_event_sequence=7))
        is None
    )
    assert [e.kind for e in await env.events()] == [
        CompletionEventKind.COMPLETION_COMMITTED, CompletionEventKind.TERMINALIZATION_ERROR]


async def test_a_postponed_settlement_is_due_again_only_at_its_time(env):
    claimed = await env.claimed()
    completion = (await env.attempt(claimed)).completion
    await env.store.postpone_settlement(completion, START + 5 * SECOND)
    assert await env.store.due_settlements(START + 4 * SECOND, 10) == []
    [due] = await env.store.due_settlements(START + 5 * SECOND, 10)
    assert (due.completion_id, due.settle_attempts, due.settlement) == (
        completion.completion_id,
        1,
        SettlementStatus.PENDING,
    )


# -- request ids ------------------------------------------------------------------


async def test_a_claim_request_id_replays_the_original_response_and_refuses_another_request(env):
    first = await env.claimed(request_id="req-1")
    before = await env.dump()
    replay = await env.claim(request_id="req-1")
    assert isinstance(replay, Remembered)
    assert pb.ClaimTaskResponse.FromString(replay.response) == render_claim(first.run, first.lease)
    digest = fingerprint("ClaimTask", f"t-1/agent-1/{60 * SECOND}".encode())
    assert await env.store.recall(key("ClaimTask", "req-1", digest)) == replay
    assert_rejected(await env.claim(request_id="req-1", agent="agent-2"), Reason.REQUEST_ID_REUSED, request_id="req-1")
    assert_rejected(await env.store.recall(key("ClaimTask", "req-1", b"another request")), Reason.REQUEST_ID_REUSED)
    assert await env.dump() == before
    # Request ids are per workspace.
    assert await env.store.recall(key("ClaimTask", "req-1", b"another request", workspace="ws-other")) is None
    # The scope is (workspace, caller, RPC): another caller or another RPC owns the same id afresh.
    assert await env.store.recall(key("ClaimTask", "req-1", digest, caller="host-2")) is None
    assert await env.store.recall(key("RenewLease", "req-1", digest)) is None


async def test_an_attempt_request_id_replays_the_original_decision(env):
    claimed = await env.claimed()
    fp = key("AttemptCompletion", "att-1", fingerprint("AttemptCompletion", b"first"))
    first = await env.attempt(claimed, request=fp, render=render_attempt)
    assert first.inserted
    before = await env.dump()
    replay = await env.attempt(claimed, request=fp, render=render_attempt)
    assert isinstance(replay, Remembered)
    assert pb.AttemptCompletionResponse.FromString(replay.response) == render_attempt(first)
    reused = await env.attempt(
        claimed,
        request=key("AttemptCompletion", "att-1", fingerprint("AttemptCompletion", b"other")),
        render=render_attempt,
    )
    assert_rejected(reused, Reason.REQUEST_ID_REUSED)
    assert await env.dump() == before


async def test_a_close_request_id_replays_and_refuses_another_request(env):
    claimed = await env.claimed()
    fp = key("CompleteRun", "close-1", fingerprint("CompleteRun", b"close"))
    closed = await env.close(claimed.run.run_id, request=fp, render=render_run)
    before = await env.dump()
    replay = await env.close(claimed.run.run_id, request=fp, render=render_run)
    assert isinstance(replay, Remembered)
    assert pb.CompleteRunResponse.FromString(replay.response) == render_run(closed)
    reused = await env.close(claimed.run.run_id, request=key("CompleteRun", "close-1", b"other"), render=render_run)
    assert_rejected(reused, Reason.REQUEST_ID_REUSED)
    assert await env.dump() == before


async def test_a_withdrawn_claim_releases_the_lease_and_forgets_its_request_id(env):
    claimed = await env.claimed(request_id="req-1")
    await env.store.withdraw_claim(
        WS, claimed.run.run_id, key("ClaimTask", "req-1", b"the claim's fingerprint"), "CANCELLATION_FENCED"
    )
    run = await env.store.get_run(WS, claimed.run.run_id)
    assert (run.open, run.outcome) == (False, RunOutcome.CANCELLED)
    assert await env.store.recall(key("ClaimTask", "req-1", b"anything")) is None
    retried = await env.claimed(request_id="req-1")  # a retry claims anew
    assert retried.lease.epoch == 2


# -- evidence ---------------------------------------------------------------------


async def test_evidence_counts_for_its_generation_and_is_listed_in_order(env):
    def record(kind, generation=1, passed=True):
        return EvidenceRecord("", WS, "t-1", generation, kind, passed, "cp-1", "details", None, 0)

    render = lambda stored: pb.RecordEvidenceResponse()  # noqa: E731
    first = await env.store.record_evidence(record("tests"), None, None, render)
    await env.store.record_evidence(record("lint", passed=False), None, None, render)
    await env.store.record_evidence(record("tests", generation=2), None, None, render)
    listed = await env.store.list_evidence(WS, "t-1", 1)
    assert [(e.kind, e.passed, e.generation) for e in listed] == [("tests", True, 1), ("lint", False, 1)]
    assert listed[0] == first and first.recorded_at == START and first.evidence_id


async def test_the_audit_log_stores_json_metadata(env):
    claimed = await env.claimed()
    await env.close(claimed.run.run_id, closed_by="stall_sweeper", outcome=RunOutcome.STALLED)
    [(metadata,)] = await env.rows("SELECT metadata FROM audit_log")
    assert json.loads(metadata) == {"outcome": "STALLED", "final_status": "UNCHANGED", "closed_by": "stall_sweeper"}


async def test_evidence_counts_only_at_the_checkpoint_it_names(env):
    policy = WorkspacePolicy(required_evidence=("tests",))
    claimed = await env.claimed()
    await env.set_state_version("t-1", 2, "cp-2")

    def record(checkpoint, passed=True, generation=1):
        return EvidenceRecord("", WS, "t-1", generation, "tests", passed, checkpoint, "", None, 0)

    render = lambda stored: pb.RecordEvidenceResponse()  # noqa: E731
    await env.store.record_evidence(record("cp-1"), None, None, render)  # an older checkpoint
    await env.store.record_evidence(record("cp-2", generation=2), None, None, render)  # another generation
    await blocked_and_recorded(env, claimed, Verdict.SOFT_BLOCK, "evidence.required", AgentAction.RECORD_EVIDENCE,
                               policy=policy, result="first")
    await env.store.record_evidence(record("cp-2", passed=False), None, None, render)
    await blocked_and_recorded(env, claimed, Verdict.SOFT_BLOCK, "evidence.required", AgentAction.RECORD_EVIDENCE,
                               policy=policy, result="second")
    await env.store.record_evidence(record("cp-2"), None, None, render)  # the latest fact wins
    assert (await env.attempt(claimed, policy=policy, result="third")).decision.verdict is Verdict.ALLOW


async def test_the_circuit_breaker_holds_until_the_checkpoint_changes(env):
    policy = WorkspacePolicy(required_evidence=("tests",), breaker_threshold=2)
    claimed = await env.claimed()
    await env.set_state_version("t-1", 1, "cp-1")
    for _ in range(2):
        await blocked_and_recorded(env, claimed, Verdict.SOFT_BLOCK, "evidence.required", AgentAction.RECORD_EVIDENCE,
                                   policy=policy)
    await blocked_and_recorded(env, claimed, Verdict.HARD_BLOCK, "completion.circuit_breaker",
                               AgentAction.STOP_AND_REPORT, policy=policy)
    await env.set_state_version("t-1", 2, "cp-2")
    await blocked_and_recorded(env, claimed, Verdict.SOFT_BLOCK, "evidence.required", AgentAction.RECORD_EVIDENCE,
                               policy=policy)
