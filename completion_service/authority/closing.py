"""Closing a run (seed 001's `complete_task`). The lifecycle change the outcome
asks for comes before the close commits: if the lifecycle service refuses it,
nothing is closed and the refusal is the answer (LIFECYCLE_REJECTED), so that an
agent is never told its run closed while the task was left in another state
than asked.

Under a cancellation fence no status can be set and no completion passes unless
it came first; so a close on a fenced generation first lets a pending completion
of it settle (its answer decides), and when nothing but the cancellation can end
the generation and no other run holds the task, the close settles the
cancellation (core/runs.py `FenceEnd`). The settlement outbox does the same for a
completion refused by the fence after its run closed (settlements.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from completion_service.authority.attempts import CompletionTransaction
from completion_service.authority.lifecycle import close_refused, unavailable
from completion_service.clients.lifecycle_client import (
    LifecycleClient,
    LifecycleRejected,
    LifecycleUnavailable,
    record_of,
)
from completion_service.core.model import (
    CompletionEvent,
    CompletionRecord,
    Decision,
    FinalStatus,
    RequestedOutcome,
    RunOutcome,
    RunRecord,
    SettlementStatus,
)
from completion_service.core.runs import (
    ClosePlan,
    CloseStep,
    FenceEnd,
    TaskEffect,
    cap_notes,
    close_effect,
    close_plan,
    fence_end,
    tokens_total,
)
from completion_service.core.settlement import binding_decision, fence_refused
from completion_service.errors import Reason
from completion_service.storage.port import CompletionReadTx, CompletionStore
from completion_service.units import runs
from completion_service.units.completions import AttemptCommand, AttemptOutcome
from completion_service.units.holding import holding_run
from completion_service.units.request_ids import peek
from completion_service.units.runs import CloseCommand, Closed, Replan
from funnel.auth.principal import Caller
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.clock import Clock
from funnel.runtime.errors import Rejection, ServiceError, reject
from funnel.runtime.idempotency import Replay, RequestKey


@dataclass(frozen=True)
class RunClosed:
    run: RunRecord
    decision: Decision | None = None
    completion: CompletionRecord | None = None
    effect: TaskEffect | None = None
    effect_reason: str = ""


@dataclass(frozen=True)
class _Decided:
    """What the lifecycle side of a close came to, for its transaction and answer."""

    decision: Decision | None
    completion: CompletionRecord | None
    final: FinalStatus
    effect: TaskEffect
    effect_reason: str
    # The generation's completion as the close was decided on (runs.CloseCommand).
    seen: CompletionRecord | None

    @property
    def completion_seen(self) -> tuple[str, SettlementStatus] | None:
        return (self.seen.completion_id, self.seen.settlement) if self.seen is not None else None

    def closed(self, run: RunRecord) -> RunClosed:
        return RunClosed(run, self.decision, self.completion, self.effect, self.effect_reason)


def _fenced(task: lifecycle_types.Task, run: RunRecord) -> bool:
    """The run's generation is the current one, open, with its cancellation requested."""
    return (
        task.generation == run.generation
        and task.state != lifecycle_enums.GENERATION_STATE_TERMINAL
        and task.cancellation == lifecycle_enums.CANCELLATION_STATE_REQUESTED
    )


def _settlement_refused(decision: Decision, completion: CompletionRecord, run: RunRecord) -> ServiceError:
    return ServiceError(
        reject(
            Reason.LIFECYCLE_REJECTED,
            f"closing run {run.run_id} committed completion {completion.completion_id}, and the lifecycle service "
            f"refused to settle it; the run stays open. {decision.instruction}",
            lifecycle_reason=completion.error_reason or "",
            next_action=decision.next_action.name,
            run_id=run.run_id,
            completion_id=completion.completion_id,
        )
    )


def _render(render: Callable[[RunClosed], bytes], decided: _Decided, run: RunRecord) -> bytes:
    return render(decided.closed(run))


