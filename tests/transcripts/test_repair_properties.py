"""Property tests of interrupted-turn repair over random valid transcripts cut at
any point (seed 002: interrupted turns are preserved and closed by synthetic
events, never dropped).

The generator emits only events an independent model of the grammar allows from
the current tail, so every generated transcript is valid; a cut anywhere leaves a
possibly open turn, step and calls. Then: repair's events appended to the cut log
are accepted; repairing again yields nothing; repair only appends (synthetic
events, one error result per open call, a step end iff a step was open, a turn
end INTERRUPTED last). The same holds through every store adapter
(tests/completion/backends.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from completion_service.authority.transcripts import Transcripts
from completion_service.core.transcript import (
    EventKind,
    SessionEvent,
    Tail,
    TurnEndReason,
    repair,
    validate,
)
from completion_service.units.transcripts import AppendCommand, Appended
from funnel.runtime.clock import ManualClock
from tests.completion.backends import BACKENDS

TURNS = ["t0", "t1", "t2"]
STEPS = ["s0", "s1", "s2"]
CALLS = ["c0", "c1", "c2", "c3", "c4"]
CHECKPOINTS = ["k0", "k1", "k2"]
texts = st.text(alphabet='abc xyz\n"{}é', max_size=12)


@dataclasses.dataclass
class Model:
    """What is open, tracked independently of the module under test."""

    turn: str | None = None
    step: str | None = None
    calls: list[str] = dataclasses.field(default_factory=list)
    checkpoints: list[str] = dataclasses.field(default_factory=list)
    last_checkpoint: str = ""

    def choices(self) -> list[str]:
        if self.turn is None:
            # turn_start is listed thrice so that transcripts spend most of their length in turns
            kinds = ["turn_start"] * 3 + ["user_message", "user_feedback", "prompt_resend", "checkpoint"]
            return kinds + (["restore"] if self.checkpoints else [])
        if self.step is None:
            return ["step_start", "assistant_message", "checkpoint", "turn_end"]
        kinds = ["assistant_message"]
        if len(self.calls) < len(CALLS):
            kinds.append("tool_call")
        if self.calls:
            kinds.append("tool_result")
        else:
            kinds.append("step_end")
        return kinds


@st.composite
def transcripts(draw, max_events: int = 60) -> list[SessionEvent]:
    """A random valid transcript; long runs inside turns and steps are likely."""
    model = Model()
    events: list[SessionEvent] = []
    for _ in range(draw(st.integers(0, max_events))):
        choice = draw(st.sampled_from(model.choices()))
        if choice == "turn_start":
            model.turn = draw(st.sampled_from(TURNS))
            event = SessionEvent(EventKind.TURN_START, ref=model.turn)
        elif choice == "turn_end":
            event = SessionEvent(EventKind.TURN_END, ref=model.turn, reason=draw(st.sampled_from(list(TurnEndReason))))
            model.turn = None
        elif choice == "step_start":
            model.step = draw(st.sampled_from(STEPS))
            event = SessionEvent(EventKind.STEP_START, ref=model.step)
        elif choice == "step_end":
            event = SessionEvent(EventKind.STEP_END, ref=model.step)
            model.step = None
        elif choice == "tool_call":
            call = draw(st.sampled_from([c for c in CALLS if c not in model.calls]))
            model.calls.append(call)
            event = SessionEvent(
                EventKind.TOOL_CALL, ref=call, name=draw(st.sampled_from(["bash", "edit"])), text=draw(texts)
            )
        elif choice == "tool_result":
            call = draw(st.sampled_from(model.calls))
            model.calls.remove(call)
            event = SessionEvent(EventKind.TOOL_RESULT, ref=call, text=draw(texts), is_error=draw(st.booleans()))
        elif choice == "checkpoint":
            checkpoint = draw(st.sampled_from(CHECKPOINTS))
            model.checkpoints.append(checkpoint)
            model.last_checkpoint = checkpoint
            event = SessionEvent(EventKind.CHECKPOINT, ref=checkpoint)
        elif choice == "restore":
            checkpoint = draw(st.sampled_from(model.checkpoints))
            model.last_checkpoint = checkpoint
            event = SessionEvent(EventKind.CHECKPOINT_RESTORE, ref=checkpoint)
        else:
            kind = {
                "user_message": EventKind.USER_MESSAGE,
                "user_feedback": EventKind.USER_FEEDBACK,
                "prompt_resend": EventKind.PROMPT_RESEND,
                "assistant_message": EventKind.ASSISTANT_MESSAGE,
            }[choice]
            event = SessionEvent(kind, text=draw(texts))
        events.append(event)
    return events


def known_checkpoints(events: list[SessionEvent]) -> dict[str, int]:
    known: dict[str, int] = {}
    for sequence, event in enumerate(events, start=1):
        if event.kind is EventKind.CHECKPOINT:
            known.setdefault(event.ref, sequence)
    return known


def replay(events: list[SessionEvent]) -> Model:
    model = Model()
    for event in events:
        k = event.kind
        if k is EventKind.TURN_START:
            model.turn = event.ref
        elif k is EventKind.TURN_END:
            model.turn = None
        elif k is EventKind.STEP_START:
            model.step = event.ref
        elif k is EventKind.STEP_END:
            model.step = None
        elif k is EventKind.TOOL_CALL:
            model.calls.append(event.ref)
        elif k is EventKind.TOOL_RESULT:
            model.calls.remove(event.ref)
        elif k in (EventKind.CHECKPOINT, EventKind.CHECKPOINT_RESTORE):
            model.last_checkpoint = event.ref
    return model


@st.composite
def cut_transcripts(draw) -> tuple[list[SessionEvent], int]:
    events = draw(transcripts())
    return events, draw(st.integers(0, len(events)))


def assert_closers_close(tail: Tail, closers: list[SessionEvent], generation: int) -> None:
    """The shape of repair's output for `tail`."""
    assert all(c.synthetic for c in closers)
    assert all(c.generation == generation for c in closers)
    if tail.open_turn is None:
        assert closers == []
        return
    results = [c for c in closers if c.kind is EventKind.TOOL_RESULT]
    step_ends = [c for c in closers if c.kind is EventKind.STEP_END]
    assert [r.ref for r in results] == list(tail.open_calls)  # one per open call, in call order
    assert all(r.is_error and r.text for r in results)
    assert [s.ref for s in step_ends] == ([tail.open_step] if tail.open_step is not None else [])
    last = closers[-1]
    assert (last.kind, last.ref, last.reason) == (EventKind.TURN_END, tail.open_turn, TurnEndReason.INTERRUPTED)
    assert closers == results + step_ends + [last]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut_transcripts(), st.integers(1, 5))
