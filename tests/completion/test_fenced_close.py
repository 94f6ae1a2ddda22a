"""A cancellation requested while a completion was pending ends (issue 21, item 7),
against both real servers on each engine. Under a cancellation fence a generation
can end only CANCELLED, unless its pending completion proves it came first (BRIEF
§3 rules 3 and 4): so when its last run closes and no completion of it can still
settle, the cancellation is settled, never left as an ACTIVE generation with no
run for a host to find. The races of the attack run, ordered by hand:

  allowed attempt committed, settlement unanswered -> cancellation requested ->
  settlement fenced -> CompleteRun (any outcome)            the close settles it
  ... -> cancellation requested -> CompleteRun             the close settles the
                                                            pending completion
                                                            (fenced), then it
  ... -> CompleteRun (settlement unanswered again: SETTLING) -> cancellation
  requested -> the outbox's settlement fenced              the settler settles it
"""

from __future__ import annotations

import pytest

from completion_service.clients.lifecycle_client import LifecycleUnavailable
from funnel.auth.pki import COMPLETION_IDENTITY
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from tests.completion.e2e_support import Funnel, eventually
from tests.completion.test_e2e import commit_while_lifecycle_is_down, settled

CANCELLED = (
    lifecycle_enums.GENERATION_STATE_TERMINAL,
    lifecycle_enums.TERMINAL_OUTCOME_CANCELLED,
    lifecycle_enums.WORK_STATUS_CANCELLED,
)


async def fenced_while_pending(f: Funnel):
    """A committed, allowed completion whose settlement went unanswered, then the
    cancellation request (5 ms later: within the clock offset, so unprovable)."""
    claim, answer = await commit_while_lifecycle_is_down(f)
    await f.start_lifecycle()
    f.clock.advance(5_000)
    await f.request_cancellation("task-1")
    return claim, answer


async def task_state(f: Funnel) -> tuple:
    task = (await f.task("task-1")).task
    return task.state, task.outcome, task.work_status


async def assert_settled_by_the_completion_service(f: Funnel, run_id: str) -> None:
    last = (await f.lifecycle_events("task-1"))[-1]
    assert last.intent == lifecycle_enums.INTENT_SETTLE_CANCELLATION
    assert (last.caller.subject, last.caller.role) == (COMPLETION_IDENTITY, "completion-service")
    assert last.cause.originating_ids["run_id"] == run_id


@pytest.mark.parametrize("outcome", ["SUCCEEDED", "FAILED", "STALLED", "CANCELLED"])
async def test_a_close_after_the_fence_refused_the_completion_settles_the_cancellation(start_funnel, outcome):
    f = await start_funnel()
    claim, answer = await fenced_while_pending(f)
    refused = await settled(f, "task-1")
    assert (refused.settlement, refused.terminalization_error_reason) == (
        completion_enums.SETTLEMENT_STATUS_REJECTED,
        "CANCELLATION_FENCED",
    )
    assert (await task_state(f))[0] == lifecycle_enums.GENERATION_STATE_ACTIVE  # what used to wait for a host forever

    closed = await f.complete_run(claim, outcome=completion_enums.RunOutcome.Value(f"RUN_OUTCOME_{outcome}"))
    assert (closed.task_effect, closed.final_status) == (
        completion_enums.TASK_EFFECT_CANCELLED,
        completion_enums.FINAL_STATUS_CANCELLED,
    )
    assert "cancellation" in closed.task_effect_reason
    assert await task_state(f) == CANCELLED
    assert (await f.get_run(claim.run.run_id)).HasField("finish_time")
    await assert_settled_by_the_completion_service(f, claim.run.run_id)
    assert (await f.completion_of("task-1")).completion_id == answer.completion.completion_id


async def test_a_close_while_the_completion_is_pending_settles_it_first(start_funnel):
    f = await start_funnel()
    claim, _ = await fenced_while_pending(f)
    # The outbox's retry is not due (its backoff runs on the service clock): the close settles it.
    assert (await f.completion_of("task-1")).settlement == completion_enums.SETTLEMENT_STATUS_PENDING

    closed = await f.complete_run(claim)
    assert (closed.task_effect, closed.final_status) == (
        completion_enums.TASK_EFFECT_CANCELLED,
        completion_enums.FINAL_STATUS_CANCELLED,
    )
    assert await task_state(f) == CANCELLED
    completion = await f.completion_of("task-1")
    assert (completion.settlement, completion.terminalization_error_reason) == (
        completion_enums.SETTLEMENT_STATUS_REJECTED,
        "CANCELLATION_FENCED",
    )
    await assert_settled_by_the_completion_service(f, claim.run.run_id)


async def test_a_pending_completion_that_predates_the_fence_still_wins(start_funnel):
    # A 1 ms clock offset: the completion, 5 ms before the fence, proves it came first.
    f = await start_funnel(lifecycle={"max_clock_offset_ms": 1})
    claim, answer = await fenced_while_pending(f)
    closed = await f.complete_run(claim)
    assert (closed.task_effect, closed.final_status) == (
        completion_enums.TASK_EFFECT_DONE,
        completion_enums.FINAL_STATUS_DONE,
    )
    task = (await f.task("task-1")).task
    assert (task.outcome, task.completion_id) == (
        lifecycle_enums.TERMINAL_OUTCOME_COMPLETED,
        answer.completion.completion_id,
    )


def leave_next_settlement_unanswered(f: Funnel) -> None:
    """The next SettleCompletion the completion service sends gets no answer (as a
    lost reply would), once; the lifecycle service never sees it."""
    client = f.completion.authority.lifecycle

    async def unanswered(*args, **kwargs):
        del client.settle_completion  # back to the real method
        raise LifecycleUnavailable("UNAVAILABLE: no answer (the test)")

    client.settle_completion = unanswered


async def test_a_run_closed_while_settling_ends_cancelled_when_the_outbox_meets_the_fence(start_funnel):
    f = await start_funnel()
    claim, _ = await commit_while_lifecycle_is_down(f)
    await f.start_lifecycle()
    leave_next_settlement_unanswered(f)
    closed = await f.complete_run(claim)
    assert closed.task_effect == completion_enums.TASK_EFFECT_SETTLING
    assert (await f.get_run(claim.run.run_id)).HasField("finish_time")

    f.clock.advance(5_000)
    await f.request_cancellation("task-1")
    refused = await settled(f, "task-1")
    assert refused.terminalization_error_reason == "CANCELLATION_FENCED"

    async def ended():
        return await task_state(f) == CANCELLED

    await eventually(ended)
    await assert_settled_by_the_completion_service(f, claim.run.run_id)


async def test_a_fence_with_another_live_holder_waits_for_that_holders_close(start_funnel):
    f = await start_funnel()
    await f.register("task-1")
    stale = await f.claim("task-1", ttl_seconds=1)
    f.clock.advance(2_000_000)
    holder = await f.claim("task-1", agent="agent-2", ttl_seconds=3600)
    await f.request_cancellation("task-1")

    closed = await f.complete_run(stale, outcome=completion_enums.RUN_OUTCOME_STALLED)
    assert closed.task_effect == completion_enums.TASK_EFFECT_UNCHANGED
    assert holder.run.run_id in closed.task_effect_reason
    assert (await task_state(f))[0] == lifecycle_enums.GENERATION_STATE_ACTIVE

    closed = await f.complete_run(holder, outcome=completion_enums.RUN_OUTCOME_SUCCEEDED)
    assert closed.task_effect == completion_enums.TASK_EFFECT_CANCELLED
    assert await task_state(f) == CANCELLED
    await assert_settled_by_the_completion_service(f, holder.run.run_id)