class RunCloser:
    def __init__(
        self,
        store: CompletionStore,
        lifecycle: LifecycleClient,
        clock: Clock,
        completions: CompletionTransaction,
        publish: Callable[[list[CompletionEvent]], None],
    ) -> None:
        self._store = store
        self._lifecycle = lifecycle
        self._clock = clock
        self._completions = completions
        self._publish = publish

    async def complete_run(
        self,
        workspace_id: str,
        run_id: str,
        outcome: RunOutcome,
        tokens: tuple[int | None, int | None, int | None],
        notes: str,
        error: str,
        final_status: FinalStatus | None,
        caller: Caller,
        holder: str | None,
        request: RequestKey | None,
        render: Callable[[RunClosed], bytes],
    ) -> RunClosed | Replay:
        def check(tx: CompletionReadTx) -> RunRecord | Replay | Rejection:
            seen = peek(tx, request)
            if seen is not None:
                return seen
            run = runs.owned_run(tx, workspace_id, run_id, holder)
            if isinstance(run, RunRecord) and not run.open:
                return runs.already_finished(run)
            return run

        run = await self._store.read(check)
        if isinstance(run, Rejection):
            raise ServiceError(run)
        if isinstance(run, Replay):
            return run
        capped_notes, truncated = cap_notes(notes)
        plan = close_plan(outcome, final_status)
        tokens_input, tokens_output, reported_total = tokens
        close = functools.partial(
            CloseCommand,
            workspace_id=workspace_id,
            run_id=run_id,
            outcome=outcome,
            tokens_input=tokens_input,
            tokens_output=tokens_output,
            tokens_total=tokens_total(tokens_input, tokens_output, reported_total),
            notes=capped_notes,
            notes_truncated=truncated,
            error=error,
            closed_by="agent",
            caller=caller,
            request=request,
        )
        # Decided twice at most: a fenced refusal recorded after the first decision
        # is final, so the second one has seen it (runs.close_run).
        for _ in range(2):
            try:
                decided = await self._decide(workspace_id, run, outcome, plan, capped_notes)
            except LifecycleUnavailable as exc:
                raise unavailable(exc) from None
            except LifecycleRejected as exc:
                raise close_refused(exc, run) from None
            command = close(
                final_status=decided.final,
                render=functools.partial(_render, render, decided),
                completion_seen=decided.completion_seen,
            )
            closed = await self._store.write(
                functools.partial(runs.close_run, command=command, now=self._clock.now_micros()),
                after_commit=self._published,
            )
            if not isinstance(closed, Replan):
                break
        assert not isinstance(closed, Replan), "a close decided on the fenced refusal is not decided again"
        if isinstance(closed, Rejection):
            raise ServiceError(closed)
        if isinstance(closed, Replay):
            return closed
        return decided.closed(closed.run)

    def _published(self, closed: Closed | Replay | Rejection | Replan) -> None:
        if isinstance(closed, Closed):
            self._publish([closed.event])

    async def _decide(
        self, workspace_id: str, run: RunRecord, outcome: RunOutcome, plan: ClosePlan, notes: str
    ) -> _Decided:
        """Applies the plan's lifecycle change, then ends a fence the close leaves
        with nothing else to end it. Raises the lifecycle's refusal or silence."""
        seen = await self._completion_of(run)
        current = await self._lifecycle.get_task(workspace_id, run.task_id)
        decision = completion = None
        settled_here = False
        if plan.step is CloseStep.ATTEMPT_COMPLETION:
            decision, completion = await self._complete(workspace_id, run, seen, current, notes)
            seen, settled_here = completion or seen, completion is not None
        elif plan.step is CloseStep.SET_STATUS and not _fenced(current.task, run):  # a fence refuses any status
            assert plan.status is not None, "a SET_STATUS plan names its status"
            await self._lifecycle.set_work_status(
                workspace_id,
                run.task_id,
                run.generation,
                plan.status.value,
                f"{run.run_id}:final-status",
                f"agent run closed as {outcome.name}",
                run.run_id,
            )
        elif plan.step is CloseStep.CANCEL:
            await self._cancel(workspace_id, run, current.task)
        task = (await self._lifecycle.get_task(workspace_id, run.task_id)).task
        fence, holder_run_id = FenceEnd.NONE, ""
        if _fenced(task, run):
            if seen is not None and seen.settlement is SettlementStatus.PENDING and not settled_here:
                # It may have come before the fence: its answer decides first.
                seen = await self._completions.settle(seen)
            other = await self._other_holder(run)
            fence = fence_end(True, seen.settlement if seen is not None else None, other is not None)
            holder_run_id = other.run_id if other is not None else ""
            if fence is FenceEnd.SETTLE_CANCELLATION:
                await self._lifecycle.settle_cancellation(
                    workspace_id,
                    run.task_id,
                    run.generation,
                    run.run_id,
                    request_id=f"{run.run_id}:fence-settle",
                    reason="the last run of a fenced generation closed",
                )
            if fence is not FenceEnd.NONE:
                completion = seen
                task = (await self._lifecycle.get_task(workspace_id, run.task_id)).task
        effect, reason = close_effect(plan, decision, completion, fence, holder_run_id)
        return _Decided(decision, completion, FinalStatus(task.work_status), effect, reason, seen)

    async def _complete(
        self,
        workspace_id: str,
        run: RunRecord,
        stored: CompletionRecord | None,
        current: lifecycle_messages.GetTaskResponse,
        notes: str,
    ) -> tuple[Decision | None, CompletionRecord | None]:
        """DONE the only way there is: a settled completion. One committed already is
        settled, not attempted again; otherwise the completion transaction runs with
        the run's lease and the notes as result (and settles what it commits)."""
        if stored is not None and stored.settlement is SettlementStatus.SETTLED:
            return None, stored
        if stored is not None and stored.settlement is SettlementStatus.PENDING:
            completion = await self._completions.settle(stored)
            decision = completion.decision if completion is not None else None
        else:
            attempted = await self._completions.attempt(
                AttemptCommand(
                    workspace_id=workspace_id,
                    task_id=run.task_id,
                    run_id=run.run_id,
                    claimed_epoch=run.epoch,
                    outcome=RequestedOutcome.COMPLETED,
                    result=notes,
                    state_version=None,
                ),
                view=record_of(current).view(),
            )
            # Without a request id there is nothing to remember: never a replay.
            assert isinstance(attempted, AttemptOutcome)
            decision, completion = attempted.decision, attempted.completion
        # A refusal by the fence leaves the generation to its cancellation (_decide).
        if (
            completion is not None
            and completion.settlement is SettlementStatus.REJECTED
            and not (fence_refused(completion))
        ):
            assert decision is not None, "a refused completion comes with its decision"
            raise _settlement_refused(binding_decision(decision, completion), completion, run)
        return decision, completion

    async def _completion_of(self, run: RunRecord) -> CompletionRecord | None:
        return await self._store.read(lambda tx: tx.completions.load(run.workspace_id, run.task_id, run.generation))

    async def _other_holder(self, run: RunRecord) -> RunRecord | None:
        """Another open run holding a live lease on the run's task, if any."""
        now = self._clock.now_micros()
        holding = await self._store.read(lambda tx: holding_run(tx, run.workspace_id, run.task_id, now))
        return holding if holding is not None and holding.run_id != run.run_id else None

    async def _cancel(self, workspace_id: str, run: RunRecord, task: lifecycle_types.Task) -> None:
        if task.cancellation != lifecycle_enums.CANCELLATION_STATE_REQUESTED:
            await self._lifecycle.request_cancellation(workspace_id, run.task_id, run.generation, run.run_id)
        await self._lifecycle.settle_cancellation(workspace_id, run.task_id, run.generation, run.run_id)
