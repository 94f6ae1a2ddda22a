"""The completion service's only way to touch lifecycle state: typed calls to
`TaskLifecycleService`, each with a deadline, each answer classified.

A rejection by the lifecycle service (its ErrorInfo domain, a final code) is
`LifecycleRejected`; anything else that fails (unavailable, deadline, unknown)
may or may not have been applied and is `LifecycleUnavailable`: callers retry
with the same request id, which the lifecycle service deduplicates."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import grpc
from google.rpc import code_pb2, error_details_pb2

from completion_service.clients.outbound import LifecycleChannel
from completion_service.clients.settle_batches import SettleBatches
from completion_service.core.model import LifecycleState
from completion_service.core.projection import Change, Record
from completion_service.core.settlement import SettleAnswer, classify_failure
from funnel.auth.principal import Caller
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.grpc_errors import error_info, status_error_info
from funnel.runtime.proto_enums import proto_enum
from funnel.runtime.timestamps import to_timestamp
from funnel.runtime.tracing import OutboundCalls

SOURCE = "completion_service"
SERVICE_NAME = "funnel.lifecycle.v1.TaskLifecycleService"
log = logging.getLogger(__name__)


class _Stub(Protocol):
    """The part of the generated stub this client calls as an attribute (`_call` looks up the unary RPCs by name)."""

    WatchLifecycleEvents: grpc.aio.UnaryStreamMultiCallable[
        lifecycle_messages.WatchLifecycleEventsRequest, lifecycle_messages.WatchLifecycleEventsResponse
    ]


# The generated stub module has no .pyi, so its constructor is untyped: this is its type as used here.
_new_stub: Callable[[grpc.aio.Channel], _Stub] = lifecycle_grpc.TaskLifecycleServiceStub


class LifecycleRejected(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class LifecycleUnavailable(Exception):
    """No answer: the intent may or may not have been applied."""


def record_of(current: lifecycle_messages.GetTaskResponse) -> Record:
    task = current.task
    return Record(
        generation=task.generation,
        revision=task.revision,
        state=LifecycleState(task.state),
        outcome=_outcome(task.outcome),
        cancellation_requested=task.cancellation == lifecycle_enums.CANCELLATION_STATE_REQUESTED,
        open_children=frozenset(current.open_attached_child_task_ids),
    )


def change_of(event: lifecycle_types.LifecycleEvent) -> Change:
    attached = event.HasField("parent") and event.parent.mode == lifecycle_enums.PARENT_LINK_MODE_ATTACHED
    return Change(
        task_id=event.task_id,
        generation=event.generation,
        revision=event.revision,
        state=LifecycleState(event.to_state),
        outcome=_outcome(event.outcome),
        cancellation_requested=event.cancellation == lifecycle_enums.CANCELLATION_STATE_REQUESTED,
        attached_to=(event.parent.task_id, event.parent.generation) if attached else None,
    )


def _outcome(outcome: int) -> str | None:
    return lifecycle_enums.TerminalOutcome.Name(outcome).removeprefix("TERMINAL_OUTCOME_") if outcome else None


def _classified(code: str, message: str, info: error_details_pb2.ErrorInfo | None) -> Exception:
    """A failed call's (or a batch item's) error: the lifecycle's own verdict, or no answer."""
    if classify_failure(code, info.domain if info else None) is SettleAnswer.REJECTED and info is not None:
        return LifecycleRejected(info.reason, message)  # REJECTED needs the lifecycle's domain
    return LifecycleUnavailable(f"{code}: {message}")


def _item_answer(
    result: lifecycle_messages.SettleCompletionsResult,
) -> lifecycle_messages.SettleCompletionResponse | Exception:
    if result.HasField("settled"):
        return result.settled
    status = result.error
    return _classified(code_pb2.Code.Name(status.code), status.message, status_error_info(status))


