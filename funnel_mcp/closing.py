"""What `complete_task` says about the task. The run is closed whatever the
completion gates decided, so the answer never asks for a retry: it says what the
close did to the task (`taskEffect`, `taskEffectReason`) and what, if anything,
is left to do and by whom (`nextStep`). No I/O here."""

from __future__ import annotations

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types

EFFECTS = {
    completion_enums.TASK_EFFECT_DONE: "done",
    completion_enums.TASK_EFFECT_SETTLING: "settling",
    # The service's BLOCKED: the gates refused the completion. Not the work status
    # `blocked`, which `finalStatus` (the task's real status) beside it can say.
    completion_enums.TASK_EFFECT_BLOCKED: "not_completed",
    completion_enums.TASK_EFFECT_STATUS_SET: "status_set",
    completion_enums.TASK_EFFECT_CANCELLED: "cancelled",
    completion_enums.TASK_EFFECT_UNCHANGED: "unchanged",
}

A_NEW_RUN = (
    "A new run finishes it: claim_task, then attempt_completion until it answers report_complete, then complete_task."
)
# What finishes a task whose completion the gates refused, by what they asked for.
AFTER_REFUSAL = {
    completion_enums.AGENT_ACTION_PROVIDE_RESULT: "A new run finishes it: claim_task, then complete_task with "
    "outcome succeeded and the result in notes (or attempt_completion with the result first).",
    completion_enums.AGENT_ACTION_RECORD_EVIDENCE: "A new run finishes it: claim_task, record_evidence for what "
    "decision.missing names, then attempt_completion until it answers report_complete, then complete_task.",
    completion_enums.AGENT_ACTION_RESOLVE_OPEN_TOOL_CALLS: "The host answers the open tool calls of the task's "
    "transcript (decision.missing.openToolCallIds); then a new run (claim_task) can complete it.",
    completion_enums.AGENT_ACTION_WAIT_FOR_CHILDREN: "The attached child tasks (decision.missing.openChildTaskIds) "
    "finish first; then a new run (claim_task) can complete it.",
    completion_enums.AGENT_ACTION_STOP_AND_REPORT: "Report the blocker to the user or operator: the task cannot be "
    "completed as it is.",
}


def effect_word(response: completion_messages.CompleteRunResponse) -> str:
    return EFFECTS.get(response.task_effect, "unchanged")


def effect_reason(response: completion_messages.CompleteRunResponse, final_status: str) -> str:
    if response.task_effect != completion_enums.TASK_EFFECT_BLOCKED:
        return response.task_effect_reason
    if not response.HasField("decision"):  # a cancellation fence: another run settles it
        return f"The run is closed; the task was not completed: {response.task_effect_reason}."
    return (
        f"The run is closed; the task was not completed: the completion gates refused it "
        f"({refusal(response.decision)}). The task stays {final_status} and no run holds it."
    )


def next_step(response: completion_messages.CompleteRunResponse, final_status: str) -> str:
    effect = response.task_effect
    if effect == completion_enums.TASK_EFFECT_DONE:
        return "Nothing: the task is done."
    if effect == completion_enums.TASK_EFFECT_SETTLING:
        return "Nothing: the lifecycle service settles the completion; get_task tells when the task is done."
    if effect == completion_enums.TASK_EFFECT_CANCELLED:
        return "Nothing: the task is cancelled; do not work on it."
    if effect == completion_enums.TASK_EFFECT_BLOCKED:
        if not response.HasField("decision"):
            return "Nothing: the run that holds the task settles its cancellation when it closes."
        return AFTER_REFUSAL.get(response.decision.next_action, A_NEW_RUN)
    if final_status == "blocked":
        return "Nothing for the agent: the task is blocked until a host or operator sets it ready again."
    return f"Nothing required: the task stays {final_status} and no run holds it; a new run (claim_task) continues it."


def refusal(decision: completion_types.Decision) -> str:
    """The decisive gate's reason and id, e.g. `a result is empty: result.non_empty`."""
    for gate in decision.trace:
        if gate.decisive:
            return f"{gate.reason}: {gate.gate_id}"
    return decision.details.decisive_gate or "no gate named"
