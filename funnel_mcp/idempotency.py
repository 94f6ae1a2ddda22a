"""The `request_id` of a mutating tool call, so that a host that sends the same
call again gets the first answer instead of a second effect.

MCP has no tool-call id of its own. What identifies "the same call" is, in order:
1. the host's own call id, when it passes one in the request's `_meta` under
   `io.funnel/callId` (e.g. the model's tool-use id): stable across reconnects
   and restarts of this server;
2. else the JSON-RPC request id within its connection (the Streamable HTTP
   session id, or this process for stdio): a transport that resends a request
   resends its id, while a new call gets a new one, so an agent that deliberately
   closes a run twice still learns `RUN_ALREADY_FINISHED`;
3. else (a stateless Streamable HTTP request: no session, and JSON-RPC ids that
   restart with every client) nothing does, and the call goes with a fresh
   request id of funnel.client's, which only its own retries of that service call
   repeat. The arguments alone cannot name a call: an agent that attempts
   completion, records the missing evidence and attempts again with the same
   words must get a new decision, not the first one replayed; and a claim after
   the run closed must open a new run.

The tool name, workspace and arguments are always part of the key, so one call
id can never replay the answer of a different call."""

from __future__ import annotations

import hashlib
import json
from typing import Any

CALL_ID_META_KEY = "io.funnel/callId"
PREFIX = "mcp-"


def request_id(tool: str, workspace: str, arguments: dict[str, Any], call: str) -> str:
    """A valid service id (`mcp-` + 40 hex digits) for the call named `call`."""
    material = json.dumps(
        {"tool": tool, "workspace": workspace, "arguments": arguments, "call": call},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return PREFIX + hashlib.sha256(material.encode()).hexdigest()[:40]


def call_identity(meta_call_id: object, connection: str | None, jsonrpc_id: object) -> str | None:
    """Which of the sources above names this call (None: none does)."""
    if isinstance(meta_call_id, (str, int)) and not isinstance(meta_call_id, bool) and str(meta_call_id):
        return f"host:{meta_call_id}"
    if connection is not None:
        return f"connection:{connection}:{jsonrpc_id}"
    return None
