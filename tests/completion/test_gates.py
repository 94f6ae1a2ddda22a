"""The built-in gates, the binding decision and the circuit breaker (docs/specification.md §5.3, §5.4).

Each case starts from a snapshot that every gate passes and changes one thing."""

from __future__ import annotations

import copy
import dataclasses
import hashlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from completion_service.core.gates import (
    BUILT_IN_GATES,
    DECISION_SCHEMA,
    DEFAULT_BREAKER_THRESHOLD,
    MANDATORY_GATES,
    ExternalAnswer,
    ExternalGate,
    GateState,
    WorkspacePolicy,
    decide,
    evaluate_builtins,
)
from completion_service.core.model import (
    AgentAction,
    BlockDetails,
    EvidenceFact,
    GateStatus,
    Lease,
    LifecycleState,
    LifecycleView,
    PriorAttempt,
    RequestedOutcome,
    RunView,
    Snapshot,
    TranscriptTail,
    Verdict,
    decision_from_json,
    decision_to_json,
)

NOW = 1_700_000_000_000_000
SECOND = 1_000_000
RESULT = "Implemented the parser; all 42 tests pass."
CHECKPOINT = "cp-7"
GATE_IDS = [g.gate_id for g in BUILT_IN_GATES]
HARD_GATES = {g.gate_id for g in BUILT_IN_GATES if g.hard}
POLICY = WorkspacePolicy(required_evidence=("tests",))


def digest(result: str) -> str:
    return hashlib.sha256(result.encode("utf-8")).hexdigest()


def evidence(kind="tests", passed=True, checkpoint=CHECKPOINT, generation=1, order=1) -> EvidenceFact:
    return EvidenceFact(kind, passed, checkpoint, generation, order)


def blocked(times: int, checkpoint=CHECKPOINT, result=RESULT) -> tuple[PriorAttempt, ...]:
    return tuple(PriorAttempt(checkpoint, digest(result), blocked=True) for _ in range(times))


def snap(
    *,
    run: dict | None = None,
    lease: dict | bool | None = True,
    claimed_epoch: int = 2,
    transcript: dict | None = None,
    evaluated_state_version: int = 12,
    evidence_facts: tuple[EvidenceFact, ...] = (evidence(),),
    lifecycle: dict | None = None,
    attempts: tuple[PriorAttempt, ...] = (),
    outcome: RequestedOutcome = RequestedOutcome.COMPLETED,
    result: str = RESULT,
) -> Snapshot:
    """A snapshot every built-in gate passes under POLICY, with the given changes.
    `lease=None` means no lease; a dict changes fields of the live lease."""
    run_view = dataclasses.replace(RunView("run-1", "task-1", 1, 2, True), **(run or {}))
    live = Lease("task-1", "run-1", 2, NOW + 60 * SECOND)
    lease_value = None if lease is None else dataclasses.replace(live, **(lease if isinstance(lease, dict) else {}))
    return Snapshot(
        workspace_id="acme",
        task_id="task-1",
        now=NOW,
        run=run_view,
        lease=lease_value,
        claimed_epoch=claimed_epoch,
        transcript=dataclasses.replace(TranscriptTail(state_version=12, checkpoint=CHECKPOINT), **(transcript or {})),
        evaluated_state_version=evaluated_state_version,
        evidence=evidence_facts,
        lifecycle=dataclasses.replace(LifecycleView(1, LifecycleState.ACTIVE, None, False), **(lifecycle or {})),
        attempts=attempts,
        outcome=outcome,
        result=result,
        result_digest=digest(result),
    )


def trace_of(decision, gate_id):
    (entry,) = [t for t in decision.trace if t.gate_id == gate_id]
    return entry


def failed_ids(decision):
    return [t.gate_id for t in decision.trace if t.status is GateStatus.FAILED]


def decisive_ids(decision):
    return [t.gate_id for t in decision.trace if t.decisive]


# --- every built-in gate: passing ----------------------------------------------------


def test_the_base_snapshot_passes_every_gate_and_is_allowed():
    decision = decide(snap(), POLICY)
    assert decision.verdict is Verdict.ALLOW
    assert decision.allowed
    assert [t.gate_id for t in decision.trace] == GATE_IDS
    assert all(t.status is GateStatus.PASSED for t in decision.trace)
    assert decisive_ids(decision) == []


