"""Rules for agent runs and leases (`complete_task`, docs/specification.md §4.1-§4.3)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from completion_service.core.model import CompletionRecord, Decision, FinalStatus, Lease, RunOutcome, SettlementStatus
from completion_service.core.settlement import fence_refused

NOTES_LIMIT = 2000


def tokens_total(tokens_input: int | None, tokens_output: int | None, reported_total: int | None) -> int:
    """The agent's reported total wins (models report cumulative totals natively);
    otherwise input + output. An inconsistent total is kept, not an error."""
    if reported_total is not None:
        return reported_total
    return (tokens_input or 0) + (tokens_output or 0)


def cap_notes(notes: str) -> tuple[str, bool]:
    if len(notes) <= NOTES_LIMIT:
        return notes, False
    return notes[:NOTES_LIMIT], True


class CloseStep(enum.Enum):
    # Reach DONE the only way there is: the completion transaction.
    ATTEMPT_COMPLETION = "attempt_completion"
    SET_STATUS = "set_status"
    CANCEL = "cancel"
    LEAVE = "leave"


@dataclass(frozen=True)
class ClosePlan:
    step: CloseStep
    status: FinalStatus | None = None


def close_plan(outcome: RunOutcome, final_status: FinalStatus | None) -> ClosePlan:
    """How a run's close changes the task: an explicit final status wins, else the
    outcome decides (succeeded -> done, failed -> blocked, cancelled -> cancelled)."""
    target = final_status
    if target is None:
        target = {
            RunOutcome.SUCCEEDED: FinalStatus.DONE,
            RunOutcome.FAILED: FinalStatus.BLOCKED,
            RunOutcome.CANCELLED: FinalStatus.CANCELLED,
        }.get(outcome)
    if target is None:
        return ClosePlan(CloseStep.LEAVE)
    if target is FinalStatus.DONE:
        return ClosePlan(CloseStep.ATTEMPT_COMPLETION, FinalStatus.DONE)
    if target is FinalStatus.CANCELLED:
        return ClosePlan(CloseStep.CANCEL, FinalStatus.CANCELLED)
    return ClosePlan(CloseStep.SET_STATUS, target)


class FenceEnd(enum.Enum):
    """How a run's close (or a completion's refusal) ends its generation's
    cancellation fence. Under the fence nothing but SettleCancellation, or a
    completion that proves it came first, ends the generation (specification.md §3.6;
    lifecycle_service/core/rules.py): once no completion can still settle
    and no run holds the task, the cancellation is settled, so that a fenced
    generation never waits with no run for a host to settle it."""

    # No fence on the run's generation (or it is no longer current or open).
    NONE = "none"
    # The pending completion proved it came first: its settlement ended the generation.
    COMPLETED_FIRST = "completed_first"
    # Nothing else can end the generation: settle its cancellation now.
    SETTLE_CANCELLATION = "settle_cancellation"
    # A committed completion is still pending: it may predate the fence, so its
    # settlement decides (its refusal is followed by the cancellation's settlement).
    AWAIT_SETTLEMENT = "await_settlement"
    # Another open run holds a live lease on the task: its close decides.
    AWAIT_HOLDER = "await_holder"


def fence_end(fenced: bool, completion: SettlementStatus | None, other_holder: bool) -> FenceEnd:
    """`fenced`: the generation was current, open and its cancellation requested
    when the close looked; `completion`: the settlement of its completion, if one
    was committed, once the close let a pending one settle; `other_holder`:
    another open run holds a live lease on the task."""
    if not fenced:
        return FenceEnd.NONE
    if completion is SettlementStatus.SETTLED:
        return FenceEnd.COMPLETED_FIRST
    if completion is SettlementStatus.PENDING:
        return FenceEnd.AWAIT_SETTLEMENT
    if other_holder:
        return FenceEnd.AWAIT_HOLDER
    return FenceEnd.SETTLE_CANCELLATION


class TaskEffect(enum.Enum):
    """What closing a run did to its task (values equal the contract's)."""

    DONE = 1
    SETTLING = 2
    BLOCKED = 3
    STATUS_SET = 4
    CANCELLED = 5
    UNCHANGED = 6


def close_effect(
    plan: ClosePlan,
    decision: Decision | None,
    completion: CompletionRecord | None,
    fence: FenceEnd = FenceEnd.NONE,
    holder_run_id: str = "",
) -> tuple[TaskEffect, str]:
    """Whether a close ended the task or left it open, and why (one line). A
    settlement refused for another reason than the fence never gets here: it
    fails the close."""
    if fence is FenceEnd.COMPLETED_FIRST:
        assert completion is not None, "a completion came first"
        return TaskEffect.DONE, (
            f"completion {completion.completion_id} was committed before the task's cancellation request: its "
            "settlement ended the generation COMPLETED"
        )
    if fence is FenceEnd.SETTLE_CANCELLATION:
        refused = (
            f" and the lifecycle service refused completion {completion.completion_id} for it"
            if completion is not None and fence_refused(completion)
            else ""
        )
        return TaskEffect.CANCELLED, (
            f"the task's cancellation was requested{refused}; nothing else can end the generation, so closing its "
            "last run settled the cancellation: the generation ended CANCELLED"
        )
    if fence is FenceEnd.AWAIT_SETTLEMENT:
        assert completion is not None, "a pending settlement has its completion"
        return TaskEffect.SETTLING, (
            f"completion {completion.completion_id} is committed and not settled yet, and the task's cancellation "
            "was requested: the lifecycle service decides which came first; if it refuses the completion, the "
            "completion service settles the cancellation"
        )
    if fence is FenceEnd.AWAIT_HOLDER:
        effect = TaskEffect.BLOCKED if plan.step is CloseStep.ATTEMPT_COMPLETION else TaskEffect.UNCHANGED
        return effect, (
            f"the task's cancellation was requested and run {holder_run_id} still holds its lease: that run's "
            "close settles the cancellation"
        )
    if plan.step is CloseStep.ATTEMPT_COMPLETION:
        if completion is not None and completion.settlement is SettlementStatus.SETTLED:
            return TaskEffect.DONE, f"completion {completion.completion_id} is settled: the task is DONE"
        if completion is not None:
            return TaskEffect.SETTLING, (
                f"completion {completion.completion_id} is committed; the lifecycle service has not settled it yet"
            )
        return TaskEffect.BLOCKED, decision.instruction if decision else "the completion was blocked"
    if plan.step is CloseStep.SET_STATUS:
        assert plan.status is not None, "a SET_STATUS plan names its status"
        return TaskEffect.STATUS_SET, f"work status set to {plan.status.name}; the task stays open"
    if plan.step is CloseStep.CANCEL:
        return TaskEffect.CANCELLED, "cancellation requested and settled: the generation ended CANCELLED"
    return TaskEffect.UNCHANGED, "a STALLED close leaves the task as it is"


@dataclass(frozen=True)
class LeaseHeld:
    holder: Lease


@dataclass(frozen=True)
class LeaseGranted:
    epoch: int
    expires_at: int


def judge_claim(current: Lease | None, holder_open: bool, now: int, ttl_micros: int) -> LeaseGranted | LeaseHeld:
    """A claim wins unless another open run holds a live lease. The epoch grows on
    every claim, fencing every earlier holder."""
    if current is not None and holder_open and current.expires_at > now:
        return LeaseHeld(current)
    return LeaseGranted(epoch=(current.epoch if current else 0) + 1, expires_at=now + ttl_micros)


class RenewalProblem(enum.Enum):
    RUN_CLOSED = "run_closed"
    NOT_CURRENT = "not_current"
    EXPIRED = "expired"


def judge_renewal(run_open: bool, run_id: str, epoch: int, current: Lease | None, now: int) -> RenewalProblem | None:
    if not run_open:
        return RenewalProblem.RUN_CLOSED
    if current is None or current.run_id != run_id or current.epoch != epoch:
        return RenewalProblem.NOT_CURRENT
    if current.expires_at <= now:
        return RenewalProblem.EXPIRED
    return None


def is_stalled(run_open: bool, lease_expires_at: int, now: int, stall_after_micros: int) -> bool:
    return run_open and lease_expires_at + stall_after_micros <= now
