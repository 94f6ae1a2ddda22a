"""Settlements due together share one lifecycle call (completion_service/clients/settle_batches.py):
alone a settlement is sent at once by itself; those that come while a call is in
flight go together in the next one; every caller gets its own item's answer, and
no caller that goes away (cancelled while waiting, while sending, or just as its
turn came) leaves the others unanswered or the line stuck."""

from __future__ import annotations

import asyncio

import pytest

from completion_service.clients.lifecycle_client import LifecycleRejected, LifecycleUnavailable
from completion_service.clients.settle_batches import SettleBatches
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types

pytestmark = pytest.mark.asyncio
T = 5.0


def request(completion: str, workspace: str = "ws") -> lifecycle_messages.SettleCompletionRequest:
    return lifecycle_messages.SettleCompletionRequest(
        workspace_id=workspace, task_id=f"t-{completion}", completion_id=completion
    )


def settled(item: lifecycle_messages.SettleCompletionRequest) -> lifecycle_messages.SettleCompletionResponse:
    return lifecycle_messages.SettleCompletionResponse(event=lifecycle_types.LifecycleEvent(task_id=item.task_id))


class Lifecycle:
    """A send whose calls stay open until the test answers them."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self._open: list[asyncio.Future[None]] = []
        self.refused: set[str] = set()
        self.fail_next: Exception | None = None

    async def send(self, items):
        self.calls.append([item.completion_id for item in items])
        opened = asyncio.get_running_loop().create_future()
        self._open.append(opened)
        await opened
        if self.fail_next is not None:
            failure, self.fail_next = self.fail_next, None
            raise failure
        return [
            LifecycleRejected("CANCELLATION_FENCED", "fenced") if item.completion_id in self.refused else settled(item)
            for item in items
        ]

    async def wait_calls(self, n: int) -> None:
        async with asyncio.timeout(T):
            while len(self._open) < n:
                await asyncio.sleep(0)

    def answer(self, call: int) -> None:
        self._open[call].set_result(None)


def batches(lifecycle: Lifecycle, max_items: int = 64) -> SettleBatches:
    return SettleBatches(lifecycle.send, LifecycleUnavailable, max_items)


async def settle_all(line: SettleBatches, *names: str, workspace: str = "ws") -> list[asyncio.Task]:
    tasks = [asyncio.ensure_future(line.settle(request(name, workspace))) for name in names]
    await asyncio.sleep(0)
    return tasks


async def queued_behind_a_call(lifecycle: Lifecycle, line: SettleBatches, *names: str):
    """c1's call in flight and `names` queued behind it: (c1's task, theirs)."""
    [first] = await settle_all(line, "c1")
    await lifecycle.wait_calls(1)
    return first, await settle_all(line, *names)


async def test_a_settlement_alone_is_sent_at_once_by_itself():
    lifecycle = Lifecycle()
    line = batches(lifecycle)
    [alone] = await settle_all(line, "c1")
    await lifecycle.wait_calls(1)
    lifecycle.answer(0)
    assert (await alone).event.task_id == "t-c1"
    assert lifecycle.calls == [["c1"]]


async def test_those_that_come_while_a_call_is_in_flight_go_together_in_the_next():
    lifecycle = Lifecycle()
    line = batches(lifecycle)
    first, rest = await queued_behind_a_call(lifecycle, line, "c2", "c3", "c4")
    assert lifecycle.calls == [["c1"]]  # they wait for the call in flight
    lifecycle.answer(0)
    await lifecycle.wait_calls(2)
    assert lifecycle.calls == [["c1"], ["c2", "c3", "c4"]]
    lifecycle.answer(1)
    answers = await asyncio.gather(first, *rest)
    assert [a.event.task_id for a in answers] == ["t-c1", "t-c2", "t-c3", "t-c4"]


async def test_each_caller_gets_its_own_items_answer():
    lifecycle = Lifecycle()
    lifecycle.refused = {"c3"}
    line = batches(lifecycle)
    first, (c2, c3) = await queued_behind_a_call(lifecycle, line, "c2", "c3")
    lifecycle.answer(0)
    await lifecycle.wait_calls(2)
    lifecycle.answer(1)
    assert (await c2).event.task_id == "t-c2"
    with pytest.raises(LifecycleRejected, match="CANCELLATION_FENCED"):
        await c3
    await first


async def test_a_call_without_an_answer_fails_every_settlement_it_carried_and_the_next_call_goes_on():
    lifecycle = Lifecycle()
    line = batches(lifecycle)
    first, (c2, c3) = await queued_behind_a_call(lifecycle, line, "c2", "c3")
    lifecycle.answer(0)
    await first
    await lifecycle.wait_calls(2)
    c4 = (await settle_all(line, "c4"))[0]
    lifecycle.fail_next = LifecycleUnavailable("UNAVAILABLE: down")
    lifecycle.answer(1)
    for failed in (c2, c3):
        with pytest.raises(LifecycleUnavailable, match="down"):
            await failed
    await lifecycle.wait_calls(3)
    assert lifecycle.calls[2] == ["c4"]
    lifecycle.answer(2)
    await c4


async def test_a_caller_cancelled_while_waiting_is_not_sent():
    lifecycle = Lifecycle()
    line = batches(lifecycle)
    first, (c2, c3) = await queued_behind_a_call(lifecycle, line, "c2", "c3")
    c2.cancel()
    await asyncio.sleep(0)
    lifecycle.answer(0)
    await lifecycle.wait_calls(2)
    assert lifecycle.calls[1] == ["c3"]
    lifecycle.answer(1)
    await asyncio.gather(first, c3)


async def test_a_sender_cancelled_in_its_call_answers_its_batch_unavailable_and_the_next_in_line_sends():
    lifecycle = Lifecycle()
    line = batches(lifecycle)
    first, (c2, c3) = await queued_behind_a_call(lifecycle, line, "c2", "c3")
    lifecycle.answer(0)
    await first
    await lifecycle.wait_calls(2)  # c2 sends c2 and c3
    c4 = (await settle_all(line, "c4"))[0]
    c2.cancel()
    with pytest.raises(asyncio.CancelledError):
        await c2
    with pytest.raises(LifecycleUnavailable, match="cancelled"):
        await c3
    await lifecycle.wait_calls(3)
    assert lifecycle.calls[2] == ["c4"]
    lifecycle.answer(2)
    await c4


async def test_a_caller_cancelled_just_as_its_turn_came_hands_the_turn_on():
    lifecycle = Lifecycle()
    line = batches(lifecycle, max_items=1)  # one item a call: c2's turn comes, then c3's
    first, (c2, c3) = await queued_behind_a_call(lifecycle, line, "c2", "c3")
    lifecycle.answer(0)
    await asyncio.sleep(0)  # c1 runs once: its call answered, it gives the turn to c2 ...
    c2.cancel()  # ... which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await c2
    await first
    await lifecycle.wait_calls(2)
    assert lifecycle.calls[1] == ["c3"]
    lifecycle.answer(1)
    await c3


async def test_a_call_carries_at_most_max_items():
    lifecycle = Lifecycle()
    line = batches(lifecycle, max_items=2)
    first, rest = await queued_behind_a_call(lifecycle, line, "c2", "c3", "c4")
    for n in range(3):
        lifecycle.answer(n)
        if n < 2:
            await lifecycle.wait_calls(n + 2)
    await asyncio.gather(first, *rest)
    assert lifecycle.calls == [["c1"], ["c2", "c3"], ["c4"]]


async def test_workspaces_do_not_wait_for_each_other():
    lifecycle = Lifecycle()
    line = batches(lifecycle)
    [a] = await settle_all(line, "a1", workspace="a")
    [b] = await settle_all(line, "b1", workspace="b")
    await lifecycle.wait_calls(2)  # both in flight at once
    lifecycle.answer(1)
    await b
    lifecycle.answer(0)
    await a
    assert line._lines == {}  # nothing is left waiting
