"""Fast unit tests of the MCP server's pure parts (answers, idempotency, failures)
and of its LeaseKeeper, with fakes instead of services."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import grpc
import pytest
from google.protobuf import any_pb2
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2, status_pb2
from hypothesis import example, given
from hypothesis import strategies as st

import funnel_mcp.leases
from funnel.client import FunnelError
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import errors_pb2 as completion_errors
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import errors_pb2 as lifecycle_errors
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.validation import id_problem
from funnel_mcp import answers
from funnel_mcp.answers import (
    EVIDENCE_VERDICTS,
    FINAL_STATUSES,
    REQUESTED_OUTCOMES,
    RUN_OUTCOMES,
    EvidenceVerdictWord,
    FinalStatusWord,
    RequestedOutcomeWord,
    RunOutcomeWord,
    attempt_answer,
    closed_run,
    decision_answer,
    instant,
    recorded_evidence,
    task_truth,
    word,
)
from funnel_mcp.failures import ADVICE, INPUT_REASONS, RETRYABLE, Failure, failure, unavailable
from funnel_mcp.idempotency import call_identity, request_id
from funnel_mcp.leases import PROCESS, SESSIONLESS, HeldRun, LeaseKeeper
from funnel_mcp.rebinding import transport_security

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# 2023-11-14T22:13:20Z
SECONDS = 1_700_000_000


def ts(seconds: int, nanos: int = 0) -> Timestamp:
    return Timestamp(seconds=seconds, nanos=nanos)


# ============================================================================ answers


@pytest.mark.parametrize(
    ("name", "prefix", "expected"),
    [
        ("FINAL_STATUS_IN_PROGRESS", "FINAL_STATUS_", "in_progress"),
        ("FINAL_STATUS_DONE", "FINAL_STATUS_", "done"),
        ("FINAL_STATUS_UNSPECIFIED", "FINAL_STATUS_", ""),
        ("VERDICT_SOFT_BLOCK", "VERDICT_", "soft_block"),
        ("VERDICT_UNSPECIFIED", "VERDICT_", ""),
        ("AGENT_ACTION_RESOLVE_OPEN_TOOL_CALLS", "AGENT_ACTION_", "resolve_open_tool_calls"),
        ("AGENT_ACTION_UNSPECIFIED", "AGENT_ACTION_", ""),
        ("SETTLEMENT_STATUS_REJECTED", "SETTLEMENT_STATUS_", "rejected"),
        ("TASK_EFFECT_STATUS_SET", "TASK_EFFECT_", "status_set"),
        ("EVIDENCE_VERDICT_PASSED", "EVIDENCE_VERDICT_", "passed"),
        ("GENERATION_STATE_TERMINAL", "GENERATION_STATE_", "terminal"),
        ("TERMINAL_OUTCOME_TIMED_OUT", "TERMINAL_OUTCOME_", "timed_out"),
        ("TERMINAL_OUTCOME_UNSPECIFIED", "TERMINAL_OUTCOME_", ""),
        ("WORK_STATUS_IN_PROGRESS", "WORK_STATUS_", "in_progress"),
    ],
)
def test_word(name: str, prefix: str, expected: str) -> None:
    assert word(name, prefix) == expected


@pytest.mark.parametrize(
    ("enum", "prefix"),
    [
        (completion_enums.Verdict, "VERDICT_"),
        (completion_enums.AgentAction, "AGENT_ACTION_"),
        (completion_enums.SettlementStatus, "SETTLEMENT_STATUS_"),
        (completion_enums.RunOutcome, "RUN_OUTCOME_"),
        (completion_enums.FinalStatus, "FINAL_STATUS_"),
        (completion_enums.EvidenceVerdict, "EVIDENCE_VERDICT_"),
        (completion_enums.TaskEffect, "TASK_EFFECT_"),
        (completion_enums.RequestedOutcome, "REQUESTED_OUTCOME_"),
        (lifecycle_enums.GenerationState, "GENERATION_STATE_"),
        (lifecycle_enums.TerminalOutcome, "TERMINAL_OUTCOME_"),
        (lifecycle_enums.WorkStatus, "WORK_STATUS_"),
    ],
)
def test_word_over_whole_enums(enum: Any, prefix: str) -> None:
    words = {value: word(enum.Name(value), prefix) for value in enum.values()}
    assert words[0] == ""
    for value, got in words.items():
        if value:
            assert got and got == got.lower() and not got.startswith(prefix.lower())
    assert len(set(words.values())) == len(words)


@pytest.mark.parametrize(
    ("literal", "mapping", "enum", "prefix"),
    [
        (RunOutcomeWord, RUN_OUTCOMES, completion_enums.RunOutcome, "RUN_OUTCOME_"),
        (FinalStatusWord, FINAL_STATUSES, completion_enums.FinalStatus, "FINAL_STATUS_"),
        (EvidenceVerdictWord, EVIDENCE_VERDICTS, completion_enums.EvidenceVerdict, "EVIDENCE_VERDICT_"),
    ],
)
def test_vocabularies_match_their_maps_and_enums(literal: Any, mapping: dict[str, int], enum: Any, prefix: str) -> None:
    assert set(get_args(literal)) == set(mapping)
    # Each word maps to the enum value whose name gives that same word back...
    for key, value in mapping.items():
        assert word(enum.Name(value), prefix) == key
    # ...and every specified value of the enum has a word.
    assert set(mapping.values()) == {v for v in enum.values() if v != 0}


def test_every_tool_speaks_the_outcome_words_of_complete_task() -> None:
    """attempt_completion's and get_task's outcomes are seed 001's run outcomes
    where they mean the same (COMPLETED is `succeeded`), and cover their enums."""
    assert set(get_args(RequestedOutcomeWord)) == set(REQUESTED_OUTCOMES) <= set(get_args(RunOutcomeWord))
    assert set(REQUESTED_OUTCOMES.values()) == {v for v in completion_enums.RequestedOutcome.values() if v != 0}
    assert REQUESTED_OUTCOMES["succeeded"] == completion_enums.REQUESTED_OUTCOME_COMPLETED
    assert set(answers.TERMINAL_OUTCOMES) == {v for v in lifecycle_enums.TerminalOutcome.values() if v != 0}
    assert set(answers.TERMINAL_OUTCOMES.values()) - {"timed_out"} <= set(get_args(RunOutcomeWord))
    assert answers.TERMINAL_OUTCOMES[lifecycle_enums.TERMINAL_OUTCOME_COMPLETED] == "succeeded"
    # The former word still works; anything else is left for validation to refuse.
    assert [answers.former_requested_outcome(v) for v in ("completed", "succeeded", "done", 3)] == [
        "succeeded",
        "succeeded",
        "done",
        3,
    ]


INSTANT_FORMAT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


@pytest.mark.parametrize(
    ("seconds", "nanos", "expected"),
    [
        (SECONDS, 123_456_789, "2023-11-14T22:13:20.123456Z"),  # nanos truncated, not rounded
        (SECONDS, 999_999_999, "2023-11-14T22:13:20.999999Z"),
        (SECONDS, 1_000, "2023-11-14T22:13:20.000001Z"),
        (-1, 500_000_000, "1969-12-31T23:59:59.500000Z"),
        # Whole seconds: the docstring promises microseconds ("...:00.123456Z").
        pytest.param(0, 0, "1970-01-01T00:00:00.000000Z", id="epoch-0"),
        pytest.param(SECONDS, 999, "2023-11-14T22:13:20.000000Z", id="sub-microsecond-nanos"),
        # Far-future instants: float division must not carry into the next second.
        pytest.param(32_503_679_999, 999_999_000, "2999-12-31T23:59:59.999999Z", id="year-2999"),
        pytest.param(253_402_300_799, 999_999_999, "9999-12-31T23:59:59.999999Z", id="max-timestamp"),
    ],
)
def test_instant(seconds: int, nanos: int, expected: str) -> None:
    got = instant(ts(seconds, nanos))
    assert got == expected
    assert INSTANT_FORMAT.match(got)


@given(
    seconds=st.integers(min_value=-62_135_596_800, max_value=253_402_300_799),  # Timestamp's range
    nanos=st.integers(min_value=0, max_value=999_999_999),
)
@example(seconds=SECONDS, nanos=123_456_789)
@example(seconds=32_503_679_999, nanos=999_999_000)
def test_instant_is_the_exact_instant_truncated_to_microseconds(seconds: int, nanos: int) -> None:
    expected = EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)
    got = instant(ts(seconds, nanos))
    assert got.endswith("Z")
    assert datetime.fromisoformat(got.removesuffix("Z") + "+00:00") == expected


def block_details(**overrides: Any) -> completion_types.BlockDetails:
    fields: dict[str, Any] = {
        "decisive_gate": "evidence.required",
        "missing_evidence_kinds": ["tests", "lint"],
        "failing_evidence_kinds": ["typecheck"],
        "evidence_checkpoint": "abc123",
        "open_tool_call_ids": ["call-1"],
        "open_step_id": "step-1",
        "open_turn_id": "turn-1",
        "open_child_task_ids": ["child-1", "child-2"],
        "current_lease": completion_types.Lease(task_id="t-1", run_id="run-other", epoch=3),
        "current_state_version": 17,
        "current_generation": 2,
        "lifecycle_reason": "ACTIVE_ATTACHED_CHILD",
        "gate_feedback": "cover the new branch",
    }
    fields.update(overrides)
    return completion_types.BlockDetails(**fields)


def a_decision(details: completion_types.BlockDetails | None = None, **overrides: Any) -> completion_types.Decision:
    fields: dict[str, Any] = {
        "verdict": completion_enums.VERDICT_HARD_BLOCK,
        "next_action": completion_enums.AGENT_ACTION_RECORD_EVIDENCE,
        "forbidden_actions": [
            completion_enums.AGENT_ACTION_REPORT_COMPLETE,
            completion_enums.AGENT_ACTION_ATTEMPT_COMPLETION,
        ],
        "instruction": "Record the missing evidence.",
        "state_version": 5,
        "checkpoint": "abc123",
    }
    fields.update(overrides)
    decision = completion_types.Decision(**fields)
    if details is not None:
        decision.details.CopyFrom(details)
    return decision


FULL_MISSING = {
    "decisiveGate": "evidence.required",
    "missingEvidenceKinds": ["tests", "lint"],
    "failingEvidenceKinds": ["typecheck"],
    "evidenceCheckpoint": "abc123",
    "openToolCallIds": ["call-1"],
    "openChildTaskIds": ["child-1", "child-2"],
    "currentLeaseRunId": "run-other",
    "currentStateVersion": 17,
    "lifecycleReason": "ACTIVE_ATTACHED_CHILD",
    "gateFeedback": "cover the new branch",
}
BLOCKED = {
    "verdict": "hard_block",
    "nextAction": "record_evidence",
    "instruction": "Record the missing evidence.",
    "forbiddenActions": ["report_complete", "attempt_completion"],
}


def test_decision_answer_with_every_detail() -> None:
    assert decision_answer(a_decision(block_details())).model_dump() == {**BLOCKED, "missing": FULL_MISSING}


def test_decision_answer_without_optional_details() -> None:
    details = completion_types.BlockDetails(decisive_gate="lifecycle.settlement")
    assert decision_answer(a_decision(details)).model_dump()["missing"] == {
        "decisiveGate": "lifecycle.settlement",
        "missingEvidenceKinds": [],
        "failingEvidenceKinds": [],
        "evidenceCheckpoint": None,
        "openToolCallIds": [],
        "openChildTaskIds": [],
        "currentLeaseRunId": None,
        "currentStateVersion": None,
        "lifecycleReason": None,
        "gateFeedback": None,
    }


@pytest.mark.parametrize(
    ("overrides", "field", "expected"),
    [
        ({"evidence_checkpoint": ""}, "evidenceCheckpoint", ""),  # set but empty: "name the empty checkpoint"
        ({"current_state_version": 0}, "currentStateVersion", 0),  # set to zero is not absent
        ({"current_lease": completion_types.Lease()}, "currentLeaseRunId", ""),
        ({"lifecycle_reason": ""}, "lifecycleReason", None),
        ({"gate_feedback": ""}, "gateFeedback", None),
    ],
)
def test_decision_answer_presence(overrides: dict[str, Any], field: str, expected: object) -> None:
    missing = decision_answer(a_decision(block_details(**overrides))).missing
    assert missing is not None
    assert getattr(missing, field) == expected


def test_decision_answer_unset_optionals_are_none() -> None:
    details = block_details()
    for name in ("evidence_checkpoint", "current_state_version", "current_lease"):
        details.ClearField(name)
    missing = decision_answer(a_decision(details)).missing
    assert missing is not None
    assert (missing.evidenceCheckpoint, missing.currentStateVersion, missing.currentLeaseRunId) == (None, None, None)


def test_decision_answer_allow_without_details() -> None:
    decision = a_decision(
        verdict=completion_enums.VERDICT_ALLOW,
        next_action=completion_enums.AGENT_ACTION_REPORT_COMPLETE,
        forbidden_actions=[],
    )
    assert decision_answer(decision).model_dump() == {
        "verdict": "allow",
        "nextAction": "report_complete",
        "instruction": "Record the missing evidence.",
        "forbiddenActions": [],
        "missing": None,
    }


@pytest.mark.parametrize("with_decision", [True, False])
def test_closed_run(with_decision: bool) -> None:
    response = completion_messages.CompleteRunResponse(
        run_id="run-1",
        finish_time=ts(SECONDS, 250_000_000),
        final_status=completion_enums.FINAL_STATUS_IN_PROGRESS,
        tokens_total=1234,
        notes_truncated=True,
        task_effect=completion_enums.TASK_EFFECT_STATUS_SET,
        task_effect_reason="the task was set in_progress",
    )
    if with_decision:
        response.decision.CopyFrom(a_decision(block_details()))
    assert closed_run(response).model_dump() == {
        "runId": "run-1",
        "finishedAt": "2023-11-14T22:13:20.250000Z",
        "finalStatus": "in_progress",
        "tokensTotal": 1234,
        "notesTruncated": True,
        "taskEffect": "status_set",
        "taskEffectReason": "the task was set in_progress",
        "nextStep": "Nothing required: the task stays in_progress and no run holds it; a new run (claim_task) "
        "continues it.",
        # No action in it: the run is closed.
        "decision": {"verdict": "hard_block", "missing": FULL_MISSING} if with_decision else None,
    }


@pytest.mark.parametrize(
    ("settlement", "expected"),
    [
        (completion_enums.SETTLEMENT_STATUS_PENDING, "pending"),
        (completion_enums.SETTLEMENT_STATUS_SETTLED, "settled"),
        (completion_enums.SETTLEMENT_STATUS_REJECTED, "rejected"),
    ],
)
def test_attempt_answer_with_completion(settlement: completion_enums.SettlementStatus, expected: str) -> None:
    decision = a_decision(
        verdict=completion_enums.VERDICT_ALLOW,
        next_action=completion_enums.AGENT_ACTION_REPORT_COMPLETE,
        forbidden_actions=[],
    )
    response = completion_messages.AttemptCompletionResponse(
        decision=decision,
        completion=completion_types.Completion(completion_id="cmp-1", settlement=settlement, decision=decision),
    )
    answer = attempt_answer(response)
    assert answer.model_dump() == {
        "verdict": "allow",
        "nextAction": "report_complete",
        "instruction": "Record the missing evidence.",
        "forbiddenActions": [],
        "missing": None,
        "completionId": "cmp-1",
        "settlement": expected,
    }


def test_attempt_answer_blocked_without_completion() -> None:
    answer = attempt_answer(completion_messages.AttemptCompletionResponse(decision=a_decision(block_details())))
    assert answer.model_dump() == {**BLOCKED, "missing": FULL_MISSING, "completionId": None, "settlement": None}


@pytest.mark.parametrize(
    ("verdict", "expected"),
    [(completion_enums.EVIDENCE_VERDICT_PASSED, "passed"), (completion_enums.EVIDENCE_VERDICT_FAILED, "failed")],
)
def test_recorded_evidence(verdict: completion_enums.EvidenceVerdict, expected: str) -> None:
    response = completion_messages.RecordEvidenceResponse(
        evidence=completion_types.Evidence(
            workspace_id="acme",
            task_id="t-1",
            generation=3,
            evidence_id="ev-1",
            kind="tests",
            verdict=verdict,
            checkpoint="",
            details="42 passed",
            run_id="run-1",
            record_time=ts(SECONDS, 7_000),
        )
    )
    assert recorded_evidence(response).model_dump() == {
        "evidenceId": "ev-1",
        "taskId": "t-1",
        "generation": 3,
        "kind": "tests",
        "verdict": expected,
        "checkpoint": "",
        "recordedAt": "2023-11-14T22:13:20.000007Z",
    }


@pytest.mark.parametrize(
    ("state", "outcome", "state_word", "terminal_outcome"),
    [
        (lifecycle_enums.GENERATION_STATE_REGISTERED, lifecycle_enums.TERMINAL_OUTCOME_UNSPECIFIED, "registered", None),
        (lifecycle_enums.GENERATION_STATE_ACTIVE, lifecycle_enums.TERMINAL_OUTCOME_UNSPECIFIED, "active", None),
        # An outcome on a task that is not terminal is not reported.
        (lifecycle_enums.GENERATION_STATE_SUSPENDED, lifecycle_enums.TERMINAL_OUTCOME_FAILED, "suspended", None),
        (
            lifecycle_enums.GENERATION_STATE_TERMINAL,
            lifecycle_enums.TERMINAL_OUTCOME_COMPLETED,
            "terminal",
            "succeeded",
        ),
        (
            lifecycle_enums.GENERATION_STATE_TERMINAL,
            lifecycle_enums.TERMINAL_OUTCOME_CANCELLED,
            "terminal",
            "cancelled",
        ),
        (lifecycle_enums.GENERATION_STATE_TERMINAL, lifecycle_enums.TERMINAL_OUTCOME_FAILED, "terminal", "failed"),
        (
            lifecycle_enums.GENERATION_STATE_TERMINAL,
            lifecycle_enums.TERMINAL_OUTCOME_TIMED_OUT,
            "terminal",
            "timed_out",
        ),
    ],
)
def test_task_truth_states(
    state: lifecycle_enums.GenerationState,
    outcome: lifecycle_enums.TerminalOutcome,
    state_word: str,
    terminal_outcome: str | None,
) -> None:
    response = lifecycle_messages.GetTaskResponse(
        task=lifecycle_types.Task(
            workspace_id="acme",
            task_id="t-1",
            generation=2,
            revision=9,
            state=state,
            outcome=outcome,
            cancellation=lifecycle_enums.CANCELLATION_STATE_NONE,
            work_status=lifecycle_enums.WORK_STATUS_IN_PROGRESS,
            completion_id="cmp-1" if terminal_outcome == "succeeded" else "",
        ),
        open_attached_child_task_ids=["c-1", "c-2"],
    )
    assert task_truth(response).model_dump() == {
        "taskId": "t-1",
        "generation": 2,
        "revision": 9,
        "state": state_word,
        "terminalOutcome": terminal_outcome,
        "cancellationRequested": False,
        "workStatus": "in_progress",
        "completionId": "cmp-1" if terminal_outcome == "succeeded" else None,
        "openChildTaskIds": ["c-1", "c-2"],
    }


@pytest.mark.parametrize(
    ("cancellation", "requested"),
    [
        (lifecycle_enums.CANCELLATION_STATE_UNSPECIFIED, False),
        (lifecycle_enums.CANCELLATION_STATE_NONE, False),
        (lifecycle_enums.CANCELLATION_STATE_REQUESTED, True),
    ],
)
def test_task_truth_cancellation(cancellation: lifecycle_enums.CancellationState, requested: bool) -> None:
    task = lifecycle_types.Task(task_id="t-1", state=lifecycle_enums.GENERATION_STATE_ACTIVE, cancellation=cancellation)
    truth = task_truth(lifecycle_messages.GetTaskResponse(task=task))
    assert truth.cancellationRequested is requested
    assert truth.openChildTaskIds == []
    assert truth.workStatus == ""


def test_claimed_run() -> None:
    response = completion_messages.ClaimTaskResponse(
        run=completion_types.Run(run_id="run-1", task_id="t-1", generation=4),
        lease=completion_types.Lease(task_id="t-1", run_id="run-1", epoch=6, expire_time=ts(SECONDS + 30, 5_000_000)),
    )
    assert answers.claimed_run(response).model_dump() == {
        "runId": "run-1",
        "taskId": "t-1",
        "generation": 4,
        "leaseEpoch": 6,
        "leaseExpiresAt": "2023-11-14T22:13:50.005000Z",
    }


# ======================================================================== idempotency

REQUEST_ID = re.compile(r"^mcp-[0-9a-f]{40}$")
BASE: dict[str, Any] = {
    "tool": "complete_task",
    "workspace": "acme",
    "arguments": {"runId": "run-1", "outcome": "succeeded", "tokens": {"input": 1, "output": 2}},
    "call": "host:toolu_01",
}


def test_request_id_is_deterministic_and_well_formed() -> None:
    first = request_id(**BASE)
    assert first == request_id(**json.loads(json.dumps(BASE)))
    assert REQUEST_ID.match(first)
    assert id_problem(first) is None


def test_request_id_ignores_key_order() -> None:
    reordered = {"tokens": {"output": 2, "input": 1}, "outcome": "succeeded", "runId": "run-1"}
    assert list(reordered) != list(BASE["arguments"])
    assert request_id(**{**BASE, "arguments": reordered}) == request_id(**BASE)


@pytest.mark.parametrize(
    "change",
    [
        {"tool": "attempt_completion"},
        {"workspace": "acme-2"},
        {"call": None},
        {"call": "host:toolu_02"},
        {"call": "connection:s1:1"},
        {"arguments": {}},
        {"arguments": {**BASE["arguments"], "runId": "run-2"}},
        {"arguments": {**BASE["arguments"], "notes": None}},
        {"arguments": {**BASE["arguments"], "tokens": {"input": "1", "output": 2}}},  # 1 vs "1"
        {"arguments": {**BASE["arguments"], "tokens": {"input": 1.5, "output": 2}}},
        {"arguments": {**BASE["arguments"], "outcome": "Succeeded"}},
    ],
)
def test_request_id_differs_when_the_call_differs(change: dict[str, Any]) -> None:
    assert request_id(**{**BASE, **change}) != request_id(**BASE)


JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(item) for item in value]
    return value


@given(
    tool=st.text(),
    workspace=st.text(),
    arguments=st.dictionaries(st.text(), JSON_VALUES, max_size=6),
    call=st.none() | st.text(),
)
@example(tool="claim_task", workspace="ünïcødé", arguments={"taskId": "タスク\u0301", "x": ["\U0001f600"]}, call=None)
def test_request_id_properties(tool: str, workspace: str, arguments: dict[str, Any], call: str | None) -> None:
    rid = request_id(tool, workspace, arguments, call)
    assert id_problem(rid) is None
    assert len(rid) <= 128
    assert REQUEST_ID.match(rid)
    assert request_id(tool, workspace, reversed_keys(arguments), call) == rid


@pytest.mark.parametrize(
    ("meta", "connection", "jsonrpc_id", "expected"),
    [
        ("toolu_01", "session-1", 5, "host:toolu_01"),
        ("toolu_01", None, 5, "host:toolu_01"),
        (42, "session-1", 5, "host:42"),
        (0, None, 5, "host:0"),
        ("", "session-1", 5, "connection:session-1:5"),
        ("", None, 5, None),
        (None, "session-1", 5, "connection:session-1:5"),
        (None, "session-1", "req-a", "connection:session-1:req-a"),
        (None, "stdio-123", 0, "connection:stdio-123:0"),
        ({"id": "x"}, "session-1", 5, "connection:session-1:5"),
        (["x"], None, 5, None),
        (1.5, None, 5, None),
        (None, None, 5, None),
    ],
)
def test_call_identity(meta: object, connection: str | None, jsonrpc_id: object, expected: str | None) -> None:
    assert call_identity(meta, connection, jsonrpc_id) == expected


def test_call_identity_sources_never_collide() -> None:
    # The same text as a host id and as a connection id names different calls.
    assert call_identity("s:1", None, None) != call_identity(None, "s", 1)


# =========================================================================== failures


@pytest.mark.parametrize("reason", sorted(ADVICE))
def test_failure_text_with_advice(reason: str) -> None:
    text = Failure("FAILED_PRECONDITION", reason, "the service said no").text()
    assert text == f"{reason} (FAILED_PRECONDITION): the service said no. {ADVICE[reason]}"


@pytest.mark.parametrize("reason", sorted(INPUT_REASONS))
def test_failure_text_of_input_reasons(reason: str) -> None:
    text = Failure("INVALID_ARGUMENT", reason, "taskId is required").text()
    assert text == f"{reason} (INVALID_ARGUMENT): taskId is required. Fix the arguments and call again."


@pytest.mark.parametrize("reason", ["REQUEST_ID_REUSED", "INTERNAL_FAULT", "SOMETHING_NEW"])
def test_failure_text_without_advice(reason: str) -> None:
    assert Failure("ABORTED", reason, "boom").text() == f"{reason} (ABORTED): boom."


def test_failure_text_with_metadata() -> None:
    failed = Failure("FAILED_PRECONDITION", "LEASE_EXPIRED", "lease lapsed.", (("epoch", "3"), ("runId", "run-1")))
    text = failed.text()
    assert text.startswith("LEASE_EXPIRED (FAILED_PRECONDITION):")
    assert (
        text == f"LEASE_EXPIRED (FAILED_PRECONDITION): lease lapsed. (epoch=3, runId=run-1) {ADVICE['LEASE_EXPIRED']}"
    )


def test_failure_text_when_reason_is_the_code() -> None:
    assert Failure("NOT_FOUND", "NOT_FOUND", "no such thing...").text() == "NOT_FOUND: no such thing."


def test_unavailable() -> None:
    text = unavailable("the completion service").text()
    assert text.startswith("UNAVAILABLE: the completion service did not answer in time")
    assert text.endswith("(advice=read the state (get_task) before repeating the call)")


def test_advice_names_real_reasons() -> None:
    reasons = set(completion_errors.ErrorReason.keys()) | set(lifecycle_errors.ErrorReason.keys())
    assert set(ADVICE) <= reasons
    assert reasons >= INPUT_REASONS


def rpc_error(code: grpc.StatusCode, message: str, info: error_details_pb2.ErrorInfo | None = None) -> FunnelError:
    """A failed call with `info` in its status, as funnel.client raises it."""
    trailing = grpc.aio.Metadata()
    if info is not None:
        packed = any_pb2.Any()
        packed.Pack(info)
        # grpc_status.rpc_status.from_call insists that code and message match the call's.
        status = status_pb2.Status(code=code.value[0], message=message, details=[packed])
        trailing = grpc.aio.Metadata(("grpc-status-details-bin", status.SerializeToString()))
    return FunnelError.from_rpc_error(
        grpc.aio.AioRpcError(code, initial_metadata=grpc.aio.Metadata(), trailing_metadata=trailing, details=message)
    )


@pytest.mark.parametrize(
    ("code", "reason", "metadata"),
    [
        (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_EXPIRED", {"runId": "run-1", "epoch": "3"}),
        (grpc.StatusCode.NOT_FOUND, "RUN_NOT_FOUND", {}),
        (grpc.StatusCode.INVALID_ARGUMENT, "FIELD_REQUIRED", {"field": "task_id"}),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "RATE_LIMITED", {}),
    ],
)
def test_failure_of_an_error_with_error_info(code: grpc.StatusCode, reason: str, metadata: dict[str, str]) -> None:
    info = error_details_pb2.ErrorInfo(reason=reason, domain="completion.funnel.io", metadata=metadata)
    failed = failure(rpc_error(code, "it failed", info))
    assert failed == Failure(code.name, reason, "it failed", tuple(sorted(metadata.items())))
    assert failed.text().startswith(f"{reason} ({code.name}): it failed.")


def test_failure_of_an_error_with_an_empty_reason() -> None:
    info = error_details_pb2.ErrorInfo(reason="", metadata={"k": "v"})
    assert failure(rpc_error(grpc.StatusCode.ABORTED, "conflict", info)) == Failure(
        "ABORTED", "ABORTED", "conflict", (("k", "v"),)
    )


@pytest.mark.parametrize(
    ("code", "message", "expected_message"),
    [
        (grpc.StatusCode.UNAVAILABLE, "connection refused", "connection refused"),
        (grpc.StatusCode.INTERNAL, "", "INTERNAL"),
    ],
)
def test_failure_of_an_error_without_details(code: grpc.StatusCode, message: str, expected_message: str) -> None:
    failed = failure(rpc_error(code, message))
    assert failed == Failure(code.name, code.name, expected_message, ())
    assert failed.text() == f"{code.name}: {expected_message}."


def test_retryable_codes() -> None:
    assert {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED} == RETRYABLE


# ============================================================================= Host and Origin


def test_every_bind_checks_host_and_origin_against_its_own_names_and_the_flags() -> None:
    loopback = transport_security("127.0.0.2", 8080)
    assert loopback.enable_dns_rebinding_protection
    assert loopback.allowed_hosts == ["127.0.0.2:8080", "localhost:8080", "127.0.0.1:8080", "[::1]:8080"]
    assert "http://127.0.0.2:8080" in loopback.allowed_origins and "https://localhost:8080" in loopback.allowed_origins
    remote = transport_security("0.0.0.0", 8080, ["mcp.example.com", "mcp.internal:*"], ["https://app.example"])
    assert remote.enable_dns_rebinding_protection
    assert remote.allowed_hosts == [
        "localhost:8080",
        "127.0.0.1:8080",
        "[::1]:8080",
        "mcp.example.com",
        "mcp.internal:*",
    ]
    assert {"https://mcp.example.com", "http://mcp.internal:*", "https://app.example"} <= set(remote.allowed_origins)
    assert not any("0.0.0.0" in name for name in remote.allowed_hosts + remote.allowed_origins)


# ============================================================================= leases

WAIT = 10.0  # seconds a test waits for something that should happen much sooner, on a loaded machine too
IDLE = 60.0  # a sessionless holder's idle timeout that these tests never reach
SESSION = "session s1"


def held_run(run_id: str, epoch: int = 1) -> HeldRun:
    return HeldRun(workspace="acme", run_id=run_id, epoch=epoch, token="tok")


class FakeRenew:
    """Records renewals; raises what `effects[run_id]` lists, one per call, or runs
    `blocking` runs' calls until cancelled."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.calls: list[tuple[HeldRun, float]] = []
        self.effects: dict[str, list[BaseException]] = {}
        self.blocking: set[str] = set()
        self.cancelled: list[str] = []
        self.withdrawn: list[tuple[str, str, float]] = []
        self.changed = asyncio.Condition()

    async def __call__(self, run: HeldRun) -> None:
        self.calls.append((run, self.loop.time()))
        async with self.changed:
            self.changed.notify_all()
        if run.run_id in self.blocking:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(run.run_id)
                raise
        pending = self.effects.get(run.run_id)
        if pending:
            raise pending.pop(0)

    async def withdraw(self, run: HeldRun, why: str) -> None:
        """Records withdrawals as (run id, why, time); a `blocking` run's never returns."""
        if run.run_id in self.blocking:
            await asyncio.Event().wait()
        self.withdrawn.append((run.run_id, why, self.loop.time()))
        async with self.changed:
            self.changed.notify_all()

    def times(self, run_id: str) -> list[float]:
        return [at for run, at in self.calls if run.run_id == run_id]

    def count(self, run_id: str) -> int:
        return len(self.times(run_id))

    async def until(self, predicate: Callable[[], bool], timeout: float = WAIT) -> None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(predicate), timeout)


