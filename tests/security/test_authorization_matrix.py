"""The authorization matrix: every RPC of both services against every kind of
credential (none, expired, wrongly signed, for another audience, and each role,
including an operator of another workspace and the completion service), with the
status and reason each cell must get, against real servers. A denied call changes
nothing: both databases are compared, table by table, around every denial.

The expected cells are written out here, independently of funnel/auth/table.py:
the table is what the services enforce, this is what the issue asks for."""

from __future__ import annotations

import asyncio
import itertools

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from funnel.auth.table import TABLE
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.grpc_errors import error_info
from tests import credentials
from tests.security.support import AGENT, OTHER_WS, WS, credential_tokens

Code = grpc.StatusCode
TIMEOUT = 10.0
ROLES = ("viewer", "agent", "host", "operator", "completion-service")
# Who may call what. `agent` cells are for a run (lease) the agent holds.
ALLOWED: dict[str, set[str]] = {
    "RegisterTask": {"host", "operator"},
    "ActivateGeneration": {"host", "operator", "completion-service"},
    "SuspendGeneration": {"host", "operator"},
    "ResumeWithGeneration": {"host", "operator", "completion-service"},
    "RequestCancellation": {"host", "operator", "completion-service"},
    "SettleCancellation": {"host", "operator", "completion-service"},
    "SettleCompletion": {"completion-service"},
    "SettleCompletions": {"completion-service"},
    "SettleFailure": {"completion-service"},
    "SettleTimeout": {"host", "operator"},
    "PropagateParentTermination": {"operator"},
    "SetWorkStatus": {"host", "operator", "completion-service"},
    "GetTask": {"viewer", "agent", "host", "operator", "completion-service"},
    "ListTasks": {"viewer", "host", "operator", "completion-service"},
    "CountTasks": {"viewer", "host", "operator", "completion-service"},
    "ListLifecycleEvents": {"viewer", "agent", "host", "operator", "completion-service"},
    "WatchLifecycleEvents": {"viewer", "agent", "host", "operator", "completion-service"},
    "ClaimTask": {"agent", "host", "operator"},
    "RenewLease": {"agent", "host", "operator"},
    "CompleteRun": {"agent", "host", "operator"},
    "GetRun": {"viewer", "agent", "host", "operator"},
    "ListRuns": {"viewer", "host", "operator"},
    "RecordEvidence": {"agent", "host", "operator"},
    "ListEvidence": {"viewer", "host", "operator"},
    "AttemptCompletion": {"agent", "host", "operator"},
    "GetCompletion": {"viewer", "agent", "host", "operator"},
    "ListCompletions": {"viewer", "host", "operator"},
    "ListAuditLog": {"viewer", "host", "operator"},
    "ListCompletionEvents": {"viewer", "host", "operator"},
    "WatchCompletionEvents": {"viewer", "host", "operator"},
    "AppendTranscript": {"agent", "host", "operator"},
    "LoadTranscript": {"viewer", "agent", "host", "operator"},
    "ExportTranscript": {"viewer", "host", "operator"},
    "ImportTranscript": {"host", "operator"},
    "ResolveResume": {"viewer", "agent", "host", "operator"},
}
UNAUTHENTICATED = {
    "none": "CREDENTIALS_MISSING",
    "expired": "CREDENTIALS_EXPIRED",
    "wrong-signature": "CREDENTIALS_INVALID",
    "wrong-audience": "CREDENTIALS_INVALID",
}
LIFECYCLE = "funnel.lifecycle.v1.TaskLifecycleService"
SERVICE_OF = {rpc: ("lc" if f"/{LIFECYCLE}/{rpc}" in TABLE else "cs") for rpc in ALLOWED}


def expected(rpc: str, credential: str) -> tuple[Code, str] | None:
    """(code, reason) of a denial, or None where the call must pass the boundary."""
    if credential in UNAUTHENTICATED:
        return Code.UNAUTHENTICATED, UNAUTHENTICATED[credential]
    if credential == "foreign-operator":
        return Code.PERMISSION_DENIED, "WORKSPACE_NOT_GRANTED"
    if credential in ALLOWED[rpc]:
        return None
    return Code.PERMISSION_DENIED, "ROLE_NOT_PERMITTED"


