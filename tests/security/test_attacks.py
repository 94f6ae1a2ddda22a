"""The attacks of the trust-boundary issue, each as a test that now fails to do
harm: forged and back-dated settlements, cross-workspace reads, watches and
writes, squatted request ids, an agent acting on another agent's run, a held
database lock; plus attribution of callers and the request-id retention."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from funnel.auth.pki import COMPLETION_IDENTITY
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.grpc_errors import error_info
from tests import credentials
from tests.completion.e2e_support import eventually, stop_lifecycle_during_next_settlement
from tests.security.support import AGENT, OTHER_WS, WS

Code = grpc.StatusCode
T = 10.0
HOST = credentials.token("host-1", [f"{WS}:host"])
OPERATOR = credentials.token("operator-1", [f"{WS}:operator"])
FOREIGN_HOST = credentials.token("host-2", [f"{OTHER_WS}:host"])
AGENT_TOKEN = credentials.token(AGENT, [f"{WS}:agent"])
OTHER_AGENT = credentials.token("agent-2", [f"{WS}:agent"])


async def denied(call, code: Code, reason: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info(caught.value)
    assert (caught.value.code(), info.reason if info else None) == (code, reason), caught.value.details()
    return caught.value


async def story(funnel, task_id: str = "t-1"):
    """A registered task claimed by the agent: (host clients, agent clients, claim)."""
    host, agent = funnel.clients(HOST), funnel.clients(AGENT_TOKEN)
    await host.lc.RegisterTask(lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id=task_id), timeout=T)
    claim = await agent.cs.ClaimTask(
        completion_messages.ClaimTaskRequest(
            workspace_id=WS, task_id=task_id, agent_id=AGENT, lease_ttl=Duration(seconds=3600)
        ),
        timeout=T,
    )
    return host, agent, claim


def settle_request(task_id: str, authoritative_at: Timestamp) -> lifecycle_messages.SettleCompletionRequest:
    return lifecycle_messages.SettleCompletionRequest(
        workspace_id=WS, task_id=task_id, generation=1, completion_id="cmp_forged", authoritative_time=authoritative_at
    )


# -- forged settlements -------------------------------------------------------


@pytest.mark.parametrize("who", ["host", "operator", "foreign-operator", "agent"])
async def test_nobody_but_the_completion_service_can_settle_a_completion(secured, who):
    funnel = await secured()
    await story(funnel)
    token = {
        "host": HOST,
        "operator": OPERATOR,
        "agent": AGENT_TOKEN,
        "foreign-operator": credentials.token("op-2", [f"{OTHER_WS}:operator"]),
    }[who]
    forger = funnel.clients(token)
    back_dated = Timestamp(seconds=1)  # "long before any cancellation fence"
    before = funnel.snapshot()
    reason = "WORKSPACE_NOT_GRANTED" if who == "foreign-operator" else "ROLE_NOT_PERMITTED"
    error = await denied(
        forger.lc.SettleCompletion(settle_request("t-1", back_dated), timeout=T), Code.PERMISSION_DENIED, reason
    )
    if reason == "ROLE_NOT_PERMITTED":
        assert error_info(error).metadata["permitted_roles"] == "completion-service"
    await denied(
        forger.lc.SettleFailure(
            lifecycle_messages.SettleFailureRequest(workspace_id=WS, task_id="t-1", generation=1), timeout=T
        ),
        Code.PERMISSION_DENIED,
        reason,
    )
    assert funnel.snapshot() == before
    task = (
        await funnel.clients(HOST).lc.GetTask(
            lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id="t-1"), timeout=T
        )
    ).task
    assert (task.state, task.work_status) == (
        lifecycle_enums.GENERATION_STATE_ACTIVE,
        lifecycle_enums.WORK_STATUS_IN_PROGRESS,
    )


async def test_a_completion_reaches_done_only_through_the_completion_service(secured):
    funnel = await secured()
    _, agent, claim = await story(funnel)
    allowed = await agent.cs.AttemptCompletion(
        completion_messages.AttemptCompletionRequest(
            workspace_id=WS,
            task_id="t-1",
            run_id=claim.run.run_id,
            epoch=claim.lease.epoch,
            outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
            result="done",
        ),
        timeout=T,
    )
    assert allowed.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    events = (
        await funnel.clients(HOST).lc.ListLifecycleEvents(
            lifecycle_messages.ListLifecycleEventsRequest(workspace_id=WS, task_id="t-1"), timeout=T
        )
    ).events
    settled = events[-1]
    assert settled.intent == lifecycle_enums.INTENT_SETTLE_COMPLETION
    assert (settled.caller.subject, settled.caller.role) == (COMPLETION_IDENTITY, "completion-service")


# -- workspaces ---------------------------------------------------------------


async def test_another_workspace_cannot_read_watch_or_write_and_learns_nothing(secured):
    funnel = await secured()
    _, _, claim = await story(funnel)
    foreign = funnel.clients(FOREIGN_HOST)
    before = funnel.snapshot()
    # Reads: the same answer for a task that exists and one that does not.
    existing = await denied(
        foreign.lc.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id="t-1"), timeout=T),
        Code.PERMISSION_DENIED,
        "WORKSPACE_NOT_GRANTED",
    )
    missing = await denied(
        foreign.lc.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id="no-such"), timeout=T),
        Code.PERMISSION_DENIED,
        "WORKSPACE_NOT_GRANTED",
    )
    assert existing.details() == missing.details()
    assert dict(error_info(existing).metadata) == dict(error_info(missing).metadata) == {"workspace_id": WS}
    for call in (
        foreign.cs.GetRun(completion_messages.GetRunRequest(workspace_id=WS, run_id=claim.run.run_id), timeout=T),
        foreign.cs.ListAuditLog(completion_messages.ListAuditLogRequest(workspace_id=WS), timeout=T),
        foreign.ts.LoadTranscript(transcript_messages.LoadTranscriptRequest(workspace_id=WS, task_id="t-1"), timeout=T),
    ):
        await denied(call, Code.PERMISSION_DENIED, "WORKSPACE_NOT_GRANTED")
    # Watches: no event of the foreign workspace is ever delivered.
    for watch in (
        foreign.lc.WatchLifecycleEvents(lifecycle_messages.WatchLifecycleEventsRequest(workspace_id=WS), timeout=T),
        foreign.cs.WatchCompletionEvents(completion_messages.WatchCompletionEventsRequest(workspace_id=WS), timeout=T),
    ):
        await denied(watch.read(), Code.PERMISSION_DENIED, "WORKSPACE_NOT_GRANTED")
    # Writes: evidence, a failure, a registration.
    await denied(
        foreign.cs.RecordEvidence(
            completion_messages.RecordEvidenceRequest(
                workspace_id=WS,
                task_id="t-1",
                generation=1,
                kind="tests",
                verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
            ),
            timeout=T,
        ),
        Code.PERMISSION_DENIED,
        "WORKSPACE_NOT_GRANTED",
    )
    await denied(
        foreign.lc.SettleFailure(
            lifecycle_messages.SettleFailureRequest(workspace_id=WS, task_id="t-1", generation=1), timeout=T
        ),
        Code.PERMISSION_DENIED,
        "WORKSPACE_NOT_GRANTED",
    )
    await denied(
        foreign.lc.RegisterTask(lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id="planted"), timeout=T),
        Code.PERMISSION_DENIED,
        "WORKSPACE_NOT_GRANTED",
    )
    assert funnel.snapshot() == before


async def request_lines(caplog) -> list[dict]:
    """The request log's lines so far, once there is one: the server writes its
    line after the status went out, so the client can see the status first."""

    async def lines():
        return [r.fields for r in caplog.records if r.name == "funnel.request"]

    await eventually(lines, timeout=T)
    return await lines()


async def test_a_denied_call_is_logged_once_with_caller_method_and_reason(secured, caplog):
    funnel = await secured()
    caplog.set_level(logging.WARNING, logger="funnel.request")
    foreign = funnel.clients(FOREIGN_HOST)
    await denied(
        foreign.lc.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id="t-1"), timeout=T),
        Code.PERMISSION_DENIED,
        "WORKSPACE_NOT_GRANTED",
    )
    [line] = await request_lines(caplog)
    assert (line["method"], line["code"], line["reason"]) == ("GetTask", "PERMISSION_DENIED", "WORKSPACE_NOT_GRANTED")
    assert (line["subject"], line["workspace"], line["task"]) == ("host-2", WS, "t-1")
    caplog.clear()
    await denied(
        funnel.clients(None).lc.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id="t-1"), timeout=T),
        Code.UNAUTHENTICATED,
        "CREDENTIALS_MISSING",
    )
    [line] = await request_lines(caplog)
    assert (line["method"], line["code"], line["reason"]) == ("GetTask", "UNAUTHENTICATED", "CREDENTIALS_MISSING")
    # Without a subject, the peer's address says who called.
    assert "subject" not in line and line["peer"].startswith("ipv")


# -- agents act for themselves ------------------------------------------------


async def test_an_agent_cannot_act_on_another_agents_run(secured):
    funnel = await secured()
    _, _, claim = await story(funnel)
    other = funnel.clients(OTHER_AGENT)
    run = claim.run
    before = funnel.snapshot()
    for call in (
        other.cs.RenewLease(
            completion_messages.RenewLeaseRequest(
                workspace_id=WS, run_id=run.run_id, epoch=claim.lease.epoch, lease_ttl=Duration(seconds=60)
            ),
            timeout=T,
        ),
        other.cs.CompleteRun(
            completion_messages.CompleteRunRequest(
                workspace_id=WS, run_id=run.run_id, outcome=completion_enums.RUN_OUTCOME_SUCCEEDED
            ),
            timeout=T,
        ),
        other.cs.AttemptCompletion(
            completion_messages.AttemptCompletionRequest(
                workspace_id=WS,
                task_id="t-1",
                run_id=run.run_id,
                epoch=claim.lease.epoch,
                outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
                result="mine now",
            ),
            timeout=T,
        ),
        other.cs.RecordEvidence(
            completion_messages.RecordEvidenceRequest(
                workspace_id=WS,
                task_id="t-1",
                generation=1,
                kind="tests",
                verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
                run_id=run.run_id,
            ),
            timeout=T,
        ),
        other.ts.AppendTranscript(
            transcript_messages.AppendTranscriptRequest(
                workspace_id=WS,
                task_id="t-1",
                events=[completion_types.SessionEvent(user_message=completion_types.UserMessage(text="x"))],
            ),
            timeout=T,
        ),
    ):
        await denied(call, Code.PERMISSION_DENIED, "RUN_NOT_HELD")
    # Evidence without a run is not vouched for by any agent.
    await denied(
        other.cs.RecordEvidence(
            completion_messages.RecordEvidenceRequest(
                workspace_id=WS,
                task_id="t-1",
                generation=1,
                kind="tests",
                verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
            ),
            timeout=T,
        ),
        Code.PERMISSION_DENIED,
        "RUN_NOT_HELD",
    )
    # And an agent claims only as itself.
    await denied(
        other.cs.ClaimTask(
            completion_messages.ClaimTaskRequest(
                workspace_id=WS, task_id="t-1", agent_id=AGENT, lease_ttl=Duration(seconds=60)
            ),
            timeout=T,
        ),
        Code.PERMISSION_DENIED,
        "AGENT_ID_MISMATCH",
    )
    assert funnel.snapshot() == before


# -- request ids ----------------------------------------------------------------


async def test_the_reopen_id_cannot_be_squatted(secured):
    funnel = await secured()
    host, agent, claim = await story(funnel, "s1")
    # The attack: a junk task registered under the completion service's reopen id of s1.
    await host.lc.RegisterTask(
        lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id="junk", request_id="reopen:s1:2"), timeout=T
    )
    done = await agent.cs.AttemptCompletion(
        completion_messages.AttemptCompletionRequest(
            workspace_id=WS,
            task_id="s1",
            run_id=claim.run.run_id,
            epoch=claim.lease.epoch,
            outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
            result="done",
        ),
        timeout=T,
    )
    assert done.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    reopened = await host.ts.AppendTranscript(
        transcript_messages.AppendTranscriptRequest(
            workspace_id=WS,
            task_id="s1",
            events=[completion_types.SessionEvent(user_feedback=completion_types.UserFeedback(text="not quite"))],
        ),
        timeout=T,
    )
    assert (reopened.resumed, reopened.generation) == (True, 2)
    task = (await host.lc.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id="s1"), timeout=T)).task
    assert (task.generation, task.state) == (2, lifecycle_enums.GENERATION_STATE_ACTIVE)


async def test_the_cancel_request_id_cannot_be_squatted(secured):
    funnel = await secured()
    host, agent, claim = await story(funnel)
    run_id = claim.run.run_id
    for method, request in (
        (
            "RegisterTask",
            lifecycle_messages.RegisterTaskRequest(
                workspace_id=WS, task_id="junk", request_id=f"{run_id}:cancel-request"
            ),
        ),
        (
            "RequestCancellation",
            lifecycle_messages.RequestCancellationRequest(
                workspace_id=WS, task_id="junk", generation=1, request_id=f"{run_id}:cancel-request"
            ),
        ),
    ):
        await getattr(host.lc, method)(request, timeout=T)
    closed = await agent.cs.CompleteRun(
        completion_messages.CompleteRunRequest(
            workspace_id=WS, run_id=run_id, outcome=completion_enums.RUN_OUTCOME_CANCELLED
        ),
        timeout=T,
    )
    assert closed.final_status == completion_enums.FINAL_STATUS_CANCELLED
    task = (await host.lc.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id="t-1"), timeout=T)).task
    assert (task.state, task.outcome) == (
        lifecycle_enums.GENERATION_STATE_TERMINAL,
        lifecycle_enums.TERMINAL_OUTCOME_CANCELLED,
    )


async def test_the_settle_id_of_a_pending_completion_cannot_be_squatted(secured):
    funnel = await secured()
    host, agent, claim = await story(funnel)
    f = funnel.f
    stop_lifecycle_during_next_settlement(f)
    pending = await agent.cs.AttemptCompletion(
        completion_messages.AttemptCompletionRequest(
            workspace_id=WS,
            task_id="t-1",
            run_id=claim.run.run_id,
            epoch=claim.lease.epoch,
            outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
            result="done",
        ),
        timeout=T,
    )
    assert pending.completion.settlement == completion_enums.SETTLEMENT_STATUS_PENDING
    completion_id = pending.completion.completion_id
    await f.start_lifecycle()
    host = funnel.clients(HOST)
    # The attack: the settlement's request id used first, by the host, for intents of its own.
    await host.lc.RegisterTask(
        lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id="junk", request_id=f"settle:{completion_id}"),
        timeout=T,
    )
    deadline = time.monotonic() + 30
    while True:  # the outbox settles it once its retry is due
        f.clock.advance(2_000_000)
        completion = (
            await host.cs.GetCompletion(
                completion_messages.GetCompletionRequest(workspace_id=WS, task_id="t-1", generation=1), timeout=T
            )
        ).completion
        if completion.settlement != completion_enums.SETTLEMENT_STATUS_PENDING or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    task = (await host.lc.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id="t-1"), timeout=T)).task
    assert (task.outcome, task.completion_id) == (lifecycle_enums.TERMINAL_OUTCOME_COMPLETED, completion_id)


async def test_request_ids_are_scoped_to_the_caller(secured):
    funnel = await secured()
    host, other_host = funnel.clients(HOST), funnel.clients(credentials.token("host-9", [f"{WS}:host"]))
    first = await host.lc.RegisterTask(
        lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id="a", request_id="r-1"), timeout=T
    )
    # Another caller's identical id is its own: a new request, not a replay of the first.
    second = await other_host.lc.RegisterTask(
        lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id="b", request_id="r-1"), timeout=T
    )
    assert (first.task.task_id, second.task.task_id) == ("a", "b")
    assert (
        await host.lc.RegisterTask(
            lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id="a", request_id="r-1"), timeout=T
        )
    ) == first


async def test_request_ids_are_forgotten_after_the_retention(secured):
    funnel = await secured(
        lifecycle={"request_id_retention_seconds": 60.0}, completion={"request_id_retention_seconds": 60.0}
    )
    host = funnel.clients(HOST)
    request = lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id="a", request_id="r-1")
    first = await host.lc.RegisterTask(request, timeout=T)
    assert await host.lc.RegisterTask(request, timeout=T) == first  # within the retention: a replay
    funnel.f.clock.advance(61_000_000)
    deadline = time.monotonic() + 30
    while True:  # the sweeper runs every few seconds of real time
        db = sqlite3.connect(funnel.f.lifecycle_config.database)
        try:
            left = db.execute("SELECT count(*) FROM request_ids").fetchone()[0]
        finally:
            db.close()
        if left == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert left == 0
    # After the retention the same request is new: the task exists, so it is refused.
    await denied(host.lc.RegisterTask(request, timeout=T), Code.ALREADY_EXISTS, "TASK_ALREADY_EXISTS")


# -- attribution ----------------------------------------------------------------


async def test_events_and_audit_rows_record_the_authenticated_caller(secured):
    funnel = await secured()
    host, agent, claim = await story(funnel)
    await agent.cs.CompleteRun(
        completion_messages.CompleteRunRequest(
            workspace_id=WS, run_id=claim.run.run_id, outcome=completion_enums.RUN_OUTCOME_FAILED
        ),
        timeout=T,
    )
    events = (
        await host.lc.ListLifecycleEvents(
            lifecycle_messages.ListLifecycleEventsRequest(workspace_id=WS, task_id="t-1"), timeout=T
        )
    ).events
    callers = [(e.intent, e.caller.subject, e.caller.role) for e in events]
    assert callers == [
        (lifecycle_enums.INTENT_REGISTER_TASK, "host-1", "host"),
        (lifecycle_enums.INTENT_ACTIVATE_GENERATION, COMPLETION_IDENTITY, "completion-service"),
        (lifecycle_enums.INTENT_SET_WORK_STATUS, COMPLETION_IDENTITY, "completion-service"),
    ]
    [entry] = (await host.cs.ListAuditLog(completion_messages.ListAuditLogRequest(workspace_id=WS), timeout=T)).entries
    assert (entry.caller.subject, entry.caller.role) == (AGENT, "agent")


@pytest.mark.parametrize("who", ["host", "operator"])
async def test_a_transcript_that_reopens_a_task_names_its_caller_on_the_resume_event(secured, who):
    funnel = await secured()
    host, agent, claim = await story(funnel)
    await agent.cs.AttemptCompletion(
        completion_messages.AttemptCompletionRequest(
            workspace_id=WS,
            task_id="t-1",
            run_id=claim.run.run_id,
            epoch=claim.lease.epoch,
            outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
            result="done",
        ),
        timeout=T,
    )
    caller = funnel.clients({"host": HOST, "operator": OPERATOR}[who])
    reopened = await caller.ts.AppendTranscript(
        transcript_messages.AppendTranscriptRequest(
            workspace_id=WS,
            task_id="t-1",
            events=[completion_types.SessionEvent(user_feedback=completion_types.UserFeedback(text="not quite"))],
        ),
        timeout=T,
    )
    assert (reopened.resumed, reopened.generation) == (True, 2)
    events = (
        await host.lc.ListLifecycleEvents(
            lifecycle_messages.ListLifecycleEventsRequest(workspace_id=WS, task_id="t-1"), timeout=T
        )
    ).events
    resume = events[-1]
    assert resume.intent == lifecycle_enums.INTENT_RESUME_WITH_GENERATION
    assert (resume.caller.subject, resume.caller.role) == (f"{who}-1", who)
    # Submitted by the completion service, whose request id it stays.
    # (one per batch: the batch's own request id is hashed into it)
    assert resume.cause.source == "completion_service" and resume.request_id.startswith("reopen:t-1:2:")


async def test_only_the_completion_service_names_the_caller_of_a_resume(secured):
    funnel = await secured()
    host, agent, claim = await story(funnel)
    await agent.cs.AttemptCompletion(
        completion_messages.AttemptCompletionRequest(
            workspace_id=WS,
            task_id="t-1",
            run_id=claim.run.run_id,
            epoch=claim.lease.epoch,
            outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
            result="done",
        ),
        timeout=T,
    )
    before = funnel.snapshot()

    def resume(subject: str, role: str) -> lifecycle_messages.ResumeWithGenerationRequest:
        return lifecycle_messages.ResumeWithGenerationRequest(
            workspace_id=WS,
            task_id="t-1",
            generation=2,
            on_behalf_of=lifecycle_types.Caller(subject=subject, role=role),
        )

    error = await denied(
        host.lc.ResumeWithGeneration(resume("host-9", "host"), timeout=T), Code.PERMISSION_DENIED, "ROLE_NOT_PERMITTED"
    )
    assert error_info(error).metadata["permitted_roles"] == "completion-service"
    service = funnel.clients(credentials.token(COMPLETION_IDENTITY, []))
    for role in ("agent", "viewer", "completion-service"):
        error = await denied(
            service.lc.ResumeWithGeneration(resume("someone", role), timeout=T),
            Code.PERMISSION_DENIED,
            "ROLE_NOT_PERMITTED",
        )
        assert error_info(error).metadata["permitted_roles"] == "operator,host"
    await denied(
        service.lc.ResumeWithGeneration(resume("someone", "root"), timeout=T), Code.INVALID_ARGUMENT, "FIELD_MALFORMED"
    )
    await denied(
        service.lc.ResumeWithGeneration(resume("", "host"), timeout=T), Code.INVALID_ARGUMENT, "FIELD_REQUIRED"
    )
    assert funnel.snapshot() == before
    resumed = await service.lc.ResumeWithGeneration(resume("host-9", "host"), timeout=T)
    assert (resumed.event.caller.subject, resumed.event.caller.role) == ("host-9", "host")


# -- the database lock ------------------------------------------------------------


# Long enough that the service's margin before it (a quarter, up to a second) is its
# whole second: the answer's way back on a heavily loaded machine.
LOCKED_CALL_DEADLINE = 4.0


@pytest.mark.parametrize("service", ["lifecycle", "completion"])
async def test_a_held_database_lock_answers_unavailable_within_the_callers_deadline(secured, service):
    funnel = await secured()
    host, _agent, _claim = await story(funnel)
    path = funnel.f.lifecycle_config.database if service == "lifecycle" else funnel.f.completion_db

    def call():
        if service == "lifecycle":
            return host.lc.SetWorkStatus(
                lifecycle_messages.SetWorkStatusRequest(
                    workspace_id=WS,
                    task_id="t-1",
                    generation=1,
                    work_status=lifecycle_enums.WORK_STATUS_BLOCKED,
                    request_id="w-1",
                ),
                timeout=LOCKED_CALL_DEADLINE,
            )
        return host.cs.RecordEvidence(
            completion_messages.RecordEvidenceRequest(
                workspace_id=WS,
                task_id="t-1",
                generation=1,
                kind="tests",
                verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
                request_id="w-1",
            ),
            timeout=LOCKED_CALL_DEADLINE,
        )

    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        before = funnel.snapshot()
        started = time.monotonic()
        error = await denied(call(), Code.UNAVAILABLE, "STORAGE_UNAVAILABLE")
        elapsed = time.monotonic() - started
        # It waited for the lock, then answered UNAVAILABLE within the deadline (DEADLINE_EXCEEDED otherwise).
        assert elapsed > 1.0, elapsed
        assert "nothing was applied" in error.details()
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert funnel.snapshot() == before
    # The retry with the same request id applies it, once.
    first = await call()
    assert await call() == first
