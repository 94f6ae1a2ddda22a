"""The authorization table of both services: every RPC, the roles that may call
it, and whether an agent may call it only for work it holds. Enforced before any
handler runs (funnel/runtime/boundary.py), with the request's `workspace_id`
checked against the caller's grants first, so that a foreign workspace's
contents, even whether a task exists there, never leak.

docs/security.md renders this table; tests/security/test_authorization_table.py
keeps the two equal and checks that every RPC of the protos is listed.
"""

from __future__ import annotations

from dataclasses import dataclass

from funnel.auth.principal import PRECEDENCE, Principal, Role

# One letter per role, for the table below (O is OPERATOR, never zero).
V, A, H, O, C = Role.VIEWER, Role.AGENT, Role.HOST, Role.OPERATOR, Role.COMPLETION_SERVICE  # noqa: E741

LIFECYCLE = "funnel.lifecycle.v1.TaskLifecycleService"
COMPLETION = "funnel.completion.v1.CompletionService"
TRANSCRIPT = "funnel.completion.v1.TranscriptService"


@dataclass(frozen=True)
class Rule:
    roles: frozenset[Role]
    # An agent (without a host or operator role in the workspace) may call it only
    # for a run it holds; the service checks that once it has loaded the run.
    holder_only: bool = False


def _rule(*roles: Role, holder_only: bool = False) -> Rule:
    return Rule(frozenset(roles), holder_only)


READ = _rule(V, H, O, C)
# An agent reads and watches the lifecycle of its workspace's tasks, as it reads
# any one of them, so that it learns its task finished without a host's token.
# Not "only tasks it holds a run on": the lifecycle service knows no runs. A
# watch of the whole workspace shows an agent its task ids, their histories and
# who caused each change (docs/security.md).
LIFECYCLE_READ = _rule(V, A, H, O, C)

TABLE: dict[str, Rule] = {
    # The lifecycle authority. Settlements of completion and failure facts (and
    # the `authoritative_at` they carry) come only from the completion service.
    f"/{LIFECYCLE}/RegisterTask": _rule(H, O),
    f"/{LIFECYCLE}/ActivateGeneration": _rule(H, O, C),
    f"/{LIFECYCLE}/SuspendGeneration": _rule(H, O),
    f"/{LIFECYCLE}/ResumeWithGeneration": _rule(H, O, C),
    f"/{LIFECYCLE}/RequestCancellation": _rule(H, O, C),
    f"/{LIFECYCLE}/SettleCancellation": _rule(H, O, C),
    f"/{LIFECYCLE}/SettleCompletion": _rule(C),
    f"/{LIFECYCLE}/SettleCompletions": _rule(C),
    f"/{LIFECYCLE}/SettleFailure": _rule(C),
    f"/{LIFECYCLE}/SettleTimeout": _rule(H, O),
    f"/{LIFECYCLE}/PropagateParentTermination": _rule(O),
    f"/{LIFECYCLE}/SetWorkStatus": _rule(H, O, C),
    f"/{LIFECYCLE}/GetTask": LIFECYCLE_READ,
    f"/{LIFECYCLE}/ListTasks": READ,
    f"/{LIFECYCLE}/CountTasks": READ,
    f"/{LIFECYCLE}/ListLifecycleEvents": LIFECYCLE_READ,
    f"/{LIFECYCLE}/WatchLifecycleEvents": LIFECYCLE_READ,
    # Runs, evidence and the completion transaction.
    f"/{COMPLETION}/ClaimTask": _rule(A, H, O, holder_only=True),
    f"/{COMPLETION}/RenewLease": _rule(A, H, O, holder_only=True),
    f"/{COMPLETION}/CompleteRun": _rule(A, H, O, holder_only=True),
    f"/{COMPLETION}/GetRun": _rule(V, A, H, O),
    f"/{COMPLETION}/ListRuns": _rule(V, H, O),
    f"/{COMPLETION}/RecordEvidence": _rule(A, H, O, holder_only=True),
    f"/{COMPLETION}/ListEvidence": _rule(V, H, O),
    f"/{COMPLETION}/AttemptCompletion": _rule(A, H, O, holder_only=True),
    f"/{COMPLETION}/GetCompletion": _rule(V, A, H, O),
    f"/{COMPLETION}/ListCompletions": _rule(V, H, O),
    f"/{COMPLETION}/ListAuditLog": _rule(V, H, O),
    f"/{COMPLETION}/ListCompletionEvents": _rule(V, H, O),
    f"/{COMPLETION}/WatchCompletionEvents": _rule(V, H, O),
    # Transcripts.
    f"/{TRANSCRIPT}/AppendTranscript": _rule(A, H, O, holder_only=True),
    f"/{TRANSCRIPT}/LoadTranscript": _rule(V, A, H, O),
    f"/{TRANSCRIPT}/ExportTranscript": _rule(V, H, O),
    f"/{TRANSCRIPT}/ImportTranscript": _rule(H, O),
    f"/{TRANSCRIPT}/ResolveResume": _rule(V, A, H, O),
}


# A transcript batch that reopens a completed generation is a resume: only these
# roles may reopen one (the completion service relays the resume for them, and the
# lifecycle service checks the named role against this again). The completion
# service's own role is no resumer in its own right.
RESUME = f"/{LIFECYCLE}/ResumeWithGeneration"
RESUMING_ROLES = tuple(role for role in PRECEDENCE if role in TABLE[RESUME].roles and role is not C)


@dataclass(frozen=True)
class Granted:
    """The call may proceed as `role`. `holder_only`: the caller acts as an agent
    and must hold the run it names (or the task's live lease)."""

    role: Role
    holder_only: bool


@dataclass(frozen=True)
class Denied:
    # WORKSPACE_NOT_GRANTED or ROLE_NOT_PERMITTED (a catalogue reason name).
    reason: str
    message: str
    permitted_roles: tuple[str, ...] = ()


def authorize(principal: Principal, method: str, workspace_id: str) -> Granted | Denied:
    rule = TABLE.get(method)
    if rule is None:  # fail closed: an RPC nobody listed is callable by nobody
        return Denied("ROLE_NOT_PERMITTED", f"{method} is not in the authorization table")
    held = principal.roles_in(workspace_id)
    if not held:
        return Denied(
            "WORKSPACE_NOT_GRANTED",
            f"the credential of {principal.subject!r} grants no role in workspace {workspace_id!r}",
        )
    allowed = held & rule.roles
    permitted = tuple(role.value for role in PRECEDENCE if role in rule.roles)
    if not allowed:
        return Denied(
            "ROLE_NOT_PERMITTED",
            f"{method.rsplit('/', 1)[1]} needs one of the roles {', '.join(permitted)} in workspace "
            f"{workspace_id!r}; the caller {principal.subject!r} has {', '.join(sorted(r.value for r in held))}",
            permitted,
        )
    role = next(r for r in PRECEDENCE if r in allowed)
    return Granted(role, rule.holder_only and role is Role.AGENT)