class LifecycleClient:
    """Calls through the current channel of `channel`, which re-opens when its TLS
    files are reloaded."""

    def __init__(self, channel: LifecycleChannel, timeout: float = 5.0) -> None:
        self._channel = channel
        self._timeout = timeout
        self._stub_channel: grpc.aio.Channel | None = None
        self._stub_cache: _Stub | None = None
        # Each call's span goes first: the lifecycle service's span of the call is its child.
        self._calls = OutboundCalls()
        self._settlements = SettleBatches(self._send_settlements, LifecycleUnavailable)

    @property
    def timeout(self) -> float:
        """Seconds one lifecycle call may take."""
        return self._timeout

    @property
    def _stub(self) -> _Stub:
        channel, stub = self._channel.channel, self._stub_cache
        if channel is not self._stub_channel or stub is None:
            stub = _new_stub(channel)
            self._stub_channel, self._stub_cache = channel, stub
        return stub

    async def _call(self, name: str, request: Any) -> Any:
        """The response of the unary RPC `name`, found on the stub by name: each caller
        names its RPC's response type on the variable it assigns it to."""
        try:
            return await self._calls.unary(
                SERVICE_NAME, name, getattr(self._stub, name), request, self._timeout, self._channel.metadata()
            )
        except grpc.aio.AioRpcError as error:
            if error.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                # A configuration problem, never the lifecycle's verdict on a fact:
                # retried (settlements stay pending) and shouted about.
                log.error(
                    "the lifecycle service refused this service's identity (%s: %s); check --identity-cert/"
                    "--identity-token-file here and --completion-identity/--jwks-file there",
                    error.code().name,
                    error.details(),
                )
            raise _classified(error.code().name, error.details() or "", error_info(error)) from None

    async def get_task(self, workspace_id: str, task_id: str) -> lifecycle_messages.GetTaskResponse:
        response: lifecycle_messages.GetTaskResponse = await self._call(
            "GetTask", lifecycle_messages.GetTaskRequest(workspace_id=workspace_id, task_id=task_id)
        )
        return response

    def watch_from_head(
        self, workspace_id: str
    ) -> grpc.aio.UnaryStreamCall[
        lifecycle_messages.WatchLifecycleEventsRequest, lifecycle_messages.WatchLifecycleEventsResponse
    ]:
        """A workspace's lifecycle events from the head on, without a deadline: the
        head marker, then every later event. Its failures are gRPC's own errors."""
        return self._stub.WatchLifecycleEvents(
            lifecycle_messages.WatchLifecycleEventsRequest(workspace_id=workspace_id, from_head=True),
            metadata=self._channel.metadata(),
        )

    @staticmethod
    def _cause(reason: str, **ids: str) -> lifecycle_types.Cause:
        return lifecycle_types.Cause(source=SOURCE, reason=reason, originating_ids={k: v for k, v in ids.items() if v})

    async def activate(
        self, workspace_id: str, task_id: str, generation: int, run_id: str
    ) -> lifecycle_messages.ActivateGenerationResponse:
        response: lifecycle_messages.ActivateGenerationResponse = await self._call(
            "ActivateGeneration",
            lifecycle_messages.ActivateGenerationRequest(
                workspace_id=workspace_id,
                task_id=task_id,
                generation=generation,
                request_id=f"{run_id}:activate",
                work_status=lifecycle_enums.WORK_STATUS_IN_PROGRESS,
                cause=self._cause("claimed by an agent run", run_id=run_id),
            ),
        )
        return response

    async def set_work_status(
        self, workspace_id: str, task_id: str, generation: int, status: int, request_id: str, reason: str, run_id: str
    ) -> lifecycle_messages.SetWorkStatusResponse:
        response: lifecycle_messages.SetWorkStatusResponse = await self._call(
            "SetWorkStatus",
            lifecycle_messages.SetWorkStatusRequest(
                workspace_id=workspace_id,
                task_id=task_id,
                generation=generation,
                work_status=proto_enum(lifecycle_enums.WorkStatus, status),
                request_id=request_id,
                cause=self._cause(reason, run_id=run_id),
            ),
        )
        return response

    async def request_cancellation(
        self, workspace_id: str, task_id: str, generation: int, run_id: str
    ) -> lifecycle_messages.RequestCancellationResponse:
        response: lifecycle_messages.RequestCancellationResponse = await self._call(
            "RequestCancellation",
            lifecycle_messages.RequestCancellationRequest(
                workspace_id=workspace_id,
                task_id=task_id,
                generation=generation,
                request_id=f"{run_id}:cancel-request",
                cause=self._cause("agent run closed as cancelled", run_id=run_id),
            ),
        )
        return response

    async def settle_cancellation(
        self,
        workspace_id: str,
        task_id: str,
        generation: int,
        run_id: str,
        *,
        request_id: str | None = None,
        reason: str = "agent run closed as cancelled",
        completion_id: str = "",
    ) -> lifecycle_messages.SettleCancellationResponse:
        """By default the cancellation a run closed as cancelled settles; a fenced
        generation's end names its own request id and reason."""
        response: lifecycle_messages.SettleCancellationResponse = await self._call(
            "SettleCancellation",
            lifecycle_messages.SettleCancellationRequest(
                workspace_id=workspace_id,
                task_id=task_id,
                generation=generation,
                request_id=request_id or f"{run_id}:cancel-settle",
                cause=self._cause(reason, run_id=run_id, completion_id=completion_id),
            ),
        )
        return response

    async def settle_completion(
        self, workspace_id: str, task_id: str, generation: int, completion_id: str, authoritative_at: int, run_id: str
    ) -> lifecycle_messages.SettleCompletionResponse:
        """Settled alone, or with the others due at the same time (settle_batches)."""
        return await self._settlements.settle(
            lifecycle_messages.SettleCompletionRequest(
                workspace_id=workspace_id,
                task_id=task_id,
                generation=generation,
                request_id=settle_request_id(completion_id),
                completion_id=completion_id,
                authoritative_time=to_timestamp(authoritative_at),
                cause=self._cause("completion committed", completion_id=completion_id, run_id=run_id),
            )
        )

    async def _send_settlements(
        self, items: list[lifecycle_messages.SettleCompletionRequest]
    ) -> list[lifecycle_messages.SettleCompletionResponse | Exception]:
        if len(items) == 1:
            try:
                settled: lifecycle_messages.SettleCompletionResponse = await self._call("SettleCompletion", items[0])
                return [settled]
            except LifecycleRejected as exc:
                return [exc]
        batch = lifecycle_messages.SettleCompletionsRequest(workspace_id=items[0].workspace_id, items=items)
        response: lifecycle_messages.SettleCompletionsResponse = await self._call("SettleCompletions", batch)
        return [_item_answer(result) for result in response.results]

    async def settle_failure(
        self, workspace_id: str, task_id: str, generation: int, completion_id: str, run_id: str
    ) -> lifecycle_messages.SettleFailureResponse:
        response: lifecycle_messages.SettleFailureResponse = await self._call(
            "SettleFailure",
            lifecycle_messages.SettleFailureRequest(
                workspace_id=workspace_id,
                task_id=task_id,
                generation=generation,
                request_id=settle_request_id(completion_id),
                cause=self._cause("failure committed", completion_id=completion_id, run_id=run_id),
            ),
        )
        return response

    async def resume_with_generation(
        self, workspace_id: str, task_id: str, generation: int, request_id: str, reason: str, on_behalf_of: Caller
    ) -> lifecycle_messages.ResumeWithGenerationResponse:
        """A resume for this service's caller `on_behalf_of`, whom the lifecycle
        service records on the event (after judging that it may resume)."""
        response: lifecycle_messages.ResumeWithGenerationResponse = await self._call(
            "ResumeWithGeneration",
            lifecycle_messages.ResumeWithGenerationRequest(
                workspace_id=workspace_id,
                task_id=task_id,
                generation=generation,
                request_id=request_id,
                cause=self._cause(reason),
                on_behalf_of=lifecycle_types.Caller(subject=on_behalf_of.subject, role=on_behalf_of.role),
            ),
        )
        return response


def settle_request_id(completion_id: str) -> str:
    """One request id per completion, reused by every retry, so the lifecycle
    service applies the settlement exactly once."""
    return f"settle:{completion_id}"
