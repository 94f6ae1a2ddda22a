"""The simulated clients: hosts and agents carrying out their steps of the
workload, and watchers following each workspace's event streams across cuts and
crashes. They call the real servicers over the simulated network as a careful
gRPC client does: every mutation carries a request id and is sent again with it
while no answer comes (UNAVAILABLE, DEADLINE_EXCEEDED, STORAGE_UNAVAILABLE); what
each call answered is in the history."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message

from funnel.auth.principal import Principal, Role
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime import calls
from funnel_sim import turns
from funnel_sim.network import Answer, Network, Ok, SimContext, StreamEnded, no_answer
from funnel_sim.nodes import CompletionNode, LifecycleNode, Node
from funnel_sim.workload import Step, Task

CALL_TIMEOUT = 2.0
TRIES = 6
LEASE_SECONDS = 4
# Events per LoadTranscript page: small, so that a load pages.
TRANSCRIPT_PAGE = 8


def _caller(subject: str, role: Role) -> calls.Call:
    return calls.Call(Principal(subject), role, role is Role.AGENT, "")


def _handler(node: Node, method: str) -> Callable[[Any, SimContext], Any]:
    async def handle(request: Any, context: SimContext) -> Any:
        return await getattr(node.servicer(method), method)(request, context)

    return handle


class Rendezvous:
    """Where the crew's members (workload.py's finale) wait for each other: each
    arrives, and waits until all expected have arrived or `timeout` virtual
    seconds passed (one may never come)."""

    def __init__(self, expected: int, timeout: float) -> None:
        self._left = expected
        self._timeout = timeout
        self._all_here = asyncio.Event()
        if expected <= 0:
            self._all_here.set()

    async def meet(self) -> None:
        self._left -= 1
        if self._left <= 0:
            self._all_here.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all_here.wait(), self._timeout)


@dataclass
class Actor:
    name: str
    network: Network
    lifecycle: LifecycleNode
    completion: CompletionNode
    role: Role
    last: tuple[Node, str, Message] | None = None
    counter: int = 0
    # Where the crew (workload.py's finale) meets before completing; None for the others.
    rendezvous: Rendezvous | None = None

    def request_id(self, label: str) -> str:
        self.counter += 1
        return f"{self.name}:{self.counter}:{label}"

    async def call(self, node: Node, method: str, request: Message) -> Answer:
        """Sends the request until it is answered (at most TRIES times)."""
        answer: Answer | None = None
        for attempt in range(TRIES):
            answer = await self.network.call(
                self.name, node, method, _handler(node, method), request, _caller(self.name, self.role), CALL_TIMEOUT
            )
            if not no_answer(answer):
                break
            await asyncio.sleep(0.2 * 2**attempt)
        assert answer is not None
        if getattr(request, "request_id", ""):
            self.last = (node, method, request)
        return answer

    async def meet(self, jitter: int) -> None:
        """At the crew's rendezvous, whether or not it holds a run (the others wait
        for it), then `jitter` milliseconds: the crew's next steps start nearly together."""
        if self.rendezvous is not None:
            await self.rendezvous.meet()
        await asyncio.sleep(jitter / 1000)

    async def replay(self) -> None:
        """The last mutation again, with its request id: a late retransmission."""
        if self.last is not None:
            node, method, request = self.last
            await self.call(node, method, request)

    async def task_of(self, task: Task) -> lifecycle_types.Task | None:
        answer = await self.call(
            self.lifecycle,
            "GetTask",
            lifecycle_messages.GetTaskRequest(workspace_id=task.workspace, task_id=task.name),
        )
        return answer.response.task if isinstance(answer, Ok) else None

    async def append(self, task: Task, request_id: str, events: list[turns.Event]) -> Answer:
        return await self.call(
            self.completion,
            "AppendTranscript",
            transcript_messages.AppendTranscriptRequest(
                workspace_id=task.workspace, task_id=task.name, events=events, request_id=request_id
            ),
        )


def cause(reason: str) -> lifecycle_types.Cause:
    return lifecycle_types.Cause(source="funnel-sim", reason=reason)