def test_the_matrix_covers_every_rpc_of_both_services():
    from funnel.completion.v1 import completion_service_pb2, transcript_service_pb2
    from funnel.lifecycle.v1 import service_pb2 as lifecycle_service_pb2

    # Not gate_service.proto: `CompletionGate` is implemented by gates, not by these services.
    rpcs = {
        method.name
        for module in (lifecycle_service_pb2, completion_service_pb2, transcript_service_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert set(ALLOWED) == rpcs
    assert {path.rsplit("/", 1)[1] for path in TABLE} == rpcs
    # The enforced table grants exactly the cells written here.
    for path, rule in TABLE.items():
        assert {role.value for role in rule.roles} == ALLOWED[path.rsplit("/", 1)[1]], path


class World:
    """The state every cell's request refers to: in `ws-1`, task `t-1` claimed by
    the agent (its run holds the lease), task `t-2` registered; `ws-2` has a
    task `t-1` of its own."""

    def __init__(self, secured, superuser) -> None:
        self.secured = secured
        self.su = superuser
        self.serial = itertools.count(1)

    async def build(self, agent) -> World:
        for task_id, workspace in (("t-1", WS), ("t-2", WS), ("t-1", OTHER_WS), ("p-1", WS)):
            await self.su.lc.RegisterTask(
                lifecycle_messages.RegisterTaskRequest(workspace_id=workspace, task_id=task_id), timeout=TIMEOUT
            )
        claim = await agent.cs.ClaimTask(
            completion_messages.ClaimTaskRequest(
                workspace_id=WS, task_id="t-1", agent_id=AGENT, lease_ttl=Duration(seconds=3600)
            ),
            timeout=TIMEOUT,
        )
        self.run_id, self.epoch = claim.run.run_id, claim.lease.epoch
        await self.su.lc.ActivateGeneration(
            lifecycle_messages.ActivateGenerationRequest(workspace_id=WS, task_id="p-1", generation=1), timeout=TIMEOUT
        )
        await self.su.lc.RegisterTask(
            lifecycle_messages.RegisterTaskRequest(
                workspace_id=WS,
                task_id="c-1",
                parent=lifecycle_types.ParentLink(
                    task_id="p-1", generation=1, mode=lifecycle_enums.PARENT_LINK_MODE_ATTACHED
                ),
            ),
            timeout=TIMEOUT,
        )
        return self

    def fresh(self, prefix: str) -> str:
        return f"{prefix}-{next(self.serial)}"

    def request(self, rpc: str, credential: str):
        """A well-formed request of `rpc` in `ws-1` (the agent's own run where one is named)."""
        now = Timestamp()
        now.GetCurrentTime()
        plain = {"workspace_id": WS, "task_id": "t-1", "generation": 1}
        agent_id = AGENT if credential == "agent" else "agent-x"
        return {
            "RegisterTask": lambda: lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id=self.fresh("new")),
            "ActivateGeneration": lambda: lifecycle_messages.ActivateGenerationRequest(
                workspace_id=WS, task_id="t-2", generation=1
            ),
            "SuspendGeneration": lambda: lifecycle_messages.SuspendGenerationRequest(**plain),
            "ResumeWithGeneration": lambda: lifecycle_messages.ResumeWithGenerationRequest(**plain),
            "RequestCancellation": lambda: lifecycle_messages.RequestCancellationRequest(
                workspace_id=WS, task_id="t-2", generation=1
            ),
            "SettleCancellation": lambda: lifecycle_messages.SettleCancellationRequest(
                workspace_id=WS, task_id="t-2", generation=1
            ),
            "SettleCompletion": lambda: lifecycle_messages.SettleCompletionRequest(
                **plain, completion_id=self.fresh("cmp"), authoritative_time=now
            ),
            "SettleCompletions": lambda: lifecycle_messages.SettleCompletionsRequest(
                workspace_id=WS,
                items=[
                    lifecycle_messages.SettleCompletionRequest(
                        **plain, completion_id=self.fresh("cmp"), authoritative_time=now
                    )
                ],
            ),
            "SettleFailure": lambda: lifecycle_messages.SettleFailureRequest(**plain),
            "SettleTimeout": lambda: lifecycle_messages.SettleTimeoutRequest(**plain),
            "PropagateParentTermination": lambda: lifecycle_messages.PropagateParentTerminationRequest(
                workspace_id=WS, task_id="c-1", generation=1
            ),
            "SetWorkStatus": lambda: lifecycle_messages.SetWorkStatusRequest(
                **plain, work_status=lifecycle_enums.WORK_STATUS_BLOCKED
            ),
            "GetTask": lambda: lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id="t-1"),
            "ListTasks": lambda: lifecycle_messages.ListTasksRequest(workspace_id=WS),
            "CountTasks": lambda: lifecycle_messages.CountTasksRequest(workspace_id=WS),
            "ListLifecycleEvents": lambda: lifecycle_messages.ListLifecycleEventsRequest(
                workspace_id=WS, task_id="t-1"
            ),
            "WatchLifecycleEvents": lambda: lifecycle_messages.WatchLifecycleEventsRequest(workspace_id=WS),
            "ClaimTask": lambda: completion_messages.ClaimTaskRequest(
                workspace_id=WS, task_id="t-2", agent_id=agent_id, lease_ttl=Duration(seconds=60)
            ),
            "RenewLease": lambda: completion_messages.RenewLeaseRequest(
                workspace_id=WS, run_id=self.run_id, epoch=self.epoch, lease_ttl=Duration(seconds=3600)
            ),
            "CompleteRun": lambda: completion_messages.CompleteRunRequest(
                workspace_id=WS, run_id=self.run_id, outcome=completion_enums.RUN_OUTCOME_STALLED
            ),
            "GetRun": lambda: completion_messages.GetRunRequest(workspace_id=WS, run_id=self.run_id),
            "ListRuns": lambda: completion_messages.ListRunsRequest(workspace_id=WS),
            "RecordEvidence": lambda: completion_messages.RecordEvidenceRequest(
                workspace_id=WS,
                task_id="t-1",
                generation=1,
                kind="tests",
                verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
                run_id=self.run_id,
            ),
            "ListEvidence": lambda: completion_messages.ListEvidenceRequest(workspace_id=WS, task_id="t-1"),
            "AttemptCompletion": lambda: completion_messages.AttemptCompletionRequest(
                workspace_id=WS,
                task_id="t-1",
                run_id=self.run_id,
                epoch=self.epoch,
                outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
                result="done",
            ),
            "GetCompletion": lambda: completion_messages.GetCompletionRequest(
                workspace_id=WS, task_id="t-1", generation=1
            ),
            "ListCompletions": lambda: completion_messages.ListCompletionsRequest(workspace_id=WS),
            "ListAuditLog": lambda: completion_messages.ListAuditLogRequest(workspace_id=WS),
            "ListCompletionEvents": lambda: completion_messages.ListCompletionEventsRequest(workspace_id=WS),
            "WatchCompletionEvents": lambda: completion_messages.WatchCompletionEventsRequest(workspace_id=WS),
            "AppendTranscript": lambda: transcript_messages.AppendTranscriptRequest(
                workspace_id=WS,
                task_id="t-1",
                events=[completion_types.SessionEvent(user_message=completion_types.UserMessage(text="hi"))],
            ),
            "LoadTranscript": lambda: transcript_messages.LoadTranscriptRequest(workspace_id=WS, task_id="t-1"),
            "ExportTranscript": lambda: transcript_messages.ExportTranscriptRequest(workspace_id=WS, task_id="t-1"),
            "ImportTranscript": lambda: [
                transcript_messages.ImportTranscriptRequest(
                    target=transcript_messages.ImportTarget(workspace_id=WS, task_id="t-2")
                ),
                transcript_messages.ImportTranscriptRequest(jsonl_chunk=b""),
            ],
            "ResolveResume": lambda: transcript_messages.ResolveResumeRequest(workspace_id=WS, task_id="t-1"),
        }[rpc]()


