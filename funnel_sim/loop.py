"""Virtual time for asyncio: an event loop whose clock moves only when nothing is
ready to run, straight to the next timer, so that leases expire, sweeps run and
deadlines pass in microseconds of real time, and the same program gives the same
schedule every time.

Why a loop and not a scheduler of our own: the shells are asyncio code through
and through (`asyncio.wait_for`, `Event`, `TaskGroup`, `gather`, `sleep` in the
settlement outbox, the propagation worker, the watch streams, the sweepers). A
custom loop runs that code as it is. asyncio's ready queue is FIFO and its timer
heap deterministic, so the schedule depends only on what the program does; the
seeded choices (network latency, reordering, faults, client think time) come from
the simulation's random streams, never from the loop.

The loop has no real I/O: its selector never blocks. When no callback is ready the
loop asks the selector to wait until the next timer; the selector moves the clock
there instead. Nothing ready and no timer means nothing can ever happen again: a
deadlock of the simulated program, raised as `Stalled`.

Real threads (the SQLite connections', threads.py) run their jobs in lockstep with
the loop: the loop waits while a job runs, and what the job posts back
(`call_soon_threadsafe`) is held and delivered after a virtual delay, in order
(`deliver_posted`), so that a thread's answers land at the same point of the
schedule every run, however long the job took in real time."""

from __future__ import annotations

import asyncio
import contextvars
import selectors
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, TypeVarTuple

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class Stalled(Exception):
    """Nothing is ready and no timer is set: the simulated program can never go on."""


class VirtualClock:
    """Seconds of virtual time since the simulation began."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self.now += seconds


class _VirtualSelector(selectors.BaseSelector):
    """A selector that owns file objects but never has I/O to report: waiting
    means moving the virtual clock (the loop's self-pipe is registered here)."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._keys: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, fileobj if isinstance(fileobj, int) else fileobj.fileno(), events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        self.unregister(fileobj)
        return self.register(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Stalled("no callback is ready and no timer is set")
        self._clock.advance(timeout)
        return []

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        try:
            return self._keys[fileobj]
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None

    def get_map(self) -> dict[Any, selectors.SelectorKey]:
        return dict(self._keys)

    def close(self) -> None:
        self._keys.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock or VirtualClock()
        super().__init__(_VirtualSelector(self.clock))
        # asyncio warns about callbacks slower than this in debug mode; virtual time
        # makes every callback take no time at all.
        self.slow_callback_duration = float("inf")

        self._thread = threading.get_ident()
        # What other threads posted during the job that runs now (see deliver_posted).
        self._posted: list[
            tuple[asyncio.Handle, Callable[..., object], tuple[Any, ...], contextvars.Context | None]
        ] = []
        self._last_delivery = 0.0

    def time(self) -> float:
        return self.clock.now

    def call_soon_threadsafe(
        self, callback: Callable[[*Ts], object], *args: *Ts, context: contextvars.Context | None = None
    ) -> asyncio.Handle:
        if threading.get_ident() == self._thread:
            return super().call_soon_threadsafe(callback, *args, context=context)
        # A thread's answer, while the loop waits for its job: held until the job is over.
        handle = asyncio.Handle(callback, args, self, context)
        self._posted.append((handle, callback, args, context))
        return handle

    def deliver_posted(self, after: float) -> None:
        """What the thread job that just ended posted arrives `after` virtual seconds
        from now, in the order posted, after everything posted by earlier jobs."""
        posted, self._posted = self._posted, []
        if not posted:
            return
        # Strictly later than the previous delivery: the timer heap does not keep the
        # order of timers due at the same time.
        self._last_delivery = max(self._last_delivery + 1e-9, self.time() + after)
        self.call_at(self._last_delivery, self._deliver, posted)

    def _deliver(
        self, posted: list[tuple[asyncio.Handle, Callable[..., object], tuple[Any, ...], contextvars.Context | None]]
    ) -> None:
        for handle, callback, args, context in posted:
            if not handle.cancelled():
                self.call_soon(callback, *args, context=context)


def run(main: Coroutine[Any, Any, T], clock: VirtualClock | None = None) -> T:
    """Runs `main` to completion on a fresh virtual-time loop, then closes it."""
    loop = VirtualTimeLoop(clock)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
