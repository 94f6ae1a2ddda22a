"""The imperative shell of the completion authority: runs and leases, the
completion transaction with its settlement, the outbox settler and the stall
sweeper. Decisions come from the pure core; this module loads, calls the core
through the store, commits, settles and publishes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf.message import Message

from completion_service.core import gates
from completion_service.core.gates import WorkspacePolicy, snapshot_basis
from completion_service.core.model import (
    CompletionRecord,
    Decision,
    FinalStatus,
    RequestedOutcome,
    RunOutcome,
    RunRecord,
    SettlementStatus,
)
from completion_service.core.runs import (
    CloseStep,
    TaskEffect,
    cap_notes,
    close_effect,
    close_plan,
    is_stalled,
    tokens_total,
)
from completion_service.core.settlement import binding_decision, retry_delay_seconds
from completion_service.errors import Reason
from completion_service.external_gates import ExternalGates
from completion_service.lifecycle_client import LifecycleClient, LifecycleRejected, LifecycleUnavailable, view_of
from completion_service.policy import PolicyBook
from completion_service.storage.port import (
    AttemptCommand,
    AttemptOutcome,
    ClaimCommand,
    Claimed,
    CloseCommand,
    CompletionCorrupted,
    CompletionStore,
    Remembered,
    Settlement,
)
from funnel.auth.principal import Caller
from funnel.lifecycle.v1 import lifecycle_pb2 as lpb
from funnel.runtime.clock import Clock
from funnel.runtime.errors import Rejection, ServiceError, instant, reject
from funnel.runtime.faults import NO_FAULTS, DroppedReply, Faults
from funnel.runtime.idempotency import RequestKey
from funnel.runtime.storage_errors import StorageUnavailable

log = logging.getLogger(__name__)
# This service's own background work (the stall sweeper), as recorded on audit rows.
SELF = Caller("completion_service", "service")


class Metrics:
    """Counters an operator alarms on."""

    def __init__(self) -> None:
        self.completion_corruptions = 0
        self.settlements = 0
        self.terminalization_errors = 0
        self.settle_retries = 0


def _lifecycle_unavailable(exc: LifecycleUnavailable) -> ServiceError:
    return ServiceError(
        reject(Reason.LIFECYCLE_UNAVAILABLE, f"the lifecycle service did not answer: {exc}; nothing was applied here")
    )


def _lifecycle_rejected(exc: LifecycleRejected, task_id: str) -> ServiceError:
    if exc.reason == "TASK_NOT_FOUND":
        return ServiceError(reject(Reason.TASK_NOT_FOUND, exc.message, task_id=task_id))
    return ServiceError(
        reject(Reason.LIFECYCLE_REJECTED, f"the lifecycle service refused: {exc.message}", lifecycle_reason=exc.reason)
    )


def _close_refused(exc: LifecycleRejected, run: RunRecord) -> ServiceError:
    return ServiceError(
        reject(
            Reason.LIFECYCLE_REJECTED,
            f"the lifecycle service refused what closing run {run.run_id} needs ({exc.reason}: {exc.message}); "
            "the run stays open: close it with another outcome (STALLED leaves the task as it is)",
            lifecycle_reason=exc.reason,
            run_id=run.run_id,
        )
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


@dataclass(frozen=True)
class RunClosed:
    run: RunRecord
    decision: Decision | None = None
    completion: CompletionRecord | None = None
    effect: TaskEffect | None = None
    effect_reason: str = ""


class CompletionAuthority:
    def __init__(
        self,
        store: CompletionStore,
        lifecycle: LifecycleClient,
        policies: PolicyBook,
        clock: Clock,
        external: ExternalGates,
        settle_interval: float = 0.5,
        stall_after: float | None = None,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self.faults = faults
        self.store = store
        self.lifecycle = lifecycle
        self.policies = policies
        self.clock = clock
        self.external = external
        self.metrics = Metrics()
        self._settle_interval = settle_interval
        self._stall_after = stall_after
        self._settle_wakeup = asyncio.Event()

    # -- lifecycle view ----------------------------------------------------

    async def lifecycle_task(self, workspace_id: str, task_id: str) -> lpb.GetTaskResponse:
        """The lifecycle record of a task, with lifecycle errors mapped to this service's."""
        try:
            return await self.lifecycle.get_task(workspace_id, task_id)
        except LifecycleRejected as exc:
            raise _lifecycle_rejected(exc, task_id) from None
        except LifecycleUnavailable as exc:
            raise _lifecycle_unavailable(exc) from None

    # -- runs and leases ---------------------------------------------------

    async def claim(
        self,
        workspace_id: str,
        task_id: str,
        agent_id: str,
        ttl_micros: int,
        request: RequestKey | None,
        render: Callable,
        parse: Callable[[bytes], Message],
    ) -> Message:
        remembered = await self.store.recall(request)
        if isinstance(remembered, Rejection):
            raise ServiceError(remembered)
        if isinstance(remembered, Remembered):
            response = parse(remembered.response)
            await self._confirm_replayed_claim(workspace_id, response)
            return response
        current = await self.lifecycle_task(workspace_id, task_id)
        task = current.task
        if task.state == lpb.GENERATION_STATE_TERMINAL:
            raise ServiceError(
                reject(
                    Reason.GENERATION_TERMINAL,
                    f"generation {task.generation} of task {task_id!r} is terminal",
                    generation=task.generation,
                    outcome=lpb.TerminalOutcome.Name(task.outcome),
                )
            )
        if task.cancellation == lpb.CANCELLATION_STATE_REQUESTED:
            raise ServiceError(reject(Reason.CANCELLATION_REQUESTED, f"task {task_id!r} has a cancellation request"))
        result = await self.store.claim(
            ClaimCommand(workspace_id, task_id, agent_id, task.generation, ttl_micros, request, render)
        )
        if isinstance(result, Rejection):
            raise ServiceError(result)
        if isinstance(result, Remembered):
            response = parse(result.response)
            await self._confirm_replayed_claim(workspace_id, response)
            return response
        assert isinstance(result, Claimed)
        await self._confirm_claim(workspace_id, task_id, result.run.run_id, request, current)
        return render(result.run, result.lease)

    async def _confirm_replayed_claim(self, workspace_id: str, response) -> None:
        """A retried claim returns its original response. If the original call died
        before the lifecycle confirmation, the retry completes it; but a retry never
        withdraws a granted claim: once the run closed or its generation moved on
        (terminal, replaced) there is nothing to confirm, and a lifecycle refusal
        leaves the claim as it is (its attempts stay gated by the lifecycle view)."""
        run = await self.store.get_run(workspace_id, response.run.run_id)
        if run is None or not run.open:
            return
        current = await self.lifecycle_task(workspace_id, run.task_id)
        if current.task.generation != run.generation or current.task.state == lpb.GENERATION_STATE_TERMINAL:
            return
        try:
            await self._confirm_claim(workspace_id, run.task_id, run.run_id, None, current, withdraw=False)
        except LifecycleRejected as exc:
            log.info("retried claim of run %s: the lifecycle refused its confirmation (%s)", run.run_id, exc.reason)
        except LifecycleUnavailable as exc:
            raise _lifecycle_unavailable(exc) from None

    async def _confirm_claim(
        self,
        workspace_id: str,
        task_id: str,
        run_id: str,
        request: RequestKey | None,
        current: lpb.GetTaskResponse | None = None,
        withdraw: bool = True,
    ) -> None:
        """Activates a registered generation and marks the task IN_PROGRESS, with
        request ids derived from the run so that retries apply it once. If the
        lifecycle refuses or cannot be reached, the claim is withdrawn (unless
        `withdraw` is false: then the lifecycle error is raised as it is)."""
        try:
            task = (current or await self.lifecycle.get_task(workspace_id, task_id)).task
            if task.state == lpb.GENERATION_STATE_REGISTERED:
                try:
                    await self.lifecycle.activate(workspace_id, task_id, task.generation, run_id)
                    return
                except LifecycleRejected as exc:
                    if exc.reason != "INVALID_TRANSITION":
                        raise
                    task = (await self.lifecycle.get_task(workspace_id, task_id)).task
            if task.work_status != lpb.WORK_STATUS_IN_PROGRESS:
                await self.lifecycle.set_work_status(
                    workspace_id,
                    task_id,
                    task.generation,
                    lpb.WORK_STATUS_IN_PROGRESS,
                    f"{run_id}:in-progress",
                    "claimed by an agent run",
                    run_id,
                )
        except LifecycleRejected as exc:
            if not withdraw:
                raise
            await self.store.withdraw_claim(workspace_id, run_id, request, exc.reason)
            if exc.reason == "CANCELLATION_FENCED":
                raise ServiceError(reject(Reason.CANCELLATION_REQUESTED, exc.message)) from None
            raise _lifecycle_rejected(exc, task_id) from None
        except LifecycleUnavailable as exc:
            if not withdraw:
                raise
            await self.store.withdraw_claim(workspace_id, run_id, request, "lifecycle service unavailable")
            raise _lifecycle_unavailable(exc) from None

    async def renew(self, workspace_id, run_id, epoch, ttl_micros, holder, request, render):
        result = await self.store.renew(workspace_id, run_id, epoch, ttl_micros, holder, request, render)
        if isinstance(result, Rejection):
            raise ServiceError(result)
        return result

    # -- the completion transaction ----------------------------------------

    async def attempt(self, command: AttemptCommand) -> AttemptOutcome | Remembered:
        # A repeated request_id is answered by the write transaction itself; checking
        # it up front would cost every attempt one more trip to the database thread.
        if command.lifecycle is None:  # CompleteRun passes the view it has just read
            current = await self.lifecycle_task(command.workspace_id, command.task_id)
            command = _with(command, lifecycle=view_of(current.task, list(current.open_attached_child_task_ids)))
        policy = self.policies.for_workspace(command.workspace_id)
        command = _with(command, policy=policy)
        if policy.external_gates:
            command = await self._consult_external_gates(command, policy)
        try:
            outcome = await self.store.attempt(command)
        except CompletionCorrupted as exc:
            self.metrics.completion_corruptions += 1
            log.error(
                "ALARM completion corrupted: %s (workspace %s task %s); failing closed",
                exc,
                command.workspace_id,
                command.task_id,
            )
            raise ServiceError(
                reject(Reason.COMPLETION_CORRUPTED, str(exc), completion_id=exc.completion_id)
            ) from None
        if isinstance(outcome, Rejection):
            raise ServiceError(outcome)
        if isinstance(outcome, Remembered):
            return outcome
        completion = outcome.completion
        if outcome.inserted:
            self.faults.hit("completion.after_commit_before_settle")
        if completion is not None and completion.settlement is SettlementStatus.PENDING:
            completion = await self.settle(completion)
            outcome = AttemptOutcome(outcome.decision, completion, outcome.existing, outcome.inserted)
        return outcome

    async def _consult_external_gates(self, command: AttemptCommand, policy: WorkspacePolicy) -> AttemptCommand:
        snapshot = await self.store.snapshot(command)
        if isinstance(snapshot, Rejection):
            raise ServiceError(snapshot)
        if not gates.evaluate_builtins(snapshot, policy).builtins_passed:
            return command
        evidence = await self.store.list_evidence(command.workspace_id, command.task_id, snapshot.run.generation)
        answers = await self.external.ask_all(policy.external_gates, snapshot, evidence)
        return _with(command, external_answers=answers, external_basis=snapshot_basis(snapshot))

    async def settle(self, completion: CompletionRecord) -> CompletionRecord | None:
        """Submits the committed completion to the lifecycle service (step 6) and
        records its answer (step 7). Without an answer the row stays PENDING and
        the outbox settler retries with the same request id. Returns the row as
        it is stored afterwards."""
        response: lpb.SettleCompletionResponse | lpb.SettleFailureResponse
        try:
            if completion.outcome is RequestedOutcome.COMPLETED:
                response = await self.lifecycle.settle_completion(
                    completion.workspace_id,
                    completion.task_id,
                    completion.generation,
                    completion.completion_id,
                    completion.committed_at,
                    completion.run_id,
                )
            else:
                response = await self.lifecycle.settle_failure(
                    completion.workspace_id,
                    completion.task_id,
                    completion.generation,
                    completion.completion_id,
                    completion.run_id,
                )
            settlement = Settlement(
                lifecycle_revision=response.event.revision, lifecycle_event_sequence=response.event.sequence
            )
        except LifecycleRejected as exc:
            settlement = Settlement(error_reason=exc.reason, error_message=exc.message)
        except LifecycleUnavailable as exc:
            self.metrics.settle_retries += 1
            delay = retry_delay_seconds(completion.settle_attempts)
            log.warning("settlement of %s pending (%s); retrying in %.1fs", completion.completion_id, exc, delay)
            await self.store.postpone_settlement(completion, self.clock.now_micros() + int(delay * 1_000_000))
            self._settle_wakeup.set()
            return await self.store.get_completion(completion.workspace_id, completion.task_id, completion.generation)
        self.faults.hit("completion.after_settle_before_publish")
        recorded = await self.store.record_settlement(completion, settlement)
        if recorded is not None:
            if settlement.rejected:
                self.metrics.terminalization_errors += 1
                log.warning(
                    "lifecycle rejected completion %s: %s", completion.completion_id, settlement.error_reason
                )
            else:
                self.metrics.settlements += 1
            return recorded
        return await self.store.get_completion(completion.workspace_id, completion.task_id, completion.generation)

    async def settle_due(self) -> int:
        """One pass of the outbox settler; returns how many rows it tried."""
        due = await self.store.due_settlements(self.clock.now_micros(), limit=100)
        for completion in due:
            self.faults.hit("completion.outbox_retry")
            try:
                await self.settle(completion)
            except (StorageUnavailable, DroppedReply):
                raise
            except Exception:  # one bad row must not hold back the rows behind it
                log.exception("settling %s failed; it stays pending", completion.completion_id)
        return len(due)

    # -- closing runs ------------------------------------------------------

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
        render: Callable[[RunClosed], Message],
    ) -> RunClosed | Remembered:
        """Closes a run (seed 001's `complete_task`). The lifecycle change comes
        first: if the lifecycle service refuses it, nothing is closed and the
        refusal is the answer (LIFECYCLE_REJECTED), so that an agent is never told
        its run closed while the task was left in another state than asked."""
        remembered = await self.store.recall(request)
        if isinstance(remembered, Rejection):
            raise ServiceError(remembered)
        if isinstance(remembered, Remembered):
            return remembered
        run = await self.store.get_run(workspace_id, run_id)
        if run is None:
            raise ServiceError(reject(Reason.RUN_NOT_FOUND, f"run {run_id!r} does not exist", run_id=run_id))
        if holder is not None and run.agent_id != holder:
            raise ServiceError(
                reject(Reason.RUN_NOT_HELD, f"run {run_id} belongs to another agent", run_id=run_id)
            )
        if run.finished_at is not None:
            raise ServiceError(
                reject(
                    Reason.RUN_ALREADY_FINISHED,
                    f"run {run_id} was already closed",
                    run_id=run_id,
                    finish_time=instant(run.finished_at),
                )
            )
        capped_notes, truncated = cap_notes(notes)
        plan = close_plan(outcome, final_status)
        decision = completion = None
        try:
            current = await self.lifecycle.get_task(workspace_id, run.task_id)
            if plan.step is CloseStep.ATTEMPT_COMPLETION:
                settled = await self.store.settled_completion(workspace_id, run.task_id, run.generation)
                if settled is None:
                    attempted = await self.attempt(
                        AttemptCommand(
                            workspace_id=workspace_id,
                            task_id=run.task_id,
                            run_id=run.run_id,
                            claimed_epoch=run.epoch,
                            outcome=RequestedOutcome.COMPLETED,
                            result=capped_notes,
                            state_version=None,
                            lifecycle=view_of(current.task, list(current.open_attached_child_task_ids)),
                        )
                    )
                    # Without a request id there is nothing to remember: never Remembered.
                    assert isinstance(attempted, AttemptOutcome)
                    decision, completion = attempted.decision, attempted.completion
                    if completion is not None and completion.settlement is SettlementStatus.REJECTED:
                        raise _settlement_refused(binding_decision(decision, completion), completion, run)
                else:
                    completion = settled
            elif plan.step is CloseStep.SET_STATUS:
                assert plan.status is not None, "a SET_STATUS plan names its status"
                await self.lifecycle.set_work_status(
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
            final = FinalStatus((await self.lifecycle.get_task(workspace_id, run.task_id)).task.work_status)
        except LifecycleUnavailable as exc:
            raise _lifecycle_unavailable(exc) from None
        except LifecycleRejected as exc:
            raise _close_refused(exc, run) from None
        tokens_input, tokens_output, reported_total = tokens

        effect, effect_reason = close_effect(plan, decision, completion)

        def render_closed(closed: RunRecord) -> Message:
            return render(RunClosed(closed, decision, completion, effect, effect_reason))

        closed = await self.store.close_run(
            CloseCommand(
                workspace_id=workspace_id,
                run_id=run_id,
                outcome=outcome,
                tokens_input=tokens_input,
                tokens_output=tokens_output,
                tokens_total=tokens_total(tokens_input, tokens_output, reported_total),
                notes=capped_notes,
                notes_truncated=truncated,
                error=error,
                final_status=final,
                closed_by="agent",
                caller=caller,
                request=request,
                render=render_closed,
            )
        )
        if isinstance(closed, Rejection):
            raise ServiceError(closed)
        if isinstance(closed, Remembered):
            return closed
        return RunClosed(closed, decision, completion, effect, effect_reason)

    async def _cancel(self, workspace_id: str, run: RunRecord, task: lpb.Task) -> None:
        if task.cancellation != lpb.CANCELLATION_STATE_REQUESTED:
            await self.lifecycle.request_cancellation(workspace_id, run.task_id, run.generation, run.run_id)
        await self.lifecycle.settle_cancellation(workspace_id, run.task_id, run.generation, run.run_id)

    async def sweep_stalled(self) -> int:
        """Closes runs whose lease expired longer than `stall_after` ago as STALLED."""
        if self._stall_after is None:
            return 0
        stall_micros = int(self._stall_after * 1_000_000)
        now = self.clock.now_micros()
        swept = 0
        for run in await self.store.stalled_runs(now, stall_micros, limit=100):
            if not is_stalled(run.open, run.lease_expires_at, now, stall_micros):
                continue
            result = await self.store.close_run(
                CloseCommand(
                    workspace_id=run.workspace_id,
                    run_id=run.run_id,
                    outcome=RunOutcome.STALLED,
                    tokens_input=None,
                    tokens_output=None,
                    tokens_total=0,
                    notes="",
                    notes_truncated=False,
                    error=f"lease expired at {run.lease_expires_at}; closed by the stall sweeper",
                    final_status=None,
                    closed_by="stall_sweeper",
                    caller=SELF,
                )
            )
            if not isinstance(result, Rejection):
                swept += 1
                log.info("closed stalled run %s of task %s", run.run_id, run.task_id)
        return swept

    # -- background work ---------------------------------------------------

    async def settle_forever(self) -> None:
        """The outbox settler (a background loop)."""
        while True:
            try:
                await self.settle_due()
            except StorageUnavailable as exc:
                log.warning("outbox settler postponed: %s", exc)
            except Exception:  # the settler must survive any single failure
                log.exception("outbox settler pass failed")
            self._settle_wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settle_wakeup.wait(), timeout=self._settle_interval)

    async def sweep_forever(self) -> None:
        """The stall sweeper (a background loop; only when `stall_after` is set)."""
        if self._stall_after is None:
            return
        interval = max(0.05, min(self._stall_after / 2, 30.0))
        while True:
            try:
                await self.sweep_stalled()
            except Exception:  # the sweeper must survive any single failure
                log.exception("stall sweep failed")
            await asyncio.sleep(interval)


def _with(command: AttemptCommand, **changes) -> AttemptCommand:
    return dataclasses.replace(command, **changes)
