"""Stale fences, both orders (issue 5 §4): a write holding an old lease epoch, an
old generation or an old revision is delayed until just before and just after
the fence moves. Before, it commits; after, it is rejected and changes nothing.

Both services run in process on one manual clock, so that "just before" and
"just after" are exact; a write is delayed by holding it at a gate inside the
service (after its checks from outside the transaction, before the transaction
or the settle call)."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from completion_service.policy import parse_policy
from completion_service.server import CompletionConfig
from completion_service.server import start as start_completion
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import completion_service_pb2_grpc as completion_grpc
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import transcript_service_pb2_grpc as transcript_grpc
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.clock import SequentialIds
from funnel.runtime.grpc_errors import error_info
from funnel.runtime.timestamps import to_timestamp
from lifecycle_service.server import LifecycleConfig
from lifecycle_service.server import start as start_lifecycle
from tests import credentials

WS = "ws-fence"
T = 10.0
LEASE_SECONDS = 10
SECOND = 1_000_000


@dataclasses.dataclass
class Services:
    clock: object
    lifecycle: object
    completion: object
    lc: lifecycle_grpc.TaskLifecycleServiceStub
    cs: completion_grpc.CompletionServiceStub
    ts: transcript_grpc.TranscriptServiceStub
    lifecycle_db: str
    completion_db: str

    def rows(self, database: str, sql: str, *params) -> list[tuple]:
        db = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
        try:
            return db.execute(sql, params).fetchall()
        finally:
            db.close()

    def state(self) -> dict:
        """Everything both services hold for the workspace, minus the attempt log
        and its DECISION_BLOCKED events (a blocked attempt records those by design)."""
        lifecycle = {
            table: self.rows(self.lifecycle_db, f"SELECT * FROM {table} WHERE workspace_id = ? ORDER BY 1, 2", WS)
            for table in ("tasks", "lifecycle_events")
        }
        completion = {
            table: self.rows(self.completion_db, f"SELECT * FROM {table} WHERE workspace_id = ? ORDER BY 1, 2", WS)
            for table in ("task_completions", "agent_runs", "task_leases")
        }
        completion["terminal_events"] = self.rows(
            self.completion_db,
            "SELECT * FROM completion_events WHERE workspace_id = ? AND kind != 'DECISION_BLOCKED' ORDER BY sequence",
            WS,
        )
        return {**lifecycle, **completion}


@pytest.fixture
async def services(tmp_path, clock):
    lifecycle = await start_lifecycle(
        LifecycleConfig(
            listen="127.0.0.1:0",
            database=str(tmp_path / "lifecycle.sqlite3"),
            max_clock_offset_ms=500,
            security=credentials.server_security(),
        ),
        clock=clock,
    )
    completion = await start_completion(
        CompletionConfig(
            listen="127.0.0.1:0",
            database=str(tmp_path / "completion.sqlite3"),
            lifecycle_address=lifecycle.address,
            settle_interval=0.05,
            security=credentials.server_security(),
            outbound=credentials.outbound_security(),
        ),
        clock=clock,
        ids=SequentialIds(),
        policies=parse_policy({"defaults": {"required_evidence": ["tests"]}}),
    )
    lifecycle_channel = credentials.insecure_channel(lifecycle.address)
    completion_channel = credentials.insecure_channel(completion.address)
    yield Services(
        clock,
        lifecycle,
        completion,
        lifecycle_grpc.TaskLifecycleServiceStub(lifecycle_channel),
        completion_grpc.CompletionServiceStub(completion_channel),
        transcript_grpc.TranscriptServiceStub(completion_channel),
        str(tmp_path / "lifecycle.sqlite3"),
        str(tmp_path / "completion.sqlite3"),
    )
    await completion_channel.close()
    await lifecycle_channel.close()
    await completion.stop(None)
    await lifecycle.stop(None)


class Gate:
    """Holds every call of a wrapped coroutine function until released."""

    def __init__(self, owner: object, name: str) -> None:
        self.reached = asyncio.Event()
        self.released = asyncio.Event()
        inner = getattr(owner, name)

        async def held(*args, **kwargs):
            self.reached.set()
            await self.released.wait()
            return await inner(*args, **kwargs)

        setattr(owner, name, held)


def cause() -> lifecycle_types.Cause:
    return lifecycle_types.Cause(source="test", reason="fence")


async def refused(call, code: grpc.StatusCode, reason: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == code, caught.value
    assert error_info(caught.value).reason == reason, caught.value


async def claim(s: Services, task_id: str, agent: str) -> completion_messages.ClaimTaskResponse:
    return await s.cs.ClaimTask(
        completion_messages.ClaimTaskRequest(
            workspace_id=WS, task_id=task_id, agent_id=agent, lease_ttl=Duration(seconds=LEASE_SECONDS)
        ),
        timeout=T,
    )


async def ready_to_complete(s: Services, task_id: str) -> completion_messages.ClaimTaskResponse:
    await s.lc.RegisterTask(
        lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id=task_id, cause=cause()), timeout=T
    )
    held = await claim(s, task_id, "agent-a")
    await s.ts.AppendTranscript(
        transcript_messages.AppendTranscriptRequest(
            workspace_id=WS,
            task_id=task_id,
            events=[
                completion_types.SessionEvent(turn_start=completion_types.TurnStart(turn_id="t")),
                completion_types.SessionEvent(checkpoint=completion_types.Checkpoint(checkpoint_id="cp")),
                completion_types.SessionEvent(
                    turn_end=completion_types.TurnEnd(turn_id="t", reason=completion_enums.TURN_END_REASON_COMPLETED)
                ),
            ],
        ),
        timeout=T,
    )
    await s.cs.RecordEvidence(
        completion_messages.RecordEvidenceRequest(
            workspace_id=WS,
            task_id=task_id,
            generation=1,
            kind="tests",
            verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
            checkpoint="cp",
            run_id=held.run.run_id,
        ),
        timeout=T,
    )
    return held


def attempt(s: Services, task_id: str, held: completion_messages.ClaimTaskResponse):
    return s.cs.AttemptCompletion(
        completion_messages.AttemptCompletionRequest(
            workspace_id=WS,
            task_id=task_id,
            run_id=held.run.run_id,
            epoch=held.lease.epoch,
            outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
            result="done",
        ),
        timeout=T,
    )


async def settled(s: Services, task_id: str, generation: int = 1) -> completion_types.Completion:
    for _ in range(500):
        completion = (
            await s.cs.GetCompletion(
                completion_messages.GetCompletionRequest(workspace_id=WS, task_id=task_id, generation=generation),
                timeout=T,
            )
        ).completion
        if completion.settlement != completion_enums.SETTLEMENT_STATUS_PENDING:
            return completion
        await asyncio.sleep(0.02)
    pytest.fail("the completion stayed PENDING")


async def task(s: Services, task_id: str) -> lifecycle_types.Task:
    return (await s.lc.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id=task_id), timeout=T)).task


# -- lease epoch ------------------------------------------------------------------


async def test_an_attempt_with_epoch_1_delayed_until_just_before_the_reclaim_commits(services):
    s = services
    held = await ready_to_complete(s, "t")
    gate = Gate(s.completion.authority.completions, "commit")
    delayed = asyncio.ensure_future(attempt(s, "t", held))
    await gate.reached.wait()
    # Just before the fence moves: the lease of epoch 1 has a microsecond left.
    s.clock.advance(LEASE_SECONDS * SECOND - 1)
    gate.released.set()
    answer = await delayed
    assert answer.decision.verdict == completion_enums.VERDICT_ALLOW
    assert (await settled(s, "t")).settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    # The fence would move now, but the generation is over: nobody can claim it again.
    s.clock.advance(1)
    await refused(claim(s, "t", "agent-b"), grpc.StatusCode.FAILED_PRECONDITION, "GENERATION_TERMINAL")
    current = await task(s, "t")
    assert (current.state, current.completion_id) == (
        lifecycle_enums.GENERATION_STATE_TERMINAL,
        answer.completion.completion_id,
    )


async def test_an_attempt_with_epoch_1_delayed_until_just_after_the_reclaim_changes_nothing(services):
    s = services
    held = await ready_to_complete(s, "t")
    gate = Gate(s.completion.authority.completions, "commit")
    delayed = asyncio.ensure_future(attempt(s, "t", held))
    await gate.reached.wait()
    # The fence moves: the lease expires and another agent claims epoch 2.
    s.clock.advance(LEASE_SECONDS * SECOND)
    second = await claim(s, "t", "agent-b")
    assert second.lease.epoch == held.lease.epoch + 1
    before = s.state()
    gate.released.set()
    answer = await delayed
    assert answer.decision.verdict == completion_enums.VERDICT_HARD_BLOCK
    assert answer.decision.next_action == completion_enums.AGENT_ACTION_STOP_AND_REPORT
    assert not answer.HasField("completion")
    assert s.state() == before, "the stale attempt changed something"
    # The holder of the new epoch can still finish the task.
    await s.cs.RecordEvidence(
        completion_messages.RecordEvidenceRequest(
            workspace_id=WS,
            task_id="t",
            generation=1,
            kind="tests",
            verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
            checkpoint="cp",
            run_id=second.run.run_id,
        ),
        timeout=T,
    )
    assert (await attempt(s, "t", second)).decision.verdict == completion_enums.VERDICT_ALLOW


# -- generation -------------------------------------------------------------------


async def end_and_resume(s: Services, task_id: str) -> None:
    """The generation fence moves: the host times generation 1 out and resumes into 2."""
    await s.lc.SettleTimeout(
        lifecycle_messages.SettleTimeoutRequest(workspace_id=WS, task_id=task_id, generation=1, cause=cause()),
        timeout=T,
    )
    await s.lc.ResumeWithGeneration(
        lifecycle_messages.ResumeWithGenerationRequest(workspace_id=WS, task_id=task_id, generation=2, cause=cause()),
        timeout=T,
    )


async def test_a_settlement_for_generation_1_delayed_until_just_before_the_resume_commits(services):
    s = services
    held = await ready_to_complete(s, "t")
    gate = Gate(s.completion.authority.lifecycle, "settle_completion")
    delayed = asyncio.ensure_future(attempt(s, "t", held))
    await gate.reached.wait()
    gate.released.set()
    answer = await delayed
    completion = await settled(s, "t")
    assert completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    assert completion.completion_id == answer.completion.completion_id
    # Generation 1 is completed: the host's timeout for it is refused, the resume works.
    await refused(
        s.lc.SettleTimeout(
            lifecycle_messages.SettleTimeoutRequest(workspace_id=WS, task_id="t", generation=1, cause=cause()),
            timeout=T,
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "GENERATION_TERMINAL",
    )
    await s.lc.ResumeWithGeneration(
        lifecycle_messages.ResumeWithGenerationRequest(workspace_id=WS, task_id="t", generation=2, cause=cause()),
        timeout=T,
    )
    history = s.rows(
        s.lifecycle_db,
        "SELECT generation, intent, outcome, completion_id FROM lifecycle_events "
        "WHERE workspace_id = ? AND task_id = 't' ORDER BY revision",
        WS,
    )
    assert (1, "SETTLE_COMPLETION", "COMPLETED", completion.completion_id) in history


async def test_a_settlement_for_generation_1_delayed_until_just_after_the_resume_changes_nothing(services):
    s = services
    held = await ready_to_complete(s, "t")
    gate = Gate(s.completion.authority.lifecycle, "settle_completion")
    delayed = asyncio.ensure_future(attempt(s, "t", held))
    await gate.reached.wait()
    # The completion row is committed (PENDING) and its settle call is in flight.
    await end_and_resume(s, "t")
    lifecycle_before = {k: v for k, v in s.state().items() if k in ("tasks", "lifecycle_events")}
    gate.released.set()
    answer = await delayed
    completion = await settled(s, "t")
    assert completion.completion_id == answer.completion.completion_id
    assert completion.settlement == completion_enums.SETTLEMENT_STATUS_REJECTED
    assert completion.terminalization_error_reason == "STALE_GENERATION"
    assert {k: v for k, v in s.state().items() if k in ("tasks", "lifecycle_events")} == lifecycle_before
    kinds = s.rows(s.completion_db, "SELECT kind FROM completion_events WHERE workspace_id = ? ORDER BY sequence", WS)
    assert kinds == [("RUN_CLAIMED",), ("EVIDENCE_RECORDED",), ("COMPLETION_COMMITTED",), ("TERMINALIZATION_ERROR",)]
    current = await task(s, "t")
    assert (current.generation, current.state, current.completion_id) == (
        2,
        lifecycle_enums.GENERATION_STATE_ACTIVE,
        "",
    )


@pytest.mark.parametrize(
    "method, extra",
    [
        ("ActivateGeneration", {}),
        ("SuspendGeneration", {}),
        ("SetWorkStatus", {"work_status": lifecycle_enums.WORK_STATUS_BLOCKED}),
        ("RequestCancellation", {}),
        ("SettleFailure", {}),
        ("SettleTimeout", {}),
        ("SettleCompletion", {"completion_id": "cmp_late", "authoritative_time": to_timestamp(1)}),
    ],
)
async def test_any_intent_for_a_replaced_generation_is_stale_and_changes_nothing(services, method, extra):
    s = services
    await s.lc.RegisterTask(
        lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id="t", cause=cause()), timeout=T
    )
    request = getattr(lifecycle_messages, f"{method}Request")(
        workspace_id=WS, task_id="t", generation=1, cause=cause(), **extra
    )
    await end_and_resume(s, "t")
    before = s.state()
    await refused(getattr(s.lc, method)(request, timeout=T), grpc.StatusCode.FAILED_PRECONDITION, "STALE_GENERATION")
    assert s.state() == before


# -- revision -----------------------------------------------------------------------


async def set_status(s: Services, status: int, expected_revision: int):
    return await s.lc.SetWorkStatus(
        lifecycle_messages.SetWorkStatusRequest(
            workspace_id=WS,
            task_id="t",
            generation=1,
            work_status=status,
            expected_revision=expected_revision,
            cause=cause(),
        ),
        timeout=T,
    )


async def test_a_write_expecting_revision_r_just_before_another_write_commits(services):
    s = services
    await s.lc.RegisterTask(
        lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id="t", cause=cause()), timeout=T
    )
    read = (await task(s, "t")).revision
    stale = await set_status(s, lifecycle_enums.WORK_STATUS_BLOCKED, read)
    assert stale.task.revision == read + 1
    # The other writer read the same revision and now loses.
    await refused(
        set_status(s, lifecycle_enums.WORK_STATUS_IN_PROGRESS, read), grpc.StatusCode.ABORTED, "REVISION_MISMATCH"
    )
    assert (await task(s, "t")).work_status == lifecycle_enums.WORK_STATUS_BLOCKED


async def test_a_write_expecting_revision_r_just_after_another_write_changes_nothing(services):
    s = services
    await s.lc.RegisterTask(
        lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id="t", cause=cause()), timeout=T
    )
    read = (await task(s, "t")).revision
    await set_status(s, lifecycle_enums.WORK_STATUS_IN_PROGRESS, read)
    before = s.state()
    await refused(
        set_status(s, lifecycle_enums.WORK_STATUS_BLOCKED, read), grpc.StatusCode.ABORTED, "REVISION_MISMATCH"
    )
    assert s.state() == before
    assert (await task(s, "t")).work_status == lifecycle_enums.WORK_STATUS_IN_PROGRESS


# -- cancellation fence (rule 4: authoritative_time + max clock offset) ----------------


@pytest.mark.parametrize("margin_micros, commits", [(1, True), (0, False)])
async def test_a_completion_just_before_the_cancellation_fence_passes_it_just_after_does_not(
    services, margin_micros, commits
):
    s = services
    await s.lc.RegisterTask(
        lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id="t", cause=cause()), timeout=T
    )
    await s.lc.ActivateGeneration(
        lifecycle_messages.ActivateGenerationRequest(workspace_id=WS, task_id="t", generation=1, cause=cause()),
        timeout=T,
    )
    fence = (
        await s.lc.RequestCancellation(
            lifecycle_messages.RequestCancellationRequest(workspace_id=WS, task_id="t", generation=1, cause=cause()),
            timeout=T,
        )
    ).task.cancellation_request_time
    fence_micros = fence.seconds * SECOND + fence.nanos // 1000
    # Proven earlier only if authoritative_time + 500 ms < the fence.
    authoritative = fence_micros - 500_000 - margin_micros
    request = lifecycle_messages.SettleCompletionRequest(
        workspace_id=WS,
        task_id="t",
        generation=1,
        completion_id="cmp_x",
        authoritative_time=to_timestamp(authoritative),
        cause=cause(),
    )
    if commits:
        answer = await s.lc.SettleCompletion(request, timeout=T)
        assert (answer.task.state, answer.task.outcome) == (
            lifecycle_enums.GENERATION_STATE_TERMINAL,
            lifecycle_enums.TERMINAL_OUTCOME_COMPLETED,
        )
    else:
        before = s.state()
        await refused(
            s.lc.SettleCompletion(request, timeout=T), grpc.StatusCode.FAILED_PRECONDITION, "CANCELLATION_FENCED"
        )
        assert s.state() == before
