"""Support of the application-layer unit tests: the in-memory store with a manual
clock and sequential ids (`World`), builders of commands, and a scripted fake of
the lifecycle client for the shells."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from completion_service.clients.lifecycle_client import LifecycleRejected, LifecycleUnavailable
from completion_service.core.gates import WorkspacePolicy
from completion_service.core.model import LifecycleState, LifecycleView, RequestedOutcome, RunOutcome
from completion_service.core.transcript import Tail
from completion_service.storage.memory import MemoryCompletionStore
from completion_service.storage.port import TranscriptState
from completion_service.units.completions import AttemptCommand, AttemptContext
from completion_service.units.runs import ClaimCommand, Claimed, CloseCommand
from funnel.auth.principal import Caller
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.clock import ManualClock, SequentialIds
from funnel.runtime.idempotency import RequestKey

START = 1_700_000_000_000_000
SECOND = 1_000_000
WS = "ws-1"
ACTIVE = LifecycleView(generation=1, state=LifecycleState.ACTIVE, outcome=None, cancellation_requested=False)


class World:
    """An empty in-memory store, a clock that moves only when told, sequential ids."""

    def __init__(self) -> None:
        self.store = MemoryCompletionStore()
        self.clock = ManualClock(START)
        self.ids = SequentialIds()

    async def run(self, unit: Callable[..., Any], /, **kwargs: Any) -> Any:
        """Runs a unit of work in one write transaction at the clock's `now`."""
        return await self.store.write(functools.partial(unit, **kwargs, now=self.clock.now_micros()))

    async def read(self, fn: Callable[..., Any]) -> Any:
        return await self.store.read(fn)

    async def claimed(
        self,
        task_id: str = "t-1",
        agent: str = "agent-1",
        ttl: int = 60 * SECOND,
        request: RequestKey | None = None,
        generation: int = 1,
    ) -> Claimed:
        from completion_service.units import runs

        claimed = await self.run(runs.claim, command=self.claim_command(task_id, agent, ttl, request, generation))
        assert isinstance(claimed, Claimed), claimed
        return claimed

    def claim_command(
        self,
        task_id: str = "t-1",
        agent: str = "agent-1",
        ttl: int = 60 * SECOND,
        request: RequestKey | None = None,
        generation: int = 1,
    ) -> ClaimCommand:
        return ClaimCommand(
            WS,
            task_id,
            agent,
            generation,
            ttl,
            self.ids.new_id("run"),
            request,
            lambda claimed: claimed.run.run_id.encode(),
        )

    def attempt_command(self, claimed: Claimed, **changes: Any) -> AttemptCommand:
        return attempt_parts(claimed, self.ids.new_id("cmp"), **changes)[0]

    def attempt_args(self, claimed: Claimed, **changes: Any) -> dict[str, Any]:
        """completions.attempt's command and context (each change goes to the one naming it)."""
        command, context = attempt_parts(claimed, self.ids.new_id("cmp"), **changes)
        return {"command": command, "context": context}

    async def set_transcript(
        self, task_id: str, state_version: int, checkpoint: str = "", open_turn: str | None = None
    ) -> None:
        tail = Tail(open_turn=open_turn, checkpoint=checkpoint)
        await self.store.write(lambda tx: tx.transcripts.save_tail(WS, task_id, TranscriptState(tail, state_version)))

    def state(self) -> object:
        """The store's whole committed state (for "nothing changed" checks)."""
        return self.store.snapshot()


def attempt_parts(claimed: Claimed, completion_id: str, **changes: Any) -> tuple[AttemptCommand, AttemptContext]:
    """A default attempt of the claimed run, judged on an ACTIVE view with the
    default policy; `changes` name fields of either the command or the context."""
    in_context = {f.name for f in dataclasses.fields(AttemptContext)}
    command = AttemptCommand(
        workspace_id=WS,
        task_id=claimed.run.task_id,
        run_id=claimed.run.run_id,
        claimed_epoch=claimed.lease.epoch,
        outcome=RequestedOutcome.COMPLETED,
        result="all tests pass",
        state_version=None,
    )
    context = AttemptContext(
        lifecycle=ACTIVE, lifecycle_projected=False, policy=WorkspacePolicy(), completion_id=completion_id
    )
    return (
        dataclasses.replace(command, **{k: v for k, v in changes.items() if k not in in_context}),
        dataclasses.replace(context, **{k: v for k, v in changes.items() if k in in_context}),
    )


def close_command(run_id: str, **changes: Any) -> CloseCommand:
    command = CloseCommand(
        workspace_id=WS,
        run_id=run_id,
        outcome=RunOutcome.SUCCEEDED,
        tokens_input=10,
        tokens_output=5,
        tokens_total=15,
        notes="done",
        notes_truncated=False,
        error="",
        final_status=None,
        closed_by="agent",
        caller=Caller("agent-1", "agent"),
    )
    return dataclasses.replace(command, **changes)


