"""When the client calls again by itself, and how long it waits first.

Only answers that say nothing was applied, or that ask the caller to wait, are
retried: `UNAVAILABLE` (the service was not reached or did not commit; the
same request, and so the same `request_id`, is sent again, which the service
answers from its memory if the first one did commit after all) and
`RESOURCE_EXHAUSTED` with a `google.rpc.RetryInfo` (`RATE_LIMITED`), after the
delay it names. Everything else is the caller's to decide (docs/specification.md:
`ABORTED` re-read, `FAILED_PRECONDITION` do not retry)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from funnel.client.errors import FunnelError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` is the number of calls in all (1: never retry). Between two
    calls after `UNAVAILABLE` the client waits `initial_backoff`, doubling up
    to `max_backoff`, each wait drawn from its upper half (callers that failed
    together do not come back together). A `RetryInfo` delay is waited as
    given, unless it is above `max_retry_delay`: then the error is raised at
    once, since the caller would rather know than sleep that long."""

    attempts: int = 5
    initial_backoff: float = 0.2
    max_backoff: float = 2.0
    max_retry_delay: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be at least 1")

    def delay(self, error: FunnelError, retry: int) -> float | None:
        """Seconds to wait before retry number `retry` (1 for the first) after
        `error`, or None when `error` is final."""
        if retry >= self.attempts:
            return None
        if error.code == grpc.StatusCode.UNAVAILABLE:
            backoff = min(self.initial_backoff * 2 ** (retry - 1), self.max_backoff)
            return random.uniform(backoff / 2, backoff)
        if error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.retry_after is not None:
            return error.retry_after if error.retry_after <= self.max_retry_delay else None
        return None


NO_RETRY = RetryPolicy(attempts=1)


async def with_retries(call: Callable[[], Awaitable[T]], policy: RetryPolicy) -> T:
    """Awaits `call()` until it answers or fails finally. `call` must send the
    same request every time (the request id included): that is what makes a
    retry safe. Raises FunnelError for the last failure."""
    retry = 0
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as failed:
            error = FunnelError.from_rpc_error(failed)
            retry += 1
            wait = policy.delay(error, retry)
            if wait is None:
                raise error from failed
        await asyncio.sleep(wait)
