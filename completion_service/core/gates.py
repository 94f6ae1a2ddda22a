"""Completion gates and the binding decision (docs/specification.md §5.3, §5.4).

A gate is a pure function of the snapshot and the workspace policy. The registry
fixes the evaluation order; a gate is active or retired there, and a workspace
policy may deactivate active gates. Every registered gate appears in the trace.
The first failing gate decides: a hard gate means the agent must stop, a soft
gate names the one thing to fix. External gates (gRPC) run after all built-ins
passed; their answers arrive here as plain values, and a missing answer (error or
timeout) fails closed.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from completion_service.core.model import (
    AgentAction,
    BlockDetails,
    Decision,
    GateStatus,
    GateTrace,
    LifecycleState,
    RequestedOutcome,
    Snapshot,
    Verdict,
)

DECISION_SCHEMA = "funnel.completion.decision/v1"
DEFAULT_BREAKER_THRESHOLD = 3


class GateState(enum.Enum):
    ACTIVE = "active"
    RETIRED = "retired"


@dataclass(frozen=True)
class GateCheck:
    """What one gate found: passed, or failed with a reason and the structured
    details the reason is written from; `applicable=False` skips it."""

    passed: bool
    reason: str
    applicable: bool = True
    details: BlockDetails = BlockDetails()


def passed(reason: str) -> GateCheck:
    return GateCheck(True, reason)


def failed(reason: str, details: BlockDetails = BlockDetails()) -> GateCheck:
    return GateCheck(False, reason, details=details)


def not_applicable(reason: str) -> GateCheck:
    return GateCheck(True, reason, applicable=False)


@dataclass(frozen=True)
class ExternalGate:
    gate_id: str
    address: str
    timeout_ms: int = 1000


@dataclass(frozen=True)
class WorkspacePolicy:
    # Built-in gates switched off for this workspace (ids).
    disabled_gates: frozenset[str] = frozenset()
    required_evidence: tuple[str, ...] = ()
    breaker_threshold: int = DEFAULT_BREAKER_THRESHOLD
    external_gates: tuple[ExternalGate, ...] = ()


@dataclass(frozen=True)
class ExternalAnswer:
    """An external gate's answer; `passed=None` means it errored or timed out."""

    passed: bool | None
    reason: str


@dataclass(frozen=True)
class Gate:
    gate_id: str
    version: int
    # Hard gates: the task is not this agent's to finish now. Soft: fixable.
    hard: bool
    action: AgentAction
    check: Callable[[Snapshot, WorkspacePolicy], GateCheck]
    state: GateState = GateState.ACTIVE


def _lease_live(s: Snapshot, policy: WorkspacePolicy) -> GateCheck:
    lease, run = s.lease, s.run
    if not run.open:
        return failed(f"run {run.run_id} is closed")
    if lease is None or lease.run_id != run.run_id or lease.epoch != s.claimed_epoch or run.epoch != s.claimed_epoch:
        holder = f"run {lease.run_id} epoch {lease.epoch}" if lease else "nobody"
        return failed(
            f"the lease of epoch {s.claimed_epoch} was superseded (now held by {holder})",
            BlockDetails(current_lease=lease),
        )
    if lease.expires_at <= s.now:
        return failed(f"the lease of epoch {lease.epoch} expired", BlockDetails(current_lease=lease))
    return passed(f"run {run.run_id} holds the live lease of epoch {lease.epoch}")


def _generation_current(s: Snapshot, policy: WorkspacePolicy) -> GateCheck:
    view = s.lifecycle
    if s.run.generation != view.generation:
        return failed(
            f"the run works on generation {s.run.generation}; the task is at generation {view.generation}",
            BlockDetails(current_generation=view.generation),
        )
    if view.state is LifecycleState.TERMINAL:
        return failed(
            f"generation {view.generation} is already terminal ({view.outcome})",
            BlockDetails(current_generation=view.generation),
        )
    return passed(f"generation {view.generation} is current and {view.state.name}")


