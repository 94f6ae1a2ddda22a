"""What the tools share while the server runs: the settings, the client of the
services (funnel.client), the lease keeper, and who each call acts as. Each
service call goes out with the caller's own token (`client`); a failure becomes
a tool error (`failures`)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import jwt
from mcp.server.mcpserver import Context

from funnel.auth import tokens
from funnel.client import FunnelClient, FunnelError, RetryPolicy
from funnel.client.connection import Connection
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types
from funnel_mcp.authorization import BearerVerifier, ResourceServer
from funnel_mcp.callers import Caller, workspace_of
from funnel_mcp.failures import RETRYABLE, Refused, failure, refusal, unavailable
from funnel_mcp.holders import holder
from funnel_mcp.idempotency import CALL_ID_META_KEY, call_identity, request_id
from funnel_mcp.leases import HeldRun, LeaseKeeper

log = logging.getLogger("funnel.mcp")

# Each attempt of a service call gets CALL_TIMEOUT; UNAVAILABLE and
# DEADLINE_EXCEEDED are retried with the same request id for RETRY_WINDOW: a
# model waits for the answer, so the bound is in time, not in calls. A
# RATE_LIMITED is not waited out here (max_retry_delay 0): the model reads it,
# with the advice to wait and repeat the call.
CALL_TIMEOUT = 10.0
RETRY_WINDOW = 15.0
RETRIES = RetryPolicy(
    attempts=None, initial_backoff=0.1, max_backoff=2.0, max_retry_delay=0.0, retried=RETRYABLE, window=RETRY_WINDOW
)
# A renewal is tried once: the lease keeper tries again itself while the lease
# lasts, and sees a holder's end between two tries.
RENEWAL = RetryPolicy(attempts=1)

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


def services(settings: Settings) -> FunnelClient:
    """The client of both services, with no token of its own: every call names
    its caller (Door.client). Make it inside the server's event loop."""
    return settings.connection.with_token(None).client(
        settings.lifecycle_address, settings.completion_address, timeout=CALL_TIMEOUT, retry=RETRIES
    )


class Door:
    def __init__(
        self, settings: Settings, keeper: LeaseKeeper, services: FunnelClient, bearer: BearerVerifier | None
    ) -> None:
        self.settings = settings
        self.keeper = keeper
        self.bearer = bearer
        self._services = services

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
            raise refusal(
                "CREDENTIALS_MISSING",
                "this server has no token for the services; the operator "
                "configures FUNNEL_TOKEN, --token or --token-file",
            )
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

    def request_id(self, ctx: Context[Any], tool: str, workspace: str, arguments: dict[str, Any]) -> str | None:
        """None: nothing names the call (funnel_mcp.idempotency, 3.)."""
        meta = ctx.request_context.meta or {}
        connection = (ctx.headers or {}).get("mcp-session-id") if self.settings.http else PROCESS_CONNECTION
        call = call_identity(meta.get(CALL_ID_META_KEY), connection, ctx.request_context.request_id)
        return None if call is None else request_id(tool, workspace, arguments, call)

    # --- calling the services ---------------------------------------------------

    def client(self, caller: Caller) -> FunnelClient:
        """The services, called with the caller's own token."""
        return self._services.as_caller(caller.token)

    async def call(self, service: str, reply: Awaitable[Response]) -> Response:
        """Awaits one call of `client` (retried there: RETRIES); a failure becomes
        a tool error, and one the retries gave up on says that `service` did not
        answer in time."""
        try:
            return await reply
        except FunnelError as error:
            if error.code in RETRYABLE:
                raise unavailable(service).refused() from None
            raise failure(error).refused() from None

    async def run(self, run_id: str, caller: Caller, holder: str) -> completion_types.Run:
        """The run (task, generation, epoch come from it); an open run with a live
        lease is renewed from now on for `holder`, even if another process of this
        server claimed it."""
        run = (await self.call("completion_service", self.client(caller).get_run(caller.workspace, run_id))).run
        if not run.HasField("finish_time") and run.lease_expire_time.ToMicroseconds() > time.time() * 1_000_000:
            self.keeper.hold(HeldRun(caller.workspace, run.run_id, run.epoch, caller.token), holder)
        return run

    async def renew(self, held: HeldRun) -> None:
        """Raises FunnelError for the keeper to judge (funnel_mcp.leases)."""
        await self._services.as_caller(held.token, retry=RENEWAL).renew_lease(
            held.workspace, held.run_id, held.epoch, lease_ttl=self.keeper.ttl
        )

    async def withdraw(self, held: HeldRun, why: str) -> None:
        """Closes the run of a holder that is gone as `stalled`: the task keeps its
        status and, its run closed, is claimable at once (docs/mcp.md, Leases)."""
        closing = self._services.as_caller(held.token).complete_run(
            held.workspace,
            held.run_id,
            completion_enums.RUN_OUTCOME_STALLED,
            error=f"withdrawn by funnel mcp: {why}",
            request_id=request_id("withdraw", held.workspace, {"runId": held.run_id}, "withdraw"),
        )
        try:
            await self.call("completion_service", closing)
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
