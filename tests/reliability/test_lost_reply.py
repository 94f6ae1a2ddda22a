"""Lost replies (issue 5 §3), with both services as real processes: a service
commits, then its reply is dropped (the caller sees UNAVAILABLE); the retry with
the same request_id returns the committed revision and event, and exactly one
event exists. The same for the completion side: an AttemptCompletion whose
reply is lost after its commit is retried into the same completion, settled once."""

from __future__ import annotations

import asyncio
import functools

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.grpc_errors import error_info
from tests.reliability.harness import Pair, read_only

WS = "ws-lost"
T = 5.0


@pytest.fixture
async def pair(tmp_path):
    # A slower outbox pass (every second instead of every 50 ms), so that the
    # attempt's own settle, not the outbox's, meets the armed fault point.
    pair = await Pair(tmp_path / "pair", completion_args=["--settle-interval", "1"]).start()
    yield pair
    await pair.stop()


def cause() -> lifecycle_types.Cause:
    return lifecycle_types.Cause(source="test", reason="lost reply")


async def dropped(call) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
    assert "reply dropped" in caught.value.details()


async def events(pair: Pair, task_id: str) -> list[lifecycle_types.LifecycleEvent]:
    response = await pair.lc.ListLifecycleEvents(
        lifecycle_messages.ListLifecycleEventsRequest(workspace_id=WS, task_id=task_id, page_size=100), timeout=T
    )
    return list(response.events)


def lifecycle_steps(cid: str) -> list[tuple[str, str, object]]:
    """Every mutating lifecycle intent a host sends, in an order that applies each."""
    now = Timestamp()
    now.GetCurrentTime()
    key = {"workspace_id": WS, "cause": cause()}
    return [
        ("t1", "RegisterTask", lifecycle_messages.RegisterTaskRequest(task_id="t1", **key)),
        ("t1", "ActivateGeneration", lifecycle_messages.ActivateGenerationRequest(task_id="t1", generation=1, **key)),
        (
            "t1",
            "SetWorkStatus",
            lifecycle_messages.SetWorkStatusRequest(
                task_id="t1", generation=1, work_status=lifecycle_enums.WORK_STATUS_BLOCKED, **key
            ),
        ),
        ("t1", "SuspendGeneration", lifecycle_messages.SuspendGenerationRequest(task_id="t1", generation=1, **key)),
        (
            "t1",
            "ResumeWithGeneration",
            lifecycle_messages.ResumeWithGenerationRequest(task_id="t1", generation=1, **key),
        ),
        ("t1", "RequestCancellation", lifecycle_messages.RequestCancellationRequest(task_id="t1", generation=1, **key)),
        ("t1", "SettleCancellation", lifecycle_messages.SettleCancellationRequest(task_id="t1", generation=1, **key)),
        (
            "t1",
            "ResumeWithGeneration",
            lifecycle_messages.ResumeWithGenerationRequest(task_id="t1", generation=2, **key),
        ),
        (
            "t1",
            "SettleCompletion",
            lifecycle_messages.SettleCompletionRequest(
                task_id="t1", generation=2, completion_id=cid, authoritative_time=now, **key
            ),
        ),
        ("t2", "RegisterTask", lifecycle_messages.RegisterTaskRequest(task_id="t2", **key)),
        ("t2", "SettleFailure", lifecycle_messages.SettleFailureRequest(task_id="t2", generation=1, **key)),
        ("t3", "RegisterTask", lifecycle_messages.RegisterTaskRequest(task_id="t3", **key)),
        ("t3", "SettleTimeout", lifecycle_messages.SettleTimeoutRequest(task_id="t3", generation=1, **key)),
    ]


async def test_every_lifecycle_intent_survives_a_lost_reply(pair):
    for index, (task_id, method, request) in enumerate(lifecycle_steps("cmp_lost_reply")):
        request.request_id = f"req-{index}"
        call = functools.partial(getattr(pair.lc, method), request, timeout=T)
        before = await events(pair, task_id) if method != "RegisterTask" else []
        pair.lifecycle.arm("lifecycle.after_commit_before_reply:drop:1")
        await dropped(call())
        pair.lifecycle.disarm()
        committed = await events(pair, task_id)
        assert len(committed) == len(before) + 1, (method, committed)
        first, second = await call(), await call()
        assert first == second, method
        assert first.event == committed[-1], method
        assert first.event.revision == len(committed) == first.task.revision, method
        assert await events(pair, task_id) == committed, f"{method}: the retry added an event"
        # The same request id with another request is refused, not applied.
        other = type(request)()
        other.CopyFrom(request)
        other.cause.reason = "something else"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await getattr(pair.lc, method)(other, timeout=T)
        assert error_info(caught.value).reason == "REQUEST_ID_REUSED"
    lifecycle = read_only(pair.lifecycle.database)
    try:
        per_request = lifecycle.execute(
            "SELECT request_id, count(*) FROM lifecycle_events WHERE workspace_id = ? GROUP BY request_id", (WS,)
        ).fetchall()
    finally:
        lifecycle.close()
    assert len(per_request) == len(lifecycle_steps("x")) and {count for _, count in per_request} == {1}


# -- the completion side ------------------------------------------------------


