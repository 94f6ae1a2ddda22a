"""Resumes the completion service submits for its own caller (a transcript batch
that reopened a completed generation): the lifecycle service, not the relay,
decides whether that caller may resume, with the same authorization table the
boundary applies to a direct call (funnel/auth/table.py)."""

from __future__ import annotations

from funnel.auth.principal import Caller, Role
from funnel.auth.table import RESUMING_ROLES
from funnel.runtime.errors import Rejection, reject
from lifecycle_service.errors import Reason


def judge_relay(relayer: Role, named: Caller) -> Rejection | None:
    """None when `relayer` (the role the call was admitted under) may name the
    caller a resume is for, and that caller's role may resume a task itself."""
    if relayer is not Role.COMPLETION_SERVICE:
        return reject(
            Reason.ROLE_NOT_PERMITTED,
            "only the completion service names the caller it resumes a task for (on_behalf_of)",
            field="on_behalf_of",
            permitted_roles=Role.COMPLETION_SERVICE.value,
        )
    if Role(named.role) not in RESUMING_ROLES:
        permitted = [role.value for role in RESUMING_ROLES]
        return reject(
            Reason.ROLE_NOT_PERMITTED,
            f"the completion service resumes a task only for a caller that may resume it: {named.subject!r} acts "
            f"as {named.role}, ResumeWithGeneration needs one of {', '.join(permitted)}",
            field="on_behalf_of.role",
            permitted_roles=",".join(permitted),
        )
    return None
