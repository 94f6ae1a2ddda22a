"""An attempt's answer rendered once (api/convert.py DecisionProtos): the same messages
as rendering every decision field by field, with each decision built once."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from completion_service.api import convert
from completion_service.api.convert import DecisionProtos, completion_to_proto, decision_to_proto
from completion_service.api.service import _render_attempt
from completion_service.core.model import (
    AgentAction,
    BlockDetails,
    CompletionRecord,
    Decision,
    GateStatus,
    GateTrace,
    RequestedOutcome,
    SettlementStatus,
    Verdict,
)
from completion_service.core.settlement import binding_decision
from completion_service.units.completions import AttemptOutcome
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from tests.completion.test_core_rules import DECISIONS

# Gate versions are int32 in the contract (the JSON form's strategy goes beyond).
RENDERABLE = DECISIONS.map(
    lambda d: dataclasses.replace(d, trace=tuple(dataclasses.replace(t, version=t.version % 2**31) for t in d.trace))
)
WITH_DETAILS = st.one_of(
    RENDERABLE,
    RENDERABLE.map(
        lambda d: dataclasses.replace(
            d, details=BlockDetails(decisive_gate="evidence.present", missing_evidence_kinds=("tests",))
        )
    ),
)
DECISION = Decision(
    verdict=Verdict.ALLOW,
    next_action=AgentAction.REPORT_COMPLETE,
    forbidden_actions=(AgentAction.CONTINUE_WORK,),
    instruction="Report the task complete.",
    trace=tuple(GateTrace(f"gate.{n}", 1, GateStatus.PASSED, f"gate {n} passed", n == 0) for n in range(12)),
    decision_schema="funnel.completion.decision/v1",
    state_version=7,
    checkpoint="ckpt-7",
)
SETTLEMENTS = st.sampled_from(
    [
        (SettlementStatus.PENDING, None),
        (SettlementStatus.SETTLED, None),
        (SettlementStatus.REJECTED, "CANCELLATION_FENCED"),
    ]
)


def completion(decision: Decision, settlement: SettlementStatus, reason: str | None) -> CompletionRecord:
    return CompletionRecord(
        workspace_id="ws",
        task_id="task",
        generation=2,
        completion_id="cmp_1",
        identity="f" * 64,
        payload=b"{}",
        outcome=RequestedOutcome.COMPLETED,
        result="done",
        run_id="run_1",
        state_version=decision.state_version,
        checkpoint=decision.checkpoint,
        decision=decision,
        committed_at=1_000,
        settlement=settlement,
        settled_at=None if settlement is SettlementStatus.PENDING else 2_000,
        error_reason=reason,
        error_message="refused" if reason else None,
    )


def field_by_field(outcome: AttemptOutcome) -> completion_messages.AttemptCompletionResponse:
    return completion_messages.AttemptCompletionResponse(
        decision=decision_to_proto(binding_decision(outcome.decision, outcome.completion)),
        completion=completion_to_proto(outcome.completion) if outcome.completion else None,
        existing_completion=outcome.existing,
    )


@settings(max_examples=100, deadline=None)
@given(WITH_DETAILS, WITH_DETAILS, SETTLEMENTS, st.sampled_from(["none", "own", "existing"]))
def test_the_answers_are_those_rendered_field_by_field(decision, stored_decision, settlement, kind):
    status, reason = settlement
    protos = DecisionProtos()
    stored = None if kind == "none" else completion(decision if kind == "own" else stored_decision, status, reason)
    pending = AttemptOutcome(decision, stored and dataclasses.replace(stored, settlement=SettlementStatus.PENDING))
    answered = AttemptOutcome(decision, stored, existing=kind == "existing")
    # As an attempt renders: its stored response in the transaction, then its reply.
    assert _render_attempt(pending, protos) == field_by_field(pending)
    assert _render_attempt(answered, protos) == field_by_field(answered)


def test_an_attempt_builds_its_decision_once(monkeypatch):
    built = []

    def counted(decision: Decision):
        built.append(decision)
        return decision_to_proto(decision)

    monkeypatch.setattr(convert, "decision_to_proto", counted)
    decision = DECISION
    protos = DecisionProtos()
    committed = completion(decision, SettlementStatus.PENDING, None)
    _render_attempt(AttemptOutcome(decision, committed, inserted=True), protos).SerializeToString()
    settled = dataclasses.replace(committed, settlement=SettlementStatus.SETTLED, settled_at=2_000)
    _render_attempt(AttemptOutcome(decision, settled, inserted=True), protos)
    assert built == [decision]


def test_every_field_of_a_decision_is_either_the_agents_instructions_or_compared():
    instructions = {"next_action", "forbidden_actions", "instruction"}
    fields = {field.name for field in dataclasses.fields(Decision)}
    assert set(convert._BEYOND_THE_AGENTS_INSTRUCTIONS) == fields - instructions


@pytest.mark.parametrize("changed", convert._BEYOND_THE_AGENTS_INSTRUCTIONS)
def test_a_binding_decision_that_differs_beyond_the_instructions_is_built_whole(changed):
    other: Any = {
        "verdict": Verdict.SOFT_BLOCK,
        "trace": (),
        "decision_schema": "other",
        "state_version": DECISION.state_version + 1,
        "checkpoint": "other",
        "details": BlockDetails(decisive_gate="other"),
    }[changed]
    binding = dataclasses.replace(DECISION, instruction="something else", **{changed: other})
    assert DecisionProtos().binding(DECISION, binding) == decision_to_proto(binding)
