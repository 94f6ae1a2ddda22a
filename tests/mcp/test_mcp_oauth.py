"""`funnel mcp --http` is an OAuth 2.1 resource server, as the MCP
specification's authorization section wants: a request without a valid bearer
token is HTTP 401 whose `WWW-Authenticate` names the protected-resource metadata
(RFC 9728), that document names the configured authorization servers, and a
caller with a token acts as itself, in the workspace its token grants."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import httpx2
import pytest
from mcp import MCPError

from funnel.auth.tokens import SigningKey
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from tests import credentials
from tests.mcp.support import (
    CALL_TIMEOUT,
    FUNNEL,
    WS,
    agent_token,
    error_text,
    fresh_task,
    http_client,
    http_server,
    initialize_request,
    mcp_arguments,
    ok,
    request_2026,
)
from tests.reliability.harness import unused_port

pytestmark = pytest.mark.asyncio(loop_scope="module")

AUTHORIZATION_SERVER = "https://login.example.com"
OTHER_WS = "beta"
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def initialize() -> str:
    return json.dumps(initialize_request())


def list_tools_2026() -> str:
    return json.dumps(request_2026("tools/list", {}))


async def test_no_valid_token_is_401_naming_the_resource_metadata_which_names_the_authorization_server(pair, tmp_path):
    expired = credentials.token("agent-7", [f"{WS}:agent"], ttl_seconds=-3600)
    for_another_audience = credentials.token("agent-7", [f"{WS}:agent"], audience="another")
    with http_server(pair, tmp_path / "mcp.log", "--authorization-server", AUTHORIZATION_SERVER) as url:
        origin = url.removesuffix("/mcp")
        metadata_url = f"{origin}/.well-known/oauth-protected-resource/mcp"
        async with httpx2.AsyncClient(timeout=30) as http:
            for body, extra in (
                (initialize(), {}),
                (list_tools_2026(), {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/list"}),
                (initialize(), {"authorization": "Bearer not-a-jwt"}),
                (initialize(), {"authorization": f"Bearer {expired}"}),
                (initialize(), {"authorization": f"Bearer {for_another_audience}"}),
            ):
                answer = await http.post(url, content=body, headers=HEADERS | extra)
                assert answer.status_code == 401, (extra, answer.text)
                challenge = answer.headers["www-authenticate"]
                assert challenge.startswith("Bearer ") and f'resource_metadata="{metadata_url}"' in challenge
            # RFC 9728 §3.1 places the document under the resource's path; MCP
            # clients also try the root, where the same document is served.
            for where in (metadata_url, f"{origin}/.well-known/oauth-protected-resource"):
                document = await http.get(where)
                assert document.status_code == 200, where
                assert document.json()["resource"] == url
                assert document.json()["authorization_servers"] == [AUTHORIZATION_SERVER]
                assert document.json()["bearer_methods_supported"] == ["header"]
        # Then, with a token, the SDK's own client is served.
        t = await fresh_task(pair)
        async with http_client(url, agent_token()) as client:
            assert ok(await client.call_tool("claim_task", {"taskId": t}))["taskId"] == t


async def test_an_unauthenticated_sdk_client_is_refused_before_any_tool_runs(pair, tmp_path):
    t = await fresh_task(pair)
    with http_server(pair, tmp_path / "mcp.log") as url, pytest.raises(ExceptionGroup) as refused:
        async with http_client(url, None) as client:
            await client.call_tool("claim_task", {"taskId": t})
    # The SDK's client reports the 401 of its `initialize` as an error response.
    assert refused.group_contains(MCPError)
    runs = await pair.cs.ListRuns(completion_messages.ListRunsRequest(workspace_id=WS, task_id=t), timeout=CALL_TIMEOUT)
    assert list(runs.runs) == []


async def audit_callers(pair, run_id: str, workspace: str = WS) -> list[tuple[str, str]]:
    audit = await pair.cs.ListAuditLog(
        completion_messages.ListAuditLogRequest(workspace_id=workspace, run_id=run_id), timeout=CALL_TIMEOUT
    )
    return [(entry.caller.subject, entry.caller.role) for entry in audit.entries]


async def test_two_clients_with_different_tokens_act_as_themselves(pair, tmp_path):
    mine, theirs = await fresh_task(pair), await fresh_task(pair)
    with http_server(pair, tmp_path / "mcp.log") as url:
        async with (
            http_client(url, agent_token("agent-a"), mode="legacy") as first,
            http_client(url, agent_token("agent-b")) as second,
        ):
            run_a = ok(await first.call_tool("claim_task", {"taskId": mine}))["runId"]
            run_b = ok(await second.call_tool("claim_task", {"taskId": theirs}))["runId"]
            refused = error_text(await second.call_tool("complete_task", {"runId": run_a, "outcome": "stalled"}))
            ok(await first.call_tool("complete_task", {"runId": run_a, "outcome": "stalled"}))
            ok(await second.call_tool("complete_task", {"runId": run_b, "outcome": "stalled"}))
    assert "RUN_NOT_HELD" in refused
    for run_id, agent in ((run_a, "agent-a"), (run_b, "agent-b")):
        run = (
            await pair.cs.GetRun(
                completion_messages.GetRunRequest(workspace_id=WS, run_id=run_id), timeout=CALL_TIMEOUT
            )
        ).run
        assert run.agent_id == agent
        assert await audit_callers(pair, run_id) == [(agent, "agent")]


async def test_the_workspace_comes_from_the_token_or_from_workspace(pair, tmp_path):
    """Without --workspace a call acts in the one workspace its token grants; a
    token granting several names none. With --workspace the server serves that
    workspace only: a token for another is refused by the services."""
    elsewhere, here = await fresh_task(pair, workspace=OTHER_WS), await fresh_task(pair)
    beta_agent = agent_token("agent-b", workspace=OTHER_WS)
    both = credentials.token("agent-c", [f"{WS}:agent", f"{OTHER_WS}:agent"])
    with http_server(pair, tmp_path / "any.log", workspace=None) as url:
        async with http_client(url, beta_agent) as client:
            claimed = ok(await client.call_tool("claim_task", {"taskId": elsewhere}))
            ok(await client.call_tool("complete_task", {"runId": claimed["runId"], "outcome": "stalled"}))
        async with http_client(url, both) as client:
            ambiguous = error_text(await client.call_tool("get_task", {"taskId": here}))
    assert await audit_callers(pair, claimed["runId"], OTHER_WS) == [("agent-b", "agent")]
    assert "WORKSPACE_UNKNOWN" in ambiguous and f"{WS}, {OTHER_WS}" in ambiguous
    with http_server(pair, tmp_path / "acme.log") as url:
        async with http_client(url, beta_agent) as client:
            foreign = error_text(await client.call_tool("get_task", {"taskId": here}))
        async with http_client(url, both) as client:
            assert ok(await client.call_tool("get_task", {"taskId": here}))["taskId"] == here
    assert "WORKSPACE_NOT_GRANTED (PERMISSION_DENIED)" in foreign


async def test_a_rotated_jwks_file_is_used_without_a_restart(pair, tmp_path):
    """As by the services: a token of a key added to the JWKS file is accepted
    once the file changed (bounded wait), and was refused before."""
    jwks = tmp_path / "jwks.json"
    jwks.write_text(credentials.JWKS_FILE.read_text(encoding="utf-8"), encoding="utf-8")
    new_key = SigningKey.generate()
    token = new_key.issue("agent-7", [f"{WS}:agent"], 3600)
    headers = HEADERS | {"authorization": f"Bearer {token}"}
    with http_server(pair, tmp_path / "mcp.log", "--jwks-file", str(jwks)) as url:
        async with httpx2.AsyncClient(timeout=30) as http:
            assert (await http.post(url, content=initialize(), headers=headers)).status_code == 401
            keys = json.loads(jwks.read_text(encoding="utf-8"))["keys"] + new_key.jwks()["keys"]
            jwks.write_text(json.dumps({"keys": keys}), encoding="utf-8")
            deadline = time.monotonic() + 60
            while (await http.post(url, content=initialize(), headers=headers)).status_code == 401:
                assert time.monotonic() < deadline, "the new key was never accepted"
                await asyncio.sleep(0.5)


async def test_a_configured_token_is_refused_over_http(pair):
    """Over HTTP every client brings its own token; one held by the server would
    let whoever reaches the port act with it."""
    result = await asyncio.to_thread(
        subprocess.run,
        [str(FUNNEL), *mcp_arguments(pair, "--http", f"127.0.0.1:{unused_port()}", "--token", agent_token())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "every client sends its own token" in result.stderr