async def eventually(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


class RecordedSleeps:
    """funnel_mcp.leases' asyncio, but each wait it asks for (a timeout around the
    wait for its holder's end) is recorded by run: what the keeper decided to wait,
    which load can only shorten (the keeper subtracts the clock read just before) and
    never lengthen, so upper bounds on it hold however loaded the machine is."""

    def __init__(self) -> None:
        self.asked: dict[str, list[float]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    def timeout(self, delay: float) -> asyncio.Timeout:
        task = asyncio.current_task()
        assert task is not None
        self.asked.setdefault(task.get_name().removeprefix("lease "), []).append(delay)
        return asyncio.timeout(delay)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> RecordedSleeps:
    recorded = RecordedSleeps()
    monkeypatch.setattr(funnel_mcp.leases, "asyncio", recorded)
    return recorded


def status_error(code: grpc.StatusCode) -> FunnelError:
    """A failed renewal, as funnel.client raises it."""
    return FunnelError(code, f"{code.name} from fake")


async def test_renews_every_third_of_the_ttl_while_held(sleeps: RecordedSleeps) -> None:
    renew = FakeRenew()
    ttl = 0.3
    async with LeaseKeeper(renew, renew.withdraw, ttl, IDLE) as keeper:
        started = renew.loop.time()
        keeper.hold(held_run("r1"), SESSION)
        assert keeper.held() == {"r1"}
        await renew.until(lambda: renew.count("r1") >= 3)
        assert keeper.held() == {"r1"}
    times = renew.times("r1")
    gaps = [later - earlier for earlier, later in itertools.pairwise([started, *times])]
    assert all(ttl / 3 * 0.9 <= gap for gap in gaps), gaps
    assert len(sleeps.asked["r1"]) >= 3 and all(0 < asked <= ttl / 3 for asked in sleeps.asked["r1"][:3])
    assert all(run == held_run("r1") for run, _ in renew.calls)


async def test_release_stops_renewal() -> None:
    renew = FakeRenew()
    async with LeaseKeeper(renew, renew.withdraw, 0.15, IDLE) as keeper:
        keeper.hold(held_run("r1"), SESSION)
        keeper.hold(held_run("r2"), SESSION)
        await renew.until(lambda: renew.count("r1") >= 1)
        keeper.release("r1")
        keeper.release("never-held")  # no-op
        assert keeper.held() == {"r2"}
        count = renew.count("r1")
        await renew.until(lambda: renew.count("r2") >= 4)  # three more intervals
        assert renew.count("r1") == count
        assert keeper.held() == {"r2"}


async def test_release_then_hold_again_keeps_the_new_renewal() -> None:
    renew = FakeRenew()
    async with LeaseKeeper(renew, renew.withdraw, 0.15, IDLE) as keeper:
        keeper.hold(held_run("r1", epoch=1), SESSION)
        await renew.until(lambda: renew.count("r1") >= 1)
        keeper.release("r1")
        keeper.hold(held_run("r1", epoch=2), SESSION)  # before the old task has seen its cancellation
        await asyncio.sleep(0)
        assert keeper.held() == {"r1"}
        await renew.until(lambda: renew.count("r1") >= 3)
        assert keeper.held() == {"r1"}
    assert [run.epoch for run, _ in renew.calls] == [1, 2, 2]


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.FAILED_PRECONDITION,  # LEASE_NOT_CURRENT, LEASE_EXPIRED, RUN_ALREADY_FINISHED
        grpc.StatusCode.PERMISSION_DENIED,  # RUN_NOT_HELD
    ],
)
async def test_a_non_retryable_error_stops_that_run_only(code: grpc.StatusCode) -> None:
    renew = FakeRenew()
    renew.effects["lost"] = [status_error(code)]
    async with LeaseKeeper(renew, renew.withdraw, 0.15, IDLE) as keeper:
        keeper.hold(held_run("lost"), SESSION)
        keeper.hold(held_run("kept"), SESSION)
        await eventually(lambda: "lost" not in keeper.held())
        assert keeper.held() == {"kept"}
        await renew.until(lambda: renew.count("kept") >= 3)
        assert renew.count("lost") == 1
        assert keeper.held() == {"kept"}
        # Lost, it can be held again (e.g. after a new claim).
        keeper.hold(held_run("lost", epoch=2), SESSION)
        await renew.until(lambda: renew.count("lost") >= 2)
        assert keeper.held() == {"kept", "lost"}


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
async def test_a_retryable_error_is_retried_after_the_retry_delay(
    code: grpc.StatusCode, monkeypatch: pytest.MonkeyPatch, sleeps: RecordedSleeps
) -> None:
    retry_delay = 0.02
    ttl = 0.3  # renewals every 0.1 s
    monkeypatch.setattr(funnel_mcp.leases, "RETRY_DELAY", retry_delay)
    renew = FakeRenew()
    renew.effects["r1"] = [status_error(code), status_error(code)]
    async with LeaseKeeper(renew, renew.withdraw, ttl, IDLE) as keeper:
        keeper.hold(held_run("r1"), SESSION)
        await renew.until(lambda: renew.count("r1") >= 4)
        assert keeper.held() == {"r1"}
    first, second, third, fourth = renew.times("r1")
    assert retry_delay * 0.9 <= second - first
    assert retry_delay * 0.9 <= third - second
    # Once a renewal succeeds, the next one waits a third of the ttl again.
    assert fourth - third >= ttl / 3 * 0.9
    # The keeper waited the retry delay after each failure, and longer once a renewal succeeded.
    before, after_first, after_second, after_success = sleeps.asked["r1"][:4]
    assert 0 < after_first <= retry_delay and 0 < after_second <= retry_delay
    assert retry_delay < after_success <= ttl / 3 and 0 < before <= ttl / 3


