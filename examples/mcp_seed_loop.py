"""Seed 001's manual check, as an MCP host runs it: start `funnel mcp` from a host
configuration file (the README's snippet), then claim_task -> do nothing ->
complete_task, and show that the run closed.

    python examples/mcp_seed_loop.py mcp.json fix-login

Uses the official MCP SDK client over stdio, like any host that spawns servers."""

import asyncio
import json
import sys

from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.types import TextContent


def answer(result) -> dict:
    if result.is_error:
        sys.exit(" ".join(block.text for block in result.content if block.type == "text"))
    return result.structured_content


async def main(config_path: str, task_id: str) -> None:
    with open(config_path, encoding="utf-8") as file:
        server = json.load(file)["mcpServers"]["funnel"]
    parameters = StdioServerParameters(command=server["command"], args=server["args"], env=server.get("env"))
    async with Client(parameters) as client:
        claimed = answer(await client.call_tool("claim_task", {"taskId": task_id}))
        print(
            f"claim_task    -> run {claimed['runId']}, generation {claimed['generation']}, "
            f"lease epoch {claimed['leaseEpoch']} until {claimed['leaseExpiresAt']}"
        )
        closed = answer(
            await client.call_tool(
                "complete_task",
                {
                    "runId": claimed["runId"],
                    "outcome": "stalled",
                    "tokensInput": 0,
                    "tokensOutput": 0,
                    "notes": "seed 001 manual loop: nothing done",
                },
            )
        )
        print(
            f"complete_task -> run {closed['runId']} finished at {closed['finishedAt']}, "
            f"final status {closed['finalStatus']}, tokens {closed['tokensTotal']}"
        )
        again = await client.call_tool("complete_task", {"runId": claimed["runId"], "outcome": "stalled"})
        error = again.content[0]
        if not isinstance(error, TextContent):
            sys.exit(f"complete_task again -> expected a text error, got {error.type} content")
        print(f"complete_task again -> error: {error.text}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python examples/mcp_seed_loop.py MCP_CONFIG.json TASK_ID")
    asyncio.run(main(sys.argv[1], sys.argv[2]))
