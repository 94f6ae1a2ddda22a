"""`funnel mcp`: the MCP server, over stdio or Streamable HTTP. The tools
(`tools`) call the services through the `door`; over HTTP the server is an OAuth
resource server (`authorization`) that answers only its own names (`rebinding`).
It logs a start line and one line per tool call (`observe`)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp_types import CallToolResult, InputRequiredResult
from pydantic import ValidationError

from funnel.runtime.background import Background
from funnel.runtime.http import uvicorn_config
from funnel.runtime.logs import fields
from funnel.runtime.security import Reloader
from funnel_mcp import observe, tools
from funnel_mcp.authorization import BearerVerifier, auth_settings, publish_metadata
from funnel_mcp.door import Door, Settings, services
from funnel_mcp.failures import ARGUMENTS_INVALID, Refused, invalid_arguments
from funnel_mcp.leases import PROCESS, LeaseKeeper
from funnel_mcp.rebinding import transport_security

log = logging.getLogger("funnel.mcp")

VERSION = importlib.metadata.version("funnel")
# Seconds between checks of the JWKS file for a change (the services' default).
RELOAD_INTERVAL = 2.0
# Handlers the SDK registers whether or not there is anything to serve: without
# them no empty prompts or resources capability is advertised.
UNSERVED = ("prompts/list", "prompts/get", "resources/list", "resources/templates/list", "resources/read")


class FunnelServer(MCPServer[Door]):
    """The SDK's server, with each tool call resolved to its caller before the
    tool runs, logged when it ends, and its argument errors in plain words."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Door, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        assert context is not None, "the SDK passes the request's context"
        started = time.perf_counter()
        with observe.observed(name, arguments) as call:
            outcome = "INTERNAL"
            try:
                try:
                    call.caller = context.request_context.lifespan_context.caller(context)
                except Refused as refused:
                    raise ToolError(f"Error executing tool {name}: {refused}") from refused
                result = await super().call_tool(name, arguments, context)
                outcome = observe.OK
                return result
            except ToolError as error:
                cause = error.__cause__
                if isinstance(cause, ValidationError):
                    outcome = ARGUMENTS_INVALID
                    raise ToolError(invalid_arguments(name, cause)) from cause
                if isinstance(cause, Refused):
                    outcome = cause.reason
                elif not isinstance(error, UnexpectedToolError):
                    outcome = "TOOL_ERROR"  # e.g. an unknown tool
                raise
            except asyncio.CancelledError:
                outcome = "CANCELLED"
                raise
            finally:
                observe.finished(call, outcome, time.perf_counter() - started)


def build(settings: Settings, bearer: BearerVerifier | None = None) -> FunnelServer:
    @contextlib.asynccontextmanager
    async def lifespan(server: MCPServer[Door]) -> AsyncIterator[Door]:
        client = services(settings)
        background = Background("funnel-mcp")
        if bearer is not None:  # a rotated JWKS is used without a restart, as by the services
            background.add("jwks-reload", Reloader([bearer.key_set], RELOAD_INTERVAL).run_forever)
        background.start()
        try:
            shared: list[Door] = []
            async with LeaseKeeper(
                lambda held: shared[0].renew(held),
                lambda held, why: shared[0].withdraw(held, why),
                settings.lease_ttl,
                settings.session_idle_timeout,
            ) as keeper:
                shared.append(Door(settings, keeper, client, bearer))
                try:
                    yield shared[0]
                finally:
                    # Over stdio the host closed the pipe (or the server stops): its runs go with it.
                    keeper.end(PROCESS, "the host closed its stdio connection")
        finally:
            await background.stop()
            await client.close()

    where = f"workspace {settings.workspace!r}" if settings.workspace else "the workspace your credential grants"
    server = FunnelServer(
        name="funnel",
        title="funnel: durable task completion",
        version=VERSION,
        instructions=(
            f"Tools of {where}. Claim a task (claim_task), do the work, record evidence (record_evidence), ask "
            "attempt_completion until it says report_complete, then close the run with complete_task. get_task "
            "tells whether a task is really finished."
        ),
        lifespan=lifespan,
        token_verifier=bearer,
        auth=auth_settings(bearer.server) if bearer is not None else None,
        # Nothing changes the tool list: no subscriptions/listen (2026-07-28), so no listChanged.
        subscriptions=False,
        # This server only forwards; the services log and rate-limit every call.
        log_level="WARNING",
    )
    handlers = server._lowlevel_server._request_handlers  # the SDK has no switch for these
    for method in UNSERVED:
        handlers.pop(method, None)
    # The SDK's own info lines (a session opened, a tool failed) repeat the per-call line.
    logging.getLogger("mcp").setLevel(logging.WARNING)
    tools.register(server)
    return server


def announce(transport: str, settings: Settings, url: str | None = None) -> None:
    log.info(
        "funnel mcp %s serving %s",
        VERSION,
        url or transport,
        extra=fields(
            event="start",
            transport=transport,
            url=url,
            version=VERSION,
            workspace=settings.workspace,
            lifecycle=settings.lifecycle_address,
            completion=settings.completion_address,
            authorization_servers=list(settings.resource.authorization_servers) if settings.resource else None,
        ),
    )


def serve_stdio(settings: Settings) -> None:
    server = build(settings)
    announce("stdio", settings)
    asyncio.run(server.run_stdio_async())


class _Announcing(uvicorn.Server):
    """Logs the start line once the socket listens."""

    def __init__(self, config: uvicorn.Config, settings: Settings) -> None:
        super().__init__(config)
        self.settings = settings

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started:
            assert self.settings.resource is not None
            announce("streamable-http", self.settings, self.settings.resource.resource_url)


def serve_http(settings: Settings, host: str, port: int) -> None:
    """Raises funnel.auth.tokens.KeySetError when the JWKS file cannot be used."""
    assert settings.resource is not None, "Streamable HTTP serves as a resource server"
    server = build(settings, BearerVerifier(settings.resource))
    app = server.streamable_http_app(
        transport_security=transport_security(host, port, settings.allowed_hosts, settings.allowed_origins),
        session_idle_timeout=settings.session_idle_timeout,
        host=host,
    )
    publish_metadata(app, settings.resource)
    # The request timeouts of funnel/runtime/http.py. uvicorn's own lines go through
    # the JSON log (no log_config of its own); a request's line is the tool call's.
    config = uvicorn_config(app, host=host, port=port, log_config=None, log_level="warning", access_log=False)
    asyncio.run(_Announcing(config, settings).serve())
