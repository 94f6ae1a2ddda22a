"""`funnel mcp`: the MCP server. Each tool is one or two calls to the services
with the caller's token; the answers are mapped by `answers`, failures by
`failures`, request ids by `idempotency`, lease renewal by `leases`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, cast

import grpc
import jwt
from google.protobuf.duration_pb2 import Duration
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

from funnel.completion.v1 import completion_pb2 as cpb
from funnel.completion.v1 import completion_pb2_grpc
from funnel.lifecycle.v1 import lifecycle_pb2 as lpb
from funnel.lifecycle.v1 import lifecycle_pb2_grpc
from funnel.runtime.http import serve_asgi
from funnel_cli.connection import Connection
from funnel_mcp import answers
from funnel_mcp.failures import RETRYABLE, failure, unavailable
from funnel_mcp.holders import holder
from funnel_mcp.idempotency import CALL_ID_META_KEY, call_identity, request_id
from funnel_mcp.leases import PROCESS, HeldRun, LeaseKeeper
from funnel_mcp.rebinding import transport_security

log = logging.getLogger("funnel.mcp")

# Each attempt of a service call gets CALL_TIMEOUT; UNAVAILABLE and
# DEADLINE_EXCEEDED are retried with the same request id for RETRY_WINDOW.
CALL_TIMEOUT = 10.0
RETRY_WINDOW = 15.0

# stdio serves one connection per process: this names it in request ids.
PROCESS_CONNECTION = uuid.uuid4().hex

Response = TypeVar("Response")


@dataclass(frozen=True)
class Settings:
    workspace: str
    lifecycle_address: str
    completion_address: str
    # TLS material, and the configured token (None: Streamable HTTP callers bring theirs).
    connection: Connection
    # Re-read on every call, so a rotated token file takes effect without a restart.
    token_file: str | None = None
    agent_id: str | None = None
    lease_ttl: float = 120.0
    # A sessionless caller's run, and an HTTP session, count as abandoned after this (funnel_mcp.leases).
    session_idle_timeout: float = 120.0
    # Streamable HTTP instead of stdio.
    http: bool = False
    # Host and Origin headers answered besides the bound address's own (funnel_mcp.rebinding).
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()


class Door:
    """What the tools share while the server runs: the channels, the lease keeper."""

    def __init__(self, settings: Settings, keeper: LeaseKeeper, lifecycle: grpc.aio.Channel,
                 completion: grpc.aio.Channel) -> None:
        self.settings = settings
        self.keeper = keeper
        self.lifecycle = lifecycle_pb2_grpc.TaskLifecycleServiceStub(lifecycle)
        self.completion = completion_pb2_grpc.CompletionServiceStub(completion)

    # --- who calls -------------------------------------------------------------

    def configured_token(self) -> str | None:
        if self.settings.token_file:
            try:
                with open(self.settings.token_file, encoding="utf-8") as file:
                    return file.read().strip() or None
            except OSError as exc:
                raise ToolError(f"CREDENTIALS_MISSING: cannot read the token file: {exc.strerror}.") from None
        return self.settings.connection.token

    def token(self, ctx: Context) -> str:
        """Streamable HTTP: the request's own bearer token when it sends one; else
        the token this server was configured with."""
        if self.settings.http:
            header = (ctx.headers or {}).get("authorization", "")
            if header.lower().startswith("bearer ") and header[7:].strip():
                return header[7:].strip()
        token = self.configured_token()
        if not token:
            raise ToolError(
                "CREDENTIALS_MISSING (UNAUTHENTICATED): no bearer token for the services. "
                "Send `Authorization: Bearer <token>`, or the operator configures FUNNEL_TOKEN."
            )
        return token

    def agent_id(self, token: str) -> str:
        if self.settings.agent_id:
            return self.settings.agent_id
        try:
            # Not a verification (the services verify): the subject names the agent.
            subject = jwt.decode(token, options={"verify_signature": False}).get("sub")
        except jwt.InvalidTokenError:
            subject = None
        if not isinstance(subject, str) or not subject:
            raise ToolError("AGENT_ID_UNKNOWN: the token names no subject; the operator sets --agent-id.")
        return subject

    def holder(self, ctx: Context) -> str:
        return holder(ctx, self.keeper, self.settings.http)

    def request_id(self, ctx: Context, tool: str, arguments: dict[str, Any]) -> str:
        meta = ctx.request_context.meta or {}
        connection = (ctx.headers or {}).get("mcp-session-id") if self.settings.http else PROCESS_CONNECTION
        call = call_identity(meta.get(CALL_ID_META_KEY), connection, ctx.request_context.request_id)
        return "" if call is None else request_id(tool, self.settings.workspace, arguments, call)

    # --- calling the services ---------------------------------------------------

    async def call(self, rpc: Callable[..., Awaitable[Response]], request: Any, token: str, service: str) -> Response:
        """One RPC with the caller's token; a failure becomes a tool error."""
        metadata = (("authorization", f"Bearer {token}"),)
        deadline = time.monotonic() + RETRY_WINDOW
        delay = 0.1
        while True:
            try:
                return await rpc(request, timeout=CALL_TIMEOUT, metadata=metadata)
            except grpc.aio.AioRpcError as error:
                if error.code() not in RETRYABLE:
                    raise ToolError(failure(error).text()) from None
            if time.monotonic() + delay > deadline:
                raise ToolError(unavailable(service).text())
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def run(self, run_id: str, token: str, holder: str) -> cpb.Run:
        """The run (task, generation, epoch come from it); an open run with a live
        lease is renewed from now on for `holder`, even if another process of this
        server claimed it."""
        response = await self.call(
            self.completion.GetRun,
            cpb.GetRunRequest(workspace_id=self.settings.workspace, run_id=run_id),
            token,
            "completion_service",
        )
        run = response.run
        if not run.HasField("finish_time") and run.lease_expire_time.ToMicroseconds() > time.time() * 1_000_000:
            self.keeper.hold(HeldRun(self.settings.workspace, run.run_id, run.epoch, token), holder)
        return run

    async def renew(self, held: HeldRun) -> None:
        await self.completion.RenewLease(
            cpb.RenewLeaseRequest(
                workspace_id=held.workspace,
                run_id=held.run_id,
                epoch=held.epoch,
                lease_ttl=Duration(seconds=int(self.keeper.ttl)),
            ),
            timeout=CALL_TIMEOUT,
            metadata=(("authorization", f"Bearer {held.token}"),),
        )

    async def withdraw(self, held: HeldRun, why: str) -> None:
        """Closes the run of a holder that is gone as `stalled`: the task keeps its
        status and, its run closed, is claimable at once (docs/mcp.md, Leases)."""
        request = cpb.CompleteRunRequest(
            workspace_id=held.workspace,
            run_id=held.run_id,
            outcome=cpb.RUN_OUTCOME_STALLED,
            error=f"withdrawn by funnel mcp: {why}",
            request_id=request_id("withdraw", held.workspace, {"runId": held.run_id}, "withdraw"),
        )
        try:
            await self.call(self.completion.CompleteRun, request, held.token, "completion_service")
        except ToolError as failed:
            # Closed meanwhile, or the services refuse: the lease then lapses at its expiry.
            log.info("could not withdraw run %s: %s", held.run_id, failed)


