"""Settlements due together go in one `SettleCompletions` call (issue 25), with real
service processes on each engine. The test makes them due together for certain: it
holds the lock the lifecycle service's commits need, so the first attempt's
`SettleCompletion` stays in flight while four more attempts commit their
completions behind it; released, the four go in one call, and every task ends
`COMPLETED` by its own completion, once."""

from __future__ import annotations

import asyncio

import pytest

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from tests.completion.e2e_support import eventually
from tests.lifecycle.grpc_support import Client
from tests.prometheus import scrape, value
from tests.reliability.test_shutdown import BACKENDS, WS, Agent, started_pair, until_in_flight, writes_held

pytestmark = pytest.mark.asyncio
T = 10.0
LIFECYCLE = "funnel.lifecycle.v1.TaskLifecycleService"


def handled(url: str, method: str) -> float:
    return (
        value(
            scrape(url),
            "grpc_server_handled_total",
            grpc_service=LIFECYCLE,
            grpc_method=method,
            grpc_type="unary",
            grpc_code="OK",
            reason="",
        )
        or 0
    )


async def committed(pair, count: int) -> bool:
    listing = await pair.cs.ListCompletions(
        completion_messages.ListCompletionsRequest(workspace_id=WS, page_size=100), timeout=T
    )
    return len(listing.completions) >= count


@pytest.mark.parametrize("backend", BACKENDS)
async def test_settlements_due_together_go_in_one_call_and_each_settles_its_own_task(tmp_path, backend):
    pair = await started_pair(tmp_path, backend)
    agent = Agent(pair)
    tasks = [f"b{n}" for n in range(5)]
    try:
        for task_id in tasks:
            await agent.claim(task_id)
            run_id, _ = agent.runs[task_id]
            await pair.cs.RecordEvidence(
                completion_messages.RecordEvidenceRequest(
                    workspace_id=WS,
                    task_id=task_id,
                    generation=1,
                    run_id=run_id,
                    kind="tests",
                    verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
                ),
                timeout=T,
            )
        url = pair.lifecycle.process.metrics_url
        with writes_held(pair.lifecycle):
            first = asyncio.ensure_future(agent.attempt(tasks[0]))
            await until_in_flight(pair.lifecycle, "SettleCompletion")
            rest = [asyncio.ensure_future(agent.attempt(task_id)) for task_id in tasks[1:]]
            await eventually(lambda: committed(pair, len(tasks)), timeout=T)
        answers = await asyncio.gather(first, *rest)
        assert all(a.decision.verdict == completion_enums.VERDICT_ALLOW for a in answers), answers
        lc = Client(pair.lc, WS)
        for task_id, answer in zip(tasks, answers, strict=True):
            task = await lc.eventually(task_id, lambda t: t.state == lifecycle_enums.GENERATION_STATE_TERMINAL)
            assert (task.outcome, task.completion_id) == (
                lifecycle_enums.TERMINAL_OUTCOME_COMPLETED,
                answer.completion.completion_id,
            )
        assert await asyncio.to_thread(handled, url, "SettleCompletions") == 1
        settled = await pair.cs.ListCompletions(
            completion_messages.ListCompletionsRequest(
                workspace_id=WS, settlement=completion_enums.SETTLEMENT_STATUS_SETTLED
            ),
            timeout=T,
        )
        assert sorted(c.task_id for c in settled.completions) == tasks
    finally:
        await pair.stop()
