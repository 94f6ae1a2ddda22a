"""How a lifecycle answer to a settlement is read (docs/specification.md §5.8), and what the
agent is told about a completion whose settlement is pending or was refused: a
completion is reported complete only once the lifecycle service settled it."""

from __future__ import annotations

import dataclasses
import enum

from completion_service.core.model import (
    AgentAction,
    BlockDetails,
    CompletionRecord,
    Decision,
    GateStatus,
    GateTrace,
    SettlementStatus,
    Verdict,
)

LIFECYCLE_DOMAIN = "funnel.lifecycle.v1"
SETTLEMENT_GATE = "lifecycle.settlement"

# Codes that mean "the lifecycle looked at the fact and said no": never retried.
_FINAL_CODES = frozenset({"FAILED_PRECONDITION", "NOT_FOUND", "INVALID_ARGUMENT", "ALREADY_EXISTS", "OUT_OF_RANGE"})

# Refusals that a later attempt of the same generation can overcome: the refused
# completion gives way to a new one (the other refusals end the generation's
# chance to complete: cancelled, replaced, already terminal).
TRANSIENT_REFUSALS = frozenset({"ACTIVE_ATTACHED_CHILD"})


class SettleAnswer(enum.Enum):
    SETTLED = "settled"
    # Final: recorded as a terminalization error; no terminal event, ever.
    REJECTED = "rejected"
    # Maybe applied (unavailable, deadline, unknown...): retry with the same request id.
    RETRY = "retry"


def classify_failure(code: str, error_domain: str | None) -> SettleAnswer:
    """A failed settle call is a rejection only when the lifecycle service itself
    said so (its ErrorInfo domain) with a non-retryable code; anything else may
    have been applied and must be retried with the same request id."""
    if error_domain == LIFECYCLE_DOMAIN and code in _FINAL_CODES:
        return SettleAnswer.REJECTED
    return SettleAnswer.RETRY


def retry_delay_seconds(attempts: int, base: float = 0.2, cap: float = 10.0) -> float:
    """Exponential backoff for the outbox settler."""
    return min(cap, base * (2.0 ** min(attempts, 16)))


def fence_refused(completion: CompletionRecord | None) -> bool:
    """Whether the lifecycle service refused this completion for the cancellation
    fence: final, and what leaves the generation to its cancellation."""
    return (
        completion is not None
        and completion.settlement is SettlementStatus.REJECTED
        and completion.error_reason == "CANCELLATION_FENCED"
    )


def supersedable(completion: CompletionRecord) -> bool:
    """Whether a new attempt may replace this completion of the generation."""
    return completion.settlement is SettlementStatus.REJECTED and completion.error_reason in TRANSIENT_REFUSALS


def binding_decision(decision: Decision, completion: CompletionRecord | None) -> Decision:
    """What the agent is told: the gates' decision while no completion is
    involved or it settled; otherwise what its pending or refused settlement means."""
    if completion is None or completion.settlement is SettlementStatus.SETTLED:
        return decision
    if completion.settlement is SettlementStatus.PENDING:
        return dataclasses.replace(
            decision,
            next_action=AgentAction.RETRY_LATER,
            forbidden_actions=(AgentAction.REPORT_COMPLETE, AgentAction.CONTINUE_WORK),
            instruction=(
                f"Completion committed ({completion.outcome.name}) but not settled by the lifecycle service yet; "
                "do not report it yet: repeat this attempt with the same request_id shortly to learn the outcome."
            ),
        )
    return refusal_decision(decision, completion.error_reason or "", completion.error_message or "")


def refusal_decision(decision: Decision, reason: str, message: str) -> Decision:
    """The block a lifecycle refusal of the settlement amounts to."""
    trace = tuple(dataclasses.replace(t, decisive=False) for t in decision.trace) + (
        GateTrace(
            SETTLEMENT_GATE,
            1,
            GateStatus.FAILED,
            f"the lifecycle service refused the settlement: {reason}: {message}",
            decisive=True,
        ),
    )
    details = BlockDetails(decisive_gate=SETTLEMENT_GATE, lifecycle_reason=reason)
    if reason in TRANSIENT_REFUSALS:
        return dataclasses.replace(
            decision,
            verdict=Verdict.SOFT_BLOCK,
            next_action=AgentAction.WAIT_FOR_CHILDREN,
            forbidden_actions=(AgentAction.REPORT_COMPLETE,),
            instruction=(
                f"Not complete: the lifecycle service refused the completion ({reason}): attached child tasks are "
                f"still open; wait for them to finish, then attempt completion again."
            ),
            trace=trace,
            details=details,
        )
    replaced = reason in ("STALE_GENERATION", "FUTURE_GENERATION")
    action = AgentAction.REFRESH_STATE if replaced else AgentAction.STOP_AND_REPORT
    why = {
        "CANCELLATION_FENCED": "the task's cancellation was requested before the completion could be settled",
        "STALE_GENERATION": "the task moved on to a newer generation; this run's work no longer applies",
        "GENERATION_TERMINAL": "the task's generation already ended otherwise",
        "PARENT_TERMINAL": "the attached parent task already ended",
    }.get(reason, message or "the completion cannot be settled")
    advice = "re-read the task and do not report completion" if replaced else "report this and do not retry"
    return dataclasses.replace(
        decision,
        verdict=Verdict.HARD_BLOCK,
        next_action=action,
        forbidden_actions=(AgentAction.REPORT_COMPLETE, AgentAction.ATTEMPT_COMPLETION, AgentAction.CONTINUE_WORK),
        instruction=f"Stop: the lifecycle service refused the completion ({reason}): {why}; {advice}.",
        trace=trace,
        details=details,
    )
