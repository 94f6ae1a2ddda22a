"""Settlements due together go to the lifecycle service in one call.

Per workspace, one settle call is in flight at a time. A settlement that finds
none sends itself at once (`SettleCompletion`: alone, it waits for nothing); the
ones that come while a call is in flight queue, and when that call is answered
the first still waiting sends every one queued behind it in one
`SettleCompletions` call (up to its 64 items). Under load the calls carry many
settlements each, and the lifecycle service's writer commits them in one group;
at rest nothing changes.

There is no sender task: whoever is first in line sends, so nothing runs that no
caller waits for, and a caller that goes away (its deadline, a disconnect) hands
its turn on. A settlement whose call fails without an answer, or whose sender was
cancelled, is answered `LifecycleUnavailable`: it may have been applied, and the
outbox retries it with the same request id, which the lifecycle service replays.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages

# The lifecycle service's limit on the items of one SettleCompletions call.
MAX_ITEMS = 64

Settled = lifecycle_messages.SettleCompletionResponse
Send = Callable[[list[lifecycle_messages.SettleCompletionRequest]], Awaitable[list["Settled | Exception"]]]


class _YourTurn:
    """The answer that makes a waiting settlement the sender of the next call."""


_YOUR_TURN = _YourTurn()


@dataclass
class _Line:
    waiting: deque[_Waiter] = field(default_factory=deque)
    sending: bool = False


@dataclass
class _Waiter:
    request: lifecycle_messages.SettleCompletionRequest
    answer: asyncio.Future[Settled | Exception | _YourTurn]


class SettleBatches:
    """`send(items)` makes one call for the items (one item: SettleCompletion) and
    returns, per item, its response or the exception its settlement raises
    (LifecycleRejected for a refusal); it raises when the call got no answer."""

    def __init__(self, send: Send, unavailable: Callable[[str], Exception], max_items: int = MAX_ITEMS) -> None:
        self._send = send
        self._unavailable = unavailable
        self._max_items = max_items
        self._lines: dict[str, _Line] = {}

    async def settle(self, request: lifecycle_messages.SettleCompletionRequest) -> Settled:
        line = self._lines.setdefault(request.workspace_id, _Line())
        me = _Waiter(request, asyncio.get_running_loop().create_future())
        line.waiting.append(me)
        if not line.sending:
            line.sending = True
            answer: Settled | Exception | _YourTurn = _YOUR_TURN
        else:
            try:
                answer = await me.answer
            except asyncio.CancelledError:
                # Cancelled just as its turn came: the turn goes to the next in line.
                if me.answer.done() and not me.answer.cancelled() and me.answer.result() is _YOUR_TURN:
                    self._pass_turn(request.workspace_id, line)
                raise
        if isinstance(answer, _YourTurn):
            answer = await self._send_batch(request.workspace_id, line)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def _send_batch(self, workspace_id: str, line: _Line) -> Settled | Exception:
        """Sends the settlements at the head of the line, this caller's first (its
        turn made it the head), answers the others, and passes the turn on as soon
        as the call returns. Returns this caller's answer."""
        batch = [line.waiting.popleft()]
        while line.waiting and len(batch) < self._max_items:
            waiter = line.waiting.popleft()
            if not waiter.answer.done():  # one that went away waits for nothing
                batch.append(waiter)
        try:
            answers = await self._send([waiter.request for waiter in batch])
        except asyncio.CancelledError:
            self._answer_all(batch[1:], self._unavailable("the call carrying this settlement was cancelled"))
            raise
        except Exception as exc:  # noqa: BLE001 - no answer for any of them: each raises it, and is retried
            answers = [exc] * len(batch)
        finally:
            self._pass_turn(workspace_id, line)
        for waiter, answer in zip(batch[1:], answers[1:], strict=True):
            if not waiter.answer.done():
                waiter.answer.set_result(answer)
        return answers[0]

    def _pass_turn(self, workspace_id: str, line: _Line) -> None:
        while line.waiting:
            head = line.waiting[0]
            if not head.answer.done():
                head.answer.set_result(_YOUR_TURN)
                return
            line.waiting.popleft()
        line.sending = False
        if self._lines.get(workspace_id) is line:
            del self._lines[workspace_id]

    @staticmethod
    def _answer_all(waiters: list[_Waiter], answer: Exception) -> None:
        for waiter in waiters:
            if not waiter.answer.done():
                waiter.answer.set_result(answer)
