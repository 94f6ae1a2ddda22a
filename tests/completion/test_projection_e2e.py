"""The completion service's lifecycle projection over real gRPC (issue 13): an
attempt on a task the projection holds is judged without a GetTask; changes made
at the lifecycle service reach it through the event stream; a change it has not
seen yet is fenced by the lifecycle service (a refused settlement, never a wrong
commit); while the stream is down every attempt reads, and it comes back."""

from __future__ import annotations

from completion_service.core.model import LifecycleState
from completion_service.core.projection import Record
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from tests.completion.e2e_support import (
    CALL_TIMEOUT,
    OTHER_WS,
    WS,
    Code,
    Funnel,
    decisive_gate,
    eventually,
    rejected,
)


async def lifecycle_get_tasks(f: Funnel) -> float:
    """GetTask calls the lifecycle service has answered."""
    value = f.lifecycle.metrics.registry.get_sample_value(
        "grpc_server_handled_total",
        {
            "grpc_service": "funnel.lifecycle.v1.TaskLifecycleService",
            "grpc_method": "GetTask",
            "grpc_type": "unary",
            "grpc_code": "OK",
            "reason": "",
        },
    )
    return value or 0.0


async def test_an_attempt_on_a_claimed_task_is_judged_without_reading_the_lifecycle(funnel):
    f = funnel
    await f.projection_live()
    claim = await f.registered_and_claimed("task-1")  # the claim's read fills the projection
    reads, projected = f.views("read"), f.views("projection")
    get_tasks = await lifecycle_get_tasks(f)
    answer = await f.attempt(claim)
    assert answer.decision.verdict == completion_enums.VERDICT_ALLOW
    assert answer.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    assert (f.views("read"), f.views("projection")) == (reads, projected + 1)
    assert await lifecycle_get_tasks(f) == get_tasks
    # The settlement reached the projection: a repeat is not served from it (terminal).
    await f.projection_caught_up()
    assert f.completion.authority.projection.view(WS, "task-1") is None


async def test_a_cancellation_reaches_the_projection_and_the_next_attempt_hard_blocks(funnel):
    f = funnel
    await f.projection_live()
    claim = await f.registered_and_claimed("task-1")
    assert f.completion.authority.projection.view(WS, "task-1") is not None
    await f.request_cancellation("task-1")
    await f.projection_caught_up()
    assert f.completion.authority.projection.view(WS, "task-1") is None
    blocked = await f.attempt(claim)
    assert blocked.decision.verdict == completion_enums.VERDICT_HARD_BLOCK
    assert decisive_gate(blocked.decision).gate_id == "lifecycle.no_cancellation"
    assert not blocked.HasField("completion")


async def test_a_new_attached_child_reaches_the_projection_and_its_end_releases_the_parent(funnel):
    f = funnel
    await f.projection_live()
    parent = await f.registered_and_claimed("parent")
    await f.register("child", parent="parent")
    await f.projection_caught_up()
    assert f.completion.authority.projection.view(WS, "parent") is None
    blocked = await f.attempt(parent)
    assert decisive_gate(blocked.decision).gate_id == "lifecycle.no_active_children"
    child = await f.claim("child", agent="agent-child")
    assert (await f.attempt(child)).completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    # The child's end reaches the projection: the parent is served from it again.
    await f.projection_caught_up()
    assert f.completion.authority.projection.view(WS, "parent") is not None
    projected = f.views("projection")
    allowed = await f.attempt(parent)
    assert allowed.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    assert f.views("projection") == projected + 1


async def test_an_attached_child_resuming_reaches_the_projection_of_its_parent(funnel):
    f = funnel
    await f.projection_live()
    parent = await f.registered_and_claimed("parent")
    await f.register("child", parent="parent")
    child = await f.claim("child", agent="agent-child")
    assert (await f.attempt(child)).completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    await f.complete_run(child)
    await f.projection_caught_up()
    assert f.completion.authority.projection.view(WS, "parent") is not None
    await f.lc.ResumeWithGeneration(
        lifecycle_messages.ResumeWithGenerationRequest(
            workspace_id=WS,
            task_id="child",
            generation=2,
            cause=lifecycle_types.Cause(source="test", reason="new feedback"),
        ),
        timeout=CALL_TIMEOUT,
    )
    # The resume's event names the parent: the projection sees the child open again.
    (resumed,) = [
        e for e in await f.lifecycle_events("child") if e.intent == lifecycle_enums.INTENT_RESUME_WITH_GENERATION
    ]
    assert resumed.parent == lifecycle_types.ParentLink(
        task_id="parent", generation=1, mode=lifecycle_enums.PARENT_LINK_MODE_ATTACHED
    )
    await f.projection_caught_up()
    assert f.completion.authority.projection.view(WS, "parent") is None
    blocked = await f.attempt(parent)
    assert decisive_gate(blocked.decision).gate_id == "lifecycle.no_active_children"


