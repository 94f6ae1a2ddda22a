"""The gRPC face of the lifecycle authority: checks requests, applies intents,
shapes responses, and streams committed events."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from funnel.auth.principal import Caller
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.runtime import calls
from funnel.runtime.errors import Rejection, ServiceError, reject, storage_unavailable
from funnel.runtime.grpc_errors import status_message
from funnel.runtime.idempotency import fingerprint
from funnel.runtime.paging import (
    DEFAULT_MAX_MESSAGE_BYTES,
    decode_token,
    encode_token,
    fitting,
    page_size,
    response_budget,
)
from funnel.runtime.proto_enums import proto_enum
from funnel.runtime.storage_errors import StorageUnavailable
from funnel.runtime.validation import malformed_page_token
from funnel.runtime.watch import EventBroker, WatchEnds, WatchQuota, follow, follow_from_head
from lifecycle_service.api import requests
from lifecycle_service.api.convert import event_to_proto, task_to_proto
from lifecycle_service.api.relay import judge_relay
from lifecycle_service.authority import LifecycleAuthority
from lifecycle_service.core import intents as i
from lifecycle_service.core.model import LifecycleEvent, TaskRecord
from lifecycle_service.errors import DOMAIN, Reason
from lifecycle_service.storage.port import LifecycleReadTx
from lifecycle_service.units import Committed, Replayed, Resettled, task_view

SERVICE_NAME = "funnel.lifecycle.v1.TaskLifecycleService"

# Of its context a servicer reads only the deadline, whatever the call's message types.
Context = grpc.aio.ServicerContext[Any, Any]

_Response = TypeVar("_Response", bound=Message)


def publisher(broker: EventBroker[lifecycle_messages.WatchLifecycleEventsResponse]) -> Callable[[LifecycleEvent], None]:
    """The store's after-commit hook: hands each committed event to the watch streams."""

    def publish(event: LifecycleEvent) -> None:
        broker.publish(
            event.workspace_id,
            event.task_id,
            lambda: lifecycle_messages.WatchLifecycleEventsResponse(event=event_to_proto(event)),
        )

    return publish


