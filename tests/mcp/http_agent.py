"""An agent process for tests/mcp/test_mcp_leases_end.py: the SDK's client claims
a task through `funnel mcp --http`, prints the answer as one JSON line, and then
waits, its session open, until the test kills it (so it never ends the session).

    python -m tests.mcp.http_agent URL TOKEN TASK_ID MODE"""

from __future__ import annotations

import asyncio
import json
import sys

from tests.mcp.support import http_client, ok


async def main(url: str, token: str, task_id: str, mode: str) -> None:
    async with http_client(url, token, mode) as client:
        print(json.dumps(ok(await client.call_tool("claim_task", {"taskId": task_id}))), flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
