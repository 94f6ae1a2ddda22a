"""An MCP client this project did not write: the MCP Inspector's CLI
(`@modelcontextprotocol/inspector`, pinned in the root package-lock.json and
installed by tests/node_tools.py) against `funnel mcp --http` and both services
as real processes, with TLS and tokens. It lists the tools, runs seed 001's loop
one tool call per invocation, and is refused with the HTTP 401 without a token.

Each invocation is what a user types, `npx @modelcontextprotocol/inspector --cli
URL --transport http --header "Authorization: Bearer …" --method tools/call
--tool-name NAME --tool-arg key=value …`, with `--format json` (one JSON object
on stdout, the error envelope on stderr) and `--stored-auth-only` (never an
interactive OAuth login). Every invocation opens a session of its own (the CLI's
default protocol era, `legacy`) and leaves it without deleting it: the run
claimed by the first stays open for the later ones (docs/mcp.md, "Leases").
HOME points into tmp_path so the Inspector's catalog and secret store never
touch the user's."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from tests.mcp.support import AGENT, CALL_TIMEOUT, WS, agent_token, fresh_task, http_server
from tests.node_tools import ensure_packages

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = Path(__file__).with_name("tools.snapshot.json")
INSPECTOR_TIMEOUT = 60  # seconds per invocation; each takes about one


@pytest.fixture(scope="module")
def inspector() -> Path:
    path = ensure_packages(ROOT) / ".bin" / "mcp-inspector"
    assert path.exists(), f"npm ci installed no {path}: is @modelcontextprotocol/inspector in package-lock.json?"
    return path


@pytest.fixture(scope="module")
def url(pair, tmp_path_factory) -> Iterator[str]:
    with http_server(pair, tmp_path_factory.mktemp("mcp") / "mcp.log") as served:
        yield served


class Inspected:
    """One run of the Inspector CLI: its exit code and the JSON it printed
    (the result on stdout, or the error envelope on stderr)."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr

    @property
    def result(self) -> dict[str, Any]:
        assert self.returncode == 0, (self.returncode, self.stdout, self.stderr)
        answer: dict[str, Any] = json.loads(self.stdout)["result"]
        return answer

    @property
    def error(self) -> dict[str, Any]:
        assert self.returncode != 0, self.stdout
        envelope: dict[str, Any] = json.loads(self.stderr.strip().splitlines()[-1])["error"]
        return envelope

    def tool_answer(self) -> dict[str, Any]:
        """The structured answer of a tool call that must succeed."""
        result = self.result
        assert result["isError"] is False, result["content"]
        answer: dict[str, Any] = result["structuredContent"]
        return answer


async def inspect(inspector: Path, home: Path, url: str, token: str | None, *arguments: str) -> Inspected:
    headers = ("--header", f"Authorization: Bearer {token}") if token else ()
    env = {
        **os.environ,
        "HOME": str(home),
        "MCP_CATALOG_PATH": str(home / "catalog.json"),
        "MCP_CLIENT_CONFIG_PATH": str(home / "client.json"),
    }
    process = await asyncio.create_subprocess_exec(
        str(inspector),
        "--cli",
        url,
        "--transport",
        "http",
        *headers,
        "--format",
        "json",
        "--stored-auth-only",
        *arguments,
        cwd=home,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), INSPECTOR_TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return Inspected(process.returncode, stdout.decode(), stderr.decode())


async def call_tool(inspector: Path, home: Path, url: str, tool: str, **arguments: str) -> Inspected:
    pairs = [f"{key}={value}" for key, value in arguments.items()]
    return await inspect(
        inspector,
        home,
        url,
        agent_token(),
        "--method",
        "tools/call",
        "--tool-name",
        tool,
        *(("--tool-arg", *pairs) if pairs else ()),
    )


async def test_the_inspector_lists_the_servers_tools(inspector, url, tmp_path):
    listed = (await inspect(inspector, tmp_path, url, agent_token(), "--method", "tools/list")).result["tools"]
    pinned = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    assert [tool["name"] for tool in listed] == [tool["name"] for tool in pinned]
    for seen, served in zip(listed, pinned, strict=True):
        assert (seen["title"], seen["inputSchema"]) == (served["title"], served["inputSchema"]), served["name"]


