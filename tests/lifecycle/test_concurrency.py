"""Many concurrent, conflicting intents over real gRPC: each revision is committed
once, losers are told ABORTED or FAILED_PRECONDITION, and the history stays
gapless and agrees with the record."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.grpc_errors import error_info
from tests.lifecycle.grpc_support import DOMAIN, Client, Code

N = 50


@pytest.fixture
def c(lifecycle) -> Client:
    return Client(lifecycle[1])


async def race(calls):
    """Starts every call at once; returns (successes, errors)."""
    results = await asyncio.gather(*(call() for call in calls), return_exceptions=True)
    successes = [r for r in results if not isinstance(r, BaseException)]
    errors = [r for r in results if isinstance(r, BaseException)]
    for error in errors:
        assert isinstance(error, grpc.aio.AioRpcError), repr(error)
        assert error_info(error).domain == DOMAIN
    return successes, errors


def reasons(errors) -> dict[tuple[grpc.StatusCode, str], int]:
    found: dict[tuple[grpc.StatusCode, str], int] = {}
    for error in errors:
        key = (error.code(), error_info(error).reason)
        found[key] = found.get(key, 0) + 1
    return found


async def assert_history_matches_record(c: Client, task_id: str) -> list[lifecycle_types.LifecycleEvent]:
    task = await c.task(task_id)
    events = await c.events(task_id)
    assert [e.revision for e in events] == list(range(1, task.revision + 1))
    sequences = [e.sequence for e in events]
    assert sequences == sorted(set(sequences))
    last = events[-1]
    assert (last.generation, last.revision, last.to_state, last.outcome, last.work_status, last.completion_id) == (
        task.generation,
        task.revision,
        task.state,
        task.outcome,
        task.work_status,
        task.completion_id,
    )
    assert last.cancellation == task.cancellation
    return events


async def test_one_winner_among_writers_expecting_the_same_revision(c):
    await c.active("t1")
    statuses = [
        lifecycle_enums.WORK_STATUS_READY,
        lifecycle_enums.WORK_STATUS_IN_PROGRESS,
        lifecycle_enums.WORK_STATUS_BLOCKED,
    ]
    successes, errors = await race([lambda k=k: c.work("t1", statuses[k % 3], expected_revision=2) for k in range(N)])
    assert len(successes) == 1
    assert reasons(errors) == {(Code.ABORTED, "REVISION_MISMATCH"): N - 1}
    assert {tuple(sorted(error_info(e).metadata.items())) for e in errors} == {
        (("actual_revision", "3"), ("expected_revision", "2"))
    }
    [winner] = successes
    assert winner.task.revision == 3
    events = await assert_history_matches_record(c, "t1")
    assert events[-1] == winner.event


async def test_unconditional_writers_each_commit_exactly_one_revision(c):
    await c.active("t1")
    statuses = [
        lifecycle_enums.WORK_STATUS_READY,
        lifecycle_enums.WORK_STATUS_IN_PROGRESS,
        lifecycle_enums.WORK_STATUS_BLOCKED,
    ]
    successes, errors = await race([lambda k=k: c.work("t1", statuses[k % 3]) for k in range(N)])
    assert errors == []
    revisions = sorted(s.event.revision for s in successes)
    assert revisions == list(range(3, 3 + N))
    events = await assert_history_matches_record(c, "t1")
    assert sorted((s.event for s in successes), key=lambda e: e.revision) == events[2:]


KINDS = ["complete", "fail", "time_out", "request_cancellation", "settle_cancellation"]


@pytest.mark.parametrize("seed", range(4))
async def test_mixed_settlements_settle_a_generation_exactly_once(c, seed):
    await c.active("t1")
    kinds = KINDS

    def contender(k: int):
        kind = kinds[k % len(kinds)]
        extra = {"expected_revision": 2} if k % 2 else {}
        if kind == "complete":
            # Durably committed long before any fence: it may pass one.
            return lambda: c.complete("t1", completion_id=f"cmp-{k}", authoritative_at=1, **extra)
        return lambda: getattr(c, kind)("t1", **extra)

    contenders = [contender(k) for k in range(N)]
    random.Random(seed).shuffle(contenders)  # another sending order per seed
    successes, errors = await race(contenders)
    allowed = {
        (Code.ABORTED, "REVISION_MISMATCH"),
        (Code.FAILED_PRECONDITION, "GENERATION_TERMINAL"),
        (Code.FAILED_PRECONDITION, "CANCELLATION_FENCED"),
        (Code.FAILED_PRECONDITION, "CANCELLATION_NOT_REQUESTED"),
        (Code.FAILED_PRECONDITION, "CANCELLATION_ALREADY_REQUESTED"),
    }
    assert set(reasons(errors)) <= allowed, reasons(errors)
    events = await assert_history_matches_record(c, "t1")
    terminal = [e for e in events if e.to_state == lifecycle_enums.GENERATION_STATE_TERMINAL]
    assert len(terminal) == 1
    [settlement] = terminal
    # Every committed event was reported to the caller that committed it; every other
    # success is a repeat of the one settlement.
    reported = {s.event.SerializeToString(deterministic=True) for s in successes}
    committed = {e.SerializeToString(deterministic=True) for e in events[2:]}
    assert reported == committed
    repeats = [s for s in successes if s.event == settlement]
    assert len(repeats) >= 1
    assert len(successes) + len(errors) == N
    final = await c.task("t1")
    assert final.state == lifecycle_enums.GENERATION_STATE_TERMINAL and final.outcome == settlement.outcome


async def test_concurrent_registrations_create_a_task_once(c):
    successes, errors = await race([lambda: c.register("t1") for _ in range(N)])
    assert len(successes) == 1
    assert reasons(errors) == {(Code.ALREADY_EXISTS, "TASK_ALREADY_EXISTS"): N - 1}
    assert len(await c.events("t1")) == 1


async def test_children_settling_while_their_parent_fails_end_exactly_once(c):
    await c.active("parent")
    children = [f"child-{n:02d}" for n in range(10)]
    for child in children:
        await c.active(child, parent="parent")

    def child_call(k: int):
        child = children[k % len(children)]
        if k % 3 == 0:
            return lambda: c.complete(child, completion_id=f"cmp-{k}", authoritative_at=1)
        if k % 3 == 1:
            return lambda: c.fail(child)
        return lambda: c.request_cancellation(child)

    calls = [lambda: c.fail("parent")] + [child_call(k) for k in range(N - 1)]
    _successes, errors = await race(calls)
    assert {code for code, _ in reasons(errors)} <= {Code.FAILED_PRECONDITION}
    for child in children:
        task = await c.eventually(child, lambda t: t.state == lifecycle_enums.GENERATION_STATE_TERMINAL)
        events = await assert_history_matches_record(c, child)
        assert [e.to_state for e in events].count(lifecycle_enums.GENERATION_STATE_TERMINAL) == 1
        assert task.outcome in (
            lifecycle_enums.TERMINAL_OUTCOME_COMPLETED,
            lifecycle_enums.TERMINAL_OUTCOME_FAILED,
            lifecycle_enums.TERMINAL_OUTCOME_CANCELLED,
        )
    parent = await c.task("parent")
    assert parent.outcome == lifecycle_enums.TERMINAL_OUTCOME_FAILED
    # Nothing is left for the parent's generation to wait for.
    assert list((await c.get("parent")).open_attached_child_task_ids) == []
