"""The answers an agent can act on (issue 10): a completion the lifecycle service
refuses is never answered with REPORT_COMPLETE, in the attempt's decision, the
completion event or CompleteRun; a refusal that passes (open children) lets a
later attempt complete; every block carries structured details; CompleteRun
says whether it ended the task."""

from __future__ import annotations

from completion_service.clients.lifecycle_client import LifecycleUnavailable
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.runtime.grpc_errors import error_info
from tests.completion.e2e_support import CALL_TIMEOUT, WS, Code, Funnel, kinds, rejected

REPORT = completion_enums.AGENT_ACTION_REPORT_COMPLETE


def before_next_settlement(f: Funnel, step) -> None:
    """Runs `step()` right before the completion service submits its next
    settlement, once: the race a real lifecycle change would win."""
    client = f.completion.authority.lifecycle
    original = client.settle_completion

    async def racing(*args, **kwargs):
        del client.settle_completion  # back to the real method
        await step()
        return await original(*args, **kwargs)

    client.settle_completion = racing


async def settle_child(f: Funnel, task_id: str) -> None:
    for intent, request in (
        ("RequestCancellation", lifecycle_messages.RequestCancellationRequest),
        ("SettleCancellation", lifecycle_messages.SettleCancellationRequest),
    ):
        await getattr(f.lc, intent)(request(workspace_id=WS, task_id=task_id, generation=1), timeout=CALL_TIMEOUT)


async def test_a_refusal_for_open_children_says_wait_and_a_later_attempt_completes(funnel):
    f = funnel
    claim = await f.registered_and_claimed("parent", ttl_seconds=3600)
    before_next_settlement(f, lambda: f.register("child", parent="parent"))
    refused = await f.attempt(claim)
    assert refused.completion.settlement == completion_enums.SETTLEMENT_STATUS_REJECTED
    assert refused.completion.terminalization_error_reason == "ACTIVE_ATTACHED_CHILD"
    decision = refused.decision
    assert (decision.verdict, decision.next_action) == (
        completion_enums.VERDICT_SOFT_BLOCK,
        completion_enums.AGENT_ACTION_WAIT_FOR_CHILDREN,
    )
    assert REPORT in decision.forbidden_actions and "ACTIVE_ATTACHED_CHILD" in decision.instruction
    assert (decision.details.decisive_gate, decision.details.lifecycle_reason) == (
        "lifecycle.settlement",
        "ACTIVE_ATTACHED_CHILD",
    )
    assert [t.gate_id for t in decision.trace if t.decisive] == ["lifecycle.settlement"]
    # The completion event tells the same.
    events = await f.completion_events(task_id="parent")
    assert kinds(events) == ["RUN_CLAIMED", "COMPLETION_COMMITTED", "TERMINALIZATION_ERROR"]
    assert events[-1].decision.next_action == completion_enums.AGENT_ACTION_WAIT_FOR_CHILDREN
    # Once the child is terminal, a new attempt completes: the refused completion gives way.
    await settle_child(f, "child")
    done = await f.attempt(claim)
    assert done.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    assert done.completion.completion_id != refused.completion.completion_id
    assert (done.decision.verdict, done.decision.next_action) == (completion_enums.VERDICT_ALLOW, REPORT)
    assert (await f.task("parent")).task.completion_id == done.completion.completion_id
    assert kinds(await f.completion_events(task_id="parent")) == [
        "RUN_CLAIMED",
        "COMPLETION_COMMITTED",
        "TERMINALIZATION_ERROR",
        "COMPLETION_COMMITTED",
        "COMPLETION_SETTLED",
    ]