def door(ctx: Context) -> Door:
    # The lifespan below yields the Door; the SDK types the context as a mapping.
    return cast(Door, ctx.request_context.lifespan_context)


# --- the tools ----------------------------------------------------------------

RunId = Annotated[str, Field(description="The runId that claim_task returned.", min_length=1, max_length=128)]
TaskId = Annotated[str, Field(description="The task's id in this workspace.", min_length=1, max_length=128)]


def tokens(what: str) -> Any:
    return Field(description=what, ge=0, le=2**53 - 1)


def prose(text: str) -> str:
    """A description as one paragraph (the constants below are wrapped for reading)."""
    return " ".join(text.split())

CLAIM_TASK = """Claim a task before working on it. Opens a run for you and gives you the task's
lease, which this server keeps alive while the run is open. Returns runId (pass it to every other
tool), the lease epoch and expiry, and the task generation. Fails with LEASE_HELD if another run
holds the task, GENERATION_TERMINAL if it is finished, CANCELLATION_REQUESTED if it was cancelled."""

COMPLETE_TASK = """Call once at the end of your session to close your run. Records the outcome, token
counts (tokensTotal is kept as given; if omitted, tokensInput + tokensOutput) and notes (cut at 2000
characters). The task's status follows: succeeded -> done, but only if the completion gates allow it
(otherwise the run still closes and `decision` says what was missing); failed -> blocked; cancelled
-> the task is cancelled; stalled -> unchanged. finalStatus overrides the status, except that done
is reached only through an allowed, settled completion. Closing a run twice is an error
(RUN_ALREADY_FINISHED). Returns runId, finishedAt, finalStatus (the task's real status) and
tokensTotal."""

RECORD_EVIDENCE = """Record one fact that supports completing the task, e.g. that the tests passed
(kind "tests", verdict passed). Evidence counts only at the checkpoint it names: pass the
evidenceCheckpoint that attempt_completion reported as missing, or none when it reported null.
For each kind the latest fact counts, so record a new one after fixing a failure."""