def key(method: str, request_id: str, digest: bytes = b"fp", caller: str = "host-1") -> RequestKey:
    return RequestKey(WS, caller, method, request_id, digest)


class FakeLifecycle:
    """A scripted stand-in for LifecycleClient: tasks as plain protos, each call
    recorded in `calls`; `fail[method] = exception` makes the next call raise it."""

    def __init__(self) -> None:
        self.tasks: dict[str, lifecycle_types.Task] = {}
        self.children: dict[str, list[str]] = {}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.fail: dict[str, Exception] = {}
        self._revision = 1
        # Seconds a call may take, as LifecycleClient.timeout.
        self.timeout = 5.0

    def register(
        self, task_id: str, state: int = lifecycle_enums.GENERATION_STATE_ACTIVE, generation: int = 1, **fields: Any
    ) -> lifecycle_types.Task:
        task = lifecycle_types.Task(
            workspace_id=WS, task_id=task_id, generation=generation, revision=1, state=state, **fields
        )
        self.tasks[task_id] = task
        return task

    def _called(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))
        failure = self.fail.pop(method, None)
        if failure is not None:
            raise failure

    def called(self, method: str) -> list[tuple[Any, ...]]:
        return [args for name, args in self.calls if name == method]

    def _event(self, task: lifecycle_types.Task) -> lifecycle_types.LifecycleEvent:
        self._revision += 1
        task.revision = self._revision
        return lifecycle_types.LifecycleEvent(
            revision=task.revision, sequence=100 + self._revision, generation=task.generation
        )

    async def get_task(self, workspace_id: str, task_id: str) -> lifecycle_messages.GetTaskResponse:
        self._called("get_task", task_id)
        if task_id not in self.tasks:
            raise LifecycleRejected("TASK_NOT_FOUND", f"no task {task_id!r}")
        children = self.children.get(task_id, [])
        return lifecycle_messages.GetTaskResponse(task=self.tasks[task_id], open_attached_child_task_ids=children)

    async def activate(self, workspace_id: str, task_id: str, generation: int, run_id: str) -> Any:
        self._called("activate", task_id, generation, run_id)
        task = self.tasks[task_id]
        task.state, task.work_status = lifecycle_enums.GENERATION_STATE_ACTIVE, lifecycle_enums.WORK_STATUS_IN_PROGRESS
        return lifecycle_messages.ActivateGenerationResponse(event=self._event(task), task=task)

    async def set_work_status(
        self, workspace_id: str, task_id: str, generation: int, status: int, request_id: str, reason: str, run_id: str
    ) -> Any:
        self._called("set_work_status", task_id, status, request_id)
        task = self.tasks[task_id]
        task.work_status = status  # type: ignore[assignment]
        return lifecycle_messages.SetWorkStatusResponse(event=self._event(task))

    async def request_cancellation(self, workspace_id: str, task_id: str, generation: int, run_id: str) -> Any:
        self._called("request_cancellation", task_id)
        self.tasks[task_id].cancellation = lifecycle_enums.CANCELLATION_STATE_REQUESTED
        return lifecycle_messages.RequestCancellationResponse()

    async def settle_cancellation(
        self, workspace_id: str, task_id: str, generation: int, run_id: str, **cause: Any
    ) -> Any:
        self._called("settle_cancellation", task_id)
        task = self.tasks[task_id]
        task.state, task.outcome, task.work_status = (
            lifecycle_enums.GENERATION_STATE_TERMINAL,
            lifecycle_enums.TERMINAL_OUTCOME_CANCELLED,
            lifecycle_enums.WORK_STATUS_CANCELLED,
        )
        return lifecycle_messages.SettleCancellationResponse()

    async def settle_completion(
        self, workspace_id: str, task_id: str, generation: int, completion_id: str, authoritative_at: int, run_id: str
    ) -> lifecycle_messages.SettleCompletionResponse:
        self._called("settle_completion", task_id, completion_id)
        task = self.tasks[task_id]
        task.state, task.outcome, task.work_status, task.completion_id = (
            lifecycle_enums.GENERATION_STATE_TERMINAL,
            lifecycle_enums.TERMINAL_OUTCOME_COMPLETED,
            lifecycle_enums.WORK_STATUS_DONE,
            completion_id,
        )
        return lifecycle_messages.SettleCompletionResponse(event=self._event(task))

    async def settle_failure(
        self, workspace_id: str, task_id: str, generation: int, completion_id: str, run_id: str
    ) -> lifecycle_messages.SettleFailureResponse:
        self._called("settle_failure", task_id, completion_id)
        task = self.tasks[task_id]
        task.state, task.outcome = lifecycle_enums.GENERATION_STATE_TERMINAL, lifecycle_enums.TERMINAL_OUTCOME_FAILED
        return lifecycle_messages.SettleFailureResponse(event=self._event(task))


UNAVAILABLE = LifecycleUnavailable("UNAVAILABLE: connection refused")
