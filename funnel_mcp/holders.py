"""Which holder (funnel_mcp.leases) a tool call acts for, and how the end of a
Streamable HTTP session reaches the lease keeper.

The SDK ends a session's connection however the session ends (the client's
DELETE, `session_idle_timeout` without a request in flight, a crash, the
server's shutdown) and then closes that connection's `exit_stack`, the place
its documentation names for per-connection cleanup: the session's holder ends
there. MCP SDK 2.3 hands a tool the connection only through its session object
(`ServerSession._connection`; the SDK's pending Context rework exposes it as
`ctx.connection`); should that attribute go, calls count as sessionless, whose
runs are withdrawn after the idle timeout without a call, so a task is still
never pinned."""

from __future__ import annotations

from typing import Any

from mcp.server.connection import Connection
from mcp.server.mcpserver import Context

from funnel_mcp.leases import PROCESS, SESSIONLESS, LeaseKeeper

# Marks, in a connection's `state`, that its end is wired to the keeper already.
WIRED = "funnel.holder"


def holder(ctx: Context[Any], keeper: LeaseKeeper, http: bool) -> str:
    if not http:
        return PROCESS
    connection = getattr(ctx.request_context.session, "_connection", None)
    if not isinstance(connection, Connection) or connection.session_id is None:
        return SESSIONLESS
    key = f"session {connection.session_id}"
    if WIRED not in connection.state:
        connection.state[WIRED] = key
        connection.exit_stack.callback(keeper.end, key, "the MCP session that held it ended")
    return key