async def test_a_refusal_after_a_cancellation_says_stop_for_good(start_funnel):
    f = await start_funnel(lifecycle={"max_clock_offset_ms": 60_000})  # the completion cannot prove it came first
    claim = await f.registered_and_claimed("task-1", ttl_seconds=3600)
    before_next_settlement(f, lambda: f.request_cancellation("task-1"))
    refused = await f.attempt(claim)
    decision = refused.decision
    assert refused.completion.terminalization_error_reason == "CANCELLATION_FENCED"
    assert (decision.verdict, decision.next_action) == (
        completion_enums.VERDICT_HARD_BLOCK,
        completion_enums.AGENT_ACTION_STOP_AND_REPORT,
    )
    assert {REPORT, completion_enums.AGENT_ACTION_ATTEMPT_COMPLETION} <= set(decision.forbidden_actions)
    assert "cancellation" in decision.instruction
    # Not transient: another attempt stops too (at the cancellation gate now), and
    # the refused completion stays the generation's.
    again = await f.attempt(claim, request_id="again")
    assert again.decision.next_action == completion_enums.AGENT_ACTION_STOP_AND_REPORT
    assert not again.HasField("completion")
    assert (await f.completion_of("task-1")).completion_id == refused.completion.completion_id


async def test_complete_run_reports_a_refused_settlement_as_an_error_with_the_next_action(funnel):
    f = funnel
    claim = await f.registered_and_claimed("parent", ttl_seconds=3600)
    before_next_settlement(f, lambda: f.register("child", parent="parent"))
    error = await rejected(
        f.complete_run(claim, notes="done"),
        Code.FAILED_PRECONDITION,
        "LIFECYCLE_REJECTED",
        metadata={"lifecycle_reason", "next_action", "run_id", "completion_id"},
    )
    metadata = error_info(error).metadata
    assert (metadata["lifecycle_reason"], metadata["next_action"]) == ("ACTIVE_ATTACHED_CHILD", "WAIT_FOR_CHILDREN")
    assert not (await f.get_run(claim.run.run_id)).HasField("finish_time")  # the run stays open
    await settle_child(f, "child")
    closed = await f.complete_run(claim, notes="done")
    assert (closed.final_status, closed.task_effect) == (
        completion_enums.FINAL_STATUS_DONE,
        completion_enums.TASK_EFFECT_DONE,
    )


async def test_a_pending_settlement_is_not_to_be_reported_yet(start_funnel):
    # The outbox settler stays out of the way (it would settle the row, due since its
    # commit, with the real method if it ran between the commit and the postponement).
    f = await start_funnel(completion={"settle_interval": 3600.0})
    claim = await f.registered_and_claimed("task-1", ttl_seconds=3600)
    client = f.completion.authority.lifecycle
    original = client.settle_completion

    async def unanswered(*args, **kwargs):
        del client.settle_completion
        raise LifecycleUnavailable("DEADLINE_EXCEEDED: no answer in time")

    client.settle_completion = unanswered
    closed = await f.complete_run(claim, notes="done")
    assert closed.completion.settlement == completion_enums.SETTLEMENT_STATUS_PENDING
    assert closed.task_effect == completion_enums.TASK_EFFECT_SETTLING and "not settled" in closed.task_effect_reason
    assert closed.final_status == completion_enums.FINAL_STATUS_IN_PROGRESS
    assert closed.decision.next_action == completion_enums.AGENT_ACTION_RETRY_LATER
    assert original is not None


