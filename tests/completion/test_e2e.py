"""End to end over gRPC with both real servers (port 0, SQLite files, one manual
clock): the whole story, claims and leases, cancellation fences with and without
proof of order, settlement through an outage exactly once, attached children,
external gates, the circuit breaker, failure outcomes, the event stream,
`CompleteRun` (seed 001 `complete_task`), the stall sweeper and request-id replay."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from completion_service.api.convert import lease_to_proto, run_to_proto
from completion_service.units.runs import ClaimCommand
from funnel.auth.pki import COMPLETION_IDENTITY
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import gate_messages_pb2 as gate_messages
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.runtime.grpc_errors import error_info
from funnel.runtime.idempotency import RequestKey, fingerprint
from tests.completion.e2e_support import (
    CALL_TIMEOUT,
    OTHER_WS,
    WS,
    Code,
    Funnel,
    damage,
    decisive_gate,
    eventually,
    gate,
    kinds,
    micros,
    rejected,
    stop_lifecycle_during_next_settlement,
    table_dump,
)

SECOND = 1_000_000


async def settled(f: Funnel, task_id: str, *, generation: int = 1, advance: int = SECOND, timeout: float = 10.0):
    """Waits (moving the service clock, so that the outbox settler's backoff elapses)
    until the completion of the task generation is no longer pending."""

    async def done():
        completion = await f.completion_of(task_id, generation)
        return completion if completion.settlement != completion_enums.SETTLEMENT_STATUS_PENDING else None

    return await eventually(done, clock=f.clock, advance_micros=advance, timeout=timeout)


# -- the story ------------------------------------------------------------------


async def test_the_full_story(strict_funnel):
    f = strict_funnel
    registered = await f.register("task-1")
    assert (registered.generation, registered.state, registered.work_status) == (
        1,
        lifecycle_enums.GENERATION_STATE_REGISTERED,
        lifecycle_enums.WORK_STATUS_READY,
    )

    claim = await f.claim("task-1")
    task = (await f.task("task-1")).task
    assert (task.state, task.work_status) == (
        lifecycle_enums.GENERATION_STATE_ACTIVE,
        lifecycle_enums.WORK_STATUS_IN_PROGRESS,
    )

    blocked = await f.attempt(claim)
    assert blocked.decision.verdict == completion_enums.VERDICT_SOFT_BLOCK
    assert blocked.decision.next_action == completion_enums.AGENT_ACTION_RECORD_EVIDENCE
    assert completion_enums.AGENT_ACTION_REPORT_COMPLETE in blocked.decision.forbidden_actions
    assert decisive_gate(blocked.decision).gate_id == "evidence.required"
    assert "tests" in blocked.decision.instruction
    assert not blocked.HasField("completion")
    await rejected(f.completion_of("task-1"), Code.NOT_FOUND, "COMPLETION_NOT_FOUND")
    assert (
        await f.task("task-1")
    ).task.state == lifecycle_enums.GENERATION_STATE_ACTIVE  # a block changes no lifecycle state

    evidence = await f.evidence(claim)
    assert (evidence.kind, evidence.verdict, evidence.generation) == (
        "tests",
        completion_enums.EVIDENCE_VERDICT_PASSED,
        1,
    )

    allowed = await f.attempt(claim)
    assert allowed.decision.verdict == completion_enums.VERDICT_ALLOW
    assert allowed.decision.next_action == completion_enums.AGENT_ACTION_REPORT_COMPLETE
    assert all(
        g.status in (completion_enums.GATE_STATUS_PASSED, completion_enums.GATE_STATUS_SKIPPED)
        for g in allowed.decision.trace
    )
    completion = allowed.completion
    assert completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED and not allowed.existing_completion
    assert completion.identity.startswith("sha256:") and len(completion.identity) == 7 + 64
    assert (completion.run_id, completion.outcome, completion.result) == (
        claim.run.run_id,
        completion_enums.REQUESTED_OUTCOME_COMPLETED,
        "Implemented the change; all tests pass.",
    )
    assert await f.completion_of("task-1") == completion

    events = await f.lifecycle_events("task-1")
    terminal = [e for e in events if e.to_state == lifecycle_enums.GENERATION_STATE_TERMINAL]
    assert len(terminal) == 1
    [event] = terminal
    assert (event.intent, event.outcome, event.completion_id, event.generation) == (
        lifecycle_enums.INTENT_SETTLE_COMPLETION,
        lifecycle_enums.TERMINAL_OUTCOME_COMPLETED,
        completion.completion_id,
        1,
    )
    assert (event.revision, event.sequence) == (completion.lifecycle_revision, completion.lifecycle_event_sequence)
    assert event.authoritative_time == completion.commit_time
    task = (await f.task("task-1")).task
    assert (task.state, task.outcome, task.work_status, task.completion_id) == (
        lifecycle_enums.GENERATION_STATE_TERMINAL,
        lifecycle_enums.TERMINAL_OUTCOME_COMPLETED,
        lifecycle_enums.WORK_STATUS_DONE,
        completion.completion_id,
    )

    closed = await f.complete_run(
        claim, tokens_input=1200, tokens_output=300, tokens_total=1500, notes="Implemented the change; all tests pass."
    )
    assert (closed.run_id, closed.final_status, closed.tokens_total) == (
        claim.run.run_id,
        completion_enums.FINAL_STATUS_DONE,
        1500,
    )
    assert closed.completion.completion_id == completion.completion_id
    assert (await f.completion_of("task-1")).completion_id == completion.completion_id  # no second completion

    assert kinds(await f.completion_events(task_id="task-1")) == [
        "RUN_CLAIMED",
        "DECISION_BLOCKED",
        "EVIDENCE_RECORDED",
        "COMPLETION_COMMITTED",
        "COMPLETION_SETTLED",
        "RUN_CLOSED",
    ]


async def test_claim_activates_a_registered_generation_and_sets_in_progress(funnel):
    f = funnel
    await f.register("task-1")
    claim = await f.claim("task-1", agent="claude-cli@host-7", ttl_seconds=90)
    run, lease = claim.run, claim.lease
    assert (run.workspace_id, run.task_id, run.agent_id, run.generation, run.epoch) == (
        WS,
        "task-1",
        "claude-cli@host-7",
        1,
        1,
    )
    assert (lease.task_id, lease.run_id, lease.epoch) == ("task-1", run.run_id, 1)
    assert micros(lease.expire_time) == micros(run.claim_time) + 90 * SECOND == f.clock.now_micros() + 90 * SECOND
    assert not run.HasField("finish_time") and run.outcome == completion_enums.RUN_OUTCOME_UNSPECIFIED

    task = (await f.task("task-1")).task
    assert (task.state, task.work_status) == (
        lifecycle_enums.GENERATION_STATE_ACTIVE,
        lifecycle_enums.WORK_STATUS_IN_PROGRESS,
    )
    activation = (await f.lifecycle_events("task-1"))[-1]
    assert activation.intent == lifecycle_enums.INTENT_ACTIVATE_GENERATION
    assert activation.cause.source == "completion_service"
    assert activation.cause.originating_ids["run_id"] == run.run_id
    assert await f.get_run(run.run_id) == run


async def test_a_second_claim_on_an_active_task_sets_in_progress_again(funnel):
    f = funnel
    first = await f.registered_and_claimed("task-1", ttl_seconds=5)
    await f.complete_run(first, outcome=completion_enums.RUN_OUTCOME_FAILED)  # -> BLOCKED
    assert (await f.task("task-1")).task.work_status == lifecycle_enums.WORK_STATUS_BLOCKED
    second = await f.claim("task-1", agent="agent-2")
    assert second.lease.epoch == 2
    assert (await f.task("task-1")).task.work_status == lifecycle_enums.WORK_STATUS_IN_PROGRESS


async def test_lease_held_renew_and_expiry(funnel):
    f = funnel
    holder = await f.registered_and_claimed("task-1", ttl_seconds=10)
    await rejected(
        f.claim("task-1", agent="agent-2"),
        Code.FAILED_PRECONDITION,
        "LEASE_HELD",
        metadata={"holder_run_id", "lease_expire_time"},
    )
    error = await rejected(f.claim("task-1", agent="agent-2"), Code.FAILED_PRECONDITION, "LEASE_HELD")
    assert error_info(error).metadata["holder_run_id"] == holder.run.run_id

    f.clock.advance(8 * SECOND)
    renewed = await f.cs.RenewLease(
        completion_messages.RenewLeaseRequest(
            workspace_id=WS, run_id=holder.run.run_id, epoch=1, lease_ttl=Duration(seconds=30)
        ),
        timeout=CALL_TIMEOUT,
    )
    assert micros(renewed.lease.expire_time) == f.clock.now_micros() + 30 * SECOND
    assert renewed.lease.epoch == 1 and renewed.lease.run_id == holder.run.run_id
    assert micros((await f.get_run(holder.run.run_id)).lease_expire_time) == micros(renewed.lease.expire_time)

    f.clock.advance(20 * SECOND)  # past the original expiry, within the renewed one
    await rejected(f.claim("task-1", agent="agent-2"), Code.FAILED_PRECONDITION, "LEASE_HELD")

    f.clock.advance(11 * SECOND)
    await rejected(
        f.cs.RenewLease(
            completion_messages.RenewLeaseRequest(
                workspace_id=WS, run_id=holder.run.run_id, epoch=1, lease_ttl=Duration(seconds=30)
            ),
            timeout=CALL_TIMEOUT,
        ),
        Code.FAILED_PRECONDITION,
        "LEASE_EXPIRED",
    )
    taker = await f.claim("task-1", agent="agent-2")
    assert taker.lease.epoch == 2
    await rejected(
        f.cs.RenewLease(
            completion_messages.RenewLeaseRequest(
                workspace_id=WS, run_id=holder.run.run_id, epoch=1, lease_ttl=Duration(seconds=30)
            ),
            timeout=CALL_TIMEOUT,
        ),
        Code.FAILED_PRECONDITION,
        "LEASE_NOT_CURRENT",
    )
    stale = await f.attempt(holder)
    assert stale.decision.verdict == completion_enums.VERDICT_HARD_BLOCK
    assert decisive_gate(stale.decision).gate_id == "lease.live"


async def test_claims_on_terminal_or_cancelled_tasks_are_refused_and_change_nothing(funnel):
    f = funnel
    await f.register("cancelled")
    await f.request_cancellation("cancelled")
    done = await f.registered_and_claimed("done")
    assert (await f.attempt(done)).completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    before = await f.visible_state()
    events = len(await f.lifecycle_events("cancelled"))
    await rejected(f.claim("cancelled"), Code.FAILED_PRECONDITION, "CANCELLATION_REQUESTED")
    await rejected(
        f.claim("done", agent="agent-3"),
        Code.FAILED_PRECONDITION,
        "GENERATION_TERMINAL",
        metadata={"generation", "outcome"},
    )
    assert await f.visible_state() == before
    assert len(await f.lifecycle_events("cancelled")) == events


# -- cancellation fences -----------------------------------------------------------


async def test_cancellation_requested_before_the_attempt_hard_blocks_and_commits_nothing(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    await f.request_cancellation("task-1")
    await f.projection_caught_up()  # the attempt's view reflects the request (else the lifecycle fences it)
    lifecycle_before = await f.lifecycle_events("task-1")

    blocked = await f.attempt(claim)
    assert blocked.decision.verdict == completion_enums.VERDICT_HARD_BLOCK
    assert blocked.decision.next_action == completion_enums.AGENT_ACTION_STOP_AND_REPORT
    assert decisive_gate(blocked.decision).gate_id == "lifecycle.no_cancellation"
    assert not blocked.HasField("completion")
    # A FAILED outcome cannot pass the fence either.
    failed = await f.attempt(claim, outcome=completion_enums.REQUESTED_OUTCOME_FAILED, result="gave up")
    assert decisive_gate(failed.decision).gate_id == "lifecycle.no_cancellation"

    await rejected(f.completion_of("task-1"), Code.NOT_FOUND, "COMPLETION_NOT_FOUND")
    assert (
        await f.cs.ListCompletions(completion_messages.ListCompletionsRequest(workspace_id=WS), timeout=CALL_TIMEOUT)
    ).completions == []
    assert await f.lifecycle_events("task-1") == lifecycle_before
    task = (await f.task("task-1")).task
    assert (task.state, task.cancellation) == (
        lifecycle_enums.GENERATION_STATE_ACTIVE,
        lifecycle_enums.CANCELLATION_STATE_REQUESTED,
    )
    assert kinds(await f.completion_events(task_id="task-1")) == ["RUN_CLAIMED", "DECISION_BLOCKED", "DECISION_BLOCKED"]


async def commit_while_lifecycle_is_down(f: Funnel, task_id: str = "task-1"):
    """Claims, then attempts while the lifecycle server goes down between the
    completion commit and its settlement. Returns (claim, answer)."""
    claim = await f.registered_and_claimed(task_id, ttl_seconds=3600)
    stop_lifecycle_during_next_settlement(f)
    answer = await f.attempt(claim)
    assert f.lifecycle is None, "the lifecycle server was not stopped"
    # Committed, settlement pending: the client is told so.
    assert answer.decision.verdict == completion_enums.VERDICT_ALLOW
    assert answer.completion.settlement == completion_enums.SETTLEMENT_STATUS_PENDING
    assert answer.completion.lifecycle_revision == 0 and not answer.completion.HasField("settle_time")
    return claim, answer


async def test_completion_committed_then_cancellation_requested_then_settled_completes_with_proof(start_funnel):
    # Proof of order: authoritative_time + 1 ms < cancellation_request_time.
    f = await start_funnel(lifecycle={"max_clock_offset_ms": 1})
    _, answer = await commit_while_lifecycle_is_down(f)
    committed_at = micros(answer.completion.commit_time)

    await f.start_lifecycle()  # same port, same database
    # The settler's retry is not due yet (its backoff is measured on the service
    # clock): the cancellation request commits first, 5 ms after the completion.
    f.clock.advance(5_000)
    cancelled = await f.request_cancellation("task-1")
    requested_at = micros(cancelled.task.cancellation_request_time)
    assert requested_at == committed_at + 5_000

    completion = await settled(f, "task-1")
    assert completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    assert completion.terminalization_error_reason == ""
    task = (await f.task("task-1")).task
    assert (task.state, task.outcome, task.work_status, task.completion_id) == (
        lifecycle_enums.GENERATION_STATE_TERMINAL,
        lifecycle_enums.TERMINAL_OUTCOME_COMPLETED,
        lifecycle_enums.WORK_STATUS_DONE,
        completion.completion_id,
    )
    [settlement] = [
        e for e in await f.lifecycle_events("task-1") if e.intent == lifecycle_enums.INTENT_SETTLE_COMPLETION
    ]
    assert micros(settlement.authoritative_time) == committed_at
    assert settlement.sequence == completion.lifecycle_event_sequence
    assert kinds(await f.completion_events(task_id="task-1")) == [
        "RUN_CLAIMED",
        "COMPLETION_COMMITTED",
        "COMPLETION_SETTLED",
    ]


async def test_completion_whose_order_against_the_cancellation_is_unprovable_is_fenced(start_funnel):
    # A 60 s clock offset: a completion 5 ms before the fence proves nothing.
    f = await start_funnel(lifecycle={"max_clock_offset_ms": 60_000})
    _, answer = await commit_while_lifecycle_is_down(f)

    await f.start_lifecycle()
    f.clock.advance(5_000)
    await f.request_cancellation("task-1")

    completion = await settled(f, "task-1")
    assert completion.completion_id == answer.completion.completion_id
    assert completion.settlement == completion_enums.SETTLEMENT_STATUS_REJECTED
    assert completion.terminalization_error_reason == "CANCELLATION_FENCED"
    assert completion.terminalization_error_message
    assert completion.lifecycle_revision == 0

    events = await f.completion_events(task_id="task-1")
    assert kinds(events) == ["RUN_CLAIMED", "COMPLETION_COMMITTED", "TERMINALIZATION_ERROR"]
    assert events[-1].error_reason == "CANCELLATION_FENCED"
    assert events[-1].completion_id == completion.completion_id
    task = (await f.task("task-1")).task
    assert (task.state, task.cancellation, task.completion_id) == (
        lifecycle_enums.GENERATION_STATE_ACTIVE,
        lifecycle_enums.CANCELLATION_STATE_REQUESTED,
        "",
    )
    assert not [e for e in await f.lifecycle_events("task-1") if e.intent == lifecycle_enums.INTENT_SETTLE_COMPLETION]
    assert counted(f.completion.authority, "funnel_completion_settlements_total", {"status": "REJECTED"}) == 1
    # Never retried once rejected, and a repeated attempt does not revive it.
    f.clock.advance(60 * SECOND)
    assert await f.completion.authority.settler.settle_due() == 0
    assert (await f.completion_of("task-1")).settlement == completion_enums.SETTLEMENT_STATUS_REJECTED


async def test_lifecycle_down_after_the_commit_settles_exactly_once_after_restart(funnel):
    f = funnel
    claim, answer = await commit_while_lifecycle_is_down(f)
    completion_id = answer.completion.completion_id
    assert (await f.completion_of("task-1")).settlement == completion_enums.SETTLEMENT_STATUS_PENDING

    # While the lifecycle is down the settler keeps retrying (with backoff) and
    # nothing terminal is published.
    await settler_retried(f, times=2)
    assert kinds(await f.completion_events(task_id="task-1")) == ["RUN_CLAIMED", "COMPLETION_COMMITTED"]
    assert (await f.completion_of("task-1")).settlement == completion_enums.SETTLEMENT_STATUS_PENDING

    await f.start_lifecycle()  # same port, same database
    completion = await settled(f, "task-1")
    assert (
        completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
        and completion.completion_id == completion_id
    )

    # One more pass of the settler, with every retry due: nothing is settled twice.
    f.clock.advance(60 * SECOND)
    assert await f.completion.authority.settler.settle_due() == 0
    lifecycle = await f.lifecycle_events("task-1")
    assert [e.intent for e in lifecycle].count(lifecycle_enums.INTENT_SETTLE_COMPLETION) == 1
    assert [e.completion_id for e in lifecycle if e.to_state == lifecycle_enums.GENERATION_STATE_TERMINAL] == [
        completion_id
    ]
    events = await f.completion_events(task_id="task-1")
    assert kinds(events) == ["RUN_CLAIMED", "COMPLETION_COMMITTED", "COMPLETION_SETTLED"]
    assert events[-1].lifecycle_event_sequence == completion.lifecycle_event_sequence
    assert counted(f.completion.authority, "funnel_completion_settlements_total", {"status": "SETTLED"}) == 1

    # A repeated attempt settles nothing again.
    again = await f.attempt(claim)
    assert again.decision.verdict == completion_enums.VERDICT_HARD_BLOCK  # the generation is terminal now
    assert decisive_gate(again.decision).gate_id == "lifecycle.generation_current"
    assert [e.intent for e in await f.lifecycle_events("task-1")].count(lifecycle_enums.INTENT_SETTLE_COMPLETION) == 1


async def _true(value: bool) -> bool:
    return value


async def settler_retried(f: Funnel, times: int) -> None:
    """Until the settler has retried `times` more settlements, the clock moving a
    second each round so that its backoff elapses."""
    retries = counted(f.completion.authority, "funnel_completion_settlement_retries_total", None)
    await eventually(
        lambda: _true(
            counted(f.completion.authority, "funnel_completion_settlement_retries_total", None) >= retries + times
        ),
        clock=f.clock,
        advance_micros=SECOND,
    )


async def test_the_outbox_shows_a_pending_settlement_with_its_attempts_next_time_and_error(funnel):
    f = funnel
    _, answer = await commit_while_lifecycle_is_down(f)
    completion_id = answer.completion.completion_id

    async def outbox() -> list[completion_types.Completion]:
        listed = await f.cs.ListCompletions(
            completion_messages.ListCompletionsRequest(
                workspace_id=WS, settlement=completion_enums.SETTLEMENT_STATUS_PENDING
            ),
            timeout=CALL_TIMEOUT,
        )
        return list(listed.completions)

    async def retried_twice():
        completion = await f.completion_of("task-1")
        return completion if completion.settle_attempts >= 2 else None

    pending = await eventually(retried_twice, clock=f.clock, advance_micros=SECOND)
    assert pending.settlement == completion_enums.SETTLEMENT_STATUS_PENDING
    # The next call is after the last one failed, never before the commit.
    assert micros(pending.next_settle_time) > micros(pending.commit_time)
    assert "UNAVAILABLE" in pending.last_settle_error or "DEADLINE_EXCEEDED" in pending.last_settle_error
    assert not pending.HasField("settle_time")
    [listed] = await outbox()
    assert listed.completion_id == completion_id and listed.settle_attempts >= 2 and listed.last_settle_error

    await f.start_lifecycle()  # same port, same database
    completion = await settled(f, "task-1")
    assert completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    # The answered call counts; nothing is due and no error stands any more.
    assert completion.settle_attempts >= 3
    assert not completion.HasField("next_settle_time") and completion.last_settle_error == ""
    assert await outbox() == []
    settled_only = await f.cs.ListCompletions(
        completion_messages.ListCompletionsRequest(
            workspace_id=WS, settlement=completion_enums.SETTLEMENT_STATUS_SETTLED
        ),
        timeout=CALL_TIMEOUT,
    )
    assert [c.completion_id for c in settled_only.completions] == [completion_id]


async def test_a_repeated_attempt_returns_the_pending_completion_and_settles_it(funnel):
    f = funnel
    claim, answer = await commit_while_lifecycle_is_down(f)
    await f.start_lifecycle()  # the service clock stands still: the outbox retry is not due yet
    again = await f.attempt(claim, result="said again")
    assert again.decision.verdict == completion_enums.VERDICT_ALLOW and again.existing_completion
    assert again.completion.completion_id == answer.completion.completion_id
    assert again.completion.result == answer.completion.result  # the stored row, not this attempt's
    assert again.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    assert [e.intent for e in await f.lifecycle_events("task-1")].count(lifecycle_enums.INTENT_SETTLE_COMPLETION) == 1
    assert kinds(await f.completion_events(task_id="task-1")) == [
        "RUN_CLAIMED",
        "COMPLETION_COMMITTED",
        "COMPLETION_SETTLED",
    ]


async def test_a_corrupted_completion_fails_closed_with_an_alarm(funnel, caplog):
    f = funnel
    claim, answer = await commit_while_lifecycle_is_down(f)
    await f.start_lifecycle()
    damage(
        f.completion_db,
        "UPDATE task_completions SET payload = ? WHERE completion_id = ?",
        (b"{}", answer.completion.completion_id),
    )
    before = table_dump(f.completion_db)
    with caplog.at_level(logging.ERROR, logger="completion_service"):
        error = await rejected(f.attempt(claim), Code.DATA_LOSS, "COMPLETION_CORRUPTED", metadata={"completion_id"})
    assert error_info(error).metadata["completion_id"] == answer.completion.completion_id
    assert counted(f.completion.authority, "funnel_completion_corruptions_total", None) == 1
    assert [
        r for r in caplog.records if r.levelno == logging.ERROR and answer.completion.completion_id in r.getMessage()
    ]
    assert table_dump(f.completion_db) == before
    assert (await f.task("task-1")).task.state == lifecycle_enums.GENERATION_STATE_ACTIVE


async def test_an_attempt_while_the_lifecycle_is_unreachable_commits_nothing(start_funnel):
    # Without the lifecycle projection nothing says what the task is (with it, see
    # test_projection_e2e: the attempt is judged on what the projection last saw).
    f = await start_funnel(completion={"projected_workspaces": 0})
    claim = await f.registered_and_claimed("task-1")
    await f.stop_lifecycle()
    await rejected(f.attempt(claim), Code.UNAVAILABLE, "LIFECYCLE_UNAVAILABLE")
    await rejected(f.claim("task-1", agent="agent-2"), Code.UNAVAILABLE, "LIFECYCLE_UNAVAILABLE")
    assert (
        await f.cs.ListCompletions(completion_messages.ListCompletionsRequest(workspace_id=WS), timeout=CALL_TIMEOUT)
    ).completions == []
    assert (
        len((await f.cs.ListRuns(completion_messages.ListRunsRequest(workspace_id=WS), timeout=CALL_TIMEOUT)).runs) == 1
    )
    assert kinds(await f.completion_events(quiet=0.1)) == ["RUN_CLAIMED"]  # the first claim's only


# -- children, gates, breaker, failure -------------------------------------------------


async def test_an_attached_active_child_blocks_the_parent_until_it_is_terminal(funnel):
    f = funnel
    parent = await f.registered_and_claimed("parent")
    await f.register("child", parent="parent", parent_generation=1, mode=lifecycle_enums.PARENT_LINK_MODE_ATTACHED)
    assert list((await f.task("parent")).open_attached_child_task_ids) == ["child"]
    await f.projection_caught_up()

    blocked = await f.attempt(parent)
    assert blocked.decision.verdict == completion_enums.VERDICT_SOFT_BLOCK
    assert blocked.decision.next_action == completion_enums.AGENT_ACTION_WAIT_FOR_CHILDREN
    assert decisive_gate(blocked.decision).gate_id == "lifecycle.no_active_children"
    assert "child" in gate(blocked.decision, "lifecycle.no_active_children").reason
    assert not blocked.HasField("completion")
    assert (await f.task("parent")).task.state == lifecycle_enums.GENERATION_STATE_ACTIVE

    child = await f.claim("child", agent="agent-child")
    assert (await f.attempt(child)).completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    allowed = await f.attempt(parent)
    assert allowed.decision.verdict == completion_enums.VERDICT_ALLOW
    assert allowed.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED


async def test_a_detached_child_does_not_block_the_parent(funnel):
    f = funnel
    parent = await f.registered_and_claimed("parent")
    await f.register("child", parent="parent", mode=lifecycle_enums.PARENT_LINK_MODE_DETACHED)
    assert (await f.attempt(parent)).decision.verdict == completion_enums.VERDICT_ALLOW


def external_gate_policy(address: str, timeout_ms: int = 1000, **workspace) -> dict:
    return {
        "workspaces": {
            WS: {"external_gates": [{"id": "acme.review", "address": address, "timeout_ms": timeout_ms}], **workspace}
        }
    }


async def test_an_external_gate_that_times_out_blocks(start_funnel, gate_server):
    async def slow(request, context):
        await asyncio.sleep(2)
        return gate_messages.EvaluateGateResponse(status=completion_enums.GATE_STATUS_PASSED)

    address, calls = await gate_server(slow)
    f = await start_funnel(policy=external_gate_policy(address, timeout_ms=100))
    claim = await f.registered_and_claimed("task-1")
    blocked = await f.attempt(claim)
    assert len(calls) == 1
    assert blocked.decision.verdict == completion_enums.VERDICT_SOFT_BLOCK
    assert blocked.decision.next_action == completion_enums.AGENT_ACTION_RETRY_LATER
    external = decisive_gate(blocked.decision)
    assert (external.gate_id, external.status) == ("acme.review", completion_enums.GATE_STATUS_FAILED)
    assert "DEADLINE_EXCEEDED" in external.reason
    assert not blocked.HasField("completion")
    await rejected(f.completion_of("task-1"), Code.NOT_FOUND, "COMPLETION_NOT_FOUND")
    assert (await f.task("task-1")).task.state == lifecycle_enums.GENERATION_STATE_ACTIVE


async def test_an_unreachable_external_gate_blocks(start_funnel):
    # Port 1: nobody listens there.
    f = await start_funnel(policy=external_gate_policy("127.0.0.1:1", timeout_ms=500))
    claim = await f.registered_and_claimed("task-1")
    blocked = await f.attempt(claim)
    assert blocked.decision.next_action == completion_enums.AGENT_ACTION_RETRY_LATER
    assert decisive_gate(blocked.decision).gate_id == "acme.review"
    assert not blocked.HasField("completion")


async def test_an_external_gate_that_passes_allows_and_sees_the_snapshot(start_funnel, gate_server):
    async def approve(request, context):
        return gate_messages.EvaluateGateResponse(status=completion_enums.GATE_STATUS_PASSED, reason="reviewed by acme")

    address, calls = await gate_server(approve)
    f = await start_funnel(policy=external_gate_policy(address, required_evidence=["tests"]))
    claim = await f.registered_and_claimed("task-1")

    blocked = await f.attempt(claim)  # a built-in gate blocks first: the external one is not called
    assert decisive_gate(blocked.decision).gate_id == "evidence.required"
    assert gate(blocked.decision, "acme.review").status == completion_enums.GATE_STATUS_SKIPPED
    assert calls == []

    await f.evidence(claim)
    allowed = await f.attempt(claim)
    assert allowed.decision.verdict == completion_enums.VERDICT_ALLOW
    external = gate(allowed.decision, "acme.review")
    assert (external.status, external.reason) == (completion_enums.GATE_STATUS_PASSED, "reviewed by acme")
    assert allowed.decision.trace[-1].gate_id == "acme.review"  # after every built-in gate
    assert allowed.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    [request] = calls
    assert (request.gate_id, request.workspace_id, request.task_id, request.generation, request.run_id) == (
        "acme.review",
        WS,
        "task-1",
        1,
        claim.run.run_id,
    )
    assert (request.outcome, request.result) == (
        completion_enums.REQUESTED_OUTCOME_COMPLETED,
        "Implemented the change; all tests pass.",
    )
    assert [(e.kind, e.verdict) for e in request.evidence] == [("tests", completion_enums.EVIDENCE_VERDICT_PASSED)]


@pytest.mark.parametrize(
    "status, action",
    [
        (completion_enums.GATE_STATUS_FAILED, completion_enums.AGENT_ACTION_ADDRESS_GATE_FEEDBACK),
        (completion_enums.GATE_STATUS_UNSPECIFIED, completion_enums.AGENT_ACTION_RETRY_LATER),
        (completion_enums.GATE_STATUS_SKIPPED, completion_enums.AGENT_ACTION_RETRY_LATER),
    ],
)
async def test_an_external_gate_that_fails_or_answers_nonsense_blocks(start_funnel, gate_server, status, action):
    async def judge(request, context):
        return gate_messages.EvaluateGateResponse(status=status, reason="add a changelog entry")

    address, _ = await gate_server(judge)
    f = await start_funnel(policy=external_gate_policy(address))
    claim = await f.registered_and_claimed("task-1")
    blocked = await f.attempt(claim)
    assert blocked.decision.verdict == completion_enums.VERDICT_SOFT_BLOCK
    assert blocked.decision.next_action == action
    external = decisive_gate(blocked.decision)
    assert (external.gate_id, external.status) == ("acme.review", completion_enums.GATE_STATUS_FAILED)
    if status == completion_enums.GATE_STATUS_FAILED:
        assert "add a changelog entry" in blocked.decision.instruction
    assert not blocked.HasField("completion")


async def test_an_external_gate_that_errors_blocks(start_funnel, gate_server):
    async def broken(request, context):
        raise RuntimeError("gate bug")

    address, _ = await gate_server(broken)
    f = await start_funnel(policy=external_gate_policy(address))
    blocked = await f.attempt(await f.registered_and_claimed("task-1"))
    assert blocked.decision.next_action == completion_enums.AGENT_ACTION_RETRY_LATER
    assert decisive_gate(blocked.decision).gate_id == "acme.review"


async def test_the_circuit_breaker_hard_blocks_repeated_blocked_attempts(start_funnel):
    f = await start_funnel(policy={"workspaces": {WS: {"required_evidence": ["tests"], "breaker_threshold": 2}}})
    claim = await f.registered_and_claimed("task-1")
    for _ in range(2):
        soft = await f.attempt(claim, result="done, trust me")
        assert decisive_gate(soft.decision).gate_id == "evidence.required"
    await f.evidence(claim)

    tripped = await f.attempt(claim, result="done, trust me")
    assert tripped.decision.verdict == completion_enums.VERDICT_HARD_BLOCK
    assert tripped.decision.next_action == completion_enums.AGENT_ACTION_STOP_AND_REPORT
    assert decisive_gate(tripped.decision).gate_id == "completion.circuit_breaker"
    assert not tripped.HasField("completion")
    assert kinds(await f.completion_events(task_id="task-1")) == [
        "RUN_CLAIMED",
        "DECISION_BLOCKED",
        "DECISION_BLOCKED",
        "EVIDENCE_RECORDED",
        "DECISION_BLOCKED",
    ]

    # The breaker counts repeats of the same result: a new result is judged afresh.
    fresh = await f.attempt(claim, result="tests pass at the current checkpoint")
    assert fresh.decision.verdict == completion_enums.VERDICT_ALLOW


async def test_a_failed_outcome_settles_with_settle_failure(strict_funnel):
    f = strict_funnel
    claim = await f.registered_and_claimed("task-1")
    answer = await f.attempt(claim, outcome=completion_enums.REQUESTED_OUTCOME_FAILED, result="the API is gone")
    assert answer.decision.verdict == completion_enums.VERDICT_ALLOW
    assert (
        gate(answer.decision, "evidence.required").status == completion_enums.GATE_STATUS_SKIPPED
    )  # no evidence for failures
    completion = answer.completion
    assert (completion.outcome, completion.settlement) == (
        completion_enums.REQUESTED_OUTCOME_FAILED,
        completion_enums.SETTLEMENT_STATUS_SETTLED,
    )
    task = (await f.task("task-1")).task
    assert (task.state, task.outcome, task.work_status) == (
        lifecycle_enums.GENERATION_STATE_TERMINAL,
        lifecycle_enums.TERMINAL_OUTCOME_FAILED,
        lifecycle_enums.WORK_STATUS_BLOCKED,
    )
    [event] = [e for e in await f.lifecycle_events("task-1") if e.to_state == lifecycle_enums.GENERATION_STATE_TERMINAL]
    assert (event.intent, event.sequence) == (
        lifecycle_enums.INTENT_SETTLE_FAILURE,
        completion.lifecycle_event_sequence,
    )
    events = await f.completion_events(task_id="task-1")
    assert kinds(events) == ["RUN_CLAIMED", "COMPLETION_COMMITTED", "COMPLETION_SETTLED"]
    assert events[-1].outcome == completion_enums.REQUESTED_OUTCOME_FAILED


# -- the event stream --------------------------------------------------------------


class Follower:
    """Reads a watch stream in the background, so that waiting with a timeout never
    cancels the stream itself."""

    def __init__(self, call) -> None:
        self.call = call
        self._queue: asyncio.Queue = asyncio.Queue()
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for item in self.call:
            await self._queue.put(item.event)

    async def next(self, n: int, timeout: float = 5.0) -> list[completion_types.CompletionEvent]:
        return [await asyncio.wait_for(self._queue.get(), timeout=timeout) for _ in range(n)]

    async def close(self) -> None:
        self.call.cancel()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await self._reader


def follow(f: Funnel, **request) -> Follower:
    return Follower(f.cs.WatchCompletionEvents(completion_messages.WatchCompletionEventsRequest(**request)))


async def test_watch_streams_backlog_then_live_and_resumes_from_a_cursor(strict_funnel):
    f = strict_funnel
    claim = await f.registered_and_claimed("task-1")  # RUN_CLAIMED (backlog)
    other_ws = await f.registered_and_claimed("task-1", workspace=OTHER_WS)
    await f.attempt(claim)  # DECISION_BLOCKED (backlog)
    await f.attempt(other_ws)  # another workspace: never on this stream

    watch = follow(f, workspace_id=WS)
    filtered = follow(f, workspace_id=WS, task_id="task-2")
    try:
        claimed, backlog = await watch.next(2)
        assert (claimed.kind, claimed.run_id, claimed.generation) == (
            completion_enums.COMPLETION_EVENT_KIND_RUN_CLAIMED,
            claim.run.run_id,
            1,
        )
        assert (backlog.kind, backlog.task_id, backlog.workspace_id) == (
            completion_enums.COMPLETION_EVENT_KIND_DECISION_BLOCKED,
            "task-1",
            WS,
        )
        assert (
            backlog.decision.next_action == completion_enums.AGENT_ACTION_RECORD_EVIDENCE
            and backlog.completion_id == ""
        )

        evidence = await f.evidence(claim)
        allowed = await f.attempt(claim)
        recorded, *live = await watch.next(3)
        assert (recorded.kind, recorded.evidence_id, recorded.run_id) == (
            completion_enums.COMPLETION_EVENT_KIND_EVIDENCE_RECORDED,
            evidence.evidence_id,
            claim.run.run_id,
        )
        assert [e.kind for e in live] == [
            completion_enums.COMPLETION_EVENT_KIND_COMPLETION_COMMITTED,
            completion_enums.COMPLETION_EVENT_KIND_COMPLETION_SETTLED,
        ]
        assert {e.completion_id for e in live} == {allowed.completion.completion_id}
        sequences = [claimed.sequence, backlog.sequence, recorded.sequence] + [e.sequence for e in live]
        assert sequences == sorted(set(sequences))

        # The terminal event names the lifecycle event that made the generation
        # terminal, which was committed before it.
        terminal = live[1]
        [lifecycle_event] = [
            e for e in await f.lifecycle_events("task-1") if e.sequence == terminal.lifecycle_event_sequence
        ]
        assert (lifecycle_event.intent, lifecycle_event.revision) == (
            lifecycle_enums.INTENT_SETTLE_COMPLETION,
            terminal.lifecycle_revision,
        )
        assert micros(lifecycle_event.commit_time) <= micros(terminal.commit_time)

        second = await f.registered_and_claimed("task-2")
        await f.evidence(second)
        await f.attempt(second)
        # Claimed, evidence recorded, committed, settled: only task-2, from the beginning.
        assert {e.task_id for e in await filtered.next(4)} == {"task-2"}
        more = await watch.next(4)
        assert [e.task_id for e in more] == ["task-2"] * 4 and more[0].sequence > terminal.sequence
    finally:
        await watch.close()
        await filtered.close()

    # Resume after a disconnect: exactly what follows the cursor.
    resumed = await f.completion_events(after=live[0].sequence)
    assert [e.sequence for e in resumed] == [live[1].sequence] + [e.sequence for e in more]
    assert resumed[0] == live[1]
    assert kinds(await f.completion_events(workspace=OTHER_WS)) == [
        "RUN_CLAIMED",
        "COMPLETION_COMMITTED",
        "COMPLETION_SETTLED",
    ]


async def test_no_terminal_event_is_published_before_the_lifecycle_commit(funnel):
    f = funnel
    watch = follow(f, workspace_id=WS)
    try:
        _, answer = await commit_while_lifecycle_is_down(f)
        claimed, committed = await watch.next(2)
        assert (claimed.kind, committed.kind) == (
            completion_enums.COMPLETION_EVENT_KIND_RUN_CLAIMED,
            completion_enums.COMPLETION_EVENT_KIND_COMPLETION_COMMITTED,
        )
        # The settler retries against the dead lifecycle, twice: each a chance to publish too early.
        await settler_retried(f, times=2)
        await f.start_lifecycle()
        await settled(f, "task-1")
        # The next event on the stream is the one settlement, as stored: nothing came before it.
        [terminal] = await watch.next(1)
        assert (terminal.kind, terminal.completion_id) == (
            completion_enums.COMPLETION_EVENT_KIND_COMPLETION_SETTLED,
            answer.completion.completion_id,
        )
        assert [claimed, committed, terminal] == await f.completion_events(task_id="task-1")
        assert (await f.task("task-1")).task.state == lifecycle_enums.GENERATION_STATE_TERMINAL
    finally:
        await watch.close()


# -- CompleteRun: seed 001 `complete_task` ------------------------------------------------


async def test_acceptance_a_successful_close_updates_finished_at_outcome_tokens_and_status(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    f.clock.advance(5 * SECOND)
    closed = await f.complete_run(
        claim, tokens_input=1200, tokens_output=300, tokens_total=1500, notes="Implemented the change.", error=""
    )
    finished_at = claim.run.claim_time.seconds + 5
    assert closed.run_id == claim.run.run_id
    assert closed.finish_time.seconds == finished_at
    assert (closed.final_status, closed.tokens_total, closed.notes_truncated) == (
        completion_enums.FINAL_STATUS_DONE,
        1500,
        False,
    )
    assert closed.decision.verdict == completion_enums.VERDICT_ALLOW  # DONE only through a settled completion
    assert closed.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    assert closed.completion.result == "Implemented the change."

    run = await f.get_run(claim.run.run_id)
    assert run.finish_time == closed.finish_time
    assert (run.outcome, run.tokens_input, run.tokens_output, run.tokens_total) == (
        completion_enums.RUN_OUTCOME_SUCCEEDED,
        1200,
        300,
        1500,
    )
    assert (run.notes, run.final_status) == ("Implemented the change.", completion_enums.FINAL_STATUS_DONE)
    task = (await f.task("task-1")).task
    assert (task.state, task.outcome, task.work_status, task.completion_id) == (
        lifecycle_enums.GENERATION_STATE_TERMINAL,
        lifecycle_enums.TERMINAL_OUTCOME_COMPLETED,
        lifecycle_enums.WORK_STATUS_DONE,
        closed.completion.completion_id,
    )
    [entry] = await f.audit(run_id=run.run_id)
    assert (entry.action, entry.task_id, dict(entry.metadata)) == (
        "task.completed",
        "task-1",
        {"outcome": "SUCCEEDED", "final_status": "DONE", "closed_by": "agent"},
    )
    assert entry.record_time == closed.finish_time


async def test_acceptance_double_close_errors_with_run_already_finished(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    first = await f.complete_run(claim, outcome=completion_enums.RUN_OUTCOME_FAILED, error="tests fail")
    before = (await f.visible_state(), await f.lifecycle_events("task-1"))
    for outcome in (completion_enums.RUN_OUTCOME_FAILED, completion_enums.RUN_OUTCOME_SUCCEEDED):
        error = await rejected(
            f.complete_run(claim, outcome=outcome),
            Code.FAILED_PRECONDITION,
            "RUN_ALREADY_FINISHED",
            metadata={"run_id", "finish_time"},
        )
        assert error_info(error).metadata["run_id"] == claim.run.run_id
    assert (await f.visible_state(), await f.lifecycle_events("task-1")) == before
    assert (await f.get_run(claim.run.run_id)).finish_time == first.finish_time


@pytest.mark.parametrize(
    "tokens, total",
    [
        ({"tokens_input": 100, "tokens_output": 50, "tokens_total": 1000}, 1000),  # inconsistent: the total wins
        ({"tokens_input": 100, "tokens_output": 50, "tokens_total": 0}, 0),
        ({"tokens_input": 100, "tokens_output": 50}, 150),
        ({"tokens_total": 77}, 77),
        ({"tokens_input": 100}, 100),
        ({}, 0),
    ],
)
async def test_acceptance_token_inconsistency_is_resolved_by_preferring_the_reported_total(funnel, tokens, total):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    closed = await f.complete_run(claim, outcome=completion_enums.RUN_OUTCOME_STALLED, **tokens)
    assert closed.tokens_total == total
    run = await f.get_run(claim.run.run_id)
    assert (run.tokens_input, run.tokens_output, run.tokens_total) == (
        tokens.get("tokens_input", 0),
        tokens.get("tokens_output", 0),
        total,
    )


async def test_notes_longer_than_2000_characters_are_cut_and_the_response_says_so(funnel):
    f = funnel
    long_notes = "".join(chr(0x41 + i % 26) for i in range(2500))
    claim = await f.registered_and_claimed("task-1")
    closed = await f.complete_run(claim, outcome=completion_enums.RUN_OUTCOME_FAILED, notes=long_notes)
    assert closed.notes_truncated
    run = await f.get_run(claim.run.run_id)
    assert (run.notes, run.notes_truncated) == (long_notes[:2000], True)

    exact = await f.registered_and_claimed("task-2")
    closed = await f.complete_run(exact, outcome=completion_enums.RUN_OUTCOME_FAILED, notes="é" * 2000)
    assert not closed.notes_truncated
    assert (await f.get_run(exact.run.run_id)).notes == "é" * 2000


async def test_a_successful_close_with_long_notes_uses_the_cut_notes_as_the_result(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    closed = await f.complete_run(claim, notes="r" * 3000)
    assert closed.notes_truncated and closed.completion.result == "r" * 2000


async def test_a_failed_close_sets_blocked(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    closed = await f.complete_run(claim, outcome=completion_enums.RUN_OUTCOME_FAILED, error="the build is broken")
    assert closed.final_status == completion_enums.FINAL_STATUS_BLOCKED
    task = (await f.task("task-1")).task
    assert (task.state, task.work_status) == (
        lifecycle_enums.GENERATION_STATE_ACTIVE,
        lifecycle_enums.WORK_STATUS_BLOCKED,
    )
    run = await f.get_run(claim.run.run_id)
    assert (run.outcome, run.error, run.final_status) == (
        completion_enums.RUN_OUTCOME_FAILED,
        "the build is broken",
        completion_enums.FINAL_STATUS_BLOCKED,
    )
    [entry] = await f.audit(task_id="task-1")
    assert dict(entry.metadata) == {"outcome": "FAILED", "final_status": "BLOCKED", "closed_by": "agent"}
    assert (entry.caller.subject, entry.caller.role) == (COMPLETION_IDENTITY, "operator")
    assert not closed.HasField("decision") and not closed.HasField("completion")


@pytest.mark.parametrize(
    "outcome",
    [completion_enums.RUN_OUTCOME_FAILED, completion_enums.RUN_OUTCOME_STALLED, completion_enums.RUN_OUTCOME_SUCCEEDED],
)
async def test_a_close_under_a_cancellation_fence_settles_the_cancellation(funnel, outcome):
    # Under the fence no status can be set and no completion passes: the close of
    # the last run is the end of the work, so it settles the cancellation (it used
    # to refuse a FAILED close and leave a STALLED one ACTIVE with no run).
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    await f.request_cancellation("task-1")
    closed = await f.complete_run(claim, outcome=outcome)
    assert (closed.task_effect, closed.final_status) == (
        completion_enums.TASK_EFFECT_CANCELLED,
        completion_enums.FINAL_STATUS_CANCELLED,
    )
    task = (await f.task("task-1")).task
    assert (task.state, task.outcome) == (
        lifecycle_enums.GENERATION_STATE_TERMINAL,
        lifecycle_enums.TERMINAL_OUTCOME_CANCELLED,
    )
    [entry] = await f.audit(task_id="task-1")
    assert dict(entry.metadata)["final_status"] == "CANCELLED"
    events = await f.lifecycle_events("task-1")
    assert [e.intent for e in events][-2:] == [
        lifecycle_enums.INTENT_REQUEST_CANCELLATION,
        lifecycle_enums.INTENT_SETTLE_CANCELLATION,
    ]
    assert events[-1].request_id == f"{claim.run.run_id}:fence-settle"


async def test_notes_of_exactly_the_request_limit_are_accepted_and_cut(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    closed = await f.complete_run(claim, outcome=completion_enums.RUN_OUTCOME_STALLED, notes="n" * (1024 * 1024))
    assert closed.notes_truncated
    assert (await f.get_run(claim.run.run_id)).notes == "n" * 2000


async def test_a_cancelled_close_requests_and_settles_cancellation(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    closed = await f.complete_run(claim, outcome=completion_enums.RUN_OUTCOME_CANCELLED)
    assert closed.final_status == completion_enums.FINAL_STATUS_CANCELLED
    task = (await f.task("task-1")).task
    assert (task.state, task.outcome, task.work_status) == (
        lifecycle_enums.GENERATION_STATE_TERMINAL,
        lifecycle_enums.TERMINAL_OUTCOME_CANCELLED,
        lifecycle_enums.WORK_STATUS_CANCELLED,
    )
    intents = [e.intent for e in await f.lifecycle_events("task-1")]
    assert intents[-2:] == [lifecycle_enums.INTENT_REQUEST_CANCELLATION, lifecycle_enums.INTENT_SETTLE_CANCELLATION]
    [entry] = await f.audit(task_id="task-1")
    assert dict(entry.metadata)["final_status"] == "CANCELLED"


async def test_a_cancelled_close_after_an_operator_cancellation_request_settles_it(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    await f.request_cancellation("task-1")
    closed = await f.complete_run(claim, outcome=completion_enums.RUN_OUTCOME_CANCELLED)
    assert closed.final_status == completion_enums.FINAL_STATUS_CANCELLED
    intents = [e.intent for e in await f.lifecycle_events("task-1")]
    assert (
        intents.count(lifecycle_enums.INTENT_REQUEST_CANCELLATION) == 1
        and intents[-1] == lifecycle_enums.INTENT_SETTLE_CANCELLATION
    )


async def test_a_stalled_close_leaves_the_status_unchanged(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    events = await f.lifecycle_events("task-1")
    closed = await f.complete_run(claim, outcome=completion_enums.RUN_OUTCOME_STALLED)
    assert closed.final_status == completion_enums.FINAL_STATUS_IN_PROGRESS
    assert await f.lifecycle_events("task-1") == events
    [entry] = await f.audit(task_id="task-1")
    assert dict(entry.metadata) == {"outcome": "STALLED", "final_status": "IN_PROGRESS", "closed_by": "agent"}


async def test_an_explicit_final_status_overrides_the_outcome(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    closed = await f.complete_run(
        claim, outcome=completion_enums.RUN_OUTCOME_FAILED, final_status=completion_enums.FINAL_STATUS_READY
    )
    assert closed.final_status == completion_enums.FINAL_STATUS_READY
    assert (await f.task("task-1")).task.work_status == lifecycle_enums.WORK_STATUS_READY


async def test_a_successful_close_that_the_gates_deny_still_closes_and_reports_the_real_status(strict_funnel):
    f = strict_funnel
    claim = await f.registered_and_claimed("task-1")
    closed = await f.complete_run(claim, notes="done, no tests though", tokens_total=10)
    assert closed.final_status == completion_enums.FINAL_STATUS_IN_PROGRESS
    assert closed.decision.verdict == completion_enums.VERDICT_SOFT_BLOCK
    assert closed.decision.next_action == completion_enums.AGENT_ACTION_RECORD_EVIDENCE
    assert not closed.HasField("completion")
    run = await f.get_run(claim.run.run_id)
    assert run.HasField("finish_time") and run.outcome == completion_enums.RUN_OUTCOME_SUCCEEDED
    assert run.final_status == completion_enums.FINAL_STATUS_IN_PROGRESS
    task = (await f.task("task-1")).task
    assert (task.state, task.work_status) == (
        lifecycle_enums.GENERATION_STATE_ACTIVE,
        lifecycle_enums.WORK_STATUS_IN_PROGRESS,
    )
    await rejected(f.completion_of("task-1"), Code.NOT_FOUND, "COMPLETION_NOT_FOUND")
    [entry] = await f.audit(task_id="task-1")
    assert dict(entry.metadata) == {"outcome": "SUCCEEDED", "final_status": "IN_PROGRESS", "closed_by": "agent"}
    assert kinds(await f.completion_events(task_id="task-1")) == ["RUN_CLAIMED", "DECISION_BLOCKED", "RUN_CLOSED"]


async def test_close_while_the_lifecycle_is_unreachable_closes_nothing(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    before = await f.visible_state()
    await f.stop_lifecycle()
    await rejected(
        f.complete_run(claim, outcome=completion_enums.RUN_OUTCOME_FAILED), Code.UNAVAILABLE, "LIFECYCLE_UNAVAILABLE"
    )
    assert await f.visible_state() == before
    assert not (await f.get_run(claim.run.run_id)).HasField("finish_time")


# -- the stall sweeper ------------------------------------------------------------------


async def test_the_stall_sweeper_closes_runs_whose_lease_expired_long_ago(start_funnel):
    f = await start_funnel(completion={"stall_after": 0.5})
    stalled = await f.registered_and_claimed("task-1", ttl_seconds=1)
    live = await f.registered_and_claimed("task-2", ttl_seconds=3600)
    f.clock.advance(1_200_000)  # expired 0.2 s ago: not long enough
    assert await f.completion.authority.sweeper.sweep() == 0  # a pass after the clock moved
    assert not (await f.get_run(stalled.run.run_id)).HasField("finish_time")

    f.clock.advance(500_000)  # expired 0.7 s ago

    async def swept():
        run = await f.get_run(stalled.run.run_id)
        return run if run.HasField("finish_time") else None

    run = await eventually(swept)
    assert run.outcome == completion_enums.RUN_OUTCOME_STALLED and "lease expired" in run.error
    [entry] = await f.audit(run_id=stalled.run.run_id)
    assert (entry.action, dict(entry.metadata)) == (
        "task.completed",
        {"outcome": "STALLED", "final_status": "UNCHANGED", "closed_by": "stall_sweeper"},
    )
    assert not (await f.get_run(live.run.run_id)).HasField("finish_time")
    assert (await f.task("task-1")).task.work_status == lifecycle_enums.WORK_STATUS_IN_PROGRESS
    # The task can be claimed again; an agent's late close of the stalled run is an error.
    assert (await f.claim("task-1", agent="agent-2")).lease.epoch == 2
    await rejected(f.complete_run(stalled), Code.FAILED_PRECONDITION, "RUN_ALREADY_FINISHED")


async def test_without_stall_after_nothing_is_swept(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1", ttl_seconds=1)
    f.clock.advance(3600 * SECOND)
    assert await f.completion.authority.sweeper.sweep() == 0
    assert not (await f.get_run(claim.run.run_id)).HasField("finish_time")


# -- request ids ------------------------------------------------------------------------


async def test_claim_task_request_id_replays_and_rejects_reuse(funnel):
    f = funnel
    await f.register("task-1")
    first = await f.claim("task-1", request_id="claim-1")
    f.clock.advance(SECOND)
    assert await f.claim("task-1", request_id="claim-1") == first
    before = (await f.visible_state(), await f.lifecycle_events("task-1"))
    await rejected(f.claim("task-1", agent="agent-2", request_id="claim-1"), Code.INVALID_ARGUMENT, "REQUEST_ID_REUSED")
    assert (await f.visible_state(), await f.lifecycle_events("task-1")) == before
    assert (
        len((await f.cs.ListRuns(completion_messages.ListRunsRequest(workspace_id=WS), timeout=CALL_TIMEOUT)).runs) == 1
    )


async def test_a_retried_claim_after_the_task_moved_on_returns_the_original_response_and_changes_nothing(funnel):
    # Regression: a retry (lost reply) once re-ran the lifecycle confirmation; a
    # refusal (the generation is terminal now) withdrew the granted claim, closing
    # the agent's open run as CANCELLED, and the retry failed with LIFECYCLE_REJECTED.
    f = funnel
    await f.register("task-1")
    first = await f.claim("task-1", request_id="claim-1")
    assert (await f.attempt(first)).completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    before = (await f.visible_state(), await f.lifecycle_events("task-1"))
    assert await f.claim("task-1", request_id="claim-1") == first
    assert (await f.visible_state(), await f.lifecycle_events("task-1")) == before
    assert not (await f.get_run(first.run.run_id)).HasField("finish_time")
    assert (await f.complete_run(first)).final_status == completion_enums.FINAL_STATUS_DONE

    # A retry after the run closed (FAILED -> BLOCKED) does not flip the status back.
    await f.register("task-2")
    second = await f.claim("task-2", request_id="claim-2")
    await f.complete_run(second, outcome=completion_enums.RUN_OUTCOME_FAILED)
    before = (await f.visible_state(), await f.lifecycle_events("task-2"))
    assert await f.claim("task-2", request_id="claim-2") == second
    assert (await f.visible_state(), await f.lifecycle_events("task-2")) == before
    assert (await f.task("task-2")).task.work_status == lifecycle_enums.WORK_STATUS_BLOCKED


async def test_a_retried_claim_completes_a_confirmation_the_original_call_never_made(funnel):
    """The service died between committing the claim and activating the task: the
    client's retry returns the original response and activates the task."""
    f = funnel
    await f.register("task-1")
    request = completion_messages.ClaimTaskRequest(
        workspace_id=WS, task_id="task-1", agent_id="agent-1", lease_ttl=Duration(seconds=60), request_id="claim-1"
    )
    # What ClaimTask committed before the crash: the run, the lease, the remembered response.
    committed = await f.completion.authority.runs.commit_claim(
        ClaimCommand(
            WS,
            "task-1",
            "agent-1",
            1,
            60 * SECOND,
            "run-before-the-crash",
            RequestKey(
                WS,
                COMPLETION_IDENTITY,
                "ClaimTask",
                "claim-1",
                fingerprint("ClaimTask", request.SerializeToString(deterministic=True)),
            ),
            lambda claimed: completion_messages.ClaimTaskResponse(
                run=run_to_proto(claimed.run), lease=lease_to_proto(claimed.lease)
            ).SerializeToString(),
        )
    )
    assert (await f.task("task-1")).task.state == lifecycle_enums.GENERATION_STATE_REGISTERED

    retried = await f.cs.ClaimTask(request, timeout=CALL_TIMEOUT)
    assert retried.run.run_id == committed.run.run_id and retried.lease.epoch == 1
    task = (await f.task("task-1")).task
    assert (task.state, task.work_status) == (
        lifecycle_enums.GENERATION_STATE_ACTIVE,
        lifecycle_enums.WORK_STATUS_IN_PROGRESS,
    )
    assert await f.cs.ClaimTask(request, timeout=CALL_TIMEOUT) == retried
    assert [e.intent for e in await f.lifecycle_events("task-1")].count(lifecycle_enums.INTENT_ACTIVATE_GENERATION) == 1


async def test_attempt_completion_request_id_replays_the_original_decision(strict_funnel):
    f = strict_funnel
    claim = await f.registered_and_claimed("task-1")
    blocked = await f.attempt(claim, request_id="attempt-1")
    assert await f.attempt(claim, request_id="attempt-1") == blocked
    await f.evidence(claim)
    assert await f.attempt(claim, request_id="attempt-1") == blocked  # the original answer, not a new evaluation
    assert kinds(await f.completion_events(task_id="task-1")) == [
        "RUN_CLAIMED",
        "DECISION_BLOCKED",
        "EVIDENCE_RECORDED",
    ]
    await rejected(f.attempt(claim, result="other", request_id="attempt-1"), Code.INVALID_ARGUMENT, "REQUEST_ID_REUSED")

    allowed = await f.attempt(claim, request_id="attempt-2")
    assert allowed.decision.verdict == completion_enums.VERDICT_ALLOW
    assert await f.attempt(claim, request_id="attempt-2") == allowed
    assert kinds(await f.completion_events(task_id="task-1")) == [
        "RUN_CLAIMED",
        "DECISION_BLOCKED",
        "EVIDENCE_RECORDED",
        "COMPLETION_COMMITTED",
        "COMPLETION_SETTLED",
    ]


async def test_a_replayed_attempt_reports_the_current_settlement(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1", ttl_seconds=3600)
    stop_lifecycle_during_next_settlement(f)
    pending = await f.attempt(claim, request_id="attempt-1")
    assert pending.completion.settlement == completion_enums.SETTLEMENT_STATUS_PENDING
    # Committed but not settled: not to be reported yet; the replay will tell.
    assert (pending.decision.verdict, pending.decision.next_action) == (
        completion_enums.VERDICT_ALLOW,
        completion_enums.AGENT_ACTION_RETRY_LATER,
    )
    assert completion_enums.AGENT_ACTION_REPORT_COMPLETE in pending.decision.forbidden_actions
    await f.start_lifecycle()
    await settled(f, "task-1")
    replay = await f.attempt(claim, request_id="attempt-1")
    assert replay.completion.completion_id == pending.completion.completion_id
    assert replay.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    # Now settled: the gates' decision, to report completion.
    assert replay.decision == replay.completion.decision
    assert (replay.decision.verdict, replay.decision.next_action) == (
        completion_enums.VERDICT_ALLOW,
        completion_enums.AGENT_ACTION_REPORT_COMPLETE,
    )
    assert replay.decision.trace == pending.decision.trace


async def test_complete_run_request_id_replays_instead_of_double_closing(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    first = await f.complete_run(claim, outcome=completion_enums.RUN_OUTCOME_FAILED, notes="n", request_id="close-1")
    f.clock.advance(SECOND)
    assert (
        await f.complete_run(claim, outcome=completion_enums.RUN_OUTCOME_FAILED, notes="n", request_id="close-1")
        == first
    )
    before = (await f.visible_state(), await f.lifecycle_events("task-1"))
    await rejected(
        f.complete_run(claim, outcome=completion_enums.RUN_OUTCOME_FAILED, notes="other", request_id="close-1"),
        Code.INVALID_ARGUMENT,
        "REQUEST_ID_REUSED",
    )
    assert (await f.visible_state(), await f.lifecycle_events("task-1")) == before
    assert len(await f.audit(task_id="task-1")) == 1


async def test_renew_and_evidence_request_ids_replay(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    renew = completion_messages.RenewLeaseRequest(
        workspace_id=WS, run_id=claim.run.run_id, epoch=1, lease_ttl=Duration(seconds=30), request_id="renew-1"
    )
    first = await f.cs.RenewLease(renew, timeout=CALL_TIMEOUT)
    f.clock.advance(10 * SECOND)
    assert await f.cs.RenewLease(renew, timeout=CALL_TIMEOUT) == first  # not extended again
    renew.lease_ttl.seconds = 40
    await rejected(f.cs.RenewLease(renew, timeout=CALL_TIMEOUT), Code.INVALID_ARGUMENT, "REQUEST_ID_REUSED")

    record = completion_messages.RecordEvidenceRequest(
        workspace_id=WS,
        task_id="task-1",
        generation=1,
        kind="tests",
        verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
        request_id="evidence-1",
    )
    evidence = await f.cs.RecordEvidence(record, timeout=CALL_TIMEOUT)
    assert await f.cs.RecordEvidence(record, timeout=CALL_TIMEOUT) == evidence
    record.verdict = completion_enums.EVIDENCE_VERDICT_FAILED
    await rejected(f.cs.RecordEvidence(record, timeout=CALL_TIMEOUT), Code.INVALID_ARGUMENT, "REQUEST_ID_REUSED")


async def test_open_runs_are_listed_alone_and_their_token_is_for_that_listing(funnel):
    f = funnel
    done = await f.registered_and_claimed("task-1")
    await f.complete_run(done, outcome=completion_enums.RUN_OUTCOME_STALLED)
    first = await f.registered_and_claimed("task-2")
    second = await f.registered_and_claimed("task-3")

    def listing(**kw) -> completion_messages.ListRunsRequest:
        return completion_messages.ListRunsRequest(workspace_id=WS, open_only=True, **kw)

    page = await f.cs.ListRuns(listing(page_size=1), timeout=CALL_TIMEOUT)
    rest = await f.cs.ListRuns(listing(page_token=page.next_page_token), timeout=CALL_TIMEOUT)
    assert [r.run_id for r in (*page.runs, *rest.runs)] == [second.run.run_id, first.run.run_id]
    assert not rest.next_page_token
    await rejected(
        f.cs.ListRuns(
            completion_messages.ListRunsRequest(workspace_id=WS, page_token=page.next_page_token), timeout=CALL_TIMEOUT
        ),
        Code.INVALID_ARGUMENT,
        "FIELD_MALFORMED",
    )


async def test_a_tasks_evidence_is_listed_oldest_first_with_who_recorded_it_in_pages(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    recorded = [await f.evidence(claim, kind=kind) for kind in ("tests", "lint", "review")]
    await f.evidence(await f.registered_and_claimed("task-2"))  # another task's

    def page(token: str = "", **kw) -> completion_messages.ListEvidenceRequest:
        return completion_messages.ListEvidenceRequest(
            workspace_id=WS, task_id="task-1", page_size=2, page_token=token, **kw
        )

    first = await f.cs.ListEvidence(page(), timeout=CALL_TIMEOUT)
    second = await f.cs.ListEvidence(page(first.next_page_token), timeout=CALL_TIMEOUT)
    assert [*first.evidence, *second.evidence] == recorded and not second.next_page_token
    assert (recorded[0].recorded_by.subject, recorded[0].recorded_by.role) == (COMPLETION_IDENTITY, "operator")
    assert [e.kind for e in (await f.cs.ListEvidence(page(generation=1), timeout=CALL_TIMEOUT)).evidence] == [
        "tests",
        "lint",
    ]
    assert list((await f.cs.ListEvidence(page(generation=2), timeout=CALL_TIMEOUT)).evidence) == []
    # A token is for its listing only.
    await rejected(
        f.cs.ListEvidence(page(first.next_page_token, generation=1), timeout=CALL_TIMEOUT),
        Code.INVALID_ARGUMENT,
        "FIELD_MALFORMED",
    )


async def test_evidence_naming_an_unknown_run_or_one_of_another_task_is_refused_and_changes_nothing(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    elsewhere = await f.registered_and_claimed("task-2")

    def record(run_id: str, generation: int = 1) -> completion_messages.RecordEvidenceRequest:
        return completion_messages.RecordEvidenceRequest(
            workspace_id=WS,
            task_id="task-1",
            generation=generation,
            kind="tests",
            verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
            run_id=run_id,
            request_id=f"evidence-{run_id}-{generation}",
        )

    before = table_dump(f.completion_db)
    for refused in (record("run-that-never-was"), record(elsewhere.run.run_id), record(claim.run.run_id, 2)):
        error = await rejected(f.cs.RecordEvidence(refused, timeout=CALL_TIMEOUT), Code.NOT_FOUND, "RUN_NOT_FOUND")
        assert error_info(error).metadata["run_id"] == refused.run_id
    assert table_dump(f.completion_db) == before
    # The control: the task's own run of that generation is taken.
    stored = (await f.cs.RecordEvidence(record(claim.run.run_id), timeout=CALL_TIMEOUT)).evidence
    assert (stored.task_id, stored.run_id) == ("task-1", claim.run.run_id)


# -- concurrency --------------------------------------------------------------------------


async def test_concurrent_claims_grant_exactly_one_lease(funnel):
    f = funnel
    await f.register("task-1")
    results = await asyncio.gather(*(f.claim("task-1", agent=f"agent-{i}") for i in range(6)), return_exceptions=True)
    granted = [r for r in results if isinstance(r, completion_messages.ClaimTaskResponse)]
    refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(granted) == 1 and len(refused) == 5, results
    assert {error_info(e).reason for e in refused} == {"LEASE_HELD"}
    runs = (await f.cs.ListRuns(completion_messages.ListRunsRequest(workspace_id=WS), timeout=CALL_TIMEOUT)).runs
    assert [r.run_id for r in runs] == [granted[0].run.run_id]


async def test_concurrent_attempts_commit_and_settle_one_completion_exactly_once(funnel):
    f = funnel
    claim = await f.registered_and_claimed("task-1")
    answers = await asyncio.gather(*(f.attempt(claim, result=f"done #{i}") for i in range(6)))
    allowed = [a for a in answers if a.decision.verdict == completion_enums.VERDICT_ALLOW]
    assert allowed, answers
    assert len({a.completion.completion_id for a in allowed}) == 1
    assert sum(not a.existing_completion for a in allowed) == 1
    # Late attempts may already see the generation terminal: they are blocked, never a second completion.
    for blocked in (a for a in answers if a.decision.verdict != completion_enums.VERDICT_ALLOW):
        assert decisive_gate(blocked.decision).gate_id == "lifecycle.generation_current"
    completion = await settled(f, "task-1")
    assert completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    assert [e.intent for e in await f.lifecycle_events("task-1")].count(lifecycle_enums.INTENT_SETTLE_COMPLETION) == 1
    events = kinds(await f.completion_events(task_id="task-1"))
    assert (events.count("COMPLETION_COMMITTED"), events.count("COMPLETION_SETTLED")) == (1, 1)


# -- listings -------------------------------------------------------------------------------


async def test_listings_page_without_gaps_or_duplicates(funnel):
    f = funnel
    claims = []
    for i in range(5):
        claims.append(await f.registered_and_claimed(f"task-{i}"))
        f.clock.advance(SECOND)
    for claim in claims[:3]:
        await f.attempt(claim)
        await f.complete_run(claim)
        f.clock.advance(SECOND)

    async def pages(method, request_type, items_field, **filters):
        seen, token = [], ""
        while True:
            page = await method(
                request_type(workspace_id=WS, page_size=2, page_token=token, **filters), timeout=CALL_TIMEOUT
            )
            items = list(getattr(page, items_field))
            assert len(items) <= 2
            seen += items
            token = page.next_page_token
            if not token:
                return seen

    runs = await pages(f.cs.ListRuns, completion_messages.ListRunsRequest, "runs")
    assert [r.task_id for r in runs] == [f"task-{i}" for i in reversed(range(5))]  # newest claim first
    assert [
        r.task_id for r in await pages(f.cs.ListRuns, completion_messages.ListRunsRequest, "runs", task_id="task-2")
    ] == ["task-2"]
    completions = await pages(f.cs.ListCompletions, completion_messages.ListCompletionsRequest, "completions")
    assert [c.task_id for c in completions] == ["task-0", "task-1", "task-2"]  # oldest first
    audit = await pages(f.cs.ListAuditLog, completion_messages.ListAuditLogRequest, "entries")
    assert [a.task_id for a in audit] == ["task-0", "task-1", "task-2"]
    assert len({a.audit_id for a in audit}) == 3


def counted(authority, name: str, labels: dict[str, str] | None) -> float:
    """A counter of the authority's metrics (0 before it first counts)."""
    return authority.metrics.registry.get_sample_value(name, labels) or 0.0
