"""The completion transaction's shell: takes the lifecycle view (from the
projection, else read), consults the policy's external gates, commits the attempt
(completions.attempt, one transaction), then settles what it committed. Also
records evidence."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace

from completion_service.authority.metrics import Metrics
from completion_service.authority.projection import LifecycleProjection
from completion_service.authority.settler import Settler
from completion_service.clients.external_gates import ExternalGates
from completion_service.clients.lifecycle_client import LifecycleClient, record_of
from completion_service.core import gates
from completion_service.core.gates import ExternalAnswer, SnapshotBasis, WorkspacePolicy, snapshot_basis
from completion_service.core.model import (
    CompletionEvent,
    CompletionRecord,
    EvidenceRecord,
    LifecycleView,
    SettlementStatus,
    Snapshot,
)
from completion_service.errors import Reason
from completion_service.policy import PolicyBook
from completion_service.storage.port import CompletionReadTx, CompletionStore
from completion_service.units import completions
from completion_service.units.completions import (
    AttemptCommand,
    AttemptContext,
    AttemptOutcome,
    CompletionCorrupted,
    EvidenceCommand,
    EvidenceStored,
    StaleView,
)
from funnel.runtime.clock import Clock, IdSource
from funnel.runtime.errors import Rejection, ServiceError, reject
from funnel.runtime.faults import NO_FAULTS, Faults
from funnel.runtime.idempotency import Replay, RequestKey
from funnel.runtime.tracing import current_traceparent

log = logging.getLogger(__name__)


class CompletionTransaction:
    def __init__(
        self,
        store: CompletionStore,
        lifecycle: LifecycleClient,
        projection: LifecycleProjection,
        policies: PolicyBook,
        clock: Clock,
        ids: IdSource,
        external: ExternalGates,
        settler: Settler,
        metrics: Metrics,
        publish: Callable[[list[CompletionEvent]], None],
        faults: Faults = NO_FAULTS,
    ) -> None:
        self._store = store
        self._lifecycle = lifecycle
        self._projection = projection
        self._policies = policies
        self._clock = clock
        self._ids = ids
        self._external = external
        self._settler = settler
        self._metrics = metrics
        self._publish = publish
        self._faults = faults

    async def attempt(self, command: AttemptCommand, view: LifecycleView | None = None) -> AttemptOutcome | Replay:
        """The path of one attempt: the lifecycle view (CompleteRun passes the one
        it has just read), the whole context built once, one transaction, then the
        settlement of what it committed."""
        # A repeated request_id is answered by the write transaction itself; checking
        # it up front would cost every attempt one more trip to the database thread.
        source = "read"
        if view is None:
            view, source = await self._lifecycle_view(command)
        context = await self._context(command, view, projected=source != "read")
        try:
            outcome = await self.commit(command, context)
            if isinstance(outcome, StaleView):
                fresh = await self._read_view(command)
                outcome = await self.commit(command, replace(context, lifecycle=fresh, lifecycle_projected=False))
                assert not isinstance(outcome, StaleView), "a view read for the attempt is never stale"
                source = "stale"
            self._metrics.lifecycle_view(source)
        except CompletionCorrupted as exc:
            self._metrics.corrupted()
            log.error(
                "ALARM completion corrupted: %s (workspace %s task %s); failing closed",
                exc,
                command.workspace_id,
                command.task_id,
            )
            raise ServiceError(reject(Reason.COMPLETION_CORRUPTED, str(exc), completion_id=exc.completion_id)) from None
        if isinstance(outcome, Rejection):
            raise ServiceError(outcome)
        if isinstance(outcome, Replay):
            return outcome
        self._metrics.attempted(outcome.decision)
        completion = outcome.completion
        if outcome.inserted:
            self._faults.hit("completion.after_commit_before_settle")
        if completion is not None and completion.settlement is SettlementStatus.PENDING:
            completion = await self._settler.settle(completion)
            outcome = replace(outcome, completion=completion)
        return outcome

    async def _context(self, command: AttemptCommand, view: LifecycleView, *, projected: bool) -> AttemptContext:
        """Everything the transaction needs besides the database, gathered once."""
        policy = self._policies.for_workspace(command.workspace_id)
        answers, basis = (
            await self._consult_external_gates(command, view, policy) if policy.external_gates else (None, None)
        )
        return AttemptContext(
            lifecycle=view,
            lifecycle_projected=projected,
            policy=policy,
            completion_id=self._ids.new_id("cmp"),
            traceparent=current_traceparent(),
            external_answers=answers,
            external_basis=basis,
        )

    async def settle(self, completion: CompletionRecord) -> CompletionRecord | None:
        """Settles a committed completion now (step 6; the outbox's way, once)."""
        return await self._settler.settle(completion)

    async def _lifecycle_view(self, command: AttemptCommand) -> tuple[LifecycleView, str]:
        """The view to judge the attempt on, and where it came from: the projection,
        a read, or (the lifecycle service cannot be read) what the projection had
        seen when its stream ended, so that the attempt commits with its settlement
        pending rather than failing."""
        projected = self._projection.view(command.workspace_id, command.task_id)
        if projected is not None:
            return projected, "projection"
        try:
            return await self._read_view(command), "read"
        except ServiceError as exc:
            seen = self._projection.last_seen(command.workspace_id, command.task_id)
            if exc.rejection.reason is not Reason.LIFECYCLE_UNAVAILABLE or seen is None:
                raise
            return seen, "last_seen"

    async def _read_view(self, command: AttemptCommand) -> LifecycleView:
        current = await self._projection.read(command.workspace_id, command.task_id)
        return record_of(current).view()

    async def commit(
        self, command: AttemptCommand, context: AttemptContext
    ) -> AttemptOutcome | Replay | Rejection | StaleView:
        """Steps 1-5: one write transaction judged at the moment it runs."""
        return await self._store.write(
            functools.partial(
                completions.attempt,
                command=command,
                context=context,
                now=self._clock.now_micros(),
                inline_settle_micros=int(self._lifecycle.timeout * 1_000_000),
            ),
            after_commit=self._published,
        )

    def _published(self, outcome: AttemptOutcome | Replay | Rejection | StaleView) -> None:
        if isinstance(outcome, AttemptOutcome) and outcome.events:
            self._publish(list(outcome.events))

    async def _consult_external_gates(
        self, command: AttemptCommand, view: LifecycleView, policy: WorkspacePolicy
    ) -> tuple[Mapping[str, ExternalAnswer] | None, SnapshotBasis | None]:
        """The external gates' answers and the snapshot they judged, or (None, None)
        when a built-in gate blocks anyway (the gates are not asked then)."""
        now = self._clock.now_micros()

        def read(tx: CompletionReadTx) -> tuple[Snapshot | Rejection, list[EvidenceRecord]]:
            snapshot = completions.load_snapshot(tx, command, view, now)
            if isinstance(snapshot, Rejection):
                return snapshot, []
            return snapshot, tx.evidence.load(command.workspace_id, command.task_id, snapshot.run.generation)

        snapshot, evidence = await self._store.read(read)
        if isinstance(snapshot, Rejection):
            raise ServiceError(snapshot)
        if not gates.evaluate_builtins(snapshot, policy).builtins_passed:
            return None, None
        answers = await self._external.ask_all(policy.external_gates, snapshot, evidence)
        return answers, snapshot_basis(snapshot)

    async def record_evidence(
        self,
        record: EvidenceRecord,
        holder: str | None,
        request: RequestKey | None,
        render: Callable[[EvidenceRecord], bytes],
    ) -> EvidenceRecord | Replay:
        command = EvidenceCommand(replace(record, evidence_id=self._ids.new_id("evd")), holder, request, render)
        result = await self._store.write(
            functools.partial(completions.record_evidence, command=command, now=self._clock.now_micros()),
            after_commit=self._published_evidence,
        )
        if isinstance(result, Rejection):
            raise ServiceError(result)
        return result.record if isinstance(result, EvidenceStored) else result

    def _published_evidence(self, stored: EvidenceStored | Replay | Rejection) -> None:
        if isinstance(stored, EvidenceStored):
            self._publish([stored.event])
