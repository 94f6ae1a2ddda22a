"""Two replicas of each service on one PostgreSQL database, clients spreading
calls over them: concurrent claims, attempts, cancellations and resumes on shared
tasks, and one replica of each service killed with SIGKILL mid-burst and
restarted. Afterwards every guarantee must still hold across the replicas:
exactly one terminal event per generation, every committed completion settled
exactly once or recorded as rejected, and a watcher on each replica saw the same
sequence of events, each once (the killed one's watcher resumed from its cursor)."""

from __future__ import annotations

import asyncio
import collections
import random
import time
import uuid

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.runtime.grpc_errors import error_info
from tests.postgres import fresh_database
from tests.replicas.cluster import Cluster

WS = "ws-replicas"
TASKS = [f"task-{n}" for n in range(12)]
AGENTS = ["agent-a", "agent-b", "agent-c"]
WORKERS = 12
BURST = 14.0  # seconds of workload
KILL_AT, RESTART_AT = 4.0, 7.0
CALL_TIMEOUT = 5.0
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class Clients:
    """Spreads each call over the replicas; a call that finds its replica down
    goes to another with the same request (so the same request_id)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.calls = 0
        self.moved = 0
        self.reasons: collections.Counter[str] = collections.Counter()

    async def call(self, service: str, invoke, window: float = 60.0):
        """The response, or the AioRpcError of a refusal (never a transport failure)."""
        count = len(self.cluster.lifecycles)
        deadline = time.monotonic() + window
        order = random.sample(range(count), count)
        attempt = 0
        while True:
            replica = order[attempt % count]
            stub = self.cluster.lifecycle(replica) if service == "lifecycle" else self.cluster.completion(replica)
            self.calls += 1
            try:
                return await invoke(stub)
            except grpc.aio.AioRpcError as error:
                if error.code() not in RETRYABLE:
                    info = error_info(error)
                    assert error.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), error.details()
                    assert info is not None, (error.code(), error.details())
                    self.reasons[info.reason] += 1
                    return error
            self.moved += 1
            attempt += 1
            assert time.monotonic() < deadline, "no replica answered"
            await asyncio.sleep(0.05)


def rid() -> str:
    return uuid.uuid4().hex


async def work_on(clients: Clients, task_id: str, stats: collections.Counter) -> None:
    """One random step on a shared task. Each request is built once, with its
    request_id, so that a retry on another replica is the same request."""
    choice = random.random()
    if choice < 0.6:
        claim_request = completion_messages.ClaimTaskRequest(
            workspace_id=WS,
            task_id=task_id,
            agent_id=random.choice(AGENTS),
            lease_ttl=Duration(seconds=20),
            request_id=rid(),
        )
        claim = await clients.call("completion", lambda s: s.ClaimTask(claim_request, timeout=CALL_TIMEOUT))
        if isinstance(claim, grpc.aio.AioRpcError):
            return
        stats["claims"] += 1
        run = claim.run
        evidence = completion_messages.RecordEvidenceRequest(
            workspace_id=WS,
            task_id=task_id,
            generation=run.generation,
            kind="tests",
            verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
            run_id=run.run_id,
            request_id=rid(),
        )
        await clients.call("completion", lambda s: s.RecordEvidence(evidence, timeout=CALL_TIMEOUT))
        attempt_request = completion_messages.AttemptCompletionRequest(
            workspace_id=WS,
            task_id=task_id,
            run_id=run.run_id,
            epoch=claim.lease.epoch,
            result="done",
            request_id=rid(),
            outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
        )
        attempt = await clients.call("completion", lambda s: s.AttemptCompletion(attempt_request, timeout=CALL_TIMEOUT))
        if not isinstance(attempt, grpc.aio.AioRpcError):
            stats["attempts"] += 1
            if attempt.decision.next_action == completion_enums.AGENT_ACTION_REPORT_COMPLETE:
                assert attempt.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED  # binding answers
        close = completion_messages.CompleteRunRequest(
            workspace_id=WS,
            run_id=run.run_id,
            request_id=rid(),
            outcome=random.choice([completion_enums.RUN_OUTCOME_SUCCEEDED, completion_enums.RUN_OUTCOME_STALLED]),
        )
        await clients.call("completion", lambda s: s.CompleteRun(close, timeout=CALL_TIMEOUT))
        return
    read = lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id=task_id)
    task = (await clients.call("lifecycle", lambda s: s.GetTask(read, timeout=CALL_TIMEOUT))).task
    if task.state == lifecycle_enums.GENERATION_STATE_TERMINAL:
        resume = lifecycle_messages.ResumeWithGenerationRequest(
            workspace_id=WS,
            task_id=task_id,
            generation=task.generation + 1,
            expected_revision=task.revision,
            request_id=rid(),
        )
        resumed = await clients.call("lifecycle", lambda s: s.ResumeWithGeneration(resume, timeout=CALL_TIMEOUT))
        stats["resumes"] += not isinstance(resumed, grpc.aio.AioRpcError)
    elif choice < 0.8:
        fence = lifecycle_messages.RequestCancellationRequest(
            workspace_id=WS, task_id=task_id, generation=task.generation, request_id=rid()
        )
        fenced = await clients.call("lifecycle", lambda s: s.RequestCancellation(fence, timeout=CALL_TIMEOUT))
        if not isinstance(fenced, grpc.aio.AioRpcError):
            stats["cancellations"] += 1
            settle = lifecycle_messages.SettleCancellationRequest(
                workspace_id=WS, task_id=task_id, generation=task.generation, request_id=rid()
            )
            await clients.call("lifecycle", lambda s: s.SettleCancellation(settle, timeout=CALL_TIMEOUT))


class Watcher:
    """A watch stream of one service on one replica, resumed from its cursor
    whenever it breaks."""

    def __init__(self, cluster: Cluster, service: str, replica: int) -> None:
        self.cluster = cluster
        self.service = service
        self.replica = replica
        self.events: list = []
        self.breaks = 0

    @property
    def cursor(self) -> int:
        return self.events[-1].sequence if self.events else 0

    async def run(self) -> None:
        while True:
            try:
                if self.service == "lifecycle":
                    stream = self.cluster.lifecycle(self.replica).WatchLifecycleEvents(
                        lifecycle_messages.WatchLifecycleEventsRequest(workspace_id=WS, after_sequence=self.cursor)
                    )
                else:
                    stream = self.cluster.completion(self.replica).WatchCompletionEvents(
                        completion_messages.WatchCompletionEventsRequest(workspace_id=WS, after_sequence=self.cursor)
                    )
                async for message in stream:
                    self.events.append(message.event)
            except grpc.aio.AioRpcError:
                self.breaks += 1
                await asyncio.sleep(0.1)


async def all_completions(clients: Clients) -> list[completion_types.Completion]:
    found, token = [], ""
    while True:
        page = await clients.call(
            "completion",
            lambda s, t=token: s.ListCompletions(
                completion_messages.ListCompletionsRequest(workspace_id=WS, page_size=500, page_token=t),
                timeout=CALL_TIMEOUT,
            ),
        )
        found += page.completions
        token = page.next_page_token
        if not token:
            return found


async def completion_sequences(clients: Clients) -> list[int]:
    """The sequences of the workspace's completion events, as listed by cursor."""
    sequences: list[int] = []
    while True:
        cursor = sequences[-1] if sequences else 0
        page = await clients.call(
            "completion",
            lambda s, c=cursor: s.ListCompletionEvents(
                completion_messages.ListCompletionEventsRequest(workspace_id=WS, after_sequence=c, page_size=500),
                timeout=CALL_TIMEOUT,
            ),
        )
        if not page.events:
            return sequences
        sequences += [event.sequence for event in page.events]