@pytest.mark.parametrize(
    "changes, gate_id, reason",
    [
        (dict(), "lease.live", "run run-1 holds the live lease of epoch 2"),
        (dict(lease={"expires_at": NOW + 1}), "lease.live", "live lease of epoch 2"),
        (
            dict(lifecycle={"state": LifecycleState.REGISTERED}),
            "lifecycle.generation_current",
            "generation 1 is current and REGISTERED",
        ),
        (dict(), "lifecycle.no_cancellation", "no cancellation requested"),
        (
            dict(attempts=blocked(DEFAULT_BREAKER_THRESHOLD - 1)),
            "completion.circuit_breaker",
            "2 earlier blocked attempt(s)",
        ),
        (dict(), "transcript.state_version_current", "state version 12 is current"),
        (dict(), "transcript.no_open_work", "no open tool calls, steps or turn"),
        (dict(), "lifecycle.no_active_children", "no attached child task is open"),
        (dict(), "evidence.required", "tests passed at checkpoint 'cp-7'"),
        (dict(result="  ok "), "result.non_empty", "a result is given"),
    ],
    ids=lambda v: v if isinstance(v, str) and "." in v else None,
)
def test_gate_passes(changes, gate_id, reason):
    decision = decide(snap(**changes), POLICY)
    entry = trace_of(decision, gate_id)
    assert entry.status is GateStatus.PASSED
    assert reason in entry.reason
    assert decision.verdict is Verdict.ALLOW


# --- every built-in gate: each failure mode ------------------------------------------

FAILURES = [
    # lease.live
    ("run closed", dict(run={"open": False}), "lease.live", "run run-1 is closed"),
    ("lease missing", dict(lease=None), "lease.live", "superseded (now held by nobody)"),
    (
        "lease taken by another run",
        dict(lease={"run_id": "run-2", "epoch": 3}),
        "lease.live",
        "now held by run run-2 epoch 3",
    ),
    (
        "lease re-claimed (newer epoch)",
        dict(lease={"epoch": 3}, run={"epoch": 3}),
        "lease.live",
        "the lease of epoch 2 was superseded",
    ),
    ("run epoch is not the claimed epoch", dict(run={"epoch": 1}), "lease.live", "superseded"),
    ("lease expired exactly now", dict(lease={"expires_at": NOW}), "lease.live", "the lease of epoch 2 expired"),
    ("lease expired long ago", dict(lease={"expires_at": NOW - 3600 * SECOND}), "lease.live", "expired"),
    # lifecycle.generation_current
    (
        "newer generation",
        dict(lifecycle={"generation": 2}),
        "lifecycle.generation_current",
        "the run works on generation 1; the task is at generation 2",
    ),
    (
        "generation terminal",
        dict(lifecycle={"state": LifecycleState.TERMINAL, "outcome": "COMPLETED"}),
        "lifecycle.generation_current",
        "generation 1 is already terminal (COMPLETED)",
    ),
    # lifecycle.no_cancellation
    (
        "cancellation requested",
        dict(lifecycle={"cancellation_requested": True}),
        "lifecycle.no_cancellation",
        "generation 1 has a cancellation request",
    ),
    # completion.circuit_breaker
    (
        "breaker tripped",
        dict(attempts=blocked(DEFAULT_BREAKER_THRESHOLD)),
        "completion.circuit_breaker",
        "3 blocked attempts with this result at checkpoint 'cp-7'",
    ),
    # transcript.state_version_current
    (
        "state version stale",
        dict(evaluated_state_version=11),
        "transcript.state_version_current",
        "evaluated state version 11, the transcript is at 12",
    ),
    (
        "state version ahead",
        dict(evaluated_state_version=13),
        "transcript.state_version_current",
        "evaluated state version 13, the transcript is at 12",
    ),
    # transcript.no_open_work
    (
        "open tool calls",
        dict(transcript={"open_calls": ("call-1", "call-2")}),
        "transcript.no_open_work",
        "2 tool call(s) have no result: call-1, call-2",
    ),
    ("open step", dict(transcript={"open_step": "step-4"}), "transcript.no_open_work", "step 'step-4' is still open"),
    # lifecycle.no_active_children
    (
        "open attached children",
        dict(lifecycle={"open_attached_children": ("child-1", "child-2")}),
        "lifecycle.no_active_children",
        "2 attached child task(s) are not terminal: child-1, child-2",
    ),
    # evidence.required
    ("evidence missing", dict(evidence_facts=()), "evidence.required", "no tests evidence at checkpoint 'cp-7'"),
    (
        "evidence failing",
        dict(evidence_facts=(evidence(passed=False),)),
        "evidence.required",
        "failing tests evidence at checkpoint 'cp-7'",
    ),
    (
        "evidence at another checkpoint",
        dict(evidence_facts=(evidence(checkpoint="cp-6"),)),
        "evidence.required",
        "no tests evidence at checkpoint 'cp-7'",
    ),
    (
        "evidence for another generation",
        dict(evidence_facts=(evidence(generation=2),)),
        "evidence.required",
        "no tests evidence",
    ),
    (
        "evidence of another kind",
        dict(evidence_facts=(evidence(kind="lint"),)),
        "evidence.required",
        "no tests evidence",
    ),
    (
        "latest evidence fails",
        dict(evidence_facts=(evidence(order=1), evidence(passed=False, order=2))),
        "evidence.required",
        "failing tests evidence",
    ),
    (
        "latest by order, not by position",
        dict(evidence_facts=(evidence(passed=False, order=9), evidence(order=3))),
        "evidence.required",
        "failing tests evidence",
    ),
    # result.non_empty
    ("empty result", dict(result=""), "result.non_empty", "the result is empty"),
    ("whitespace result", dict(result=" \n\t "), "result.non_empty", "the result is empty"),
]


