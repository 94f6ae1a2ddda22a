"""Failed service calls as tool errors a model can act on. The MCP specification
wants a tool that ran and failed to answer with `isError` and a text, not a
protocol error; the text here names the service's reason first (so a host can
match it), then the service's message, then the one thing to do about it."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from funnel.client import FunnelError

# What the agent does next, by reason. A reason not listed keeps the service's
# message alone: it already says what is wrong.
ADVICE = {
    "RUN_ALREADY_FINISHED": "The run is closed; it cannot be closed or used again. Call get_task for the task's "
    "state; if work remains, claim_task opens a new run.",
    "RUN_NOT_FOUND": "There is no such run in this workspace: pass the runId that claim_task returned.",
    "RUN_NOT_HELD": "The run belongs to another agent: use a run you claimed yourself.",
    "LEASE_NOT_CURRENT": "A newer claim superseded this run's lease: stop working on the task, the other run owns it.",
    "LEASE_EXPIRED": "The run's lease lapsed: call claim_task again before continuing.",
    "LEASE_HELD": "Another run holds the task's lease: do not work on it now.",
    "TASK_NOT_FOUND": "No such task in this workspace: check the taskId.",
    "GENERATION_TERMINAL": "The task is already finished: do not work on it.",
    "CANCELLATION_REQUESTED": "Cancellation of the task was requested: stop working on it and close the run with "
    "outcome cancelled.",
    "LIFECYCLE_REJECTED": "The lifecycle service refused the change and the run stays open: call get_task, then "
    "close the run with an outcome the task allows (stalled leaves the task as it is).",
    "SNAPSHOT_CHANGED": "The task's state moved while the gates were consulted: call attempt_completion again.",
    "COMPLETION_CONFLICT": "A different completion of this generation exists already: call get_task.",
    "LIFECYCLE_UNAVAILABLE": "The lifecycle service did not answer; nothing was changed. Repeat the same call later.",
    "RATE_LIMITED": "Too many calls: wait a moment, then repeat the same call.",
    "CREDENTIALS_MISSING": "This MCP server has no credentials for the services: the operator must configure a token.",
    "CREDENTIALS_INVALID": "The services reject this MCP server's token: the operator must configure a valid one.",
    "CREDENTIALS_EXPIRED": "This MCP server's token expired: the operator must renew it.",
    "WORKSPACE_NOT_GRANTED": "The token does not grant the workspace this server serves (--workspace): use a token "
    "for it, or a server started for the token's workspace.",
    "ROLE_NOT_PERMITTED": "The token's role does not allow this call.",
}
INPUT_REASONS = {"FIELD_REQUIRED", "FIELD_MALFORMED", "FIELD_TOO_LONG", "ENUM_UNSPECIFIED", "VALUE_OUT_OF_RANGE"}

# Codes on which nothing was applied and the same request may simply be sent again.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

# The reason of arguments that do not fit a tool's input schema.
ARGUMENTS_INVALID = "ARGUMENTS_INVALID"


class Refused(ToolError):
    """A tool's failure as the model reads it; `reason` comes first in the text
    and names the failure in the server's log."""

    def __init__(self, reason: str, text: str) -> None:
        super().__init__(text)
        self.reason = reason


def refusal(reason: str, message: str) -> Refused:
    """A failure of this server's own (no service call): `REASON: message.`"""
    return Refused(reason, f"{reason}: {message.rstrip('.')}.")


@dataclass(frozen=True)
class Failure:
    code: str
    reason: str
    message: str
    metadata: tuple[tuple[str, str], ...] = ()

    def text(self) -> str:
        head = f"{self.reason} ({self.code})" if self.reason != self.code else self.code
        parts = [f"{head}: {self.message.rstrip('.')}."]
        if self.metadata:
            parts.append("(" + ", ".join(f"{key}={value}" for key, value in self.metadata) + ")")
        advice = ADVICE.get(self.reason, "")
        if not advice and self.reason in INPUT_REASONS:
            advice = "Fix the arguments and call again."
        if advice:
            parts.append(advice)
        return " ".join(parts)

    def refused(self) -> Refused:
        return Refused(self.reason, self.text())


def failure(error: FunnelError) -> Failure:
    """The reason (ErrorInfo), code, message and metadata of a failed call."""
    code = error.code.name
    return Failure(
        code=code,
        reason=error.reason or code,
        message=error.message or code,
        metadata=tuple(sorted(error.metadata.items())),
    )


def unavailable(service: str) -> Failure:
    return Failure(
        "UNAVAILABLE",
        "UNAVAILABLE",
        f"{service} did not answer in time, even after retries; whether the call took effect is unknown",
        (("advice", "read the state (get_task) before repeating the call"),),
    )


def invalid_arguments(tool: str, error: ValidationError) -> str:
    """Arguments that do not fit the input schema, in the SDK's `Error executing
    tool` frame, as plain words: each field and what it should be. (Pydantic's own
    text names its generated model and links its documentation; the values are
    the caller's own and are not repeated.)"""
    problems = "; ".join(_problem(item) for item in error.errors(include_url=False))
    return f"Error executing tool {tool}: {ARGUMENTS_INVALID}: {problems}. Fix the arguments and call again."


def _problem(item: ErrorDetails) -> str:
    field = ".".join(str(part) for part in item["loc"]) or "arguments"
    if item["type"] == "missing":
        return f"`{field}` is required"
    message = item["msg"].removeprefix("Input ")  # "Input should be …": the field should be …
    return f"`{field}` {message[:1].lower()}{message[1:]}"
