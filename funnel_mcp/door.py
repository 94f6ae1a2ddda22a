"""What the tools share while the server runs: the settings, the channels to the
services, the lease keeper, and who each call acts as. Each service call goes
out with the caller's own token; a failure becomes a tool error (`failures`)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import jwt
from google.protobuf.duration_pb2 import Duration
from mcp.server.mcpserver import Context

from funnel.auth import tokens
from funnel.client.connection import Connection
from funnel.completion.v1 import completion_pb2 as cpb
from funnel.completion.v1 import completion_pb2_grpc
from funnel.lifecycle.v1 import lifecycle_pb2_grpc
from funnel_mcp.authorization import BearerVerifier, ResourceServer
from funnel_mcp.callers import Caller, workspace_of
from funnel_mcp.failures import RETRYABLE, Refused, failure, refusal, unavailable
from funnel_mcp.holders import holder
from funnel_mcp.idempotency import CALL_ID_META_KEY, call_identity, request_id
from funnel_mcp.leases import HeldRun, LeaseKeeper

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
    # stdio: the workspace every tool acts in. Streamable HTTP: the one workspace
    # served, or None for the workspace each caller's token grants (funnel_mcp.callers).
    workspace: str | None
    lifecycle_address: str
    completion_address: str
    # TLS material, and the configured token (stdio only: HTTP callers bring theirs).
    connection: Connection
    # Re-read on every call, so a rotated token file takes effect without a restart.
    token_file: str | None = None
    agent_id: str | None = None
    lease_ttl: float = 120.0
    # A sessionless caller's run, and an HTTP session, count as abandoned after this (funnel_mcp.leases).
    session_idle_timeout: float = 120.0
    # Streamable HTTP instead of stdio: the OAuth resource server it is.
    resource: ResourceServer | None = None
    # Host and Origin headers answered besides the bound address's own (funnel_mcp.rebinding).
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()

    @property
    def http(self) -> bool:
        return self.resource is not None


class Door:
    def __init__(self, settings: Settings, keeper: LeaseKeeper, lifecycle: grpc.aio.Channel,
                 completion: grpc.aio.Channel, bearer: BearerVerifier | None) -> None:
        self.settings = settings
        self.keeper = keeper
        self.bearer = bearer
        self.lifecycle = lifecycle_pb2_grpc.TaskLifecycleServiceStub(lifecycle)
        self.completion = completion_pb2_grpc.CompletionServiceStub(completion)

    # --- who calls -------------------------------------------------------------

    def caller(self, ctx: Context[Any]) -> Caller:
        """Streamable HTTP: the request's own token, verified, in the workspace it
        grants. stdio: the configured token, in --workspace (the services verify it)."""
        if self.bearer is not None:
            try:
                token = tokens.bearer_token((ctx.headers or {}).items())
                principal = self.bearer.principal(token)
            except tokens.Unauthenticated as refused:  # expired since the HTTP layer checked it
                raise refusal(refused.problem.value, refused.message) from None
            return Caller(token, principal.subject, workspace_of(self.settings.workspace, principal))
        assert self.settings.workspace is not None, "stdio serves --workspace"
        configured = self.configured_token()
        if not configured:
            raise refusal("CREDENTIALS_MISSING", "this server has no token for the services; the operator "
                          "configures FUNNEL_TOKEN, --token or --token-file")
        return Caller(configured, unverified_subject(configured), self.settings.workspace)

    def configured_token(self) -> str | None:
        if self.settings.token_file:
            try:
                with open(self.settings.token_file, encoding="utf-8") as file:
                    return file.read().strip() or None
            except OSError as exc:
                raise refusal("CREDENTIALS_MISSING", f"cannot read the token file: {exc.strerror}") from None
        return self.settings.connection.token

    def agent_id(self, caller: Caller) -> str:
        agent_id = self.settings.agent_id or caller.subject
        if not agent_id:
            raise refusal("AGENT_ID_UNKNOWN", "the token names no subject; the operator sets --agent-id")
        return agent_id

    def holder(self, ctx: Context[Any]) -> str:
        return holder(ctx, self.keeper, self.settings.http)

    def request_id(self, ctx: Context[Any], tool: str, workspace: str, arguments: dict[str, Any]) -> str:
        meta = ctx.request_context.meta or {}
        connection = (ctx.headers or {}).get("mcp-session-id") if self.settings.http else PROCESS_CONNECTION
        call = call_identity(meta.get(CALL_ID_META_KEY), connection, ctx.request_context.request_id)
        return "" if call is None else request_id(tool, workspace, arguments, call)

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
                    raise failure(error).refused() from None
            if time.monotonic() + delay > deadline:
                raise unavailable(service).refused()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def run(self, run_id: str, caller: Caller, holder: str) -> cpb.Run:
        """The run (task, generation, epoch come from it); an open run with a live
        lease is renewed from now on for `holder`, even if another process of this
        server claimed it."""
        response = await self.call(
            self.completion.GetRun,
            cpb.GetRunRequest(workspace_id=caller.workspace, run_id=run_id),
            caller.token,
            "completion_service",
        )
        run = response.run
        if not run.HasField("finish_time") and run.lease_expire_time.ToMicroseconds() > time.time() * 1_000_000:
            self.keeper.hold(HeldRun(caller.workspace, run.run_id, run.epoch, caller.token), holder)
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
        except Refused as failed:
            # Closed meanwhile, or the services refuse: the lease then lapses at its expiry.
            log.info("could not withdraw run %s: %s", held.run_id, failed)


def unverified_subject(token: str) -> str | None:
    """The subject a stdio token names. Not a verification (the services verify)."""
    try:
        subject = jwt.decode(token, options={"verify_signature": False}).get("sub")
    except jwt.InvalidTokenError:
        return None
    return subject if isinstance(subject, str) and subject else None
