"""A seeded random workload over both services (one workspace per run), the
ledger of what the client was told, and the invariant checks run on the two
SQLite files once the outbox and the propagations have drained.

The workload is a small project: a parent task with attached children (one of
them never claimed, so that it is still open when the parent ends; one, the
racer, whose completion races the parent's end), maybe a detached child,
standalone tasks (some reopened into generation 2 by user feedback), and a task
whose agent dies mid-turn. Each task follows a script (claim, transcript
appends, evidence, an ending: attempt COMPLETED or FAILED, CompleteRun SUCCEEDED
or CANCELLED, a blocked attempt first…); the scheduler interleaves the scripts at
random and sometimes runs two steps concurrently. The parent ends by
cancellation (request, then settle), failure or timeout (settled by the host),
or completion once its children are done. Two watchers follow the workspace's
lifecycle and completion event streams throughout, as a UI would.

Every mutating call carries a request_id and is retried with it while a service
does not answer, restarting services that died, so every call ends with an
answer: OK (recorded in the ledger and checked for durability afterwards) or a
business rejection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
from google.protobuf.duration_pb2 import Duration

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.grpc_errors import error_info
from lifecycle_service.errors import Reason as LifecycleReason
from tests.reliability.harness import CALL_TIMEOUT, Exhausted, Pair, read_only

T = CALL_TIMEOUT
LEASE = Duration(seconds=60)
FINAL_OUTCOMES_THAT_END_CHILDREN = ("CANCELLED", "FAILED", "TIMED_OUT")


# -- the ledger ----------------------------------------------------------------


@dataclass
class Ledger:
    workspace: str
    lifecycle_events: list[tuple[str, int, int, int]] = field(default_factory=list)  # task, sequence, revision, intent
    claims: list[tuple[str, str, int]] = field(default_factory=list)  # task, run, epoch
    appends: list[tuple[str, int, int, int]] = field(default_factory=list)  # task, first sequence, count, version
    unknown_appends: collections.Counter = field(default_factory=collections.Counter)  # task -> events
    evidence: list[str] = field(default_factory=list)
    unknown_evidence: int = 0
    completions: list[tuple[str, int, str]] = field(default_factory=list)  # task, generation, completion id
    closed_runs: list[str] = field(default_factory=list)
    interrupted: dict[str, str] = field(default_factory=dict)  # task -> turn id
    repaired_replies: collections.Counter = field(default_factory=collections.Counter)  # task -> loads saying repaired
    answers: collections.Counter = field(default_factory=collections.Counter)  # (op, code, reason)
    bad: list[str] = field(default_factory=list)  # answers a client must never see
    repeated: list[str] = field(default_factory=list)  # answers that show a retry applied twice
    unknown: int = 0


BAD_CODES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INVALID_ARGUMENT}
# Each operation of the workload is issued once (and retried with its request_id):
# these answers can only mean that a retry was applied a second time.
REPEATED = {
    "TASK_ALREADY_EXISTS",
    "RUN_ALREADY_FINISHED",
    "LEASE_HELD",
    "REQUEST_ID_REUSED",
    "CANCELLATION_ALREADY_REQUESTED",
}


# -- watchers --------------------------------------------------------------------


class Watcher:
    """Follows one service's event stream for a workspace the way a UI would:
    from a cursor, reconnecting after any error from the last sequence it saw.
    What it saw is checked against the database: no event before its commit
    (every streamed event exists, identical), no gaps, no duplicates."""

    def __init__(self, pair: Pair, workspace: str, service: str) -> None:
        self.pair = pair
        self.workspace = workspace
        self.service = service
        self.seen: list[tuple] = []
        self.reconnects = 0
        self._task: asyncio.Task | None = None

    @property
    def cursor(self) -> int:
        return self.seen[-1][0] if self.seen else 0

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        while True:
            try:
                if self.service == "lifecycle":
                    request = lifecycle_messages.WatchLifecycleEventsRequest(
                        workspace_id=self.workspace, after_sequence=self.cursor
                    )
                    stream = self.pair.lc.WatchLifecycleEvents(request)
                    async for item in stream:
                        e = item.event
                        self.seen.append(
                            (
                                e.sequence,
                                e.task_id,
                                e.revision,
                                lifecycle_enums.Intent.Name(e.intent).removeprefix("INTENT_"),
                            )
                        )
                else:
                    request = completion_messages.WatchCompletionEventsRequest(
                        workspace_id=self.workspace, after_sequence=self.cursor
                    )
                    stream = self.pair.cs.WatchCompletionEvents(request)
                    async for item in stream:
                        e = item.event
                        kind = completion_enums.CompletionEventKind.Name(e.kind).removeprefix("COMPLETION_EVENT_KIND_")
                        self.seen.append((e.sequence, e.task_id, kind, e.completion_id or None))
            except grpc.aio.AioRpcError:
                pass
            self.reconnects += 1
            await asyncio.sleep(0.02)

    async def catch_up(self, last: int, timeout: float = 10.0) -> bool:
        deadline = asyncio.get_running_loop().time() + timeout
        while self.cursor < last and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        return self.cursor >= last

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


# -- the workload ----------------------------------------------------------------


@dataclass
class Task:
    task_id: str
    kind: str
    run_id: str = ""
    epoch: int = 0
    generation: int = 1
    registered: bool = False
    checkpoint: str = ""


Step = Callable[[], Awaitable[bool]]  # False: the rest of the task's script is skipped


class Workload:
    def __init__(self, pair: Pair, seed: int, workspace: str, *, parent_endings: tuple[str, ...] = ()) -> None:
        self.pair = pair
        self.parent_endings = parent_endings or ("cancel", "cancel", "fail", "timeout", "complete")
        self.rng = random.Random(seed)
        self.ws = workspace
        self.ledger = Ledger(workspace)
        self._ids = collections.Counter()
        self.tasks: dict[str, Task] = {}
        self.scripts: dict[str, collections.deque] = {}

    # -- calls ---------------------------------------------------------------

    def rid(self, what: str) -> str:
        self._ids[what] += 1
        return f"{what}-{self._ids[what]}"

    async def call(self, op: str, invoke):
        """The response, or None after a final error (recorded) or no answer at all."""
        try:
            response = await self.pair.call(invoke)
        except grpc.aio.AioRpcError as error:
            self.refused(op, error)
            return None
        except Exhausted:
            self.ledger.unknown += 1
            self.ledger.answers[(op, "NO_ANSWER", "")] += 1
            return None
        self.ledger.answers[(op, "OK", "")] += 1
        return response

    def refused(self, op: str, error: grpc.aio.AioRpcError) -> None:
        info = error_info(error)
        reason = info.reason if info else ""
        self.ledger.answers[(op, error.code().name, reason)] += 1
        if error.code() in BAD_CODES:
            self.ledger.bad.append(f"{op}: {error.code().name} {reason} {error.details()}")
        elif reason in REPEATED:
            self.ledger.repeated.append(f"{op}: {reason} {error.details()}")

    def _lifecycle_ack(self, response) -> None:
        event = response.event
        self.ledger.lifecycle_events.append((event.task_id, event.sequence, event.revision, event.intent))

    async def lifecycle(self, op: str, method: str, request) -> object:
        response = await self.call(op, lambda p: getattr(p.lc, method)(request, timeout=T))
        if response is not None:
            self._lifecycle_ack(response)
        return response

    # -- operations ------------------------------------------------------------

    async def register(
        self, task: Task, parent: Task | None = None, mode: int = lifecycle_enums.PARENT_LINK_MODE_ATTACHED
    ) -> bool:
        request = lifecycle_messages.RegisterTaskRequest(
            workspace_id=self.ws,
            task_id=task.task_id,
            request_id=self.rid(f"register-{task.task_id}"),
            cause=lifecycle_types.Cause(source="host", reason="planned"),
        )
        if parent is not None:
            request.parent.CopyFrom(lifecycle_types.ParentLink(task_id=parent.task_id, generation=1, mode=mode))
        task.registered = await self.lifecycle("RegisterTask", "RegisterTask", request) is not None
        return task.registered

    async def claim(self, task: Task) -> bool:
        request = completion_messages.ClaimTaskRequest(
            workspace_id=self.ws,
            task_id=task.task_id,
            agent_id=f"agent-{task.task_id}",
            lease_ttl=LEASE,
            request_id=self.rid(f"claim-{task.task_id}"),
        )
        response = await self.call("ClaimTask", lambda p: p.cs.ClaimTask(request, timeout=T))
        if response is None:
            return False
        task.run_id, task.epoch, task.generation = response.run.run_id, response.lease.epoch, response.run.generation
        self.ledger.claims.append((task.task_id, task.run_id, task.epoch))
        return True

    async def append(self, task: Task, events: list[completion_types.SessionEvent]) -> bool:
        request = transcript_messages.AppendTranscriptRequest(
            workspace_id=self.ws, task_id=task.task_id, events=events, request_id=self.rid(f"append-{task.task_id}")
        )
        try:
            response = await self.pair.call(lambda p: p.ts.AppendTranscript(request, timeout=T))
        except Exhausted:
            self.ledger.unknown += 1
            self.ledger.unknown_appends[task.task_id] += len(events)
            return False
        except grpc.aio.AioRpcError as error:
            self.refused("AppendTranscript", error)
            return False
        self.ledger.answers[("AppendTranscript", "OK", "")] += 1
        self.ledger.appends.append((task.task_id, response.first_sequence, len(events), response.state_version))
        task.generation = response.generation
        for event in events:
            if event.WhichOneof("body") == "checkpoint":
                task.checkpoint = event.checkpoint.checkpoint_id
        return True

    async def evidence(self, task: Task) -> bool:
        request = completion_messages.RecordEvidenceRequest(
            workspace_id=self.ws,
            task_id=task.task_id,
            generation=task.generation,
            kind="tests",
            verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
            checkpoint=task.checkpoint,
            details="all green",
            run_id=task.run_id,
            request_id=self.rid(f"evidence-{task.task_id}"),
        )
        try:
            response = await self.pair.call(lambda p: p.cs.RecordEvidence(request, timeout=T))
        except Exhausted:
            self.ledger.unknown += 1
            self.ledger.unknown_evidence += 1
            return True
        except grpc.aio.AioRpcError as error:
            self.refused("RecordEvidence", error)
            return True
        self.ledger.answers[("RecordEvidence", "OK", "")] += 1
        self.ledger.evidence.append(response.evidence.evidence_id)
        return True

    def _completion_ack(self, completion) -> None:
        if completion.completion_id:
            self.ledger.completions.append((completion.task_id, completion.generation, completion.completion_id))

    async def attempt(self, task: Task, outcome: int, result: str = "done: all tests pass") -> bool:
        if not task.run_id:
            return False
        request = completion_messages.AttemptCompletionRequest(
            workspace_id=self.ws,
            task_id=task.task_id,
            run_id=task.run_id,
            epoch=task.epoch,
            outcome=outcome,
            result=result,
            request_id=self.rid(f"attempt-{task.task_id}"),
        )
        response = await self.call("AttemptCompletion", lambda p: p.cs.AttemptCompletion(request, timeout=T))
        if response is not None and response.HasField("completion"):
            self._completion_ack(response.completion)
        return True

    async def complete_run(self, task: Task, outcome: int, notes: str = "finished") -> bool:
        if not task.run_id:
            return False
        request = completion_messages.CompleteRunRequest(
            workspace_id=self.ws,
            run_id=task.run_id,
            outcome=outcome,
            tokens_input=100,
            tokens_output=50,
            notes=notes,
            request_id=self.rid(f"close-{task.task_id}"),
        )
        response = await self.call("CompleteRun", lambda p: p.cs.CompleteRun(request, timeout=T))
        if response is not None:
            self.ledger.closed_runs.append(task.run_id)
            if response.HasField("completion"):
                self._completion_ack(response.completion)
        return True

    async def host_intent(self, task: Task, method: str) -> bool:
        request_type = getattr(lifecycle_messages, f"{method}Request")
        request = request_type(
            workspace_id=self.ws,
            task_id=task.task_id,
            generation=task.generation,
            request_id=self.rid(f"{method}-{task.task_id}"),
            cause=lifecycle_types.Cause(source="host", reason=f"host {method}"),
        )
        await self.lifecycle(method, method, request)
        return True

    async def load(self, task: Task) -> bool:
        request = transcript_messages.LoadTranscriptRequest(workspace_id=self.ws, task_id=task.task_id, page_size=100)
        response = await self.call("LoadTranscript", lambda p: p.ts.LoadTranscript(request, timeout=T))
        if response is not None and response.repaired:
            self.ledger.repaired_replies[task.task_id] += 1
        return True

    # -- scripts ---------------------------------------------------------------

    def _turn(self, task: Task, n: int) -> list[completion_types.SessionEvent]:
        turn, step, call = f"turn-{n}", f"step-{n}", f"call-{n}"
        return [
            completion_types.SessionEvent(turn_start=completion_types.TurnStart(turn_id=turn)),
            completion_types.SessionEvent(step_start=completion_types.StepStart(step_id=step)),
            completion_types.SessionEvent(
                tool_call=completion_types.ToolCall(call_id=call, tool_name="bash", arguments="pytest -q")
            ),
            completion_types.SessionEvent(tool_result=completion_types.ToolResult(call_id=call, content="42 passed")),
            completion_types.SessionEvent(step_end=completion_types.StepEnd(step_id=step)),
            completion_types.SessionEvent(
                checkpoint=completion_types.Checkpoint(checkpoint_id=f"cp-{task.task_id}-{n}")
            ),
            completion_types.SessionEvent(assistant_message=completion_types.AssistantMessage(text="the tests pass")),
            completion_types.SessionEvent(
                turn_end=completion_types.TurnEnd(turn_id=turn, reason=completion_enums.TURN_END_REASON_COMPLETED)
            ),
        ]

    def _appends(self, task: Task, events: list[completion_types.SessionEvent]) -> list[Step]:
        cuts = sorted(self.rng.sample(range(1, len(events)), self.rng.randint(0, 2)))
        batches = [events[a:b] for a, b in zip([0, *cuts], [*cuts, len(events)], strict=True)]
        return [lambda batch=batch: self.append(task, batch) for batch in batches]

    def worker_script(self, task: Task) -> list[Step]:
        steps: list[Step] = [lambda: self.claim(task)]
        steps += self._appends(task, self._turn(task, 1))
        ending = self.rng.choice(["attempt", "attempt", "fail", "run_succeeded", "run_cancelled", "blocked_first"])
        success = completion_enums.REQUESTED_OUTCOME_COMPLETED
        if ending == "blocked_first":
            steps += [
                lambda: self.attempt(task, success),
                lambda: self.evidence(task),
                lambda: self.attempt(task, success),
            ]
        elif ending == "attempt":
            steps += [lambda: self.evidence(task), lambda: self.attempt(task, success)]
        elif ending == "fail":
            steps += [
                lambda: self.attempt(task, completion_enums.REQUESTED_OUTCOME_FAILED, "gave up: flaky environment")
            ]
        elif ending == "run_succeeded":
            steps += [
                lambda: self.evidence(task),
                lambda: self.complete_run(task, completion_enums.RUN_OUTCOME_SUCCEEDED),
            ]
        else:
            steps += [lambda: self.complete_run(task, completion_enums.RUN_OUTCOME_CANCELLED, "stopped")]
        if ending in ("attempt", "blocked_first", "fail") and self.rng.random() < 0.5:
            outcome = (
                completion_enums.RUN_OUTCOME_SUCCEEDED if ending != "fail" else completion_enums.RUN_OUTCOME_FAILED
            )
            steps.append(lambda: self.complete_run(task, outcome))
        if ending in ("attempt", "run_succeeded") and task.kind in ("solo", "detached") and self.rng.random() < 0.4:
            steps += self.reopen_script(task)
        return steps

    def reopen_script(self, task: Task) -> list[Step]:
        """User feedback on the completed generation: the task moves to generation
        2 (ResumeWithGeneration), is claimed again and completed again."""

        async def feedback() -> bool:
            await self.append(
                task,
                [completion_types.SessionEvent(user_feedback=completion_types.UserFeedback(text="one more thing"))],
            )
            return task.generation == 2

        async def close_first_run() -> bool:
            # Its lease would otherwise still hold the task (LEASE_HELD).
            if task.run_id not in self.ledger.closed_runs:
                await self.complete_run(task, completion_enums.RUN_OUTCOME_SUCCEEDED)
            return True

        return [
            feedback,
            close_first_run,
            lambda: self.claim(task),
            *self._appends(task, self._turn(task, 2)),
            lambda: self.evidence(task),
            lambda: self.attempt(task, completion_enums.REQUESTED_OUTCOME_COMPLETED),
        ]

    def interrupted_script(self, task: Task) -> list[Step]:
        turn = "turn-1"
        self.ledger.interrupted[task.task_id] = turn
        opened = [
            completion_types.SessionEvent(turn_start=completion_types.TurnStart(turn_id=turn)),
            completion_types.SessionEvent(step_start=completion_types.StepStart(step_id="step-1")),
            completion_types.SessionEvent(
                tool_call=completion_types.ToolCall(call_id="call-1", tool_name="bash", arguments="make")
            ),
            completion_types.SessionEvent(
                tool_call=completion_types.ToolCall(call_id="call-2", tool_name="grep", arguments="TODO")
            ),
        ]
        steps: list[Step] = [lambda: self.claim(task)]
        steps += self._appends(task, opened)
        # The agent dies mid-turn: its run is closed, nobody owns the turn any more.
        steps.append(lambda: self.complete_run(task, completion_enums.RUN_OUTCOME_FAILED, "agent crashed"))

        async def racing_loads() -> bool:
            await asyncio.gather(*(self.load(task) for _ in range(self.rng.randint(1, 3))))
            return True

        steps.append(racing_loads)
        return steps

    def parent_script(self, parent: Task, children: list[Task], lazy: Task, racer: Task, detached: Task | None) -> list:
        ending = self.rng.choice(self.parent_endings)
        self.parent_ending = ending

        async def register_children() -> bool:
            for child in [*children, lazy, racer]:
                if await self.register(child, parent):
                    if child is racer:
                        script = self.racer_script(racer) if ending != "complete" else self.worker_script(racer)
                    else:
                        script = self.worker_script(child) if child is not lazy else []
                    self.scripts[child.task_id] = collections.deque(script)
            if detached is not None and await self.register(
                detached, parent, lifecycle_enums.PARENT_LINK_MODE_DETACHED
            ):
                self.scripts[detached.task_id] = collections.deque(self.worker_script(detached))
            return True

        def children_done() -> bool:
            return all(not self.scripts.get(child.task_id) for child in [*children, racer])

        def racer_ready() -> bool:
            return not self.scripts.get(racer.task_id)

        async def race(method: str) -> bool:
            # The racer's completion against the parent's fence: whichever the
            # lifecycle service commits first wins, the other is refused.
            async def fence() -> None:
                await asyncio.sleep(self.rng.choice([0, 0, 0.001, 0.003, 0.006]))
                await self.host_intent(parent, method)

            await asyncio.gather(self.attempt(racer, completion_enums.REQUESTED_OUTCOME_COMPLETED), fence())
            return True

        steps: list = [lambda: self.register(parent), lambda: self.claim(parent), register_children]
        steps += self._appends(parent, self._turn(parent, 1))
        steps.append(lambda: self.evidence(parent))
        if ending == "cancel":
            steps += [
                (lambda: race("RequestCancellation"), racer_ready),
                lambda: self.host_intent(parent, "SettleCancellation"),
            ]
        elif ending == "fail":
            steps.append((lambda: race("SettleFailure"), racer_ready))
        elif ending == "timeout":
            steps.append((lambda: race("SettleTimeout"), racer_ready))
        else:

            async def cancel_lazy_child() -> bool:
                await self.host_intent(lazy, "RequestCancellation")
                await self.host_intent(lazy, "SettleCancellation")
                return True

            steps += [
                (cancel_lazy_child, children_done),
                lambda: self.attempt(parent, completion_enums.REQUESTED_OUTCOME_COMPLETED),
            ]
        return steps

    def racer_script(self, task: Task) -> list[Step]:
        """A child that gets ready to complete; its attempt races the parent's end."""
        return [lambda: self.claim(task), *self._appends(task, self._turn(task, 1)), lambda: self.evidence(task)]

    # -- scheduling ------------------------------------------------------------

    def plan(self) -> None:
        rng = self.rng
        parent = self.task("parent", "parent")
        children = [self.task(f"child-{i}", "child") for i in range(rng.randint(1, 2))]
        lazy = self.task("lazy-child", "lazy")
        racer = self.task("racer", "child")
        detached = self.task("detached", "detached") if rng.random() < 0.5 else None
        self.scripts[parent.task_id] = collections.deque(self.parent_script(parent, children, lazy, racer, detached))
        for i in range(rng.randint(1, 2)):
            task = self.task(f"solo-{i}", "solo")
            self.scripts[task.task_id] = collections.deque(
                [lambda task=task: self.register(task), *self.worker_script(task)]
            )
        broken = self.task("interrupted", "interrupted")
        self.scripts[broken.task_id] = collections.deque(
            [lambda: self.register(broken), *self.interrupted_script(broken)]
        )

    def task(self, name: str, kind: str) -> Task:
        task = Task(name, kind)
        self.tasks[name] = task
        return task

    def ready(self, name: str) -> bool:
        head = self.scripts[name][0]
        return not isinstance(head, tuple) or head[1]()

    def next_step(self, name: str) -> Step:
        head = self.scripts[name].popleft()
        return head[0] if isinstance(head, tuple) else head

    async def run(self) -> Ledger:
        self.watchers = [Watcher(self.pair, self.ws, "lifecycle"), Watcher(self.pair, self.ws, "completion")]
        for watcher in self.watchers:
            watcher.start()
        self.plan()
        while True:
            live = [name for name, steps in self.scripts.items() if steps and self.ready(name)]
            if not live:
                break
            picked = [self.rng.choice(live)]
            others = [name for name in live if name != picked[0]]
            if others and self.rng.random() < 0.3:
                picked.append(self.rng.choice(others))
            steps = [self.next_step(name) for name in picked]
            results = await asyncio.gather(*(step() for step in steps))
            for name, ok in zip(picked, results, strict=True):
                if not ok:
                    self.scripts[name].clear()
        return self.ledger


