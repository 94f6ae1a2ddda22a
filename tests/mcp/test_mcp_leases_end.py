"""A run claimed through `funnel mcp` is renewed only while its holder lives: an
HTTP session that its client deletes, or that stays idle past
`--session-idle-timeout` (a killed client), a sessionless caller that stops
calling, and a stdio host that closes the pipe all give the task back at once:
the server closes the run `stalled` and another agent can claim.

The leases here are long (10 minutes) and every wait is bounded well below
that, so a lease that lapses by itself can never be what frees a task."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.runtime.grpc_errors import error_info
from tests.mcp.support import (
    CALL_TIMEOUT,
    WS,
    agent_token,
    fresh_task,
    http_client,
    http_server,
    ok,
    stdio_client,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

LEASE = ("--lease-ttl", "10m")
# A second agent gets the task within this many seconds, or the test fails (the
# idle timeouts below are 2 s; the bound is generous for a shared machine).
BOUND = 60.0
ROOT = Path(__file__).resolve().parents[2]


async def claim_when_free(pair, task_id: str) -> completion_messages.ClaimTaskResponse:
    """Another agent claims `task_id` as soon as no live lease holds it."""
    deadline = time.monotonic() + BOUND
    while True:
        try:
            return await pair.cs.ClaimTask(
                completion_messages.ClaimTaskRequest(
                    workspace_id=WS, task_id=task_id, agent_id="agent-8", lease_ttl=Duration(seconds=600)
                ),
                timeout=CALL_TIMEOUT,
            )
        except grpc.aio.AioRpcError as error:
            info = error_info(error)
            assert info is not None and info.reason == "LEASE_HELD", error
            assert time.monotonic() < deadline, f"the first run still holds the task after {BOUND} s"
            await asyncio.sleep(0.2)


async def run_row(pair, run_id: str) -> completion_types.Run:
    return (
        await pair.cs.GetRun(completion_messages.GetRunRequest(workspace_id=WS, run_id=run_id), timeout=CALL_TIMEOUT)
    ).run


async def assert_withdrawn(pair, run_id: str) -> None:
    run = await run_row(pair, run_id)
    assert run.HasField("finish_time") and run.outcome == completion_enums.RUN_OUTCOME_STALLED
    assert "funnel mcp" in run.error


def start_agent(url: str, task_id: str, mode: str) -> tuple[subprocess.Popen, dict]:
    """A separate client process that claims `task_id` and keeps its session open."""
    agent = subprocess.Popen(
        [sys.executable, "-m", "tests.mcp.http_agent", url, agent_token(), task_id, mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert agent.stdout is not None
    line = agent.stdout.readline()
    assert line, agent.communicate(timeout=10)
    return agent, json.loads(line)


def kill(agent: subprocess.Popen) -> None:
    """As a crash would: no DELETE, its connections just close."""
    agent.kill()
    agent.communicate(timeout=10)


@pytest.mark.parametrize("mode", ["legacy", "auto"], ids=["session", "sessionless"])
async def test_a_killed_http_client_frees_its_task_after_the_idle_timeout(pair, tmp_path, mode):
    """ "legacy": the SDK's session (GET stream, Mcp-Session-Id) is reaped once idle;
    "auto" (2026-07-28, no session): no call names the run for the idle timeout."""
    t = await fresh_task(pair)
    with http_server(pair, tmp_path / "mcp.log", *LEASE, "--session-idle-timeout", "2s") as url:
        agent, claimed = await asyncio.to_thread(start_agent, url, t, mode)
        try:
            assert claimed["taskId"] == t
        finally:
            await asyncio.to_thread(kill, agent)
        second = await claim_when_free(pair, t)
    assert second.run.run_id != claimed["runId"]
    await assert_withdrawn(pair, claimed["runId"])


async def test_an_http_session_its_client_deletes_frees_its_task_at_once(pair, tmp_path):
    t = await fresh_task(pair)
    # The idle timeout is far beyond the bound: only the DELETE can free the task.
    with http_server(pair, tmp_path / "mcp.log", *LEASE, "--session-idle-timeout", "30m") as url:
        async with http_client(url, agent_token(), mode="legacy") as client:
            claimed = ok(await client.call_tool("claim_task", {"taskId": t}))
        # Leaving the client sent DELETE for its session.
        await claim_when_free(pair, t)
    await assert_withdrawn(pair, claimed["runId"])


async def test_a_stdio_host_that_closes_the_pipe_frees_its_task_at_once(pair):
    t = await fresh_task(pair)
    async with stdio_client(pair, agent_token(), *LEASE) as client:
        claimed = ok(await client.call_tool("claim_task", {"taskId": t}))
    # Leaving the client closed the server's stdin (then waited for it to exit).
    await claim_when_free(pair, t)
    await assert_withdrawn(pair, claimed["runId"])


async def renewed_until(pair, run_id: str, seconds_past_claim: float) -> completion_types.Run:
    """Waits (bounded) until the run's lease was renewed at least `seconds_past_claim`
    after its claim, and returns the run as it is then."""
    deadline = time.monotonic() + BOUND
    while True:
        run = await run_row(pair, run_id)
        assert not run.HasField("finish_time"), "the run was closed while its holder lived"
        renewed = run.lease_expire_time.ToMicroseconds() - run.claim_time.ToMicroseconds() - 3_000_000
        if renewed >= seconds_past_claim * 1_000_000:
            return run
        assert time.monotonic() < deadline, "the lease was not renewed"
        await asyncio.sleep(0.2)


async def test_a_live_session_keeps_its_run_past_the_idle_timeout(pair, tmp_path):
    """A client whose session is open (its GET stream) is not idle, however long
    it goes without a call."""
    t = await fresh_task(pair)
    with http_server(pair, tmp_path / "mcp.log", "--lease-ttl", "3s", "--session-idle-timeout", "2s") as url:
        async with http_client(url, agent_token(), mode="legacy") as client:
            claimed = ok(await client.call_tool("claim_task", {"taskId": t}))
            await renewed_until(pair, claimed["runId"], 6)
            answer = ok(await client.call_tool("attempt_completion", {"runId": claimed["runId"], "result": "x"}))
            assert answer["nextAction"] == "record_evidence"


async def test_a_sessionless_caller_keeps_its_run_while_it_calls(pair, tmp_path):
    t = await fresh_task(pair)
    # Calls every second against a 6 s idle timeout: only a call that took over 5 s
    # on a loaded machine could let the run go.
    with http_server(pair, tmp_path / "mcp.log", "--lease-ttl", "3s", "--session-idle-timeout", "6s") as url:
        async with http_client(url, agent_token()) as client:
            claimed = ok(await client.call_tool("claim_task", {"taskId": t}))
            deadline = time.monotonic() + BOUND
            while True:
                ok(
                    await client.call_tool(
                        "record_evidence", {"runId": claimed["runId"], "kind": "lint", "verdict": "passed"}
                    )
                )
                run = await run_row(pair, claimed["runId"])
                assert not run.HasField("finish_time")
                if run.lease_expire_time.ToMicroseconds() - run.claim_time.ToMicroseconds() >= 15_000_000:
                    break  # renewed well past the idle timeout since the claim
                assert time.monotonic() < deadline, "the lease was not renewed"
                await asyncio.sleep(1)
