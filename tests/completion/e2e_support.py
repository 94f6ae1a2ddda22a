"""Client-side helpers for the completion gRPC tests: both real servers, typed
shortcuts for the calls the story needs, error assertions and polling.

The completion service of these tests runs on each engine of ENGINES (the
`completion_engine` fixture of tests/completion and tests/transcripts): a SQLite
file under tmp_path, or a new, empty PostgreSQL database (tests/postgres.py). The
lifecycle service stays on SQLite. `table_dump` and `damage` reach into either."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import psycopg
import pytest
from google.protobuf.duration_pb2 import Duration

from completion_service.policy import parse_policy
from completion_service.server import CompletionConfig, RunningCompletion
from completion_service.server import start as start_completion
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import completion_service_pb2_grpc as completion_grpc
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.clock import ManualClock, SequentialIds
from funnel.runtime.grpc_errors import error_info, field_violations
from funnel.runtime.postgres import SqliteStyle, is_postgres_url
from lifecycle_service.server import LifecycleConfig, RunningLifecycle
from lifecycle_service.server import start as start_lifecycle
from tests import credentials
from tests.postgres import fresh_database

DOMAIN = "funnel.completion.v1"
WS = "ws-1"
OTHER_WS = "ws-2"
Code = grpc.StatusCode
# Every call of a test carries a deadline: a hang fails the test instead of the suite.
CALL_TIMEOUT = 10.0
# The completion service's deadline for each lifecycle call (--lifecycle-timeout) in
# these tests: on a loaded 2-core machine with every server on the test's event loop,
# a lifecycle call can take over a second; the product's default of 5 s holds there.
LIFECYCLE_TIMEOUT = 5.0
# 2023-11-14T22:13:20Z, as in tests/conftest.py: a round start for predictable times.
CLOCK_START_MICROS = 1_700_000_000_000_000


def micros(timestamp) -> int:
    return timestamp.seconds * 1_000_000 + timestamp.nanos // 1000


async def rejected(
    awaitable: Awaitable,
    code: grpc.StatusCode,
    reason: str,
    *,
    field: str | None = None,
    metadata: set[str] | None = None,
) -> grpc.aio.AioRpcError:
    """Awaits a call that must fail with `code` and exactly one ErrorInfo of the
    completion service with `reason`. With `field`, the ErrorInfo and a BadRequest
    violation both name that field."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await awaitable
    error = caught.value
    assert error.code() == code, (error.code(), error.details())
    info = error_info(error)
    assert info is not None, error.details()
    assert (info.reason, info.domain) == (reason, DOMAIN), (info.reason, info.domain, error.details())
    if metadata is not None:
        assert metadata <= set(info.metadata), dict(info.metadata)
    if field is not None:
        assert info.metadata["field"] == field, dict(info.metadata)
        assert field in [name for name, _ in field_violations(error)], field_violations(error)
    return error