# -- the checks ------------------------------------------------------------------


@dataclass
class Findings:
    lost: int = 0
    duplicated: int = 0
    violations: list[str] = field(default_factory=list)

    def fail(self, kind: str, message: str) -> None:
        if kind == "lost":
            self.lost += 1
        elif kind == "duplicated":
            self.duplicated += 1
        self.violations.append(f"[{kind}] {message}")


def pending(pair: Pair, workspace: str) -> dict[str, int]:
    """What the outbox and the propagation worker still owe for a workspace."""
    completion = read_only(pair.completion.database)
    lifecycle = read_only(pair.lifecycle.database)
    try:
        return {
            "pending completions": completion.execute(
                "SELECT count(*) FROM task_completions WHERE workspace_id = ? AND settlement = 'PENDING'", (workspace,)
            ).fetchone()[0],
            "pending propagations": lifecycle.execute(
                "SELECT count(*) FROM pending_propagations WHERE workspace_id = ?", (workspace,)
            ).fetchone()[0],
        }
    finally:
        completion.close()
        lifecycle.close()


def drained(pair: Pair, workspace: str) -> bool:
    return not any(pending(pair, workspace).values())


async def drain(pair: Pair, workspace: str, timeout: float = 20.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while not drained(pair, workspace):
        await pair.ensure_alive()
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def check_watchers(pair: Pair, watchers: list[Watcher], found: Findings) -> None:
    """After the drain: each stream catches up with its database and saw exactly
    the committed events, in order, once."""
    ws = watchers[0].workspace
    L = read_only(pair.lifecycle.database)
    C = read_only(pair.completion.database)
    try:
        committed = {
            "lifecycle": [
                tuple(r)
                for r in L.execute(
                    "SELECT sequence, task_id, revision, intent FROM lifecycle_events WHERE workspace_id = ? ORDER BY "
                    "sequence",
                    (ws,),
                )
            ],
            "completion": [
                tuple(r)
                for r in C.execute(
                    "SELECT sequence, task_id, kind, completion_id FROM completion_events WHERE workspace_id = ? ORDER "
                    "BY sequence",
                    (ws,),
                )
            ],
        }
    finally:
        L.close()
        C.close()
    for watcher in watchers:
        events = committed[watcher.service]
        if not await watcher.catch_up(events[-1][0] if events else 0):
            found.fail("lost", f"{watcher.service} watch stuck at {watcher.cursor}, last committed {events[-1][0]}")
        await watcher.stop()
        sequences = [e[0] for e in watcher.seen]
        if sequences != sorted(set(sequences)):
            found.fail("duplicated", f"{watcher.service} watch delivered {sequences} (duplicates or disorder)")
        known = set(events)
        phantoms = [e for e in watcher.seen if e not in known]
        if phantoms:
            found.fail("phantom", f"{watcher.service} watch showed events that are not committed: {phantoms[:3]}")
        missing = [e for e in events if e not in set(watcher.seen)]
        if missing:
            found.fail("gap", f"{watcher.service} watch skipped committed events: {missing[:3]}")


def check(pair: Pair, ledger: Ledger) -> Findings:
    """Every invariant of the crash matrix over one workspace of both databases."""
    found = Findings()
    ws = ledger.workspace
    L = read_only(pair.lifecycle.database)
    C = read_only(pair.completion.database)
    try:
        _check_lifecycle(L, ws, found)
        _check_completions(L, C, ws, found)
        _check_children(L, ws, found)
        _check_acknowledged(L, C, ledger, found)
        _check_transcripts(C, ledger, found)
    finally:
        L.close()
        C.close()
    for bad in ledger.bad:
        found.fail("answer", f"a client was answered {bad}")
    for repeated in ledger.repeated:
        found.fail("duplicated", f"a retry was applied twice: {repeated}")
    return found


def _check_lifecycle(L, ws: str, found: Findings) -> None:
    tasks = {
        r[0]: r
        for r in L.execute(
            "SELECT task_id, revision, state, outcome, completion_id FROM tasks WHERE workspace_id = ?", (ws,)
        )
    }
    events = collections.defaultdict(list)
    for task_id, revision, sequence, generation in L.execute(
        "SELECT task_id, revision, sequence, generation FROM lifecycle_events WHERE workspace_id = ? ORDER BY task_id, "
        "revision",
        (ws,),
    ):
        events[task_id].append((revision, sequence, generation))
    for task_id, (_, revision, state, outcome, _completion_id) in tasks.items():
        history = events.get(task_id, [])
        revisions = [r for r, _, _ in history]
        if revisions != list(range(1, len(revisions) + 1)):
            found.fail("gap", f"task {task_id}: revisions {revisions} are not 1..N")
        if len(revisions) != revision:
            found.fail("gap", f"task {task_id}: record at revision {revision}, {len(revisions)} events")
        sequences = [s for _, s, _ in history]
        if sequences != sorted(set(sequences)):
            found.fail("order", f"task {task_id}: sequences {sequences} not strictly increasing with revision")
        generations = [g for _, _, g in history]
        if generations != sorted(generations):
            found.fail("order", f"task {task_id}: generations {generations} go backwards")
        if (state == "TERMINAL") != (outcome is not None):
            found.fail("state", f"task {task_id}: state {state} with outcome {outcome}")
    for task_id in events:
        if task_id not in tasks:
            found.fail("state", f"events of unknown task {task_id}")
    for request_id, count in L.execute(
        "SELECT request_id, count(*) FROM lifecycle_events WHERE workspace_id = ? AND request_id IS NOT NULL "
        "GROUP BY request_id HAVING count(*) > 1",
        (ws,),
    ):
        found.fail("duplicated", f"request {request_id} has {count} lifecycle events")


def _check_completions(L, C, ws: str, found: Findings) -> None:
    rows = C.execute(
        "SELECT completion_id, task_id, generation, outcome, settlement, lifecycle_revision, lifecycle_event_sequence, "
        "error_reason FROM task_completions WHERE workspace_id = ?",
        (ws,),
    ).fetchall()
    kinds = collections.defaultdict(collections.Counter)
    for completion_id, kind in C.execute(
        "SELECT completion_id, kind FROM completion_events WHERE workspace_id = ? AND completion_id IS NOT NULL", (ws,)
    ):
        kinds[completion_id][kind] += 1
    known = {row[0] for row in rows}
    for completion_id in kinds:
        if completion_id not in known:
            found.fail("phantom", f"completion events for unknown completion {completion_id}")
    for cid, task_id, generation, outcome, settlement, revision, sequence, error_reason in rows:
        settles = L.execute(
            "SELECT sequence, revision, generation, intent, outcome, completion_id FROM lifecycle_events "
            "WHERE workspace_id = ? AND request_id = ?",
            (ws, f"settle:{cid}"),
        ).fetchall()
        seen = kinds[cid]
        if seen["COMPLETION_COMMITTED"] != 1:
            found.fail(
                "duplicated" if seen["COMPLETION_COMMITTED"] > 1 else "lost",
                f"{cid}: {seen['COMPLETION_COMMITTED']} COMPLETION_COMMITTED events",
            )
        if settlement == "PENDING":
            found.fail("lost", f"{cid} ({task_id}) is still PENDING after the drain")
        elif settlement == "SETTLED":
            if len(settles) != 1:
                found.fail(
                    "duplicated" if len(settles) > 1 else "lost", f"{cid}: {len(settles)} lifecycle settle events"
                )
            if seen["COMPLETION_SETTLED"] != 1 or seen["TERMINALIZATION_ERROR"]:
                found.fail(
                    "duplicated" if seen["COMPLETION_SETTLED"] > 1 else "lost", f"{cid}: settled, events {dict(seen)}"
                )
            if settles:
                s_sequence, s_revision, s_generation, intent, s_outcome, s_cid = settles[0]
                expected = "SETTLE_COMPLETION" if outcome == "COMPLETED" else "SETTLE_FAILURE"
                if (s_sequence, s_revision, s_generation, intent) != (sequence, revision, generation, expected):
                    found.fail(
                        "mismatch",
                        f"{cid}: row says {(sequence, revision, generation, expected)}, "
                        f"lifecycle {(s_sequence, s_revision, s_generation, intent)}",
                    )
                if outcome == "COMPLETED" and (s_outcome, s_cid) != ("COMPLETED", cid):
                    found.fail("mismatch", f"{cid}: lifecycle event outcome {s_outcome} completion {s_cid}")
            task = L.execute(
                "SELECT generation, state, outcome, completion_id FROM tasks WHERE workspace_id = ? AND task_id = ?",
                (ws, task_id),
            ).fetchone()
            if task is not None and task[0] == generation:
                wanted = ("TERMINAL", outcome, cid if outcome == "COMPLETED" else None)
                if tuple(task[1:]) != wanted:
                    found.fail("mismatch", f"{cid}: task {task_id} is {tuple(task[1:])}, expected {wanted}")
        elif settlement == "REJECTED":
            if settles:
                found.fail("duplicated", f"{cid}: REJECTED yet the lifecycle committed {settles}")
            if seen["TERMINALIZATION_ERROR"] != 1 or seen["COMPLETION_SETTLED"]:
                found.fail("mismatch", f"{cid}: rejected, events {dict(seen)}")
            if error_reason not in FINAL_LIFECYCLE_REASONS:
                found.fail("spurious", f"{cid}: rejected for {error_reason!r}, not a final lifecycle refusal")
            elif not _refusal_stands(L, ws, task_id, generation):
                found.fail("spurious", f"{cid}: rejected ({error_reason}) although nothing forbade settling it")
    # No terminal completion event without its lifecycle commit, and no lifecycle
    # settlement of a completion this service does not record as SETTLED.
    for cid, event_sequence in C.execute(
        "SELECT completion_id, lifecycle_event_sequence FROM completion_events WHERE workspace_id = ? AND kind = "
        "'COMPLETION_SETTLED'",
        (ws,),
    ):
        row = L.execute(
            "SELECT sequence FROM lifecycle_events WHERE workspace_id = ? AND request_id = ?", (ws, f"settle:{cid}")
        ).fetchone()
        if row is None or row[0] != event_sequence:
            found.fail("phantom", f"COMPLETION_SETTLED for {cid} without its lifecycle commit")
    settled = {row[0] for row in rows if row[4] == "SETTLED"}
    for (request_id,) in L.execute(
        "SELECT request_id FROM lifecycle_events WHERE workspace_id = ? AND request_id LIKE 'settle:%'", (ws,)
    ):
        if request_id.removeprefix("settle:") not in settled:
            found.fail(
                "phantom", f"lifecycle settled {request_id} which the completion service does not hold as SETTLED"
            )
    for task_id, completion_id in L.execute(
        "SELECT task_id, completion_id FROM tasks WHERE workspace_id = ? AND outcome = 'COMPLETED'", (ws,)
    ):
        if completion_id not in settled:
            found.fail("phantom", f"task {task_id} COMPLETED by {completion_id}, not a settled completion")


FINAL_LIFECYCLE_REASONS = {r.name for r in LifecycleReason if r.value.code.name in ("FAILED_PRECONDITION", "NOT_FOUND")}


def _refusal_stands(L, ws: str, task_id: str, generation: int) -> bool:
    """A completion may be refused only when its generation is over (replaced or
    terminal), fenced, or its attached parent's generation is fenced or over."""
    task = L.execute(
        "SELECT generation, state, cancellation_requested_at, parent_task_id, parent_generation, parent_mode "
        "FROM tasks WHERE workspace_id = ? AND task_id = ?",
        (ws, task_id),
    ).fetchone()
    if task is None:
        return True
    current, state, fence, parent_id, parent_generation, mode = task
    if current != generation or state == "TERMINAL" or fence is not None:
        return True
    if mode == "ATTACHED":
        parent = L.execute(
            "SELECT generation, state, cancellation_requested_at FROM tasks WHERE workspace_id = ? AND task_id = ?",
            (ws, parent_id),
        ).fetchone()
        return parent is None or parent[0] != parent_generation or parent[1] == "TERMINAL" or parent[2] is not None
    return False


def _check_children(L, ws: str, found: Findings) -> None:
    tasks = {
        r[0]: r
        for r in L.execute(
            "SELECT task_id, generation, state, outcome, cancellation_requested_at, parent_task_id, parent_generation, "
            "parent_mode FROM tasks WHERE workspace_id = ?",
            (ws,),
        )
    }
    for task_id, _generation, state, _outcome, fence, parent_id, parent_generation, mode in tasks.values():
        if mode != "ATTACHED":
            continue
        parent = tasks.get(parent_id)
        if parent is None:
            found.fail("state", f"{task_id}: attached to unknown parent {parent_id}")
            continue
        ended = parent[1] > parent_generation or (
            parent[2] == "TERMINAL" and parent[3] in FINAL_OUTCOMES_THAT_END_CHILDREN
        )
        if ended and state != "TERMINAL":
            found.fail("lost", f"attached child {task_id} is {state} although parent {parent_id} ended {parent[3]}")
        if parent[1] == parent_generation and parent[4] is not None and state != "TERMINAL" and fence is None:
            found.fail("lost", f"attached child {task_id} has no cancellation request although its parent has")
    pending = L.execute("SELECT count(*) FROM pending_propagations WHERE workspace_id = ?", (ws,)).fetchone()[0]
    if pending:
        found.fail("lost", f"{pending} propagations still pending")


def _check_acknowledged(L, C, ledger: Ledger, found: Findings) -> None:
    ws = ledger.workspace
    for task_id, sequence, revision, intent in ledger.lifecycle_events:
        row = L.execute(
            "SELECT task_id, revision, intent FROM lifecycle_events WHERE workspace_id = ? AND sequence = ?",
            (ws, sequence),
        ).fetchone()
        if row is None or (row[0], row[1], lifecycle_enums.Intent.Value(f"INTENT_{row[2]}")) != (
            task_id,
            revision,
            intent,
        ):
            found.fail("lost", f"acknowledged lifecycle event #{sequence} ({task_id} r{revision}) is {row}")
    for task_id, run_id, epoch in ledger.claims:
        row = C.execute(
            "SELECT task_id, epoch FROM agent_runs WHERE workspace_id = ? AND run_id = ?", (ws, run_id)
        ).fetchone()
        if row is None or tuple(row) != (task_id, epoch):
            found.fail("lost", f"acknowledged claim {run_id} of {task_id} is {row}")
    for evidence_id in ledger.evidence:
        if C.execute("SELECT 1 FROM evidence WHERE evidence_id = ?", (evidence_id,)).fetchone() is None:
            found.fail("lost", f"acknowledged evidence {evidence_id} is missing")
    stored = C.execute("SELECT count(*) FROM evidence WHERE workspace_id = ?", (ws,)).fetchone()[0]
    if stored > len(ledger.evidence) + ledger.unknown_evidence:
        found.fail("duplicated", f"{stored} evidence rows for {len(ledger.evidence)} acknowledged records")
    for task_id, generation, completion_id in ledger.completions:
        row = C.execute(
            "SELECT task_id, generation FROM task_completions WHERE workspace_id = ? AND completion_id = ?",
            (ws, completion_id),
        ).fetchone()
        if row is None or tuple(row) != (task_id, generation):
            found.fail("lost", f"acknowledged completion {completion_id} of {task_id} is {row}")
    for run_id in ledger.closed_runs:
        row = C.execute(
            "SELECT finished_at FROM agent_runs WHERE workspace_id = ? AND run_id = ?", (ws, run_id)
        ).fetchone()
        if row is None or row[0] is None:
            found.fail("lost", f"acknowledged close of run {run_id} is missing")
    for run_id, count in C.execute(
        "SELECT run_id, count(*) FROM audit_log WHERE workspace_id = ? GROUP BY run_id", (ws,)
    ):
        if count != 1:
            found.fail("duplicated", f"run {run_id} has {count} audit rows")
    for (run_id,) in C.execute(
        "SELECT run_id FROM agent_runs WHERE workspace_id = ? AND finished_at IS NOT NULL "
        "AND run_id NOT IN (SELECT run_id FROM audit_log WHERE workspace_id = ?)",
        (ws, ws),
    ):
        found.fail("lost", f"closed run {run_id} has no audit row")


def _check_transcripts(C, ledger: Ledger, found: Findings) -> None:
    ws = ledger.workspace
    acknowledged = collections.Counter()
    for task_id, first, count, _version in ledger.appends:
        acknowledged[task_id] += count
        rows = C.execute(
            "SELECT sequence, synthetic FROM transcript_events WHERE workspace_id = ? AND task_id = ? "
            "AND sequence BETWEEN ? AND ?",
            (ws, task_id, first, first + count - 1),
        ).fetchall()
        if len(rows) != count or any(synthetic for _, synthetic in rows):
            found.fail("lost", f"acknowledged append of {count} events at {first} to {task_id}: {rows}")
    tasks = {r[0] for r in C.execute("SELECT DISTINCT task_id FROM transcript_events WHERE workspace_id = ?", (ws,))}
    for task_id in tasks | set(acknowledged):
        sequences = [
            r[0]
            for r in C.execute(
                "SELECT sequence FROM transcript_events WHERE workspace_id = ? AND task_id = ? ORDER BY sequence",
                (ws, task_id),
            )
        ]
        if sequences != list(range(1, len(sequences) + 1)):
            found.fail("gap", f"transcript of {task_id}: sequences {sequences}")
        real = C.execute(
            "SELECT count(*) FROM transcript_events WHERE workspace_id = ? AND task_id = ? AND synthetic = 0",
            (ws, task_id),
        ).fetchone()[0]
        if not acknowledged[task_id] <= real <= acknowledged[task_id] + ledger.unknown_appends[task_id]:
            found.fail(
                "duplicated" if real > acknowledged[task_id] else "lost",
                f"transcript of {task_id}: {real} events, {acknowledged[task_id]} acknowledged",
            )
        closers = C.execute(
            "SELECT kind, ref, count(*) FROM transcript_events WHERE workspace_id = ? AND task_id = ? AND synthetic = "
            "1 "
            "GROUP BY kind, ref",
            (ws, task_id),
        ).fetchall()
        for kind, ref, count in closers:
            if count != 1:
                found.fail("duplicated", f"{task_id}: {count} synthetic {kind} for {ref}")
    for task_id, turn in ledger.interrupted.items():
        opened = C.execute(
            "SELECT count(*) FROM transcript_events WHERE workspace_id = ? AND task_id = ? AND kind = 'TURN_START' AND "
            "ref = ?",
            (ws, task_id, turn),
        ).fetchone()[0]
        if not opened:
            continue  # the turn never started (its append was refused)
        ends = C.execute(
            "SELECT synthetic, reason FROM transcript_events WHERE workspace_id = ? AND task_id = ? AND kind = "
            "'TURN_END' AND ref = ?",
            (ws, task_id, turn),
        ).fetchall()
        if ends != [(1, "INTERRUPTED")]:
            found.fail("duplicated" if len(ends) > 1 else "lost", f"interrupted turn of {task_id} ended by {ends}")
        tail = C.execute(
            "SELECT open_turn FROM transcript_tails WHERE workspace_id = ? AND task_id = ?", (ws, task_id)
        ).fetchone()
        if tail is None or tail[0] is not None:
            found.fail("lost", f"interrupted turn of {task_id} is still open: {tail}")
        if ledger.repaired_replies[task_id] > 1:
            found.fail("duplicated", f"{ledger.repaired_replies[task_id]} loads of {task_id} reported a repair")
