"""A refused call changes nothing (issue 21): every mutating RPC of both services,
each with the refusals a caller past the boundary can meet (an agent acting on
another agent's run or reopening a task, a stale or future generation, a fence, a
terminal generation, a wrong revision or state version, a reused request id, a
lifecycle refusal of what the call needs...), against real servers. Each refusal
is checked on the databases themselves: every row of every table of both, before
and after. (tests/security/test_authorization_matrix.py does the same for the
boundary's own denials.)"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from completion_service.api.jsonl import to_line
from funnel.auth.pki import COMPLETION_IDENTITY
from funnel.auth.table import LIFECYCLE, TABLE
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.grpc_errors import error_info
from tests import credentials
from tests.security.support import AGENT, WS
from tests.security.test_authorization_matrix import ALLOWED

Code = grpc.StatusCode
T = 10.0
TOKENS = {
    "host": credentials.token("host-1", [f"{WS}:host"]),
    "operator": credentials.token("operator-1", [f"{WS}:operator"]),
    "agent": credentials.token(AGENT, [f"{WS}:agent"]),
    "other-agent": credentials.token("agent-2", [f"{WS}:agent"]),
    "completion-service": credentials.token(COMPLETION_IDENTITY, []),
}
READS = {
    "GetTask",
    "ListTasks",
    "CountTasks",
    "ListLifecycleEvents",
    "WatchLifecycleEvents",
    "GetRun",
    "ListRuns",
    "ListEvidence",
    "GetCompletion",
    "ListCompletions",
    "ListAuditLog",
    "ListCompletionEvents",
    "WatchCompletionEvents",
    "ExportTranscript",
    "ResolveResume",
}
# LoadTranscript reads, but may write (the repair of an interrupted turn).
MUTATING = set(ALLOWED) - READS
TRANSCRIPT_RPCS = {"AppendTranscript", "LoadTranscript", "ImportTranscript"}


class World:
    """In `ws-1`: `held` claimed by the agent (live lease, one transcript event);
    `done` claimed by the agent and completed (its run still open and holding the
    lease); `free` registered; `fenced` claimed by agent-2, then its cancellation
    requested; `parent` active with the attached child `child` registered, then
    suspended; `stalled` claimed by the agent and closed STALLED."""

    def __init__(self, funnel) -> None:
        self.funnel = funnel
        self.clients = {name: funnel.clients(token) for name, token in TOKENS.items()}
        self.runs: dict[str, completion_messages.ClaimTaskResponse] = {}

    async def build(self) -> World:
        host, agent = self.clients["host"], self.clients["agent"]
        for task_id in ("held", "done", "free", "fenced", "parent", "stalled"):
            await host.lc.RegisterTask(
                lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id=task_id), timeout=T
            )
        for task_id, who in (("held", "agent"), ("done", "agent"), ("fenced", "other-agent"), ("stalled", "agent")):
            agent_id = AGENT if who == "agent" else "agent-2"
            self.runs[task_id] = await self.clients[who].cs.ClaimTask(
                completion_messages.ClaimTaskRequest(
                    workspace_id=WS, task_id=task_id, agent_id=agent_id, lease_ttl=Duration(seconds=3600)
                ),
                timeout=T,
            )
        await agent.ts.AppendTranscript(
            transcript_messages.AppendTranscriptRequest(
                workspace_id=WS,
                task_id="held",
                events=[completion_types.SessionEvent(user_message=completion_types.UserMessage(text="hi"))],
            ),
            timeout=T,
        )
        done = self.runs["done"]
        allowed = await agent.cs.AttemptCompletion(
            completion_messages.AttemptCompletionRequest(
                workspace_id=WS,
                task_id="done",
                run_id=done.run.run_id,
                epoch=done.lease.epoch,
                outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
                result="done",
            ),
            timeout=T,
        )
        assert allowed.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
        await host.lc.RequestCancellation(
            lifecycle_messages.RequestCancellationRequest(workspace_id=WS, task_id="fenced", generation=1), timeout=T
        )
        await host.lc.ActivateGeneration(
            lifecycle_messages.ActivateGenerationRequest(workspace_id=WS, task_id="parent", generation=1), timeout=T
        )
        await host.lc.RegisterTask(
            lifecycle_messages.RegisterTaskRequest(
                workspace_id=WS,
                task_id="child",
                parent=lifecycle_types.ParentLink(
                    task_id="parent", generation=1, mode=lifecycle_enums.PARENT_LINK_MODE_ATTACHED
                ),
            ),
            timeout=T,
        )
        await host.lc.SuspendGeneration(
            lifecycle_messages.SuspendGenerationRequest(workspace_id=WS, task_id="parent", generation=1), timeout=T
        )
        await agent.cs.CompleteRun(
            completion_messages.CompleteRunRequest(
                workspace_id=WS, run_id=self.runs["stalled"].run.run_id, outcome=completion_enums.RUN_OUTCOME_STALLED
            ),
            timeout=T,
        )
        return self

    def run(self, task_id: str) -> str:
        return self.runs[task_id].run.run_id

    def epoch(self, task_id: str) -> int:
        return self.runs[task_id].lease.epoch


def now() -> Timestamp:
    stamp = Timestamp()
    stamp.GetCurrentTime()
    return stamp


def feedback(text: str = "not quite") -> completion_types.SessionEvent:
    return completion_types.SessionEvent(user_feedback=completion_types.UserFeedback(text=text))


def append(
    task_id: str, *events: completion_types.SessionEvent, **fields: Any
) -> transcript_messages.AppendTranscriptRequest:
    return transcript_messages.AppendTranscriptRequest(workspace_id=WS, task_id=task_id, events=list(events), **fields)


def jsonl(*events: completion_types.SessionEvent) -> bytes:
    return b"".join(to_line(event) for event in events)


def import_of(task_id: str, data: bytes) -> list[transcript_messages.ImportTranscriptRequest]:
    return [
        transcript_messages.ImportTranscriptRequest(
            target=transcript_messages.ImportTarget(workspace_id=WS, task_id=task_id)
        ),
        transcript_messages.ImportTranscriptRequest(jsonl_chunk=data),
    ]


def imported(sequence: int, **body: Any) -> completion_types.SessionEvent:
    return completion_types.SessionEvent(sequence=sequence, generation=1, **body)


def on_behalf(subject: str, role: str) -> dict:
    """The field a resume names its caller with (built lazily: it is new in issue 21)."""
    return {"on_behalf_of": lifecycle_types.Caller(subject=subject, role=role)}


@dataclass(frozen=True)
class Refusal:
    name: str
    who: str
    rpc: str
    request: Callable[[World], Any]
    code: Code
    reason: str
    # A call that must succeed first (its effect is part of the state compared).
    prepare: Callable[[World], Awaitable[Any]] | None = None


def _lc(rpc: str, **fields: Any) -> Callable[[World], Any]:
    return lambda w: getattr(lifecycle_messages, f"{rpc}Request")(workspace_id=WS, **fields)


P = Code.FAILED_PRECONDITION
CASES = [
    # -- the lifecycle service ---------------------------------------------------
    Refusal(
        "existing task",
        "host",
        "RegisterTask",
        _lc("RegisterTask", task_id="free"),
        Code.ALREADY_EXISTS,
        "TASK_ALREADY_EXISTS",
    ),
    Refusal(
        "missing parent",
        "host",
        "RegisterTask",
        _lc(
            "RegisterTask",
            task_id="n-1",
            parent=lifecycle_types.ParentLink(
                task_id="nope", generation=1, mode=lifecycle_enums.PARENT_LINK_MODE_ATTACHED
            ),
        ),
        Code.NOT_FOUND,
        "PARENT_NOT_FOUND",
    ),
    Refusal(
        "terminal parent",
        "host",
        "RegisterTask",
        _lc(
            "RegisterTask",
            task_id="n-1",
            parent=lifecycle_types.ParentLink(
                task_id="done", generation=1, mode=lifecycle_enums.PARENT_LINK_MODE_ATTACHED
            ),
        ),
        P,
        "PARENT_TERMINAL",
    ),
    Refusal(
        "fenced parent",
        "host",
        "RegisterTask",
        _lc(
            "RegisterTask",
            task_id="n-1",
            parent=lifecycle_types.ParentLink(
                task_id="fenced", generation=1, mode=lifecycle_enums.PARENT_LINK_MODE_ATTACHED
            ),
        ),
        P,
        "PARENT_CANCELLATION_FENCED",
    ),
    Refusal(
        "revision of a missing task",
        "host",
        "RegisterTask",
        _lc("RegisterTask", task_id="n-1", expected_revision=3),
        Code.ABORTED,
        "REVISION_MISMATCH",
    ),
    Refusal(
        "request id reused",
        "host",
        "RegisterTask",
        _lc("RegisterTask", task_id="n-2", request_id="r-1"),
        Code.INVALID_ARGUMENT,
        "REQUEST_ID_REUSED",
        prepare=lambda w: w.clients["host"].lc.RegisterTask(
            lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id="n-1", request_id="r-1"), timeout=T
        ),
    ),
    Refusal(
        "active",
        "host",
        "ActivateGeneration",
        _lc("ActivateGeneration", task_id="held", generation=1),
        P,
        "INVALID_TRANSITION",
    ),
    Refusal(
        "fenced",
        "host",
        "ActivateGeneration",
        _lc("ActivateGeneration", task_id="fenced", generation=1),
        P,
        "CANCELLATION_FENCED",
    ),
    Refusal(
        "future generation",
        "host",
        "ActivateGeneration",
        _lc("ActivateGeneration", task_id="free", generation=2),
        P,
        "FUTURE_GENERATION",
    ),
    Refusal(
        "wrong revision",
        "host",
        "ActivateGeneration",
        _lc("ActivateGeneration", task_id="free", generation=1, expected_revision=9),
        Code.ABORTED,
        "REVISION_MISMATCH",
    ),
    Refusal(
        "suspended parent",
        "host",
        "ActivateGeneration",
        _lc("ActivateGeneration", task_id="child", generation=1),
        P,
        "PARENT_NOT_ACTIVE",
    ),
    Refusal(
        "unknown task",
        "host",
        "ActivateGeneration",
        _lc("ActivateGeneration", task_id="nope", generation=1),
        Code.NOT_FOUND,
        "TASK_NOT_FOUND",
    ),
    Refusal(
        "reserved status",
        "host",
        "ActivateGeneration",
        _lc("ActivateGeneration", task_id="free", generation=1, work_status=lifecycle_enums.WORK_STATUS_DONE),
        Code.INVALID_ARGUMENT,
        "WORK_STATUS_RESERVED",
    ),
    Refusal(
        "registered",
        "host",
        "SuspendGeneration",
        _lc("SuspendGeneration", task_id="free", generation=1),
        P,
        "INVALID_TRANSITION",
    ),
    Refusal(
        "fenced",
        "host",
        "SuspendGeneration",
        _lc("SuspendGeneration", task_id="fenced", generation=1),
        P,
        "CANCELLATION_FENCED",
    ),
    Refusal(
        "terminal",
        "host",
        "SuspendGeneration",
        _lc("SuspendGeneration", task_id="done", generation=1),
        P,
        "GENERATION_TERMINAL",
    ),
    Refusal(
        "active",
        "host",
        "ResumeWithGeneration",
        _lc("ResumeWithGeneration", task_id="held", generation=1),
        P,
        "INVALID_TRANSITION",
    ),
    Refusal(
        "terminal generation itself",
        "host",
        "ResumeWithGeneration",
        _lc("ResumeWithGeneration", task_id="done", generation=1),
        P,
        "GENERATION_TERMINAL",
    ),
    Refusal(
        "two generations on",
        "host",
        "ResumeWithGeneration",
        _lc("ResumeWithGeneration", task_id="done", generation=3),
        P,
        "FUTURE_GENERATION",
    ),
    Refusal(
        "a host naming another caller",
        "host",
        "ResumeWithGeneration",
        lambda w: lifecycle_messages.ResumeWithGenerationRequest(
            workspace_id=WS, task_id="done", generation=2, **on_behalf("host-9", "host")
        ),
        Code.PERMISSION_DENIED,
        "ROLE_NOT_PERMITTED",
    ),
    Refusal(
        "the completion service for an agent",
        "completion-service",
        "ResumeWithGeneration",
        lambda w: lifecycle_messages.ResumeWithGenerationRequest(
            workspace_id=WS, task_id="done", generation=2, **on_behalf(AGENT, "agent")
        ),
        Code.PERMISSION_DENIED,
        "ROLE_NOT_PERMITTED",
    ),
    Refusal(
        "already requested",
        "host",
        "RequestCancellation",
        _lc("RequestCancellation", task_id="fenced", generation=1),
        P,
        "CANCELLATION_ALREADY_REQUESTED",
    ),
    Refusal(
        "terminal",
        "host",
        "RequestCancellation",
        _lc("RequestCancellation", task_id="done", generation=1),
        P,
        "GENERATION_TERMINAL",
    ),
    Refusal(
        "not requested",
        "host",
        "SettleCancellation",
        _lc("SettleCancellation", task_id="held", generation=1),
        P,
        "CANCELLATION_NOT_REQUESTED",
    ),
    Refusal(
        "terminal",
        "host",
        "SettleCancellation",
        _lc("SettleCancellation", task_id="done", generation=1),
        P,
        "GENERATION_TERMINAL",
    ),
    Refusal(
        "fenced",
        "completion-service",
        "SettleCompletion",
        lambda w: lifecycle_messages.SettleCompletionRequest(
            workspace_id=WS, task_id="fenced", generation=1, completion_id="cmp-x", authoritative_time=now()
        ),
        P,
        "CANCELLATION_FENCED",
    ),
    Refusal(
        "another completion of a completed generation",
        "completion-service",
        "SettleCompletion",
        lambda w: lifecycle_messages.SettleCompletionRequest(
            workspace_id=WS, task_id="done", generation=1, completion_id="cmp-x", authoritative_time=now()
        ),
        P,
        "GENERATION_TERMINAL",
    ),
    Refusal(
        "future generation",
        "completion-service",
        "SettleCompletion",
        lambda w: lifecycle_messages.SettleCompletionRequest(
            workspace_id=WS, task_id="held", generation=2, completion_id="cmp-x", authoritative_time=now()
        ),
        P,
        "FUTURE_GENERATION",
    ),
    # A batch whose own fields are wrong applies none of its items, not even a valid one.
    Refusal(
        "an item of another workspace",
        "completion-service",
        "SettleCompletions",
        lambda w: lifecycle_messages.SettleCompletionsRequest(
            workspace_id=WS,
            items=[
                lifecycle_messages.SettleCompletionRequest(
                    workspace_id=WS, task_id="held", generation=1, completion_id="cmp-x", authoritative_time=now()
                ),
                lifecycle_messages.SettleCompletionRequest(
                    workspace_id="ws-2", task_id="held", generation=1, completion_id="cmp-y", authoritative_time=now()
                ),
            ],
        ),
        Code.INVALID_ARGUMENT,
        "FIELD_MALFORMED",
    ),
    Refusal(
        "fenced",
        "completion-service",
        "SettleFailure",
        _lc("SettleFailure", task_id="fenced", generation=1),
        P,
        "CANCELLATION_FENCED",
    ),
    Refusal(
        "terminal",
        "completion-service",
        "SettleFailure",
        _lc("SettleFailure", task_id="done", generation=1),
        P,
        "GENERATION_TERMINAL",
    ),
    Refusal(
        "fenced",
        "host",
        "SettleTimeout",
        _lc("SettleTimeout", task_id="fenced", generation=1),
        P,
        "CANCELLATION_FENCED",
    ),
    Refusal(
        "terminal",
        "host",
        "SettleTimeout",
        _lc("SettleTimeout", task_id="done", generation=1),
        P,
        "GENERATION_TERMINAL",
    ),
    Refusal(
        "no parent",
        "operator",
        "PropagateParentTermination",
        _lc("PropagateParentTermination", task_id="held", generation=1),
        P,
        "NOT_ATTACHED_CHILD",
    ),
    Refusal(
        "parent open",
        "operator",
        "PropagateParentTermination",
        _lc("PropagateParentTermination", task_id="child", generation=1),
        P,
        "PARENT_NOT_TERMINAL",
    ),
    Refusal(
        "fenced",
        "host",
        "SetWorkStatus",
        _lc("SetWorkStatus", task_id="fenced", generation=1, work_status=lifecycle_enums.WORK_STATUS_BLOCKED),
        P,
        "CANCELLATION_FENCED",
    ),
    Refusal(
        "terminal",
        "host",
        "SetWorkStatus",
        _lc("SetWorkStatus", task_id="done", generation=1, work_status=lifecycle_enums.WORK_STATUS_BLOCKED),
        P,
        "GENERATION_TERMINAL",
    ),
    Refusal(
        "reserved status",
        "host",
        "SetWorkStatus",
        _lc("SetWorkStatus", task_id="held", generation=1, work_status=lifecycle_enums.WORK_STATUS_DONE),
        Code.INVALID_ARGUMENT,
        "WORK_STATUS_RESERVED",
    ),
    # -- runs, evidence, completions ---------------------------------------------
    Refusal(
        "lease held",
        "other-agent",
        "ClaimTask",
        lambda w: completion_messages.ClaimTaskRequest(
            workspace_id=WS, task_id="held", agent_id="agent-2", lease_ttl=Duration(seconds=60)
        ),
        P,
        "LEASE_HELD",
    ),
    Refusal(
        "terminal",
        "agent",
        "ClaimTask",
        lambda w: completion_messages.ClaimTaskRequest(
            workspace_id=WS, task_id="done", agent_id=AGENT, lease_ttl=Duration(seconds=60)
        ),
        P,
        "GENERATION_TERMINAL",
    ),
    Refusal(
        "fenced",
        "agent",
        "ClaimTask",
        lambda w: completion_messages.ClaimTaskRequest(
            workspace_id=WS, task_id="fenced", agent_id=AGENT, lease_ttl=Duration(seconds=60)
        ),
        P,
        "CANCELLATION_REQUESTED",
    ),
    Refusal(
        "as another agent",
        "agent",
        "ClaimTask",
        lambda w: completion_messages.ClaimTaskRequest(
            workspace_id=WS, task_id="free", agent_id="agent-x", lease_ttl=Duration(seconds=60)
        ),
        Code.PERMISSION_DENIED,
        "AGENT_ID_MISMATCH",
    ),
    Refusal(
        "unknown task",
        "host",
        "ClaimTask",
        lambda w: completion_messages.ClaimTaskRequest(
            workspace_id=WS, task_id="nope", agent_id="agent-x", lease_ttl=Duration(seconds=60)
        ),
        Code.NOT_FOUND,
        "TASK_NOT_FOUND",
    ),
    Refusal(
        "the lifecycle refuses the activation",
        "host",
        "ClaimTask",
        lambda w: completion_messages.ClaimTaskRequest(
            workspace_id=WS, task_id="child", agent_id="agent-x", lease_ttl=Duration(seconds=60)
        ),
        P,
        "LIFECYCLE_REJECTED",
    ),
    Refusal(
        "another agent's run",
        "other-agent",
        "RenewLease",
        lambda w: completion_messages.RenewLeaseRequest(
            workspace_id=WS, run_id=w.run("held"), epoch=w.epoch("held"), lease_ttl=Duration(seconds=60)
        ),
        Code.PERMISSION_DENIED,
        "RUN_NOT_HELD",
    ),
    Refusal(
        "a superseded epoch",
        "agent",
        "RenewLease",
        lambda w: completion_messages.RenewLeaseRequest(
            workspace_id=WS, run_id=w.run("held"), epoch=w.epoch("held") + 1, lease_ttl=Duration(seconds=60)
        ),
        P,
        "LEASE_NOT_CURRENT",
    ),
    Refusal(
        "unknown run",
        "host",
        "RenewLease",
        lambda w: completion_messages.RenewLeaseRequest(
            workspace_id=WS, run_id="run-nope", epoch=1, lease_ttl=Duration(seconds=60)
        ),
        Code.NOT_FOUND,
        "RUN_NOT_FOUND",
    ),
    Refusal(
        "closed run",
        "agent",
        "RenewLease",
        lambda w: completion_messages.RenewLeaseRequest(
            workspace_id=WS, run_id=w.run("stalled"), epoch=w.epoch("stalled"), lease_ttl=Duration(seconds=60)
        ),
        P,
        "RUN_ALREADY_FINISHED",
    ),
    Refusal(
        "another agent's run",
        "other-agent",
        "CompleteRun",
        lambda w: completion_messages.CompleteRunRequest(
            workspace_id=WS, run_id=w.run("held"), outcome=completion_enums.RUN_OUTCOME_SUCCEEDED
        ),
        Code.PERMISSION_DENIED,
        "RUN_NOT_HELD",
    ),
    Refusal(
        "unknown run",
        "host",
        "CompleteRun",
        lambda w: completion_messages.CompleteRunRequest(
            workspace_id=WS, run_id="run-nope", outcome=completion_enums.RUN_OUTCOME_SUCCEEDED
        ),
        Code.NOT_FOUND,
        "RUN_NOT_FOUND",
    ),
    Refusal(
        "closed run",
        "agent",
        "CompleteRun",
        lambda w: completion_messages.CompleteRunRequest(
            workspace_id=WS, run_id=w.run("stalled"), outcome=completion_enums.RUN_OUTCOME_FAILED
        ),
        P,
        "RUN_ALREADY_FINISHED",
    ),
    Refusal(
        "a status for a terminal generation",
        "agent",
        "CompleteRun",
        lambda w: completion_messages.CompleteRunRequest(
            workspace_id=WS, run_id=w.run("done"), outcome=completion_enums.RUN_OUTCOME_FAILED
        ),
        P,
        "LIFECYCLE_REJECTED",
    ),
    Refusal(
        "another agent's run",
        "other-agent",
        "RecordEvidence",
        lambda w: completion_messages.RecordEvidenceRequest(
            workspace_id=WS,
            task_id="held",
            generation=1,
            kind="tests",
            verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
            run_id=w.run("held"),
        ),
        Code.PERMISSION_DENIED,
        "RUN_NOT_HELD",
    ),
    Refusal(
        "no run",
        "agent",
        "RecordEvidence",
        lambda w: completion_messages.RecordEvidenceRequest(
            workspace_id=WS,
            task_id="held",
            generation=1,
            kind="tests",
            verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
        ),
        Code.PERMISSION_DENIED,
        "RUN_NOT_HELD",
    ),
    Refusal(
        "another agent's run",
        "other-agent",
        "AttemptCompletion",
        lambda w: completion_messages.AttemptCompletionRequest(
            workspace_id=WS,
            task_id="held",
            run_id=w.run("held"),
            epoch=w.epoch("held"),
            outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
            result="mine",
        ),
        Code.PERMISSION_DENIED,
        "RUN_NOT_HELD",
    ),
    Refusal(
        "unknown run",
        "host",
        "AttemptCompletion",
        lambda w: completion_messages.AttemptCompletionRequest(
            workspace_id=WS,
            task_id="held",
            run_id="run-nope",
            epoch=1,
            outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
            result="done",
        ),
        Code.NOT_FOUND,
        "RUN_NOT_FOUND",
    ),
    Refusal(
        "a run of another task",
        "agent",
        "AttemptCompletion",
        lambda w: completion_messages.AttemptCompletionRequest(
            workspace_id=WS,
            task_id="free",
            run_id=w.run("held"),
            epoch=w.epoch("held"),
            outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
            result="done",
        ),
        Code.NOT_FOUND,
        "RUN_NOT_FOUND",
    ),
    Refusal(
        "another outcome for a completed generation",
        "agent",
        "AttemptCompletion",
        lambda w: completion_messages.AttemptCompletionRequest(
            workspace_id=WS,
            task_id="done",
            run_id=w.run("done"),
            epoch=w.epoch("done"),
            outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
            result="done",
            request_id="a-1",
        ),
        Code.INVALID_ARGUMENT,
        "REQUEST_ID_REUSED",
        prepare=lambda w: w.clients["agent"].cs.AttemptCompletion(
            completion_messages.AttemptCompletionRequest(
                workspace_id=WS,
                task_id="held",
                run_id=w.run("held"),
                epoch=w.epoch("held"),
                outcome=completion_enums.REQUESTED_OUTCOME_FAILED,
                result="gave up",
                request_id="a-1",
            ),
            timeout=T,
        ),
    ),
    # -- transcripts ----------------------------------------------------------------
    Refusal(
        "another agent's task",
        "other-agent",
        "AppendTranscript",
        lambda w: append("held", completion_types.SessionEvent(user_message=completion_types.UserMessage(text="x"))),
        Code.PERMISSION_DENIED,
        "RUN_NOT_HELD",
    ),
    Refusal(
        "plain event for a terminal generation",
        "host",
        "AppendTranscript",
        lambda w: append("done", completion_types.SessionEvent(user_message=completion_types.UserMessage(text="x"))),
        P,
        "GENERATION_TERMINAL",
    ),
    Refusal(
        "an agent that never held the task reopens it",
        "other-agent",
        "AppendTranscript",
        lambda w: append("done", feedback()),
        Code.PERMISSION_DENIED,
        "ROLE_NOT_PERMITTED",
    ),
    Refusal(
        "the agent holding the lease reopens it",
        "agent",
        "AppendTranscript",
        lambda w: append("done", feedback()),
        Code.PERMISSION_DENIED,
        "ROLE_NOT_PERMITTED",
    ),
    Refusal(
        "a reopening batch with a stale state version",
        "host",
        "AppendTranscript",
        lambda w: append("done", feedback(), expected_state_version=99),
        Code.ABORTED,
        "STATE_VERSION_MISMATCH",
    ),
    Refusal(
        "a reopening batch the grammar refuses",
        "host",
        "AppendTranscript",
        lambda w: append(
            "done", feedback(), completion_types.SessionEvent(tool_result=completion_types.ToolResult(call_id="c-9"))
        ),
        P,
        "TRANSCRIPT_GRAMMAR_VIOLATION",
    ),
    Refusal(
        "a stale state version",
        "host",
        "AppendTranscript",
        lambda w: append("held", feedback(), expected_state_version=99),
        Code.ABORTED,
        "STATE_VERSION_MISMATCH",
    ),
    Refusal(
        "unknown task",
        "host",
        "AppendTranscript",
        lambda w: append("nope", feedback()),
        Code.NOT_FOUND,
        "TASK_NOT_FOUND",
    ),
    Refusal(
        "unknown task",
        "host",
        "LoadTranscript",
        lambda w: transcript_messages.LoadTranscriptRequest(workspace_id=WS, task_id="nope"),
        Code.NOT_FOUND,
        "TASK_NOT_FOUND",
    ),
    Refusal(
        "malformed page token",
        "host",
        "LoadTranscript",
        lambda w: transcript_messages.LoadTranscriptRequest(workspace_id=WS, task_id="held", page_token="junk"),
        Code.INVALID_ARGUMENT,
        "FIELD_MALFORMED",
    ),
    Refusal(
        "a transcript exists",
        "host",
        "ImportTranscript",
        lambda w: import_of("held", jsonl(imported(1, user_message=completion_types.UserMessage(text="x")))),
        P,
        "TRANSCRIPT_NOT_EMPTY",
    ),
    Refusal(
        "damage before the last line",
        "host",
        "ImportTranscript",
        lambda w: import_of(
            "free",
            jsonl(imported(1, user_message=completion_types.UserMessage(text="x")))
            + b"{oops\n"
            + jsonl(imported(2, user_message=completion_types.UserMessage(text="y"))),
        ),
        Code.INVALID_ARGUMENT,
        "TRANSCRIPT_LINE_INVALID",
    ),
    Refusal(
        "a line the grammar refuses",
        "host",
        "ImportTranscript",
        lambda w: import_of(
            "free",
            jsonl(
                imported(1, user_message=completion_types.UserMessage(text="x")),
                imported(2, tool_result=completion_types.ToolResult(call_id="c-9")),
            ),
        ),
        P,
        "TRANSCRIPT_GRAMMAR_VIOLATION",
    ),
    Refusal(
        "unknown task", "host", "ImportTranscript", lambda w: import_of("nope", b""), Code.NOT_FOUND, "TASK_NOT_FOUND"
    ),
]


def test_every_mutating_rpc_has_refusals():
    assert {case.rpc for case in CASES} == MUTATING
    assert len({(case.rpc, case.name) for case in CASES}) == len(CASES)


async def call(clients, rpc: str, request) -> None:
    stub = clients.lc if f"/{LIFECYCLE}/{rpc}" in TABLE else clients.ts if rpc in TRANSCRIPT_RPCS else clients.cs
    if rpc == "ImportTranscript":
        await stub.ImportTranscript(iter(request), timeout=T)
    else:
        await getattr(stub, rpc)(request, timeout=T)


def changed_tables(before: tuple[dict, dict], after: tuple[dict, dict]) -> list[str]:
    pairs = (("lifecycle", before[0], after[0]), ("completion", before[1], after[1]))
    return [
        f"{db}.{table}"
        for db, old, new in pairs
        for table in sorted(set(old) | set(new))
        if old.get(table) != new.get(table)
    ]


@pytest.mark.parametrize("rpc", sorted(MUTATING))
async def test_a_refused_call_changes_nothing(secured, rpc):
    funnel = await secured()
    world = await World(funnel).build()
    problems = []
    for case in [c for c in CASES if c.rpc == rpc]:
        clients = world.clients[case.who]
        if case.prepare is not None:
            await case.prepare(world)
        before = funnel.snapshot()
        try:
            await call(clients, rpc, case.request(world))
        except grpc.aio.AioRpcError as error:
            info = error_info(error)
            got = (error.code(), info.reason if info else None)
            if got != (case.code, case.reason):
                problems.append(f"{case.name}: {got} ({error.details()}), expected {(case.code, case.reason)}")
        else:
            problems.append(f"{case.name}: admitted, expected {(case.code, case.reason)}")
        changed = changed_tables(before, funnel.snapshot())
        if changed:
            problems.append(f"{case.name}: refused but changed {changed}")
    assert not problems, "\n".join(problems)
