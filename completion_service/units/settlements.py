"""Units of work of the settlement outbox (docs/specification.md §5.8): record the lifecycle
service's answer for a pending completion exactly once, postpone a settlement the
lifecycle did not answer, and claim the completions that are due. Plain functions
over storage/port.py; the lifecycle call itself happens outside, in the shell."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from completion_service.core.model import CompletionEvent, CompletionEventKind, CompletionRecord, SettlementStatus
from completion_service.core.settlement import refusal_decision
from completion_service.storage.port import CompletionTx
from completion_service.units.holding import holding_run


@dataclass(frozen=True)
class Settlement:
    """What the lifecycle service answered to a settle call."""

    lifecycle_revision: int | None = None
    lifecycle_event_sequence: int | None = None
    error_reason: str | None = None
    error_message: str | None = None
    # A refusal for the cancellation fence: the generation's cancellation has been
    # settled (or is no longer the settler's to settle), so it may be recorded.
    fence_ended: bool = False

    @property
    def rejected(self) -> bool:
        return self.error_reason is not None


@dataclass(frozen=True)
class CancellationOwed:
    """The fence refused the completion and no run holds the task any more: no
    close will end the generation, so its cancellation must be settled before the
    refusal is recorded (the row stays pending until then). Nothing was written."""


@dataclass(frozen=True)
class Recorded:
    """A settlement recorded now: the row as written and its terminal event."""

    completion: CompletionRecord
    event: CompletionEvent


def record_settlement(
    tx: CompletionTx, completion: CompletionRecord, settlement: Settlement, now: int
) -> Recorded | CompletionRecord | CancellationOwed | None:
    """Records the lifecycle's final answer while the completion is pending, with
    its one terminal event (COMPLETION_SETTLED or TERMINALIZATION_ERROR). Otherwise
    it changes nothing and returns the row as stored (None if there is none).

    A refusal for the cancellation fence while no run holds the task is
    CancellationOwed (see there); while one does, that run's close ends the fence
    (runs.close_run re-decides a close this refusal overtook)."""
    stored = _pending(tx, completion)
    if not isinstance(stored, _Pending):
        return stored
    if (
        settlement.error_reason == "CANCELLATION_FENCED"
        and not settlement.fence_ended
        and (holding_run(tx, completion.workspace_id, completion.task_id, now) is None)
    ):
        return CancellationOwed()
    status = SettlementStatus.REJECTED if settlement.rejected else SettlementStatus.SETTLED
    kind = CompletionEventKind.TERMINALIZATION_ERROR if settlement.rejected else CompletionEventKind.COMPLETION_SETTLED
    recorded = dataclasses.replace(
        stored.completion,
        settlement=status,
        settle_attempts=stored.completion.settle_attempts + 1,
        next_settle_at=None,
        last_settle_error=None,
        lifecycle_revision=settlement.lifecycle_revision,
        lifecycle_event_sequence=settlement.lifecycle_event_sequence,
        settled_at=now,
        error_reason=settlement.error_reason,
        error_message=settlement.error_message,
    )
    tx.completions.update(recorded)
    event = tx.events.append(
        CompletionEvent(
            recorded.workspace_id,
            recorded.task_id,
            recorded.generation,
            kind,
            recorded.run_id,
            now,
            completion_id=recorded.completion_id,
            outcome=recorded.outcome,
            lifecycle_revision=settlement.lifecycle_revision,
            lifecycle_event_sequence=settlement.lifecycle_event_sequence,
            error_reason=settlement.error_reason,
            error_message=settlement.error_message,
            decision=refusal_decision(recorded.decision, settlement.error_reason or "", settlement.error_message or "")
            if settlement.rejected
            else None,
        )
    )
    return Recorded(recorded, event)


def postpone_settlement(
    tx: CompletionTx, completion: CompletionRecord, next_attempt_at: int, error: str
) -> CompletionRecord | None:
    """Counts a settle attempt that got no answer, keeps why (`error`) and schedules
    the next one; returns the row as stored afterwards (a row no longer pending is
    left as it is)."""
    stored = _pending(tx, completion)
    if not isinstance(stored, _Pending):
        return stored
    postponed = dataclasses.replace(
        stored.completion,
        settle_attempts=stored.completion.settle_attempts + 1,
        next_settle_at=next_attempt_at,
        last_settle_error=error,
    )
    tx.completions.update(postponed)
    return postponed


def claim_due(tx: CompletionTx, now: int, owner: str, lease_micros: int, limit: int) -> list[CompletionRecord]:
    """The pending completions due at `now` that `owner` settles next."""
    return tx.completions.claim_due(now, owner, lease_micros, limit)


@dataclass(frozen=True)
class _Pending:
    completion: CompletionRecord


def _pending(tx: CompletionTx, completion: CompletionRecord) -> _Pending | CompletionRecord | None:
    """The stored row if it is this completion and still pending, else the row as stored."""
    stored = tx.completions.load(completion.workspace_id, completion.task_id, completion.generation)
    if (
        stored is None
        or stored.completion_id != completion.completion_id
        or stored.settlement is not SettlementStatus.PENDING
    ):
        return stored
    return _Pending(stored)
