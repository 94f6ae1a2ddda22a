"""Unit tests of what the model reads beyond the tools' data: a close's
effect and next step (funnel_mcp.closing), argument errors in plain words, the
workspace a call acts in (funnel_mcp.callers), and fields' titles."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import BaseModel, Field, ValidationError

from funnel.auth.principal import Principal, Role
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types
from funnel_mcp import closing
from funnel_mcp.answers import title
from funnel_mcp.callers import workspace_of
from funnel_mcp.failures import Refused, invalid_arguments


def refused_close(
    action: int = completion_enums.AGENT_ACTION_PROVIDE_RESULT, *, decision: bool = True
) -> completion_messages.CompleteRunResponse:
    """A succeeded close the gates refused, with the service's own words (which end in "then retry")."""
    response = completion_messages.CompleteRunResponse(
        task_effect=completion_enums.TASK_EFFECT_BLOCKED,
        task_effect_reason="Not complete: the result is empty (result.non_empty); state the result, then retry.",
    )
    if decision:
        response.decision.CopyFrom(
            completion_types.Decision(
                verdict=completion_enums.VERDICT_SOFT_BLOCK,
                next_action=action,
                instruction="Not complete: the result is empty (result.non_empty); state the result, then retry.",
                trace=[
                    completion_types.GateResult(
                        gate_id="lease.live", status=completion_enums.GATE_STATUS_PASSED, reason="the lease is live"
                    ),
                    completion_types.GateResult(
                        gate_id="result.non_empty",
                        status=completion_enums.GATE_STATUS_FAILED,
                        reason="the result is empty",
                        decisive=True,
                    ),
                ],
                details=completion_types.BlockDetails(decisive_gate="result.non_empty"),
            )
        )
    else:
        response.task_effect_reason = (
            "the task's cancellation was requested and run run-2 still holds its lease: "
            "that run's close settles the cancellation"
        )
    return response


def test_a_refused_completion_says_the_run_is_closed_why_and_what_finishes_the_task() -> None:
    response = refused_close()
    assert closing.effect_word(response) == "not_completed"
    assert closing.effect_reason(response, "in_progress") == (
        "The run is closed; the task was not completed: the completion gates refused it (the result is empty: "
        "result.non_empty). The task stays in_progress and no run holds it."
    )
    assert "result in notes" in closing.next_step(response, "in_progress")


@pytest.mark.parametrize(
    "action", [a for a in completion_enums.AgentAction.values() if a != completion_enums.AGENT_ACTION_REPORT_COMPLETE]
)
@pytest.mark.parametrize("decision", [True, False])
def test_no_answer_about_a_closed_run_asks_for_a_retry(action: int, decision: bool) -> None:
    response = refused_close(action, decision=decision)
    words = closing.effect_reason(response, "in_progress") + " " + closing.next_step(response, "in_progress")
    assert "retry" not in words.lower() and "The run is closed" in words


@pytest.mark.parametrize(
    ("effect", "final_status", "word", "step"),
    [
        (completion_enums.TASK_EFFECT_DONE, "done", "done", "Nothing: the task is done."),
        (completion_enums.TASK_EFFECT_SETTLING, "in_progress", "settling", "Nothing: the lifecycle service settles"),
        (completion_enums.TASK_EFFECT_CANCELLED, "cancelled", "cancelled", "Nothing: the task is cancelled"),
        (
            completion_enums.TASK_EFFECT_STATUS_SET,
            "blocked",
            "status_set",
            "Nothing for the agent: the task is blocked until",
        ),
        (completion_enums.TASK_EFFECT_STATUS_SET, "ready", "status_set", "Nothing required: the task stays ready"),
        (
            completion_enums.TASK_EFFECT_UNCHANGED,
            "in_progress",
            "unchanged",
            "Nothing required: the task stays in_progress",
        ),
    ],
)
def test_every_effect_has_its_word_the_services_reason_and_a_next_step(
    effect: int, final_status: str, word: str, step: str
) -> None:
    response = completion_messages.CompleteRunResponse(task_effect=effect, task_effect_reason="as the service says")
    assert closing.effect_word(response) == word
    assert closing.effect_reason(response, final_status) == "as the service says"
    assert closing.next_step(response, final_status).startswith(step)
    assert set(closing.EFFECTS) == {v for v in completion_enums.TaskEffect.values() if v != 0}


class Arguments(BaseModel):
    runId: str
    outcome: Annotated[str, Field(pattern="^(succeeded|failed)$")]
    tokensTotal: Annotated[int | None, Field(ge=0)] = None


def test_argument_errors_name_each_field_in_plain_words() -> None:
    with pytest.raises(ValidationError) as refused:
        Arguments.model_validate({"outcome": "done", "tokensTotal": -1})
    assert invalid_arguments("complete_task", refused.value) == (
        "Error executing tool complete_task: ARGUMENTS_INVALID: `runId` is required; `outcome` string should "
        "match pattern '^(succeeded|failed)$'; `tokensTotal` should be greater than or equal to 0. Fix the "
        "arguments and call again."
    )


def grants(*workspaces: str) -> Principal:
    return Principal("agent-7", {workspace: frozenset({Role.AGENT}) for workspace in workspaces})


@pytest.mark.parametrize(
    ("configured", "principal", "expected"),
    [
        ("acme", grants("beta"), "acme"),  # the server's one workspace; the services judge the grant
        (None, grants("beta"), "beta"),
        (None, grants(), "WORKSPACE_NOT_GRANTED"),
        (None, grants("acme", "beta"), "WORKSPACE_UNKNOWN"),
        (None, grants("*"), "WORKSPACE_UNKNOWN"),
        (None, grants("acme", "*"), "WORKSPACE_UNKNOWN"),
    ],
)
def test_the_workspace_of_a_call(configured: str | None, principal: Principal, expected: str) -> None:
    try:
        assert workspace_of(configured, principal) == expected
    except Refused as refused:
        assert refused.reason == expected and str(refused).startswith(f"{expected}: the token of 'agent-7' grants")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("runId", "Run ID"),
        ("tokensTotal", "Tokens total"),
        ("openChildTaskIds", "Open child task IDs"),
        ("verdict", "Verdict"),
        ("currentLeaseRunId", "Current lease run ID"),
    ],
)
def test_titles_are_words(name: str, expected: str) -> None:
    assert title(name) == expected