@pytest.mark.parametrize("changes, gate_id, reason", [f[1:] for f in FAILURES], ids=[f[0] for f in FAILURES])
def test_gate_failure_mode(changes, gate_id, reason):
    decision = decide(snap(**changes), POLICY)
    entry = trace_of(decision, gate_id)
    assert entry.status is GateStatus.FAILED
    assert reason in entry.reason
    assert entry.decisive
    # One change, one failing gate: every other gate still passes.
    assert failed_ids(decision) == [gate_id]
    assert decision.verdict is (Verdict.HARD_BLOCK if gate_id in HARD_GATES else Verdict.SOFT_BLOCK)
    assert entry.reason in decision.instruction and gate_id in decision.instruction


BLOCK_DETAILS = [
    (
        "lease taken",
        dict(lease={"run_id": "run-2", "epoch": 3}),
        dict(current_lease=Lease("task-1", "run-2", 3, NOW + 60 * SECOND)),
    ),
    ("lease missing", dict(lease=None), dict(current_lease=None)),
    ("newer generation", dict(lifecycle={"generation": 2}), dict(current_generation=2)),
    ("state version stale", dict(evaluated_state_version=11), dict(current_state_version=12)),
    (
        "open work",
        dict(transcript={"open_calls": ("call-1", "call-2"), "open_step": "s-1", "open_turn": "t-1"}),
        dict(open_tool_call_ids=("call-1", "call-2"), open_step_id="s-1", open_turn_id="t-1"),
    ),
    (
        "children",
        dict(lifecycle={"open_attached_children": tuple(f"c-{i}" for i in range(7))}),
        dict(open_child_task_ids=tuple(f"c-{i}" for i in range(7))),
    ),
    (
        "evidence",
        dict(evidence_facts=(evidence(kind="lint", passed=False),)),
        dict(missing_evidence_kinds=("tests",), failing_evidence_kinds=("lint",), evidence_checkpoint=CHECKPOINT),
    ),
]


@pytest.mark.parametrize("changes, fields", [d[1:] for d in BLOCK_DETAILS], ids=[d[0] for d in BLOCK_DETAILS])
def test_every_block_carries_structured_details_of_its_decisive_gate(changes, fields):
    policy = WorkspacePolicy(required_evidence=("tests", "lint"))
    decision = decide(snap(**changes), policy)
    assert not decision.allowed and decision.details is not None
    [gate_id] = decisive_ids(decision)
    assert decision.details == BlockDetails(decisive_gate=gate_id, **fields)
    # The details survive storage in the completion row and events.
    assert decision_from_json(decision_to_json(decision)) == decision


def test_an_allowed_decision_has_no_details():
    decision = decide(snap(), POLICY)
    assert decision.allowed and decision.details is None
    assert decision_from_json(decision_to_json(decision)).details is None


def test_external_gate_feedback_is_in_the_details():
    gate = ExternalGate("acme.review", "127.0.0.1:1")
    policy = WorkspacePolicy(external_gates=(gate,))
    refused = decide(snap(), policy, {"acme.review": ExternalAnswer(False, "add a changelog entry")})
    assert refused.details == BlockDetails(decisive_gate="acme.review", gate_feedback="add a changelog entry")
    silent = decide(snap(), policy, {})
    assert (silent.next_action, silent.details.gate_feedback) == (AgentAction.RETRY_LATER, "no answer")


