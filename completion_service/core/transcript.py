"""The transcript grammar, interrupted-turn repair and reopening rules (docs/specification.md
§4.4, §4.5, §6). Pure: events and tails in, tails, violations and events out.

A transcript is an append-only log of session events. Its tail (what is open)
decides which events may follow:

  turn_start         no turn is open                                NESTED_TURN
  turn_end           the open turn, with no open step               TURN_END_WITHOUT_TURN,
                                                                    TURN_MISMATCH, TURN_END_WITH_OPEN_STEP
  step_start         inside a turn, no step open                    STEP_OUTSIDE_TURN, NESTED_STEP
  step_end           the open step, with every call answered        STEP_END_WITHOUT_STEP,
                                                                    STEP_MISMATCH, STEP_END_WITH_OPEN_CALLS
  tool_call          inside a step, a call id not already open      TOOL_CALL_OUTSIDE_STEP, DUPLICATE_CALL_ID
  tool_result        for an open call of the open step              RESULT_FOR_UNKNOWN_CALL
  assistant_message  inside a turn                                  ASSISTANT_MESSAGE_OUTSIDE_TURN
  user_message, user_feedback, prompt_resend
                     outside any turn                               USER_INPUT_INSIDE_TURN
  checkpoint         outside any step                               CHECKPOINT_INSIDE_STEP
  checkpoint_restore outside any turn, to a known checkpoint        RESTORE_INSIDE_TURN, UNKNOWN_CHECKPOINT
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from completion_service.errors import Reason
from funnel.runtime.errors import Rejection


class EventKind(enum.Enum):
    TURN_START = 1
    TURN_END = 2
    STEP_START = 3
    STEP_END = 4
    TOOL_CALL = 5
    TOOL_RESULT = 6
    USER_MESSAGE = 7
    ASSISTANT_MESSAGE = 8
    CHECKPOINT = 9
    CHECKPOINT_RESTORE = 10
    USER_FEEDBACK = 11
    PROMPT_RESEND = 12


class TurnEndReason(enum.Enum):
    COMPLETED = 1
    INTERRUPTED = 2
    ERROR = 3
    CANCELLED = 4


INTERRUPTED_RESULT = "interrupted: the session ended before this tool call returned a result"


@dataclass(frozen=True)
class SessionEvent:
    """One transcript event. `ref` is the turn, step, call or checkpoint id the kind
    refers to; `name` the tool name; `text` message text, tool arguments or result."""

    kind: EventKind
    ref: str = ""
    name: str = ""
    text: str = ""
    is_error: bool = False
    reason: TurnEndReason | None = None
    synthetic: bool = False
    generation: int = 0
    sequence: int = 0
    recorded_at: int = 0


@dataclass(frozen=True)
class Tail:
    """What is open at the end of a transcript."""

    open_turn: str | None = None
    open_step: str | None = None
    open_calls: tuple[str, ...] = ()
    checkpoint: str = ""
    last_sequence: int = 0


@dataclass(frozen=True)
class Violation:
    index: int
    rule: str
    message: str


def _violation(index: int, rule: str, message: str) -> Violation:
    return Violation(index, rule, message)


def step(tail: Tail, event: SessionEvent, index: int, known_checkpoints: Mapping[str, int]) -> Tail | Violation:
    """The tail after `event`, or the rule it breaks."""
    k = event.kind
    if k is EventKind.TURN_START:
        if tail.open_turn is not None:
            return _violation(index, "NESTED_TURN", f"turn {tail.open_turn!r} is still open")
        return dataclasses.replace(tail, open_turn=event.ref)
    if k is EventKind.TURN_END:
        if tail.open_turn is None:
            return _violation(index, "TURN_END_WITHOUT_TURN", "no turn is open")
        if event.ref != tail.open_turn:
            return _violation(index, "TURN_MISMATCH", f"the open turn is {tail.open_turn!r}, not {event.ref!r}")
        if tail.open_step is not None:
            return _violation(index, "TURN_END_WITH_OPEN_STEP", f"step {tail.open_step!r} is still open")
        return dataclasses.replace(tail, open_turn=None)
    if k is EventKind.STEP_START:
        if tail.open_turn is None:
            return _violation(index, "STEP_OUTSIDE_TURN", "a step needs an open turn")
        if tail.open_step is not None:
            return _violation(index, "NESTED_STEP", f"step {tail.open_step!r} is still open")
        return dataclasses.replace(tail, open_step=event.ref)
    if k is EventKind.STEP_END:
        if tail.open_step is None:
            return _violation(index, "STEP_END_WITHOUT_STEP", "no step is open")
        if event.ref != tail.open_step:
            return _violation(index, "STEP_MISMATCH", f"the open step is {tail.open_step!r}, not {event.ref!r}")
        if tail.open_calls:
            return _violation(
                index, "STEP_END_WITH_OPEN_CALLS", f"tool calls {', '.join(tail.open_calls)} have no result"
            )
        return dataclasses.replace(tail, open_step=None)
    if k is EventKind.TOOL_CALL:
        if tail.open_step is None:
            return _violation(index, "TOOL_CALL_OUTSIDE_STEP", "a tool call needs an open step")
        if event.ref in tail.open_calls:
            return _violation(index, "DUPLICATE_CALL_ID", f"tool call {event.ref!r} is already open")
        return dataclasses.replace(tail, open_calls=tail.open_calls + (event.ref,))
    if k is EventKind.TOOL_RESULT:
        if event.ref not in tail.open_calls:
            return _violation(index, "RESULT_FOR_UNKNOWN_CALL", f"no open tool call {event.ref!r} in this step")
        return dataclasses.replace(tail, open_calls=tuple(c for c in tail.open_calls if c != event.ref))
    if k is EventKind.ASSISTANT_MESSAGE:
        if tail.open_turn is None:
            return _violation(index, "ASSISTANT_MESSAGE_OUTSIDE_TURN", "an assistant message needs an open turn")
        return tail
    if k in (EventKind.USER_MESSAGE, EventKind.USER_FEEDBACK, EventKind.PROMPT_RESEND):
        if tail.open_turn is not None:
            return _violation(index, "USER_INPUT_INSIDE_TURN", f"turn {tail.open_turn!r} is still open")
        return tail
    if k is EventKind.CHECKPOINT:
        if tail.open_step is not None:
            return _violation(index, "CHECKPOINT_INSIDE_STEP", f"step {tail.open_step!r} is still open")
        return dataclasses.replace(tail, checkpoint=event.ref)
    if k is EventKind.CHECKPOINT_RESTORE:
        if tail.open_turn is not None:
            return _violation(index, "RESTORE_INSIDE_TURN", f"turn {tail.open_turn!r} is still open")
        if event.ref not in known_checkpoints:
            return _violation(index, "UNKNOWN_CHECKPOINT", f"no checkpoint {event.ref!r} in this transcript")
        return dataclasses.replace(tail, checkpoint=event.ref)
    raise ValueError(f"unknown event kind {k}")


def validate(tail: Tail, events: Sequence[SessionEvent], known_checkpoints: Mapping[str, int] = {}) -> Tail | Violation:
    """Checks a whole batch against the tail; the batch is accepted whole or not at all.
    Checkpoints created earlier in the batch may be restored later in it."""
    known = dict(known_checkpoints)
    for index, event in enumerate(events):
        following = step(tail, event, index, known)
        if isinstance(following, Violation):
            return following
        if event.kind is EventKind.CHECKPOINT:
            known.setdefault(event.ref, tail.last_sequence + 1)
        tail = dataclasses.replace(following, last_sequence=tail.last_sequence + 1)
    return tail


def checkpoints_referenced(events: Iterable[SessionEvent]) -> set[str]:
    return {e.ref for e in events if e.kind is EventKind.CHECKPOINT_RESTORE}


def repair(tail: Tail, generation: int) -> list[SessionEvent]:
    """The synthetic events that close an interrupted final turn: an error result
    for each unanswered call, a step end if a step is open, and a turn end with
    reason INTERRUPTED. Nothing is removed; an already closed tail needs nothing."""
    if tail.open_turn is None:
        return []
    events = [
        SessionEvent(
            EventKind.TOOL_RESULT,
            ref=call,
            text=INTERRUPTED_RESULT,
            is_error=True,
            synthetic=True,
            generation=generation,
        )
        for call in tail.open_calls
    ]
    if tail.open_step is not None:
        events.append(SessionEvent(EventKind.STEP_END, ref=tail.open_step, synthetic=True, generation=generation))
    events.append(
        SessionEvent(
            EventKind.TURN_END,
            ref=tail.open_turn,
            reason=TurnEndReason.INTERRUPTED,
            synthetic=True,
            generation=generation,
        )
    )
    return events


@dataclass(frozen=True)
class Reopening:
    index: int
    kind: EventKind
    why: str


def reopening(
    events: Sequence[SessionEvent], completion_checkpoint_sequence: int | None, checkpoint_sequences: Mapping[str, int]
) -> Reopening | None:
    """The first event, in order, that reopens a completed generation: new user
    feedback, a prompt resend, or a restore to a checkpoint created before the
    completion's checkpoint. A restore to the completion's own or a later
    checkpoint does not reopen. `completion_checkpoint_sequence` is where the
    completion's checkpoint was created (None when it had none)."""
    for index, event in enumerate(events):
        if event.kind is EventKind.USER_FEEDBACK:
            return Reopening(index, event.kind, "new user feedback")
        if event.kind is EventKind.PROMPT_RESEND:
            return Reopening(index, event.kind, "the prompt was resent")
        if event.kind is EventKind.CHECKPOINT_RESTORE:
            created = checkpoint_sequences.get(event.ref)
            if (
                created is not None
                and completion_checkpoint_sequence is not None
                and created < completion_checkpoint_sequence
            ):
                return Reopening(
                    index, event.kind, f"restore to checkpoint {event.ref!r}, which predates the completion"
                )
    return None