async def invoke(clients, rpc: str, request) -> grpc.aio.AioRpcError | None:
    """Calls `rpc`; None when it answered (for streams: opened and sent its first
    message, or stayed open without error), else the error."""
    stub = (
        clients.lc
        if SERVICE_OF[rpc] == "lc"
        else (
            clients.ts
            if rpc in {"AppendTranscript", "LoadTranscript", "ExportTranscript", "ImportTranscript", "ResolveResume"}
            else clients.cs
        )
    )
    method = getattr(stub, rpc)
    try:
        if rpc in {"WatchLifecycleEvents", "WatchCompletionEvents", "ExportTranscript"}:
            call = method(request, timeout=TIMEOUT)
            try:
                async with asyncio.timeout(1.0):
                    await call.read()
            except TimeoutError:
                pass  # a watch with no backlog waits for events: it was admitted
            finally:
                call.cancel()
        elif rpc == "ImportTranscript":
            await method(iter(request), timeout=TIMEOUT)
        else:
            await method(request, timeout=TIMEOUT)
    except grpc.aio.AioRpcError as error:
        return error
    return None


@pytest.mark.parametrize("rpc", list(ALLOWED))
async def test_every_credential_gets_its_cell(secured, rpc):
    funnel = await secured()
    tokens = credential_tokens()
    superuser = funnel.clients(credentials.SUPERUSER)
    world = await World(funnel, superuser).build(funnel.clients(tokens["agent"]))
    domain = "funnel.lifecycle.v1" if SERVICE_OF[rpc] == "lc" else "funnel.completion.v1"
    cells = []
    for credential, token in tokens.items():
        want = expected(rpc, credential)
        before = funnel.snapshot() if want else None
        error = await invoke(funnel.clients(token), rpc, world.request(rpc, credential))
        if want is None:
            # Admitted: an answer, or a business error past the boundary.
            if error is not None:
                assert error.code() not in (Code.UNAUTHENTICATED, Code.PERMISSION_DENIED), (rpc, credential, error)
                assert error_info(error).reason not in ("RUN_NOT_HELD", "AGENT_ID_MISMATCH"), (rpc, credential)
            cells.append((credential, "admitted"))
            continue
        assert error is not None, f"{rpc} by {credential} was admitted"
        info = error_info(error)
        assert (error.code(), info.reason, info.domain) == (*want, domain), (rpc, credential, error.details())
        assert funnel.snapshot() == before, f"{rpc} by {credential} was denied but changed the database"
        cells.append((credential, info.reason))
    assert len(cells) == 10
