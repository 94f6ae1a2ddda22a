"""The gRPC face of the completion authority."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from completion_service.api import requests
from completion_service.api.convert import (
    DecisionProtos,
    audit_to_proto,
    completion_to_proto,
    event_to_proto,
    evidence_to_proto,
    lease_to_proto,
    run_to_proto,
)
from completion_service.authority import CompletionAuthority, RunClosed
from completion_service.core.model import (
    CompletionEvent,
    EvidenceRecord,
    FinalStatus,
    RequestedOutcome,
    RunOutcome,
)
from completion_service.errors import Reason
from completion_service.storage.port import CompletionReadTx
from completion_service.units.completions import AttemptCommand, AttemptOutcome
from completion_service.units.runs import Claimed, RenewCommand
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import completion_service_pb2_grpc as completion_grpc
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.runtime import calls
from funnel.runtime.errors import ServiceError, reject
from funnel.runtime.idempotency import Replay, RequestKey, fingerprint
from funnel.runtime.paging import (
    DEFAULT_MAX_MESSAGE_BYTES,
    decode_token,
    encode_token,
    fitting,
    page_size,
    response_budget,
)
from funnel.runtime.proto_enums import proto_enum
from funnel.runtime.validation import malformed_page_token
from funnel.runtime.watch import EventBroker, WatchEnds, WatchQuota, follow

SERVICE_NAME = "funnel.completion.v1.CompletionService"
C = TypeVar("C")
R = TypeVar("R")
M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class Page(Generic[R]):
    items: list[R]
    more: bool = False


def page_of(rows: list[R], limit: int) -> Page[R]:
    """A page from `limit + 1` loaded rows."""
    return Page(rows[:limit], len(rows) > limit)


def publisher(
    broker: EventBroker[completion_messages.WatchCompletionEventsResponse],
) -> Callable[[list[CompletionEvent]], None]:
    """The store's after-commit hook: hands committed events to the watch streams."""

    def publish(events: list[CompletionEvent]) -> None:
        for event in events:
            broker.publish(event.workspace_id, event.task_id, functools.partial(_watch_response, event))

    return publish


def _watch_response(event: CompletionEvent) -> completion_messages.WatchCompletionEventsResponse:
    return completion_messages.WatchCompletionEventsResponse(event=event_to_proto(event))


class KeyedRequest(Protocol):
    """A request that may carry a `request_id`: every mutating one."""

    request_id: str
    workspace_id: str

    def SerializeToString(self, *, deterministic: bool = ...) -> bytes: ...


def request_key(method: str, request: KeyedRequest, workspace_id: str | None = None) -> RequestKey | None:
    """The request's `request_id` in its scope (workspace, caller, RPC), or None."""
    if not request.request_id:
        return None
    return RequestKey(
        workspace_id or request.workspace_id,
        calls.served().principal.subject,
        method,
        request.request_id,
        fingerprint(method, request.SerializeToString(deterministic=True)),
    )


def holder() -> str | None:
    """The agent that must hold the runs the call names: the caller's subject when
    it acts as an agent (see funnel/auth/table.py), else None."""
    call = calls.served()
    return call.principal.subject if call.holder_only else None


def _check_deadline(context: grpc.aio.ServicerContext[Any, Any]) -> None:
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise ServiceError(reject(Reason.DEADLINE_EXPIRED, "the deadline expired before the request was applied"))


def _token(request: Any, listing: list[str], cursor_type: type[C]) -> C | None:
    if not request.page_token:
        return None
    cursor = decode_token(request.page_token, listing, cursor_type)
    if cursor is None or (cursor_type is list and not _is_time_id_pair(cursor)):
        raise malformed_page_token(Reason)
    return cursor


def _is_time_id_pair(cursor: object) -> bool:
    return isinstance(cursor, list) and len(cursor) == 2 and type(cursor[0]) is int and isinstance(cursor[1], str)


