"""Which actions the dashboard's action token lets it offer, per workspace.

The buttons follow the token's own `permissions` claim, turned into grants by
the parsing the services use (funnel.auth.principal) and judged by their one
authorization table (funnel.auth.table): a button shows exactly where the
services would admit its call. The claims are read, not verified: the dashboard
holds no key to verify with and needs none, since the services verify the token
on every call and refuse what it does not grant (the page then shows their
reason). Reading a forged token could only show a button whose click is refused."""

from __future__ import annotations

import functools

import jwt

from funnel.auth.principal import ALL_WORKSPACES, Principal, parse_permissions
from funnel.auth.table import LIFECYCLE, RESUME, Granted, authorize
from funnel.runtime.validation import id_problem

# Each action of the dashboard and the RPC it calls (funnel_ui.backend).
METHODS = {
    "resume": RESUME,
    "new-chat": f"/{LIFECYCLE}/RegisterTask",
    "cancel": f"/{LIFECYCLE}/RequestCancellation",
}
NONE: frozenset[str] = frozenset()


@functools.lru_cache(maxsize=8)
def principal(token: str) -> Principal | None:
    """The caller the token names with its grants, or None if it is no readable JWT.
    Cached by the token's text: a token read from a file is asked about on every
    page, and changes only when the file does."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError:
        return None
    permissions = claims.get("permissions", [])
    subject = claims.get("sub", "")
    if not isinstance(permissions, list) or not isinstance(subject, str):
        return None
    return Principal(subject, parse_permissions(permissions, lambda workspace: id_problem(workspace) is None))


def permitted(token: str | None, workspace: str) -> frozenset[str]:
    """The actions (names of METHODS) the token's grants admit in `workspace`."""
    caller = principal(token) if token else None
    if caller is None:
        return NONE
    return frozenset(
        name for name, method in METHODS.items() if isinstance(authorize(caller, method, workspace), Granted)
    )


def start_mode(token: str | None) -> str:
    """What `funnel ui` says it may do when it starts: where its action token's
    grants admit an action, as the buttons will show."""
    if token is None:
        return "read only"
    caller = principal(token)
    acting = sorted(w for w in (caller.grants if caller else ()) if permitted(token, w))
    if not acting:
        return "read only: the action token grants no action"
    if ALL_WORKSPACES in acting:
        return "actions in every workspace"
    return "actions in " + ", ".join(acting)
