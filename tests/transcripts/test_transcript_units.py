"""Unit tests of the transcript units of work (completion_service/units/transcripts.py)
on the in-memory store: appends (the agent's lease, the expected state version,
the grammar, checkpoints), interrupted-turn repair, committing a staged import,
and the page read. Refusals change nothing."""

from __future__ import annotations

import pytest

from completion_service.core.transcript import EventKind, SessionEvent, Tail, TurnEndReason
from completion_service.errors import Reason
from completion_service.storage.port import TranscriptState
from completion_service.units import runs, transcripts
from completion_service.units.transcripts import AppendCommand, Appended, Repaired
from funnel.runtime.errors import Rejection
from funnel.runtime.idempotency import Replay
from tests.completion.units_support import SECOND, START, WS, World, close_command, key


@pytest.fixture
def world() -> World:
    return World()


def ev(kind: EventKind, ref: str = "", **fields) -> SessionEvent:
    return SessionEvent(kind, ref=ref, **fields)


OPEN_TURN = [
    ev(EventKind.TURN_START, "turn-1"),
    ev(EventKind.STEP_START, "step-1"),
    ev(EventKind.TOOL_CALL, "call-1", name="grep"),
    ev(EventKind.TOOL_CALL, "call-2", name="ls"),
]


async def append(world: World, events, task_id: str = "t-1", generation: int = 1, **fields):
    return await world.run(transcripts.append, command=AppendCommand(WS, task_id, events, generation, **fields))


def refused(result, reason: Reason) -> Rejection:
    assert isinstance(result, Rejection), result
    assert result.reason is reason, result
    return result


# -- appends --------------------------------------------------------------------------


async def test_an_append_stamps_sequence_generation_and_time_and_moves_the_tail(world):
    assert await append(world, OPEN_TURN[:2], generation=2) == Appended(1, 1)
    world.clock.advance(SECOND)
    assert await append(world, OPEN_TURN[2:], generation=2, expected_state_version=1) == Appended(2, 3)
    stored = await world.read(lambda tx: tx.transcripts.page(WS, "t-1", 0, 10))
    assert [(e.sequence, e.generation, e.recorded_at, e.kind) for e in stored] == [
        (1, 2, START, EventKind.TURN_START),
        (2, 2, START, EventKind.STEP_START),
        (3, 2, START + SECOND, EventKind.TOOL_CALL),
        (4, 2, START + SECOND, EventKind.TOOL_CALL),
    ]
    assert await world.read(lambda tx: tx.transcripts.load_tail(WS, "t-1")) == TranscriptState(
        Tail("turn-1", "step-1", ("call-1", "call-2"), "", 4), 2
    )


async def test_a_checkpoint_is_remembered_where_it_was_first_created(world):
    await append(world, [ev(EventKind.CHECKPOINT, "cp-1"), ev(EventKind.CHECKPOINT, "cp-1")])
    await append(
        world,
        [ev(EventKind.CHECKPOINT, "cp-2"), ev(EventKind.CHECKPOINT, "cp-1"), ev(EventKind.CHECKPOINT_RESTORE, "cp-2")],
    )
    assert await world.read(lambda tx: tx.transcripts.load_checkpoints(WS, "t-1", {"cp-1", "cp-2"})) == {
        "cp-1": 1,
        "cp-2": 3,
    }
    assert (await world.read(lambda tx: tx.transcripts.load_tail(WS, "t-1"))).tail.checkpoint == "cp-2"


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("stale version", Reason.STATE_VERSION_MISMATCH),
        ("grammar", Reason.TRANSCRIPT_GRAMMAR_VIOLATION),
        ("unknown checkpoint", Reason.TRANSCRIPT_GRAMMAR_VIOLATION),
        ("no lease", Reason.RUN_NOT_HELD),
        ("another agent's lease", Reason.RUN_NOT_HELD),
        ("expired lease", Reason.RUN_NOT_HELD),
        ("closed run", Reason.RUN_NOT_HELD),
    ],
)
async def test_a_refused_append_changes_nothing(world, case, reason):
    claimed = await world.claimed(ttl=10 * SECOND)
    await append(world, OPEN_TURN[:1])
    fields: dict = {}
    task_id = "t-1"
    events = [ev(EventKind.ASSISTANT_MESSAGE, text="hi")]
    if case == "stale version":
        fields["expected_state_version"] = 0
    elif case == "grammar":
        events = [ev(EventKind.TURN_START, "turn-2")]
    elif case == "unknown checkpoint":
        events = [
            ev(EventKind.TURN_END, "turn-1", reason=TurnEndReason.COMPLETED),
            ev(EventKind.CHECKPOINT_RESTORE, "cp-never"),
        ]
    elif case == "no lease":
        fields["holder"] = "agent-1"
        task_id, events = "t-2", [ev(EventKind.USER_MESSAGE)]
    elif case == "another agent's lease":
        fields["holder"] = "agent-2"
    elif case == "expired lease":
        fields["holder"] = "agent-1"
        world.clock.advance(10 * SECOND)
    else:
        fields["holder"] = "agent-1"
        await world.run(runs.close_run, command=close_command(claimed.run.run_id))
    before = world.state()
    refused(await append(world, events, task_id=task_id, **fields), reason)
    assert world.state() == before