async def eventually(
    check: Callable[[], Awaitable],
    *,
    timeout: float = 10.0,
    clock: ManualClock | None = None,
    advance_micros: int = 0,
    interval: float = 0.05,
):
    """Polls `check` until it returns a truthy value (returned) or `timeout` real
    seconds pass (the test fails). With `clock`, each round also moves the manual
    clock by `advance_micros`, so that backoff measured in service time elapses."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s (last value {value!r})")
        if clock is not None and advance_micros:
            clock.advance(advance_micros)
        await asyncio.sleep(interval)


# The engines the completion service of the in-process tests runs on.
ENGINES = ("sqlite", "postgresql")
# The schema of the completion service's tables on PostgreSQL.
COMPLETION_SCHEMA = "funnel_completion"


async def completion_database(engine: str, tmp: Path, name: str) -> str:
    """Where a completion service of a test keeps its data: a SQLite file under
    `tmp` named `name`, or the URL of a new, empty PostgreSQL database."""
    if engine == "postgresql":
        return await asyncio.to_thread(fresh_database)
    return str(tmp / f"{name}.sqlite3")


def table_dump(database: str) -> dict[str, list[tuple]]:
    """Every row of every table of a SQLite file, or of the completion schema of a
    PostgreSQL database, read through its own connection."""
    if is_postgres_url(database):
        with psycopg.connect(database, autocommit=True) as conn:
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY table_name",
                    (COMPLETION_SCHEMA,),
                )
            ]
            return {
                t: sorted(conn.execute(f'SELECT * FROM "{COMPLETION_SCHEMA}"."{t}"').fetchall(), key=repr)
                for t in tables
            }
    db = sqlite3.connect(database)
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {t: sorted(db.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}
    finally:
        db.close()


def query(database: str, sql: str, params: tuple = ()) -> list[tuple]:
    """The rows of one statement with `?` placeholders, run on a completion database
    through its own connection (autocommit)."""
    if is_postgres_url(database):
        with psycopg.connect(database, autocommit=True, options=f"-c search_path={COMPLETION_SCHEMA}") as conn:
            cursor = SqliteStyle(conn).execute(sql, params)
            return cursor.fetchall() if cursor.description else []
    db = sqlite3.connect(database)
    try:
        with db:
            return db.execute(sql, params).fetchall()
    finally:
        db.close()


def damage(database: str, sql: str, params: tuple = ()) -> None:
    """Changes a completion database behind the service's back (a test that
    corrupts a row on purpose)."""
    query(database, sql, params)


@dataclasses.dataclass
class Funnel:
    """Both services of one test, on port 0 over SQLite files under tmp_path (the
    completion service's may be a PostgreSQL database instead), with one manual
    clock, and client stubs for the default workspace."""

    clock: ManualClock
    tmp: Path
    lifecycle_config: LifecycleConfig
    completion_config: CompletionConfig
    policy: dict
    lifecycle: RunningLifecycle | None = None
    completion: RunningCompletion | None = None
    lc: lifecycle_grpc.TaskLifecycleServiceStub | None = None
    cs: completion_grpc.CompletionServiceStub | None = None
    _channels: list = dataclasses.field(default_factory=list)
    _stopped: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        # Unless a test chose its own, both servers run with the test credentials.
        if self.lifecycle_config.security == LifecycleConfig().security:
            self.lifecycle_config = dataclasses.replace(self.lifecycle_config, security=credentials.server_security())
        if self.completion_config.security == CompletionConfig().security:
            self.completion_config = dataclasses.replace(
                self.completion_config, security=credentials.server_security(), outbound=credentials.outbound_security()
            )

    # -- process control ---------------------------------------------------

    async def start(self) -> Funnel:
        await self.start_lifecycle()
        self.completion_config = dataclasses.replace(self.completion_config, lifecycle_address=self.lifecycle.address)
        self.completion = await start_completion(
            self.completion_config, clock=self.clock, ids=SequentialIds(), policies=parse_policy(self.policy)
        )
        channel = credentials.insecure_channel(self.completion.address)
        self._channels.append(channel)
        self.cs = completion_grpc.CompletionServiceStub(channel)
        return self

    async def start_lifecycle(self, **overrides) -> None:
        """Starts (or restarts, on the same port and database) the lifecycle server."""
        self.lifecycle_config = dataclasses.replace(self.lifecycle_config, **overrides)
        self.lifecycle = await start_lifecycle(self.lifecycle_config, clock=self.clock)
        # Pin the port so that a restart comes back where the completion service looks.
        self.lifecycle_config = dataclasses.replace(self.lifecycle_config, listen=self.lifecycle.address)
        channel = credentials.insecure_channel(self.lifecycle.address)
        self._channels.append(channel)
        self.lc = lifecycle_grpc.TaskLifecycleServiceStub(channel)
        await self._until_reachable()

    async def _until_reachable(self, timeout: float = 30.0) -> None:
        """Waits until calls reach the (re)started lifecycle server, from the test and
        from the completion service: after a restart on the same port the old
        listener may linger for a moment, and the completion service's channel
        reconnects with backoff. The probes read only (an unknown task)."""
        probes = [lambda: self.lc.ListTasks(lifecycle_messages.ListTasksRequest(workspace_id="probe"), timeout=5.0)]
        if self.cs is not None:
            probes.append(
                lambda: self.cs.ClaimTask(
                    completion_messages.ClaimTaskRequest(
                        workspace_id="probe", task_id="probe", agent_id="probe", lease_ttl=Duration(seconds=60)
                    ),
                    timeout=CALL_TIMEOUT,
                )
            )
        deadline = time.monotonic() + timeout
        for probe in probes:
            while True:
                try:
                    await probe()
                    break
                except grpc.aio.AioRpcError as error:
                    if error.code() == grpc.StatusCode.NOT_FOUND:
                        break
                    # A probe that took too long (a loaded machine) is tried again too.
                    retried = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                    if error.code() not in retried or time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.02)

    async def stop_lifecycle(self) -> None:
        running, self.lifecycle = self.lifecycle, None
        if running is not None:
            await running.stop(None)

    async def close(self) -> None:
        if self.completion is not None:
            await self.completion.stop(None)
        await self.stop_lifecycle()
        for channel in self._channels:
            await channel.close()

    @property
    def completion_db(self) -> str:
        return self.completion_config.database

    # -- lifecycle shortcuts -----------------------------------------------

    async def register(
        self,
        task_id: str,
        *,
        workspace: str = WS,
        parent: str | None = None,
        parent_generation: int = 1,
        mode=lifecycle_enums.PARENT_LINK_MODE_ATTACHED,
    ) -> lifecycle_types.Task:
        request = lifecycle_messages.RegisterTaskRequest(
            workspace_id=workspace,
            task_id=task_id,
            cause=lifecycle_types.Cause(source="test", reason="a task to finish"),
        )
        if parent:
            request.parent.CopyFrom(lifecycle_types.ParentLink(task_id=parent, generation=parent_generation, mode=mode))
        return (await self.lc.RegisterTask(request, timeout=CALL_TIMEOUT)).task

    async def task(self, task_id: str, workspace: str = WS) -> lifecycle_messages.GetTaskResponse:
        return await self.lc.GetTask(
            lifecycle_messages.GetTaskRequest(workspace_id=workspace, task_id=task_id), timeout=CALL_TIMEOUT
        )

    async def lifecycle_events(self, task_id: str, workspace: str = WS) -> list[lifecycle_types.LifecycleEvent]:
        response = await self.lc.ListLifecycleEvents(
            lifecycle_messages.ListLifecycleEventsRequest(workspace_id=workspace, task_id=task_id), timeout=CALL_TIMEOUT
        )
        return list(response.events)

    async def request_cancellation(self, task_id: str, generation: int = 1, workspace: str = WS):
        return await self.lc.RequestCancellation(
            lifecycle_messages.RequestCancellationRequest(
                workspace_id=workspace,
                task_id=task_id,
                generation=generation,
                cause=lifecycle_types.Cause(source="operator:test", reason="the user changed their mind"),
            ),
            timeout=CALL_TIMEOUT,
        )

    # -- the completion service's lifecycle projection -----------------------

    def completion_metric(self, name: str, **labels: str) -> float:
        value = self.completion.authority.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def views(self, source: str) -> float:
        """Lifecycle views attempts were judged on, from `projection` or a `read`."""
        return self.completion_metric("funnel_completion_lifecycle_views_total", source=source)

    async def projection_live(self, workspace: str = WS) -> None:
        """Waits until the completion service follows `workspace`'s lifecycle events
        (a stream opens the first time a workspace is asked about, once the
        service's background work runs)."""
        projection = self.completion.authority.projection
        await eventually(
            lambda: _now(projection.view(workspace, "probe") is None and projection.position(workspace) is not None)
        )

    async def projection_caught_up(self, workspace: str = WS) -> None:
        """Waits until the completion service's projection of `workspace` reflects
        every lifecycle event committed so far (or its stream is not live, so that
        attempts read). An attempt's view may lag behind the lifecycle service by
        the events still on their way (docs/specification.md §5.2: the lifecycle stays the fence);
        tests that predict a gate's verdict after a change at the lifecycle wait."""
        events = await self.lifecycle.store.read(lambda tx: tx.events.page(workspace, 0, None, 1_000_000))
        head = events[-1].sequence if events else 0  # the workspace's: its stream carries no other
        projection = self.completion.authority.projection

        def reached() -> bool:
            position = projection.position(workspace)
            return position is None or position >= head

        await eventually(lambda: _now(reached()))

    # -- completion shortcuts ----------------------------------------------

    async def claim(
        self, task_id: str, *, workspace: str = WS, agent: str = "agent-1", ttl_seconds: int = 60, request_id: str = ""
    ) -> completion_messages.ClaimTaskResponse:
        return await self.cs.ClaimTask(
            completion_messages.ClaimTaskRequest(
                workspace_id=workspace,
                task_id=task_id,
                agent_id=agent,
                lease_ttl=Duration(seconds=ttl_seconds),
                request_id=request_id,
            ),
            timeout=CALL_TIMEOUT,
        )

    async def registered_and_claimed(
        self, task_id: str, workspace: str = WS, **claim_kw
    ) -> completion_messages.ClaimTaskResponse:
        await self.register(task_id, workspace=workspace)
        return await self.claim(task_id, workspace=workspace, **claim_kw)

    def attempt_request(
        self,
        claim: completion_messages.ClaimTaskResponse,
        *,
        outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
        result: str = "Implemented the change; all tests pass.",
        **kw,
    ) -> completion_messages.AttemptCompletionRequest:
        return completion_messages.AttemptCompletionRequest(
            workspace_id=claim.run.workspace_id,
            task_id=claim.run.task_id,
            run_id=claim.run.run_id,
            epoch=claim.lease.epoch,
            outcome=outcome,
            result=result,
            **kw,
        )

    async def attempt(
        self, claim: completion_messages.ClaimTaskResponse, **kw
    ) -> completion_messages.AttemptCompletionResponse:
        return await self.cs.AttemptCompletion(self.attempt_request(claim, **kw), timeout=CALL_TIMEOUT)

    async def evidence(
        self,
        claim: completion_messages.ClaimTaskResponse,
        kind: str = "tests",
        passed: bool = True,
        checkpoint: str = "",
    ) -> completion_types.Evidence:
        response = await self.cs.RecordEvidence(
            completion_messages.RecordEvidenceRequest(
                workspace_id=claim.run.workspace_id,
                task_id=claim.run.task_id,
                generation=claim.run.generation,
                kind=kind,
                verdict=completion_enums.EVIDENCE_VERDICT_PASSED
                if passed
                else completion_enums.EVIDENCE_VERDICT_FAILED,
                checkpoint=checkpoint,
                details="pytest: 42 passed",
                run_id=claim.run.run_id,
            ),
            timeout=CALL_TIMEOUT,
        )
        return response.evidence

    async def complete_run(
        self, claim_or_run_id, *, workspace: str = WS, outcome=completion_enums.RUN_OUTCOME_SUCCEEDED, **kw
    ) -> completion_messages.CompleteRunResponse:
        run_id = claim_or_run_id if isinstance(claim_or_run_id, str) else claim_or_run_id.run.run_id
        return await self.cs.CompleteRun(
            completion_messages.CompleteRunRequest(workspace_id=workspace, run_id=run_id, outcome=outcome, **kw),
            timeout=CALL_TIMEOUT,
        )

    async def get_run(self, run_id: str, workspace: str = WS) -> completion_types.Run:
        return (
            await self.cs.GetRun(
                completion_messages.GetRunRequest(workspace_id=workspace, run_id=run_id), timeout=CALL_TIMEOUT
            )
        ).run

    async def completion_of(
        self, task_id: str, generation: int = 1, workspace: str = WS
    ) -> completion_types.Completion:
        response = await self.cs.GetCompletion(
            completion_messages.GetCompletionRequest(workspace_id=workspace, task_id=task_id, generation=generation),
            timeout=CALL_TIMEOUT,
        )
        return response.completion

    async def completion_events(
        self, workspace: str = WS, task_id: str = "", after: int = 0, quiet: float = 0.05
    ) -> list[completion_types.CompletionEvent]:
        """The stream's backlog as a client sees it. The stream never ends, so the
        number of committed events is taken from the service's store; the stream
        must deliver exactly those (and nothing more within `quiet` seconds)."""
        stored = await self.completion.store.read(lambda tx: tx.events.page(workspace, after, task_id or None, 100_000))
        call = self.cs.WatchCompletionEvents(
            completion_messages.WatchCompletionEventsRequest(
                workspace_id=workspace, task_id=task_id, after_sequence=after
            )
        )
        events = []
        try:
            for _ in stored:
                item = await asyncio.wait_for(call.read(), timeout=CALL_TIMEOUT)
                assert item is not grpc.aio.EOF, events
                events.append(item.event)
            try:
                extra = await asyncio.wait_for(call.read(), timeout=quiet)
            except TimeoutError:
                return events
            # An event committed since the store was read; anything else is a bug.
            assert extra is not grpc.aio.EOF and extra.event.sequence > (events[-1].sequence if events else after)
            return events + [extra.event]
        finally:
            call.cancel()

    async def audit(self, workspace: str = WS, **kw) -> list[completion_types.AuditEntry]:
        response = await self.cs.ListAuditLog(
            completion_messages.ListAuditLogRequest(workspace_id=workspace, **kw), timeout=CALL_TIMEOUT
        )
        return list(response.entries)

    async def visible_state(self, workspace: str = WS) -> tuple:
        """What a client can read of one workspace: runs, completions, audit rows."""
        runs = await self.cs.ListRuns(completion_messages.ListRunsRequest(workspace_id=workspace), timeout=CALL_TIMEOUT)
        completions = await self.cs.ListCompletions(
            completion_messages.ListCompletionsRequest(workspace_id=workspace), timeout=CALL_TIMEOUT
        )
        return (
            [r.SerializeToString(deterministic=True) for r in runs.runs],
            [c.SerializeToString(deterministic=True) for c in completions.completions],
            [a.SerializeToString(deterministic=True) for a in await self.audit(workspace)],
        )


async def _now(value):
    return value


def kinds(events: list[completion_types.CompletionEvent]) -> list[str]:
    return [completion_enums.CompletionEventKind.Name(e.kind).removeprefix("COMPLETION_EVENT_KIND_") for e in events]


def decisive_gate(decision: completion_types.Decision) -> completion_types.GateResult:
    decisive = [g for g in decision.trace if g.decisive]
    assert len(decisive) == 1, decision
    return decisive[0]


def gate(decision: completion_types.Decision, gate_id: str) -> completion_types.GateResult:
    found = [g for g in decision.trace if g.gate_id == gate_id]
    assert len(found) == 1, (gate_id, [g.gate_id for g in decision.trace])
    return found[0]


def stop_lifecycle_during_next_settlement(f: Funnel) -> None:
    """Stops the real lifecycle server right after the completion row committed and
    right before the completion service submits its settlement (step 5 -> 6), so
    that the settlement meets a dead server. Whoever settles first (the attempt
    itself or the outbox settler) stops the server; every settle call waits for
    the stop to finish before it goes out. Applies once."""
    client = f.completion.authority.lifecycle
    names = ("settle_completion", "settle_failure")
    originals = {name: getattr(client, name) for name in names}
    stopping: list[asyncio.Future] = []

    def stop_first(name: str):
        async def stop_then_call(*args, **kwargs):
            if not stopping:
                stopping.append(asyncio.ensure_future(f.stop_lifecycle()))
            await asyncio.shield(stopping[0])
            for installed in names:  # back to the real methods
                client.__dict__.pop(installed, None)
            return await originals[name](*args, **kwargs)

        return stop_then_call

    for name in names:
        setattr(client, name, stop_first(name))