def test_repair_of_a_cut_transcript_is_accepted_idempotent_and_only_appends(cut_transcript, generation):
    events, cut = cut_transcript
    # The generator only builds valid transcripts, and the grammar's tail agrees
    # with the independent model at the cut.
    whole = validate(Tail(), events, known_checkpoints(events))
    assert isinstance(whole, Tail), whole
    log = events[:cut]
    known = known_checkpoints(log)
    tail = validate(Tail(), log, known)
    assert isinstance(tail, Tail), tail
    model = replay(log)
    assert (tail.open_turn, tail.open_step, list(tail.open_calls), tail.checkpoint, tail.last_sequence) == (
        model.turn,
        model.step,
        model.calls,
        model.last_checkpoint,
        cut,
    )

    before = list(log)
    closers = repair(tail, generation)

    assert log == before  # nothing removed or altered
    assert_closers_close(tail, closers, generation)
    after = validate(tail, closers, known)
    assert isinstance(after, Tail), after
    assert (after.open_turn, after.open_step, after.open_calls) == (None, None, ())
    assert after.checkpoint == tail.checkpoint
    assert after.last_sequence == cut + len(closers)
    # The repaired log as a whole is accepted from the empty tail...
    assert validate(Tail(), log + closers, known) == after
    # ...and repairing it again yields nothing.
    assert repair(after, generation) == []
    assert repair(after, generation + 1) == []


# -- the same through every store adapter ----------------------------------------------

WS, TASK = "ws-1", "task-1"


async def _store_round(backend: str, directory: Path, log: list[SessionEvent], splits: list[int], generation: int):
    clock = ManualClock(1_700_000_000_000_000)
    store = await BACKENDS[backend](directory, clock)
    transcripts = Transcripts(store, clock)
    try:
        batches, start = 0, 0
        for end in sorted(set(splits)) + [len(log)]:
            if end > start:
                appended = await transcripts.append(AppendCommand(WS, TASK, log[start:end], generation))
                assert isinstance(appended, Appended) and appended.first_sequence == start + 1
                batches += 1
                start = end
        first = await transcripts.load(WS, TASK, 0, 1000, repair_first=True)
        second = await transcripts.load(WS, TASK, 0, 1000, repair_first=True)
        return batches, first, second
    finally:
        await store.close()


def _essence(e: SessionEvent) -> tuple:
    return (e.kind, e.ref, e.name, e.text, e.is_error, e.reason, e.synthetic)


# A store on a database server costs more per example than a file; the property
# is the same on every adapter, and the in-process ones take the full count.
EXAMPLES = {"postgresql": 30}


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_the_store_commits_the_repair_once_and_keeps_every_event(backend):
    @settings(max_examples=EXAMPLES.get(backend, 100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(cut_transcripts(), st.lists(st.integers(0, 60), max_size=4), st.integers(1, 3))
    def through_the_store(cut_transcript, splits, generation):
        _the_store_commits_the_repair_once_and_keeps_every_event(backend, cut_transcript, splits, generation)

    through_the_store()


def _the_store_commits_the_repair_once_and_keeps_every_event(backend, cut_transcript, splits, generation):
    events, cut = cut_transcript
    log = events[:cut]
    with tempfile.TemporaryDirectory() as tmp:
        batches, first, second = asyncio.run(
            _store_round(backend, Path(tmp), log, [s for s in splits if s <= cut], generation)
        )
    tail = validate(Tail(), log, known_checkpoints(log))
    closers = repair(tail, generation)

    stored = first.events
    assert [_essence(e) for e in stored[:cut]] == [_essence(e) for e in log]
    assert [e.sequence for e in stored] == list(range(1, len(stored) + 1))
    assert all(e.generation == generation for e in stored)
    assert [_essence(e) for e in stored[cut:]] == [_essence(c) for c in closers]
    assert first.repaired == bool(closers)
    assert first.turn_in_progress is False
    assert first.state_version == batches + (1 if closers else 0)
    # The second load finds nothing to repair and sees exactly the same log.
    assert second.repaired is False
    assert second.events == stored
    assert second.state_version == first.state_version
    final = validate(Tail(), [dataclasses.replace(e, synthetic=False) for e in stored], known_checkpoints(stored))
    assert isinstance(final, Tail) and final.open_turn is None
