"""What a model and its host read from `funnel mcp`, beyond the tools' data: the
server's identity and capabilities, titles, the words of outcomes, validation
errors, the answer of a close that did not complete the task, and the log."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import subprocess

import pytest

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import completion_service_pb2_grpc as completion_grpc
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel_mcp.idempotency import request_id
from tests import credentials
from tests.mcp.support import (
    AGENT,
    CALL_TIMEOUT,
    FUNNEL,
    WS,
    agent_token,
    error_text,
    fresh_task,
    http_client,
    http_server,
    mcp_arguments,
    ok,
    stdio_client,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_the_server_names_its_version_and_advertises_only_its_tools(pair):
    async with stdio_client(pair, agent_token()) as client:
        info, capabilities = client.server_info, client.server_capabilities
    assert info is not None and info.version == importlib.metadata.version("funnel")
    assert capabilities.tools is not None
    assert capabilities.prompts is None and capabilities.resources is None


def generated(name: str) -> str | None:
    """Pydantic's title for a field nobody titled, where it is not words:
    `tokensInput` -> `Tokensinput` (`generation` -> `Generation` is fine)."""
    return name.title() if name != name.lower() else None


async def test_tools_and_their_fields_have_human_titles(pair):
    async with stdio_client(pair, agent_token()) as client:
        tools = (await client.list_tools()).tools
    for tool in tools:
        assert tool.title and tool.annotations is not None and tool.annotations.title == tool.title
        for schema in (tool.input_schema, tool.output_schema or {}):
            for name, field in schema["properties"].items():
                assert field.get("title") not in (None, generated(name)), (tool.name, name, field.get("title"))


async def test_a_succeeded_close_without_notes_says_what_happened_to_the_task_and_never_retry(pair):
    """The run is closed: the answer says the task was not completed and why, what
    is left to do (a new run, with the result), and nothing in it asks for a retry."""
    t = await fresh_task(pair)
    async with stdio_client(pair, agent_token()) as client:
        described = {tool.name: tool.description for tool in (await client.list_tools()).tools}
        run_id = ok(await client.call_tool("claim_task", {"taskId": t}))["runId"]
        first = ok(await client.call_tool("attempt_completion", {"runId": run_id, "result": "fixed"}))
        ok(
            await client.call_tool(
                "record_evidence",
                {
                    "runId": run_id,
                    "kind": "tests",
                    "verdict": "passed",
                    "checkpoint": first["missing"]["evidenceCheckpoint"],
                },
            )
        )
        closed = ok(await client.call_tool("complete_task", {"runId": run_id, "outcome": "succeeded"}))
        again = ok(await client.call_tool("attempt_completion", {"runId": run_id, "result": "done"}))
    assert "notes" in described["complete_task"] and "result" in described["complete_task"]
    assert (closed["finalStatus"], closed["taskEffect"]) == ("in_progress", "not_completed")
    assert "retry" not in json.dumps(closed).lower(), closed
    assert "result.non_empty" in closed["taskEffectReason"] and "run is closed" in closed["taskEffectReason"]
    assert "claim_task" in closed["nextStep"] and "notes" in closed["nextStep"]
    assert closed["decision"]["verdict"] == "soft_block"
    assert again["verdict"] == "hard_block"  # indeed nothing to retry on that run
    task = (
        await pair.lc.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id=t), timeout=CALL_TIMEOUT)
    ).task
    assert (
        task.state == lifecycle_enums.GENERATION_STATE_ACTIVE
        and task.work_status == lifecycle_enums.WORK_STATUS_IN_PROGRESS
    )


async def test_validation_errors_are_plain_words_without_library_links(pair):
    t = await fresh_task(pair)
    async with stdio_client(pair, agent_token()) as client:
        run_id = ok(await client.call_tool("claim_task", {"taskId": t}))["runId"]
        texts = {
            field: error_text(await client.call_tool("complete_task", arguments))
            for field, arguments in (
                ("outcome", {"runId": run_id, "outcome": "finished"}),
                ("tokensTotal", {"runId": run_id, "outcome": "stalled", "tokensTotal": -1}),
                ("runId", {"outcome": "stalled"}),
            )
        }
    for field, text in texts.items():
        assert "pydantic" not in text and "http" not in text, text
        assert text.startswith("Error executing tool complete_task: ARGUMENTS_INVALID:"), text
        assert f"`{field}`" in text and text.endswith("Fix the arguments and call again."), text
    assert "'succeeded', 'failed', 'cancelled' or 'stalled'" in texts["outcome"]
    assert "required" in texts["runId"]


async def test_every_tool_says_succeeded_for_a_task_that_succeeded(pair):
    """attempt_completion and get_task speak complete_task's word; attempt_completion
    still accepts its former `completed`."""
    t, former = await fresh_task(pair), await fresh_task(pair)
    async with stdio_client(pair, agent_token()) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        for task_id, word in ((t, "succeeded"), (former, "completed")):
            run_id = ok(await client.call_tool("claim_task", {"taskId": task_id}))["runId"]
            first = ok(await client.call_tool("attempt_completion", {"runId": run_id, "result": "x", "outcome": word}))
            ok(
                await client.call_tool(
                    "record_evidence",
                    {
                        "runId": run_id,
                        "kind": "tests",
                        "verdict": "passed",
                        "checkpoint": first["missing"]["evidenceCheckpoint"],
                    },
                )
            )
            allowed = ok(
                await client.call_tool("attempt_completion", {"runId": run_id, "result": "x", "outcome": word})
            )
            assert allowed["settlement"] == "settled"
            assert ok(await client.call_tool("get_task", {"taskId": task_id}))["terminalOutcome"] == "succeeded"
    outcome = listed["attempt_completion"].input_schema["properties"]["outcome"]
    assert outcome["enum"] == ["succeeded", "failed"] and outcome["default"] == "succeeded"


async def test_attempt_completion_request_ids_hash_the_services_outcome_word(pair):
    """The tool says `succeeded`; its request id is still derived from `completed`,
    the service's word, as 0.1.0 and clients/typescript's session derive it: the
    service replays the tool call's answer to a direct call with that id."""
    t = await fresh_task(pair)
    token = agent_token()
    channel = credentials.tls_channel(pair.completion.address, token, identity=None)
    try:
        async with stdio_client(pair, token) as client:
            claimed = ok(await client.call_tool("claim_task", {"taskId": t}))
            blocked = ok(
                await client.call_tool(
                    "attempt_completion",
                    {"runId": claimed["runId"], "result": "done"},
                    meta={"io.funnel/callId": "toolu_a"},
                )
            )
            ok(
                await client.call_tool(
                    "record_evidence",
                    {
                        "runId": claimed["runId"],
                        "kind": "tests",
                        "verdict": "passed",
                        "checkpoint": blocked["missing"]["evidenceCheckpoint"],
                    },
                )
            )
            arguments = {"runId": claimed["runId"], "result": "done", "outcome": "completed", "stateVersion": None}
            replayed = await completion_grpc.CompletionServiceStub(channel).AttemptCompletion(
                completion_messages.AttemptCompletionRequest(
                    workspace_id=WS,
                    task_id=t,
                    run_id=claimed["runId"],
                    epoch=claimed["leaseEpoch"],
                    outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
                    result="done",
                    request_id=request_id("attempt_completion", WS, arguments, "host:toolu_a"),
                ),
                timeout=CALL_TIMEOUT,
            )
    finally:
        await channel.close()
    assert blocked["verdict"] == "soft_block"
    # The first answer, not a new decision (the evidence is there now: it would allow).
    assert replayed.decision.verdict == completion_enums.VERDICT_SOFT_BLOCK and not replayed.HasField("completion")