class Host(Actor):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Each whole LoadTranscript (every page answered): the task and the events read.
        self.reads: list[tuple[Task, list[turns.Event]]] = []

    async def step(self, step: Step, tree: dict[str, Task]) -> None:
        task = tree[step.task]
        if step.action == "register":
            parent = None
            if task.parent is not None:
                mode = (
                    lifecycle_enums.PARENT_LINK_MODE_ATTACHED
                    if task.parent[1]
                    else lifecycle_enums.PARENT_LINK_MODE_DETACHED
                )
                parent = lifecycle_types.ParentLink(task_id=task.parent[0], generation=1, mode=mode)
            await self.call(
                self.lifecycle,
                "RegisterTask",
                lifecycle_messages.RegisterTaskRequest(
                    workspace_id=task.workspace,
                    task_id=task.name,
                    request_id=self.request_id("register"),
                    parent=parent,
                    cause=cause("registered by the simulation"),
                ),
            )
        elif step.action == "replay":
            await self.replay()
        elif step.action == "pause":
            await asyncio.sleep(step.arg / 100)
        elif step.action == "rendezvous":
            await self.meet(step.arg)
        elif step.action == "feedback":
            # User feedback: on a completed generation the batch reopens it (a resume).
            request_id = self.request_id("feedback")
            await self.append(task, request_id, turns.feedback(request_id))
        elif step.action == "load":
            await self.load(task)
        else:
            current = await self.task_of(task)
            if current is not None:
                await self._intent(step, task, current)

    async def load(self, task: Task) -> None:
        """The whole transcript, page by page: the first page repairs an interrupted final turn."""
        read: list[turns.Event] = []
        token = ""
        while True:
            answer = await self.call(
                self.completion,
                "LoadTranscript",
                transcript_messages.LoadTranscriptRequest(
                    workspace_id=task.workspace, task_id=task.name, page_size=TRANSCRIPT_PAGE, page_token=token
                ),
            )
            if not isinstance(answer, Ok):
                return
            read += answer.response.events
            token = answer.response.next_page_token
            if not token:
                self.reads.append((task, read))
                return

    async def _intent(self, step: Step, task: Task, current: lifecycle_types.Task) -> None:
        header: dict[str, Any] = {
            "workspace_id": task.workspace,
            "task_id": task.name,
            "generation": current.generation,
            "request_id": self.request_id(step.action),
            "cause": cause(step.action),
        }
        if step.action == "activate":
            await self.call(
                self.lifecycle, "ActivateGeneration", lifecycle_messages.ActivateGenerationRequest(**header)
            )
        elif step.action == "suspend":
            await self.call(self.lifecycle, "SuspendGeneration", lifecycle_messages.SuspendGenerationRequest(**header))
        elif step.action == "work_status":
            status = WORK_STATUSES[step.arg % len(WORK_STATUSES)]
            await self.call(
                self.lifecycle,
                "SetWorkStatus",
                lifecycle_messages.SetWorkStatusRequest(**header, work_status=status),
            )
        elif step.action == "cancel":
            await self.call(
                self.lifecycle, "RequestCancellation", lifecycle_messages.RequestCancellationRequest(**header)
            )
        elif step.action == "settle_cancel":
            await self.call(
                self.lifecycle, "SettleCancellation", lifecycle_messages.SettleCancellationRequest(**header)
            )
        elif step.action == "timeout":
            await self.call(self.lifecycle, "SettleTimeout", lifecycle_messages.SettleTimeoutRequest(**header))
        elif step.action == "resume" and current.state == lifecycle_enums.GENERATION_STATE_TERMINAL:
            if current.outcome == lifecycle_enums.TERMINAL_OUTCOME_COMPLETED and step.arg % 2:
                # The user's feedback on the completed task reopens it (the completion service resumes it).
                await self.append(task, header["request_id"], turns.feedback(header["request_id"]))
                return
            header["generation"] = current.generation + 1
            await self.call(
                self.lifecycle, "ResumeWithGeneration", lifecycle_messages.ResumeWithGenerationRequest(**header)
            )


# What a host may set (DONE and CANCELLED come only from settlements).
WORK_STATUSES = (
    lifecycle_enums.WORK_STATUS_READY,
    lifecycle_enums.WORK_STATUS_IN_PROGRESS,
    lifecycle_enums.WORK_STATUS_BLOCKED,
)


@dataclass
class Held:
    """The run an agent holds (or held: it keeps using it after it ended)."""

    run_id: str
    task: Task
    generation: int
    epoch: int


