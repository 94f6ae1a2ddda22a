"""`funnel mcp --http` answers only requests addressed to one of its own names
(DNS rebinding): a page of another site whose name resolves to the server's
address sends that name as Host, and its own origin as Origin. Checked on a
loopback address the SDK does not protect by itself (127.0.0.2), with a valid
token (a page that got hold of one must still be refused)."""

from __future__ import annotations

import json

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from tests.mcp.support import (
    CALL_TIMEOUT,
    WS,
    agent_token,
    fresh_task,
    http_client,
    http_server,
    initialize_request,
    ok,
    request_2026,
)
from tests.reliability.harness import unused_port

pytestmark = pytest.mark.asyncio(loop_scope="module")

HOST = "127.0.0.2"
PROTOCOL = "2026-07-28"


def claim_request(task_id: str) -> dict:
    return request_2026("tools/call", {"name": "claim_task", "arguments": {"taskId": task_id}})


async def post(url: str, body: dict, headers: dict[str, str]) -> httpx2.Response:
    base = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "authorization": f"Bearer {agent_token()}",
    }
    if body["method"] != "initialize":
        base |= {"mcp-protocol-version": PROTOCOL, "mcp-method": body["method"], "mcp-name": body["params"]["name"]}
    async with httpx2.AsyncClient(timeout=30) as http:
        return await http.post(url, content=json.dumps(body), headers=base | headers)


async def runs_of(pair, task_id: str) -> list[completion_types.Run]:
    response = await pair.cs.ListRuns(
        completion_messages.ListRunsRequest(workspace_id=WS, task_id=task_id), timeout=CALL_TIMEOUT
    )
    return list(response.runs)


async def test_a_foreign_host_or_origin_on_127_0_0_2_is_refused_and_runs_no_tool(pair, tmp_path):
    t = await fresh_task(pair)
    port = unused_port()
    own = f"{HOST}:{port}"
    with http_server(pair, tmp_path / "mcp.log", host=HOST, port=port) as url:
        rebound = {"host": f"rebind.evil.example:{port}"}
        foreign_origin = {"host": own, "origin": f"http://rebind.evil.example:{port}"}
        assert (await post(url, claim_request(t), rebound)).status_code == 421
        assert (await post(url, initialize_request(), rebound)).status_code == 421
        assert (await post(url, claim_request(t), foreign_origin)).status_code == 403
        assert (await post(url, initialize_request(), foreign_origin)).status_code == 403
        assert await runs_of(pair, t) == []
        task = (
            await pair.lc.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id=t), timeout=CALL_TIMEOUT)
        ).task
        assert task.state == lifecycle_enums.GENERATION_STATE_REGISTERED

        # The server's own name, and a same-origin page, are answered (so the
        # refusals above were about the names, not the requests).
        answered = await post(url, claim_request(t), {"host": own, "origin": f"http://{own}"})
        assert answered.status_code == 200, answered.text
        assert answered.json()["result"]["structuredContent"]["taskId"] == t
    assert len(await runs_of(pair, t)) == 1


async def test_the_names_given_by_flags_pass_and_others_do_not(pair, tmp_path):
    t = await fresh_task(pair)
    port = unused_port()
    with http_server(
        pair,
        tmp_path / "mcp.log",
        "--allowed-host",
        f"mcp.internal:{port}",
        "--allowed-origin",
        "https://app.example",
        host=HOST,
        port=port,
    ) as url:
        named = {
            "host": f"mcp.internal:{port}",
            "origin": "https://app.example",
            "authorization": f"Bearer {agent_token()}",
        }
        async with (
            httpx2.AsyncClient(timeout=30, headers=named) as http,
            Client(streamable_http_client(url, http_client=http), read_timeout_seconds=30) as client,
        ):
            claimed = ok(await client.call_tool("claim_task", {"taskId": t}))
        assert claimed["taskId"] == t
        # The derived origin of an allowed host passes; names not given do not.
        assert (
            await post(
                url, initialize_request(), {"host": f"mcp.internal:{port}", "origin": f"http://mcp.internal:{port}"}
            )
        ).status_code == 200
        assert (await post(url, initialize_request(), {"host": f"other.internal:{port}"})).status_code == 421
        assert (
            await post(url, initialize_request(), {"host": f"mcp.internal:{port}", "origin": "https://other.example"})
        ).status_code == 403


async def test_the_default_loopback_bind_still_answers_its_own_names(pair, tmp_path):
    t = await fresh_task(pair)
    with http_server(pair, tmp_path / "mcp.log") as url:
        port = url.rsplit(":", 1)[1].split("/")[0]
        async with http_client(url.replace("127.0.0.1", "localhost"), agent_token()) as client:
            assert ok(await client.call_tool("get_task", {"taskId": t}))["taskId"] == t
        assert (await post(url, initialize_request(), {"host": f"rebind.evil.example:{port}"})).status_code == 421