async def test_an_unexpected_exception_stops_that_run_only(caplog: pytest.LogCaptureFixture) -> None:
    renew = FakeRenew()
    renew.effects["broken"] = [RuntimeError("bug in renew")]
    caplog.set_level(logging.ERROR, logger="funnel.mcp.leases")
    async with LeaseKeeper(renew, renew.withdraw, 0.15, IDLE) as keeper:
        for run_id in ("a", "broken", "b"):
            keeper.hold(held_run(run_id), SESSION)
        await eventually(lambda: "broken" not in keeper.held())
        await renew.until(lambda: renew.count("a") >= 3 and renew.count("b") >= 3)
        assert keeper.held() == {"a", "b"}
        assert renew.count("broken") == 1
    assert any("broken" in record.getMessage() for record in caplog.records)


async def test_hold_of_a_held_run_is_a_no_op() -> None:
    renew = FakeRenew()
    async with LeaseKeeper(renew, renew.withdraw, 0.15, IDLE) as keeper:
        keeper.hold(held_run("r1", epoch=1), SESSION)
        keeper.hold(held_run("r1", epoch=2), SESSION)
        assert keeper.held() == {"r1"}
        await renew.until(lambda: renew.count("r1") >= 3)
    # One renewal loop, with the first HeldRun: no second loop, no epoch swap.
    assert [run.epoch for run, _ in renew.calls] == [1, 1, 1]
    times = renew.times("r1")
    assert all(later - earlier >= 0.05 * 0.9 for earlier, later in itertools.pairwise(times))


