"""The imperative shell around the lifecycle units of work: applies intents through
the store, publishes what committed, and delivers the propagations parents owe their
attached children (a background loop under the service's structured owner)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable

from funnel.auth.principal import Caller
from funnel.runtime.clock import Clock
from funnel.runtime.faults import NO_FAULTS, Faults
from funnel.runtime.idempotency import RequestKey
from funnel.runtime.logs import fields
from funnel.runtime.storage_errors import StorageUnavailable
from lifecycle_service.core import intents as i
from lifecycle_service.core.model import Cause, IntentKind, LifecycleEvent, Policy, Situation, TaskRecord
from lifecycle_service.core.rules import Decision, decide
from lifecycle_service.metrics import LifecycleMetrics
from lifecycle_service.storage.port import LifecycleStore, LifecycleTx, PendingPropagation
from lifecycle_service.units import ApplyResult, Command, Committed, Dropped, apply_intent

log = logging.getLogger(__name__)

PROPAGATION_SOURCE = "lifecycle_service"
# Propagations are submitted by this service itself.
SELF = Caller(PROPAGATION_SOURCE, "service")
_PROPAGATED_INTENTS = {
    IntentKind.REQUEST_CANCELLATION: i.RequestCancellation,
    IntentKind.SETTLE_CANCELLATION: i.SettleCancellation,
    IntentKind.PROPAGATE_PARENT_TERMINATION: i.PropagateParentTermination,
}
PROPAGATION_BATCH = 100
# How long a claimed propagation stays with its deliverer before another may take it.
PROPAGATION_LEASE_MICROS = 60_000_000


class LifecycleAuthority:
    def __init__(
        self,
        store: LifecycleStore,
        policy: Policy,
        clock: Clock,
        *,
        publish: Callable[[LifecycleEvent], None] = lambda event: None,
        retry_delay: float = 0.5,
        faults: Faults = NO_FAULTS,
        owner: str | None = None,
        replay_interval: float | None = None,
        metrics: LifecycleMetrics | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics if metrics is not None else LifecycleMetrics()
        self.faults = faults
        self.policy = policy
        self._clock = clock
        self._publish = publish
        self._retry_delay = retry_delay
        # Who claims pending propagations (storage.port.Propagations.claim).
        self._owner = owner or f"lifecycle@{socket.gethostname()}/{os.getpid()}/{id(self):x}"
        # None: only this process's commits owe propagations (one process per database).
        self._replay_interval = replay_interval
        # Set at start, so that propagations a crash left behind are delivered first.
        self._pending = asyncio.Event()
        self._pending.set()

    async def apply(
        self,
        intent: i.Intent,
        method: str,
        render: Callable[[TaskRecord, LifecycleEvent], bytes],
        fingerprint: bytes | None = None,
        *,
        requester: str | None = None,
    ) -> ApplyResult:
        """Applies a caller's intent; `render` serializes the response a repeat of its
        request id gets (with the request's `fingerprint`, set exactly when the intent
        has a request id). The request id is scoped to `requester`, the authenticated
        subject (by default the intent's caller; they differ on a relayed resume)."""
        request = None
        if intent.request_id:
            assert fingerprint is not None, "a request id comes with the request's fingerprint"
            scope = requester or intent.caller.subject
            request = RequestKey(intent.workspace_id, scope, method, intent.request_id, fingerprint)
        return await self._apply(Command(intent, self._decider(intent), render, request))

    async def _apply(self, command: Command) -> ApplyResult:
        now = self._clock.now_micros()

        def unit(tx: LifecycleTx) -> ApplyResult:
            result = apply_intent(tx, command, now)
            if isinstance(result, Committed):
                self.faults.hit("lifecycle.before_commit")
            return result

        return await self.store.write(unit, after_commit=self._committed)

    def _committed(self, result: ApplyResult) -> None:
        if isinstance(result, Committed):
            self.metrics.transition(result.event)
            self._publish(result.event)
            if result.propagations:
                self._pending.set()

    def _decider(self, intent: i.Intent) -> Callable[[Situation], Decision]:
        return lambda situation: decide(intent, situation, self.policy)

    async def deliver_pending(self) -> int:
        """Applies every pending propagation once; returns how many were handled."""
        handled = 0
        while True:
            batch = await self.store.write(self._claimer(self._clock.now_micros()))
            if not batch:
                return handled
            for pending in batch:
                self.faults.hit("lifecycle.between_parent_and_propagation")
                await self._deliver(pending)
                handled += 1

    def _claimer(self, now: int) -> Callable[[LifecycleTx], list[PendingPropagation]]:
        return lambda tx: tx.propagations.claim(now, self._owner, PROPAGATION_LEASE_MICROS, PROPAGATION_BATCH)

    async def deliver_forever(self) -> None:
        """Delivers pending propagations whenever a commit owes some, and every
        `replay_interval` seconds if set (a background loop)."""
        while True:
            if self._replay_interval is None:
                await self._pending.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._pending.wait(), self._replay_interval)
            self._pending.clear()
            try:
                await self.deliver_pending()
            except StorageUnavailable as exc:
                log.warning("propagation delivery postponed: %s", exc)
                await asyncio.sleep(self._retry_delay)
                self._pending.set()
            except Exception:  # the worker must survive any single failure
                # Without this, one unexpected error would end the worker silently and
                # leave every later propagation undelivered until the next restart.
                log.exception("propagation delivery failed; retrying")
                await asyncio.sleep(self._retry_delay)
                self._pending.set()

    async def _deliver(self, pending: PendingPropagation) -> None:
        intent = _PROPAGATED_INTENTS[pending.intent](
            workspace_id=pending.workspace_id,
            task_id=pending.child.task_id,
            generation=pending.child.generation,
            cause=Cause(
                PROPAGATION_SOURCE,
                f"{pending.intent.name} propagated from parent {pending.parent_task_id!r} "
                f"generation {pending.parent_generation}",
                (("parent_event_sequence", str(pending.parent_sequence)), ("parent_task_id", pending.parent_task_id)),
            ),
            caller=SELF,
        )
        result = await self._apply(Command(intent, self._decider(intent), propagation_id=pending.id))
        applied = not isinstance(result, Dropped)
        self.metrics.propagated(applied)
        log.info(
            "propagation %s to %s %s",
            pending.intent.name,
            pending.child.task_id,
            "applied" if applied else "dropped",
            extra=fields(
                event="propagation",
                result="applied" if applied else "dropped",
                reason=result.rejection.reason.name if isinstance(result, Dropped) else None,
                intent=pending.intent.name,
                workspace=pending.workspace_id,
                task=pending.child.task_id,
                parent_task=pending.parent_task_id,
            ),
        )

    async def sweep_request_ids(self, created_before: int, limit: int) -> int:
        """Forgets up to `limit` request ids remembered before `created_before` (for the sweeper)."""
        return await self.store.write(lambda tx: tx.requests.forget(created_before, limit))
