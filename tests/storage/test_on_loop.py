"""funnel.runtime.on_loop: a synchronous function run on the event loop, its
awaitables awaited there while other tasks run."""

from __future__ import annotations

import asyncio
import threading

import pytest

from funnel.runtime import on_loop


async def test_a_function_gets_each_awaitables_result_and_returns_its_own():
    async def double(n: int) -> int:
        await asyncio.sleep(0)
        return 2 * n

    def unit(a: int, b: int) -> list[int]:
        return [on_loop.wait(double(a)), on_loop.wait(double(b))]

    assert await on_loop.run(unit, 1, 5) == [2, 10]


async def test_it_runs_on_the_loops_thread_and_lets_other_tasks_run_while_it_waits():
    """Two units on one loop: the first waits for what the second does, so neither
    could finish if a unit held the loop (or ran alone on a thread of its own)."""
    turn = asyncio.Event()
    threads: set[int] = set()

    def waiter() -> str:
        threads.add(threading.get_ident())
        on_loop.wait(turn.wait())
        return "woken"

    def waker() -> str:
        threads.add(threading.get_ident())
        turn.set()
        return "woke"

    results = await asyncio.wait_for(asyncio.gather(on_loop.run(waiter), on_loop.run(waker)), 5)
    assert results == ["woken", "woke"]
    assert threads == {threading.get_ident()}


async def test_an_awaitables_failure_is_raised_where_the_function_waited():
    async def fails() -> None:
        raise LookupError("from the awaitable")

    def unit() -> str:
        try:
            on_loop.wait(fails())
        except LookupError as exc:
            return f"caught {exc}"
        return "not raised"

    assert await on_loop.run(unit) == "caught from the awaitable"


async def test_the_functions_own_failure_is_raised_to_the_caller():
    def unit() -> None:
        on_loop.wait(asyncio.sleep(0))
        raise ValueError("from the unit")

    with pytest.raises(ValueError, match="from the unit"):
        await on_loop.run(unit)


async def test_a_cancellation_is_raised_inside_the_function_which_may_still_wait_to_undo():
    started, undone = asyncio.Event(), []

    def unit() -> None:
        started.set()
        try:
            on_loop.wait(asyncio.sleep(30))
        except asyncio.CancelledError:
            on_loop.wait(asyncio.sleep(0))  # a rollback's round trip
            undone.append(True)
            raise

    task = asyncio.create_task(on_loop.run(unit))
    await started.wait()
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert undone == [True]


async def test_waiting_outside_a_function_it_runs_is_refused():
    awaitable = asyncio.sleep(0)
    with pytest.raises(on_loop.NotOnLoop):
        on_loop.wait(awaitable)
    assert awaitable.cr_frame is None  # closed, never awaited: no warning left behind