class CompletionService(completion_grpc.CompletionServiceServicer):
    def __init__(
        self,
        authority: CompletionAuthority,
        broker: EventBroker[completion_messages.WatchCompletionEventsResponse],
        watch_quota: WatchQuota,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._authority = authority
        self._store = authority.store
        self._broker = broker
        self._watch_quota = watch_quota
        self._page_bytes = response_budget(max_message_bytes)

    def _fit(self, page: Page[R], to_proto: Callable[[R], M]) -> tuple[list[R], list[M], bool]:
        """The page's items, their messages and whether more follow, cut to the response budget."""
        protos = [to_proto(item) for item in page.items]
        fit = fitting(protos, self._page_bytes)
        return page.items[:fit], protos[:fit], page.more or fit < len(protos)

    async def ClaimTask(
        self,
        request: completion_messages.ClaimTaskRequest,
        context: grpc.aio.ServicerContext[completion_messages.ClaimTaskRequest, completion_messages.ClaimTaskResponse],
    ) -> completion_messages.ClaimTaskResponse:
        ttl = requests.claim_task(request)
        _check_deadline(context)
        agent = holder()
        if agent is not None and request.agent_id != agent:
            raise ServiceError(
                reject(
                    Reason.AGENT_ID_MISMATCH,
                    f"an agent claims only as itself: agent_id must be {agent!r}, the token's subject",
                    agent_id=request.agent_id,
                )
            )
        result = await self._authority.runs.claim(
            request.workspace_id,
            request.task_id,
            request.agent_id,
            ttl,
            request_key("ClaimTask", request),
            lambda claimed: _claim_response(claimed).SerializeToString(),
            lambda stored: completion_messages.ClaimTaskResponse.FromString(stored).run.run_id,
        )
        if isinstance(result, Replay):
            return completion_messages.ClaimTaskResponse.FromString(result.response)
        return _claim_response(result)

    async def RenewLease(
        self,
        request: completion_messages.RenewLeaseRequest,
        context: grpc.aio.ServicerContext[
            completion_messages.RenewLeaseRequest, completion_messages.RenewLeaseResponse
        ],
    ) -> completion_messages.RenewLeaseResponse:
        ttl = requests.renew_lease(request)
        _check_deadline(context)
        result = await self._authority.runs.renew(
            RenewCommand(
                request.workspace_id,
                request.run_id,
                request.epoch,
                ttl,
                holder(),
                request_key("RenewLease", request),
                lambda lease: completion_messages.RenewLeaseResponse(lease=lease_to_proto(lease)).SerializeToString(),
            )
        )
        if isinstance(result, Replay):
            return completion_messages.RenewLeaseResponse.FromString(result.response)
        return completion_messages.RenewLeaseResponse(lease=lease_to_proto(result))

    async def CompleteRun(
        self,
        request: completion_messages.CompleteRunRequest,
        context: grpc.aio.ServicerContext[
            completion_messages.CompleteRunRequest, completion_messages.CompleteRunResponse
        ],
    ) -> completion_messages.CompleteRunResponse:
        requests.complete_run(request)
        _check_deadline(context)
        protos = DecisionProtos()

        def render(closed: RunClosed) -> completion_messages.CompleteRunResponse:
            run = closed.run
            completion = closed.completion
            return completion_messages.CompleteRunResponse(
                run_id=run.run_id,
                finish_time=run_to_proto(run).finish_time,
                final_status=proto_enum(
                    completion_enums.FinalStatus, run.final_status.value if run.final_status else 0
                ),
                tokens_total=run.tokens_total or 0,
                notes_truncated=run.notes_truncated,
                decision=protos.told(closed.decision, completion) if closed.decision else None,
                completion=protos.completion(completion) if completion else None,
                task_effect=proto_enum(completion_enums.TaskEffect, closed.effect.value if closed.effect else 0),
                task_effect_reason=closed.effect_reason,
            )

        def optional(field: str) -> int | None:
            return getattr(request, field) if request.HasField(field) else None

        result = await self._authority.closer.complete_run(
            request.workspace_id,
            request.run_id,
            RunOutcome(request.outcome),
            (optional("tokens_input"), optional("tokens_output"), optional("tokens_total")),
            request.notes,
            request.error,
            FinalStatus(request.final_status) if request.final_status else None,
            calls.served().caller,
            holder(),
            request_key("CompleteRun", request),
            lambda closed: render(closed).SerializeToString(),
        )
        if isinstance(result, Replay):
            return completion_messages.CompleteRunResponse.FromString(result.response)
        return render(result)

    async def GetRun(
        self,
        request: completion_messages.GetRunRequest,
        context: grpc.aio.ServicerContext[completion_messages.GetRunRequest, completion_messages.GetRunResponse],
    ) -> completion_messages.GetRunResponse:
        requests.run_key(request)
        run = await self._store.read(lambda tx: tx.runs.load(request.workspace_id, request.run_id))
        if run is None:
            raise ServiceError(
                reject(Reason.RUN_NOT_FOUND, f"run {request.run_id!r} does not exist", run_id=request.run_id)
            )
        return completion_messages.GetRunResponse(run=run_to_proto(run))

    async def ListRuns(
        self,
        request: completion_messages.ListRunsRequest,
        context: grpc.aio.ServicerContext[completion_messages.ListRunsRequest, completion_messages.ListRunsResponse],
    ) -> completion_messages.ListRunsResponse:
        requests.listing(request, "task_id")
        # Unfiltered by openness, the listing is as before the filter existed (its tokens stay valid).
        listing = ["runs", request.workspace_id, request.task_id, *(["open"] if request.open_only else [])]
        cursor = _token(request, listing, list)
        size = page_size(request.page_size)
        before = (cursor[0], cursor[1]) if cursor else None
        page = page_of(
            await self._store.read(
                lambda tx: tx.runs.page(
                    request.workspace_id, request.task_id or None, before, size + 1, request.open_only
                )
            ),
            size,
        )
        items, protos, more = self._fit(page, run_to_proto)
        return completion_messages.ListRunsResponse(
            runs=protos,
            next_page_token=encode_token(listing, [items[-1].claimed_at, items[-1].run_id]) if more else "",
        )

    async def RecordEvidence(
        self,
        request: completion_messages.RecordEvidenceRequest,
        context: grpc.aio.ServicerContext[
            completion_messages.RecordEvidenceRequest, completion_messages.RecordEvidenceResponse
        ],
    ) -> completion_messages.RecordEvidenceResponse:
        requests.record_evidence(request)
        _check_deadline(context)
        record = EvidenceRecord(
            evidence_id="",
            workspace_id=request.workspace_id,
            task_id=request.task_id,
            generation=request.generation,
            kind=request.kind,
            passed=request.verdict == completion_enums.EVIDENCE_VERDICT_PASSED,
            checkpoint=request.checkpoint,
            details=request.details,
            run_id=request.run_id or None,
            recorded_at=0,
            recorded_by=calls.served().caller,
        )
        result = await self._authority.completions.record_evidence(
            record,
            holder(),
            request_key("RecordEvidence", request),
            lambda stored: completion_messages.RecordEvidenceResponse(
                evidence=evidence_to_proto(stored)
            ).SerializeToString(),
        )
        if isinstance(result, Replay):
            return completion_messages.RecordEvidenceResponse.FromString(result.response)
        return completion_messages.RecordEvidenceResponse(evidence=evidence_to_proto(result))

    async def ListEvidence(
        self,
        request: completion_messages.ListEvidenceRequest,
        context: grpc.aio.ServicerContext[
            completion_messages.ListEvidenceRequest, completion_messages.ListEvidenceResponse
        ],
    ) -> completion_messages.ListEvidenceResponse:
        requests.list_evidence(request)
        listing = ["evidence", request.workspace_id, request.task_id, str(request.generation)]
        cursor = _token(request, listing, list)
        size = page_size(request.page_size)
        after = (cursor[0], cursor[1]) if cursor else None
        page = page_of(
            await self._store.read(
                lambda tx: tx.evidence.page(
                    request.workspace_id, request.task_id, request.generation or None, after, size + 1
                )
            ),
            size,
        )
        items, protos, more = self._fit(page, evidence_to_proto)
        return completion_messages.ListEvidenceResponse(
            evidence=protos,
            next_page_token=encode_token(listing, [items[-1].recorded_at, items[-1].evidence_id]) if more else "",
        )

    async def AttemptCompletion(
        self,
        request: completion_messages.AttemptCompletionRequest,
        context: grpc.aio.ServicerContext[
            completion_messages.AttemptCompletionRequest, completion_messages.AttemptCompletionResponse
        ],
    ) -> completion_messages.AttemptCompletionResponse:
        requests.attempt_completion(request)
        _check_deadline(context)
        # The stored response (rendered in the transaction) and the reply share their decisions.
        protos = DecisionProtos()
        outcome = await self._authority.completions.attempt(
            AttemptCommand(
                workspace_id=request.workspace_id,
                task_id=request.task_id,
                run_id=request.run_id,
                claimed_epoch=request.epoch,
                outcome=RequestedOutcome(request.outcome),
                result=request.result,
                state_version=request.state_version if request.HasField("state_version") else None,
                request=request_key("AttemptCompletion", request),
                holder=holder(),
                render=lambda attempted: _render_attempt(attempted, protos).SerializeToString(),
            )
        )
        if isinstance(outcome, Replay):
            return await self._replayed_attempt(outcome)
        return _render_attempt(outcome, protos)

    async def _replayed_attempt(self, remembered: Replay) -> completion_messages.AttemptCompletionResponse:
        """The original decision, with the completion's current settlement and what
        that settlement means for the agent (see binding_decision)."""
        response = completion_messages.AttemptCompletionResponse.FromString(remembered.response)
        if response.HasField("completion"):
            stored = response.completion
            current = await self._store.read(
                lambda tx: tx.completions.load(stored.workspace_id, stored.task_id, stored.generation)
            )
            if current is not None and current.completion_id == stored.completion_id:
                protos = DecisionProtos()
                response.completion.CopyFrom(protos.completion(current))
                response.decision.CopyFrom(protos.told(current.decision, current))
        return response

    async def GetCompletion(
        self,
        request: completion_messages.GetCompletionRequest,
        context: grpc.aio.ServicerContext[
            completion_messages.GetCompletionRequest, completion_messages.GetCompletionResponse
        ],
    ) -> completion_messages.GetCompletionResponse:
        requests.get_completion(request)
        completion = await self._store.read(
            lambda tx: tx.completions.load(request.workspace_id, request.task_id, request.generation)
        )
        if completion is None:
            raise ServiceError(
                reject(
                    Reason.COMPLETION_NOT_FOUND,
                    f"task {request.task_id!r} generation {request.generation} has no completion",
                    task_id=request.task_id,
                    generation=request.generation,
                )
            )
        return completion_messages.GetCompletionResponse(completion=completion_to_proto(completion))

    async def ListCompletions(
        self,
        request: completion_messages.ListCompletionsRequest,
        context: grpc.aio.ServicerContext[
            completion_messages.ListCompletionsRequest, completion_messages.ListCompletionsResponse
        ],
    ) -> completion_messages.ListCompletionsResponse:
        settlement = requests.list_completions(request)
        # The filter is part of the listing, so a token is valid only for the filter it
        # came from; unfiltered, the listing is as before the filter existed (tokens
        # issued then stay valid).
        listing = ["completions", request.workspace_id, request.task_id]
        if settlement is not None:
            listing.append(settlement.name)
        cursor = _token(request, listing, list)
        size = page_size(request.page_size)
        after = (cursor[0], cursor[1]) if cursor else None
        page = page_of(
            await self._store.read(
                lambda tx: tx.completions.page(
                    request.workspace_id, request.task_id or None, settlement, after, size + 1
                )
            ),
            size,
        )
        items, protos, more = self._fit(page, completion_to_proto)
        return completion_messages.ListCompletionsResponse(
            completions=protos,
            next_page_token=encode_token(listing, [items[-1].committed_at, items[-1].completion_id]) if more else "",
        )

    async def ListAuditLog(
        self,
        request: completion_messages.ListAuditLogRequest,
        context: grpc.aio.ServicerContext[
            completion_messages.ListAuditLogRequest, completion_messages.ListAuditLogResponse
        ],
    ) -> completion_messages.ListAuditLogResponse:
        requests.listing(request, "task_id", "run_id")
        listing = ["audit", request.workspace_id, request.task_id, request.run_id]
        cursor = _token(request, listing, int) or 0
        size = page_size(request.page_size)
        page = page_of(
            await self._store.read(
                lambda tx: tx.events.audit_page(
                    request.workspace_id, request.task_id or None, request.run_id or None, cursor, size + 1
                )
            ),
            size,
        )
        items, protos, more = self._fit(page, audit_to_proto)
        return completion_messages.ListAuditLogResponse(
            entries=protos,
            next_page_token=encode_token(listing, items[-1].audit_id) if more else "",
        )

    async def ListCompletionEvents(
        self,
        request: completion_messages.ListCompletionEventsRequest,
        context: grpc.aio.ServicerContext[
            completion_messages.ListCompletionEventsRequest, completion_messages.ListCompletionEventsResponse
        ],
    ) -> completion_messages.ListCompletionEventsResponse:
        requests.watch(request)
        size = page_size(request.page_size)
        events = await self._store.read(
            lambda tx: tx.events.page(request.workspace_id, request.after_sequence, request.task_id or None, size + 1)
        )
        protos = [event_to_proto(event) for event in events[:size]]
        fit = fitting(protos, self._page_bytes)
        return completion_messages.ListCompletionEventsResponse(
            events=protos[:fit], has_more=len(events) > size or fit < len(protos)
        )

    async def WatchCompletionEvents(
        self,
        request: completion_messages.WatchCompletionEventsRequest,
        context: grpc.aio.ServicerContext[
            completion_messages.WatchCompletionEventsRequest, completion_messages.WatchCompletionEventsResponse
        ],
    ) -> AsyncIterator[completion_messages.WatchCompletionEventsResponse]:
        requests.watch(request)
        workspace, task = request.workspace_id, request.task_id or None
        with self._watch_quota.admit(calls.served().principal.subject, workspace):
            async for item in follow(
                lambda cursor, limit: self._store.read(_events_after(workspace, cursor, task, limit)),
                self._broker,
                workspace,
                task,
                request.after_sequence,
                lambda event: completion_messages.WatchCompletionEventsResponse(event=event_to_proto(event)),
                lambda item: item.event.sequence,
                WatchEnds(Reason, self._broker.capacity),
            ):
                yield item


def _events_after(
    workspace_id: str, after_sequence: int, task_id: str | None, limit: int
) -> Callable[[CompletionReadTx], list[CompletionEvent]]:
    return lambda tx: tx.events.page(workspace_id, after_sequence, task_id, limit)


def _claim_response(claimed: Claimed) -> completion_messages.ClaimTaskResponse:
    return completion_messages.ClaimTaskResponse(run=run_to_proto(claimed.run), lease=lease_to_proto(claimed.lease))


def _render_attempt(outcome: AttemptOutcome, protos: DecisionProtos) -> completion_messages.AttemptCompletionResponse:
    completion = outcome.completion
    return completion_messages.AttemptCompletionResponse(
        decision=protos.told(outcome.decision, completion),
        completion=protos.completion(completion) if completion else None,
        existing_completion=outcome.existing,
    )