def _no_cancellation(s: Snapshot, policy: WorkspacePolicy) -> GateCheck:
    if s.lifecycle.cancellation_requested:
        return failed(f"generation {s.lifecycle.generation} has a cancellation request")
    return passed("no cancellation requested")


def _circuit_breaker(s: Snapshot, policy: WorkspacePolicy) -> GateCheck:
    checkpoint = s.transcript.checkpoint
    repeats = sum(
        1
        for attempt in s.attempts
        if attempt.blocked and attempt.checkpoint == checkpoint and attempt.result_digest == s.result_digest
    )
    if repeats >= policy.breaker_threshold:
        return failed(
            f"{repeats} blocked attempts with this result at checkpoint {checkpoint!r}; "
            "blocked until the checkpoint changes"
        )
    return passed(f"{repeats} earlier blocked attempt(s) with this result at this checkpoint")


def _state_version_current(s: Snapshot, policy: WorkspacePolicy) -> GateCheck:
    current = s.transcript.state_version
    if s.evaluated_state_version != current:
        return failed(
            f"evaluated state version {s.evaluated_state_version}, the transcript is at {current}",
            BlockDetails(current_state_version=current),
        )
    return passed(f"state version {current} is current")


def _no_open_work(s: Snapshot, policy: WorkspacePolicy) -> GateCheck:
    tail = s.transcript
    open_work = BlockDetails(
        open_tool_call_ids=tail.open_calls, open_step_id=tail.open_step or "", open_turn_id=tail.open_turn or ""
    )
    if tail.open_calls:
        return failed(
            f"{len(tail.open_calls)} tool call(s) have no result: {', '.join(tail.open_calls[:5])}", open_work
        )
    if tail.open_step is not None:
        return failed(f"step {tail.open_step!r} is still open", open_work)
    # A generation's transcript is closed when it becomes terminal: nothing can be
    # appended to it afterwards, so a turn left open would end as INTERRUPTED.
    if tail.open_turn is not None:
        return failed(f"turn {tail.open_turn!r} is still open", open_work)
    return passed("no open tool calls, steps or turn")


def _no_active_children(s: Snapshot, policy: WorkspacePolicy) -> GateCheck:
    children = s.lifecycle.open_attached_children
    if children:
        return failed(
            f"{len(children)} attached child task(s) are not terminal: {', '.join(children[:5])}",
            BlockDetails(open_child_task_ids=children),
        )
    return passed("no attached child task is open")


def _required_evidence(s: Snapshot, policy: WorkspacePolicy) -> GateCheck:
    if s.outcome is RequestedOutcome.FAILED:
        return not_applicable("a FAILED outcome needs no evidence")
    if not policy.required_evidence:
        return passed("the workspace requires no evidence")
    checkpoint = s.transcript.checkpoint
    latest: dict[str, bool] = {}
    for fact in sorted(s.evidence, key=lambda f: f.order):
        if fact.checkpoint == checkpoint and fact.generation == s.run.generation:
            latest[fact.kind] = fact.passed
    missing = [kind for kind in policy.required_evidence if kind not in latest]
    failing = [kind for kind in policy.required_evidence if latest.get(kind) is False]
    if missing or failing:
        parts = []
        if missing:
            parts.append(f"no {', '.join(missing)} evidence")
        if failing:
            parts.append(f"failing {', '.join(failing)} evidence")
        return failed(
            f"{' and '.join(parts)} at checkpoint {checkpoint!r}",
            BlockDetails(
                missing_evidence_kinds=tuple(missing),
                failing_evidence_kinds=tuple(failing),
                evidence_checkpoint=checkpoint,
            ),
        )
    return passed(f"{', '.join(policy.required_evidence)} passed at checkpoint {checkpoint!r}")


def _result_present(s: Snapshot, policy: WorkspacePolicy) -> GateCheck:
    if not s.result.strip():
        return failed("the result is empty")
    return passed("a result is given")