class LifecycleService(lifecycle_grpc.TaskLifecycleServiceServicer):
    def __init__(
        self,
        authority: LifecycleAuthority,
        broker: EventBroker[lifecycle_messages.WatchLifecycleEventsResponse],
        watch_quota: WatchQuota,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._authority = authority
        self._store = authority.store
        self._broker = broker
        self._watch_quota = watch_quota
        self._page_bytes = response_budget(max_message_bytes)

    async def _mutate(
        self,
        method: str,
        request: Message,
        context: Context,
        response_type: type[_Response],
        intent: i.Intent,
        on_behalf_of: Caller | None = None,
    ) -> _Response:
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            raise ServiceError(reject(Reason.DEADLINE_EXPIRED, "the deadline expired before the intent was applied"))

        def reply(task: TaskRecord, event: LifecycleEvent) -> _Response:
            return response_type(task=task_to_proto(task), event=event_to_proto(event))

        def render(task: TaskRecord, event: LifecycleEvent) -> bytes:
            return reply(task, event).SerializeToString(deterministic=True)

        served = calls.served()
        if on_behalf_of is not None:
            refused = judge_relay(served.role, on_behalf_of)
            if refused is not None:
                raise ServiceError(refused)
        intent = dataclasses.replace(intent, caller=on_behalf_of or served.caller)
        digest = fingerprint(method, request.SerializeToString(deterministic=True)) if intent.request_id else None
        result = await self._authority.apply(intent, method, render, digest, requester=served.principal.subject)
        if isinstance(result, Committed):
            self._authority.faults.hit("lifecycle.after_commit_before_reply")
        if isinstance(result, Committed | Resettled):
            # What was remembered is what a repeat gets: answer with exactly that.
            return (
                reply(result.task, result.event)
                if result.response is None
                else response_type.FromString(result.response)
            )
        if isinstance(result, Replayed):
            return response_type.FromString(result.response)
        assert isinstance(result, Rejection), result
        raise ServiceError(result)

    async def RegisterTask(
        self, request: lifecycle_messages.RegisterTaskRequest, context: Context
    ) -> lifecycle_messages.RegisterTaskResponse:
        return await self._mutate(
            "RegisterTask", request, context, lifecycle_messages.RegisterTaskResponse, requests.register_task(request)
        )

    async def ActivateGeneration(
        self, request: lifecycle_messages.ActivateGenerationRequest, context: Context
    ) -> lifecycle_messages.ActivateGenerationResponse:
        intent = requests.activate_generation(request)
        return await self._mutate(
            "ActivateGeneration", request, context, lifecycle_messages.ActivateGenerationResponse, intent
        )

    async def SuspendGeneration(
        self, request: lifecycle_messages.SuspendGenerationRequest, context: Context
    ) -> lifecycle_messages.SuspendGenerationResponse:
        intent = requests.plain_intent(i.SuspendGeneration, request)
        return await self._mutate(
            "SuspendGeneration", request, context, lifecycle_messages.SuspendGenerationResponse, intent
        )

    async def ResumeWithGeneration(
        self, request: lifecycle_messages.ResumeWithGenerationRequest, context: Context
    ) -> lifecycle_messages.ResumeWithGenerationResponse:
        intent, on_behalf_of = requests.resume_with_generation(request)
        return await self._mutate(
            "ResumeWithGeneration",
            request,
            context,
            lifecycle_messages.ResumeWithGenerationResponse,
            intent,
            on_behalf_of,
        )

    async def RequestCancellation(
        self, request: lifecycle_messages.RequestCancellationRequest, context: Context
    ) -> lifecycle_messages.RequestCancellationResponse:
        intent = requests.plain_intent(i.RequestCancellation, request)
        return await self._mutate(
            "RequestCancellation", request, context, lifecycle_messages.RequestCancellationResponse, intent
        )

    async def SettleCancellation(
        self, request: lifecycle_messages.SettleCancellationRequest, context: Context
    ) -> lifecycle_messages.SettleCancellationResponse:
        intent = requests.plain_intent(i.SettleCancellation, request)
        return await self._mutate(
            "SettleCancellation", request, context, lifecycle_messages.SettleCancellationResponse, intent
        )

    async def SettleCompletion(
        self, request: lifecycle_messages.SettleCompletionRequest, context: Context
    ) -> lifecycle_messages.SettleCompletionResponse:
        intent = requests.settle_completion(request)
        return await self._mutate(
            "SettleCompletion", request, context, lifecycle_messages.SettleCompletionResponse, intent
        )

    async def SettleCompletions(
        self, request: lifecycle_messages.SettleCompletionsRequest, context: Context
    ) -> lifecycle_messages.SettleCompletionsResponse:
        requests.check_settle_completions(request)
        # Each item on its own way through _mutate, all at once: the store's writer
        # commits what is queued together in one group. Every item is waited for
        # before anything else (a dropped reply, a fault) fails the call.
        answers = await asyncio.gather(
            *(self._settle_item(item, context) for item in request.items), return_exceptions=True
        )
        results: list[lifecycle_messages.SettleCompletionsResult] = []
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
            results.append(answer)
        return lifecycle_messages.SettleCompletionsResponse(results=results)

    async def _settle_item(
        self, item: lifecycle_messages.SettleCompletionRequest, context: Context
    ) -> lifecycle_messages.SettleCompletionsResult:
        """What SettleCompletion answers for one item, its error included."""
        try:
            intent = requests.settle_completion(item)
            settled = await self._mutate(
                "SettleCompletion", item, context, lifecycle_messages.SettleCompletionResponse, intent
            )
        except ServiceError as exc:
            return lifecycle_messages.SettleCompletionsResult(error=status_message(exc.rejection, DOMAIN))
        except StorageUnavailable as exc:
            return lifecycle_messages.SettleCompletionsResult(
                error=status_message(storage_unavailable(Reason, exc), DOMAIN)
            )
        return lifecycle_messages.SettleCompletionsResult(settled=settled)

    async def SettleFailure(
        self, request: lifecycle_messages.SettleFailureRequest, context: Context
    ) -> lifecycle_messages.SettleFailureResponse:
        intent = requests.plain_intent(i.SettleFailure, request)
        return await self._mutate("SettleFailure", request, context, lifecycle_messages.SettleFailureResponse, intent)

    async def SettleTimeout(
        self, request: lifecycle_messages.SettleTimeoutRequest, context: Context
    ) -> lifecycle_messages.SettleTimeoutResponse:
        intent = requests.plain_intent(i.SettleTimeout, request)
        return await self._mutate("SettleTimeout", request, context, lifecycle_messages.SettleTimeoutResponse, intent)

    async def PropagateParentTermination(
        self, request: lifecycle_messages.PropagateParentTerminationRequest, context: Context
    ) -> lifecycle_messages.PropagateParentTerminationResponse:
        intent = requests.plain_intent(i.PropagateParentTermination, request)
        return await self._mutate(
            "PropagateParentTermination",
            request,
            context,
            lifecycle_messages.PropagateParentTerminationResponse,
            intent,
        )

    async def SetWorkStatus(
        self, request: lifecycle_messages.SetWorkStatusRequest, context: Context
    ) -> lifecycle_messages.SetWorkStatusResponse:
        intent = requests.set_work_status(request)
        return await self._mutate("SetWorkStatus", request, context, lifecycle_messages.SetWorkStatusResponse, intent)

    async def GetTask(
        self, request: lifecycle_messages.GetTaskRequest, context: Context
    ) -> lifecycle_messages.GetTaskResponse:
        requests.task_key(request)
        workspace_id, task_id = request.workspace_id, request.task_id
        view = await self._store.read(lambda tx: task_view(tx, workspace_id, task_id))
        if view is None:
            raise _task_not_found(request.task_id)
        return lifecycle_messages.GetTaskResponse(
            task=task_to_proto(view.task),
            open_attached_child_task_ids=[child.task_id for child in view.open_attached_children],
        )

    async def ListTasks(
        self, request: lifecycle_messages.ListTasksRequest, context: Context
    ) -> lifecycle_messages.ListTasksResponse:
        query, by_change = requests.list_tasks(request)
        # The filters and the order are part of the listing, so a token is valid only
        # for the ones it came from; without them the listing is as before they
        # existed (tokens issued then stay valid).
        listing = ["tasks", request.workspace_id, request.parent_task_id]
        narrowed = (request.state, request.outcome, request.work_status, request.task_id_prefix, request.order)
        if any(narrowed):
            listing += [str(value) for value in narrowed]
        cursor: object = None
        if request.page_token:
            cursor = decode_token(request.page_token, listing, int if by_change else str)
            if cursor is None:
                raise malformed_page_token(Reason)
        size = page_size(request.page_size)
        workspace_id = request.workspace_id
        if by_change:
            before = cursor if isinstance(cursor, int) else None
            listed = await self._store.read(lambda tx: tx.tasks.page_by_change(workspace_id, query, before, size + 1))
        else:
            after = cursor if isinstance(cursor, str) else ""
            listed = [
                (0, task)
                for task in await self._store.read(lambda tx: tx.tasks.page(workspace_id, query, after, size + 1))
            ]
        more = len(listed) > size
        protos = [task_to_proto(task) for _, task in listed[:size]]
        fit = fitting(protos, self._page_bytes)
        more, listed, protos = more or fit < len(protos), listed[:fit], protos[:fit]
        last_sequence, last_task = listed[-1] if listed else (0, None)
        token = (
            ""
            if not more or last_task is None
            else encode_token(listing, last_sequence if by_change else last_task.task_id)
        )
        return lifecycle_messages.ListTasksResponse(tasks=protos, next_page_token=token)

    async def CountTasks(
        self, request: lifecycle_messages.CountTasksRequest, context: Context
    ) -> lifecycle_messages.CountTasksResponse:
        requests.count_tasks(request)
        counts = await self._store.read(lambda tx: tx.tasks.count(request.workspace_id))
        return lifecycle_messages.CountTasksResponse(
            counts=[
                lifecycle_messages.TaskCount(
                    state=proto_enum(lifecycle_enums.GenerationState, c.state.value),
                    outcome=proto_enum(lifecycle_enums.TerminalOutcome, c.outcome.value if c.outcome else 0),
                    work_status=proto_enum(lifecycle_enums.WorkStatus, c.work_status.value),
                    tasks=c.tasks,
                )
                for c in counts
            ],
            total=sum(c.tasks for c in counts),
        )

    async def ListLifecycleEvents(
        self, request: lifecycle_messages.ListLifecycleEventsRequest, context: Context
    ) -> lifecycle_messages.ListLifecycleEventsResponse:
        requests.list_events(request)
        listing = ["events", request.workspace_id, request.task_id]
        after = 0
        if request.page_token:
            cursor = decode_token(request.page_token, listing, int)
            if cursor is None:
                raise malformed_page_token(Reason)
            after = cursor
        size = page_size(request.page_size)
        workspace_id, task_id, must_exist = request.workspace_id, request.task_id, not request.page_token

        def listing_of(tx: LifecycleReadTx) -> list[LifecycleEvent] | None:
            if must_exist and tx.tasks.load(workspace_id, task_id) is None:
                return None
            return tx.events.history(workspace_id, task_id, after, size + 1)

        events = await self._store.read(listing_of)
        if events is None:
            raise _task_not_found(task_id)
        more = len(events) > size
        protos = [event_to_proto(e) for e in events[:size]]
        fit = fitting(protos, self._page_bytes)
        more, events, protos = more or fit < len(protos), events[:fit], protos[:fit]
        return lifecycle_messages.ListLifecycleEventsResponse(
            events=protos,
            next_page_token=encode_token(listing, events[-1].revision) if more else "",
        )

    async def WatchLifecycleEvents(
        self, request: lifecycle_messages.WatchLifecycleEventsRequest, context: Context
    ) -> AsyncIterator[lifecycle_messages.WatchLifecycleEventsResponse]:
        requests.watch(request)
        workspace, task = request.workspace_id, request.task_id or None
        sequence_of = lambda item: item.event.sequence  # noqa: E731
        ends = WatchEnds(Reason, self._broker.capacity)
        stream = (
            follow_from_head(
                lambda: self._store.read(lambda tx: tx.events.last_sequence()),
                self._broker,
                workspace,
                task,
                lambda head: lifecycle_messages.WatchLifecycleEventsResponse(head_sequence=head),
                sequence_of,
                ends,
            )
            if request.from_head
            else follow(
                lambda cursor, limit: self._store.read(lambda tx: tx.events.page(workspace, cursor, task, limit)),
                self._broker,
                workspace,
                task,
                request.after_sequence,
                lambda event: lifecycle_messages.WatchLifecycleEventsResponse(event=event_to_proto(event)),
                sequence_of,
                ends,
            )
        )
        with self._watch_quota.admit(calls.served().principal.subject, workspace):
            async for item in stream:
                yield item


def _task_not_found(task_id: str) -> ServiceError:
    return ServiceError(reject(Reason.TASK_NOT_FOUND, f"task {task_id!r} does not exist", task_id=task_id))
