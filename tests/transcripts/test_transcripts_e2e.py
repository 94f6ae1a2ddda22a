"""Transcripts end to end over gRPC with both real servers (port 0, SQLite files,
one manual clock): appends and the state version, grammar rejections, repair of an
interrupted turn on load (once, under 10 concurrent loads), the completion gates
that read the transcript, resume into a new generation with the old one fenced,
ResolveResume, and input validation of every transcript RPC."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.grpc_errors import error_info, field_violations
from tests.completion.e2e_support import CALL_TIMEOUT, WS, Code, decisive_gate, rejected
from tests.transcripts.support import P, a_full_turn, append, body, export_bytes, load, load_all

SECOND = 1_000_000


async def visible(both, task_id: str) -> tuple:
    """What a host can see of a task's transcript and lifecycle, for "nothing changed"
    checks. Use it only where a load has nothing to repair (closed turn or live lease)."""
    task = (await both.f.task(task_id)).task
    page = await load(both.ts, task_id, page_size=1000)
    assert not page.repaired
    return await export_bytes(both.ts, task_id), page.state_version, task.generation, task.state, task.revision


def metadata(error: grpc.aio.AioRpcError) -> dict[str, str]:
    return dict(error_info(error).metadata)


# -- appends and the state version ------------------------------------------------------


async def test_every_accepted_batch_raises_the_state_version_by_one(both):
    await both.f.register("task-1")
    first = await append(both.ts, "task-1", [P.user_message(), P.turn_start("t1")])
    assert (first.state_version, first.first_sequence, first.generation, first.resumed) == (1, 1, 1, False)
    second = await append(both.ts, "task-1", [P.step_start("s1"), P.tool_call("c1"), P.tool_result("c1")])
    assert (second.state_version, second.first_sequence) == (2, 3)
    third = await append(both.ts, "task-1", [P.step_end("s1"), P.turn_end("t1")], expected_state_version=2)
    assert (third.state_version, third.first_sequence) == (3, 6)

    page = await load(both.ts, "task-1")
    assert (page.state_version, page.repaired, page.turn_in_progress, page.next_page_token) == (3, False, False, "")
    assert [body(e) for e in page.events] == [
        "user_message",
        "turn_start",
        "step_start",
        "tool_call",
        "tool_result",
        "step_end",
        "turn_end",
    ]
    assert [e.sequence for e in page.events] == list(range(1, 8))
    assert {(e.generation, e.synthetic) for e in page.events} == {(1, False)}
    assert all(e.HasField("record_time") for e in page.events)
    assert page.events[3].tool_call == P.tool_call("c1").tool_call


async def test_a_stale_expected_state_version_is_aborted_and_appends_nothing(both):
    await both.f.register("task-1")
    assert (await append(both.ts, "task-1", [P.user_message()], expected_state_version=0)).state_version == 1
    await append(both.ts, "task-1", [P.user_message("again")])
    before = await visible(both, "task-1")
    error = await rejected(
        append(both.ts, "task-1", [P.turn_start()], expected_state_version=1), Code.ABORTED, "STATE_VERSION_MISMATCH"
    )
    assert metadata(error) == {"expected": "1", "actual": "2"}
    assert await visible(both, "task-1") == before
    assert (await append(both.ts, "task-1", [P.turn_start()], expected_state_version=2)).state_version == 3


async def test_an_invalid_batch_is_rejected_whole_with_its_index_and_rule(both):
    await both.f.registered_and_claimed("task-1")  # the agent's live lease owns the open turn
    await append(both.ts, "task-1", [P.checkpoint("k1"), P.turn_start("t1"), P.step_start("s1")])
    before = await visible(both, "task-1")
    cases = [
        ([P.tool_call("c1"), P.tool_result("c1"), P.tool_result("c2"), P.step_end("s1")], 2, "RESULT_FOR_UNKNOWN_CALL"),
        ([P.turn_end("t1")], 0, "TURN_END_WITH_OPEN_STEP"),  # the tail of earlier batches counts
        ([P.tool_call("c1"), P.step_end("s1")], 1, "STEP_END_WITH_OPEN_CALLS"),
        ([P.step_end("s1"), P.turn_end("t1"), P.restore("k1"), P.restore("k9")], 3, "UNKNOWN_CHECKPOINT"),
        ([P.step_end("s1"), P.turn_end("t1"), P.turn_end("t1")], 2, "TURN_END_WITHOUT_TURN"),
        ([P.step_end("s1"), P.feedback()], 1, "USER_INPUT_INSIDE_TURN"),
    ]
    for events, index, rule in cases:
        error = await rejected(
            append(both.ts, "task-1", events), Code.FAILED_PRECONDITION, "TRANSCRIPT_GRAMMAR_VIOLATION"
        )
        assert metadata(error) == {"index": str(index), "rule": rule}, events
        assert f"event {index}" in error.details()
        assert await visible(both, "task-1") == before
    # A checkpoint of an earlier batch may be restored once the turn is closed.
    closed = await append(both.ts, "task-1", [P.step_end("s1"), P.turn_end("t1"), P.restore("k1")])
    assert (closed.state_version, closed.first_sequence) == (2, 4)


async def test_pages_follow_tokens_bound_to_their_transcript(both):
    await both.f.register("task-1")
    await both.f.register("task-2")
    await append(both.ts, "task-1", a_full_turn("t1") + a_full_turn("t2"))  # 14 events
    await append(both.ts, "task-2", [P.user_message()])
    pages, token = [], ""
    while True:
        page = await load(both.ts, "task-1", page_size=4, page_token=token)
        pages.append([e.sequence for e in page.events])
        token = page.next_page_token
        if not token:
            break
    assert pages == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14]]
    first = await load(both.ts, "task-1", page_size=4)
    await rejected(
        load(both.ts, "task-2", page_token=first.next_page_token),
        Code.INVALID_ARGUMENT,
        "FIELD_MALFORMED",
        field="page_token",
    )


# -- repair of an interrupted turn ----------------------------------------------------------


async def crashed_mid_turn(both, task_id: str, how: str) -> tuple[int, list[completion_types.SessionEvent]]:
    """agent-1 claims with a 1 s lease, writes half a turn (calls c2 and c3 unanswered,
    step s1 open) and disappears; `how`: its lease expires, or its run is closed.
    Returns the state version and events it left."""
    f = both.f
    claim = await f.registered_and_claimed(task_id, agent="agent-1", ttl_seconds=1)
    await append(both.ts, task_id, [P.user_message(), P.checkpoint("k1")])
    left = await append(
        both.ts,
        task_id,
        [
            P.turn_start("t1"),
            P.assistant_message("working"),
            P.step_start("s1"),
            P.tool_call("c1"),
            P.tool_call("c2"),
            P.tool_result("c1"),
            P.tool_call("c3"),
        ],
    )
    events = await both.ts.LoadTranscript(
        transcript_messages.LoadTranscriptRequest(workspace_id=WS, task_id=task_id), timeout=CALL_TIMEOUT
    )
    assert events.turn_in_progress and not events.repaired  # agent-1 is still alive here
    if how == "lease expired":
        f.clock.advance(2 * SECOND)
    else:
        closed = await f.complete_run(
            claim, outcome=completion_enums.RUN_OUTCOME_FAILED, error="the agent process crashed"
        )
        assert closed.run_id == claim.run.run_id
    return left.state_version, list(events.events)


@pytest.mark.parametrize("how", ["lease expired", "run closed"])
async def test_ten_concurrent_loads_repair_an_interrupted_turn_exactly_once(both, how):
    version, written = await crashed_mid_turn(both, "task-1", how)

    pages = await asyncio.gather(*(load(both.ts, "task-1") for _ in range(10)))

    assert sorted(p.repaired for p in pages) == [False] * 9 + [True]
    assert {p.state_version for p in pages} == {version + 1}
    assert not any(p.turn_in_progress for p in pages)
    events = list(pages[0].events)
    assert all(list(p.events) == events for p in pages)
    # Real work is kept as it was written...
    assert events[: len(written)] == written
    assert not any(e.synthetic for e in written)
    # ...and closed by synthetic events: an error result per unanswered call, the
    # open step's end, the turn's end with reason INTERRUPTED.
    closers = events[len(written) :]
    assert [body(e) for e in closers] == ["tool_result", "tool_result", "step_end", "turn_end"]
    assert all(e.synthetic and e.generation == 1 for e in closers)
    assert [(e.tool_result.call_id, e.tool_result.is_error) for e in closers[:2]] == [("c2", True), ("c3", True)]
    assert all(e.tool_result.content for e in closers[:2])
    assert closers[2].step_end.step_id == "s1"
    assert closers[3].turn_end == completion_types.TurnEnd(
        turn_id="t1", reason=completion_enums.TURN_END_REASON_INTERRUPTED
    )
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))

    again = await load(both.ts, "task-1")
    assert (again.repaired, again.state_version, list(again.events)) == (False, version + 1, events)
    # The repaired transcript is a valid tail: the next turn can start.
    assert (await append(both.ts, "task-1", [P.user_message("go on"), P.turn_start("t2")])).state_version == version + 2


async def test_a_new_claim_closes_the_turn_the_dead_agent_left_open(both):
    version, written = await crashed_mid_turn(both, "task-1", "lease expired")

    await both.f.claim("task-1", agent="agent-2")

    page = await load(both.ts, "task-1")
    assert (page.repaired, page.turn_in_progress, page.state_version) == (False, False, version + 1)
    events = list(page.events)
    assert events[: len(written)] == written
    closers = events[len(written) :]
    assert [body(e) for e in closers] == ["tool_result", "tool_result", "step_end", "turn_end"]
    assert all(e.synthetic for e in closers)
    assert closers[-1].turn_end.reason == completion_enums.TURN_END_REASON_INTERRUPTED
    # agent-2 starts its own turn on a closed transcript.
    assert (await append(both.ts, "task-1", [P.user_message("go on"), P.turn_start("t2")])).state_version == version + 2


async def test_a_turn_owned_by_a_live_lease_is_returned_as_is(both):
    f = both.f
    claim = await f.registered_and_claimed("task-1", ttl_seconds=60)
    written = await append(both.ts, "task-1", [P.turn_start("t1"), P.step_start("s1"), P.tool_call("c1")])
    f.clock.advance(59 * SECOND)
    pages = await asyncio.gather(*(load(both.ts, "task-1") for _ in range(3)))
    for page in pages:
        assert (page.repaired, page.turn_in_progress, page.state_version) == (False, True, written.state_version)
        assert [body(e) for e in page.events] == ["turn_start", "step_start", "tool_call"]
    # A renewed lease still owns it.
    await f.cs.RenewLease(
        completion_messages.RenewLeaseRequest(
            workspace_id=WS, run_id=claim.run.run_id, epoch=claim.lease.epoch, lease_ttl={"seconds": 60}
        ),
        timeout=CALL_TIMEOUT,
    )
    f.clock.advance(30 * SECOND)
    assert (await load(both.ts, "task-1")).turn_in_progress
    # Once it lapses, the next load repairs.
    f.clock.advance(31 * SECOND)
    page = await load(both.ts, "task-1")
    assert (page.repaired, page.turn_in_progress, page.state_version) == (True, False, written.state_version + 1)
    assert [body(e) for e in page.events][-3:] == ["tool_result", "step_end", "turn_end"]


async def test_an_attempt_against_the_pre_repair_state_version_must_refresh(both):
    version, _ = await crashed_mid_turn(both, "task-1", "lease expired")
    assert (await load(both.ts, "task-1")).repaired
    claim = await both.f.claim("task-1", agent="agent-2")

    stale = await both.f.attempt(claim, state_version=version)
    assert (stale.decision.verdict, stale.decision.next_action) == (
        completion_enums.VERDICT_SOFT_BLOCK,
        completion_enums.AGENT_ACTION_REFRESH_STATE,
    )
    assert decisive_gate(stale.decision).gate_id == "transcript.state_version_current"
    assert not stale.HasField("completion")

    current = await both.f.attempt(claim, state_version=version + 1)
    assert current.decision.verdict == completion_enums.VERDICT_ALLOW, current.decision
    assert (current.completion.state_version, current.completion.checkpoint) == (version + 1, "k1")


# -- completion gates over the transcript --------------------------------------------------


async def test_an_open_tool_call_blocks_completion_until_its_result_and_step_end(both):
    f = both.f
    claim = await f.registered_and_claimed("task-1")
    await append(both.ts, "task-1", [P.turn_start("t1"), P.step_start("s1"), P.tool_call("c1")])

    blocked = await f.attempt(claim)
    assert (blocked.decision.verdict, blocked.decision.next_action) == (
        completion_enums.VERDICT_SOFT_BLOCK,
        completion_enums.AGENT_ACTION_RESOLVE_OPEN_TOOL_CALLS,
    )
    assert decisive_gate(blocked.decision).gate_id == "transcript.no_open_work"
    assert "c1" in decisive_gate(blocked.decision).reason
    assert completion_enums.AGENT_ACTION_REPORT_COMPLETE in blocked.decision.forbidden_actions

    await append(both.ts, "task-1", [P.tool_result("c1")])
    still = await f.attempt(claim)  # the step is still open
    assert (still.decision.verdict, still.decision.next_action) == (
        completion_enums.VERDICT_SOFT_BLOCK,
        completion_enums.AGENT_ACTION_RESOLVE_OPEN_TOOL_CALLS,
    )
    assert "s1" in decisive_gate(still.decision).reason

    done = await append(both.ts, "task-1", [P.step_end("s1"), P.assistant_message("done"), P.turn_end("t1")])
    allowed = await f.attempt(claim)
    assert allowed.decision.verdict == completion_enums.VERDICT_ALLOW, allowed.decision
    assert allowed.completion.state_version == done.state_version
    task = (await f.task("task-1")).task
    assert (task.state, task.outcome) == (
        lifecycle_enums.GENERATION_STATE_TERMINAL,
        lifecycle_enums.TERMINAL_OUTCOME_COMPLETED,
    )


# -- resume ----------------------------------------------------------------------------------


async def completed(both, task_id: str) -> tuple[completion_messages.ClaimTaskResponse, completion_types.Completion]:
    """A task whose generation 1 completed at checkpoint k2 (k1 predates it)."""
    claim = await both.f.registered_and_claimed(task_id)
    await append(both.ts, task_id, [P.user_message(), P.checkpoint("k1")])
    await append(both.ts, task_id, a_full_turn("t1") + [P.checkpoint("k2")])
    allowed = await both.f.attempt(claim)
    assert allowed.decision.verdict == completion_enums.VERDICT_ALLOW, allowed.decision
    assert allowed.completion.checkpoint == "k2"
    task = (await both.f.task(task_id)).task
    assert (task.generation, task.state, task.outcome) == (
        1,
        lifecycle_enums.GENERATION_STATE_TERMINAL,
        lifecycle_enums.TERMINAL_OUTCOME_COMPLETED,
    )
    return claim, allowed.completion


async def test_feedback_after_completion_resumes_into_generation_2_and_fences_generation_1(both):
    f = both.f
    claim, completion = await completed(both, "task-1")
    before = await visible(both, "task-1")

    resumed = await append(
        both.ts, "task-1", [P.feedback("the button is still red"), P.turn_start("t2")], request_id="feedback-1"
    )
    assert (resumed.resumed, resumed.generation, resumed.state_version) == (True, 2, before[1] + 1)
    task = (await f.task("task-1")).task
    assert (task.generation, task.state) == (2, lifecycle_enums.GENERATION_STATE_ACTIVE)
    events = await load_all(both.ts, "task-1")
    assert [(body(e), e.generation) for e in events[-3:]] == [
        ("checkpoint", 1),
        ("user_feedback", 2),
        ("turn_start", 2),
    ]
    # Replaying the request answers the same without a generation 3.
    replay = await append(
        both.ts, "task-1", [P.feedback("the button is still red"), P.turn_start("t2")], request_id="feedback-1"
    )
    assert replay == resumed
    assert (await f.task("task-1")).task.generation == 2
    assert (await load(both.ts, "task-1")).state_version == resumed.state_version

    # Callbacks for generation 1 are fenced.
    authoritative_at = Timestamp()
    authoritative_at.FromMicroseconds(f.clock.now_micros())
    late_completion = f.lc.SettleCompletion(
        lifecycle_messages.SettleCompletionRequest(
            workspace_id=WS,
            task_id="task-1",
            generation=1,
            completion_id=completion.completion_id,
            authoritative_time=authoritative_at,
            request_id="late-settle",
        ),
        timeout=CALL_TIMEOUT,
    )
    late_failure = f.lc.SettleFailure(
        lifecycle_messages.SettleFailureRequest(
            workspace_id=WS,
            task_id="task-1",
            generation=1,
            request_id="late-failure",
            cause=lifecycle_types.Cause(source="test", reason="an old callback"),
        ),
        timeout=CALL_TIMEOUT,
    )
    for call in (late_completion, late_failure):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        assert caught.value.code() == Code.FAILED_PRECONDITION
        assert (error_info(caught.value).reason, error_info(caught.value).domain) == (
            "STALE_GENERATION",
            "funnel.lifecycle.v1",
        )
    task = (await f.task("task-1")).task
    assert (task.generation, task.state) == (2, lifecycle_enums.GENERATION_STATE_ACTIVE)
    # The old run cannot complete the new generation either.
    old = await f.attempt(claim)
    assert old.decision.verdict != completion_enums.VERDICT_ALLOW
    assert not old.HasField("completion")


@pytest.mark.parametrize("reopening", [P.resend("try again"), P.restore("k1")], ids=["resend", "earlier restore"])
async def test_a_resend_or_a_restore_to_a_checkpoint_before_the_completions_reopens(both, reopening):
    await completed(both, "task-1")
    resumed = await append(both.ts, "task-1", [reopening])
    assert (resumed.resumed, resumed.generation) == (True, 2)
    assert (await both.f.task("task-1")).task.generation == 2
    last = (await load_all(both.ts, "task-1"))[-1]
    assert (body(last), last.generation) == (body(reopening), 2)


@pytest.mark.parametrize(
    "events",
    [
        [P.assistant_message("one more thing")],
        [P.turn_start("t2")],
        [P.user_message("thanks")],
        [P.checkpoint("k3")],
        [P.restore("k2")],  # the completion's own checkpoint
        [P.user_message("hm"), P.feedback("no")],  # reopening, but not first
        [P.turn_start("t2"), P.turn_end("t2")],
    ],
    ids=["assistant", "turn_start", "user_message", "checkpoint", "restore-own", "feedback-not-first", "turn"],
)
async def test_other_appends_to_a_completed_generation_are_refused(both, events):
    await completed(both, "task-1")
    before = await visible(both, "task-1")
    error = await rejected(append(both.ts, "task-1", events), Code.FAILED_PRECONDITION, "GENERATION_TERMINAL")
    assert metadata(error) == {"generation": "1", "outcome": "TERMINAL_OUTCOME_COMPLETED"}
    assert await visible(both, "task-1") == before


async def test_a_refused_reopening_leaves_the_completed_generation_as_it_was(both):
    """Checks that would refuse the batch come before the move to generation + 1."""
    await completed(both, "task-1")
    before = await visible(both, "task-1")
    error = await rejected(
        append(both.ts, "task-1", [P.feedback()], expected_state_version=before[1] - 1),
        Code.ABORTED,
        "STATE_VERSION_MISMATCH",
    )
    assert metadata(error) == {"expected": str(before[1] - 1), "actual": str(before[1])}
    await rejected(
        append(both.ts, "task-1", [P.feedback(), P.tool_result("c9")]),
        Code.FAILED_PRECONDITION,
        "TRANSCRIPT_GRAMMAR_VIOLATION",
    )
    assert await visible(both, "task-1") == before
    resumed = await append(both.ts, "task-1", [P.feedback()], expected_state_version=before[1])
    assert (resumed.resumed, resumed.generation, resumed.state_version) == (True, 2, before[1] + 1)


async def test_an_ended_generation_takes_no_more_events(both):
    f = both.f
    await f.registered_and_claimed("task-1")
    await append(both.ts, "task-1", [P.user_message(), P.checkpoint("k1")])
    await f.request_cancellation("task-1")
    await f.lc.SettleCancellation(
        lifecycle_messages.SettleCancellationRequest(workspace_id=WS, task_id="task-1", generation=1),
        timeout=CALL_TIMEOUT,
    )
    before = await visible(both, "task-1")
    for events in ([P.feedback()], [P.resend()], [P.restore("k1")], [P.user_message()]):
        error = await rejected(append(both.ts, "task-1", events), Code.FAILED_PRECONDITION, "GENERATION_TERMINAL")
        assert metadata(error)["outcome"] == "TERMINAL_OUTCOME_CANCELLED"
    assert await visible(both, "task-1") == before


# -- ResolveResume ---------------------------------------------------------------------------


async def resolve(both, task_id: str) -> transcript_messages.ResolveResumeResponse:
    return await both.ts.ResolveResume(
        transcript_messages.ResolveResumeRequest(workspace_id=WS, task_id=task_id), timeout=CALL_TIMEOUT
    )


async def test_resolve_resume_offers_what_fits_the_task(both):
    f = both.f
    await f.register("open")
    open_answer = await resolve(both, "open")
    assert (
        open_answer.ask,
        open_answer.primary,
        open_answer.secondary,
        open_answer.generation,
        open_answer.completion_id,
    ) == (
        completion_enums.RESUME_ASK_RESUME_TASK,
        completion_enums.HOST_ACTION_RESUME_TASK,
        completion_enums.HOST_ACTION_UNSPECIFIED,
        1,
        "",
    )
    assert open_answer.reason

    _, completion = await completed(both, "done")
    before = await visible(both, "done")
    done = await resolve(both, "done")
    assert (done.ask, done.primary, done.secondary, done.generation, done.completion_id) == (
        completion_enums.RESUME_ASK_RESUME_COMPLETED_TASK,
        completion_enums.HOST_ACTION_RESUME_TASK,
        completion_enums.HOST_ACTION_NEW_TASK,
        1,
        completion.completion_id,
    )
    assert "generation 2" in done.reason
    assert await visible(both, "done") == before  # a read: nothing moved

    await f.registered_and_claimed("cancelled")
    await f.request_cancellation("cancelled")
    await f.lc.SettleCancellation(
        lifecycle_messages.SettleCancellationRequest(workspace_id=WS, task_id="cancelled", generation=1),
        timeout=CALL_TIMEOUT,
    )
    ended = await resolve(both, "cancelled")
    assert (ended.ask, ended.primary, ended.secondary) == (
        completion_enums.RESUME_ASK_RESUME_ENDED_TASK,
        completion_enums.HOST_ACTION_NEW_TASK,
        completion_enums.HOST_ACTION_UNSPECIFIED,
    )
    assert "CANCELLED" in ended.reason

    await append(both.ts, "done", [P.feedback()])
    reopened = await resolve(both, "done")
    assert (reopened.ask, reopened.primary, reopened.generation, reopened.completion_id) == (
        completion_enums.RESUME_ASK_RESUME_TASK,
        completion_enums.HOST_ACTION_RESUME_TASK,
        2,
        "",
    )


# -- input validation --------------------------------------------------------------------------


def appending(*events: completion_types.SessionEvent, **kw) -> transcript_messages.AppendTranscriptRequest:
    fields = {"workspace_id": WS, "task_id": "task-1", "events": list(events)}
    fields.update(kw)
    return transcript_messages.AppendTranscriptRequest(**fields)


def with_fields(event: completion_types.SessionEvent, **kw) -> completion_types.SessionEvent:
    event = completion_types.SessionEvent.FromString(event.SerializeToString())
    for name, value in kw.items():
        if name == "record_time":
            event.record_time.FromMicroseconds(value)
        else:
            setattr(event, name, value)
    return event


BAD_APPENDS = [
    (appending(P.user_message(), workspace_id=""), "FIELD_REQUIRED", "workspace_id"),
    (appending(P.user_message(), task_id=""), "FIELD_REQUIRED", "task_id"),
    (appending(P.user_message(), task_id="no spaces allowed"), "FIELD_MALFORMED", "task_id"),
    (appending(), "VALUE_OUT_OF_RANGE", "events"),
    (appending(*[P.user_message(f"m{n}") for n in range(1001)]), "VALUE_OUT_OF_RANGE", "events"),
    (appending(P.user_message(), completion_types.SessionEvent()), "FIELD_REQUIRED", "events[1].body"),
    (
        appending(P.user_message(), with_fields(P.user_message(), synthetic=True)),
        "FIELD_MALFORMED",
        "events[1].synthetic",
    ),
    (appending(with_fields(P.user_message(), sequence=1)), "FIELD_MALFORMED", "events[0]"),
    (appending(with_fields(P.user_message(), generation=1)), "FIELD_MALFORMED", "events[0]"),
    (appending(with_fields(P.user_message(), record_time=1)), "FIELD_MALFORMED", "events[0]"),
    (
        appending(P.turn_start("t1"), P.turn_end("t1", reason=completion_enums.TURN_END_REASON_UNSPECIFIED)),
        "ENUM_UNSPECIFIED",
        "events[1].turn_end.reason",
    ),
    (appending(P.turn_start("t1"), P.turn_end("t1", reason=42)), "ENUM_UNSPECIFIED", "events[1].turn_end.reason"),
    (appending(P.turn_start("")), "FIELD_REQUIRED", "events[0].turn_start.turn_id"),
    (appending(P.checkpoint("")), "FIELD_REQUIRED", "events[0].checkpoint.checkpoint_id"),
    (
        appending(P.turn_start("t1"), P.step_start("s1"), P.tool_call("c1", name="")),
        "FIELD_REQUIRED",
        "events[2].tool_call.tool_name",
    ),
    (
        appending(P.turn_start("t1"), P.step_start("s1"), P.tool_call("c1", name="x" * 257)),
        "FIELD_TOO_LONG",
        "events[2].tool_call.tool_name",
    ),
    (
        appending(P.turn_start("t1"), P.step_start("s1"), P.tool_call("c 1")),
        "FIELD_MALFORMED",
        "events[2].tool_call.call_id",
    ),
    (appending(P.user_message("x" * (1024 * 1024 + 1))), "FIELD_TOO_LONG", "events[0].user_message.text"),
    (appending(P.user_message(), expected_state_version=-1), "VALUE_OUT_OF_RANGE", "expected_state_version"),
    (appending(P.user_message(), request_id="bad id"), "FIELD_MALFORMED", "request_id"),
]


@pytest.mark.parametrize("request_, reason, field", BAD_APPENDS, ids=[f"{f}-{r}" for _, r, f in BAD_APPENDS])
async def test_bad_appends_are_invalid_arguments_naming_the_field(both, request_, reason, field):
    await both.f.registered_and_claimed("task-1", ttl_seconds=1)
    await append(both.ts, "task-1", [P.user_message(), P.turn_start("t0"), P.step_start("s0"), P.tool_call("c0")])
    both.f.clock.advance(2 * SECOND)  # a load would repair: a bad request must not
    before = await export_bytes(both.ts, "task-1")
    await rejected(both.ts.AppendTranscript(request_, timeout=CALL_TIMEOUT), Code.INVALID_ARGUMENT, reason, field=field)
    assert await export_bytes(both.ts, "task-1") == before
    page = await load(both.ts, "task-1")
    assert (page.repaired, page.state_version) == (True, 2)  # nothing in between: version 1 + the repair


async def _collect(stream) -> list:
    return [item async for item in stream]


def _import_stream(*messages: transcript_messages.ImportTranscriptRequest):
    async def requests():
        for message in messages:
            yield message

    return requests()


TARGET = transcript_messages.ImportTranscriptRequest(
    target=transcript_messages.ImportTarget(workspace_id=WS, task_id="task-1")
)
CHUNK = transcript_messages.ImportTranscriptRequest(jsonl_chunk=b"")

BAD_READS = [
    ("load", transcript_messages.LoadTranscriptRequest(task_id="task-1"), "FIELD_REQUIRED", "workspace_id"),
    ("load", transcript_messages.LoadTranscriptRequest(workspace_id=WS), "FIELD_REQUIRED", "task_id"),
    (
        "load",
        transcript_messages.LoadTranscriptRequest(workspace_id=WS, task_id="task-1", page_size=1001),
        "VALUE_OUT_OF_RANGE",
        "page_size",
    ),
    (
        "load",
        transcript_messages.LoadTranscriptRequest(workspace_id=WS, task_id="task-1", page_size=-1),
        "VALUE_OUT_OF_RANGE",
        "page_size",
    ),
    (
        "load",
        transcript_messages.LoadTranscriptRequest(workspace_id=WS, task_id="task-1", page_token="not-a-token"),
        "FIELD_MALFORMED",
        "page_token",
    ),
    ("export", transcript_messages.ExportTranscriptRequest(task_id="task-1"), "FIELD_REQUIRED", "workspace_id"),
    (
        "export",
        transcript_messages.ExportTranscriptRequest(workspace_id=WS, task_id="bad id"),
        "FIELD_MALFORMED",
        "task_id",
    ),
    ("import", (CHUNK,), "FIELD_REQUIRED", "target"),
    ("import", (), "FIELD_REQUIRED", "target"),
    (
        "import",
        (transcript_messages.ImportTranscriptRequest(target=transcript_messages.ImportTarget(task_id="task-1")),),
        "FIELD_REQUIRED",
        "target.workspace_id",
    ),
    (
        "import",
        (transcript_messages.ImportTranscriptRequest(target=transcript_messages.ImportTarget(workspace_id=WS)),),
        "FIELD_REQUIRED",
        "target.task_id",
    ),
    ("resolve", transcript_messages.ResolveResumeRequest(task_id="task-1"), "FIELD_REQUIRED", "workspace_id"),
    ("resolve", transcript_messages.ResolveResumeRequest(workspace_id=WS), "FIELD_REQUIRED", "task_id"),
]


@pytest.mark.parametrize(
    "rpc, request_, reason, field", BAD_READS, ids=[f"{rpc}-{f}-{i}" for i, (rpc, _, _, f) in enumerate(BAD_READS)]
)
async def test_bad_input_to_the_other_transcript_rpcs_is_an_invalid_argument_naming_the_field(
    both, rpc, request_, reason, field
):
    await both.f.registered_and_claimed("task-1", ttl_seconds=1)
    await both.f.register("task-2")  # empty: an import into it would succeed
    await append(both.ts, "task-1", [P.turn_start("t0"), P.step_start("s0")])
    both.f.clock.advance(2 * SECOND)
    before = await export_bytes(both.ts, "task-1")
    calls = {
        "load": lambda: both.ts.LoadTranscript(request_, timeout=CALL_TIMEOUT),
        "export": lambda: _collect(both.ts.ExportTranscript(request_, timeout=CALL_TIMEOUT)),
        "import": lambda: both.ts.ImportTranscript(_import_stream(*request_), timeout=CALL_TIMEOUT),
        "resolve": lambda: both.ts.ResolveResume(request_, timeout=CALL_TIMEOUT),
    }
    error = await rejected(calls[rpc](), Code.INVALID_ARGUMENT, reason, field=field)
    assert next(name for name, _ in field_violations(error)) == field
    assert await export_bytes(both.ts, "task-1") == before  # the bad load did not repair
    assert await export_bytes(both.ts, "task-2") == b""
    page = await load(both.ts, "task-1")
    assert (page.repaired, page.state_version) == (True, 2)


async def test_unknown_tasks_are_not_found(both):
    await rejected(append(both.ts, "ghost", [P.user_message()]), Code.NOT_FOUND, "TASK_NOT_FOUND")
    await rejected(resolve(both, "ghost"), Code.NOT_FOUND, "TASK_NOT_FOUND")
    await rejected(
        both.ts.ImportTranscript(
            _import_stream(
                transcript_messages.ImportTranscriptRequest(
                    target=transcript_messages.ImportTarget(workspace_id=WS, task_id="ghost")
                )
            ),
            timeout=CALL_TIMEOUT,
        ),
        Code.NOT_FOUND,
        "TASK_NOT_FOUND",
    )
    await rejected(load(both.ts, "ghost"), Code.NOT_FOUND, "TASK_NOT_FOUND")


@pytest.mark.parametrize("task_id", ["never-registered", "only-in-another-workspace"])
async def test_loading_or_exporting_an_unknown_task_is_not_found(both, task_id):
    await both.f.register("only-in-another-workspace", workspace="ws-2")
    await rejected(load(both.ts, task_id), Code.NOT_FOUND, "TASK_NOT_FOUND")
    await rejected(export_bytes(both.ts, task_id), Code.NOT_FOUND, "TASK_NOT_FOUND")
    # A registered task without a transcript is an empty transcript, not an error.
    await both.f.register(f"{task_id}-here")
    assert list((await load(both.ts, f"{task_id}-here")).events) == []
    assert await export_bytes(both.ts, f"{task_id}-here") == b""
