"""Two replicas of the completion service on one PostgreSQL database: what must hold
when they receive the same or competing requests at the same moment.

Store level: two `PostgresCompletionStore`s (two connection pools, as two processes
have) running the units of work of the application layer, each with its own ids.
Renders run inside the transaction and are slowed down, so that the races really
overlap. Server level: two in-process completion servers on one database URL (and
one lifecycle server), a watcher on each and writers on both."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable

import grpc
import psycopg
import pytest
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc

from completion_service.api.service import SERVICE_NAME
from completion_service.core.gates import WorkspacePolicy
from completion_service.core.model import CompletionEventKind, RequestedOutcome, RunOutcome, SettlementStatus, Verdict
from completion_service.policy import parse_policy
from completion_service.server import CompletionConfig, RunningCompletion
from completion_service.server import start as start_completion
from completion_service.storage.postgres import PostgresCompletionStore
from completion_service.units import runs, settlements
from completion_service.units.completions import AttemptOutcome
from completion_service.units.runs import Claimed
from completion_service.units.settlements import Recorded, Settlement
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import completion_service_pb2_grpc as completion_grpc
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.runtime.clock import ManualClock, RandomIds
from funnel.runtime.errors import Rejection
from funnel.runtime.idempotency import Replay, fingerprint
from lifecycle_service.server import LifecycleConfig
from tests import credentials
from tests.completion.e2e_support import CALL_TIMEOUT, Funnel, eventually
from tests.completion.test_unit_flows import (
    SECOND,
    WS,
    Env,
    key,
    render_attempt,
    render_claim,
    render_run,
)
from tests.postgres import fresh_database


class Ids:
    """Ids of one replica: never the same as another replica's."""

    def __init__(self, replica: str) -> None:
        self._replica = replica
        self._counter = itertools.count(1)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{self._replica}{next(self._counter):06d}"


def slowly(render: Callable) -> Callable:
    def render_slowly(value) -> bytes:
        time.sleep(0.01)  # inside the transaction: keeps it open while the other replica arrives
        return render(value)

    return render_slowly


@pytest.fixture
def completion_engine() -> str:
    """`start_funnel` of this module runs the completion service on PostgreSQL only."""
    return "postgresql"


@pytest.fixture
async def url() -> str:
    return await asyncio.to_thread(fresh_database)


@pytest.fixture
async def replicas(url, clock) -> AsyncIterator[tuple[Env, Env]]:
    # Replicas starting together: the migrations are applied once, under a lock.
    stores = await asyncio.gather(PostgresCompletionStore.open(url), PostgresCompletionStore.open(url))
    a, b = Env(stores[0], clock), Env(stores[1], clock)
    a.ids, b.ids = Ids("a"), Ids("b")
    try:
        yield a, b
    finally:
        for store in stores:
            await store.close()


def outcomes(results: list) -> Counter:
    return Counter(r.reason.name if isinstance(r, Rejection) else type(r).__name__ for r in results)


async def table_counts(env: Env) -> dict[str, int]:
    return await env.read(
        lambda tx: {
            "runs": len(tx.runs.page(WS, None, None, 10_000)),
            "completions": len(tx.completions.page(WS, None, None, None, 10_000)),
            "events": len(tx.events.page(WS, 0, None, 10_000)),
            "audit": len(tx.events.audit_page(WS, None, None, 0, 10_000)),
        }
    )


# -- request ids -------------------------------------------------------------------


async def test_the_same_claim_request_id_at_both_replicas_has_one_effect_and_one_answer(replicas):
    a, b = replicas
    tasks = [f"t-{n}" for n in range(6)]

    async def claim(env: Env, task_id: str):
        request = key("ClaimTask", f"claim-{task_id}", fingerprint("ClaimTask", task_id.encode()))
        command = runs.ClaimCommand(
            WS, task_id, "agent-1", 1, 60 * SECOND, env.ids.new_id("run"), request, slowly(render_claim)
        )
        return await env.write(runs.claim, command=command)

    results = await asyncio.gather(*(claim(env, task_id) for task_id in tasks for env in (a, b)))
    for pair in zip(results[::2], results[1::2], strict=True):
        assert sorted(type(r).__name__ for r in pair) == ["Claimed", "Replay"], pair
        claimed = next(r for r in pair if isinstance(r, Claimed))
        replay = next(r for r in pair if isinstance(r, Replay))
        assert replay.response == render_claim(claimed)
    for task_id in tasks:
        assert len(await a.read(lambda tx, t=task_id: tx.runs.page(WS, t, None, 10))) == 1
        assert (await b.lease(task_id)).epoch == 1


