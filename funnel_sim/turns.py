"""The transcript batches the simulated clients append: whole turns, turns the
user interrupted, turns cut off mid-call (the session died: the turn stays open
until a load or a new claim closes it, docs/specification.md §4.5) and their
continuation, and user feedback that reopens a completed generation. Every id
in a batch is made of the batch's own label, so that a batch applied twice shows
as a repeated turn."""

from __future__ import annotations

from dataclasses import dataclass

from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types

Event = completion_types.SessionEvent


@dataclass(frozen=True)
class OpenTurn:
    """A turn a batch left open: its ids, to continue it with."""

    task: str
    turn: str
    step: str
    call: str


def _start(turn: str, step: str, call: str) -> list[Event]:
    return [
        Event(turn_start=completion_types.TurnStart(turn_id=turn)),
        Event(step_start=completion_types.StepStart(step_id=step)),
        Event(tool_call=completion_types.ToolCall(call_id=call, tool_name="shell", arguments="make test")),
    ]


def _finish(turn: str, step: str, call: str, reason: completion_enums.TurnEndReason) -> list[Event]:
    interrupted = reason == completion_enums.TURN_END_REASON_INTERRUPTED
    return [
        Event(
            tool_result=completion_types.ToolResult(
                call_id=call, is_error=interrupted, content="stopped by the user" if interrupted else "ok"
            )
        ),
        Event(step_end=completion_types.StepEnd(step_id=step)),
        Event(assistant_message=completion_types.AssistantMessage(text="done")),
        Event(turn_end=completion_types.TurnEnd(turn_id=turn, reason=reason)),
    ]


def turn(task: str, label: str, shape: int) -> tuple[list[Event], OpenTurn | None]:
    """A batch of one turn (shape 0 or 1 whole, 2 interrupted by the user, 3 cut off
    after its tool call) and the turn it leaves open."""
    ids = OpenTurn(task, f"turn-{label}", f"step-{label}", f"call-{label}")
    started = _start(ids.turn, ids.step, ids.call)
    if shape % 4 == 3:
        return started, ids
    reason = (
        completion_enums.TURN_END_REASON_INTERRUPTED if shape % 4 == 2 else completion_enums.TURN_END_REASON_COMPLETED
    )
    return started + _finish(ids.turn, ids.step, ids.call, reason), None


def continuation(open_turn: OpenTurn) -> list[Event]:
    """The rest of a cut-off turn (refused if a repair closed it meanwhile)."""
    return _finish(open_turn.turn, open_turn.step, open_turn.call, completion_enums.TURN_END_REASON_COMPLETED)


def feedback(label: str) -> list[Event]:
    """User feedback and the turn answering it: the feedback reopens a completed generation."""
    answered, _ = turn("", label, 0)
    return [Event(user_feedback=completion_types.UserFeedback(text=f"feedback {label}")), *answered]
