"""`funnel mcp --http`: the same tools over Streamable HTTP, driven by the SDK's
client, each caller sending its own bearer token."""

from __future__ import annotations

import pytest

from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from tests.mcp.support import (
    CALL_TIMEOUT,
    agent_token,
    error_text,
    fresh_task,
    http_client,
    http_server,
    ok,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_the_whole_story_over_streamable_http(pair, tmp_path):
    t = await fresh_task(pair)
    with http_server(pair, tmp_path / "mcp.log") as url:
        async with http_client(url, agent_token()) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert names == {"claim_task", "complete_task", "record_evidence", "attempt_completion", "get_task"}
            run_id = ok(await client.call_tool("claim_task", {"taskId": t}))["runId"]
            blocked = ok(await client.call_tool("attempt_completion", {"runId": run_id, "result": "done"}))
            assert blocked["nextAction"] == "record_evidence"
            ok(
                await client.call_tool(
                    "record_evidence",
                    {
                        "runId": run_id,
                        "kind": "tests",
                        "verdict": "passed",
                        "checkpoint": blocked["missing"]["evidenceCheckpoint"],
                    },
                )
            )
            allowed = ok(await client.call_tool("attempt_completion", {"runId": run_id, "result": "done"}))
            assert (allowed["nextAction"], allowed["settlement"]) == ("report_complete", "settled")
            closed = ok(
                await client.call_tool(
                    "complete_task", {"runId": run_id, "outcome": "succeeded", "tokensInput": 5, "tokensOutput": 6}
                )
            )
            assert (closed["finalStatus"], closed["tokensTotal"]) == ("done", 11)
            again = error_text(await client.call_tool("complete_task", {"runId": run_id, "outcome": "succeeded"}))
            assert "RUN_ALREADY_FINISHED" in again
            truth = ok(await client.call_tool("get_task", {"taskId": t}))
            assert (truth["state"], truth["terminalOutcome"]) == ("terminal", "succeeded")
    task = (
        await pair.lc.GetTask(lifecycle_messages.GetTaskRequest(workspace_id="acme", task_id=t), timeout=CALL_TIMEOUT)
    ).task
    assert task.work_status == lifecycle_enums.WORK_STATUS_DONE


async def test_a_host_call_id_makes_http_retries_exactly_once(pair, tmp_path):
    """Stateless Streamable HTTP has no connection to scope JSON-RPC ids: a host
    that wants exactly-once retries passes its call id in `_meta`."""
    t = await fresh_task(pair)
    with http_server(pair, tmp_path / "mcp.log") as url:
        async with http_client(url, agent_token()) as client:
            first = ok(await client.call_tool("claim_task", {"taskId": t}, meta={"io.funnel/callId": "c-1"}))
        async with http_client(url, agent_token()) as client:
            again = ok(await client.call_tool("claim_task", {"taskId": t}, meta={"io.funnel/callId": "c-1"}))
            unnamed = error_text(await client.call_tool("claim_task", {"taskId": t}))
    assert again == first
    assert "LEASE_HELD" in unnamed
