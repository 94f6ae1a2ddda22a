"""The request-id vectors shared by funnel_mcp/idempotency.py and the TypeScript
client (clients/typescript/src/idempotency.ts): inputs chosen where a
re-implementation goes wrong (key order by code point, not UTF-16 unit; escapes;
non-ASCII text; integers; nulls; nesting), and what the Python implementation
answers. Both test suites check the file; after a change to the derivation,
write it again with

    .venv/bin/python -m tests.contract.request_id_vectors

and make the TypeScript client agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from funnel_mcp.idempotency import CALL_ID_META_KEY, call_identity, request_id

PATH = Path(__file__).with_name("request_id_vectors.json")

# The argument shapes are those funnel_mcp/tools.py builds for its tools (every
# parameter, None when not given), which the TypeScript session mirrors.
REQUEST_IDS: list[tuple[str, str, str, dict[str, Any], str]] = [
    ("claim_task", "claim_task", "acme", {"taskId": "fix-login"}, "host:toolu_01"),
    (
        "record_evidence, optional ones absent",
        "record_evidence",
        "acme",
        {"runId": "run_1", "kind": "tests", "verdict": "passed", "checkpoint": None, "details": None},
        "host:call-2",
    ),
    (
        "record_evidence, every argument",
        "record_evidence",
        "acme",
        {"runId": "run_1", "kind": "tests", "verdict": "failed", "checkpoint": "chk_9", "details": "2 failed"},
        "host:call-3",
    ),
    (
        "attempt_completion, state version unset",
        "attempt_completion",
        "acme",
        {"runId": "run_1", "result": "Implemented the change.", "outcome": "completed", "stateVersion": None},
        "host:7",
    ),
    (
        "attempt_completion, state version 0",
        "attempt_completion",
        "acme",
        {"runId": "run_1", "result": "", "outcome": "failed", "stateVersion": 0},
        "host:8",
    ),
    (
        "complete_task, outcome only",
        "complete_task",
        "acme",
        {
            "runId": "run_1",
            "outcome": "succeeded",
            "tokensInput": None,
            "tokensOutput": None,
            "tokensTotal": None,
            "notes": None,
            "error": None,
            "finalStatus": None,
        },
        "host:toolu_02",
    ),
    (
        "complete_task, every argument, largest integer",
        "complete_task",
        "acme",
        {
            "runId": "run_1",
            "outcome": "failed",
            "tokensInput": 1200,
            "tokensOutput": 0,
            "tokensTotal": 2**53 - 1,
            "notes": "ran out of time",
            "error": "timeout",
            "finalStatus": "in_progress",
        },
        "host:toolu_03",
    ),
    ("withdraw, as the server closes a gone holder's run", "withdraw", "acme", {"runId": "run_1"}, "withdraw"),
    ("a connection's JSON-RPC id", "claim_task", "acme", {"taskId": "t"}, "connection:3f2a9c:12"),
    (
        "non-ASCII text is hashed as UTF-8, not escaped",
        "attempt_completion",
        "café",
        {
            "runId": "run_é",
            "result": "Größe 日本語 🎉 \u202e\u2028\u00a0",
            "outcome": "completed",
            "stateVersion": None,
        },
        "host:ツール",
    ),
    (
        "escapes: quotes, backslash, controls, DEL",
        "record_evidence",
        "acme",
        {
            "runId": "run_1",
            "kind": "tests",
            "verdict": "passed",
            "checkpoint": None,
            "details": 'say "hi"\\ \n\r\t\b\f \x00\x01\x1f\x7f </script>',
        },
        'host:"quoted"',
    ),
    (
        "keys sort by code point: astral after U+FFFF",
        "custom",
        "acme",
        {"\uffff": 1, "\U0001f600": 2, "a": 3, "B": 4, "é": 5, "": 6, "aa": 7, "a\x00": 8},
        "host:keys",
    ),
    (
        "nesting, booleans, negative and empty",
        "custom",
        "",
        {"list": [1, [2, []], {"z": None, "y": True}], "flag": False, "n": -42, "empty": {}, "s": ""},
        "host:",
    ),
]

# (name, the `_meta` call id, connection, JSON-RPC id) -> call identity or None.
CALL_IDENTITIES: list[tuple[str, Any, str | None, Any]] = [
    ("the host's string id wins", "toolu_01", "session-1", 4),
    ("an integer host id", 7, "session-1", 4),
    ("host id 0 is an id", 0, None, None),
    ("a negative host id", -3, None, 1),
    ("an empty host id is none: the connection's", "", "session-1", 4),
    ("a boolean is not an id", True, "session-1", 5),
    ("a fraction is not an id", 1.5, "session-1", 6),
    ("an object is not an id", {"id": 1}, "session-1", "req-7"),
    ("a string JSON-RPC id", None, "session-1", "req-7"),
    ("an empty connection name still names one", None, "", 9),
    ("no JSON-RPC id", None, "session-1", None),
    ("nothing names the call", None, None, 3),
]


def vectors() -> dict[str, Any]:
    return {
        "about": "Request ids of funnel_mcp/idempotency.py; regenerate with "
        "`python -m tests.contract.request_id_vectors`.",
        "callIdMetaKey": CALL_ID_META_KEY,
        "requestIds": [
            {
                "name": name,
                "tool": tool,
                "workspace": workspace,
                "arguments": arguments,
                "call": call,
                "requestId": request_id(tool, workspace, arguments, call),
            }
            for name, tool, workspace, arguments, call in REQUEST_IDS
        ],
        "callIdentities": [
            {
                "name": name,
                "metaCallId": meta,
                "connection": connection,
                "jsonrpcId": jsonrpc_id,
                "call": call_identity(meta, connection, jsonrpc_id),
            }
            for name, meta, connection, jsonrpc_id in CALL_IDENTITIES
        ],
    }


def text() -> str:
    # ASCII escapes keep controls and invisible characters visible in the file.
    return json.dumps(vectors(), indent=2, ensure_ascii=True) + "\n"


if __name__ == "__main__":
    PATH.write_text(text(), encoding="utf-8")