async def test_the_holder_of_the_live_lease_appends_and_a_request_id_replays(world):
    await world.claimed(ttl=10 * SECOND)
    request = key("AppendTranscript", "append-1")
    command = AppendCommand(
        WS, "t-1", OPEN_TURN[:1], 1, None, "agent-1", request, lambda appended: f"v{appended.state_version}".encode()
    )
    assert await world.run(transcripts.append, command=command) == Appended(1, 1)
    assert await world.run(transcripts.append, command=command) == Replay(b"v1")
    assert len(await world.read(lambda tx: tx.transcripts.page(WS, "t-1", 0, 10))) == 1


# -- repair ---------------------------------------------------------------------------


async def test_repair_closes_the_interrupted_turn_with_synthetic_events_of_its_generation(world):
    await append(world, OPEN_TURN, generation=3)
    world.clock.advance(SECOND)
    assert await world.run(transcripts.repair, workspace_id=WS, task_id="t-1") == Repaired(repaired=True)
    closers = await world.read(lambda tx: tx.transcripts.page(WS, "t-1", 4, 10))
    assert [(e.kind, e.ref, e.is_error, e.synthetic, e.generation, e.sequence, e.recorded_at) for e in closers] == [
        (EventKind.TOOL_RESULT, "call-1", True, True, 3, 5, START + SECOND),
        (EventKind.TOOL_RESULT, "call-2", True, True, 3, 6, START + SECOND),
        (EventKind.STEP_END, "step-1", False, True, 3, 7, START + SECOND),
        (EventKind.TURN_END, "turn-1", False, True, 3, 8, START + SECOND),
    ]
    assert closers[-1].reason is TurnEndReason.INTERRUPTED
    assert await world.read(lambda tx: tx.transcripts.load_tail(WS, "t-1")) == TranscriptState(Tail(last_sequence=8), 2)
    before = world.state()
    assert await world.run(transcripts.repair, workspace_id=WS, task_id="t-1") == Repaired()
    assert world.state() == before


async def test_a_turn_a_live_lease_owns_is_in_progress_not_interrupted(world):
    claimed = await world.claimed(ttl=10 * SECOND)
    await append(world, OPEN_TURN)
    before = world.state()
    assert await world.run(transcripts.repair, workspace_id=WS, task_id="t-1") == Repaired(turn_in_progress=True)
    assert world.state() == before
    world.clock.advance(10 * SECOND)  # the lease expired: now the turn is interrupted
    assert (await world.run(transcripts.repair, workspace_id=WS, task_id="t-1")).repaired
    assert claimed.run.open


# -- imports and pages ------------------------------------------------------------------------


async def test_a_staged_import_is_committed_into_an_empty_transcript_only(world):
    imported = [
        ev(EventKind.TURN_START, "turn-1", sequence=1, generation=2, recorded_at=7),
        ev(EventKind.CHECKPOINT, "cp-1", sequence=2, generation=2, recorded_at=8),
    ]
    await world.store.write(lambda tx: tx.imports.stage("import-1", imported))
    tail = Tail(open_turn="turn-1", checkpoint="cp-1", last_sequence=2)
    version = await world.store.write(
        lambda tx: transcripts.commit_import(tx, "import-1", WS, "t-1", tail, {"cp-1": 2})
    )
    assert version == 1
    assert await world.read(lambda tx: tx.transcripts.page(WS, "t-1", 0, 10)) == imported
    await world.store.write(lambda tx: tx.imports.stage("import-2", imported))
    before = world.state()
    refused(
        await world.store.write(lambda tx: transcripts.commit_import(tx, "import-2", WS, "t-1", tail, {})),
        Reason.TRANSCRIPT_NOT_EMPTY,
    )
    assert world.state() == before


async def test_a_page_reads_after_a_sequence_and_says_whether_more_follow(world):
    await append(world, OPEN_TURN)
    page = await world.read(lambda tx: transcripts.page(tx, WS, "t-1", 1, 2))
    assert ([e.sequence for e in page.events], page.state_version, page.more) == ([2, 3], 1, True)
    last = await world.read(lambda tx: transcripts.page(tx, WS, "t-1", 3, 2))
    assert ([e.sequence for e in last.events], last.more) == ([4], False)
    empty = await world.read(lambda tx: transcripts.page(tx, WS, "t-unknown", 0, 2))
    assert (empty.events, empty.state_version, empty.more) == ([], 0, False)