def log_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


async def test_one_start_line_and_one_json_line_per_tool_call(pair, tmp_path):
    t = await fresh_task(pair)
    log = tmp_path / "mcp.log"
    with http_server(pair, log) as url:
        async with http_client(url, agent_token()) as client:
            ok(await client.call_tool("get_task", {"taskId": t}))
            error_text(await client.call_tool("get_task", {"taskId": "no-such-task"}))
            error_text(await client.call_tool("complete_task", {"runId": "x", "outcome": "finished"}))
    lines = log_lines(log.read_text())
    (start,) = [line for line in lines if line.get("event") == "start"]
    assert start["url"] == url and start["transport"] == "streamable-http"
    assert start["version"] == importlib.metadata.version("funnel") and start["workspace"] == WS
    calls = [line for line in lines if line.get("event") == "tool"]
    assert [(c["tool"], c["caller"], c["workspace"], c["outcome"]) for c in calls] == [
        ("get_task", AGENT, WS, "ok"),
        ("get_task", AGENT, WS, "TASK_NOT_FOUND"),
        ("complete_task", AGENT, WS, "ARGUMENTS_INVALID"),
    ]
    assert all(isinstance(c["duration_ms"], float) and c["logger"] == "funnel.mcp" for c in calls)
    assert calls[0]["level"] == "INFO" and calls[1]["task"] == "no-such-task"


async def test_stdio_logs_its_start_line_on_stderr_never_on_stdout(pair):
    """stdout is the protocol: a host that connects and leaves sees only JSON-RPC
    there, and the start line on stderr."""
    done = await asyncio.to_thread(
        subprocess.run,
        [str(FUNNEL), *mcp_arguments(pair)],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        env={"FUNNEL_TOKEN": agent_token()},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    (start,) = [line for line in log_lines(done.stderr) if line.get("event") == "start"]
    assert (start["transport"], start["workspace"]) == ("stdio", WS)