async def test_a_change_the_projection_has_not_seen_is_fenced_by_the_lifecycle_service(funnel, monkeypatch):
    f = funnel
    await f.projection_live()
    claim = await f.registered_and_claimed("task-1")
    # The stream lags: what it delivers from now on is held back.
    stream = f.completion.authority.projection._streams[WS]
    held: list = []
    monkeypatch.setattr(stream.projection, "apply", held.append)
    await f.request_cancellation("task-1")
    await eventually(lambda: _now(bool(held)))

    answer = await f.attempt(claim)
    # Judged on the stale view, committed, and refused by the lifecycle's fence: the
    # agent is told to stop, and the task did not end.
    assert answer.completion.settlement == completion_enums.SETTLEMENT_STATUS_REJECTED
    assert answer.completion.terminalization_error_reason == "CANCELLATION_FENCED"
    assert answer.decision.next_action == completion_enums.AGENT_ACTION_STOP_AND_REPORT
    task = (await f.task("task-1")).task
    assert (task.state, task.cancellation) == (
        lifecycle_enums.GENERATION_STATE_ACTIVE,
        lifecycle_enums.CANCELLATION_STATE_REQUESTED,
    )
    assert not [e for e in await f.lifecycle_events("task-1") if e.intent == lifecycle_enums.INTENT_SETTLE_COMPLETION]


async def test_while_the_stream_is_down_attempts_read_and_the_projection_comes_back(funnel):
    f = funnel
    await f.projection_live()
    await f.stop_lifecycle()
    await eventually(lambda: _now(f.completion_metric("funnel_completion_lifecycle_streams_live") == 0))
    await f.start_lifecycle()
    claim = await f.registered_and_claimed("task-1")
    await f.projection_live()
    answer = await f.attempt(claim)  # read or projected: right either way
    assert answer.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    claim = await f.registered_and_claimed("task-2")
    projected = f.views("projection")
    assert (await f.attempt(claim)).completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    assert f.views("projection") == projected + 1


async def test_a_workspace_asked_about_while_every_stream_is_busy_reads(start_funnel):
    f = await start_funnel(completion={"projected_workspaces": 1})
    await f.projection_live(WS)
    for n in range(2):
        claim = await f.registered_and_claimed(f"task-{n}", workspace=OTHER_WS)
        assert (await f.attempt(claim)).completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    assert f.views("read") == 2 and f.completion.authority.projection.position(OTHER_WS) is None
    assert f.lifecycle.broker.subscriber_count == 1  # WS's stream, still open


async def test_without_projected_workspaces_every_attempt_reads(start_funnel):
    f = await start_funnel(completion={"projected_workspaces": 0})
    claim = await f.registered_and_claimed("task-1")
    answer = await f.attempt(claim)
    assert answer.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    assert f.views("projection") == 0 and f.views("read") == 1
    assert f.completion_metric("funnel_completion_lifecycle_streams_live") == 0
    assert f.lifecycle.broker.subscriber_count == 0


async def _now(value):
    return value


async def test_a_projected_view_behind_the_runs_generation_is_read_again(funnel):
    f = funnel
    await f.projection_live()
    first = await f.registered_and_claimed("task-1")
    assert (await f.attempt(first)).completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    await f.complete_run(first)
    await f.lc.ResumeWithGeneration(
        lifecycle_messages.ResumeWithGenerationRequest(
            workspace_id=WS,
            task_id="task-1",
            generation=2,
            cause=lifecycle_types.Cause(source="test", reason="new feedback"),
        ),
        timeout=CALL_TIMEOUT,
    )
    second = await f.claim("task-1")
    assert second.run.generation == 2
    # The projection still holds generation 1 (as if the resume had not reached it yet).
    projection = f.completion.authority.projection._streams[WS].projection
    projection.end_read(projection.begin_read("task-1"), Record(1, 2, LifecycleState.ACTIVE, None, False))
    reads, projected = f.views("read"), f.views("projection")
    answer = await f.attempt(second)
    assert (
        answer.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED and answer.completion.generation == 2
    )
    assert (f.views("projection"), f.views("read"), f.views("stale")) == (projected, reads, 1)


async def test_while_the_lifecycle_is_down_attempts_are_judged_on_what_the_projection_last_saw(funnel):
    f = funnel
    await f.projection_live()
    claim = await f.registered_and_claimed("task-1")
    # The first claim in a workspace opens its stream: the projection never saw this task.
    unseen = await f.registered_and_claimed("task-2", workspace=OTHER_WS)
    await f.projection_caught_up()
    await f.stop_lifecycle()
    await eventually(lambda: _now(f.completion.authority.projection.position(WS) is None))

    answer = await f.attempt(claim)  # committed; its settlement waits for the lifecycle service
    assert answer.decision.verdict == completion_enums.VERDICT_ALLOW
    assert answer.completion.settlement == completion_enums.SETTLEMENT_STATUS_PENDING
    assert f.views("last_seen") == 1
    await rejected(f.attempt(unseen), Code.UNAVAILABLE, "LIFECYCLE_UNAVAILABLE")

    await f.start_lifecycle()

    async def settled():
        completion = await f.completion_of("task-1")
        return completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED

    await eventually(settled, clock=f.clock, advance_micros=1_000_000)
    assert (await f.task("task-1")).task.state == lifecycle_enums.GENERATION_STATE_TERMINAL
