"""Walks one task through the whole story against running services, printing
each step: register, claim, a blocked attempt, evidence, an allowed attempt,
settlement, the lifecycle event, and `complete_task` -> DONE."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from funnel.client.connection import Connection
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types

WORKSPACE = "demo"


def _name(enum_type: EnumTypeWrapper, value: int, prefix: str) -> str:
    return enum_type.Name(value).removeprefix(prefix)


class DemoFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class DemoCallers:
    """The story's two callers: the host (registers, records evidence, reads) and
    the agent (claims and finishes its own run, as `agent_id`)."""

    host: Connection
    agent: Connection
    agent_id: str


async def run_demo(
    callers: DemoCallers, lifecycle_address: str, completion_address: str, say: Callable[[str], None] = print
) -> dict[str, str | int]:
    """Returns what a test needs to check the story; raises DemoFailed if any step
    does not behave as the story says, funnel.client.FunnelError if a call fails."""
    task_id = f"demo-{uuid.uuid4().hex[:8]}"
    async with (
        callers.host.client(lifecycle_address, completion_address) as host,
        callers.agent.client(lifecycle_address, completion_address) as agent,
    ):
        registered = await host.register_task(
            WORKSPACE,
            task_id,
            cause=lifecycle_types.Cause(source="funnel demo", reason="a task to finish"),
            request_id=f"{task_id}-register",
        )
        say(
            f"1. register   task {task_id} in workspace {WORKSPACE!r}: generation {registered.task.generation}, "
            f"{_name(lifecycle_enums.GenerationState, registered.task.state, 'GENERATION_STATE_')}, revision "
            f"{registered.task.revision}"
        )

        claim = await agent.claim_task(WORKSPACE, task_id, callers.agent_id, lease_ttl=60)
        run = claim.run
        say(
            f"2. claim      run {run.run_id} holds the lease (epoch {claim.lease.epoch}); "
            "the lifecycle service now shows the task ACTIVE, IN_PROGRESS"
        )

        async def attempt() -> completion_messages.AttemptCompletionResponse:
            # Each attempt is a new request (a new request id): the same one would
            # be answered with the first attempt's block.
            return await agent.attempt_completion(
                WORKSPACE, task_id, run.run_id, claim.lease.epoch, result="Implemented the change; all tests pass."
            )

        blocked = await attempt()
        verdict = _name(completion_enums.Verdict, blocked.decision.verdict, "VERDICT_")
        action = _name(completion_enums.AgentAction, blocked.decision.next_action, "AGENT_ACTION_")
        say(f"3. attempt    {verdict}: next action {action}\n               {blocked.decision.instruction}")
        if (
            blocked.decision.verdict != completion_enums.VERDICT_SOFT_BLOCK
            or blocked.decision.next_action != completion_enums.AGENT_ACTION_RECORD_EVIDENCE
        ):
            raise DemoFailed(f"expected a soft block asking for evidence, got {verdict} / {action}")

        recorded = await host.record_evidence(
            WORKSPACE,
            task_id,
            run.generation,
            "tests",
            completion_enums.EVIDENCE_VERDICT_PASSED,
            details="pytest: 42 passed",
            run_id=run.run_id,
        )
        say(
            f"4. evidence   {recorded.evidence.kind} PASSED at checkpoint {recorded.evidence.checkpoint!r} "
            f"({recorded.evidence.evidence_id})"
        )

        allowed = await attempt()
        done = allowed.completion
        say(
            f"5. attempt    {_name(completion_enums.Verdict, allowed.decision.verdict, 'VERDICT_')}: completion "
            f"{done.completion_id}\n"
            f"               identity {done.identity}"
        )
        if allowed.decision.verdict != completion_enums.VERDICT_ALLOW:
            raise DemoFailed(f"expected the second attempt to be allowed: {allowed.decision.instruction}")
        say(
            f"6. settlement {_name(completion_enums.SettlementStatus, done.settlement, 'SETTLEMENT_STATUS_')} "
            f"at lifecycle revision {done.lifecycle_revision}"
        )

        terminal = [
            e
            for e in await host.list_lifecycle_events(WORKSPACE, task_id)
            if e.to_state == lifecycle_enums.GENERATION_STATE_TERMINAL
        ]
        if not terminal:
            raise DemoFailed("the lifecycle history has no terminal event")
        event = terminal[0]
        say(
            f"7. lifecycle  event #{event.sequence}: generation {event.generation} transitioned to terminal "
            f"{_name(lifecycle_enums.TerminalOutcome, event.outcome, 'TERMINAL_OUTCOME_')} "
            f"at revision {event.revision} (completion {event.completion_id})"
        )

        closed = await agent.complete_run(
            WORKSPACE,
            run.run_id,
            completion_enums.RUN_OUTCOME_SUCCEEDED,
            tokens_input=1200,
            tokens_output=300,
            tokens_total=1500,
            notes="Implemented the change; all tests pass.",
        )
        final = _name(completion_enums.FinalStatus, closed.final_status, "FINAL_STATUS_")
        say(f"8. complete_task run {closed.run_id} closed: final status {final}, {closed.tokens_total} tokens")
        if closed.final_status != completion_enums.FINAL_STATUS_DONE:
            raise DemoFailed(f"expected DONE after complete_task, got {final}")
        return {
            "task_id": task_id,
            "run_id": run.run_id,
            "completion_id": done.completion_id,
            "terminal_event_sequence": event.sequence,
            "final_status": final,
        }
