"""Principals as plain values: an authenticated subject and the roles it holds per
workspace, read from a token's `permissions` claim (Temporal's claim-mapper
shape: `"<workspace>:<role>"`, `"*"` for every workspace)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

ALL_WORKSPACES = "*"
# A caller's subject (a token's `sub`, the completion service's identity) is
# stored on every event it causes, keys its request ids and rate limit, and is
# logged and shown: 1..255 characters (OpenID Connect's bound on `sub`) of
# printable ASCII that is safe in logs, URLs and terminals. Besides letters and
# digits: the punctuation of URIs (RFC 3986: SPIFFE ids, URNs, `repo:org/x:ref`),
# `%` and `|` (`auth0|…`). No spaces, quotes, backslashes, `<>`, control, format
# or bidirectional characters, nothing beyond ASCII.
MAX_SUBJECT_LENGTH = 255
SUBJECT_PUNCTUATION = frozenset("-._~:/?#[]@!$&'()*+,;=%|")


class Role(enum.Enum):
    """What a caller may do; the table in `funnel.auth.table` says where."""

    VIEWER = "viewer"
    AGENT = "agent"
    HOST = "host"
    OPERATOR = "operator"
    # Granted by identity only (a client certificate or service token naming the
    # configured completion-service identity), never by a `permissions` entry.
    COMPLETION_SERVICE = "completion-service"


# Most privileged first: the role a call is attributed to when several permit it.
PRECEDENCE = (Role.COMPLETION_SERVICE, Role.OPERATOR, Role.HOST, Role.AGENT, Role.VIEWER)
GRANTABLE = {role.value: role for role in (Role.VIEWER, Role.AGENT, Role.HOST, Role.OPERATOR)}


@dataclass(frozen=True)
class Caller:
    """Who made a call, as recorded on lifecycle events and audit rows: the
    authenticated subject and the role the call was admitted under."""

    subject: str = ""
    role: str = ""


@dataclass(frozen=True)
class Principal:
    """An authenticated caller with its grants: `subject` (a token's `sub`, or a certificate's
    identity) and its roles per workspace (`"*"`: every workspace)."""

    subject: str
    grants: Mapping[str, frozenset[Role]] = field(default_factory=dict)

    def roles_in(self, workspace_id: str) -> frozenset[Role]:
        return self.grants.get(workspace_id, frozenset()) | self.grants.get(ALL_WORKSPACES, frozenset())


def subject_problem(value: str) -> str | None:
    """Why `value` is not a safe subject, or None. The answer names a bad
    character by its code point, never repeats it."""
    if not value:
        return "is empty"
    if len(value) > MAX_SUBJECT_LENGTH:
        return f"is longer than {MAX_SUBJECT_LENGTH} characters"
    for ch in value:
        if not (ch.isascii() and ch.isalnum()) and ch not in SUBJECT_PUNCTUATION:
            return f"contains U+{ord(ch):04X}; subjects hold ASCII letters, digits and -._~:/?#[]@!$&'()*+,;=%| only"
    return None


def parse_permissions(entries: Iterable[object], is_workspace_id: Callable[[str], bool]) -> dict[str, frozenset[Role]]:
    """Grants from `permissions` entries. Entries that are not `"<workspace>:<role>"`
    with a known role are ignored (a token may carry permissions of other
    systems); they grant nothing."""
    grants: dict[str, set[Role]] = {}
    for entry in entries:
        if not isinstance(entry, str) or ":" not in entry:
            continue
        workspace, _, role_name = entry.rpartition(":")
        role = GRANTABLE.get(role_name)
        if role is None or not workspace or not (workspace == ALL_WORKSPACES or is_workspace_id(workspace)):
            continue
        grants.setdefault(workspace, set()).add(role)
    return {workspace: frozenset(roles) for workspace, roles in grants.items()}


def completion_service(subject: str) -> Principal:
    return Principal(subject, with_completion_service({}))


def with_completion_service(grants: Mapping[str, frozenset[Role]]) -> dict[str, frozenset[Role]]:
    """The grants of the completion service's identity: its role everywhere, plus
    whatever its token's permissions add."""
    merged = dict(grants)
    merged[ALL_WORKSPACES] = merged.get(ALL_WORKSPACES, frozenset()) | {Role.COMPLETION_SERVICE}
    return merged


def unauthenticated_operator() -> Principal:
    """The caller of a service started with authentication off (loopback only):
    every role everywhere, attributed to `anonymous`."""
    return Principal("anonymous", {ALL_WORKSPACES: frozenset(Role)})
