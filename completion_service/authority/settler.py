"""The settlement shell (docs/specification.md §5.8): submits a committed completion to the
lifecycle service and records its answer through the settlement units; the
outbox settler retries what got no answer, with the same request id, until it
is settled exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

from completion_service.authority.metrics import Metrics
from completion_service.clients.lifecycle_client import LifecycleClient, LifecycleRejected, LifecycleUnavailable
from completion_service.core.model import CompletionEvent, CompletionRecord, RequestedOutcome, SettlementStatus
from completion_service.core.settlement import retry_delay_seconds
from completion_service.storage.port import CompletionStore
from completion_service.units import settlements
from completion_service.units.settlements import CancellationOwed, Recorded, Settlement
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.runtime import logs
from funnel.runtime.clock import Clock
from funnel.runtime.faults import NO_FAULTS, DroppedReply, Faults
from funnel.runtime.logs import fields
from funnel.runtime.storage_errors import StorageUnavailable
from funnel.runtime.tracing import continued

log = logging.getLogger(__name__)
_EVENT = "settlement"
# The line of each settled completion: one per attempt under load.
_settled = logs.PreparedLines(log, event=_EVENT)
BATCH = 100


class Settler:
    def __init__(
        self,
        store: CompletionStore,
        lifecycle: LifecycleClient,
        clock: Clock,
        metrics: Metrics,
        publish: Callable[[list[CompletionEvent]], None],
        *,
        owner: str,
        lease_seconds: float,
        interval: float = 0.5,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self._store = store
        self._lifecycle = lifecycle
        self._clock = clock
        self._metrics = metrics
        self._publish = publish
        self._owner = owner
        self._lease_micros = int(lease_seconds * 1_000_000)
        self._interval = interval
        self._faults = faults
        self._wakeup = asyncio.Event()

    async def settle(self, completion: CompletionRecord) -> CompletionRecord | None:
        """Submits the committed completion to the lifecycle service (step 6) and
        records its answer (step 7). Without an answer the row stays PENDING and the
        outbox settler retries with the same request id. Returns the row as it is
        stored afterwards."""
        response: lifecycle_messages.SettleCompletionResponse | lifecycle_messages.SettleFailureResponse
        try:
            if completion.outcome is RequestedOutcome.COMPLETED:
                response = await self._lifecycle.settle_completion(
                    completion.workspace_id,
                    completion.task_id,
                    completion.generation,
                    completion.completion_id,
                    completion.committed_at,
                    completion.run_id,
                )
            else:
                response = await self._lifecycle.settle_failure(
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
            return await self._postpone(completion, str(exc))
        self._faults.hit("completion.after_settle_before_publish")
        recorded = await self._record(completion, settlement)
        if isinstance(recorded, CancellationOwed):
            if not await self._end_fence(completion):
                return await self._postpone(
                    completion, "the settlement of the fenced generation's cancellation got no answer"
                )
            recorded = await self._record(completion, dataclasses.replace(settlement, fence_ended=True))
        assert not isinstance(recorded, CancellationOwed), "an ended fence is recorded"
        if not isinstance(recorded, Recorded):
            return recorded
        status = recorded.completion.settlement
        self._metrics.settled(status)
        if status is SettlementStatus.REJECTED:
            log.warning(
                "lifecycle rejected completion %s: %s",
                completion.completion_id,
                settlement.error_reason,
                extra=_settlement_fields(completion, status.name, reason=settlement.error_reason),
            )
        else:
            # One a completion, as many as attempts under load: a prepared line, as a request's.
            _settled.log(
                logging.INFO,
                f"settled completion {completion.completion_id}",
                **_settlement_values(completion, status.name),
            )
        return recorded.completion

    async def _record(
        self, completion: CompletionRecord, settlement: Settlement
    ) -> Recorded | CompletionRecord | CancellationOwed | None:
        return await self._store.write(
            functools.partial(
                settlements.record_settlement,
                completion=completion,
                settlement=settlement,
                now=self._clock.now_micros(),
            ),
            after_commit=self._published,
        )

    async def _postpone(self, completion: CompletionRecord, error: str) -> CompletionRecord | None:
        """No answer: the row stays pending and the outbox retries it, backing off."""
        self._metrics.settle_retried()
        delay = retry_delay_seconds(completion.settle_attempts)
        log.warning(
            "settlement of %s pending (%s); retrying in %.1fs",
            completion.completion_id,
            error,
            delay,
            extra=_settlement_fields(completion, "PENDING", error=error, retry_in_seconds=delay),
        )
        next_attempt_at = self._clock.now_micros() + int(delay * 1_000_000)
        stored = await self._store.write(
            functools.partial(
                settlements.postpone_settlement, completion=completion, next_attempt_at=next_attempt_at, error=error
            )
        )
        self._wakeup.set()
        return stored

    async def _end_fence(self, completion: CompletionRecord) -> bool:
        """Settles the cancellation of a generation whose completion the fence
        refused once no run holds the task (CancellationOwed); False without an
        answer (the settlement is retried, and this with it)."""
        try:
            await self._lifecycle.settle_cancellation(
                completion.workspace_id,
                completion.task_id,
                completion.generation,
                completion.run_id,
                request_id=f"{completion.completion_id}:fence-settle",
                reason="the cancellation fence refused the completion and no run holds the task",
                completion_id=completion.completion_id,
            )
        except LifecycleRejected as exc:
            # Ended otherwise meanwhile (a host settled it, the task moved on): nothing is owed.
            log.info(
                "the fenced generation of %s ended otherwise (%s)",
                completion.completion_id,
                exc.reason,
                extra=_settlement_fields(completion, "REJECTED", reason=exc.reason),
            )
        except LifecycleUnavailable:
            return False
        return True

    def _published(self, recorded: Recorded | CompletionRecord | CancellationOwed | None) -> None:
        if isinstance(recorded, Recorded):
            self._publish([recorded.event])

    async def settle_due(self) -> int:
        """One pass of the outbox settler; returns how many rows it tried."""
        now = self._clock.now_micros()
        due = await self._store.write(
            functools.partial(
                settlements.claim_due, now=now, owner=self._owner, lease_micros=self._lease_micros, limit=BATCH
            )
        )
        for completion in due:
            self._faults.hit("completion.outbox_retry")
            try:
                # A retry minutes later still belongs to the attempt that committed the row.
                with continued(completion.traceparent, "settle pending completion", _span_attributes(completion)):
                    await self.settle(completion)
            except (StorageUnavailable, DroppedReply):
                raise
            except Exception:  # one bad row must not hold back the rows behind it
                log.exception("settling %s failed; it stays pending", completion.completion_id)
        return len(due)

    async def run_forever(self) -> None:
        """The outbox settler (a background loop)."""
        while True:
            try:
                await self.settle_due()
            except StorageUnavailable as exc:
                log.warning("outbox settler postponed: %s", exc)
            except Exception:  # the settler must survive any single failure
                log.exception("outbox settler pass failed")
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=self._interval)


def _span_attributes(completion: CompletionRecord) -> dict[str, str | int]:
    return {
        "funnel.workspace_id": completion.workspace_id,
        "funnel.task_id": completion.task_id,
        "funnel.completion_id": completion.completion_id,
        "funnel.settle_attempts": completion.settle_attempts,
    }


def _settlement_fields(completion: CompletionRecord, result: str, **more: object) -> dict[str, Any]:
    """The structured fields of a settlement attempt's log line."""
    return fields(event=_EVENT, **_settlement_values(completion, result, **more))


def _settlement_values(completion: CompletionRecord, result: str, **more: object) -> dict[str, Any]:
    """Those fields but `event`."""
    return dict(
        result=result,
        workspace=completion.workspace_id,
        task=completion.task_id,
        run=completion.run_id,
        completion=completion.completion_id,
        attempt=completion.settle_attempts + 1,
        **more,
    )
