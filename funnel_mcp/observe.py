"""One log line per tool call, as the services write one per RPC
(funnel.runtime.observe): the tool, who called (the token's subject) in which
workspace, the task or run the arguments name, the outcome (`ok`, or the reason
the model read first) and the duration. A call's record is opened around the
tool (`observed`); the caller it holds is the one the tool acts as (`current`)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from funnel.runtime.logs import fields
from funnel_mcp.callers import Caller

log = logging.getLogger("funnel.mcp")

OK = "ok"
# Outcomes that say the caller was turned away, and those that say something failed.
DENIED = frozenset(
    {
        "CREDENTIALS_MISSING",
        "CREDENTIALS_INVALID",
        "CREDENTIALS_EXPIRED",
        "WORKSPACE_NOT_GRANTED",
        "WORKSPACE_UNKNOWN",
        "ROLE_NOT_PERMITTED",
        "RATE_LIMITED",
    }
)
FAULTS = frozenset({"INTERNAL", "UNAVAILABLE", "LIFECYCLE_UNAVAILABLE"})
# Longer ids are refused by the input schema; not worth a log field.
MAX_ID = 128


@dataclass
class ToolCall:
    tool: str
    task: str | None
    run: str | None
    # Resolved before the tool runs; None when that failed.
    caller: Caller | None = None


_current: contextvars.ContextVar[ToolCall | None] = contextvars.ContextVar("funnel_mcp_tool_call", default=None)


@contextlib.contextmanager
def observed(tool: str, arguments: Mapping[str, Any]) -> Iterator[ToolCall]:
    call = ToolCall(tool, _id(arguments.get("taskId")), _id(arguments.get("runId")))
    token = _current.set(call)
    try:
        yield call
    finally:
        _current.reset(token)


def current() -> ToolCall | None:
    return _current.get()


def opened(run_id: str) -> None:
    """The current call (a claim) opened this run: its line names it."""
    call = _current.get()
    if call is not None:
        call.run = run_id


def finished(call: ToolCall, outcome: str, seconds: float) -> None:
    level = logging.WARNING if outcome in DENIED else logging.ERROR if outcome in FAULTS else logging.INFO
    log.log(
        level,
        "%s %s",
        call.tool,
        outcome,
        extra=fields(
            event="tool",
            tool=call.tool,
            caller=call.caller.subject if call.caller else None,
            workspace=call.caller.workspace if call.caller else None,
            task=call.task,
            run=call.run,
            outcome=outcome,
            duration_ms=round(seconds * 1000, 3),
        ),
    )


def _id(value: object) -> str | None:
    return value if isinstance(value, str) and len(value) <= MAX_ID else None
