"""`funnel transcript import|export`: JSONL in and out of a task's transcript."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO, TextIO

from funnel.client.connection import Connection
from funnel.client.retry import stream_until_answered
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import transcript_service_pb2_grpc as transcript_grpc
from funnel_cli.output import Progress

CHUNK_BYTES = 64 * 1024
# Whole transfers of large transcripts, not single calls: generous but finite.
TRANSFER_TIMEOUT = 600.0


async def export_transcript(
    connection: Connection,
    address: str,
    workspace_id: str,
    task_id: str,
    out: BinaryIO,
    progress_to: TextIO | None = None,
) -> int:
    """Writes the transcript as JSONL; returns the number of lines. Counts the
    events written on `progress_to` (standard error) when it is a terminal: with
    no bar, since the API tells the number of events only by sending them."""
    lines = 0
    progress = Progress(f"exporting {task_id}", None, progress_to, unit="events")
    # Events written to the terminal itself would be torn by the redrawn count.
    progress.enabled = progress.enabled and not out.isatty()
    try:
        async with connection.channel(address) as channel:
            # grpcio-tools leaves the stub's constructor unannotated; only `mypy --strict`
            # reports calling it here, the project's own run leaves the ignore unused.
            stub = transcript_grpc.TranscriptServiceStub(channel)  # type: ignore[no-untyped-call, unused-ignore]
            request = transcript_messages.ExportTranscriptRequest(workspace_id=workspace_id, task_id=task_id)
            async for chunk in stub.ExportTranscript(request, timeout=TRANSFER_TIMEOUT):
                out.write(chunk.jsonl)
                lines += chunk.jsonl.count(b"\n")
                progress.update(lines)
        out.flush()
    finally:
        progress.stop()
    return lines


async def import_transcript(
    connection: Connection,
    address: str,
    workspace_id: str,
    task_id: str,
    path: Path,
    progress_to: TextIO | None = None,
) -> transcript_messages.ImportTranscriptResponse:
    """Streams the file in chunks, so its size never matters to memory, from its
    start again if the client library lost a refusal. A bar of the bytes read so
    far on `progress_to` (standard error) when it is a terminal."""
    progress = Progress(f"importing {path.name}", Path(path).stat().st_size, progress_to)

    async def send_file(stub: transcript_grpc.TranscriptServiceStub) -> transcript_messages.ImportTranscriptResponse:
        with open(path, "rb") as source:

            async def requests() -> AsyncIterator[transcript_messages.ImportTranscriptRequest]:
                yield transcript_messages.ImportTranscriptRequest(
                    target=transcript_messages.ImportTarget(workspace_id=workspace_id, task_id=task_id)
                )
                while chunk := source.read(CHUNK_BYTES):
                    yield transcript_messages.ImportTranscriptRequest(jsonl_chunk=chunk)
                    progress.update(source.tell())

            response: transcript_messages.ImportTranscriptResponse = await stub.ImportTranscript(
                requests(), timeout=TRANSFER_TIMEOUT
            )
            return response

    try:
        async with connection.channel(address) as channel:
            stub = transcript_grpc.TranscriptServiceStub(channel)  # type: ignore[no-untyped-call, unused-ignore]
            response = await stream_until_answered(lambda: send_file(stub))
    except BaseException:
        progress.stop()
        raise
    progress.finish()
    return response


def report_import(response: transcript_messages.ImportTranscriptResponse) -> None:
    for warning in response.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"imported {response.imported_events} events; state version {response.state_version}")