async def test_hold_outside_the_context_is_a_no_op() -> None:
    renew = FakeRenew()
    keeper = LeaseKeeper(renew, renew.withdraw, 0.15, IDLE)
    keeper.hold(held_run("r1"), SESSION)
    assert keeper.held() == set()


async def test_leaving_the_context_cancels_everything_promptly() -> None:
    renew = FakeRenew()
    renew.blocking.add("stuck")  # its renewal call never returns by itself
    async with LeaseKeeper(renew, renew.withdraw, 0.15, IDLE) as keeper:
        for run_id in ("a", "b", "stuck"):
            keeper.hold(held_run(run_id), SESSION)
        await renew.until(lambda: renew.count("stuck") >= 1 and renew.count("a") >= 1)
    # Left at all: it did not wait for the stuck call, which never returns by itself.
    assert keeper.held() == set()
    assert renew.cancelled == ["stuck"]
    # And nothing is left that could renew later.
    assert [task.get_name() for task in asyncio.all_tasks() if task.get_name().startswith("lease ")] == []


async def test_the_end_of_a_holder_withdraws_its_runs_and_no_other() -> None:
    renew = FakeRenew()
    async with LeaseKeeper(renew, renew.withdraw, 0.15, IDLE) as keeper:
        keeper.hold(held_run("a"), SESSION)
        keeper.hold(held_run("b"), SESSION)
        keeper.hold(held_run("c"), "session s2")
        keeper.hold(held_run("a"), "session s2")  # touched by another session: keeps its holder
        keeper.end(SESSION, "the MCP session that held it ended")
        await renew.until(lambda: len(renew.withdrawn) == 2)
        assert sorted(run_id for run_id, _, _ in renew.withdrawn) == ["a", "b"]
        assert {why for _, why, _ in renew.withdrawn} == {"the MCP session that held it ended"}
        await eventually(lambda: keeper.held() == {"c"})
        count = renew.count("a") + renew.count("b")
        await renew.until(lambda: renew.count("c") >= 3)
        assert renew.count("a") + renew.count("b") == count
        keeper.end("session s3", "never held anything")  # no-op
        assert keeper.held() == {"c"}
    assert len(renew.withdrawn) == 2  # leaving the context withdraws nothing more