BUILT_IN_GATES: tuple[Gate, ...] = (
    Gate("lease.live", 1, True, AgentAction.STOP_AND_REPORT, _lease_live),
    Gate("lifecycle.generation_current", 1, True, AgentAction.STOP_AND_REPORT, _generation_current),
    Gate("lifecycle.no_cancellation", 1, True, AgentAction.STOP_AND_REPORT, _no_cancellation),
    Gate("completion.circuit_breaker", 1, True, AgentAction.STOP_AND_REPORT, _circuit_breaker),
    Gate("transcript.state_version_current", 1, False, AgentAction.REFRESH_STATE, _state_version_current),
    Gate("transcript.no_open_work", 1, False, AgentAction.RESOLVE_OPEN_TOOL_CALLS, _no_open_work),
    Gate("lifecycle.no_active_children", 1, False, AgentAction.WAIT_FOR_CHILDREN, _no_active_children),
    Gate("evidence.required", 1, False, AgentAction.RECORD_EVIDENCE, _required_evidence),
    Gate("result.non_empty", 1, False, AgentAction.PROVIDE_RESULT, _result_present),
)

# Gates that guard the safety rules (docs/specification.md §5.3); a workspace policy cannot switch them off.
MANDATORY_GATES = frozenset({"lease.live", "lifecycle.generation_current", "lifecycle.no_cancellation"})


@dataclass(frozen=True)
class Finding:
    gate_id: str
    version: int
    status: GateStatus
    reason: str
    hard: bool = False
    action: AgentAction | None = None
    details: BlockDetails = BlockDetails()


@dataclass(frozen=True)
class Evaluation:
    """Built-in findings before external gates are consulted."""

    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def builtins_passed(self) -> bool:
        return all(f.status is not GateStatus.FAILED for f in self.findings)


def evaluate_builtins(
    snapshot: Snapshot, policy: WorkspacePolicy, registry: tuple[Gate, ...] = BUILT_IN_GATES
) -> Evaluation:
    findings = []
    for gate in registry:
        if gate.state is GateState.RETIRED:
            findings.append(Finding(gate.gate_id, gate.version, GateStatus.SKIPPED, "retired"))
            continue
        if gate.gate_id in policy.disabled_gates and gate.gate_id not in MANDATORY_GATES:
            findings.append(Finding(gate.gate_id, gate.version, GateStatus.SKIPPED, "disabled by the workspace policy"))
            continue
        verdict = gate.check(snapshot, policy)
        if not verdict.applicable:
            status = GateStatus.SKIPPED
        else:
            status = GateStatus.PASSED if verdict.passed else GateStatus.FAILED
        findings.append(
            Finding(gate.gate_id, gate.version, status, verdict.reason, gate.hard, gate.action, verdict.details)
        )
    return Evaluation(tuple(findings))


def decide(
    snapshot: Snapshot,
    policy: WorkspacePolicy,
    external_answers: Mapping[str, ExternalAnswer] | None = None,
    registry: tuple[Gate, ...] = BUILT_IN_GATES,
) -> Decision:
    """The binding decision. `external_answers` holds what each external gate of the
    policy answered; a gate without an answer fails closed."""
    evaluation = evaluate_builtins(snapshot, policy, registry)
    findings = list(evaluation.findings)
    answers = external_answers or {}
    for gate in policy.external_gates:
        if not evaluation.builtins_passed:
            findings.append(Finding(gate.gate_id, 1, GateStatus.SKIPPED, "not called: a built-in gate blocked"))
            continue
        answer = answers.get(gate.gate_id)
        if answer is None or answer.passed is None:
            reason = answer.reason if answer else "no answer"
            findings.append(
                Finding(
                    gate.gate_id,
                    1,
                    GateStatus.FAILED,
                    f"external gate unavailable: {reason}",
                    False,
                    AgentAction.RETRY_LATER,
                    BlockDetails(gate_feedback=reason),
                )
            )
        elif answer.passed:
            findings.append(Finding(gate.gate_id, 1, GateStatus.PASSED, answer.reason or "passed"))
        else:
            findings.append(
                Finding(
                    gate.gate_id,
                    1,
                    GateStatus.FAILED,
                    answer.reason or "failed",
                    False,
                    AgentAction.ADDRESS_GATE_FEEDBACK,
                    BlockDetails(gate_feedback=answer.reason or "failed"),
                )
            )
    return _bind(snapshot, findings)