async def test_the_inspector_runs_seed_001s_loop_to_completed(pair, inspector, url, tmp_path):
    """Claim, attempt (blocked: no tests evidence), record the evidence, attempt
    again (allowed), complete as succeeded; then the double close that seed 001
    wants refused. Each step is its own Inspector process and session."""
    t = await fresh_task(pair)
    claimed = (await call_tool(inspector, tmp_path, url, "claim_task", taskId=t)).tool_answer()
    run_id = claimed["runId"]
    assert (claimed["taskId"], claimed["generation"], claimed["leaseEpoch"]) == (t, 1, 1)
    first = (
        await call_tool(inspector, tmp_path, url, "attempt_completion", runId=run_id, result="login fixed")
    ).tool_answer()
    assert (first["verdict"], first["nextAction"]) == ("soft_block", "record_evidence")
    assert first["missing"]["missingEvidenceKinds"] == ["tests"]
    evidence = (
        await call_tool(
            inspector,
            tmp_path,
            url,
            "record_evidence",
            runId=run_id,
            kind="tests",
            verdict="passed",
            details="42 passed",
        )
    ).tool_answer()
    assert (evidence["taskId"], evidence["kind"], evidence["verdict"]) == (t, "tests", "passed")
    allowed = (
        await call_tool(inspector, tmp_path, url, "attempt_completion", runId=run_id, result="login fixed")
    ).tool_answer()
    assert (allowed["verdict"], allowed["settlement"]) == ("allow", "settled")
    # --tool-arg coerces numbers: tokensTotal reaches the schema as an integer.
    closed = (
        await call_tool(
            inspector,
            tmp_path,
            url,
            "complete_task",
            runId=run_id,
            outcome="succeeded",
            tokensTotal="900",
            notes="login fixed",
        )
    ).tool_answer()
    assert (closed["runId"], closed["finalStatus"], closed["taskEffect"], closed["tokensTotal"]) == (
        run_id,
        "done",
        "done",
        900,
    )
    again = await call_tool(inspector, tmp_path, url, "complete_task", runId=run_id, outcome="succeeded")
    # A tool error: the result is printed, and the CLI exits 5 saying so.
    assert again.returncode == 5 and again.error["code"] == "tool_is_error", again.stderr
    refusal = json.loads(again.stdout)["result"]
    assert refusal["isError"] is True and "RUN_ALREADY_FINISHED" in refusal["content"][0]["text"]

    task = (
        await pair.lc.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id=t), timeout=CALL_TIMEOUT)
    ).task
    assert (
        task.outcome == lifecycle_enums.TERMINAL_OUTCOME_COMPLETED
        and task.work_status == lifecycle_enums.WORK_STATUS_DONE
    )
    assert task.completion_id == allowed["completionId"]
    run = (
        await pair.cs.GetRun(completion_messages.GetRunRequest(workspace_id=WS, run_id=run_id), timeout=CALL_TIMEOUT)
    ).run
    assert run.outcome == completion_enums.RUN_OUTCOME_SUCCEEDED and run.agent_id == AGENT and run.tokens_total == 900


@pytest.mark.parametrize(("era", "says"), [("legacy", "invalid_token"), ("modern", "HTTP 401")])
async def test_without_a_token_the_inspector_gets_the_401(pair, inspector, url, tmp_path, era, says):
    """The CLI's default era reports the 401's body (`invalid_token`), the
    2026-07-28 era names the status; either way it needs authorization
    (`auth_required`, exit 3) and no tool ran."""
    t = await fresh_task(pair)
    for arguments in (
        ("--method", "tools/list"),
        ("--method", "tools/call", "--tool-name", "claim_task", "--tool-arg", f"taskId={t}"),
    ):
        refused = await inspect(inspector, tmp_path, url, None, "--protocol-era", era, *arguments)
        assert refused.returncode == 3 and refused.stdout == "", (refused.stdout, refused.stderr)
        assert refused.error["code"] == "auth_required" and says in refused.error["message"], refused.stderr
    runs = await pair.cs.ListRuns(completion_messages.ListRunsRequest(workspace_id=WS, task_id=t), timeout=CALL_TIMEOUT)
    assert list(runs.runs) == []
