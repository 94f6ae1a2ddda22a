"""The tools an agent sees: names, descriptions, annotations and JSON schemas as
`funnel mcp` lists them over stdio, against the committed snapshot
(tools.snapshot.json); and `complete_task` against seed 001's field list.

A deliberate change of a tool rewrites the snapshot with
`FUNNEL_UPDATE_SNAPSHOT=1 .venv/bin/python -m pytest tests/mcp/test_mcp_schema.py`
and goes into CHANGELOG.md: hosts and models depend on these shapes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import pytest_asyncio

from tests.mcp.support import agent_token, stdio_client

pytestmark = pytest.mark.asyncio(loop_scope="module")

SNAPSHOT = Path(__file__).with_name("tools.snapshot.json")

# Seed 001, "Contract": the input zod schema and the returned object.
SEED_INPUT = {
    "runId": "string",
    "outcome": ["succeeded", "failed", "cancelled", "stalled"],
    "tokensInput": "integer",
    "tokensOutput": "integer",
    "tokensTotal": "integer",
    "notes": "string",
    "error": "string",
    "finalStatus": ["done", "blocked", "ready", "in_progress", "cancelled"],
}
SEED_REQUIRED = ["runId", "outcome"]
SEED_OUTPUT = {"runId", "finishedAt", "finalStatus", "tokensTotal"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def listed(pair) -> list[dict]:
    async with stdio_client(pair, agent_token()) as client:
        tools = (await client.list_tools()).tools
    return [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in tools]


async def test_the_tools_match_the_committed_snapshot(listed):
    if os.environ.get("FUNNEL_UPDATE_SNAPSHOT"):
        SNAPSHOT.write_text(json.dumps(listed, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    assert listed == json.loads(SNAPSHOT.read_text(encoding="utf-8")), (
        "the tools changed: review, then FUNNEL_UPDATE_SNAPSHOT=1 (see this file's docstring)"
    )


async def test_every_tool_is_described_and_annotated(listed):
    assert [tool["name"] for tool in listed] == [
        "claim_task",
        "complete_task",
        "record_evidence",
        "attempt_completion",
        "get_task",
    ]
    for tool in listed:
        assert len(tool["description"]) > 200, tool["name"]
        assert tool["inputSchema"]["type"] == "object" and tool["outputSchema"]["type"] == "object"
        hints = tool["annotations"]
        assert {"readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"} <= set(hints)
        for name, field in tool["inputSchema"]["properties"].items():
            assert field.get("description"), (tool["name"], name)
    read_only = {tool["name"] for tool in listed if tool["annotations"]["readOnlyHint"]}
    assert read_only == {"get_task"}


def json_type(field: dict) -> object:
    """The seed's view of a property: its enum, or its JSON type (null allowed for optional ones)."""
    options = field.get("anyOf", [field])
    kinds = [option for option in options if option.get("type") != "null"]
    assert len(kinds) == 1, field
    return kinds[0].get("enum") or kinds[0]["type"]


async def test_complete_task_has_exactly_the_seeds_contract(listed):
    tool = next(tool for tool in listed if tool["name"] == "complete_task")
    schema = tool["inputSchema"]
    assert {name: json_type(field) for name, field in schema["properties"].items()} == SEED_INPUT
    assert sorted(schema["required"]) == sorted(SEED_REQUIRED)
    for tokens in ("tokensInput", "tokensOutput", "tokensTotal"):
        assert schema["properties"][tokens]["anyOf"][0]["minimum"] == 0
    assert (
        "maxLength" not in schema["properties"]["notes"]["anyOf"][0]
        or schema["properties"]["notes"]["anyOf"][0]["maxLength"] > 2000
    )  # capped, never refused, at 2000
    output = tool["outputSchema"]
    assert set(output["required"]) >= SEED_OUTPUT
