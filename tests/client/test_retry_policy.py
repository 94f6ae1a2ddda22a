"""Which failures funnel.client retries, and how long it waits (RetryPolicy.delay)."""

import grpc
import pytest

from funnel.client import FunnelError, RetryPolicy

Code = grpc.StatusCode


def error(code: grpc.StatusCode, reason: str = "", retry_after: float | None = None) -> FunnelError:
    return FunnelError(code, "m", reason=reason, retry_after=retry_after)


def test_unavailable_is_retried_with_a_growing_capped_backoff_until_the_attempts_run_out():
    policy = RetryPolicy(attempts=6, initial_backoff=0.2, max_backoff=1.0)
    waits = [policy.delay(error(Code.UNAVAILABLE), retry) for retry in range(1, 7)]
    for wait, upper in zip(waits, [0.2, 0.4, 0.8, 1.0, 1.0], strict=False):
        assert upper / 2 <= wait <= upper
    assert waits[5] is None


def test_retry_info_is_waited_as_given_unless_it_asks_for_more_than_the_policy_allows():
    policy = RetryPolicy(max_retry_delay=5.0)
    assert policy.delay(error(Code.RESOURCE_EXHAUSTED, "RATE_LIMITED", 1.5), 1) == 1.5
    assert policy.delay(error(Code.RESOURCE_EXHAUSTED, "RATE_LIMITED", 6.0), 1) is None
    # Exhausted without RetryInfo (a full watch buffer, a message too large) is final.
    assert policy.delay(error(Code.RESOURCE_EXHAUSTED, "MESSAGE_TOO_LARGE"), 1) is None


@pytest.mark.parametrize("code", [Code.ABORTED, Code.FAILED_PRECONDITION, Code.DEADLINE_EXCEEDED, Code.INTERNAL])
def test_every_other_failure_is_the_callers_to_decide(code):
    assert RetryPolicy().delay(error(code), 1) is None


def test_a_policy_makes_at_least_one_call():
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)
