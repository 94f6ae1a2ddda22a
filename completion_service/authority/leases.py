"""The shell of runs and leases: claims, which commit only after the lifecycle
service applied what they need, and renewals (closing a run: closing.py)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from completion_service.authority.lifecycle import rejected, unavailable
from completion_service.authority.projection import LifecycleProjection
from completion_service.clients.lifecycle_client import LifecycleClient, LifecycleRejected, LifecycleUnavailable
from completion_service.core.model import CompletionEvent, Lease
from completion_service.errors import Reason
from completion_service.storage.port import CompletionStore, CompletionTx
from completion_service.units import runs
from completion_service.units.request_ids import peek
from completion_service.units.runs import ClaimCommand, Claimed, RenewCommand
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.clock import Clock, IdSource
from funnel.runtime.errors import Rejection, ServiceError, reject
from funnel.runtime.faults import NO_FAULTS, Faults
from funnel.runtime.idempotency import Replay, RequestKey
from funnel.runtime.keyed_locks import KeyedLocks

log = logging.getLogger(__name__)


def claim_refused(exc: LifecycleRejected, task_id: str) -> ServiceError:
    """The lifecycle's refusal of what a claim needs, as this service's error."""
    if exc.reason == "CANCELLATION_FENCED":
        return ServiceError(reject(Reason.CANCELLATION_REQUESTED, exc.message))
    return rejected(exc, task_id)


class RunsAndLeases:
    def __init__(
        self,
        store: CompletionStore,
        lifecycle: LifecycleClient,
        projection: LifecycleProjection,
        clock: Clock,
        ids: IdSource,
        publish: Callable[[list[CompletionEvent]], None],
        faults: Faults = NO_FAULTS,
    ) -> None:
        self._store = store
        self._publish = publish
        self._lifecycle = lifecycle
        self._projection = projection
        self._clock = clock
        self._ids = ids
        self._faults = faults
        # Claims of one task, or with one request id, take turns in this process:
        # between its checks and its commit a claim asks the lifecycle service,
        # and a rival committing in between would refuse it after the lifecycle
        # applied what it asked (see claim).
        self._claiming = KeyedLocks()

    # -- claims ------------------------------------------------------------------------

    async def claim(
        self,
        workspace_id: str,
        task_id: str,
        agent_id: str,
        ttl_micros: int,
        request: RequestKey | None,
        render: Callable[[Claimed], bytes],
        run_of: Callable[[bytes], str],
    ) -> Claimed | Replay:
        """Claims the task. Every check comes before any write: the lifecycle view
        and the lease here, then the lifecycle service's own, as it applies what the
        claim needs (activating a registered generation, marking it IN_PROGRESS);
        the claim commits last, so a refused claim leaves nothing behind. A
        replayed request returns the original response (`run_of` reads its run id).

        Rival claims (of the task, or with the request id) in this process wait
        for each other. Replicas of one database cannot: there a rival committed
        on another replica between this claim's checks and its commit still
        refuses it after the lifecycle applied the activation or IN_PROGRESS that
        the rival needed too (docs/specification.md §4.1, §10)."""
        keys: list[tuple[str, ...]] = [("task", workspace_id, task_id)]
        if request is not None:
            keys.append(("request", request.workspace_id, request.caller, request.method, request.request_id))
        async with self._claiming.hold(*keys):
            remembered = await self._store.read(functools.partial(peek, key=request))
            if isinstance(remembered, Rejection):
                raise ServiceError(remembered)
            if isinstance(remembered, Replay):
                await self._confirm_replayed_claim(workspace_id, run_of(remembered.response))
                return remembered
            current = await self._projection.read(workspace_id, task_id)
            task = current.task
            if task.state == lifecycle_enums.GENERATION_STATE_TERMINAL:
                raise ServiceError(
                    reject(
                        Reason.GENERATION_TERMINAL,
                        f"generation {task.generation} of task {task_id!r} is terminal",
                        generation=task.generation,
                        outcome=lifecycle_enums.TerminalOutcome.Name(task.outcome),
                    )
                )
            if task.cancellation == lifecycle_enums.CANCELLATION_STATE_REQUESTED:
                raise ServiceError(
                    reject(Reason.CANCELLATION_REQUESTED, f"task {task_id!r} has a cancellation request")
                )
            command = ClaimCommand(
                workspace_id, task_id, agent_id, task.generation, ttl_micros, self._ids.new_id("run"), request, render
            )
            # The request id again: a claim with it may have committed meanwhile.
            refused = await self._store.read(
                functools.partial(runs.claim_refusal, command=command, now=self._clock.now_micros())
            )
            if isinstance(refused, Rejection):
                raise ServiceError(refused)
            if isinstance(refused, Replay):
                await self._confirm_replayed_claim(workspace_id, run_of(refused.response))
                return refused
            try:
                await self._start_work(workspace_id, task_id, command.run_id, task)
            except LifecycleRejected as exc:
                raise claim_refused(exc, task_id) from None
            except LifecycleUnavailable as exc:
                raise unavailable(exc) from None
            # Only a rival on another replica can refuse the claim now (see claim).
            result = await self.commit_claim(command)
            if isinstance(result, Rejection):
                raise ServiceError(result)
            if isinstance(result, Replay):
                await self._confirm_replayed_claim(workspace_id, run_of(result.response))
            return result

    async def commit_claim(self, command: ClaimCommand) -> Claimed | Replay | Rejection:
        """The claim's transaction (runs.claim), without the lifecycle's part."""
        now = self._clock.now_micros()

        def unit(tx: CompletionTx) -> Claimed | Replay | Rejection:
            claimed = runs.claim(tx, command, now)
            # The fault point of a repair sits inside its transaction, before the commit.
            if isinstance(claimed, Claimed) and claimed.repaired:
                self._faults.hit("completion.transcript_repair")
            return claimed

        return await self._store.write(unit, after_commit=self._published)

    def _published(self, claimed: Claimed | Replay | Rejection) -> None:
        if isinstance(claimed, Claimed):
            self._publish(list(claimed.events))

    async def _confirm_replayed_claim(self, workspace_id: str, run_id: str) -> None:
        """A retried claim returns its original response, and completes what the
        lifecycle service was to apply for it if that is missing (a claim committed
        by an earlier release, which asked the lifecycle after its commit). A retry
        never undoes a granted claim: once the run closed or its generation moved on
        (terminal, replaced) there is nothing to confirm, and a lifecycle refusal
        leaves the claim as it is (its attempts stay gated by the lifecycle view)."""
        run = await self._store.read(lambda tx: tx.runs.load(workspace_id, run_id))
        if run is None or not run.open:
            return
        task = (await self._projection.read(workspace_id, run.task_id)).task
        if task.generation != run.generation or task.state == lifecycle_enums.GENERATION_STATE_TERMINAL:
            return
        try:
            await self._start_work(workspace_id, run.task_id, run.run_id, task)
        except LifecycleRejected as exc:
            log.info("retried claim of run %s: the lifecycle refused its confirmation (%s)", run.run_id, exc.reason)
        except LifecycleUnavailable as exc:
            raise unavailable(exc) from None

    async def _start_work(self, workspace_id: str, task_id: str, run_id: str, task: lifecycle_types.Task) -> None:
        """Activates a registered generation and marks the task IN_PROGRESS, with
        request ids derived from the run so that retries apply it once. Raises the
        lifecycle's refusal or silence as it is."""
        if task.state == lifecycle_enums.GENERATION_STATE_REGISTERED:
            try:
                await self._lifecycle.activate(workspace_id, task_id, task.generation, run_id)
                return
            except LifecycleRejected as exc:
                if exc.reason != "INVALID_TRANSITION":  # else another claim activated it meanwhile
                    raise
                task = (await self._lifecycle.get_task(workspace_id, task_id)).task
        if task.work_status != lifecycle_enums.WORK_STATUS_IN_PROGRESS:
            await self._lifecycle.set_work_status(
                workspace_id,
                task_id,
                task.generation,
                lifecycle_enums.WORK_STATUS_IN_PROGRESS,
                f"{run_id}:in-progress",
                "claimed by an agent run",
                run_id,
            )

    # -- renewals ------------------------------------------------------------------------

    async def renew(self, command: RenewCommand) -> Lease | Replay:
        result = await self._store.write(functools.partial(runs.renew, command=command, now=self._clock.now_micros()))
        if isinstance(result, Rejection):
            raise ServiceError(result)
        return result
