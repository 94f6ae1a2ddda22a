"""funnel_ui.together: the dashboard's reads made together leave no call running
unowned (issue 28), when one fails or when their caller is cancelled."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from funnel.client import FunnelError
from funnel_ui.together import together

pytestmark = pytest.mark.asyncio


async def test_the_results_come_in_the_order_of_the_calls():
    async def after(seconds: float, value: str) -> str:
        await asyncio.sleep(seconds)
        return value

    assert await together(after(0.02, "a"), after(0, "b"), after(0.01, "c")) == ("a", "b", "c")
    assert await together() == ()


async def test_a_failed_call_is_raised_as_it_is_once_the_others_are_cancelled_and_awaited():
    ended: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            ended.append("slow")

    async def refused() -> None:
        await asyncio.sleep(0)
        raise FunnelError(grpc.StatusCode.UNAVAILABLE, "away")

    with pytest.raises(FunnelError, match="away"):
        await together(slow(), refused())
    assert ended == ["slow"]  # gather would have left it sleeping


async def test_cancelling_the_caller_cancels_and_awaits_every_call():
    started, ended = asyncio.Event(), []

    async def held(name: str) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            ended.append(name)

    caller = asyncio.create_task(together(held("a"), held("b")))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert sorted(ended) == ["a", "b"]