def admits_terminal_append(
    outcome: str | None,
    events: Sequence[SessionEvent],
    completion_checkpoint_sequence: int | None,
    checkpoint_sequences: Mapping[str, int],
) -> Reopening | None:
    """Whether a batch may be appended to a terminal generation: only to a
    COMPLETED one, and only when the batch's first event reopens it (the batch
    then lands in the next generation). Bookkeeping never revives a generation."""
    if outcome != "COMPLETED":
        return None
    found = reopening(events, completion_checkpoint_sequence, checkpoint_sequences)
    return found if found is not None and found.index == 0 else None


class ResumeAsk(enum.Enum):
    # The current generation is not terminal: continue it.
    RESUME_TASK = 1
    # The generation completed: resuming opens a new generation; or start a new task.
    RESUME_COMPLETED_TASK = 2
    # The generation ended otherwise (cancelled, failed, timed out): its
    # transcript is closed; start a new task.
    RESUME_ENDED_TASK = 3


class HostAction(enum.Enum):
    RESUME_TASK = 1
    NEW_TASK = 2


@dataclass(frozen=True)
class ResumeAdvice:
    ask: ResumeAsk
    primary: HostAction
    secondary: HostAction | None
    reason: str


def resolve_resume(terminal: bool, outcome: str | None, generation: int) -> ResumeAdvice:
    """What a host should offer for a task (seed 000 resume controls)."""
    if not terminal:
        return ResumeAdvice(
            ResumeAsk.RESUME_TASK, HostAction.RESUME_TASK, None, f"generation {generation} is still open"
        )
    if outcome == "COMPLETED":
        return ResumeAdvice(
            ResumeAsk.RESUME_COMPLETED_TASK,
            HostAction.RESUME_TASK,
            HostAction.NEW_TASK,
            f"generation {generation} completed; user feedback, a prompt resend or a restore to an earlier "
            f"checkpoint resumes it as generation {generation + 1}",
        )
    return ResumeAdvice(
        ResumeAsk.RESUME_ENDED_TASK,
        HostAction.NEW_TASK,
        None,
        f"generation {generation} ended {outcome}; its transcript takes no more events",
    )


def grammar_rejection(violation: Violation, line: int | None = None) -> Rejection:
    where = f"line {line}" if line is not None else f"event {violation.index}"
    metadata = {"rule": violation.rule}
    metadata.update({"line": str(line)} if line is not None else {"index": str(violation.index)})
    return Rejection(
        Reason.TRANSCRIPT_GRAMMAR_VIOLATION, f"{where} breaks {violation.rule}: {violation.message}", metadata
    )
