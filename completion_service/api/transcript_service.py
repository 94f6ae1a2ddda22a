"""The gRPC face of transcripts: appends (with reopening into a new generation),
loads (with interrupted-turn repair), JSONL export and import, and resume advice."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import Any

import grpc

from completion_service.api import requests
from completion_service.api.convert import session_event_from_proto, session_event_to_proto
from completion_service.api.imports import OutOfBuffer, StreamedImport, least_held_bytes
from completion_service.api.jsonl import LineDamaged, to_line
from completion_service.api.service import holder, request_key
from completion_service.authority import CompletionAuthority
from completion_service.core import transcript as grammar
from completion_service.errors import Reason
from completion_service.units.request_ids import peek
from completion_service.units.transcripts import AppendCommand, Appended
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import transcript_service_pb2_grpc as transcript_grpc
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.runtime import calls
from funnel.runtime.budget import GLOBAL, PER_CALLER, PER_WORKSPACE, ByteBudget, Shortfall
from funnel.runtime.clock import IdSource
from funnel.runtime.errors import Rejection, ServiceError, reject
from funnel.runtime.idempotency import Replay
from funnel.runtime.paging import (
    DEFAULT_MAX_MESSAGE_BYTES,
    decode_token,
    encode_token,
    fitting,
    page_size,
    response_budget,
)
from funnel.runtime.proto_enums import proto_enum
from funnel.runtime.shutdown import Drain
from funnel.runtime.validation import malformed_page_token

SERVICE_NAME = "funnel.completion.v1.TranscriptService"
_EXPORT_PAGE = 500
# To an upload handler, a client stream that broke off (the client cancelled, its
# deadline passed, a message exceeded the size limit) ends exactly like a complete
# one; gRPC cancels the handler a moment later. An import waits this long before
# committing, so that a truncated file is discarded instead of imported.
STREAM_END_GRACE_SECONDS = 0.05


class TranscriptService(transcript_grpc.TranscriptServiceServicer):
    def __init__(
        self,
        authority: CompletionAuthority,
        ids: IdSource,
        import_budget: ByteBudget,
        drain: Drain,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._authority = authority
        self._store = authority.store
        self._transcripts = authority.transcripts
        self._ids = ids
        self._import_budget = import_budget
        self._drain = drain
        self._max_message_bytes = max_message_bytes
        self._page_bytes = response_budget(max_message_bytes)

    async def _task(self, workspace_id: str, task_id: str) -> lifecycle_messages.GetTaskResponse:
        return await self._authority.lifecycle_task(workspace_id, task_id)

    async def _require_task(self, workspace_id: str, task_id: str) -> None:
        """TASK_NOT_FOUND for a task the lifecycle service does not know; a task
        with a transcript is known without asking."""
        state = await self._transcripts.state(workspace_id, task_id)
        if not state.tail.last_sequence:
            await self._task(workspace_id, task_id)

    async def AppendTranscript(
        self,
        request: transcript_messages.AppendTranscriptRequest,
        context: grpc.aio.ServicerContext[
            transcript_messages.AppendTranscriptRequest, transcript_messages.AppendTranscriptResponse
        ],
    ) -> transcript_messages.AppendTranscriptResponse:
        requests.append_transcript(request)
        key = request_key("AppendTranscript", request)
        remembered = await self._store.read(functools.partial(peek, key=key))
        if isinstance(remembered, Rejection):
            raise ServiceError(remembered)
        if isinstance(remembered, Replay):
            return transcript_messages.AppendTranscriptResponse.FromString(remembered.response)
        events = [session_event_from_proto(e) for e in request.events]
        workspace, task_id = request.workspace_id, request.task_id
        task = (await self._task(workspace, task_id)).task
        generation, resumed = task.generation, False
        expected = request.expected_state_version if request.HasField("expected_state_version") else None
        if task.state == lifecycle_enums.GENERATION_STATE_TERMINAL:
            reopened = await self._authority.reopener.reopen(workspace, task, events, expected, key)
            generation, resumed = reopened.generation, reopened.by_this_batch

        def render(appended: Appended) -> transcript_messages.AppendTranscriptResponse:
            return transcript_messages.AppendTranscriptResponse(
                state_version=appended.state_version,
                first_sequence=appended.first_sequence,
                generation=generation,
                resumed=resumed,
            )

        result = await self._transcripts.append(
            AppendCommand(
                workspace,
                task_id,
                events,
                generation,
                expected,
                holder(),
                key,
                lambda appended: render(appended).SerializeToString(),
            )
        )
        if isinstance(result, Replay):
            return transcript_messages.AppendTranscriptResponse.FromString(result.response)
        return render(result)

    async def LoadTranscript(
        self,
        request: transcript_messages.LoadTranscriptRequest,
        context: grpc.aio.ServicerContext[
            transcript_messages.LoadTranscriptRequest, transcript_messages.LoadTranscriptResponse
        ],
    ) -> transcript_messages.LoadTranscriptResponse:
        requests.load_transcript(request)
        listing = ["transcript", request.workspace_id, request.task_id]
        after = 0
        if request.page_token:
            cursor = decode_token(request.page_token, listing, int)
            if cursor is None:
                raise malformed_page_token(Reason)
            after = cursor
        else:
            await self._require_task(request.workspace_id, request.task_id)
        page = await self._transcripts.load(
            request.workspace_id,
            request.task_id,
            after,
            page_size(request.page_size),
            repair_first=not request.page_token,
        )
        protos = [session_event_to_proto(e) for e in page.events]
        fit = fitting(protos, self._page_bytes)
        more, events, protos = page.more or fit < len(protos), page.events[:fit], protos[:fit]
        return transcript_messages.LoadTranscriptResponse(
            events=protos,
            next_page_token=encode_token(listing, events[-1].sequence) if more else "",
            state_version=page.state_version,
            repaired=page.repaired,
            turn_in_progress=page.turn_in_progress,
        )

    async def ExportTranscript(
        self,
        request: transcript_messages.ExportTranscriptRequest,
        context: grpc.aio.ServicerContext[
            transcript_messages.ExportTranscriptRequest, transcript_messages.ExportTranscriptResponse
        ],
    ) -> AsyncIterator[transcript_messages.ExportTranscriptResponse]:
        requests.task_named(request)
        await self._require_task(request.workspace_id, request.task_id)
        after = 0
        while True:
            events = await self._transcripts.events_after(request.workspace_id, request.task_id, after, _EXPORT_PAGE)
            if not events:
                return
            chunk = b""
            for event in events:
                line = to_line(session_event_to_proto(event))
                if chunk and len(chunk) + len(line) > self._page_bytes:
                    yield transcript_messages.ExportTranscriptResponse(
                        jsonl=chunk
                    )  # whole lines, within the message limit
                    chunk = b""
                # A line longer than a message (JSON escapes a control character in
                # six bytes) goes out in consecutive pieces.
                while len(line) > self._page_bytes:
                    yield transcript_messages.ExportTranscriptResponse(jsonl=line[: self._page_bytes])
                    line = line[self._page_bytes :]
                chunk += line
            yield transcript_messages.ExportTranscriptResponse(jsonl=chunk)
            after = events[-1].sequence

    async def ImportTranscript(
        self,
        request_iterator: AsyncIterator[transcript_messages.ImportTranscriptRequest],
        context: grpc.aio.ServicerContext[
            transcript_messages.ImportTranscriptRequest, transcript_messages.ImportTranscriptResponse
        ],
    ) -> transcript_messages.ImportTranscriptResponse:
        target = requests.import_target(await anext(aiter(request_iterator), None))
        workspace, task_id = target.workspace_id, target.task_id
        # The budget first: a flood of imports is refused here, before each of
        # them would ask the lifecycle service about its task.
        reservation = self._import_budget.reserve(least_held_bytes(self._max_message_bytes), _caller(), workspace)
        if isinstance(reservation, Shortfall):
            raise self._budget_exhausted(reservation)
        importer = StreamedImport(self._transcripts, self._ids.new_id("import"), reservation, self._max_message_bytes)
        try:
            await self._task(workspace, task_id)
            state = await self._transcripts.state(workspace, task_id)
            if state.tail.last_sequence:
                raise ServiceError(
                    reject(Reason.TRANSCRIPT_NOT_EMPTY, f"task {task_id!r} already has a transcript", task_id=task_id)
                )
            return await self._import(importer, request_iterator, context, workspace, task_id)
        finally:
            importer.close()

    async def _import(
        self,
        importer: StreamedImport,
        request_iterator: AsyncIterator[transcript_messages.ImportTranscriptRequest],
        context: grpc.aio.ServicerContext[
            transcript_messages.ImportTranscriptRequest, transcript_messages.ImportTranscriptResponse
        ],
        workspace: str,
        task_id: str,
    ) -> transcript_messages.ImportTranscriptResponse:
        try:
            # A stopping server lets the client finish sending within its grace
            # (funnel.runtime.shutdown); the rest is all or nothing as always.
            async with self._drain.bounded(_import_cut_by_shutdown):
                async for message in request_iterator:
                    if message.WhichOneof("part") != "jsonl_chunk":
                        raise _line_error(importer.splitter.line_number + 1, "the target may only come first")
                    importer.feed(message)
                    del message  # not kept while the lines are staged: the importer has the bytes
                    await importer.take_lines()
            warnings = await importer.finish()
            await _stream_really_ended(context)
            version = await self._transcripts.commit_import(
                importer.import_id, workspace, task_id, importer.tail, importer.checkpoints
            )
        except LineDamaged as damage:
            await self._transcripts.discard_import(importer.import_id)
            raise _line_error(damage.line, damage.problem) from None
        except OutOfBuffer as short:
            await self._transcripts.discard_import(importer.import_id)
            raise self._budget_exhausted(short.shortfall) from None
        except BaseException:
            await self._transcripts.discard_import(importer.import_id)
            raise
        if isinstance(version, Rejection):
            # The refused commit was rolled back with everything in it: drop the staged rows here.
            await self._transcripts.discard_import(importer.import_id)
            raise ServiceError(version)
        return transcript_messages.ImportTranscriptResponse(
            imported_events=importer.count, state_version=version, warnings=warnings
        )

    def _budget_exhausted(self, shortfall: Shortfall) -> ServiceError:
        holders = {
            GLOBAL: "the transcript imports in flight hold the whole import buffer",
            PER_CALLER: "your transcript imports in flight hold your share of the import buffer",
            PER_WORKSPACE: "the workspace's transcript imports in flight hold its share of the import buffer",
        }[shortfall.scope]
        return ServiceError(
            reject(
                Reason.IMPORT_BUFFER_EXHAUSTED,
                f"{holders} ({shortfall.limit} bytes); nothing was imported, retry later",
                scope=shortfall.scope,
                limit_bytes=shortfall.limit,
            )
        )

    async def ResolveResume(
        self,
        request: transcript_messages.ResolveResumeRequest,
        context: grpc.aio.ServicerContext[
            transcript_messages.ResolveResumeRequest, transcript_messages.ResolveResumeResponse
        ],
    ) -> transcript_messages.ResolveResumeResponse:
        requests.task_named(request)
        task = (await self._task(request.workspace_id, request.task_id)).task
        terminal = task.state == lifecycle_enums.GENERATION_STATE_TERMINAL
        outcome = (
            lifecycle_enums.TerminalOutcome.Name(task.outcome).removeprefix("TERMINAL_OUTCOME_") if terminal else None
        )
        advice = grammar.resolve_resume(terminal, outcome, task.generation)
        return transcript_messages.ResolveResumeResponse(
            ask=proto_enum(completion_enums.ResumeAsk, advice.ask.value),
            primary=proto_enum(completion_enums.HostAction, advice.primary.value),
            secondary=proto_enum(completion_enums.HostAction, advice.secondary.value if advice.secondary else 0),
            reason=advice.reason,
            generation=task.generation,
            completion_id=task.completion_id,
        )


async def _stream_really_ended(context: grpc.aio.ServicerContext[Any, Any]) -> None:
    """Raises CancelledError when the request stream ended because the call failed."""
    await asyncio.sleep(STREAM_END_GRACE_SECONDS)
    if context.cancelled() or context.done():
        raise asyncio.CancelledError("the import stream broke off")


def _import_cut_by_shutdown() -> ServiceError:
    return ServiceError(
        reject(
            Reason.SERVER_SHUTTING_DOWN,
            "the server is shutting down and the import was still being sent; nothing was imported, send the "
            "whole file again",
        )
    )


def _line_error(line: int, problem: str) -> ServiceError:
    return ServiceError(
        reject(Reason.TRANSCRIPT_LINE_INVALID, f"line {line}: {problem}; nothing was imported", line=line)
    )


def _caller() -> str:
    """Whose share of the import buffer an import takes: its caller's subject."""
    return calls.served().principal.subject
