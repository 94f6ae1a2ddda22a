"""The imperative shell of the completion authority, split along its seams:

  projection.LifecycleProjection  lifecycle records kept current by the event stream
  leases.RunsAndLeases            claims (the lifecycle's part first), renewals
  closing.RunCloser               closing runs, and the cancellation fences they end
  attempts.CompletionTransaction  the completion transaction and evidence
  settler.Settler                 settling committed completions; the outbox settler
  sweeper.StallSweeper            closing stalled runs
  transcripts.Transcripts         appends, loads with repair, imports
  transcripts.Reopener            reopening a completed generation for a batch (a resume)

Decisions come from the pure core and the units of work (completion_service.units.runs,
.completions, .settlements, .transcripts), each run by the store in one
transaction; the shells call other services outside transactions and publish what
committed. `CompletionAuthority` wires them and lists the background workers,
which the server runs under one owner (funnel.runtime.background)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from completion_service.authority.attempts import CompletionTransaction
from completion_service.authority.closing import RunClosed, RunCloser
from completion_service.authority.leases import RunsAndLeases
from completion_service.authority.metrics import Metrics
from completion_service.authority.projection import LifecycleProjection
from completion_service.authority.settler import Settler
from completion_service.authority.sweeper import StallSweeper
from completion_service.authority.transcripts import Reopener, Transcripts
from completion_service.clients.external_gates import ExternalGates
from completion_service.clients.lifecycle_client import LifecycleClient
from completion_service.core.model import CompletionEvent
from completion_service.policy import PolicyBook
from completion_service.storage.port import CompletionStore
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.runtime import idempotency
from funnel.runtime.clock import Clock, IdSource, RandomIds
from funnel.runtime.faults import NO_FAULTS, Faults

__all__ = ["CompletionAuthority", "Metrics", "RunClosed"]

Worker = Callable[[], Coroutine[Any, Any, None]]


class CompletionAuthority:
    def __init__(
        self,
        store: CompletionStore,
        lifecycle: LifecycleClient,
        policies: PolicyBook,
        clock: Clock,
        external: ExternalGates,
        ids: IdSource | None = None,
        publish: Callable[[list[CompletionEvent]], None] = lambda events: None,
        settle_interval: float = 0.5,
        settle_lease: float = 30.0,
        stall_after: float | None = None,
        faults: Faults = NO_FAULTS,
        metrics: Metrics | None = None,
        projected_workspaces: int = 0,
    ) -> None:
        ids = ids or RandomIds()
        self.store = store
        self.lifecycle = lifecycle
        self.clock = clock
        self.metrics = metrics if metrics is not None else Metrics()
        self.settler = Settler(
            store,
            lifecycle,
            clock,
            self.metrics,
            publish,
            owner=ids.new_id("settler"),
            lease_seconds=settle_lease,
            interval=settle_interval,
            faults=faults,
        )
        # Off (0 workspaces) unless the server asks: its streams run among the workers.
        self.projection = LifecycleProjection(lifecycle, self.metrics, workspaces=projected_workspaces)
        self.completions = CompletionTransaction(
            store,
            lifecycle,
            self.projection,
            policies,
            clock,
            ids,
            external,
            self.settler,
            self.metrics,
            publish,
            faults,
        )
        self.runs = RunsAndLeases(store, lifecycle, self.projection, clock, ids, publish, faults)
        self.closer = RunCloser(store, lifecycle, clock, self.completions, publish)
        self.sweeper = StallSweeper(store, clock, stall_after, self.metrics, publish)
        self.transcripts = Transcripts(store, clock, faults, metrics=self.metrics)
        self.reopener = Reopener(store, self.transcripts, lifecycle)

    async def lifecycle_task(self, workspace_id: str, task_id: str) -> lifecycle_messages.GetTaskResponse:
        """The lifecycle record of a task, with lifecycle errors mapped to this service's."""
        return await self.projection.read(workspace_id, task_id)

    def workers(self, request_id_retention_seconds: float) -> list[tuple[str, Worker]]:
        """The background loops this authority needs, to run under one owner."""
        loops: list[tuple[str, Worker]] = [("settlement-outbox", self.settler.run_forever)]
        if self.projection.enabled:
            loops.append(("lifecycle-projection", self.projection.run_forever))
        if self.sweeper.enabled:
            loops.append(("stall-sweeper", self.sweeper.run_forever))

        async def forget(created_before: int, limit: int) -> int:
            return await self.store.write(lambda tx: tx.requests.forget(created_before, limit))

        loops.append(("request-id-sweeper", idempotency.sweeper(forget, self.clock, request_id_retention_seconds)))
        return loops