def test_every_built_in_gate_has_a_failure_case():
    assert {f[2] for f in FAILURES} == set(GATE_IDS)


def test_latest_passing_evidence_wins_over_an_earlier_failure():
    decision = decide(snap(evidence_facts=(evidence(passed=False, order=1), evidence(order=2))), POLICY)
    assert trace_of(decision, "evidence.required").status is GateStatus.PASSED
    assert decision.allowed


def test_evidence_at_other_checkpoints_does_not_override_the_current_one():
    facts = (evidence(order=1), evidence(passed=False, checkpoint="cp-6", order=2))
    assert decide(snap(evidence_facts=facts), POLICY).allowed


def test_several_required_kinds_report_missing_and_failing_together():
    policy = WorkspacePolicy(required_evidence=("tests", "lint", "review"))
    decision = decide(snap(evidence_facts=(evidence(), evidence(kind="lint", passed=False, order=2))), policy)
    assert (
        trace_of(decision, "evidence.required").reason
        == "no review evidence and failing lint evidence at checkpoint 'cp-7'"
    )
    assert decision.next_action is AgentAction.RECORD_EVIDENCE


def test_no_required_evidence_passes_without_any():
    decision = decide(snap(evidence_facts=()), WorkspacePolicy())
    assert trace_of(decision, "evidence.required").reason == "the workspace requires no evidence"
    assert decision.allowed


def test_failed_outcome_skips_evidence():
    decision = decide(snap(outcome=RequestedOutcome.FAILED, evidence_facts=(evidence(passed=False),)), POLICY)
    entry = trace_of(decision, "evidence.required")
    assert entry.status is GateStatus.SKIPPED
    assert entry.reason == "a FAILED outcome needs no evidence"
    assert decision.verdict is Verdict.ALLOW
    assert "FAILED" in decision.instruction


def test_failed_outcome_still_passes_through_the_safety_gates():
    decision = decide(snap(outcome=RequestedOutcome.FAILED, lifecycle={"cancellation_requested": True}), POLICY)
    assert decision.verdict is Verdict.HARD_BLOCK
    assert decisive_ids(decision) == ["lifecycle.no_cancellation"]


def test_long_open_call_lists_are_cut_to_five_names():
    calls = tuple(f"call-{i}" for i in range(8))
    reason = trace_of(decide(snap(transcript={"open_calls": calls}), POLICY), "transcript.no_open_work").reason
    assert reason == "8 tool call(s) have no result: call-0, call-1, call-2, call-3, call-4"


# --- the decision table ----------------------------------------------------------------


def test_allow_tells_the_agent_to_report_and_stop_working():
    decision = decide(snap(), POLICY)
    assert decision.verdict is Verdict.ALLOW
    assert decision.next_action is AgentAction.REPORT_COMPLETE
    assert decision.forbidden_actions == (AgentAction.CONTINUE_WORK, AgentAction.ATTEMPT_COMPLETION)
    assert decision.instruction == "Completion allowed (COMPLETED); report it and end the session."
    assert decision.decision_schema == DECISION_SCHEMA
    assert decision.state_version == 12
    assert decision.checkpoint == CHECKPOINT


SOFT_ACTIONS = [
    (
        dict(evaluated_state_version=11),
        "transcript.state_version_current",
        AgentAction.REFRESH_STATE,
        "reload the transcript (now at state version 12)",
    ),
    (
        dict(transcript={"open_calls": ("call-1",)}),
        "transcript.no_open_work",
        AgentAction.RESOLVE_OPEN_TOOL_CALLS,
        "answer the open tool calls (call-1)",
    ),
    (
        dict(transcript={"open_step": "s"}),
        "transcript.no_open_work",
        AgentAction.RESOLVE_OPEN_TOOL_CALLS,
        "close the open step 's'",
    ),
    (
        dict(transcript={"open_turn": "turn-3"}),
        "transcript.no_open_work",
        AgentAction.RESOLVE_OPEN_TOOL_CALLS,
        "close the open turn 'turn-3'",
    ),
    (
        dict(lifecycle={"open_attached_children": ("c",)}),
        "lifecycle.no_active_children",
        AgentAction.WAIT_FOR_CHILDREN,
        "wait for the attached child tasks (c)",
    ),
    (
        dict(evidence_facts=()),
        "evidence.required",
        AgentAction.RECORD_EVIDENCE,
        "record passing evidence (tests) at checkpoint 'cp-7'",
    ),
    (dict(result=""), "result.non_empty", AgentAction.PROVIDE_RESULT, "state the result"),
]