ATTEMPT_COMPLETION = """Ask whether the task may be completed now, with a summary of what was
achieved as result. Returns the binding decision: verdict (allow, soft_block, hard_block), the single
nextAction to take, a one-line instruction, the actions forbidden now, and on a block `missing`: the
evidence kinds and checkpoint, open tool calls, open child tasks, the run holding the lease. Report
the task as complete only when nextAction is report_complete (the completion is then settled);
after a soft block, do what nextAction says and attempt again."""

GET_TASK = """Read the task's lifecycle truth: its state (registered, active, suspended, terminal),
generation, terminal outcome, whether cancellation was requested (then stop working), its backlog
status and the attached child tasks still open. This is the authority on whether the task is
finished; a tool's success is not."""


def build(settings: Settings) -> MCPServer[Door]:
    @contextlib.asynccontextmanager
    async def lifespan(server: MCPServer[Door]) -> AsyncIterator[Door]:
        connection = settings.connection
        lifecycle = connection.channel(settings.lifecycle_address)
        completion = connection.channel(settings.completion_address)
        try:
            shared: list[Door] = []
            async with LeaseKeeper(lambda held: shared[0].renew(held), lambda held, why: shared[0].withdraw(held, why),
                                   settings.lease_ttl, settings.session_idle_timeout) as keeper:
                shared.append(Door(settings, keeper, lifecycle, completion))
                try:
                    yield shared[0]
                finally:
                    # Over stdio the host closed the pipe (or the server stops): its runs go with it.
                    keeper.end(PROCESS, "the host closed its stdio connection")
        finally:
            await lifecycle.close()
            await completion.close()

    server: MCPServer[Door] = MCPServer(
        name="funnel",
        title="funnel: durable task completion",
        instructions=(
            f"Tools of workspace {settings.workspace!r}. Claim a task (claim_task), do the work, record "
            "evidence (record_evidence), ask attempt_completion until it says report_complete, then close "
            "the run with complete_task. get_task tells whether a task is really finished."
        ),
        lifespan=lifespan,
        # This server only forwards; the services log and rate-limit every call.
        log_level="WARNING",
    )

    @server.tool(
        description=prose(CLAIM_TASK),
        annotations=ToolAnnotations(title="Claim a task", read_only_hint=False, destructive_hint=False,
                                    idempotent_hint=False, open_world_hint=False),
    )
    async def claim_task(taskId: TaskId, ctx: Context) -> answers.ClaimedRun:
        service = door(ctx)
        token = service.token(ctx)
        response = await service.call(
            service.completion.ClaimTask,
            cpb.ClaimTaskRequest(
                workspace_id=settings.workspace,
                task_id=taskId,
                agent_id=service.agent_id(token),
                lease_ttl=Duration(seconds=int(settings.lease_ttl)),
                request_id=service.request_id(ctx, "claim_task", {"taskId": taskId}),
            ),
            token,
            "completion_service",
        )
        service.keeper.hold(HeldRun(settings.workspace, response.run.run_id, response.lease.epoch, token),
                            service.holder(ctx))
        return answers.claimed_run(response)

    @server.tool(
        description=prose(COMPLETE_TASK),
        annotations=ToolAnnotations(title="Close the run", read_only_hint=False, destructive_hint=True,
                                    idempotent_hint=False, open_world_hint=False),
    )
    async def complete_task(
        runId: RunId,
        outcome: Annotated[answers.RunOutcomeWord, Field(description="How the session ended.")],
        ctx: Context,
        tokensInput: Annotated[int | None, tokens("Input tokens the session used.")] = None,
        tokensOutput: Annotated[int | None, tokens("Output tokens the session used.")] = None,
        tokensTotal: Annotated[int | None, tokens(
            "The total as your model reports it; kept as given (else input + output).")] = None,
        notes: Annotated[str | None, Field(description="A summary of the session; cut at 2000 characters.",
                                           max_length=1_048_576)] = None,
        error: Annotated[str | None, Field(description="The failure message, if the run failed.",
                                           max_length=8192)] = None,
        finalStatus: Annotated[answers.FinalStatusWord | None,
                               Field(description="Override of the task's status; "
                                                 "done only through a settled completion.")] = None,
    ) -> answers.ClosedRun:
        service = door(ctx)
        token = service.token(ctx)
        arguments = {"runId": runId, "outcome": outcome, "tokensInput": tokensInput, "tokensOutput": tokensOutput,
                     "tokensTotal": tokensTotal, "notes": notes, "error": error, "finalStatus": finalStatus}
        request = cpb.CompleteRunRequest(
            workspace_id=settings.workspace,
            run_id=runId,
            outcome=answers.RUN_OUTCOMES[outcome],
            notes=notes or "",
            error=error or "",
            final_status=answers.FINAL_STATUSES[finalStatus] if finalStatus else cpb.FINAL_STATUS_UNSPECIFIED,
            request_id=service.request_id(ctx, "complete_task", arguments),
        )
        for field, value in (("tokens_input", tokensInput), ("tokens_output", tokensOutput),
                             ("tokens_total", tokensTotal)):
            if value is not None:
                setattr(request, field, value)
        try:
            response = await service.call(service.completion.CompleteRun, request, token, "completion_service")
        except ToolError as failed:
            if str(failed).startswith("RUN_ALREADY_FINISHED"):
                service.keeper.release(runId)
            raise
        service.keeper.release(runId)
        return answers.closed_run(response)

    @server.tool(
        description=prose(RECORD_EVIDENCE),
        annotations=ToolAnnotations(title="Record evidence", read_only_hint=False, destructive_hint=False,
                                    idempotent_hint=False, open_world_hint=False),
    )
    async def record_evidence(
        runId: RunId,
        kind: Annotated[str, Field(description='What was checked, e.g. "tests".', min_length=1, max_length=128)],
        verdict: Annotated[answers.EvidenceVerdictWord, Field(description="passed or failed.")],
        ctx: Context,
        checkpoint: Annotated[str | None, Field(description="The checkpoint the evidence is valid for.",
                                                max_length=128)] = None,
        details: Annotated[str | None, Field(description="What was run and what it showed.", max_length=8192)] = None,
    ) -> answers.RecordedEvidence:
        service = door(ctx)
        token = service.token(ctx)
        run = await service.run(runId, token, service.holder(ctx))
        arguments = {"runId": runId, "kind": kind, "verdict": verdict, "checkpoint": checkpoint, "details": details}
        response = await service.call(
            service.completion.RecordEvidence,
            cpb.RecordEvidenceRequest(
                workspace_id=settings.workspace,
                task_id=run.task_id,
                generation=run.generation,
                kind=kind,
                verdict=answers.EVIDENCE_VERDICTS[verdict],
                checkpoint=checkpoint or "",
                details=details or "",
                run_id=runId,
                request_id=service.request_id(ctx, "record_evidence", arguments),
            ),
            token,
            "completion_service",
        )
        return answers.recorded_evidence(response)

    @server.tool(
        description=prose(ATTEMPT_COMPLETION),
        annotations=ToolAnnotations(title="Attempt completion", read_only_hint=False, destructive_hint=True,
                                    idempotent_hint=False, open_world_hint=False),
    )
    async def attempt_completion(
        runId: RunId,
        result: Annotated[str, Field(description="What was achieved (or why it failed).", max_length=16384)],
        ctx: Context,
        outcome: Annotated[answers.RequestedOutcomeWord,
                           Field(description="completed, or failed to end the task as failed.")] = "completed",
        stateVersion: Annotated[int | None, Field(description="The transcript state version you evaluated, if known.",
                                                  ge=0, le=2**53 - 1)] = None,
    ) -> answers.AttemptAnswer:
        service = door(ctx)
        token = service.token(ctx)
        run = await service.run(runId, token, service.holder(ctx))
        arguments = {"runId": runId, "result": result, "outcome": outcome, "stateVersion": stateVersion}
        request = cpb.AttemptCompletionRequest(
            workspace_id=settings.workspace,
            task_id=run.task_id,
            run_id=runId,
            epoch=run.epoch,
            outcome=answers.REQUESTED_OUTCOMES[outcome],
            result=result,
            request_id=service.request_id(ctx, "attempt_completion", arguments),
        )
        if stateVersion is not None:
            request.state_version = stateVersion
        response = await service.call(service.completion.AttemptCompletion, request, token, "completion_service")
        return answers.attempt_answer(response)

    @server.tool(
        description=prose(GET_TASK),
        annotations=ToolAnnotations(title="Read the task", read_only_hint=True, destructive_hint=False,
                                    idempotent_hint=True, open_world_hint=False),
    )
    async def get_task(taskId: TaskId, ctx: Context) -> answers.TaskTruth:
        service = door(ctx)
        token = service.token(ctx)
        response = await service.call(
            service.lifecycle.GetTask,
            lpb.GetTaskRequest(workspace_id=settings.workspace, task_id=taskId),
            token,
            "lifecycle_service",
        )
        return answers.task_truth(response)

    return server


def serve_stdio(settings: Settings) -> None:
    asyncio.run(build(settings).run_stdio_async())


def serve_http(settings: Settings, host: str, port: int) -> None:
    security = transport_security(host, port, settings.allowed_hosts, settings.allowed_origins)
    server = build(settings)
    # What run_streamable_http_async does, with the request timeouts of funnel/runtime/http.py.
    app = server.streamable_http_app(host=host, transport_security=security,
                                     session_idle_timeout=settings.session_idle_timeout)
    asyncio.run(serve_asgi(app, host, port, log_level=server.settings.log_level.lower()))
