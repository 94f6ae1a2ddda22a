"""A lifecycle service that freezes (SIGSTOP: its sockets stay open, nothing answers)
as real processes: the completion service's keepalive notices, its lifecycle stream
ends instead of staying quietly open, attempts on tasks it had seen commit with
their settlement pending, and the outbox settles them once the lifecycle service
runs again."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from google.protobuf.duration_pb2 import Duration

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from tests.postgres import fresh_database
from tests.prometheus import scrape, value
from tests.replicas.cluster import Cluster

WS = "ws-frozen"
T = 10.0


async def until(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.1)


async def test_a_frozen_lifecycle_service_ends_the_stream_and_attempts_commit_pending(tmp_path):
    cluster = Cluster(tmp_path, await asyncio.to_thread(fresh_database), replicas=1)
    cluster.completions[0].arguments += ["--lifecycle-keepalive", "1", "--metrics-listen", "127.0.0.1:0"]
    cluster.start()
    lifecycle_pid = cluster.lifecycles[0].process.process.pid
    metrics = cluster.completions[0].process.metrics_url

    def streams_live() -> float:
        return value(scrape(metrics), "funnel_completion_lifecycle_streams_live") or 0

    try:
        lc, cs = cluster.lifecycle(0), cluster.completion(0)

        async def claimed(task_id: str) -> completion_messages.ClaimTaskResponse:
            await lc.RegisterTask(lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id=task_id), timeout=T)
            claim = await cs.ClaimTask(
                completion_messages.ClaimTaskRequest(
                    workspace_id=WS, task_id=task_id, agent_id="agent-1", lease_ttl=Duration(seconds=600)
                ),
                timeout=T,
            )
            await cs.RecordEvidence(
                completion_messages.RecordEvidenceRequest(
                    workspace_id=WS,
                    task_id=task_id,
                    generation=1,
                    kind="tests",
                    verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
                    run_id=claim.run.run_id,
                ),
                timeout=T,
            )
            return claim

        await claimed("opens-the-stream")
        await until(lambda: streams_live() == 1, "the workspace's stream is live")
        claim = await claimed("task-1")  # read while the stream is live: the projection holds it

        os.kill(lifecycle_pid, signal.SIGSTOP)
        await until(lambda: streams_live() == 0, "the keepalive ends the stream of the frozen service")
        answer = await cs.AttemptCompletion(
            completion_messages.AttemptCompletionRequest(
                workspace_id=WS,
                task_id="task-1",
                run_id=claim.run.run_id,
                epoch=claim.lease.epoch,
                outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
                result="done",
            ),
            timeout=30,
        )
        assert answer.decision.verdict == completion_enums.VERDICT_ALLOW
        assert answer.completion.settlement == completion_enums.SETTLEMENT_STATUS_PENDING

        os.kill(lifecycle_pid, signal.SIGCONT)

        async def settled() -> bool:
            completion = (
                await cs.GetCompletion(
                    completion_messages.GetCompletionRequest(workspace_id=WS, task_id="task-1", generation=1), timeout=T
                )
            ).completion
            return completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED

        deadline = time.monotonic() + 30
        while not await settled():
            assert time.monotonic() < deadline, "the outbox never settled the pending completion"
            await asyncio.sleep(0.2)
        task = (await lc.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id="task-1"), timeout=T)).task
        assert task.state == lifecycle_enums.GENERATION_STATE_TERMINAL
        await until(lambda: streams_live() == 1, "the stream is live again")
    finally:
        os.kill(lifecycle_pid, signal.SIGCONT)
        await cluster.stop()


@pytest.mark.parametrize("seconds", ["0.5", "0"])
def test_a_keepalive_under_a_second_is_refused(seconds):
    from completion_service.server import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--lifecycle-keepalive", seconds])