@pytest.mark.parametrize(
    "changes, gate_id, action, advice", SOFT_ACTIONS, ids=[f"{a[1]}-{i}" for i, a in enumerate(SOFT_ACTIONS)]
)
def test_soft_block_names_the_gates_action_and_forbids_reporting(changes, gate_id, action, advice):
    decision = decide(snap(**changes), POLICY)
    assert decision.verdict is Verdict.SOFT_BLOCK
    assert decision.next_action is action
    assert decision.forbidden_actions == (AgentAction.REPORT_COMPLETE,)
    assert decision.instruction.startswith("Not complete: ")
    assert advice in decision.instruction and decision.instruction.endswith(", then retry.")
    assert decisive_ids(decision) == [gate_id]


@pytest.mark.parametrize("gate_id", sorted(HARD_GATES))
def test_hard_block_means_stop_and_report(gate_id):
    changes = next(f[1] for f in FAILURES if f[2] == gate_id)
    decision = decide(snap(**changes), POLICY)
    assert decision.verdict is Verdict.HARD_BLOCK
    assert decision.next_action is AgentAction.STOP_AND_REPORT
    assert set(decision.forbidden_actions) == {
        AgentAction.REPORT_COMPLETE,
        AgentAction.ATTEMPT_COMPLETION,
        AgentAction.CONTINUE_WORK,
    }
    assert decision.instruction.startswith("Stop: ") and "do not retry" in decision.instruction


def test_hard_gates_are_the_safety_gates_and_the_breaker():
    assert {
        "lease.live",
        "lifecycle.generation_current",
        "lifecycle.no_cancellation",
        "completion.circuit_breaker",
    } == HARD_GATES


def test_the_first_failing_gate_in_registry_order_is_the_only_decisive_one():
    decision = decide(
        snap(transcript={"open_calls": ("call-1",)}, evidence_facts=(), result=""),
        POLICY,
    )
    assert failed_ids(decision) == ["transcript.no_open_work", "evidence.required", "result.non_empty"]
    assert decisive_ids(decision) == ["transcript.no_open_work"]
    assert decision.next_action is AgentAction.RESOLVE_OPEN_TOOL_CALLS


def test_a_hard_gate_earlier_in_the_order_outranks_soft_failures():
    decision = decide(
        snap(
            evaluated_state_version=3,
            lifecycle={"cancellation_requested": True, "open_attached_children": ("c",)},
            lease=None,
        ),
        POLICY,
    )
    assert failed_ids(decision) == [
        "lease.live",
        "lifecycle.no_cancellation",
        "transcript.state_version_current",
        "lifecycle.no_active_children",
    ]
    assert decisive_ids(decision) == ["lease.live"]
    assert decision.verdict is Verdict.HARD_BLOCK


def test_the_trace_lists_every_gate_even_after_the_decisive_one():
    decision = decide(snap(lease=None, result=""), POLICY)
    assert [t.gate_id for t in decision.trace] == GATE_IDS
    assert [t.version for t in decision.trace] == [g.version for g in BUILT_IN_GATES]
    assert all(t.reason for t in decision.trace)


def test_a_retired_gate_is_skipped():
    registry = tuple(
        dataclasses.replace(g, state=GateState.RETIRED) if g.gate_id == "result.non_empty" else g
        for g in BUILT_IN_GATES
    )
    decision = decide(snap(result=""), POLICY, registry=registry)
    entry = trace_of(decision, "result.non_empty")
    assert (entry.status, entry.reason, entry.decisive) == (GateStatus.SKIPPED, "retired", False)
    assert decision.verdict is Verdict.ALLOW


def test_a_retired_mandatory_gate_is_skipped_too():
    # Retirement is a registry decision (a new gate version replaces it), not a workspace's.
    registry = tuple(
        dataclasses.replace(g, state=GateState.RETIRED) if g.gate_id == "lease.live" else g for g in BUILT_IN_GATES
    )
    assert trace_of(decide(snap(lease=None), POLICY, registry=registry), "lease.live").status is GateStatus.SKIPPED


def test_a_gate_disabled_by_the_workspace_is_skipped():
    policy = WorkspacePolicy(required_evidence=("tests",), disabled_gates=frozenset({"evidence.required"}))
    decision = decide(snap(evidence_facts=()), policy)
    entry = trace_of(decision, "evidence.required")
    assert (entry.status, entry.reason) == (GateStatus.SKIPPED, "disabled by the workspace policy")
    assert decision.verdict is Verdict.ALLOW


