"""Units of work for session transcripts: append a batch, repair an interrupted
final turn, commit a streamed import, and the page read. Plain functions over one
transaction (storage/port.py); the grammar and the repair are the pure core's."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from completion_service.core.transcript import (
    EventKind,
    SessionEvent,
    Tail,
    Violation,
    checkpoints_referenced,
    grammar_rejection,
    validate,
)
from completion_service.core.transcript import repair as closers_of
from completion_service.errors import Reason
from completion_service.storage.port import CompletionReadTx, CompletionTx, TranscriptState
from completion_service.units.holding import holding_run
from completion_service.units.request_ids import answer, recalled
from funnel.runtime.errors import Rejection, reject
from funnel.runtime.idempotency import Replay, RequestKey


@dataclass(frozen=True)
class AppendCommand:
    workspace_id: str
    task_id: str
    events: Sequence[SessionEvent]
    # The generation the events belong to.
    generation: int
    expected_state_version: int | None = None
    # The agent that must hold the task's live lease (a caller acting as an agent), or None.
    holder: str | None = None
    request: RequestKey | None = None
    render: Callable[[Appended], bytes] | None = None


@dataclass(frozen=True)
class Appended:
    state_version: int
    first_sequence: int


@dataclass(frozen=True)
class Repaired:
    # The interrupted final turn was closed with synthetic events.
    repaired: bool = False
    # The final turn is open and a live lease owns it: nothing to repair.
    turn_in_progress: bool = False


@dataclass(frozen=True)
class TranscriptPage:
    events: list[SessionEvent]
    state_version: int
    more: bool
    repaired: bool = False
    turn_in_progress: bool = False


def append(tx: CompletionTx, command: AppendCommand, now: int) -> Appended | Replay | Rejection:
    """Appends a batch that the grammar accepts whole, or nothing."""
    seen = recalled(tx.requests, command.request)
    if seen is not None:
        return seen
    workspace_id, task_id = command.workspace_id, command.task_id
    if command.holder is not None and live_holder(tx, workspace_id, task_id, now) != command.holder:
        return reject(
            Reason.RUN_NOT_HELD,
            f"an agent appends only to a task whose live lease it holds; it holds none on {task_id!r}",
            task_id=task_id,
        )
    state = tx.transcripts.load_tail(workspace_id, task_id)
    expected = command.expected_state_version
    if expected is not None and expected != state.state_version:
        return version_mismatch(expected, state.state_version)
    known = tx.transcripts.load_checkpoints(workspace_id, task_id, checkpoints_referenced(command.events))
    following = validate(state.tail, command.events, known)
    if isinstance(following, Violation):
        return grammar_rejection(following)
    first = state.tail.last_sequence + 1
    stamped = [stamp(event, first + i, command.generation, now) for i, event in enumerate(command.events)]
    _write(tx, workspace_id, task_id, stamped, TranscriptState(following, state.state_version + 1))
    return answer(tx.requests, command.request, command.render, Appended(state.state_version + 1, first), now)


def repair(tx: CompletionTx, workspace_id: str, task_id: str, now: int) -> Repaired:
    """Closes an interrupted final turn that no live lease owns (docs/specification.md §4.5): an error
    result for each open call, the open step's end, the turn's end (INTERRUPTED),
    all synthetic and durable. Decided under the write lock, so that of many
    concurrent loads exactly one repairs."""
    state = tx.transcripts.load_tail(workspace_id, task_id)
    tail = state.tail
    if tail.open_turn is None:
        return Repaired()
    if live_holder(tx, workspace_id, task_id, now) is not None:
        return Repaired(turn_in_progress=True)
    [last] = tx.transcripts.page(workspace_id, task_id, tail.last_sequence - 1, 1)
    closers = closers_of(tail, last.generation)
    following = validate(tail, closers)
    assert not isinstance(following, Violation), following
    stamped = [stamp(e, tail.last_sequence + 1 + i, e.generation, now) for i, e in enumerate(closers)]
    _write(tx, workspace_id, task_id, stamped, TranscriptState(following, state.state_version + 1))
    return Repaired(repaired=True)


def commit_import(
    tx: CompletionTx, import_id: str, workspace_id: str, task_id: str, final_tail: Tail, checkpoints: Mapping[str, int]
) -> int | Rejection:
    """Makes a fully validated, staged import the task's transcript; returns the new
    state version. Only an empty transcript takes an import."""
    state = tx.transcripts.load_tail(workspace_id, task_id)
    if state.tail.last_sequence != 0:
        return reject(Reason.TRANSCRIPT_NOT_EMPTY, f"task {task_id!r} already has a transcript", task_id=task_id)
    tx.imports.move(import_id, workspace_id, task_id)
    tx.transcripts.insert_checkpoints(workspace_id, task_id, checkpoints)
    tx.transcripts.save_tail(workspace_id, task_id, TranscriptState(final_tail, state.state_version + 1))
    return state.state_version + 1


# -- reads ----------------------------------------------------------------------------


def page(tx: CompletionReadTx, workspace_id: str, task_id: str, after_sequence: int, limit: int) -> TranscriptPage:
    state = tx.transcripts.load_tail(workspace_id, task_id)
    events = tx.transcripts.page(workspace_id, task_id, after_sequence, limit + 1)
    return TranscriptPage(events[:limit], state.state_version, len(events) > limit)


def live_holder(tx: CompletionReadTx, workspace_id: str, task_id: str, now: int) -> str | None:
    """The agent of the open run holding the task's live lease, if any."""
    run = holding_run(tx, workspace_id, task_id, now)
    return run.agent_id if run is not None else None


def version_mismatch(expected: int, actual: int) -> Rejection:
    return reject(
        Reason.STATE_VERSION_MISMATCH,
        f"expected state version {expected}, the transcript is at {actual}",
        expected=expected,
        actual=actual,
    )


def stamp(event: SessionEvent, sequence: int, generation: int, now: int) -> SessionEvent:
    return SessionEvent(
        kind=event.kind,
        ref=event.ref,
        name=event.name,
        text=event.text,
        is_error=event.is_error,
        reason=event.reason,
        synthetic=event.synthetic,
        generation=generation,
        sequence=sequence,
        recorded_at=now,
    )


def _write(
    tx: CompletionTx, workspace_id: str, task_id: str, stamped: list[SessionEvent], state: TranscriptState
) -> None:
    tx.transcripts.append(workspace_id, task_id, stamped)
    created = [e for e in stamped if e.kind is EventKind.CHECKPOINT]
    if created:
        # A checkpoint id is where it was first created; later ones of the same id add nothing.
        known = tx.transcripts.load_checkpoints(workspace_id, task_id, {e.ref for e in created})
        new: dict[str, int] = {}
        for event in created:
            if event.ref not in known:
                new.setdefault(event.ref, event.sequence)
        if new:
            tx.transcripts.insert_checkpoints(workspace_id, task_id, new)
    tx.transcripts.save_tail(workspace_id, task_id, state)