async def ready_to_complete(pair: Pair, task_id: str) -> completion_messages.ClaimTaskResponse:
    await pair.lc.RegisterTask(
        lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id=task_id, cause=cause()), timeout=T
    )
    claim = await pair.cs.ClaimTask(
        completion_messages.ClaimTaskRequest(
            workspace_id=WS, task_id=task_id, agent_id="agent", lease_ttl=Duration(seconds=60)
        ),
        timeout=T,
    )
    await pair.ts.AppendTranscript(
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
    await pair.cs.RecordEvidence(
        completion_messages.RecordEvidenceRequest(
            workspace_id=WS,
            task_id=task_id,
            generation=1,
            kind="tests",
            verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
            checkpoint="cp",
            run_id=claim.run.run_id,
        ),
        timeout=T,
    )
    return claim


def attempt_request(
    task_id: str, claim: completion_messages.ClaimTaskResponse
) -> completion_messages.AttemptCompletionRequest:
    return completion_messages.AttemptCompletionRequest(
        workspace_id=WS,
        task_id=task_id,
        run_id=claim.run.run_id,
        epoch=claim.lease.epoch,
        outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
        result="done",
        request_id=f"attempt-{task_id}",
    )


async def settled(pair: Pair, task_id: str) -> completion_types.Completion:
    for _ in range(500):
        completion = (
            await pair.cs.GetCompletion(
                completion_messages.GetCompletionRequest(workspace_id=WS, task_id=task_id, generation=1), timeout=T
            )
        ).completion
        if completion.settlement != completion_enums.SETTLEMENT_STATUS_PENDING:
            return completion
        await asyncio.sleep(0.02)
    pytest.fail(f"{task_id}: the completion stayed PENDING")


def settled_once(pair: Pair, task_id: str, completion: completion_types.Completion) -> None:
    """One completion row, one COMPLETED lifecycle settlement carrying it, one
    COMPLETION_SETTLED event pointing at that lifecycle event."""
    assert completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    L, C = read_only(pair.lifecycle.database), read_only(pair.completion.database)
    try:
        rows = C.execute(
            "SELECT completion_id FROM task_completions WHERE workspace_id = ? AND task_id = ?", (WS, task_id)
        ).fetchall()
        assert rows == [(completion.completion_id,)]
        settlements = L.execute(
            "SELECT sequence, revision, completion_id FROM lifecycle_events WHERE workspace_id = ? AND task_id = ? "
            "AND intent = 'SETTLE_COMPLETION'",
            (WS, task_id),
        ).fetchall()
        assert settlements == [
            (completion.lifecycle_event_sequence, completion.lifecycle_revision, completion.completion_id)
        ]
        kinds = C.execute(
            "SELECT kind, lifecycle_event_sequence FROM completion_events WHERE workspace_id = ? AND task_id = ? ORDER "
            "BY sequence",
            (WS, task_id),
        ).fetchall()
        assert kinds == [
            ("RUN_CLAIMED", None),
            ("EVIDENCE_RECORDED", None),
            ("COMPLETION_COMMITTED", None),
            ("COMPLETION_SETTLED", completion.lifecycle_event_sequence),
        ]
        task = L.execute(
            "SELECT state, outcome, completion_id FROM tasks WHERE workspace_id = ? AND task_id = ?", (WS, task_id)
        ).fetchone()
        assert task == ("TERMINAL", "COMPLETED", completion.completion_id)
    finally:
        L.close()
        C.close()


@pytest.mark.parametrize("point", ["completion.after_commit_before_settle", "completion.after_settle_before_publish"])
async def test_an_attempt_whose_reply_is_lost_after_the_commit_is_retried_into_the_same_completion(pair, point):
    claim = await ready_to_complete(pair, "task")
    request = attempt_request("task", claim)
    pair.completion.arm(f"{point}:drop:1")
    await dropped(pair.cs.AttemptCompletion(request, timeout=T))
    pair.completion.disarm()
    retried = await pair.cs.AttemptCompletion(request, timeout=T)
    assert retried.decision.verdict == completion_enums.VERDICT_ALLOW
    final = await settled(pair, "task")
    assert retried.completion.completion_id == final.completion_id
    again = await pair.cs.AttemptCompletion(request, timeout=T)
    assert again.completion == final, "a retry after settlement reports the settled completion"
    settled_once(pair, "task", final)


async def test_a_settlement_whose_lifecycle_reply_is_lost_is_retried_by_the_outbox_and_settled_once(pair):
    claim = await ready_to_complete(pair, "task")
    # The first lifecycle commit of the attempt is its SettleCompletion.
    pair.lifecycle.arm("lifecycle.after_commit_before_reply:drop:1")
    answer = await pair.cs.AttemptCompletion(attempt_request("task", claim), timeout=T)
    pair.lifecycle.disarm()
    assert answer.decision.verdict == completion_enums.VERDICT_ALLOW
    assert pair.lifecycle.faults_fired() == 1, "the lifecycle reply to the settlement was not dropped"
    # Committed; the lifecycle committed too but its answer never came, so the
    # settlement is pending (unless the outbox, which retries with the same
    # request id, already got the original answer).
    assert answer.completion.settlement in (
        completion_enums.SETTLEMENT_STATUS_PENDING,
        completion_enums.SETTLEMENT_STATUS_SETTLED,
    )
    final = await settled(pair, "task")
    assert final.completion_id == answer.completion.completion_id
    settled_once(pair, "task", final)
