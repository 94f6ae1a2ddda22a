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


def test_a_policy_may_retry_more_codes():
    policy = RetryPolicy(retried=frozenset({Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED}), initial_backoff=0.1)
    assert 0.05 <= policy.delay(error(Code.DEADLINE_EXCEEDED), 1) <= 0.1
    assert policy.delay(error(Code.ABORTED), 1) is None


def test_a_window_ends_the_retries_whose_wait_would_start_after_it():
    policy = RetryPolicy(attempts=None, initial_backoff=1.0, max_backoff=1.0, window=15.0)
    assert 0.5 <= policy.delay(error(Code.UNAVAILABLE), 100, elapsed=14.0) <= 1.0
    assert policy.delay(error(Code.UNAVAILABLE), 2, elapsed=14.6) is None  # every wait is at least 0.5 s
    # A RetryInfo delay counts against the window too.
    assert policy.delay(error(Code.RESOURCE_EXHAUSTED, "RATE_LIMITED", 2.0), 1, elapsed=14.0) is None


def test_a_policy_without_attempts_needs_a_window():
    with pytest.raises(ValueError):
        RetryPolicy(attempts=None)


def test_a_backoff_retries_whatever_the_code_within_the_attempts_and_the_window():
    policy = RetryPolicy(attempts=3, initial_backoff=0.2, max_backoff=0.4, window=10.0)
    assert 0.1 <= policy.backoff(1) <= 0.2
    assert 0.2 <= policy.backoff(2, elapsed=5.0) <= 0.4
    assert policy.backoff(3) is None
    assert policy.backoff(1, elapsed=9.9) is None
