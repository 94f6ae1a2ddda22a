"""Event builders shared by the transcript tests: core `SessionEvent`s for the pure
grammar, protobuf `SessionEvent`s for the wire, and small gRPC shortcuts."""

from __future__ import annotations

from completion_service.core.transcript import EventKind, SessionEvent, TurnEndReason
from funnel.client.retry import stream_until_answered
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import types_pb2 as completion_types
from tests.completion.e2e_support import CALL_TIMEOUT, WS

# -- core events -------------------------------------------------------------------


def turn_start(turn: str = "t1") -> SessionEvent:
    return SessionEvent(EventKind.TURN_START, ref=turn)


def turn_end(turn: str = "t1", reason: TurnEndReason = TurnEndReason.COMPLETED) -> SessionEvent:
    return SessionEvent(EventKind.TURN_END, ref=turn, reason=reason)


def step_start(step: str = "s1") -> SessionEvent:
    return SessionEvent(EventKind.STEP_START, ref=step)


def step_end(step: str = "s1") -> SessionEvent:
    return SessionEvent(EventKind.STEP_END, ref=step)


def tool_call(call: str = "c1", name: str = "bash", arguments: str = "ls") -> SessionEvent:
    return SessionEvent(EventKind.TOOL_CALL, ref=call, name=name, text=arguments)


def tool_result(call: str = "c1", content: str = "ok", is_error: bool = False) -> SessionEvent:
    return SessionEvent(EventKind.TOOL_RESULT, ref=call, text=content, is_error=is_error)


def user_message(text: str = "please fix the bug") -> SessionEvent:
    return SessionEvent(EventKind.USER_MESSAGE, text=text)


def assistant_message(text: str = "on it") -> SessionEvent:
    return SessionEvent(EventKind.ASSISTANT_MESSAGE, text=text)


def checkpoint(checkpoint_id: str = "k1") -> SessionEvent:
    return SessionEvent(EventKind.CHECKPOINT, ref=checkpoint_id)


def restore(checkpoint_id: str = "k1") -> SessionEvent:
    return SessionEvent(EventKind.CHECKPOINT_RESTORE, ref=checkpoint_id)


def feedback(text: str = "that is not what I asked for") -> SessionEvent:
    return SessionEvent(EventKind.USER_FEEDBACK, text=text)


def resend(text: str = "please fix the bug") -> SessionEvent:
    return SessionEvent(EventKind.PROMPT_RESEND, text=text)


# -- wire events -------------------------------------------------------------------


class P:
    """Protobuf events as a host appends them (assigned fields left unset)."""

    @staticmethod
    def turn_start(turn: str = "t1") -> completion_types.SessionEvent:
        return completion_types.SessionEvent(turn_start=completion_types.TurnStart(turn_id=turn))

    @staticmethod
    def turn_end(
        turn: str = "t1", reason: int = completion_enums.TURN_END_REASON_COMPLETED
    ) -> completion_types.SessionEvent:
        return completion_types.SessionEvent(turn_end=completion_types.TurnEnd(turn_id=turn, reason=reason))

    @staticmethod
    def step_start(step: str = "s1") -> completion_types.SessionEvent:
        return completion_types.SessionEvent(step_start=completion_types.StepStart(step_id=step))

    @staticmethod
    def step_end(step: str = "s1") -> completion_types.SessionEvent:
        return completion_types.SessionEvent(step_end=completion_types.StepEnd(step_id=step))

    @staticmethod
    def tool_call(
        call: str = "c1", name: str = "bash", arguments: str = '{"cmd": "pytest"}'
    ) -> completion_types.SessionEvent:
        return completion_types.SessionEvent(
            tool_call=completion_types.ToolCall(call_id=call, tool_name=name, arguments=arguments)
        )

    @staticmethod
    def tool_result(
        call: str = "c1", content: str = "42 passed", is_error: bool = False
    ) -> completion_types.SessionEvent:
        return completion_types.SessionEvent(
            tool_result=completion_types.ToolResult(call_id=call, content=content, is_error=is_error)
        )

    @staticmethod
    def user_message(text: str = "please fix the bug") -> completion_types.SessionEvent:
        return completion_types.SessionEvent(user_message=completion_types.UserMessage(text=text))

    @staticmethod
    def assistant_message(text: str = "Fixed it.") -> completion_types.SessionEvent:
        return completion_types.SessionEvent(assistant_message=completion_types.AssistantMessage(text=text))

    @staticmethod
    def checkpoint(checkpoint_id: str = "k1") -> completion_types.SessionEvent:
        return completion_types.SessionEvent(checkpoint=completion_types.Checkpoint(checkpoint_id=checkpoint_id))

    @staticmethod
    def restore(checkpoint_id: str = "k1") -> completion_types.SessionEvent:
        return completion_types.SessionEvent(
            checkpoint_restore=completion_types.CheckpointRestore(checkpoint_id=checkpoint_id)
        )

    @staticmethod
    def feedback(text: str = "that is not what I asked for") -> completion_types.SessionEvent:
        return completion_types.SessionEvent(user_feedback=completion_types.UserFeedback(text=text))

    @staticmethod
    def resend(text: str = "please fix the bug") -> completion_types.SessionEvent:
        return completion_types.SessionEvent(prompt_resend=completion_types.PromptResend(text=text))