async def test_the_same_attempt_and_close_request_ids_at_both_replicas_have_one_effect(replicas):
    a, b = replicas
    claims = [await a.claimed(f"t-{n}") for n in range(5)]

    async def attempt(env: Env, claimed: Claimed):
        request = key("AttemptCompletion", f"att-{claimed.run.task_id}", b"the same attempt")
        return await env.attempt(claimed, request=request, render=slowly(render_attempt))

    results = await asyncio.gather(*(attempt(env, claimed) for claimed in claims for env in (a, b)))
    for pair in zip(results[::2], results[1::2], strict=True):
        assert sorted(type(r).__name__ for r in pair) == ["AttemptOutcome", "Replay"], pair
        first = next(r for r in pair if isinstance(r, AttemptOutcome))
        assert first.inserted and next(r for r in pair if isinstance(r, Replay)).response == render_attempt(first)

    async def close(env: Env, claimed: Claimed):
        request = key("CompleteRun", f"close-{claimed.run.task_id}", b"the same close")
        return await env.close(claimed.run.run_id, request=request, render=slowly(render_run))

    results = await asyncio.gather(*(close(env, claimed) for claimed in claims for env in (a, b)))
    for pair in zip(results[::2], results[1::2], strict=True):
        assert sorted(type(r).__name__ for r in pair) == ["Closed", "Replay"], pair
    # One completion per task, one close with one audit row per run; three events
    # per task: its claim, its completion, its run's close.
    assert await table_counts(a) == {"runs": 5, "completions": 5, "events": 15, "audit": 5}


# -- leases, the duplicate policy, the circuit breaker ------------------------------------


async def test_concurrent_claims_of_one_task_at_both_replicas_grant_one_lease(replicas):
    a, b = replicas
    for n in range(4):
        task_id = f"t-{n}"
        results = await asyncio.gather(*(env.claim(task_id, agent=f"agent-{i}") for i in range(4) for env in (a, b)))
        assert outcomes(results) == Counter({"Claimed": 1, "LEASE_HELD": 7}), results
        [winner] = [r for r in results if isinstance(r, Claimed)]
        assert winner.lease.epoch == 1
        assert await b.lease(task_id) == winner.lease
        assert [r.run_id for r in await a.read(lambda tx, t=task_id: tx.runs.page(WS, t, None, 10))] == [
            winner.run.run_id
        ]


async def test_the_duplicate_policy_holds_across_replicas(replicas):
    a, b = replicas
    same = [await a.claimed(f"same-{n}") for n in range(4)]
    # The same attempt at both: one inserts the completion, the other finds it.
    results = await asyncio.gather(*(env.attempt(claimed) for claimed in same for env in (a, b)))
    for claimed, pair in zip(same, zip(results[::2], results[1::2], strict=True), strict=True):
        inserted = [r for r in pair if r.inserted]
        existing = [r for r in pair if r.existing]
        assert len(inserted) == len(existing) == 1, pair
        assert existing[0].completion == inserted[0].completion == await a.completion(claimed.run.task_id)

    # Another outcome for the same generation at the same moment: one wins, the other conflicts.
    other = [await b.claimed(f"other-{n}") for n in range(4)]
    results = await asyncio.gather(
        *(
            env.attempt(claimed, outcome=outcome)
            for claimed in other
            for env, outcome in ((a, RequestedOutcome.COMPLETED), (b, RequestedOutcome.FAILED))
        )
    )
    assert outcomes(results) == Counter({"AttemptOutcome": 4, "COMPLETION_CONFLICT": 4}), results
    events = await a.events()
    committed = [e for e in events if e.kind is CompletionEventKind.COMPLETION_COMMITTED]
    assert len(committed) == len({e.task_id for e in committed}) == 8