@pytest.mark.parametrize(
    "gate_id, changes",
    [
        ("lease.live", dict(lease=None)),
        ("lifecycle.generation_current", dict(lifecycle={"state": LifecycleState.TERMINAL, "outcome": "CANCELLED"})),
        ("lifecycle.no_cancellation", dict(lifecycle={"cancellation_requested": True})),
    ],
)
def test_mandatory_gates_cannot_be_disabled(gate_id, changes):
    assert gate_id in MANDATORY_GATES
    policy = WorkspacePolicy(required_evidence=("tests",), disabled_gates=frozenset(GATE_IDS))
    decision = decide(snap(**changes), policy)
    assert trace_of(decision, gate_id).status is GateStatus.FAILED
    assert decision.verdict is Verdict.HARD_BLOCK
    assert decisive_ids(decision) == [gate_id]


def test_disabling_every_gate_leaves_exactly_the_mandatory_ones_evaluated():
    evaluation = evaluate_builtins(snap(), WorkspacePolicy(disabled_gates=frozenset(GATE_IDS)))
    evaluated = {f.gate_id for f in evaluation.findings if f.status is not GateStatus.SKIPPED}
    assert evaluated == MANDATORY_GATES


# --- external gates ----------------------------------------------------------------------

REVIEW = ExternalGate("acme.review", "127.0.0.1:7000", 500)
STYLE = ExternalGate("acme.style", "127.0.0.1:7001", 500)
WITH_EXTERNAL = WorkspacePolicy(required_evidence=("tests",), external_gates=(REVIEW, STYLE))
BOTH_PASS = {"acme.review": ExternalAnswer(True, "reviewed"), "acme.style": ExternalAnswer(True, "")}


def test_external_gates_run_after_the_built_ins_and_can_allow():
    decision = decide(snap(), WITH_EXTERNAL, BOTH_PASS)
    assert [t.gate_id for t in decision.trace] == GATE_IDS + ["acme.review", "acme.style"]
    assert [(t.status, t.reason) for t in decision.trace[-2:]] == [
        (GateStatus.PASSED, "reviewed"),
        (GateStatus.PASSED, "passed"),
    ]
    assert decision.verdict is Verdict.ALLOW


def test_external_gates_are_skipped_when_a_built_in_blocks():
    decision = decide(snap(evidence_facts=()), WITH_EXTERNAL, BOTH_PASS)
    for gate_id in ("acme.review", "acme.style"):
        entry = trace_of(decision, gate_id)
        assert (entry.status, entry.reason) == (GateStatus.SKIPPED, "not called: a built-in gate blocked")
    assert decisive_ids(decision) == ["evidence.required"]


@pytest.mark.parametrize(
    "answers, reason",
    [
        (None, "external gate unavailable: no answer"),
        ({}, "external gate unavailable: no answer"),
        ({"acme.style": ExternalAnswer(True, "")}, "external gate unavailable: no answer"),
        (
            {
                "acme.review": ExternalAnswer(None, "deadline exceeded after 500 ms"),
                "acme.style": ExternalAnswer(True, ""),
            },
            "external gate unavailable: deadline exceeded after 500 ms",
        ),
    ],
    ids=["no answers", "empty answers", "this gate unanswered", "errored"],
)
def test_an_external_gate_without_an_answer_fails_closed(answers, reason):
    decision = decide(snap(), WITH_EXTERNAL, answers)
    entry = trace_of(decision, "acme.review")
    assert (entry.status, entry.reason, entry.decisive) == (GateStatus.FAILED, reason, True)
    assert decision.verdict is Verdict.SOFT_BLOCK
    assert decision.next_action is AgentAction.RETRY_LATER
    assert decision.forbidden_actions == (AgentAction.REPORT_COMPLETE,)


def test_a_failing_external_gate_asks_to_address_its_feedback():
    answers = {"acme.review": ExternalAnswer(False, "the changelog is missing"), "acme.style": ExternalAnswer(True, "")}
    decision = decide(snap(), WITH_EXTERNAL, answers)
    entry = trace_of(decision, "acme.review")
    assert (entry.status, entry.reason, entry.decisive) == (GateStatus.FAILED, "the changelog is missing", True)
    assert decision.verdict is Verdict.SOFT_BLOCK
    assert decision.next_action is AgentAction.ADDRESS_GATE_FEEDBACK
    assert "the changelog is missing (acme.review)" in decision.instruction


def test_a_failing_external_gate_without_a_reason_still_says_failed():
    answers = {"acme.review": ExternalAnswer(False, ""), "acme.style": ExternalAnswer(True, "")}
    assert trace_of(decide(snap(), WITH_EXTERNAL, answers), "acme.review").reason == "failed"