@pytest.fixture
async def cluster(tmp_path):
    url = await asyncio.to_thread(fresh_database)
    started = Cluster(tmp_path, url).start()
    try:
        yield started
    finally:
        await started.stop()


async def test_two_replicas_of_each_service_keep_every_guarantee_through_a_kill(cluster):
    clients = Clients(cluster)
    for task_id in TASKS:
        register = lifecycle_messages.RegisterTaskRequest(
            workspace_id=WS, task_id=task_id, request_id=f"register-{task_id}"
        )
        await clients.call("lifecycle", lambda s, r=register: s.RegisterTask(r, timeout=CALL_TIMEOUT))
    watchers = [Watcher(cluster, "lifecycle", n) for n in range(2)]
    completion_watchers = [Watcher(cluster, "completion", n) for n in range(2)]
    watching = [asyncio.create_task(w.run()) for w in watchers + completion_watchers]
    stats: collections.Counter[str] = collections.Counter()
    started = time.monotonic()

    async def worker() -> None:
        while time.monotonic() - started < BURST:
            await work_on(clients, random.choice(TASKS), stats)

    async def chaos() -> None:
        await asyncio.sleep(KILL_AT)
        cluster.lifecycles[0].kill()
        cluster.completions[0].kill()
        stats["kills"] += 2
        await asyncio.sleep(RESTART_AT - KILL_AT)
        await cluster.restart(cluster.lifecycles[0])
        await cluster.restart(cluster.completions[0])

    try:
        await asyncio.gather(chaos(), *(worker() for _ in range(WORKERS)))
        # Let the outboxes finish: no completion may stay pending.
        deadline = time.monotonic() + 60
        while True:
            completions = await all_completions(clients)
            pending = [c for c in completions if c.settlement == completion_enums.SETTLEMENT_STATUS_PENDING]
            if not pending:
                break
            assert time.monotonic() < deadline, f"{len(pending)} completions still pending"
            await asyncio.sleep(0.2)
        tasks = {}
        for task_id in TASKS:
            tasks[task_id] = (
                await clients.call(
                    "lifecycle",
                    lambda s, t=task_id: s.GetTask(
                        lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id=t), timeout=CALL_TIMEOUT
                    ),
                )
            ).task
        # Every event is delivered to both watchers (the restarted one resumes from its cursor).
        total = sum(task.revision for task in tasks.values())
        listed = await completion_sequences(clients)
        completion_total = len(listed)
        deadline = time.monotonic() + 30
        while any(len(w.events) < total for w in watchers) or any(
            len(w.events) < completion_total for w in completion_watchers
        ):
            assert time.monotonic() < deadline, [len(w.events) for w in watchers + completion_watchers]
            await asyncio.sleep(0.1)
    finally:
        for task in watching:
            task.cancel()
        await asyncio.gather(*watching, return_exceptions=True)

    # Every event once, in one order, the same on every replica (PostgreSQL's
    # numbers increase but skip values: see docs/architecture.md).
    sequences = [[event.sequence for event in w.events] for w in watchers]
    assert sequences[0] == sequences[1], "identical on every replica"
    assert len(sequences[0]) == total and sequences[0] == sorted(set(sequences[0])), "each event once, in order"
    delivered = [[event.sequence for event in w.events] for w in completion_watchers]
    assert delivered[0] == delivered[1] == listed
    assert listed == sorted(set(listed))
    events = watchers[1].events
    assert watchers[0].breaks >= 1 and completion_watchers[0].breaks >= 1  # their replicas were killed under them
    # The ordering rule on PostgreSQL: across tasks the numbers need not follow
    # commit order, but each task's events do: its revisions 1..N in delivery order.
    for task_id, task in tasks.items():
        assert [e.revision for e in events if e.task_id == task_id] == list(range(1, task.revision + 1)), task_id
    terminal = collections.Counter(
        (e.task_id, e.generation)
        for e in events
        if e.to_state == lifecycle_enums.GENERATION_STATE_TERMINAL
        and e.from_state != lifecycle_enums.GENERATION_STATE_TERMINAL
    )
    for task_id, task in tasks.items():
        for generation in range(1, task.generation + 1):
            expected = (
                1 if generation < task.generation or task.state == lifecycle_enums.GENERATION_STATE_TERMINAL else 0
            )
            assert terminal[(task_id, generation)] == expected, (task_id, generation)
    settled_by_lifecycle = collections.Counter(e.completion_id for e in events if e.completion_id)
    closing = collections.Counter(
        e.completion_id
        for e in completion_watchers[1].events
        if e.kind
        in (
            completion_enums.COMPLETION_EVENT_KIND_COMPLETION_SETTLED,
            completion_enums.COMPLETION_EVENT_KIND_TERMINALIZATION_ERROR,
        )
    )
    outcomes = collections.Counter()
    for completion in completions:
        assert closing[completion.completion_id] == 1, completion.completion_id  # one terminal completion event
        outcomes[completion_enums.SettlementStatus.Name(completion.settlement)] += 1
        if completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED:
            assert settled_by_lifecycle[completion.completion_id] == 1, completion.completion_id
        else:
            assert completion.settlement == completion_enums.SETTLEMENT_STATUS_REJECTED
            assert settled_by_lifecycle[completion.completion_id] == 0
    assert stats["kills"] == 2 and outcomes["SETTLEMENT_STATUS_SETTLED"] >= 1
    print(
        f"\nreplicas: {clients.calls} calls ({clients.moved} moved to another replica), {stats['kills']} kills, "
        f"{stats['claims']} claims, {stats['attempts']} attempts, {stats['cancellations']} cancellations, "
        f"{stats['resumes']} resumes; completions {dict(outcomes)}; {len(events)} events checked on 2 watchers; "
        f"refusals {dict(clients.reasons.most_common(6))}; "
        f"{completion_total} completion events checked on 2 watchers"
    )