async def test_a_sessionless_run_is_withdrawn_once_no_call_names_it_for_the_idle_timeout() -> None:
    renew = FakeRenew()
    idle = 0.3
    async with LeaseKeeper(renew, renew.withdraw, 0.15, idle) as keeper:
        keeper.hold(held_run("r1"), SESSIONLESS)
        touches = []
        for _ in range(4):  # each call naming the run moves the idle deadline
            await asyncio.sleep(idle / 2)
            keeper.hold(held_run("r1"), SESSIONLESS)
            touches.append(renew.loop.time())
        await renew.until(lambda: len(renew.withdrawn) == 1)
        ((run_id, why, at),) = renew.withdrawn
        assert run_id == "r1" and why == "no call named the run for 0.3 s"
        assert at - touches[-1] >= idle * 0.9
        assert renew.count("r1") >= 3  # renewed all along
        await eventually(lambda: keeper.held() == set())


async def test_leaving_the_context_lets_withdrawals_finish_within_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(funnel_mcp.leases, "WITHDRAW_GRACE", 0.2)
    renew = FakeRenew()
    renew.blocking.add("stuck")  # its withdrawal never returns by itself
    async with LeaseKeeper(renew, renew.withdraw, 0.15, IDLE) as keeper:
        keeper.hold(held_run("ended"), PROCESS)
        keeper.hold(held_run("stuck"), PROCESS)
        keeper.hold(held_run("renewed"), SESSION)
        keeper.end(PROCESS, "the host closed its stdio connection")
    # Left at all: the stuck withdrawal was given up after the grace, the other one finished.
    assert [run_id for run_id, _, _ in renew.withdrawn] == ["ended"]
    assert keeper.held() == set()