class Agent(Actor):
    held: Held | None = None
    # The turn its last batch left open (its session died mid-call), to continue.
    open_turn: turns.OpenTurn | None = None

    async def step(self, step: Step, tree: dict[str, Task]) -> None:
        action, held = step.action, self.held
        if action == "claim":
            task = tree[step.task]
            answer = await self.call(
                self.completion,
                "ClaimTask",
                completion_messages.ClaimTaskRequest(
                    workspace_id=task.workspace,
                    task_id=task.name,
                    agent_id=self.name,
                    request_id=self.request_id("claim"),
                    lease_ttl=Duration(seconds=LEASE_SECONDS),
                ),
            )
            if isinstance(answer, Ok):
                run, lease = answer.response.run, answer.response.lease
                self.held = Held(run.run_id, task, run.generation, lease.epoch)
        elif action == "replay":
            await self.replay()
        elif action == "pause":
            await asyncio.sleep(step.arg / 100)
        elif action == "rendezvous":
            await self.meet(step.arg)
        elif held is None:
            return
        elif action == "transcript":
            await self._transcript(held.task, step.arg)
        elif action == "renew":
            await self.call(
                self.completion,
                "RenewLease",
                completion_messages.RenewLeaseRequest(
                    workspace_id=held.task.workspace,
                    run_id=held.run_id,
                    epoch=held.epoch,
                    request_id=self.request_id("renew"),
                    lease_ttl=Duration(seconds=LEASE_SECONDS),
                ),
            )
        elif action == "evidence":
            verdict = (
                completion_enums.EVIDENCE_VERDICT_PASSED if step.arg % 4 else completion_enums.EVIDENCE_VERDICT_FAILED
            )
            await self.call(
                self.completion,
                "RecordEvidence",
                completion_messages.RecordEvidenceRequest(
                    workspace_id=held.task.workspace,
                    task_id=held.task.name,
                    generation=held.generation,
                    kind="tests",
                    verdict=verdict,
                    run_id=held.run_id,
                    request_id=self.request_id("evidence"),
                ),
            )
        elif action in ("attempt", "attempt_failed"):
            outcome = (
                completion_enums.REQUESTED_OUTCOME_COMPLETED
                if action == "attempt"
                else completion_enums.REQUESTED_OUTCOME_FAILED
            )
            await self.call(
                self.completion,
                "AttemptCompletion",
                completion_messages.AttemptCompletionRequest(
                    workspace_id=held.task.workspace,
                    task_id=held.task.name,
                    run_id=held.run_id,
                    epoch=held.epoch,
                    outcome=outcome,
                    result="done",
                    request_id=self.request_id(action),
                ),
            )
        else:
            closed = {
                "close": completion_enums.RUN_OUTCOME_SUCCEEDED,
                "close_failed": completion_enums.RUN_OUTCOME_FAILED,
                "close_cancelled": completion_enums.RUN_OUTCOME_CANCELLED,
            }[action]
            await self.call(
                self.completion,
                "CompleteRun",
                completion_messages.CompleteRunRequest(
                    workspace_id=held.task.workspace,
                    run_id=held.run_id,
                    outcome=closed,
                    notes="closed by the simulation",
                    request_id=self.request_id(action),
                ),
            )

    async def _transcript(self, task: Task, shape: int) -> None:
        """A turn under its lease, or the rest of the one its last batch left open."""
        open_turn, self.open_turn = self.open_turn, None
        if open_turn is not None and open_turn.task == task.name:
            await self.append(task, self.request_id("continue"), turns.continuation(open_turn))
            return
        request_id = self.request_id("transcript")
        events, left_open = turns.turn(task.name, request_id, shape)
        if isinstance(await self.append(task, request_id, events), Ok):
            self.open_turn = left_open


@dataclass
class Watcher:
    """Follows one service's watch stream of one workspace from its cursor,
    reconnecting after every end, and keeps every event it was given, in order."""

    name: str
    network: Network
    workspace: str
    node: Node
    method: str
    request_type: Any
    seen: list[Any] = field(default_factory=list)
    streams: int = 0

    @property
    def cursor(self) -> int:
        return self.seen[-1].sequence if self.seen else 0

    async def follow(self) -> None:
        """Runs until cancelled (the simulation stops it once everything drained)."""

        def watch(request: Any, context: SimContext) -> Any:
            return getattr(self.node.servicer(self.method), self.method)(request, context)

        while True:
            request = self.request_type(workspace_id=self.workspace, after_sequence=self.cursor)
            stream = self.network.stream(
                self.name, self.node, self.method, watch, request, _caller(self.name, Role.VIEWER)
            )
            self.streams += 1
            try:
                while True:
                    item = await stream.next()
                    if item.HasField("event"):
                        self.seen.append(item.event)
            except StreamEnded:
                pass
            finally:
                stream.cancel()
            await asyncio.sleep(0.5)
