"""The imperative shell around the lifecycle core: applies intents through the
store, and delivers the propagations parents owe their attached children."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from google.protobuf.message import Message

from funnel.auth.principal import Caller
from funnel.runtime.errors import Rejection
from funnel.runtime.faults import NO_FAULTS, Faults
from funnel.runtime.storage_errors import StorageUnavailable
from lifecycle_service.core import intents as i
from lifecycle_service.core.model import Cause, IntentKind, LifecycleEvent, Policy, TaskRecord
from lifecycle_service.core.rules import decide
from lifecycle_service.storage.port import ApplyResult, Command, Committed, LifecycleStore, PendingPropagation

log = logging.getLogger(__name__)

PROPAGATION_SOURCE = "lifecycle_service"
# Propagations are submitted by this service itself.
SELF = Caller(PROPAGATION_SOURCE, "service")
_PROPAGATED_INTENTS = {
    IntentKind.REQUEST_CANCELLATION: i.RequestCancellation,
    IntentKind.SETTLE_CANCELLATION: i.SettleCancellation,
    IntentKind.PROPAGATE_PARENT_TERMINATION: i.PropagateParentTermination,
}


class LifecycleAuthority:
    def __init__(
        self, store: LifecycleStore, policy: Policy, retry_delay: float = 0.5, faults: Faults = NO_FAULTS
    ) -> None:
        self.store = store
        self.faults = faults
        self.policy = policy
        self._retry_delay = retry_delay
        # Set at start, so that propagations a crash left behind are delivered first.
        self._pending = asyncio.Event()
        self._pending.set()

    async def apply(
        self,
        intent: i.Intent,
        method: str,
        render: Callable[[TaskRecord, LifecycleEvent], Message],
        fingerprint: bytes | None = None,
    ) -> ApplyResult:
        result = await self.store.apply(
            Command(
                intent, lambda situation: decide(intent, situation, self.policy), render, fingerprint, method=method
            )
        )
        if isinstance(result, Committed) and result.propagations:
            self._pending.set()
        return result

    async def deliver_pending(self) -> int:
        """Applies every pending propagation once; returns how many were handled."""
        handled = 0
        while True:
            batch = await self.store.pending_propagations(limit=100)
            if not batch:
                return handled
            for pending in batch:
                self.faults.hit("lifecycle.between_parent_and_propagation")
                await self._deliver(pending)
                handled += 1

    async def deliver_forever(self) -> None:
        """Delivers pending propagations whenever a commit owes some (a background loop)."""
        while True:
            await self._pending.wait()
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
        result = await self.store.apply(
            Command(intent, lambda situation: decide(intent, situation, self.policy), propagation_id=pending.id)
        )
        if isinstance(result, Rejection):
            log.info(
                "propagation %s to %s dropped: %s", pending.intent.name, pending.child.task_id, result.reason.name
            )
        elif isinstance(result, Committed) and result.propagations:
            self._pending.set()
