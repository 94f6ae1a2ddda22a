"""A synchronous unit of work run on the event loop, its I/O awaited there.

The storage port is synchronous: a unit of work is a plain function of its
transaction (docs/architecture.md, "The ports"). On PostgreSQL each of a unit's
statements is a round trip to the server. Run on a pool thread, the unit's thread
lets go of the GIL for each round trip and then waits to win it back from the event
loop, which serves the RPCs meanwhile: under load a transaction spent 27 ms of wall
time for 2 ms of its thread's CPU (docs/scaling.md). `run(fn)` instead runs `fn` in a
greenlet on the event loop's thread: when `fn` reaches I/O it calls `wait(aw)`, which
hands the awaitable to the coroutine that started it; that coroutine awaits it on the
loop (other tasks run meanwhile) and switches back into `fn` with its result, or
raises its exception where `fn` waited. No thread, no GIL hand-off, and the unit's
code stays synchronous.

The same bridge SQLAlchemy's asyncio extension uses; `greenlet` is its library."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import greenlet

T = TypeVar("T")


class NotOnLoop(RuntimeError):
    """`wait` was called outside a unit that `run` started."""


class _Unit(greenlet.greenlet):
    """A greenlet that `run` drives: `wait` knows it by its class."""


async def run(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on the event loop, each awaitable it passes to `wait` awaited
    here. Returns what it returns, raises what it raises. A cancellation of this
    coroutine is raised inside `fn` where it waits (so that it may roll back)."""
    unit = _Unit(fn)
    request = unit.switch(*args)
    while not unit.dead:
        try:
            answer = await cast(Awaitable[Any], request)
        except BaseException as exc:  # noqa: BLE001 - raised where the unit waits
            request = unit.throw(exc)
        else:
            request = unit.switch(answer)
    return cast(T, request)


def wait(awaitable: Awaitable[T]) -> T:
    """From inside a function `run` runs: the awaitable's result, awaited on the
    event loop while other tasks run."""
    current = greenlet.getcurrent()
    if not isinstance(current, _Unit) or current.parent is None:
        if hasattr(awaitable, "close"):
            awaitable.close()  # never to be awaited: no "never awaited" warning
        raise NotOnLoop("wait() is for functions that funnel.runtime.on_loop.run runs")
    return cast(T, current.parent.switch(awaitable))