def _bind(snapshot: Snapshot, findings: list[Finding]) -> Decision:
    decisive = next((f for f in findings if f.status is GateStatus.FAILED), None)
    trace = tuple(GateTrace(f.gate_id, f.version, f.status, f.reason, decisive=f is decisive) for f in findings)
    bound = functools.partial(
        Decision,
        trace=trace,
        decision_schema=DECISION_SCHEMA,
        state_version=snapshot.evaluated_state_version,
        checkpoint=snapshot.transcript.checkpoint,
    )
    if decisive is None:
        return bound(
            verdict=Verdict.ALLOW,
            next_action=AgentAction.REPORT_COMPLETE,
            forbidden_actions=(AgentAction.CONTINUE_WORK, AgentAction.ATTEMPT_COMPLETION),
            instruction=f"Completion allowed ({snapshot.outcome.name}); report it and end the session.",
        )
    details = dataclasses.replace(decisive.details, decisive_gate=decisive.gate_id)
    if decisive.hard:
        return bound(
            verdict=Verdict.HARD_BLOCK,
            next_action=AgentAction.STOP_AND_REPORT,
            forbidden_actions=(AgentAction.REPORT_COMPLETE, AgentAction.ATTEMPT_COMPLETION, AgentAction.CONTINUE_WORK),
            instruction=f"Stop: {decisive.reason} ({decisive.gate_id}); report this and do not retry.",
            details=details,
        )
    action = decisive.action
    assert action is not None, f"failed gate {decisive.gate_id} names no action"
    return bound(
        verdict=Verdict.SOFT_BLOCK,
        next_action=action,
        forbidden_actions=(AgentAction.REPORT_COMPLETE,),
        instruction=f"Not complete: {decisive.reason} ({decisive.gate_id}); {advice(action, details)}, then retry.",
        details=details,
    )


def advice(action: AgentAction, d: BlockDetails) -> str:
    """What to do about a soft block, written from its details."""
    if action is AgentAction.RESOLVE_OPEN_TOOL_CALLS:
        steps = [f"answer the open tool calls ({_listed(d.open_tool_call_ids)})"] if d.open_tool_call_ids else []
        steps += [f"close the open step {d.open_step_id!r}"] if d.open_step_id else []
        steps += [f"close the open turn {d.open_turn_id!r}"] if d.open_turn_id else []
        return " and ".join(steps) or "answer the open tool calls and close the open step and turn"
    if action is AgentAction.REFRESH_STATE:
        return f"reload the transcript (now at state version {d.current_state_version}) and re-evaluate"
    if action is AgentAction.RECORD_EVIDENCE:
        kinds = _listed((*d.missing_evidence_kinds, *d.failing_evidence_kinds))
        return f"record passing evidence ({kinds}) at checkpoint {d.evidence_checkpoint!r}"
    if action is AgentAction.WAIT_FOR_CHILDREN:
        return f"wait for the attached child tasks ({_listed(d.open_child_task_ids)}) to finish"
    if action is AgentAction.PROVIDE_RESULT:
        return "state the result"
    if action is AgentAction.RETRY_LATER:
        return "wait a moment"
    return "address the gate's feedback"


def _listed(ids: tuple[str, ...], shown: int = 5) -> str:
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(ids[:shown]) + more


# (the lease's run and epoch, the transcript's state version, its checkpoint)
SnapshotBasis = tuple[tuple[str, int] | None, int, str]


def snapshot_basis(snapshot: Snapshot) -> SnapshotBasis:
    """What external gates' answers depend on and must not move before the commit."""
    lease = snapshot.lease
    return (
        (lease.run_id, lease.epoch) if lease else None,
        snapshot.transcript.state_version,
        snapshot.transcript.checkpoint,
    )