async def test_circuit_breaker_counts_are_shared_by_the_replicas(replicas):
    a, b = replicas
    policy = WorkspacePolicy(required_evidence=("tests",), breaker_threshold=3)
    claimed = await a.claimed()
    results = await asyncio.gather(*(env.attempt(claimed, policy=policy) for _ in range(4) for env in (a, b)))
    verdicts = Counter(r.decision.verdict for r in results)
    # Judged one after the other: exactly `threshold` soft blocks, then the breaker.
    assert verdicts == Counter({Verdict.SOFT_BLOCK: 3, Verdict.HARD_BLOCK: 5}), verdicts
    assert await b.attempts() == 8
    again = await b.attempt(claimed, policy=policy)
    assert [g.gate_id for g in again.decision.trace if g.decisive] == ["completion.circuit_breaker"]


# -- background work that every replica runs -------------------------------------------------


async def test_the_settlement_outbox_is_never_claimed_by_two_replicas(replicas, clock):
    a, b = replicas
    for n in range(20):
        claimed = await (a if n % 2 else b).claimed(f"t-{n}")
        assert (await a.attempt(claimed)).inserted
    now, lease = clock.now_micros(), 10 * SECOND

    def claim(env: Env, owner: str, at: int, limit: int = 100):
        return env.store.write(
            lambda tx: settlements.claim_due(tx, now=at, owner=owner, lease_micros=lease, limit=limit)
        )

    everything = {c.completion_id for c in await a.read(lambda tx: tx.completions.page(WS, None, None, None, 100))}
    mine, theirs = await asyncio.gather(claim(a, "a", now, 12), claim(b, "b", now, 12))
    mine_ids, their_ids = {c.completion_id for c in mine}, {c.completion_id for c in theirs}
    assert not mine_ids & their_ids and mine_ids | their_ids == everything
    # Each owner gets its own rows again and nothing the other holds; a lapsed claim is taken over.
    assert {c.completion_id for c in await claim(a, "a", now + 1)} == mine_ids
    assert await claim(b, "c", now + 1) == []
    assert {c.completion_id for c in await claim(b, "b", now + 1 + lease)} == everything

    # Both settle the same row at once: one records it, with one terminal event.
    completion = mine[0]
    recorded = await asyncio.gather(
        *(
            env.write(
                settlements.record_settlement,
                completion=completion,
                settlement=Settlement(lifecycle_revision=3, lifecycle_event_sequence=n),
            )
            for n, env in enumerate((a, b, a, b))
        )
    )
    assert sum(isinstance(r, Recorded) for r in recorded) == 1
    assert (await b.completion(completion.task_id)).settlement is SettlementStatus.SETTLED
    terminal = [e for e in await a.events(completion.task_id) if e.kind is CompletionEventKind.COMPLETION_SETTLED]
    assert len(terminal) == 1


async def test_stalled_runs_are_swept_once_by_replicas_sweeping_together(replicas, clock):
    a, b = replicas
    stalled = [await (a if n % 2 else b).claimed(f"t-{n}", ttl=SECOND) for n in range(30)]
    clock.advance(10 * SECOND)

    def sweep(env: Env, limit: int):
        return env.write(runs.close_stalled_runs, stall_after_micros=SECOND, limit=limit)

    swept = await asyncio.gather(sweep(a, 20), sweep(b, 20), sweep(a, 20), sweep(b, 20))
    closed = [c.run.run_id for batch in swept for c in batch]
    assert sorted(closed) == sorted(c.run.run_id for c in stalled)  # each exactly once
    audit = await a.read(lambda tx: tx.events.audit_page(WS, None, None, 0, 1000))
    assert sorted(e.run_id for e in audit) == sorted(closed)
    ids = [e.audit_id for e in audit]
    assert len(ids) == 30 and ids == sorted(set(ids))  # each once, in one order
    for claimed in stalled:
        assert (await b.run(claimed.run.run_id)).outcome is RunOutcome.STALLED


# -- servers: watchers and request ids across replicas, over gRPC -------------------------------


@dataclasses.dataclass
class TwoServers:
    f: Funnel
    second: RunningCompletion
    a: completion_grpc.CompletionServiceStub
    b: completion_grpc.CompletionServiceStub


