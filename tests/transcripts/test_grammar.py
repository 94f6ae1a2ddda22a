"""The pure transcript grammar (completion_service.core.transcript): one table row
per rule of the module docstring, with the failing index inside a batch; valid
sequences and the tails they leave; reopening of a completed generation; and the
resume advice table."""

from __future__ import annotations

import re

import pytest

from completion_service.core import transcript as grammar
from completion_service.core.transcript import (
    EventKind,
    HostAction,
    ResumeAsk,
    Tail,
    TurnEndReason,
    Violation,
    reopening,
    resolve_resume,
    validate,
)
from tests.transcripts.support import (
    assistant_message,
    checkpoint,
    feedback,
    resend,
    restore,
    step_end,
    step_start,
    tool_call,
    tool_result,
    turn_end,
    turn_start,
    user_message,
)

OPEN_STEP = [turn_start("t1"), step_start("s1")]
OPEN_CALL = OPEN_STEP + [tool_call("c1")]
CLOSED_TURN = OPEN_CALL + [tool_result("c1"), step_end("s1"), turn_end("t1")]

# (rule, batch, failing index, known checkpoints)
VIOLATIONS = [
    ("NESTED_TURN", [turn_start("t1"), turn_start("t2")], 1, {}),
    ("NESTED_TURN", [turn_start("t1"), turn_start("t1")], 1, {}),
    ("NESTED_TURN", OPEN_STEP + [turn_start("t2")], 2, {}),
    ("TURN_END_WITHOUT_TURN", [turn_end("t1")], 0, {}),
    ("TURN_END_WITHOUT_TURN", CLOSED_TURN + [turn_end("t1")], 6, {}),
    ("TURN_MISMATCH", [turn_start("t1"), turn_end("t2")], 1, {}),
    ("TURN_END_WITH_OPEN_STEP", OPEN_STEP + [turn_end("t1")], 2, {}),
    ("TURN_END_WITH_OPEN_STEP", OPEN_CALL + [turn_end("t1")], 3, {}),
    ("STEP_OUTSIDE_TURN", [step_start("s1")], 0, {}),
    ("STEP_OUTSIDE_TURN", CLOSED_TURN + [step_start("s2")], 6, {}),
    ("NESTED_STEP", OPEN_STEP + [step_start("s2")], 2, {}),
    ("NESTED_STEP", OPEN_STEP + [step_start("s1")], 2, {}),
    ("STEP_END_WITHOUT_STEP", [turn_start("t1"), step_end("s1")], 1, {}),
    ("STEP_END_WITHOUT_STEP", [step_end("s1")], 0, {}),
    ("STEP_END_WITHOUT_STEP", CLOSED_TURN[:5] + [step_end("s1")], 5, {}),
    ("STEP_MISMATCH", OPEN_STEP + [step_end("s2")], 2, {}),
    ("STEP_END_WITH_OPEN_CALLS", OPEN_CALL + [step_end("s1")], 3, {}),
    ("STEP_END_WITH_OPEN_CALLS", OPEN_CALL + [tool_call("c2"), tool_result("c1"), step_end("s1")], 5, {}),
    ("TOOL_CALL_OUTSIDE_STEP", [tool_call("c1")], 0, {}),
    ("TOOL_CALL_OUTSIDE_STEP", [turn_start("t1"), tool_call("c1")], 1, {}),
    ("TOOL_CALL_OUTSIDE_STEP", CLOSED_TURN[:5] + [tool_call("c2")], 5, {}),
    ("DUPLICATE_CALL_ID", OPEN_CALL + [tool_call("c1")], 3, {}),
    ("DUPLICATE_CALL_ID", OPEN_CALL + [tool_call("c2"), tool_call("c1")], 4, {}),
    ("RESULT_FOR_UNKNOWN_CALL", [tool_result("c1")], 0, {}),
    ("RESULT_FOR_UNKNOWN_CALL", OPEN_CALL + [tool_result("c2")], 3, {}),
    # answered twice
    ("RESULT_FOR_UNKNOWN_CALL", OPEN_CALL + [tool_result("c1"), tool_result("c1")], 4, {}),
    # a call of an earlier, closed step
    ("RESULT_FOR_UNKNOWN_CALL", CLOSED_TURN[:5] + [step_start("s2"), tool_result("c1")], 6, {}),
    ("ASSISTANT_MESSAGE_OUTSIDE_TURN", [assistant_message()], 0, {}),
    ("ASSISTANT_MESSAGE_OUTSIDE_TURN", CLOSED_TURN + [assistant_message()], 6, {}),
    ("USER_INPUT_INSIDE_TURN", [turn_start("t1"), user_message()], 1, {}),
    ("USER_INPUT_INSIDE_TURN", [turn_start("t1"), feedback()], 1, {}),
    ("USER_INPUT_INSIDE_TURN", [turn_start("t1"), resend()], 1, {}),
    ("USER_INPUT_INSIDE_TURN", OPEN_CALL + [user_message()], 3, {}),
    ("CHECKPOINT_INSIDE_STEP", OPEN_STEP + [checkpoint("k1")], 2, {}),
    ("CHECKPOINT_INSIDE_STEP", OPEN_CALL + [checkpoint("k1")], 3, {}),
    ("RESTORE_INSIDE_TURN", [checkpoint("k1"), turn_start("t1"), restore("k1")], 2, {}),
    ("RESTORE_INSIDE_TURN", OPEN_STEP + [restore("k0")], 2, {"k0": 1}),
    ("UNKNOWN_CHECKPOINT", [restore("k1")], 0, {}),
    ("UNKNOWN_CHECKPOINT", [checkpoint("k1"), restore("k2")], 1, {"k3": 4}),
    # a checkpoint named later in the batch is not known yet
    ("UNKNOWN_CHECKPOINT", [user_message(), restore("k1"), checkpoint("k1")], 1, {}),
]