def a_full_turn(turn: str = "t1", step: str = "s1", call: str = "c1") -> list[completion_types.SessionEvent]:
    """A closed turn with one step and one answered call."""
    return [
        P.turn_start(turn),
        P.step_start(step),
        P.tool_call(call),
        P.tool_result(call),
        P.step_end(step),
        P.assistant_message(),
        P.turn_end(turn),
    ]


def body(event: completion_types.SessionEvent) -> str:
    return event.WhichOneof("body")


# -- gRPC shortcuts ----------------------------------------------------------------


async def append(
    ts, task_id: str, events, *, workspace: str = WS, **kw
) -> transcript_messages.AppendTranscriptResponse:
    return await ts.AppendTranscript(
        transcript_messages.AppendTranscriptRequest(workspace_id=workspace, task_id=task_id, events=list(events), **kw),
        timeout=CALL_TIMEOUT,
    )


async def load(ts, task_id: str, *, workspace: str = WS, **kw) -> transcript_messages.LoadTranscriptResponse:
    return await ts.LoadTranscript(
        transcript_messages.LoadTranscriptRequest(workspace_id=workspace, task_id=task_id, **kw), timeout=CALL_TIMEOUT
    )


async def load_all(
    ts, task_id: str, *, workspace: str = WS, page_size: int = 1000
) -> list[completion_types.SessionEvent]:
    """Every event, following page tokens (the first page repairs, as for any host)."""
    events: list[completion_types.SessionEvent] = []
    token = ""
    while True:
        page = await load(ts, task_id, workspace=workspace, page_size=page_size, page_token=token)
        events.extend(page.events)
        token = page.next_page_token
        if not token:
            return events


async def export_bytes(ts, task_id: str, *, workspace: str = WS) -> bytes:
    chunks = []
    async for chunk in ts.ExportTranscript(
        transcript_messages.ExportTranscriptRequest(workspace_id=workspace, task_id=task_id), timeout=CALL_TIMEOUT
    ):
        chunks.append(chunk.jsonl)
    return b"".join(chunks)


async def import_bytes(
    ts, task_id: str, data: bytes, *, workspace: str = WS, chunk: int = 7, timeout: float = CALL_TIMEOUT
):
    """Streams `data` in deliberately odd-sized chunks, so that lines straddle messages,
    again while grpc-aio loses a refusal of an early message (grpc/grpc#36066)."""

    async def requests():
        yield transcript_messages.ImportTranscriptRequest(
            target=transcript_messages.ImportTarget(workspace_id=workspace, task_id=task_id)
        )
        for start in range(0, len(data), chunk):
            yield transcript_messages.ImportTranscriptRequest(jsonl_chunk=data[start : start + chunk])

    return await stream_until_answered(lambda: ts.ImportTranscript(requests(), timeout=timeout))
