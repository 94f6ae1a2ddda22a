"""`funnel mcp` over stdio, as an agent host runs it: the official MCP SDK client
spawns the server, which calls both services (real processes, TLS, tokens).
Seed 001's contract for `complete_task`, the companion tools, errors as tool
results, lease renewal and idempotent retries."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import pytest

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from tests.mcp.support import (
    AGENT,
    CALL_TIMEOUT,
    FUNNEL,
    WS,
    agent_token,
    error_text,
    fresh_task,
    mcp_arguments,
    ok,
    stdio_client,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def get_run(pair, run_id: str, workspace: str = WS) -> completion_types.Run:
    response = await pair.cs.GetRun(
        completion_messages.GetRunRequest(workspace_id=workspace, run_id=run_id), timeout=CALL_TIMEOUT
    )
    return response.run


async def get_task(pair, task_id: str, workspace: str = WS) -> lifecycle_types.Task:
    response = await pair.lc.GetTask(
        lifecycle_messages.GetTaskRequest(workspace_id=workspace, task_id=task_id), timeout=CALL_TIMEOUT
    )
    return response.task


async def test_the_seed_loop_claim_then_complete_closes_the_run_row(pair):
    """Seed 001's manual check: claim_task -> do nothing -> complete_task, and the
    run row is closed with its outcome, tokens, notes and an audit row."""
    t = await fresh_task(pair)
    async with stdio_client(pair, agent_token()) as client:
        claimed = ok(await client.call_tool("claim_task", {"taskId": t}))
        assert claimed["taskId"] == t and claimed["generation"] == 1 and claimed["leaseEpoch"] == 1
        closed = ok(
            await client.call_tool(
                "complete_task",
                {
                    "runId": claimed["runId"],
                    "outcome": "stalled",
                    "tokensInput": 120,
                    "tokensOutput": 30,
                    "notes": "nothing done yet",
                },
            )
        )
    assert set(closed) >= {"runId", "finishedAt", "finalStatus", "tokensTotal"}
    assert closed["runId"] == claimed["runId"] and closed["tokensTotal"] == 150
    assert closed["finalStatus"] == "in_progress" and closed["taskEffect"] == "unchanged"
    run = await get_run(pair, claimed["runId"])
    assert run.HasField("finish_time") and run.outcome == completion_enums.RUN_OUTCOME_STALLED
    assert (run.agent_id, run.tokens_input, run.tokens_output, run.tokens_total) == (AGENT, 120, 30, 150)
    assert run.notes == "nothing done yet"
    audit = await pair.cs.ListAuditLog(
        completion_messages.ListAuditLogRequest(workspace_id=WS, run_id=claimed["runId"]), timeout=CALL_TIMEOUT
    )
    assert [row.action for row in audit.entries] == ["task.completed"]


async def test_the_whole_story_to_done_with_evidence(pair):
    t = await fresh_task(pair)
    async with stdio_client(pair, agent_token()) as client:
        run_id = ok(await client.call_tool("claim_task", {"taskId": t}))["runId"]
        first = ok(await client.call_tool("attempt_completion", {"runId": run_id, "result": "login fixed"}))
        assert (first["verdict"], first["nextAction"]) == ("soft_block", "record_evidence")
        assert "report_complete" in first["forbiddenActions"]
        assert first["missing"]["missingEvidenceKinds"] == ["tests"] and first["completionId"] is None
        evidence = ok(
            await client.call_tool(
                "record_evidence",
                {
                    "runId": run_id,
                    "kind": "tests",
                    "verdict": "passed",
                    "checkpoint": first["missing"]["evidenceCheckpoint"],
                    "details": "42 passed",
                },
            )
        )
        assert (evidence["taskId"], evidence["generation"], evidence["verdict"]) == (t, 1, "passed")
        allowed = ok(await client.call_tool("attempt_completion", {"runId": run_id, "result": "login fixed"}))
        assert (allowed["verdict"], allowed["nextAction"]) == ("allow", "report_complete")
        assert allowed["settlement"] == "settled" and allowed["completionId"] and allowed["missing"] is None
        closed = ok(
            await client.call_tool("complete_task", {"runId": run_id, "outcome": "succeeded", "tokensTotal": 900})
        )
        assert (closed["finalStatus"], closed["taskEffect"], closed["tokensTotal"]) == ("done", "done", 900)
        truth = ok(await client.call_tool("get_task", {"taskId": t}))
    assert truth["state"] == "terminal" and truth["terminalOutcome"] == "succeeded"
    assert truth["workStatus"] == "done" and truth["completionId"] == allowed["completionId"]
    task = await get_task(pair, t)
    assert (
        task.outcome == lifecycle_enums.TERMINAL_OUTCOME_COMPLETED
        and task.work_status == lifecycle_enums.WORK_STATUS_DONE
    )


async def test_succeeded_without_evidence_closes_the_run_but_the_task_stays_open(pair):
    t = await fresh_task(pair)
    async with stdio_client(pair, agent_token()) as client:
        run_id = ok(await client.call_tool("claim_task", {"taskId": t}))["runId"]
        closed = ok(
            await client.call_tool("complete_task", {"runId": run_id, "outcome": "succeeded", "finalStatus": "done"})
        )
    assert closed["finalStatus"] == "in_progress" and closed["taskEffect"] == "not_completed"
    assert closed["decision"]["missing"]["missingEvidenceKinds"] == ["tests"]
    assert closed["nextStep"].startswith("A new run finishes it: claim_task, record_evidence")
    assert (await get_task(pair, t)).state == lifecycle_enums.GENERATION_STATE_ACTIVE


async def test_a_second_close_is_a_tool_error_naming_run_already_finished(pair):
    t = await fresh_task(pair)
    async with stdio_client(pair, agent_token()) as client:
        run_id = ok(await client.call_tool("claim_task", {"taskId": t}))["runId"]
        first = ok(await client.call_tool("complete_task", {"runId": run_id, "outcome": "stalled"}))
        second = await client.call_tool("complete_task", {"runId": run_id, "outcome": "stalled"})
        again = await client.call_tool("complete_task", {"runId": run_id, "outcome": "failed", "notes": "retry"})
    for result in (second, again):
        text = error_text(result)
        assert "RUN_ALREADY_FINISHED" in text and "cannot be closed" in text
    run = await get_run(pair, run_id)
    assert run.outcome == completion_enums.RUN_OUTCOME_STALLED and run.notes == ""
    assert run.finish_time.ToJsonString().rstrip("Z").startswith(first["finishedAt"].rstrip("Z")[:19])


@pytest.mark.parametrize(
    ("tokens", "total"),
    [
        ({"tokensInput": 10, "tokensOutput": 20, "tokensTotal": 99}, 99),  # inconsistent: the agent's total wins
        ({"tokensInput": 10, "tokensOutput": 20}, 30),  # no total: input + output
        ({"tokensTotal": 7}, 7),
        ({}, 0),
    ],
)
async def test_token_semantics_of_the_seed(pair, tokens, total):
    t = await fresh_task(pair)
    async with stdio_client(pair, agent_token()) as client:
        run_id = ok(await client.call_tool("claim_task", {"taskId": t}))["runId"]
        closed = ok(await client.call_tool("complete_task", {"runId": run_id, "outcome": "stalled", **tokens}))
    assert closed["tokensTotal"] == total
    assert (await get_run(pair, run_id)).tokens_total == total


async def test_notes_over_2000_characters_are_capped_not_refused(pair):
    t = await fresh_task(pair)
    async with stdio_client(pair, agent_token()) as client:
        run_id = ok(await client.call_tool("claim_task", {"taskId": t}))["runId"]
        closed = ok(
            await client.call_tool("complete_task", {"runId": run_id, "outcome": "stalled", "notes": "n" * 5000})
        )
    assert closed["notesTruncated"] is True
    run = await get_run(pair, run_id)
    assert run.notes == "n" * 2000 and run.notes_truncated


@pytest.mark.parametrize(
    ("outcome", "status", "effect"),
    [
        ("failed", lifecycle_enums.WORK_STATUS_BLOCKED, "status_set"),
        ("stalled", lifecycle_enums.WORK_STATUS_IN_PROGRESS, "unchanged"),
    ],
)
async def test_failed_blocks_the_task_and_stalled_leaves_it(pair, outcome, status, effect):
    t = await fresh_task(pair)
    async with stdio_client(pair, agent_token()) as client:
        run_id = ok(await client.call_tool("claim_task", {"taskId": t}))["runId"]
        closed = ok(
            await client.call_tool(
                "complete_task",
                {"runId": run_id, "outcome": outcome, "error": "tests red" if outcome == "failed" else None},
            )
        )
    assert closed["taskEffect"] == effect
    task = await get_task(pair, t)
    assert task.work_status == status and task.state == lifecycle_enums.GENERATION_STATE_ACTIVE


async def test_a_foreign_run_is_a_tool_error_and_nothing_changes(pair):
    """Another agent's run in the workspace (RUN_NOT_HELD) and a run of another
    workspace (RUN_NOT_FOUND): every tool refuses, and neither run moves."""
    theirs = await fresh_task(pair)
    elsewhere = await fresh_task(pair, workspace="other")
    lease = {"lease_ttl": {"seconds": 600}}
    their_claim = await pair.cs.ClaimTask(
        completion_messages.ClaimTaskRequest(workspace_id=WS, task_id=theirs, agent_id="agent-8", **lease),
        timeout=CALL_TIMEOUT,
    )
    elsewhere_claim = await pair.cs.ClaimTask(
        completion_messages.ClaimTaskRequest(workspace_id="other", task_id=elsewhere, agent_id=AGENT, **lease),
        timeout=CALL_TIMEOUT,
    )
    before = (await get_run(pair, their_claim.run.run_id), await get_run(pair, elsewhere_claim.run.run_id, "other"))
    async with stdio_client(pair, agent_token()) as client:
        for run_id, reason in ((their_claim.run.run_id, "RUN_NOT_HELD"), (elsewhere_claim.run.run_id, "RUN_NOT_FOUND")):
            for tool, arguments in (
                ("complete_task", {"outcome": "succeeded", "finalStatus": "done"}),
                ("attempt_completion", {"result": "mine now"}),
                ("record_evidence", {"kind": "tests", "verdict": "passed"}),
            ):
                text = error_text(await client.call_tool(tool, {"runId": run_id, **arguments}))
                assert reason in text, (tool, text)
    after = (await get_run(pair, their_claim.run.run_id), await get_run(pair, elsewhere_claim.run.run_id, "other"))
    assert after == before
    assert not after[0].HasField("finish_time") and not after[1].HasField("finish_time")
    runs = await pair.cs.ListRuns(
        completion_messages.ListRunsRequest(workspace_id=WS, task_id=theirs), timeout=CALL_TIMEOUT
    )
    assert len(runs.runs) == 1


async def test_a_token_that_does_not_allow_the_call_is_a_tool_error(pair):
    t = await fresh_task(pair)
    async with stdio_client(pair, agent_token(role="viewer")) as client:
        claim = error_text(await client.call_tool("claim_task", {"taskId": t}))
        truth = ok(await client.call_tool("get_task", {"taskId": t}))
    assert "ROLE_NOT_PERMITTED (PERMISSION_DENIED)" in claim
    assert truth["state"] == "registered"
    async with stdio_client(pair, agent_token(workspace="other")) as client:
        text = error_text(await client.call_tool("get_task", {"taskId": t}))
    assert "WORKSPACE_NOT_GRANTED (PERMISSION_DENIED)" in text


async def test_malformed_arguments_are_refused_before_any_call(pair):
    t = await fresh_task(pair)
    async with stdio_client(pair, agent_token()) as client:
        run_id = ok(await client.call_tool("claim_task", {"taskId": t}))["runId"]
        for arguments in (
            {"runId": run_id, "outcome": "finished"},
            {"runId": run_id, "outcome": "stalled", "tokensTotal": -1},
            {"runId": run_id, "outcome": "stalled", "finalStatus": "archived"},
            {"outcome": "stalled"},
        ):
            assert error_text(await client.call_tool("complete_task", arguments))
        # Asked while the host is connected: closing the pipe withdraws the run.
        assert not (await get_run(pair, run_id)).HasField("finish_time")


async def test_the_server_renews_the_lease_while_the_run_is_open(pair):
    t = await fresh_task(pair)
    async with stdio_client(pair, agent_token(), "--lease-ttl", "3s") as client:
        claimed = ok(await client.call_tool("claim_task", {"taskId": t}))
        first_expiry = (await get_run(pair, claimed["runId"])).lease_expire_time.ToMicroseconds()
        await asyncio.sleep(4.5)  # longer than the lease: only renewals keep it
        run = await get_run(pair, claimed["runId"])
        assert run.lease_expire_time.ToMicroseconds() > first_expiry
        assert run.lease_expire_time.ToMicroseconds() > time.time() * 1_000_000
        answer = ok(await client.call_tool("attempt_completion", {"runId": claimed["runId"], "result": "x"}))
        assert answer["nextAction"] == "record_evidence"  # not a lost lease
        ok(await client.call_tool("complete_task", {"runId": claimed["runId"], "outcome": "stalled"}))
        closed_expiry = (await get_run(pair, claimed["runId"])).lease_expire_time.ToMicroseconds()
        await asyncio.sleep(1.5)
        assert (await get_run(pair, claimed["runId"])).lease_expire_time.ToMicroseconds() == closed_expiry


async def test_a_host_call_id_makes_a_retried_call_return_the_first_answer(pair):
    """A host that passes its own call id (`_meta` `io.funnel/callId`) gets the
    first answer for a resent call, even from another process of the server; a
    new call id is a new call. (The first process stays up: a host that closes
    its pipe takes its runs along.)"""
    t = await fresh_task(pair)
    meta = {"io.funnel/callId": "toolu_01"}
    async with stdio_client(pair, agent_token()) as first_process:
        first = ok(await first_process.call_tool("claim_task", {"taskId": t}, meta=meta))
        async with stdio_client(pair, agent_token()) as client:  # a new process
            again = ok(await client.call_tool("claim_task", {"taskId": t}, meta=meta))
            other = error_text(
                await client.call_tool("claim_task", {"taskId": t}, meta={"io.funnel/callId": "toolu_02"})
            )
            close = {"runId": first["runId"], "outcome": "stalled"}
            closed = ok(await client.call_tool("complete_task", close, meta={"io.funnel/callId": "toolu_03"}))
            resent = ok(await client.call_tool("complete_task", close, meta={"io.funnel/callId": "toolu_03"}))
            twice = error_text(await client.call_tool("complete_task", close, meta={"io.funnel/callId": "toolu_04"}))
    assert again == first and "LEASE_HELD" in other
    assert resent == closed and "RUN_ALREADY_FINISHED" in twice
    runs = await pair.cs.ListRuns(completion_messages.ListRunsRequest(workspace_id=WS, task_id=t), timeout=CALL_TIMEOUT)
    assert len(runs.runs) == 1


async def test_a_resent_json_rpc_request_returns_the_first_answer(pair):
    """Without a host call id, the JSON-RPC request id within the connection names
    the call: the same request sent twice claims once; a new request is a new claim."""
    t = await fresh_task(pair)
    process = subprocess.Popen(
        [str(FUNNEL), *mcp_arguments(pair)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"FUNNEL_TOKEN": agent_token()},
        text=True,
    )

    def send(message: dict) -> None:
        process.stdin.write(json.dumps(message) + "\n")
        process.stdin.flush()

    def answer(request_id: int) -> dict:
        while True:
            line = process.stdout.readline()
            assert line, process.stderr.read()
            message = json.loads(line)
            if message.get("id") == request_id:
                return message["result"]

    def exchange() -> tuple[dict, dict, dict]:
        send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"},
                },
            }
        )
        answer(1)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "claim_task", "arguments": {"taskId": t}},
        }
        send(call)
        first = answer(7)
        send(call)
        resent = answer(7)
        send({**call, "id": 8})
        return first, resent, answer(8)

    try:
        first, resent, new = await asyncio.wait_for(asyncio.to_thread(exchange), 60)
    finally:
        process.stdin.close()
        process.wait(timeout=10)
        process.stdout.close()
        process.stderr.close()
    assert not first.get("isError"), first
    assert resent["structuredContent"] == first["structuredContent"]
    assert new["isError"] and "LEASE_HELD" in new["content"][0]["text"]