EVERY_RULE = {
    "NESTED_TURN",
    "TURN_END_WITHOUT_TURN",
    "TURN_MISMATCH",
    "TURN_END_WITH_OPEN_STEP",
    "STEP_OUTSIDE_TURN",
    "NESTED_STEP",
    "STEP_END_WITHOUT_STEP",
    "STEP_MISMATCH",
    "STEP_END_WITH_OPEN_CALLS",
    "TOOL_CALL_OUTSIDE_STEP",
    "DUPLICATE_CALL_ID",
    "RESULT_FOR_UNKNOWN_CALL",
    "ASSISTANT_MESSAGE_OUTSIDE_TURN",
    "USER_INPUT_INSIDE_TURN",
    "CHECKPOINT_INSIDE_STEP",
    "RESTORE_INSIDE_TURN",
    "UNKNOWN_CHECKPOINT",
}


def test_the_table_covers_every_rule_of_the_docstring():
    documented = set(re.findall(r"\b[A-Z]+(?:_[A-Z]+)+\b", grammar.__doc__))
    assert documented == EVERY_RULE
    assert {rule for rule, *_ in VIOLATIONS} == EVERY_RULE


@pytest.mark.parametrize(
    "rule, batch, index, known", VIOLATIONS, ids=[f"{rule}-{i}" for i, (rule, *_) in enumerate(VIOLATIONS)]
)
def test_a_batch_that_breaks_a_rule_names_the_first_failing_event(rule, batch, index, known):
    result = validate(Tail(), batch, known)
    assert isinstance(result, Violation), result
    assert (result.rule, result.index) == (rule, index)
    assert result.message
    # Everything before the failing event is accepted on its own, so the index is
    # really the first failure.
    assert isinstance(validate(Tail(), batch[:index], known), Tail)


@pytest.mark.parametrize(
    "tail, event, rule",
    [
        (Tail(open_turn="t1", last_sequence=7), turn_start("t2"), "NESTED_TURN"),
        (Tail(open_turn="t1", open_step="s1", last_sequence=7), turn_end("t1"), "TURN_END_WITH_OPEN_STEP"),
        (Tail(open_turn="t1", last_sequence=7), turn_end("t9"), "TURN_MISMATCH"),
        (Tail(open_turn="t1", open_step="s1", last_sequence=7), step_end("s9"), "STEP_MISMATCH"),
        (
            Tail(open_turn="t1", open_step="s1", open_calls=("c1",), last_sequence=7),
            step_end("s1"),
            "STEP_END_WITH_OPEN_CALLS",
        ),
        (
            Tail(open_turn="t1", open_step="s1", open_calls=("c1",), last_sequence=7),
            tool_call("c1"),
            "DUPLICATE_CALL_ID",
        ),
        (
            Tail(open_turn="t1", open_step="s1", open_calls=("c1",), last_sequence=7),
            tool_result("c2"),
            "RESULT_FOR_UNKNOWN_CALL",
        ),
        (Tail(checkpoint="k1", last_sequence=7), restore("k2"), "UNKNOWN_CHECKPOINT"),
        (Tail(open_turn="t1", last_sequence=7), feedback(), "USER_INPUT_INSIDE_TURN"),
    ],
)
def test_the_tail_of_earlier_appends_decides_the_first_event_of_a_batch(tail, event, rule):
    result = validate(tail, [event], {"k1": 3})
    assert isinstance(result, Violation)
    assert (result.rule, result.index) == (rule, 0)


