"""Who a tool call acts as, and in which workspace. No I/O here.

Over stdio the host that spawned the server is the caller: the configured
token, in `--workspace`. Over Streamable HTTP every request's own bearer token
(verified by `funnel_mcp.authorization` before the call got here) is the
caller, and the workspace comes from the token: the one it grants by name. A
server started with `--workspace` serves that workspace only (the services
refuse a token that does not grant it, `WORKSPACE_NOT_GRANTED`); one started
without needs tokens that name a single workspace. Tools take no workspace
argument: seed 001's `complete_task` has none, and a run id alone names its run."""

from __future__ import annotations

from dataclasses import dataclass

from funnel.auth.principal import ALL_WORKSPACES, Principal
from funnel_mcp.failures import refusal


@dataclass(frozen=True)
class Caller:
    token: str
    # The token's subject (None: a stdio token that names none).
    subject: str | None
    workspace: str


def workspace_of(configured: str | None, principal: Principal) -> str:
    """`configured` (--workspace), else the one workspace `principal` is granted
    by name; raises Refused when that is not one."""
    if configured:
        return configured
    named = sorted(workspace for workspace in principal.grants if workspace != ALL_WORKSPACES)
    if len(named) == 1 and ALL_WORKSPACES not in principal.grants:
        return named[0]
    if not named and ALL_WORKSPACES not in principal.grants:
        raise refusal("WORKSPACE_NOT_GRANTED", f"the token of {principal.subject!r} grants no workspace")
    grants = f"every workspace ({ALL_WORKSPACES!r})" if not named else f"several workspaces ({', '.join(named)})"
    raise refusal(
        "WORKSPACE_UNKNOWN",
        f"the token of {principal.subject!r} grants {grants} and this server "
        "serves no one workspace (--workspace): use a token for one workspace, or a server started "
        "with --workspace",
    )
