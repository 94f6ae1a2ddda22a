"""When the client calls again by itself, and how long it waits first.

Only answers that say nothing was applied, or that ask the caller to wait, are
retried: `UNAVAILABLE` (the service was not reached or did not commit; the
same request, and so the same `request_id`, is sent again, which the service
answers from its memory if the first one did commit after all) and
`RESOURCE_EXHAUSTED` with a `google.rpc.RetryInfo` (`RATE_LIMITED`), after the
delay it names. Everything else is the caller's to decide (docs/specification.md:
`ABORTED` re-read, `FAILED_PRECONDITION` do not retry), unless its policy names
the code too (`funnel mcp` also resends after `DEADLINE_EXCEEDED`). A client
stream is sent again whenever grpc-aio lost the server's answer to it
(`stream_until_answered`), and a watch is resumed from its cursor after every
end that says its stream was cut rather than refused (`watch_cut`)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from funnel.client.errors import FunnelError
from funnel.runtime.grpc_errors import error_info

T = TypeVar("T")

# What gRPC's Python client reports in place of the server's status when the
# server ends a client stream while the client still writes (grpc/grpc#36066).
_LOST_BY_THE_CLIENT = "Internal error from Core"
# A lost answer comes from a race with the server's early reply, which a loaded
# machine loses several times in a row; ten in a row say something else is wrong.
_STREAM_ATTEMPTS = 10


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` is the number of calls in all (1: never retry; None: as many
    as `window` allows). `window`, when set, is the seconds after the first call
    within which a retry may still start: a bound in time for a caller that
    answers someone who waits (`funnel mcp`'s model). Between two calls after a
    code of `retried` (`UNAVAILABLE`) the client waits `initial_backoff`,
    doubling up to `max_backoff`, each wait drawn from its upper half (callers
    that failed together do not come back together). A `RetryInfo` delay is
    waited as given, unless it is above `max_retry_delay`: then the error is
    raised at once, since the caller would rather know than sleep that long."""

    attempts: int | None = 5
    initial_backoff: float = 0.2
    max_backoff: float = 2.0
    max_retry_delay: float = 30.0
    # Resending after DEADLINE_EXCEEDED is safe only with a request id on every
    # mutating call, and a deadline may be the caller's own choice: not by default.
    retried: frozenset[grpc.StatusCode] = frozenset({grpc.StatusCode.UNAVAILABLE})
    window: float | None = None

    def __post_init__(self) -> None:
        if self.attempts is not None and self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be at least 1")
        if self.attempts is None and self.window is None:
            raise ValueError("RetryPolicy needs attempts or a window to end its retries")

    def delay(self, error: FunnelError, retry: int, elapsed: float = 0.0) -> float | None:
        """Seconds to wait before retry number `retry` (1 for the first) after
        `error`, `elapsed` seconds after the first call, or None when `error` is final."""
        if error.code in self.retried:
            return self.backoff(retry, elapsed)
        if error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.retry_after is not None:
            if error.retry_after > self.max_retry_delay:
                return None
            return self._within(error.retry_after, retry, elapsed)
        return None

    def backoff(self, retry: int, elapsed: float = 0.0) -> float | None:
        """The wait before retry number `retry` after a failure retried whatever
        its code (a watch's WATCH_OVERFLOW), or None once the attempts or the
        window are spent."""
        # The exponent is capped: with only a window, `retry` has no bound of its own.
        backoff = min(self.initial_backoff * 2 ** min(retry - 1, 32), self.max_backoff)
        return self._within(random.uniform(backoff / 2, backoff), retry, elapsed)

    def _within(self, wait: float, retry: int, elapsed: float) -> float | None:
        if self.attempts is not None and retry >= self.attempts:
            return None
        if self.window is not None and elapsed + wait > self.window:
            return None
        return wait


NO_RETRY = RetryPolicy(attempts=1)


def watch_cut(error: FunnelError) -> bool:
    """Whether a watch stream was cut, not refused: resumed from its cursor
    (it changes nothing, so it loses and repeats nothing) within the policy's
    attempts and window whatever codes the policy retries. Cut: WATCH_OVERFLOW
    (the reader fell behind), and CANCELLED, which a watch never gets for its
    own cancel (grpc-aio raises CancelledError then) but gets when the far side
    cancels the call: a server that stops cancels the calls it has accepted and
    not yet handed to the service (seen under load when a watch resumes just as
    the lifecycle service restarts). UNAVAILABLE is the policy's own."""
    return error.reason == "WATCH_OVERFLOW" or error.code == grpc.StatusCode.CANCELLED


async def with_retries(call: Callable[[], Awaitable[T]], policy: RetryPolicy) -> T:
    """Awaits `call()` until it answers or fails finally. `call` must send the
    same request every time (the request id included): that is what makes a
    retry safe. Raises FunnelError for the last failure."""
    clock = asyncio.get_running_loop().time
    started = clock()
    retry = 0
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as failed:
            error = FunnelError.from_rpc_error(failed)
            retry += 1
            wait = policy.delay(error, retry, clock() - started)
            if wait is None:
                raise error from failed
        await asyncio.sleep(wait)


def answer_lost_by_the_client(error: grpc.aio.AioRpcError) -> bool:
    """Whether a client-streaming call failed only because grpc-aio lost the
    server's answer: a status that came while the client still wrote."""
    return (
        error.code() == grpc.StatusCode.INTERNAL
        and error.details() == _LOST_BY_THE_CLIENT
        and error_info(error) is None
    )


async def stream_until_answered(call: Callable[[], Awaitable[T]]) -> T:
    """Makes a client-streaming call again, from the start of its stream, while
    the client library loses the server's answer. That answer can only have been
    a refusal of an early message (a call that is accepted reads its stream to
    the end), and a refusal changed nothing, so sending again is safe and shows
    the refusal's own code and reason instead of INTERNAL."""
    for _ in range(_STREAM_ATTEMPTS - 1):
        try:
            return await call()
        except grpc.aio.AioRpcError as error:
            if not answer_lost_by_the_client(error):
                raise
    return await call()
