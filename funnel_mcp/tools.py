"""The five tools. Each is one or two calls to the services (funnel.client) with
the caller's token, in the caller's workspace (both resolved once per call,
before the tool runs: `acting`); the answers are mapped by `answers`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar, cast

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import BeforeValidator, Field

from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel_mcp import answers, descriptions, observe
from funnel_mcp.callers import Caller
from funnel_mcp.door import Door
from funnel_mcp.failures import Refused
from funnel_mcp.leases import HeldRun

# A tool function, returned as it is by the SDK's decorator.
_Tool = TypeVar("_Tool", bound=Callable[..., Any])

RunId = Annotated[
    str, Field(title="Run ID", description="The runId that claim_task returned.", min_length=1, max_length=128)
]
TaskId = Annotated[
    str, Field(title="Task ID", description="The task's id in this workspace.", min_length=1, max_length=128)
]


def tokens(title: str, what: str) -> Any:
    return Field(title=title, description=what, ge=0, le=2**53 - 1)


def hints(title: str, *, read_only: bool = False, destructive: bool = False) -> ToolAnnotations:
    return ToolAnnotations(
        title=title,
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=read_only,
        open_world_hint=False,
    )


def acting(ctx: Context[Any]) -> tuple[Door, Caller]:
    """The server's door and who the current call acts as (FunnelServer.call_tool
    resolved the caller before the tool ran)."""
    call = observe.current()
    assert call is not None and call.caller is not None, "tools run inside FunnelServer.call_tool"
    # The lifespan yields the Door; the SDK types the context as a mapping.
    return cast(Door, ctx.request_context.lifespan_context), call.caller


def register(server: MCPServer[Door]) -> None:
    def tool(title: str, description: str, **kind: bool) -> Callable[[_Tool], _Tool]:
        return server.tool(title=title, description=description, annotations=hints(title, **kind))

    @tool("Claim a task", descriptions.CLAIM_TASK)
    async def claim_task(taskId: TaskId, ctx: Context) -> answers.ClaimedRun:
        door, caller = acting(ctx)
        response = await door.call(
            "completion_service",
            door.client(caller).claim_task(
                caller.workspace,
                taskId,
                door.agent_id(caller),
                lease_ttl=door.settings.lease_ttl,
                request_id=door.request_id(ctx, "claim_task", caller.workspace, {"taskId": taskId}),
            ),
        )
        door.keeper.hold(
            HeldRun(caller.workspace, response.run.run_id, response.lease.epoch, caller.token), door.holder(ctx)
        )
        observe.opened(response.run.run_id)
        return answers.claimed_run(response)

    @tool("Close the run", descriptions.COMPLETE_TASK, destructive=True)
    async def complete_task(
        runId: RunId,
        outcome: Annotated[answers.RunOutcomeWord, Field(title="Outcome", description="How the session ended.")],
        ctx: Context,
        tokensInput: Annotated[int | None, tokens("Input tokens", "Input tokens the session used.")] = None,
        tokensOutput: Annotated[int | None, tokens("Output tokens", "Output tokens the session used.")] = None,
        tokensTotal: Annotated[
            int | None,
            tokens("Total tokens", "The total as your model reports it; kept as given (else input + output)."),
        ] = None,
        notes: Annotated[
            str | None,
            Field(
                title="Notes",
                description="A summary of the session; with outcome succeeded, the task's result "
                "(what was achieved), which the completion gates require. Cut at 2000 characters.",
                max_length=1_048_576,
            ),
        ] = None,
        error: Annotated[
            str | None, Field(title="Error", description="The failure message, if the run failed.", max_length=8192)
        ] = None,
        finalStatus: Annotated[
            answers.FinalStatusWord | None,
            Field(
                title="Final status",
                description="Override of the task's status; done only through a settled completion.",
            ),
        ] = None,
    ) -> answers.ClosedRun:
        door, caller = acting(ctx)
        arguments = {
            "runId": runId,
            "outcome": outcome,
            "tokensInput": tokensInput,
            "tokensOutput": tokensOutput,
            "tokensTotal": tokensTotal,
            "notes": notes,
            "error": error,
            "finalStatus": finalStatus,
        }
        closing = door.client(caller).complete_run(
            caller.workspace,
            runId,
            answers.RUN_OUTCOMES[outcome],
            notes=notes or "",
            error=error or "",
            tokens_input=tokensInput,
            tokens_output=tokensOutput,
            tokens_total=tokensTotal,
            final_status=answers.FINAL_STATUSES[finalStatus]
            if finalStatus
            else completion_enums.FINAL_STATUS_UNSPECIFIED,
            request_id=door.request_id(ctx, "complete_task", caller.workspace, arguments),
        )
        try:
            response = await door.call("completion_service", closing)
        except Refused as failed:
            if failed.reason == "RUN_ALREADY_FINISHED":
                door.keeper.release(runId)
            raise
        door.keeper.release(runId)
        return answers.closed_run(response)

    @tool("Record evidence", descriptions.RECORD_EVIDENCE)
    async def record_evidence(
        runId: RunId,
        kind: Annotated[
            str, Field(title="Kind", description='What was checked, e.g. "tests".', min_length=1, max_length=128)
        ],
        verdict: Annotated[answers.EvidenceVerdictWord, Field(title="Verdict", description="passed or failed.")],
        ctx: Context,
        checkpoint: Annotated[
            str | None,
            Field(title="Checkpoint", description="The checkpoint the evidence is valid for.", max_length=128),
        ] = None,
        details: Annotated[
            str | None, Field(title="Details", description="What was run and what it showed.", max_length=8192)
        ] = None,
    ) -> answers.RecordedEvidence:
        door, caller = acting(ctx)
        run = await door.run(runId, caller, door.holder(ctx))
        arguments = {"runId": runId, "kind": kind, "verdict": verdict, "checkpoint": checkpoint, "details": details}
        response = await door.call(
            "completion_service",
            door.client(caller).record_evidence(
                caller.workspace,
                run.task_id,
                run.generation,
                kind,
                answers.EVIDENCE_VERDICTS[verdict],
                checkpoint=checkpoint or "",
                details=details or "",
                run_id=runId,
                request_id=door.request_id(ctx, "record_evidence", caller.workspace, arguments),
            ),
        )
        return answers.recorded_evidence(response)

    @tool("Attempt completion", descriptions.ATTEMPT_COMPLETION, destructive=True)
    async def attempt_completion(
        runId: RunId,
        result: Annotated[
            str, Field(title="Result", description="What was achieved (or why it failed).", max_length=16384)
        ],
        ctx: Context,
        outcome: Annotated[
            answers.RequestedOutcomeWord,
            BeforeValidator(answers.former_requested_outcome),
            Field(title="Outcome", description="succeeded, or failed to end the task as failed."),
        ] = "succeeded",
        stateVersion: Annotated[
            int | None,
            Field(
                title="State version",
                description="The transcript state version you evaluated, if known.",
                ge=0,
                le=2**53 - 1,
            ),
        ] = None,
    ) -> answers.AttemptAnswer:
        door, caller = acting(ctx)
        run = await door.run(runId, caller, door.holder(ctx))
        # The request id hashes the service's word (`completed`), not the tool's: ids
        # stay those of 0.1.0 and of clients/typescript's session, which derives them.
        arguments = {
            "runId": runId,
            "result": result,
            "stateVersion": stateVersion,
            "outcome": answers.word(
                completion_enums.RequestedOutcome.Name(answers.REQUESTED_OUTCOMES[outcome]), "REQUESTED_OUTCOME_"
            ),
        }
        response = await door.call(
            "completion_service",
            door.client(caller).attempt_completion(
                caller.workspace,
                run.task_id,
                runId,
                run.epoch,
                result=result,
                outcome=answers.REQUESTED_OUTCOMES[outcome],
                state_version=stateVersion,
                request_id=door.request_id(ctx, "attempt_completion", caller.workspace, arguments),
            ),
        )
        return answers.attempt_answer(response)

    @tool("Read the task", descriptions.GET_TASK, read_only=True)
    async def get_task(taskId: TaskId, ctx: Context) -> answers.TaskTruth:
        door, caller = acting(ctx)
        response = await door.call("lifecycle_service", door.client(caller).get_task(caller.workspace, taskId))
        return answers.task_truth(response)
