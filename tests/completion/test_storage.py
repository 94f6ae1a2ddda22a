"""Storage conformance of the completion store, for every adapter (the `backend`
fixture: tests/completion/backends.py): the port (storage/port.py) and nothing
above it. Rows are written and read through the aggregates of a transaction
(`tx.runs`, `tx.completions`, …) run by `store.write` and `store.read`; what the
units of work decide on top of them is test_unit_flows.py's, on the in-memory fake.

Covered: the transaction contract (a unit that raises or returns a rejection
leaves nothing behind, concurrent writes and their after-commit hooks in commit
order, event sequences, the keys the store keeps unique); request ids in their
scope and their sweep; runs and leases, their listings and the stall claim;
evidence; completions, their settlement fields, the outbox's claim and the
listings' filters and cursors; judged attempts; the completion events and the
audit log; transcripts, checkpoints, the tail and staged imports; the
operator's figures. Free text round-trips whatever it holds (U+0000 included).

A new adapter passes by adding one entry to BACKENDS."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3

import pytest

from completion_service.core import gates
from completion_service.core.gates import WorkspacePolicy
from completion_service.core.model import (
    AuditEntry,
    CompletionEvent,
    CompletionEventKind,
    CompletionRecord,
    Decision,
    EvidenceRecord,
    FinalStatus,
    Lease,
    LifecycleState,
    LifecycleView,
    RequestedOutcome,
    RunOutcome,
    RunRecord,
    RunView,
    SettlementStatus,
    Snapshot,
    TranscriptTail,
    Verdict,
)
from completion_service.core.transcript import EventKind, SessionEvent, Tail, TurnEndReason
from completion_service.errors import Reason
from completion_service.storage.memory import MemoryCompletionStore
from completion_service.storage.port import AttemptRecord, CompletionStore, CompletionTx, TranscriptState
from completion_service.storage.postgres.runs import PostgresRuns
from completion_service.storage.postgres.session import PostgresSession
from completion_service.storage.sqlite import SqliteCompletionStore
from completion_service.storage.sqlite.runs import SqliteRuns
from completion_service.storage.sqlite.session import Session
from funnel.auth.principal import Caller
from funnel.runtime.errors import Rejection, reject
from funnel.runtime.idempotency import RequestKey
from funnel.runtime.postgres import SqliteStyle
from tests.completion.backends import ONE_WRITER, make_postgresql

START = 1_700_000_000_000_000
SECOND = 1_000_000
WS = "ws-1"
TASKS = ("t-1", "t-2")
CALLER = "host-1"
AGENT = Caller("agent-1", "agent")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def key(method: str, request_id: str, digest: bytes, workspace: str = WS, caller: str = CALLER) -> RequestKey:
    return RequestKey(workspace, caller, method, request_id, digest)


def a_run(
    run_id: str, task_id: str = "t-1", *, claimed_at: int = START, ttl: int = 60 * SECOND, **changes
) -> RunRecord:
    run = RunRecord(WS, run_id, task_id, "agent-1", 1, 1, claimed_at, claimed_at + ttl)
    return dataclasses.replace(run, **changes)


def lease_of(run: RunRecord) -> Lease:
    return Lease(run.task_id, run.run_id, run.epoch, run.lease_expires_at)


def a_decision(*, allowed: bool = True) -> Decision:
    """A decision of the gates (allowed, or blocked with its details), as the store keeps one."""
    snapshot = Snapshot(
        workspace_id=WS,
        task_id="t-1",
        now=START,
        run=RunView("run-1", "t-1", 1, 1, True),
        lease=Lease("t-1", "run-1", 1, START + 60 * SECOND),
        claimed_epoch=1,
        transcript=TranscriptTail(state_version=3, checkpoint="cp-1"),
        evaluated_state_version=3,
        evidence=(),
        lifecycle=LifecycleView(1, LifecycleState.ACTIVE, None, False),
        attempts=(),
        outcome=RequestedOutcome.COMPLETED,
        result="all tests pass",
        result_digest="digest",
    )
    decision = gates.decide(snapshot, WorkspacePolicy(required_evidence=() if allowed else ("tests",)))
    assert decision.allowed is allowed
    return decision


def a_completion(
    task_id: str = "t-1", generation: int = 1, *, committed_at: int = START, **changes
) -> CompletionRecord:
    completion = CompletionRecord(
        workspace_id=WS,
        task_id=task_id,
        generation=generation,
        completion_id=f"cmp-{task_id}-{generation}",
        identity=f"sha256:{task_id}/{generation}",
        payload=b'{"task_id": "' + task_id.encode() + b'"}',
        outcome=RequestedOutcome.COMPLETED,
        result="all tests pass",
        run_id="run-1",
        state_version=3,
        checkpoint="cp-1",
        decision=a_decision(),
        committed_at=committed_at,
        settlement=SettlementStatus.PENDING,
        next_settle_at=committed_at,
    )
    return dataclasses.replace(completion, **changes)


def settled(completion: CompletionRecord, at: int) -> CompletionRecord:
    """The completion as the settlement of its lifecycle answer stores it."""
    return dataclasses.replace(
        completion,
        settlement=SettlementStatus.SETTLED,
        settle_attempts=completion.settle_attempts + 1,
        next_settle_at=None,
        last_settle_error=None,
        lifecycle_revision=3,
        lifecycle_event_sequence=7,
        settled_at=at,
    )


def an_event(kind: CompletionEventKind, task_id: str = "t-1", **changes) -> CompletionEvent:
    return dataclasses.replace(CompletionEvent(WS, task_id, 1, kind, "run-1", START), **changes)


def an_audit(run_id: str, task_id: str = "t-1", **metadata: str) -> AuditEntry:
    closed = {"outcome": "SUCCEEDED", "final_status": "UNCHANGED", "closed_by": "agent", **metadata}
    return AuditEntry(WS, "task.completed", run_id, task_id, tuple(sorted(closed.items())), START, caller=AGENT)


def an_evidence(evidence_id: str, task_id: str = "t-1", generation: int = 1, **changes) -> EvidenceRecord:
    record = EvidenceRecord(
        evidence_id, WS, task_id, generation, "tests", True, "cp-1", "42 passed", "run-1", START, AGENT
    )
    return dataclasses.replace(record, **changes)


def an_attempt(digest: str, generation: int = 1, **changes) -> AttemptRecord:
    attempt = AttemptRecord(WS, "t-1", generation, "run-1", "cp-1", digest, Verdict.SOFT_BLOCK, 3, START)
    return dataclasses.replace(attempt, **changes)


def ev(kind: EventKind, ref: str = "", sequence: int = 1, **fields) -> SessionEvent:
    """A stamped transcript event (generation 1, recorded at START unless given)."""
    return SessionEvent(kind, ref=ref, sequence=sequence, **{"generation": 1, "recorded_at": START, **fields})


class Env:
    """A store of one adapter, written and read through the port alone."""

    def __init__(self, store: CompletionStore, one_writer: bool = True) -> None:
        self.store = store
        # Concurrent writes commit in the order they were submitted (tests/completion/backends.py).
        self.one_writer = one_writer
        # The scope of every request id a test used: the state below includes what each recalls.
        self.scopes: set[tuple[str, str, str, str]] = set()

    def used(self, request: RequestKey) -> RequestKey:
        self.scopes.add((request.workspace_id, request.caller, request.method, request.request_id))
        return request

    async def write(self, fn):
        return await self.store.write(fn)

    async def read(self, fn):
        return await self.store.read(fn)

    async def listed(self, fn, count: int):
        """A listing read below the horizon, once it shows `count` rows. On PostgreSQL
        any transaction open anywhere on the server (an autovacuum's analyze, another
        test's store) holds the horizon back for a moment (docs/architecture.md), so
        rows just committed may be delivered a little later; elsewhere at once."""
        deadline = asyncio.get_running_loop().time() + 10
        while len(found := await self.read(fn)) < count and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        return found

    async def state(self) -> dict:
        """Everything a test touches, read through the port."""
        scopes = sorted(self.scopes)

        def read(tx) -> dict:
            found: dict = {
                "runs": tx.runs.page(WS, None, None, 10_000),
                "completions": tx.completions.page(WS, None, None, None, 10_000),
                "events": tx.events.page(WS, 0, None, 10_000),
                "audit": tx.events.audit_page(WS, None, None, 0, 10_000),
                "requests": [tx.requests.recall(*scope) for scope in scopes],
            }
            for task_id in TASKS:
                found[task_id] = (
                    tx.runs.load_lease(WS, task_id),
                    tx.transcripts.load_tail(WS, task_id),
                    tx.transcripts.page(WS, task_id, 0, 10_000),
                    tx.transcripts.load_checkpoints(WS, task_id, {"cp-1"}),
                    [(tx.evidence.load(WS, task_id, g), tx.completions.load_attempts(WS, task_id, g)) for g in (1, 2)],
                )
            return found

        return await self.store.read(read)

    async def events(self, task_id: str | None = None) -> list[CompletionEvent]:
        return await self.read(lambda tx: tx.events.page(WS, 0, task_id, 1000))

    async def due(self, now: int, limit: int = 10) -> list[CompletionRecord]:
        return await self.write(lambda tx: tx.completions.claim_due(now, "settler-1", 10 * SECOND, limit))


@pytest.fixture
async def env(request, backend) -> Env:
    return Env(backend, one_writer=request.node.callspec.params["backend"] in ONE_WRITER)


# -- the transaction contract ----------------------------------------------------


async def stored_run_and_completion(env: Env) -> tuple[RunRecord, CompletionRecord]:
    run, completion = a_run("run-1"), a_completion()

    def put(tx: CompletionTx) -> None:
        tx.runs.insert(run)
        tx.runs.save_lease(WS, lease_of(run))
        tx.completions.insert(completion)

    await env.write(put)
    return run, completion


def write_every_aggregate(tx: CompletionTx, run: RunRecord, completion: CompletionRecord, request: RequestKey) -> None:
    """A write of each kind the port has, to rows that exist and to new ones."""
    tx.requests.remember(request, b"response", START)
    tx.runs.update(dataclasses.replace(run, finished_at=START, outcome=RunOutcome.SUCCEEDED))
    tx.runs.save_lease(WS, dataclasses.replace(lease_of(run), expires_at=0))
    tx.runs.insert(a_run("run-2", "t-2"))
    tx.evidence.insert(an_evidence("evd-1"))
    tx.completions.update(settled(completion, START))
    tx.completions.insert(a_completion("t-2"))
    tx.completions.insert_attempt(an_attempt("digest"))
    tx.events.append(an_event(CompletionEventKind.DECISION_BLOCKED, decision=a_decision(allowed=False)))
    tx.events.append_audit(an_audit("run-1"))
    tx.transcripts.append(WS, "t-1", [ev(EventKind.CHECKPOINT, "cp-1")])
    tx.transcripts.insert_checkpoints(WS, "t-1", {"cp-1": 1})
    tx.transcripts.save_tail(WS, "t-1", TranscriptState(Tail(checkpoint="cp-1", last_sequence=1), 1))
    tx.imports.stage("import-1", [ev(EventKind.CHECKPOINT, "cp-2")])
    tx.imports.move("import-1", WS, "t-2")


async def test_a_unit_that_raises_leaves_nothing_behind(env):
    run, completion = await stored_run_and_completion(env)
    request = env.used(key("ClaimTask", "req-1", b"fp"))
    before = await env.state()

    def fails_halfway(tx: CompletionTx) -> None:
        write_every_aggregate(tx, run, completion, request)
        raise OSError("the disk is full")

    hooked: list = []
    with pytest.raises(OSError, match="disk is full"):
        await env.store.write(fails_halfway, after_commit=hooked.append)
    assert await env.state() == before
    assert hooked == []


async def test_a_unit_that_returns_a_rejection_leaves_nothing_behind(env):
    run, completion = await stored_run_and_completion(env)
    request = env.used(key("ClaimTask", "req-1", b"fp"))
    before = await env.state()
    refusal = reject(Reason.RUN_NOT_FOUND, "run 'run-x' does not exist", run_id="run-x")

    def refuses_after_writing(tx: CompletionTx) -> Rejection:
        write_every_aggregate(tx, run, completion, request)
        return refusal

    hooked: list = []
    assert await env.store.write(refuses_after_writing, after_commit=hooked.append) == refusal
    assert await env.state() == before
    assert hooked == []


async def test_concurrent_writes_commit_in_order_each_alone_and_hooks_run_in_commit_order(env):
    hooked: list[int] = []

    def unit(index: int):
        def body(tx: CompletionTx) -> int:
            if index == 3:
                tx.completions.insert_attempt(an_attempt("bad"))
                raise ValueError("this one fails alone")
            tx.completions.insert_attempt(an_attempt(f"attempt-{index}"))
            return index

        return body

    results = await asyncio.gather(
        *(env.store.write(unit(i), after_commit=hooked.append) for i in range(6)), return_exceptions=True
    )
    assert [r if not isinstance(r, Exception) else "failed" for r in results] == [0, 1, 2, "failed", 4, 5]
    stored = await env.read(lambda tx: tx.completions.load_attempts(WS, "t-1", 1))
    if env.one_writer:
        assert hooked == [0, 1, 2, 4, 5]
        assert [a.result_digest for a in stored] == [f"attempt-{i}" for i in (0, 1, 2, 4, 5)]
    else:  # concurrent transactions commit in any order (watchers read the table: funnel.runtime.tail)
        assert sorted(hooked) == [0, 1, 2, 4, 5]
        assert sorted(a.result_digest for a in stored) == [f"attempt-{i}" for i in (0, 1, 2, 4, 5)]


async def test_event_sequences_grow_in_commit_order_and_a_completion_has_one_terminal_event(env):
    kinds = [
        (CompletionEventKind.RUN_CLAIMED, "t-1", None),
        (CompletionEventKind.COMPLETION_COMMITTED, "t-1", "cmp-1"),
        (CompletionEventKind.RUN_CLAIMED, "t-2", None),
        (CompletionEventKind.DECISION_BLOCKED, "t-2", None),
        (CompletionEventKind.COMPLETION_SETTLED, "t-1", "cmp-1"),
    ]
    appended = [
        await env.write(lambda tx, k=k, t=t, c=c: tx.events.append(an_event(k, t, completion_id=c)))
        for k, t, c in kinds
    ]
    events = await env.events()
    assert events == appended
    assert [e.sequence for e in events] == sorted({e.sequence for e in events})

    before = await env.state()
    with pytest.raises(Exception):  # noqa: B017 - each adapter raises its own error for a violated key
        await env.store.write(lambda tx: tx.events.append(dataclasses.replace(appended[-1], sequence=0)))
    assert await env.state() == before


async def test_a_second_completion_of_a_generation_or_id_is_refused_by_the_store(env):
    completion = a_completion()
    await env.write(lambda tx: tx.completions.insert(completion))
    before = await env.state()
    for duplicate in (
        dataclasses.replace(completion, completion_id="cmp-other"),  # same generation
        dataclasses.replace(completion, generation=2),  # same completion id
    ):
        with pytest.raises(Exception):  # noqa: B017 - each adapter raises its own error for a violated key
            await env.store.write(lambda tx, d=duplicate: tx.completions.insert(d))
        assert await env.state() == before


# -- request ids ------------------------------------------------------------------


async def test_a_request_id_is_remembered_once(env):
    request = env.used(key("ClaimTask", "req-1", b"fp"))
    await env.store.write(lambda tx: tx.requests.remember(request, b"first", START))
    before = await env.state()
    with pytest.raises(Exception):  # noqa: B017 - each adapter raises its own error for a violated key
        await env.store.write(lambda tx: tx.requests.remember(request, b"second", START))
    assert await env.state() == before
    assert await env.read(lambda tx: tx.requests.recall(WS, CALLER, "ClaimTask", "req-1")) == (b"fp", b"first")


async def test_a_request_id_is_recalled_only_in_its_scope(env):
    await env.write(lambda tx: tx.requests.remember(key("ClaimTask", "req-1", b"fp"), b"answer", START))
    assert await env.read(lambda tx: tx.requests.recall(WS, CALLER, "ClaimTask", "req-1")) == (b"fp", b"answer")
    # The scope is (workspace, caller, RPC): another of any owns the same id afresh.
    for scope in (("ws-other", CALLER, "ClaimTask"), (WS, "host-2", "ClaimTask"), (WS, CALLER, "RenewLease")):
        assert await env.read(lambda tx, s=scope: tx.requests.recall(*s, "req-1")) is None


async def test_old_request_ids_are_forgotten_in_batches(env):
    for index in range(5):
        request = key("ClaimTask", f"req-{index}", b"fp")
        await env.store.write(lambda tx, r=request, i=index: tx.requests.remember(r, b"answer", START + i))
    assert await env.store.write(lambda tx: tx.requests.forget(START + 4, 3)) == 3
    assert await env.store.write(lambda tx: tx.requests.forget(START + 4, 3)) == 1
    remaining = await env.read(
        lambda tx: [tx.requests.recall(WS, CALLER, "ClaimTask", f"req-{i}") is not None for i in range(5)]
    )
    assert remaining == [False, False, False, False, True]


# -- runs and leases ----------------------------------------------------------


async def test_a_run_and_its_lease_round_trip_and_an_update_stores_the_expiry_and_the_closing_fields(env):
    run = a_run("run-1")
    await env.write(lambda tx: (tx.runs.insert(run), tx.runs.save_lease(WS, lease_of(run))))
    assert await env.read(lambda tx: tx.runs.load(WS, "run-1")) == run
    assert await env.read(lambda tx: tx.runs.load_lease(WS, "t-1")) == lease_of(run)
    assert await env.read(lambda tx: (tx.runs.load(WS, "run-x"), tx.runs.load_lease(WS, "t-x"))) == (None, None)

    closed = dataclasses.replace(
        run,
        lease_expires_at=START + 90 * SECOND,
        finished_at=START + 3 * SECOND,
        outcome=RunOutcome.FAILED,
        tokens_input=100,
        tokens_output=50,
        tokens_total=1000,
        notes="notes é\x00",
        notes_truncated=True,
        error="error \x00",
        final_status=FinalStatus.BLOCKED,
    )
    await env.write(lambda tx: tx.runs.update(closed))
    assert await env.read(lambda tx: tx.runs.load(WS, "run-1")) == closed
    # A lease is the task's: the next claim's replaces it.
    taken = Lease("t-1", "run-2", 2, START + 120 * SECOND)
    await env.write(lambda tx: tx.runs.save_lease(WS, taken))
    assert await env.read(lambda tx: tx.runs.load_lease(WS, "t-1")) == taken


async def test_runs_are_listed_newest_first_per_task_with_a_cursor(env):
    first = a_run("run-1", ttl=SECOND)
    second = a_run("run-2", claimed_at=START + 2 * SECOND, ttl=SECOND)
    other = a_run("run-3", "t-2", claimed_at=START + 2 * SECOND)
    await env.write(lambda tx: [tx.runs.insert(run) for run in (first, second, other)])
    assert [r.run_id for r in await env.read(lambda tx: tx.runs.page(WS, None, None, 10))] == [
        other.run_id,
        second.run_id,
        first.run_id,
    ]
    assert [r.run_id for r in await env.read(lambda tx: tx.runs.page(WS, "t-1", None, 10))] == [
        second.run_id,
        first.run_id,
    ]
    cursor = (second.claimed_at, second.run_id)
    assert [r.run_id for r in await env.read(lambda tx: tx.runs.page(WS, "t-1", cursor, 10))] == [first.run_id]
    assert [r.run_id for r in await env.read(lambda tx: tx.runs.page(WS, None, None, 1))] == [other.run_id]
    assert await env.read(lambda tx: tx.runs.page("ws-other", None, None, 10)) == []


async def test_open_runs_are_listed_alone_newest_first_with_a_cursor(env):
    old = a_run("run-1", "t-1", ttl=SECOND)
    closed = a_run("run-2", "t-2", claimed_at=START + SECOND, finished_at=START + SECOND, outcome=RunOutcome.SUCCEEDED)
    young = a_run("run-3", "t-3", claimed_at=START + 2 * SECOND)
    await env.write(lambda tx: [tx.runs.insert(run) for run in (old, closed, young)])

    def open_runs(task_id=None, before=None, limit=10):
        return env.read(lambda tx: [r.run_id for r in tx.runs.page(WS, task_id, before, limit, open_only=True)])

    # A lapsed lease does not close a run: only a close does.
    assert await open_runs() == [young.run_id, old.run_id]
    assert await open_runs(before=(young.claimed_at, young.run_id)) == [old.run_id]
    assert await open_runs("t-2") == [] and await open_runs(limit=1) == [young.run_id]


async def test_stalled_runs_are_claimed_oldest_expiry_first_up_to_the_limit(env):
    late = a_run("run-1", "t-1", ttl=5 * SECOND)
    early = a_run("run-2", "t-2", ttl=2 * SECOND)
    earliest = a_run("run-3", "t-3", ttl=SECOND)
    closed = a_run("run-4", "t-4", ttl=0, finished_at=START, outcome=RunOutcome.SUCCEEDED)
    await env.write(lambda tx: [tx.runs.insert(run) for run in (late, early, earliest, closed)])
    # Only open runs whose lease expired by the time given; the closed one is no one's to close.
    assert await env.write(lambda tx: tx.runs.claim_stalled(START + 3 * SECOND, 10)) == [earliest, early]
    assert await env.write(lambda tx: tx.runs.claim_stalled(START + 3 * SECOND, 1)) == [earliest]
    assert await env.write(lambda tx: tx.runs.claim_stalled(START, 10)) == []


# -- evidence ---------------------------------------------------------------------


async def test_a_generations_evidence_is_loaded_in_the_order_it_was_recorded(env):
    tests = an_evidence("evd-2", details="42 passed, é\x00")
    lint = an_evidence("evd-1", kind="lint", passed=False, run_id=None, recorded_by=Caller())
    later = an_evidence("evd-3", generation=2)
    for record in (tests, lint, later):
        await env.write(lambda tx, r=record: tx.evidence.insert(r))
    assert await env.read(lambda tx: tx.evidence.load(WS, "t-1", 1)) == [tests, lint]
    assert await env.read(lambda tx: tx.evidence.load(WS, "t-1", 2)) == [later]
    assert await env.read(lambda tx: tx.evidence.load(WS, "t-2", 1)) == []


async def test_a_tasks_evidence_is_listed_oldest_first_with_who_recorded_it_after_a_cursor(env):
    first = an_evidence("evd-1")
    second = an_evidence("evd-2", generation=2, kind="lint", recorded_at=START + SECOND)
    third = an_evidence("evd-3", generation=2, kind="review", recorded_at=START + SECOND)  # the same instant: by id
    for record in (first, second, third, an_evidence("evd-4", "t-2")):
        await env.write(lambda tx, r=record: tx.evidence.insert(r))

    def listed(generation=None, after=None, limit=10, workspace=WS):
        return env.read(lambda tx: tx.evidence.page(workspace, "t-1", generation, after, limit))

    assert await listed() == [first, second, third]
    assert first.recorded_by == Caller("agent-1", "agent")
    assert await listed(generation=2) == [second, third]
    assert await listed(after=(first.recorded_at, first.evidence_id)) == [second, third]
    assert await listed(after=(second.recorded_at, second.evidence_id), generation=2) == [third]
    assert await listed(limit=1) == [first]
    assert await listed(workspace="ws-other") == []


# -- completions, their settlement and the outbox ------------------------------------


async def test_a_completion_round_trips_every_field_and_is_deleted_by_its_generation(env):
    completion = a_completion(result="all tests pass, é\x00", traceparent=TRACEPARENT)
    await env.write(lambda tx: tx.completions.insert(completion))
    assert await env.read(lambda tx: tx.completions.load(WS, "t-1", 1)) == completion
    assert await env.read(lambda tx: tx.completions.load(WS, "t-1", 2)) is None
    await env.write(lambda tx: tx.completions.delete(WS, "t-1", 1))
    assert await env.read(lambda tx: tx.completions.load(WS, "t-1", 1)) is None
    assert await env.read(lambda tx: tx.completions.page(WS, None, None, None, 10)) == []


async def test_an_update_stores_the_settlement_fields_and_a_settled_row_has_no_due_time(env):
    completion = a_completion(traceparent=TRACEPARENT)
    refused = a_completion("t-2")
    await env.write(lambda tx: (tx.completions.insert(completion), tx.completions.insert(refused)))
    for attempt, error in enumerate(("UNAVAILABLE: connection refused", "DEADLINE_EXCEEDED: \x00late"), start=1):
        postponed = dataclasses.replace(
            completion, settle_attempts=attempt, next_settle_at=START + attempt * 10 * SECOND, last_settle_error=error
        )
        await env.write(lambda tx, p=postponed: tx.completions.update(p))
        assert await env.read(lambda tx: tx.completions.load(WS, "t-1", 1)) == postponed
    [listed, _] = await env.read(lambda tx: tx.completions.page(WS, None, SettlementStatus.PENDING, None, 10))
    assert listed == postponed

    answered = settled(postponed, START + 30 * SECOND)
    await env.write(lambda tx: tx.completions.update(answered))
    # Nothing is due once settled and no error stands; the traceparent stays the committing call's.
    assert await env.read(lambda tx: tx.completions.load(WS, "t-1", 1)) == answered
    assert (answered.next_settle_at, answered.last_settle_error, answered.traceparent) == (None, None, TRACEPARENT)
    rejected = dataclasses.replace(
        refused,
        settlement=SettlementStatus.REJECTED,
        settle_attempts=1,
        next_settle_at=None,
        settled_at=START + SECOND,
        error_reason="CANCELLATION_FENCED",
        error_message="fenced at \x00t",
    )
    await env.write(lambda tx: tx.completions.update(rejected))
    assert await env.read(lambda tx: tx.completions.load(WS, "t-2", 1)) == rejected
    assert await env.read(lambda tx: tx.completions.page(WS, None, SettlementStatus.PENDING, None, 10)) == []


async def test_completions_are_listed_by_commit_time_with_filters_and_a_cursor(env):
    first = a_completion("t-1")
    second = a_completion("t-2", committed_at=START + SECOND)
    await env.write(lambda tx: (tx.completions.insert(second), tx.completions.insert(first)))
    assert await env.read(lambda tx: tx.completions.page(WS, None, None, None, 10)) == [first, second]
    assert await env.read(lambda tx: tx.completions.page(WS, "t-2", None, None, 10)) == [second]
    cursor = (first.committed_at, first.completion_id)
    assert await env.read(lambda tx: tx.completions.page(WS, None, None, cursor, 10)) == [second]
    assert await env.read(lambda tx: tx.completions.page(WS, None, None, None, 1)) == [first]
    assert await env.read(lambda tx: tx.completions.page("ws-other", None, None, None, 10)) == []


async def test_the_settlement_filter_lists_only_that_status_in_commit_order_and_pages(env):
    committed = [
        a_completion(task_id, committed_at=START + n * SECOND)
        for n, task_id in enumerate(("t-1", "t-2", "t-3", "t-4", "t-5"))
    ]
    answered = settled(committed[1], START + 10 * SECOND)
    rejected = dataclasses.replace(
        committed[3], settlement=SettlementStatus.REJECTED, next_settle_at=None, error_reason="CANCELLATION_FENCED"
    )

    def put(tx: CompletionTx) -> None:
        for completion in committed:
            tx.completions.insert(completion)
        tx.completions.update(answered)
        tx.completions.update(rejected)

    await env.write(put)
    pending = [committed[0], committed[2], committed[4]]

    def listed(settlement, after=None, limit=10, task_id=None):
        return env.read(lambda tx: tx.completions.page(WS, task_id, settlement, after, limit))

    assert await listed(SettlementStatus.PENDING) == pending
    assert await listed(SettlementStatus.SETTLED) == [answered]
    assert await listed(SettlementStatus.REJECTED) == [rejected]
    assert len(await listed(None)) == 5
    assert await listed(SettlementStatus.PENDING, task_id="t-3") == [committed[2]]
    assert await listed(SettlementStatus.PENDING, task_id="t-2") == []
    # Pages of one: each cursor continues after the last pending row, skipping the others.
    pages, after = [], None
    while page := await listed(SettlementStatus.PENDING, after, limit=1):
        pages += page
        after = (page[-1].committed_at, page[-1].completion_id)
    assert pages == pending
    assert await listed(SettlementStatus.PENDING, (committed[1].committed_at, committed[1].completion_id)) == [
        committed[2],
        committed[4],
    ]


async def test_due_settlements_come_earliest_first_up_to_the_limit(env):
    first = a_completion("t-1")
    second = a_completion("t-2", committed_at=START + SECOND)
    await env.write(lambda tx: (tx.completions.insert(second), tx.completions.insert(first)))
    assert await env.due(START) == [first]
    assert await env.due(START + SECOND) == [first, second]
    assert await env.due(START + SECOND, limit=1) == [first]
    await env.write(lambda tx: tx.completions.update(settled(first, START + SECOND)))
    assert await env.due(START + SECOND) == [second]


async def test_a_generations_attempts_are_loaded_in_the_order_they_were_made(env):
    blocked = an_attempt("digest-b", checkpoint="", attempted_at=START + SECOND)
    allowed = an_attempt("digest-a", verdict=Verdict.ALLOW, state_version=4, attempted_at=START + 2 * SECOND)
    later = an_attempt("digest-c", generation=2, verdict=Verdict.HARD_BLOCK)
    for attempt in (blocked, allowed, later):
        await env.write(lambda tx, a=attempt: tx.completions.insert_attempt(a))
    assert await env.read(lambda tx: tx.completions.load_attempts(WS, "t-1", 1)) == [blocked, allowed]
    assert await env.read(lambda tx: tx.completions.load_attempts(WS, "t-1", 2)) == [later]
    assert await env.read(lambda tx: tx.completions.load_attempts(WS, "t-2", 1)) == []


# -- completion events and the audit log -------------------------------------------


async def test_an_event_round_trips_every_field_with_the_sequence_the_store_assigned(env):
    kind = CompletionEventKind
    events = [
        an_event(kind.RUN_CLOSED, run_outcome=RunOutcome.STALLED),
        an_event(kind.EVIDENCE_RECORDED, evidence_id="evd-1"),
        an_event(kind.DECISION_BLOCKED, outcome=RequestedOutcome.FAILED, decision=a_decision(allowed=False)),
        an_event(kind.COMPLETION_COMMITTED, completion_id="cmp-1", outcome=RequestedOutcome.COMPLETED),
        an_event(
            kind.TERMINALIZATION_ERROR,
            completion_id="cmp-1",
            outcome=RequestedOutcome.COMPLETED,
            decision=a_decision(allowed=False),
            lifecycle_revision=4,
            lifecycle_event_sequence=9,
            error_reason="CANCELLATION_FENCED",
            error_message="fenced at \x00t, é",
        ),
    ]
    appended = [await env.write(lambda tx, e=event: tx.events.append(e)) for event in events]
    assert [dataclasses.replace(e, sequence=0) for e in appended] == events
    assert await env.events() == appended


async def test_events_are_listed_per_workspace_or_task_after_a_sequence(env):
    kind = CompletionEventKind
    first = [await env.write(lambda tx, k=k: tx.events.append(an_event(k, "t-1"))) for k in (kind.RUN_CLAIMED,) * 2]
    second = [await env.write(lambda tx, k=k: tx.events.append(an_event(k, "t-2"))) for k in (kind.RUN_CLAIMED,) * 2]
    assert await env.listed(lambda tx: tx.events.page(WS, 0, None, 10), 4) == [*first, *second]
    assert await env.read(lambda tx: tx.events.page(WS, 0, "t-2", 10)) == second
    assert await env.read(lambda tx: tx.events.page(WS, first[-1].sequence, None, 10)) == second
    assert await env.read(lambda tx: tx.events.page(WS, 0, None, 1)) == first[:1]
    assert await env.read(lambda tx: tx.events.page("ws-other", 0, None, 10)) == []


async def test_the_audit_log_is_listed_by_id_with_filters_and_a_cursor(env):
    entries = [an_audit("run-1", "t-1"), an_audit("run-2", "t-2", outcome="STALLED", closed_by="stall_sweeper")]
    for entry in entries:
        await env.write(lambda tx, e=entry: tx.events.append_audit(e))
    every = await env.listed(lambda tx: tx.events.audit_page(WS, None, None, 0, 10), len(entries))
    assert every == [
        dataclasses.replace(entry, audit_id=stored.audit_id) for entry, stored in zip(entries, every, strict=True)
    ]
    assert every[0].audit_id < every[1].audit_id
    assert [a.run_id for a in await env.read(lambda tx: tx.events.audit_page(WS, "t-2", None, 0, 10))] == ["run-2"]
    assert [a.run_id for a in await env.read(lambda tx: tx.events.audit_page(WS, None, "run-1", 0, 10))] == ["run-1"]
    after_first = every[0].audit_id
    assert [a.run_id for a in await env.read(lambda tx: tx.events.audit_page(WS, None, None, after_first, 10))] == [
        "run-2"
    ]
    assert len(await env.read(lambda tx: tx.events.audit_page(WS, None, None, 0, 1))) == 1


# -- transcripts ------------------------------------------------------------------


async def test_transcript_events_checkpoints_and_the_tail_round_trip(env):
    batch = [
        ev(EventKind.TURN_START, "turn-1", 1),
        ev(EventKind.CHECKPOINT, "cp-1", 2),
        ev(EventKind.ASSISTANT_MESSAGE, sequence=3, text="hello é\x00"),
        ev(EventKind.TOOL_CALL, "call-1", 4, name="run"),
        ev(EventKind.TOOL_RESULT, "call-1", 5, text="failed", is_error=True, synthetic=True),
        ev(EventKind.TURN_END, "turn-1", 6, reason=TurnEndReason.COMPLETED),
    ]
    first = TranscriptState(Tail(checkpoint="cp-1", last_sequence=6), 1)

    def append(tx: CompletionTx) -> None:
        tx.transcripts.append(WS, "t-1", batch)
        tx.transcripts.insert_checkpoints(WS, "t-1", {"cp-1": 2})
        tx.transcripts.save_tail(WS, "t-1", first)

    await env.write(append)
    assert await env.read(lambda tx: tx.transcripts.page(WS, "t-1", 0, 100)) == batch
    assert await env.read(lambda tx: tx.transcripts.page(WS, "t-1", 3, 1)) == batch[3:4]
    assert await env.read(lambda tx: tx.transcripts.load_checkpoints(WS, "t-1", {"cp-1", "cp-none"})) == {"cp-1": 2}
    assert await env.read(lambda tx: tx.transcripts.load_tail(WS, "t-1")) == first
    open_turn = TranscriptState(Tail("turn-2", "step-1", ("call-2", "call-3"), "cp-1", 7), 2)
    await env.write(
        lambda tx: (
            tx.transcripts.append(WS, "t-1", [ev(EventKind.TURN_START, "turn-2", 7, generation=2)]),
            tx.transcripts.save_tail(WS, "t-1", open_turn),
        )
    )
    assert await env.read(lambda tx: tx.transcripts.load_tail(WS, "t-1")) == open_turn
    assert [e.generation for e in await env.read(lambda tx: tx.transcripts.page(WS, "t-1", 6, 10))] == [2]
    # Nothing of another task, and an empty tail without a transcript.
    assert await env.read(lambda tx: tx.transcripts.page(WS, "t-2", 0, 10)) == []
    assert await env.read(lambda tx: tx.transcripts.load_tail(WS, "t-2")) == TranscriptState()

    before = await env.state()
    for duplicate in (
        lambda tx: tx.transcripts.append(WS, "t-1", [ev(EventKind.CHECKPOINT, "cp-2", 7)]),  # sequence 7 is taken
        lambda tx: tx.transcripts.insert_checkpoints(WS, "t-1", {"cp-1": 7}),  # cp-1 was created at 2
    ):
        with pytest.raises(Exception):  # noqa: B017 - each adapter raises its own error for a violated key
            await env.store.write(duplicate)
        assert await env.state() == before


async def test_a_staged_import_moves_into_the_transcript_in_one_write_or_is_discarded(env):
    events = [
        ev(EventKind.TURN_START, "turn-1", 1, recorded_at=5),
        ev(EventKind.CHECKPOINT, "cp-1", 2, recorded_at=6),
        ev(EventKind.TURN_END, "turn-1", 3, recorded_at=7, reason=TurnEndReason.COMPLETED),
    ]
    # Staged in batches, each import apart from the others.
    await env.store.write(lambda tx: tx.imports.stage("import-1", events[2:]))
    await env.store.write(lambda tx: tx.imports.stage("import-1", events[:2]))
    await env.store.write(lambda tx: tx.imports.stage("import-2", events))
    await env.store.write(lambda tx: tx.imports.stage("import-3", events))
    await env.store.write(lambda tx: tx.imports.move("import-1", WS, "t-1"))
    assert await env.read(lambda tx: tx.transcripts.page(WS, "t-1", 0, 10)) == events
    # A moved import is gone from the staging area; a discarded one leaves nothing behind.
    await env.store.write(lambda tx: tx.imports.move("import-1", WS, "t-2"))
    await env.store.write(lambda tx: tx.imports.discard("import-2"))
    await env.store.write(lambda tx: tx.imports.move("import-2", WS, "t-2"))
    await env.store.write(lambda tx: tx.imports.discard(None))
    await env.store.write(lambda tx: tx.imports.move("import-3", WS, "t-2"))
    assert await env.read(lambda tx: tx.transcripts.page(WS, "t-2", 0, 10)) == []


# -- the operator's figures ------------------------------------------------------------


async def test_the_figures_count_the_outbox_open_runs_live_leases_and_request_ids(env):
    empty = await env.read(lambda tx: tx.load_figures(START))
    assert (
        empty.pending_settlements,
        empty.oldest_pending_committed_at,
        empty.open_runs,
        empty.live_leases,
        empty.request_ids,
    ) == (0, None, 0, 0, 0)
    # Only the in-memory fake has no database on disk.
    assert (empty.database_bytes is None) == isinstance(env.store, MemoryCompletionStore)
    first_run, second_run = a_run("run-1", ttl=10 * SECOND), a_run("run-2", "t-2", claimed_at=START + SECOND)
    first, second = a_completion("t-1"), a_completion("t-2", committed_at=START + SECOND)

    def put(tx: CompletionTx) -> None:
        for run in (first_run, second_run):
            tx.runs.insert(run)
            tx.runs.save_lease(WS, lease_of(run))
        tx.completions.insert(first)
        tx.completions.insert(second)
        tx.requests.remember(key("ClaimTask", "claim-1", b"fp"), b"answer", START)

    await env.write(put)
    figures = await env.read(lambda tx: tx.load_figures(START + SECOND))
    assert (figures.pending_settlements, figures.oldest_pending_committed_at) == (2, first.committed_at)
    assert (figures.open_runs, figures.live_leases, figures.request_ids) == (2, 2, 1)
    # t-1's lease has expired 20 s later; its run is still open.
    assert (await env.read(lambda tx: tx.load_figures(START + 20 * SECOND))).live_leases == 1
    await env.write(lambda tx: tx.completions.update(settled(first, START + SECOND)))
    closed = dataclasses.replace(second_run, finished_at=START + SECOND, outcome=RunOutcome.SUCCEEDED)
    await env.write(lambda tx: tx.runs.update(closed))
    figures = await env.read(lambda tx: tx.load_figures(START + SECOND))
    assert (figures.pending_settlements, figures.oldest_pending_committed_at) == (1, second.committed_at)
    assert (figures.open_runs, figures.live_leases) == (1, 1)
    if empty.database_bytes is not None:
        assert figures.database_bytes is not None and figures.database_bytes > 0


# -- the SQLite file (inspected on purpose, with sqlite3) ------------------------------


async def test_sqlite_stores_the_audit_metadata_as_a_json_object(tmp_path):
    store = await SqliteCompletionStore.open(str(tmp_path / "completion.sqlite3"))
    try:
        await store.write(
            lambda tx: tx.events.append_audit(an_audit("run-1", outcome="STALLED", closed_by="stall_sweeper"))
        )
    finally:
        await store.close()
    db = sqlite3.connect(tmp_path / "completion.sqlite3")
    try:
        [(metadata,)] = db.execute("SELECT metadata FROM audit_log").fetchall()
    finally:
        db.close()
    assert json.loads(metadata) == {"outcome": "STALLED", "final_status": "UNCHANGED", "closed_by": "stall_sweeper"}


@pytest.mark.parametrize("before", [None, (START, "run-9")], ids=["first page", "next page"])
async def test_sqlite_open_runs_are_read_from_the_index_of_open_runs_in_its_order(tmp_path, before):
    """What keeps ListRuns(open_only) independent of how many runs are closed: the
    query walks the partial index of open runs in the listing's order (a search,
    no sort of what it found)."""
    path = str(tmp_path / "completion.sqlite3")
    await (await SqliteCompletionStore.open(path)).close()
    run: list[str] = []
    with sqlite3.connect(path) as db:
        db.set_trace_callback(run.append)
        SqliteRuns(Session(db)).page(WS, None, before, 50, open_only=True)
        db.set_trace_callback(None)
        [sql] = run
        plan = " / ".join(row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}"))
    assert "agent_runs_open_by_claim" in plan and "TEMP B-TREE" not in plan and "SCAN" not in plan, plan


async def test_postgresql_open_runs_are_read_from_the_index_of_open_runs(tmp_path, clock):
    """The same on PostgreSQL (the query is SQLite's: the PostgreSQL adapter inherits
    it): with sequential scans priced out, as a large table would, the plan reads
    the partial index of open runs, without a sort."""
    store = await make_postgresql(tmp_path, clock)
    statements: list[str] = []

    class Traced(SqliteStyle):
        def execute(self, sql, params=()):
            statements.append(sql)
            return super().execute(sql, params)

    def plan(conn) -> str:
        session = PostgresSession(conn, writable=False)
        session.db = Traced(conn)
        PostgresRuns(session).page(WS, None, (START, "run-9"), 50, open_only=True)
        [sql] = statements
        conn.execute("SET LOCAL enable_seqscan = off")
        rows = SqliteStyle(conn).execute(f"EXPLAIN {sql}", (WS, START, "run-9", 50)).fetchall()
        return " / ".join(row[0] for row in rows)

    try:
        found = await store.database.read(plan)
    finally:
        await store.close()
    assert "agent_runs_open_by_claim" in found and "Sort" not in found, found
