"""What a stopping server does to client streams still sending (transcript imports).

gRPC gives in-flight calls the shutdown grace, then cancels them; a cancelled
client stream ends with a bare `CANCELLED` the client cannot tell from its own.
An import is all or nothing, so it may use the grace to finish sending and
commit whole; if it is still sending shortly before the grace ends, it is ended
here with the service's `SERVER_SHUTTING_DOWN` instead, and nothing is applied.
Only the receiving part is bounded: a commit that has begun runs to its end, as
any in-flight unary call does.

Watch streams do not wait for the grace at all (funnel.runtime.watch,
`EventBroker.close`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

# Time left for the ending status to reach the client before gRPC cancels the call.
_MARGIN_MAX = 0.5
_MARGIN_SHARE = 0.2


class Drain:
    def __init__(self) -> None:
        self.deadline: float | None = None
        self._timeouts: set[asyncio.Timeout] = set()

    def begin(self, grace: float | None) -> None:
        """The server stops now, cancelling what is left after `grace` seconds (None: at once)."""
        grace = max(grace or 0.0, 0.0)
        self.deadline = asyncio.get_running_loop().time() + grace - min(_MARGIN_MAX, grace * _MARGIN_SHARE)
        for timeout in self._timeouts:
            timeout.reschedule(self.deadline)

    @asynccontextmanager
    async def bounded(self, ended: Callable[[], Exception]) -> AsyncIterator[None]:
        """Runs the block until the drain's deadline, once the server begins
        stopping; raises ended() if the deadline cut it short."""
        timeout = asyncio.timeout(self.deadline)
        try:
            async with timeout:
                self._timeouts.add(timeout)
                try:
                    yield
                finally:
                    self._timeouts.discard(timeout)
        except TimeoutError:
            if timeout.expired():
                raise ended() from None
            raise  # the block's own timeout, not the drain's