async def test_complete_run_says_what_it_did_to_the_task(strict_funnel):
    f = strict_funnel
    cases = [
        (
            dict(outcome=completion_enums.RUN_OUTCOME_SUCCEEDED),
            completion_enums.TASK_EFFECT_BLOCKED,
            completion_enums.FINAL_STATUS_IN_PROGRESS,
        ),
        (
            dict(outcome=completion_enums.RUN_OUTCOME_FAILED),
            completion_enums.TASK_EFFECT_STATUS_SET,
            completion_enums.FINAL_STATUS_BLOCKED,
        ),
        (
            dict(outcome=completion_enums.RUN_OUTCOME_STALLED),
            completion_enums.TASK_EFFECT_UNCHANGED,
            completion_enums.FINAL_STATUS_IN_PROGRESS,
        ),
        (
            dict(outcome=completion_enums.RUN_OUTCOME_CANCELLED),
            completion_enums.TASK_EFFECT_CANCELLED,
            completion_enums.FINAL_STATUS_CANCELLED,
        ),
    ]
    for index, (close, effect, status) in enumerate(cases):
        claim = await f.registered_and_claimed(f"task-{index}")
        closed = await f.complete_run(claim, notes="done", **close)
        assert (closed.task_effect, closed.final_status) == (effect, status), close
        assert closed.task_effect_reason
    # Blocked by the gates: the reason is the decision's instruction, naming what is missing.
    claim = await f.registered_and_claimed("task-blocked")
    closed = await f.complete_run(claim, notes="done")
    assert closed.task_effect_reason == closed.decision.instruction
    assert list(closed.decision.details.missing_evidence_kinds) == ["tests"]
    # And the whole story ends DONE.
    claim = await f.registered_and_claimed("task-done")
    await f.evidence(claim)
    closed = await f.complete_run(claim, notes="done")
    assert (closed.task_effect, closed.final_status) == (
        completion_enums.TASK_EFFECT_DONE,
        completion_enums.FINAL_STATUS_DONE,
    )


async def test_block_details_reach_the_client(strict_funnel):
    f = strict_funnel
    claim = await f.registered_and_claimed("task-1")
    blocked = await f.attempt(claim)
    details = blocked.decision.details
    assert details.decisive_gate == "evidence.required"
    assert list(details.missing_evidence_kinds) == ["tests"] and details.HasField("evidence_checkpoint")
    assert details.evidence_checkpoint == ""
    # A superseded lease names the lease that superseded it.
    f.clock.advance(61 * 1_000_000)
    newer = await f.claim("task-1", agent="agent-2")
    stale = await f.attempt(claim)
    assert stale.decision.details.decisive_gate == "lease.live"
    assert (stale.decision.details.current_lease.run_id, stale.decision.details.current_lease.epoch) == (
        newer.run.run_id,
        newer.lease.epoch,
    )
    # Events carry the same details.
    events = await f.completion_events(task_id="task-1")
    assert kinds(events)[:2] == ["RUN_CLAIMED", "DECISION_BLOCKED"]
    assert events[1].decision.details == blocked.decision.details
    assert (
        await f.cs.GetRun(
            completion_messages.GetRunRequest(workspace_id=WS, run_id=claim.run.run_id), timeout=CALL_TIMEOUT
        )
    ).run


async def test_completion_events_can_be_listed_with_the_watch_cursor(strict_funnel):
    f = strict_funnel
    claim = await f.registered_and_claimed("task-1")
    for _ in range(3):
        await f.attempt(claim, result=f"try {_}")
    await f.evidence(claim)
    await f.attempt(claim)
    listed, cursor = [], 0
    while True:
        page = await f.cs.ListCompletionEvents(
            completion_messages.ListCompletionEventsRequest(workspace_id=WS, after_sequence=cursor, page_size=2),
            timeout=CALL_TIMEOUT,
        )
        listed += list(page.events)
        if not page.has_more:
            break
        cursor = page.events[-1].sequence
    assert kinds(listed) == ["RUN_CLAIMED"] + ["DECISION_BLOCKED"] * 3 + [
        "EVIDENCE_RECORDED",
        "COMPLETION_COMMITTED",
        "COMPLETION_SETTLED",
    ]
    # The same cursor resumes the watch: nothing before it, everything after it.
    watch = f.cs.WatchCompletionEvents(
        completion_messages.WatchCompletionEventsRequest(workspace_id=WS, after_sequence=listed[2].sequence),
        timeout=CALL_TIMEOUT,
    )
    resumed = [(await watch.read()).event for _ in listed[3:]]
    watch.cancel()
    assert resumed == listed[3:]
    one_task = await f.cs.ListCompletionEvents(
        completion_messages.ListCompletionEventsRequest(workspace_id=WS, task_id="other"), timeout=CALL_TIMEOUT
    )
    assert (list(one_task.events), one_task.has_more) == ([], False)