@pytest.fixture
async def two_servers(tmp_path, url) -> AsyncIterator[TwoServers]:
    """One lifecycle server and two completion servers on one PostgreSQL database."""
    clock = ManualClock()
    f = Funnel(
        clock,
        tmp_path,
        LifecycleConfig(listen="127.0.0.1:0", database=str(tmp_path / "lifecycle.sqlite3"), health_interval=5.0),
        CompletionConfig(
            listen="127.0.0.1:0", database=url, lifecycle_timeout=2.0, settle_interval=0.05, health_interval=5.0
        ),
        {},
    )
    await f.start()
    second = await start_completion(f.completion_config, clock=clock, ids=RandomIds(), policies=parse_policy({}))
    channel = credentials.insecure_channel(second.address)
    try:
        yield TwoServers(f, second, f.cs, completion_grpc.CompletionServiceStub(channel))
    finally:
        await channel.close()
        await second.stop(None)
        await f.close()


class Watcher:
    def __init__(self, stub: completion_grpc.CompletionServiceStub, task_id: str = "") -> None:
        self.call = stub.WatchCompletionEvents(
            completion_messages.WatchCompletionEventsRequest(workspace_id=WS, task_id=task_id)
        )

    async def take(self, count: int) -> list[completion_types.CompletionEvent]:
        events = []
        for _ in range(count):
            item = await asyncio.wait_for(self.call.read(), timeout=CALL_TIMEOUT)
            assert item is not grpc.aio.EOF, events
            events.append(item.event)
        return events

    async def nothing_more(self, quiet: float = 0.3) -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(self.call.read(), timeout=quiet)

    def close(self) -> None:
        self.call.cancel()


def claim_request(task_id: str, request_id: str = "") -> completion_messages.ClaimTaskRequest:
    return completion_messages.ClaimTaskRequest(
        workspace_id=WS, task_id=task_id, agent_id="agent-1", lease_ttl=Duration(seconds=600), request_id=request_id
    )


async def test_a_watcher_on_either_replica_receives_every_event_of_both_in_order(two_servers):
    s = two_servers
    tasks = [f"t-{n}" for n in range(8)]
    for task_id in tasks:
        await s.f.register(task_id)
    on_a, on_b, one_task = Watcher(s.a), Watcher(s.b), Watcher(s.a, task_id="t-1")
    try:

        async def finish(stub, task_id: str) -> None:
            claim = await stub.ClaimTask(claim_request(task_id), timeout=CALL_TIMEOUT)
            attempt = await stub.AttemptCompletion(
                completion_messages.AttemptCompletionRequest(
                    workspace_id=WS,
                    task_id=task_id,
                    run_id=claim.run.run_id,
                    epoch=claim.lease.epoch,
                    outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
                    result="done",
                ),
                timeout=CALL_TIMEOUT,
            )
            assert attempt.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED

        # Concurrent commits through both replicas, mostly through B.
        await asyncio.gather(*(finish(s.a if n % 3 == 0 else s.b, task_id) for n, task_id in enumerate(tasks)))
        # A listing across tasks delivers below the horizon: a write transaction either
        # replica's background work holds open (a claim of due settlements, a sweep)
        # holds the events committed after it back until it ends (a full run met one).
        async with asyncio.timeout(10):
            while len(stored := await s.second.store.read(lambda tx: tx.events.page(WS, 0, None, 1000))) < 3 * len(
                tasks
            ):
                await asyncio.sleep(0.02)
        assert len(stored) == 3 * len(tasks)  # each task: claimed, committed, settled
        for watcher in (on_a, on_b):
            received = await watcher.take(len(stored))
            # In order, each event once: what the table holds by cursor.
            assert [(e.sequence, e.task_id, e.completion_id) for e in received] == [
                (e.sequence, e.task_id, e.completion_id or "") for e in stored
            ]
            await watcher.nothing_more()
        assert [e.sequence for e in await one_task.take(3)] == [e.sequence for e in stored if e.task_id == "t-1"]
        await one_task.nothing_more()
    finally:
        for watcher in (on_a, on_b, one_task):
            watcher.close()