def test_a_whole_session_is_accepted_and_leaves_a_closed_tail():
    session = [
        user_message(),
        checkpoint("k1"),
        turn_start("t1"),
        assistant_message("looking"),
        step_start("s1"),
        tool_call("c1"),
        tool_call("c2"),
        tool_result("c2", is_error=True),
        assistant_message("c2 failed, waiting for c1"),
        tool_result("c1"),
        step_end("s1"),
        checkpoint("k2"),
        step_start("s2"),
        tool_call("c1"),  # a call id may be reused once it is answered
        tool_result("c1"),
        step_end("s2"),
        turn_end("t1", TurnEndReason.ERROR),
        feedback(),
        restore("k1"),
        resend(),
        turn_start("t2"),
        turn_end("t2", TurnEndReason.CANCELLED),
    ]
    tail = validate(Tail(), session, {})
    assert tail == Tail(open_turn=None, open_step=None, open_calls=(), checkpoint="k1", last_sequence=len(session))


@pytest.mark.parametrize(
    "batch, expected",
    [
        ([], Tail()),
        ([turn_start("t1")], Tail(open_turn="t1", last_sequence=1)),
        (OPEN_STEP, Tail(open_turn="t1", open_step="s1", last_sequence=2)),
        (OPEN_CALL + [tool_call("c2")], Tail(open_turn="t1", open_step="s1", open_calls=("c1", "c2"), last_sequence=4)),
        (
            OPEN_CALL + [tool_call("c2"), tool_result("c1")],
            Tail(open_turn="t1", open_step="s1", open_calls=("c2",), last_sequence=5),
        ),
        ([turn_start("t1"), checkpoint("k1")], Tail(open_turn="t1", checkpoint="k1", last_sequence=2)),
        ([checkpoint("k1"), checkpoint("k2"), restore("k1")], Tail(checkpoint="k1", last_sequence=3)),
    ],
)
def test_valid_batches_leave_the_expected_tail(batch, expected):
    assert validate(Tail(), batch, {}) == expected


def test_a_batch_continues_the_tail_it_is_given():
    tail = Tail(open_turn="t1", open_step="s1", open_calls=("c1", "c2"), checkpoint="k0", last_sequence=40)
    after = validate(
        tail, [tool_result("c2"), tool_result("c1"), step_end("s1"), turn_end("t1"), restore("k0")], {"k0": 12}
    )
    assert after == Tail(checkpoint="k0", last_sequence=45)


def test_a_restore_may_name_a_checkpoint_created_earlier_in_the_same_batch():
    assert isinstance(validate(Tail(), [checkpoint("k1"), restore("k1")], {}), Tail)


def test_validate_does_not_change_the_callers_known_checkpoints():
    known = {"k0": 1}
    validate(Tail(last_sequence=1), [checkpoint("k1"), restore("k1")], known)
    assert known == {"k0": 1}


def test_a_turn_end_of_any_reason_closes_the_turn():
    for reason in TurnEndReason:
        assert validate(Tail(), [turn_start("t1"), turn_end("t1", reason)], {}) == Tail(last_sequence=2)


# -- reopening ------------------------------------------------------------------------

# Checkpoints of a transcript: k-early at 3, k-done (the completion's) at 10, k-late at 20.
CHECKPOINTS = {"k-early": 3, "k-done": 10, "k-late": 20}