def test_only_the_first_failing_external_gate_is_decisive():
    answers = {"acme.review": ExternalAnswer(False, "no"), "acme.style": ExternalAnswer(None, "unavailable")}
    decision = decide(snap(), WITH_EXTERNAL, answers)
    assert failed_ids(decision) == ["acme.review", "acme.style"]
    assert decisive_ids(decision) == ["acme.review"]
    assert decision.next_action is AgentAction.ADDRESS_GATE_FEEDBACK


def test_answers_of_gates_outside_the_policy_are_ignored():
    decision = decide(snap(), POLICY, {"acme.review": ExternalAnswer(False, "no")})
    assert decision.verdict is Verdict.ALLOW
    assert [t.gate_id for t in decision.trace] == GATE_IDS


# --- the circuit breaker -------------------------------------------------------------------


def test_repeated_blocked_attempts_trip_the_breaker_until_the_checkpoint_changes():
    """Replays attempts as the service records them: each decision becomes history."""
    history: list[PriorAttempt] = []

    def attempt(checkpoint=CHECKPOINT, result=RESULT):
        s = snap(evidence_facts=(), transcript={"checkpoint": checkpoint}, attempts=tuple(history), result=result)
        decision = decide(s, POLICY)
        history.append(PriorAttempt(checkpoint, digest(result), blocked=not decision.allowed))
        return decision

    for _ in range(DEFAULT_BREAKER_THRESHOLD):
        assert attempt().next_action is AgentAction.RECORD_EVIDENCE
    tripped = attempt()
    assert tripped.verdict is Verdict.HARD_BLOCK
    assert tripped.next_action is AgentAction.STOP_AND_REPORT
    assert decisive_ids(tripped) == ["completion.circuit_breaker"]
    assert "blocked until the checkpoint changes" in tripped.instruction
    assert attempt().verdict is Verdict.HARD_BLOCK  # still tripped

    # A different result at the same checkpoint is not a repeat.
    assert attempt(result="A different summary.").verdict is Verdict.SOFT_BLOCK
    # A new checkpoint resets it.
    assert attempt(checkpoint="cp-8").next_action is AgentAction.RECORD_EVIDENCE


@pytest.mark.parametrize(
    "attempts, tripped",
    [
        (blocked(3), True),
        (blocked(7), True),
        (blocked(2), False),
        (blocked(5, checkpoint="cp-6"), False),
        (blocked(5, result="another result"), False),
        (blocked(2) + blocked(4, checkpoint="cp-6") + blocked(4, result="other"), False),
        (tuple(PriorAttempt(CHECKPOINT, digest(RESULT), blocked=False) for _ in range(5)), False),
        (blocked(2) + (PriorAttempt(CHECKPOINT, digest(RESULT), blocked=False),) + blocked(1), True),
    ],
    ids=[
        "3 repeats",
        "7 repeats",
        "2 repeats",
        "other checkpoint",
        "other result",
        "mixed",
        "allowed attempts",
        "interleaved",
    ],
)
def test_breaker_counts_blocked_repeats_of_this_result_at_this_checkpoint(attempts, tripped):
    entry = trace_of(decide(snap(attempts=attempts), POLICY), "completion.circuit_breaker")
    assert entry.status is (GateStatus.FAILED if tripped else GateStatus.PASSED)


@pytest.mark.parametrize("threshold", [1, 2, 5])
def test_breaker_threshold_is_configurable(threshold):
    policy = WorkspacePolicy(required_evidence=("tests",), breaker_threshold=threshold)
    assert decide(snap(attempts=blocked(threshold - 1)), policy).verdict is Verdict.ALLOW
    decision = decide(snap(attempts=blocked(threshold)), policy)
    assert decision.verdict is Verdict.HARD_BLOCK
    assert trace_of(decision, "completion.circuit_breaker").reason.startswith(f"{threshold} blocked attempts")


def test_breaker_can_be_disabled_by_a_workspace():
    policy = WorkspacePolicy(disabled_gates=frozenset({"completion.circuit_breaker"}))
    assert decide(snap(attempts=blocked(10)), policy).verdict is Verdict.ALLOW


# --- properties ------------------------------------------------------------------------------

KINDS = ("tests", "lint")
CHECKPOINTS = ("", "cp-6", CHECKPOINT)
RESULTS = ("", " ", RESULT, "other")


