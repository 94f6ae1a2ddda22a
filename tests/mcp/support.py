"""Both services as real processes (tests/reliability's Pair, TLS and tokens) and
`funnel mcp` as a real subprocess driven by the official MCP SDK client, over
stdio or Streamable HTTP."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from tests import credentials
from tests.reliability.harness import Pair, unused_port

FUNNEL = Path(sys.executable).parent / "funnel"
WS = "acme"
AGENT = "agent-7"
CALL_TIMEOUT = 10


def agent_token(subject: str = AGENT, workspace: str = WS, role: str = "agent") -> str:
    return credentials.token(subject, [f"{workspace}:{role}"])


def mcp_arguments(pair: Pair, *extra: str, workspace: str | None = WS) -> list[str]:
    """`funnel mcp` against `pair`; `workspace` None starts it without --workspace."""
    pki = credentials.PKI
    return [
        "mcp",
        *(("--workspace", workspace) if workspace else ()),
        "--lifecycle",
        pair.lifecycle.address,
        "--completion",
        pair.completion.address,
        "--ca",
        str(pki.ca),
        "--cert",
        str(pki.cert("client")),
        "--key",
        str(pki.key("client")),
        *extra,
    ]


@contextlib.asynccontextmanager
async def stdio_client(pair: Pair, token: str | None, *extra: str, workspace: str = WS) -> AsyncIterator[Client]:
    env = {"FUNNEL_TOKEN": token} if token else {}
    parameters = StdioServerParameters(
        command=str(FUNNEL), args=mcp_arguments(pair, *extra, workspace=workspace), env=env
    )
    async with Client(parameters, read_timeout_seconds=30) as client:
        yield client


@contextlib.contextmanager
def http_server(
    pair: Pair, log: Path, *extra: str, host: str = "127.0.0.1", port: int | None = None, workspace: str | None = WS
) -> Any:
    """`funnel mcp --http` on `host`, verifying callers' tokens with the services'
    JWKS (FUNNEL_JWKS_FILE); each caller sends its own token."""
    port = port or unused_port()
    env = {key: value for key, value in os.environ.items() if key != "FUNNEL_TOKEN"}
    env["FUNNEL_JWKS_FILE"] = str(credentials.JWKS_FILE)
    arguments = mcp_arguments(pair, "--http", f"{host}:{port}", *extra, workspace=workspace)
    with log.open("wb") as output:
        process = subprocess.Popen([str(FUNNEL), *arguments], stdout=output, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://{host}:{port}/mcp"
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, log.read_text()
            try:
                httpx2.get(url, timeout=1)
                break
            except httpx2.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.asynccontextmanager
async def http_client(url: str, token: str | None, mode: str = "auto") -> AsyncIterator[Client]:
    """The SDK's client; mode "auto" speaks the 2026-07-28 protocol (no session),
    "legacy" opens a session (`Mcp-Session-Id`, a GET stream, DELETE at the end)."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), read_timeout_seconds=30, mode=mode) as client,
    ):
        yield client


def initialize_request() -> dict[str, Any]:
    """A raw `initialize` of the 2025-11-25 protocol, for tests that post by hand."""
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "probe", "version": "1"},
        },
    }


def request_2026(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A whole request of the 2026-07-28 protocol (no session, nothing before it):
    the client's protocol version, info and capabilities travel in `_meta`."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "probe", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}


async def fresh_task(pair: Pair, workspace: str = WS) -> str:
    """A newly registered task (the services are shared by the tests of a module)."""
    task_id = f"task-{uuid.uuid4().hex[:12]}"
    await pair.lc.RegisterTask(
        lifecycle_messages.RegisterTaskRequest(workspace_id=workspace, task_id=task_id), timeout=CALL_TIMEOUT
    )
    return task_id


def ok(result: CallToolResult) -> dict[str, Any]:
    """The structured answer of a call that must succeed."""
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def error_text(result: CallToolResult) -> str:
    """The text of a call that must be a tool error (not a protocol error)."""
    assert result.is_error, result.structured_content
    return " ".join(block.text for block in result.content if block.type == "text")