async def test_the_same_request_id_at_two_servers_gets_the_same_bytes(two_servers):
    s = two_servers
    tasks = [f"t-{n}" for n in range(6)]
    for task_id in tasks:
        await s.f.register(task_id)
    answers = await asyncio.gather(
        *(
            stub.ClaimTask(claim_request(task_id, f"claim-{task_id}"), timeout=CALL_TIMEOUT)
            for task_id in tasks
            for stub in (s.a, s.b)
        )
    )
    for first, second in zip(answers[::2], answers[1::2], strict=True):
        assert first.SerializeToString(deterministic=True) == second.SerializeToString(deterministic=True)
    for task_id in tasks:
        listed = await s.b.ListRuns(
            completion_messages.ListRunsRequest(workspace_id=WS, task_id=task_id), timeout=CALL_TIMEOUT
        )
        assert len(listed.runs) == 1

    attempts = await asyncio.gather(
        *(
            stub.AttemptCompletion(
                completion_messages.AttemptCompletionRequest(
                    workspace_id=WS,
                    task_id=claim.run.task_id,
                    run_id=claim.run.run_id,
                    epoch=claim.lease.epoch,
                    outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
                    result="done",
                    request_id=f"attempt-{claim.run.task_id}",
                ),
                timeout=CALL_TIMEOUT,
            )
            for claim in answers[::2]
            for stub in (s.b, s.a)
        )
    )
    # The same decision and completion; a replay shows the completion's settlement as
    # it is now, which may still be PENDING while the first call settles it.
    for first, second in zip(attempts[::2], attempts[1::2], strict=True):
        assert first.completion.completion_id and first.completion.completion_id == second.completion.completion_id
        assert first.decision.verdict == second.decision.verdict == completion_enums.VERDICT_ALLOW
        assert (first.existing_completion, second.existing_completion) == (False, False)
    listed = await s.a.ListCompletions(
        completion_messages.ListCompletionsRequest(workspace_id=WS), timeout=CALL_TIMEOUT
    )
    assert len(listed.completions) == len(tasks)
    assert {c.settlement for c in listed.completions} == {completion_enums.SETTLEMENT_STATUS_SETTLED}
    # Once settled, a retry at either replica gets the first answer's bytes.
    for claim, answer in zip(answers[::2], attempts[::2], strict=True):
        if answer.completion.settlement != completion_enums.SETTLEMENT_STATUS_SETTLED:
            continue
        for stub in (s.a, s.b):
            again = await stub.AttemptCompletion(
                completion_messages.AttemptCompletionRequest(
                    workspace_id=WS,
                    task_id=claim.run.task_id,
                    run_id=claim.run.run_id,
                    epoch=claim.lease.epoch,
                    outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
                    result="done",
                    request_id=f"attempt-{claim.run.task_id}",
                ),
                timeout=CALL_TIMEOUT,
            )
            assert again.SerializeToString(deterministic=True) == answer.SerializeToString(deterministic=True)


async def test_replicas_starting_together_migrate_once_and_report_health_from_the_database(url, start_funnel):
    stores = await asyncio.gather(*(PostgresCompletionStore.open(url) for _ in range(3)))
    try:
        applied = await stores[0].database.read(
            lambda conn: conn.execute("SELECT version, name FROM schema_migrations").fetchall()
        )
        assert applied == [
            (1, "initial"),
            (2, "completion_traceparent"),
            (3, "settlement_outbox_view"),
            (4, "run_and_evidence_events"),
            (5, "evidence_recorded_by"),
            (6, "open_runs_by_claim"),
            (7, "numbers_without_a_counter"),
        ]
    finally:
        for store in stores:
            await store.close()

    f = await start_funnel(completion={"database": url, "health_interval": 0.05})
    channel = credentials.insecure_channel(f.completion.address)
    health = health_pb2_grpc.HealthStub(channel)

    async def status(wanted: int) -> bool:
        try:
            answer = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as error:  # before the first probe
            assert error.code() == grpc.StatusCode.NOT_FOUND, error
            return False
        return answer.status == wanted

    try:
        await eventually(lambda: status(health_pb2.HealthCheckResponse.SERVING))
        # An operator holds the schema locked: no write can be taken, the probe says so.
        with psycopg.connect(url, autocommit=True) as operator, operator.transaction():
            operator.execute("LOCK TABLE funnel_completion.schema_migrations IN ACCESS EXCLUSIVE MODE")
            await eventually(lambda: status(health_pb2.HealthCheckResponse.NOT_SERVING))
        await eventually(lambda: status(health_pb2.HealthCheckResponse.SERVING))
    finally:
        await channel.close()