@st.composite
def situations(draw):
    """Mostly healthy snapshots with a few things changed, so that every verdict occurs."""

    def rarely(default, strategy):
        return draw(strategy) if draw(st.integers(0, 5)) == 0 else default

    result = rarely(RESULT, st.sampled_from(RESULTS))
    checkpoint = rarely(CHECKPOINT, st.sampled_from(CHECKPOINTS))
    snapshot = snap(
        run={
            "open": rarely(True, st.booleans()),
            "epoch": rarely(2, st.integers(1, 3)),
            "generation": rarely(1, st.integers(1, 2)),
        },
        lease=rarely(
            {},
            st.none()
            | st.fixed_dictionaries(
                {
                    "run_id": st.sampled_from(["run-1", "run-2"]),
                    "epoch": st.integers(1, 3),
                    "expires_at": st.sampled_from([NOW - 1, NOW, NOW + 1]),
                }
            ),
        ),
        claimed_epoch=rarely(2, st.integers(1, 3)),
        transcript={
            "state_version": rarely(12, st.integers(11, 13)),
            "checkpoint": checkpoint,
            "open_calls": rarely(
                (), st.lists(st.sampled_from(["c1", "c2"]), min_size=1, max_size=2, unique=True).map(tuple)
            ),
            "open_step": rarely(None, st.none() | st.just("s1")),
        },
        evaluated_state_version=rarely(12, st.integers(11, 13)),
        evidence_facts=rarely(
            (evidence(),),
            st.lists(
                st.tuples(st.sampled_from(KINDS), st.booleans(), st.sampled_from(CHECKPOINTS), st.integers(1, 2)),
                max_size=4,
            ).map(lambda facts: tuple(EvidenceFact(k, p, c, g, o) for o, (k, p, c, g) in enumerate(facts))),
        ),
        lifecycle={
            "generation": rarely(1, st.integers(1, 2)),
            "state": rarely(LifecycleState.ACTIVE, st.sampled_from(LifecycleState)),
            "cancellation_requested": rarely(False, st.booleans()),
            "open_attached_children": rarely((), st.lists(st.just("child"), max_size=1).map(tuple)),
        },
        attempts=rarely(
            (),
            st.lists(st.tuples(st.sampled_from(CHECKPOINTS), st.sampled_from(RESULTS), st.booleans()), max_size=5).map(
                lambda rows: tuple(PriorAttempt(c, digest(r), b) for c, r, b in rows)
            ),
        ),
        outcome=rarely(RequestedOutcome.COMPLETED, st.sampled_from(RequestedOutcome)),
        result=result,
    )
    externals = draw(st.lists(st.sampled_from([REVIEW, STYLE]), unique=True, max_size=2))
    policy = WorkspacePolicy(
        disabled_gates=frozenset(rarely([], st.lists(st.sampled_from(GATE_IDS), max_size=3))),
        required_evidence=rarely(("tests",), st.lists(st.sampled_from(KINDS), unique=True, max_size=2).map(tuple)),
        breaker_threshold=draw(st.integers(1, 4)),
        external_gates=tuple(externals),
    )
    answers = {
        g.gate_id: rarely(
            ExternalAnswer(True, "ok"),
            st.builds(ExternalAnswer, st.none() | st.booleans(), st.sampled_from(["", "why"])),
        )
        for g in externals
        if rarely(True, st.booleans())
    }
    return snapshot, policy, answers


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(situations())
def test_decide_is_deterministic_and_allows_exactly_when_no_gate_failed(situation):
    snapshot, policy, answers = situation
    decision = decide(snapshot, policy, answers)
    assert decide(copy.deepcopy(snapshot), copy.deepcopy(policy), copy.deepcopy(answers)) == decision

    failures = [t for t in decision.trace if t.status is GateStatus.FAILED]
    assert decision.allowed == (not failures)
    assert [t.gate_id for t in decision.trace] == GATE_IDS + [g.gate_id for g in policy.external_gates]
    if failures:
        assert [t for t in decision.trace if t.decisive] == [failures[0]]
        hard = failures[0].gate_id in HARD_GATES
        assert decision.verdict is (Verdict.HARD_BLOCK if hard else Verdict.SOFT_BLOCK)
        assert AgentAction.REPORT_COMPLETE in decision.forbidden_actions
    else:
        assert not any(t.decisive for t in decision.trace)
        assert decision.next_action is AgentAction.REPORT_COMPLETE
    for t in decision.trace:
        if t.gate_id in MANDATORY_GATES:
            assert t.status is not GateStatus.SKIPPED
