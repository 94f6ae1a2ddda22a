"""A watch resumes from its cursor after every end that says its stream was cut
(funnel.client.retry.watch_cut), and only then: against a gRPC server that ends
each call as the test says, since a server cancelling a call it had accepted is
a race of a stopping process that a test cannot time (a loaded CI run met it:
the dashboard's watch of a task ended there, and its page went stale)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from funnel.client import FunnelClient, FunnelError, RetryPolicy
from funnel.client.retry import watch_cut
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types

Code = grpc.StatusCode
WS = "ws"
EVENTS = 3
QUICK = RetryPolicy(attempts=3, initial_backoff=0.01, max_backoff=0.01)


@pytest.mark.parametrize(
    ("code", "reason", "cut"),
    [
        (Code.CANCELLED, "", True),
        (Code.RESOURCE_EXHAUSTED, "WATCH_OVERFLOW", True),
        (Code.UNAVAILABLE, "SERVER_SHUTTING_DOWN", False),  # the policy's: retried unless it says otherwise
        (Code.RESOURCE_EXHAUSTED, "WATCHERS_EXHAUSTED", False),
        (Code.PERMISSION_DENIED, "WORKSPACE_NOT_GRANTED", False),
        (Code.INTERNAL, "", False),
    ],
)
def test_a_stream_is_cut_when_it_overflowed_or_the_far_side_cancelled_it(code, reason, cut):
    assert watch_cut(FunnelError(code, "m", reason=reason)) is cut


class Lifecycle(lifecycle_grpc.TaskLifecycleServiceServicer):
    """Ends the first calls with `endings`, then streams events 1..EVENTS after the cursor."""

    def __init__(self, *endings: Code) -> None:
        self.endings = list(endings)
        self.cursors: list[int] = []

    async def WatchLifecycleEvents(
        self, request: lifecycle_messages.WatchLifecycleEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[lifecycle_messages.WatchLifecycleEventsResponse]:
        self.cursors.append(request.after_sequence)
        for sequence in range(request.after_sequence + 1, EVENTS + 1):
            yield lifecycle_messages.WatchLifecycleEventsResponse(
                event=lifecycle_types.LifecycleEvent(sequence=sequence)
            )
            if self.endings:
                await context.abort(self.endings.pop(0), "CANCELLED")
        await asyncio.Event().wait()  # live: nothing more commits


async def watched(*endings: Code) -> tuple[list[int], list[tuple[Code, int]], Lifecycle]:
    """The sequences a watch delivers, the breaks it was told of, and the server."""
    server = grpc.aio.server()
    lifecycle = Lifecycle(*endings)
    lifecycle_grpc.add_TaskLifecycleServiceServicer_to_server(lifecycle, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    breaks: list[tuple[Code, int]] = []

    async def broke(error: FunnelError, after: int) -> None:
        breaks.append((error.code, after))

    try:
        async with FunnelClient(f"127.0.0.1:{port}", f"127.0.0.1:{port}", tls=None, token=None) as client:
            events = client.watch_lifecycle_events(WS, retry=QUICK, on_break=broke)
            try:
                seen = [(await asyncio.wait_for(anext(events), 10)).sequence for _ in range(EVENTS)]
            finally:
                await events.aclose()
    finally:
        await server.stop(None)
    return seen, breaks, lifecycle


async def test_a_watch_cancelled_by_its_server_resumes_after_its_last_event_without_a_gap_or_a_repeat():
    seen, breaks, lifecycle = await watched(Code.CANCELLED, Code.CANCELLED)
    assert seen == [1, 2, 3]
    assert breaks == [(Code.CANCELLED, 1), (Code.CANCELLED, 2)]
    assert lifecycle.cursors == [0, 1, 2]


async def test_a_watch_refused_is_raised_not_resumed():
    with pytest.raises(FunnelError) as refused:
        await watched(Code.PERMISSION_DENIED)
    assert refused.value.code == Code.PERMISSION_DENIED
