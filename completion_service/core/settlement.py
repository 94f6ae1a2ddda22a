"""How a lifecycle answer to a settlement is read (brief §4 step 6, issue 3 §8)."""

from __future__ import annotations

import enum

LIFECYCLE_DOMAIN = "funnel.lifecycle.v1"

# Codes that mean "the lifecycle looked at the fact and said no": never retried.
_FINAL_CODES = frozenset({"FAILED_PRECONDITION", "NOT_FOUND", "INVALID_ARGUMENT", "ALREADY_EXISTS", "OUT_OF_RANGE"})


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
    return min(cap, base * (2 ** min(attempts, 16)))