@pytest.mark.parametrize(
    "events, kind",
    [
        ([feedback()], EventKind.USER_FEEDBACK),
        ([resend()], EventKind.PROMPT_RESEND),
        ([restore("k-early")], EventKind.CHECKPOINT_RESTORE),
    ],
)
def test_feedback_a_resend_and_a_restore_to_an_earlier_checkpoint_reopen(events, kind):
    found = reopening(events, 10, CHECKPOINTS)
    assert found is not None
    assert (found.index, found.kind) == (0, kind)
    assert found.why


@pytest.mark.parametrize(
    "events, completion_checkpoint",
    [
        ([restore("k-done")], 10),  # the completion's own checkpoint
        ([restore("k-late")], 10),  # a later one
        ([restore("k-early")], None),  # the completion had no checkpoint: nothing predates it
        ([restore("k-unknown")], 10),
        ([user_message(), turn_start("t9"), assistant_message(), turn_end("t9"), checkpoint("k-new")], 10),
        ([], 10),
    ],
)
def test_other_events_and_restores_to_the_completions_or_a_later_checkpoint_do_not_reopen(
    events, completion_checkpoint
):
    assert reopening(events, completion_checkpoint, CHECKPOINTS) is None


@pytest.mark.parametrize(
    "events, index, kind",
    [
        ([restore("k-late"), user_message(), feedback(), resend()], 2, EventKind.USER_FEEDBACK),
        ([resend(), feedback()], 0, EventKind.PROMPT_RESEND),
        ([restore("k-done"), restore("k-early"), feedback()], 1, EventKind.CHECKPOINT_RESTORE),
        ([user_message(), resend(), restore("k-early")], 1, EventKind.PROMPT_RESEND),
    ],
)
def test_the_first_reopening_event_in_order_wins(events, index, kind):
    found = reopening(events, 10, CHECKPOINTS)
    assert found is not None
    assert (found.index, found.kind) == (index, kind)


# -- resume advice --------------------------------------------------------------------


@pytest.mark.parametrize(
    "terminal, outcome, generation, ask, primary, secondary",
    [
        (False, None, 1, ResumeAsk.RESUME_TASK, HostAction.RESUME_TASK, None),
        (False, None, 4, ResumeAsk.RESUME_TASK, HostAction.RESUME_TASK, None),
        (True, "COMPLETED", 1, ResumeAsk.RESUME_COMPLETED_TASK, HostAction.RESUME_TASK, HostAction.NEW_TASK),
        (True, "CANCELLED", 1, ResumeAsk.RESUME_ENDED_TASK, HostAction.NEW_TASK, None),
        (True, "FAILED", 2, ResumeAsk.RESUME_ENDED_TASK, HostAction.NEW_TASK, None),
        (True, "TIMED_OUT", 3, ResumeAsk.RESUME_ENDED_TASK, HostAction.NEW_TASK, None),
    ],
)
def test_resolve_resume(terminal, outcome, generation, ask, primary, secondary):
    advice = resolve_resume(terminal, outcome, generation)
    assert (advice.ask, advice.primary, advice.secondary) == (ask, primary, secondary)
    assert f"generation {generation}" in advice.reason
    if ask is ResumeAsk.RESUME_COMPLETED_TASK:
        assert f"generation {generation + 1}" in advice.reason
    if ask is ResumeAsk.RESUME_ENDED_TASK:
        assert outcome in advice.reason


@pytest.mark.parametrize(
    "outcome, events, admitted",
    [
        ("COMPLETED", [feedback(), turn_start()], True),
        ("COMPLETED", [resend()], True),
        ("COMPLETED", [restore("k1")], True),
        # The reopening event must come first: the rest of the batch lands after it.
        ("COMPLETED", [user_message(), feedback()], False),
        ("COMPLETED", [turn_end()], False),
        ("COMPLETED", [restore("k2")], False),
        # Only a completed generation reopens through the transcript.
        ("CANCELLED", [feedback()], False),
        ("FAILED", [resend()], False),
        ("TIMED_OUT", [restore("k1")], False),
    ],
)
def test_a_terminal_generation_takes_only_a_batch_that_reopens_a_completion(outcome, events, admitted):
    # k1 was created at 3, before the completion's checkpoint k2 (created at 9).
    found = grammar.admits_terminal_append(outcome, events, 9, {"k1": 3, "k2": 9})
    assert (found is not None) is admitted
    if admitted:
        assert found.index == 0 and found.kind is events[0].kind
