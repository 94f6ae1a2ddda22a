"""An agent needs no second, host token to learn that its task is finished: its
own token watches and reads the lifecycle of its workspace's tasks
(`WatchLifecycleEvents`, `ListLifecycleEvents`; docs/security.md)."""

from __future__ import annotations

import asyncio

import pytest

from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from tests import credentials
from tests.mcp.support import CALL_TIMEOUT, WS, agent_token, fresh_task, ok, stdio_client

pytestmark = pytest.mark.asyncio(loop_scope="module")

BOUND = 60.0


async def test_an_agent_token_watches_its_task_until_completed(pair):
    t = await fresh_task(pair)
    token = agent_token()
    channel = credentials.tls_channel(pair.lifecycle.address, token, identity="client")
    lifecycle = lifecycle_grpc.TaskLifecycleServiceStub(channel)
    try:
        stream = lifecycle.WatchLifecycleEvents(
            lifecycle_messages.WatchLifecycleEventsRequest(workspace_id=WS, task_id=t)
        )

        async def until_terminal() -> lifecycle_types.LifecycleEvent:
            async for item in stream:
                if item.event.to_state == lifecycle_enums.GENERATION_STATE_TERMINAL:
                    return item.event
            raise AssertionError("the watch ended before the task did")

        watching = asyncio.create_task(until_terminal())
        async with stdio_client(pair, token) as client:
            run_id = ok(await client.call_tool("claim_task", {"taskId": t}))["runId"]
            first = ok(await client.call_tool("attempt_completion", {"runId": run_id, "result": "fixed"}))
            ok(
                await client.call_tool(
                    "record_evidence",
                    {
                        "runId": run_id,
                        "kind": "tests",
                        "verdict": "passed",
                        "checkpoint": first["missing"]["evidenceCheckpoint"],
                    },
                )
            )
            ok(await client.call_tool("attempt_completion", {"runId": run_id, "result": "fixed"}))
            ended = await asyncio.wait_for(watching, BOUND)
            ok(await client.call_tool("complete_task", {"runId": run_id, "outcome": "succeeded", "notes": "fixed"}))
        assert ended.outcome == lifecycle_enums.TERMINAL_OUTCOME_COMPLETED
        history = await lifecycle.ListLifecycleEvents(
            lifecycle_messages.ListLifecycleEventsRequest(workspace_id=WS, task_id=t), timeout=CALL_TIMEOUT
        )
        assert history.events[-1].outcome == lifecycle_enums.TERMINAL_OUTCOME_COMPLETED
    finally:
        stream.cancel()
        await channel.close()
