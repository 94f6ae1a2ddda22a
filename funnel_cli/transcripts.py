"""`funnel transcript import|export`: JSONL in and out of a task's transcript."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

from funnel.completion.v1 import transcript_pb2 as tpb
from funnel.completion.v1 import transcript_pb2_grpc
from funnel_cli.connection import Connection

CHUNK_BYTES = 64 * 1024
# Whole transfers of large transcripts, not single calls: generous but finite.
TRANSFER_TIMEOUT = 600.0


async def export_transcript(
    connection: Connection, address: str, workspace_id: str, task_id: str, out: BinaryIO
) -> int:
    """Writes the transcript as JSONL; returns the number of lines."""
    lines = 0
    async with connection.channel(address) as channel:
        stub = transcript_pb2_grpc.TranscriptServiceStub(channel)
        request = tpb.ExportTranscriptRequest(workspace_id=workspace_id, task_id=task_id)
        async for chunk in stub.ExportTranscript(request, timeout=TRANSFER_TIMEOUT):
            out.write(chunk.jsonl)
            lines += chunk.jsonl.count(b"\n")
    out.flush()
    return lines


async def import_transcript(
    connection: Connection, address: str, workspace_id: str, task_id: str, path: Path
) -> tpb.ImportTranscriptResponse:
    """Streams the file in chunks, so its size never matters to memory."""

    async def requests() -> AsyncIterator[tpb.ImportTranscriptRequest]:
        yield tpb.ImportTranscriptRequest(target=tpb.ImportTarget(workspace_id=workspace_id, task_id=task_id))
        with open(path, "rb") as source:
            while chunk := source.read(CHUNK_BYTES):
                yield tpb.ImportTranscriptRequest(jsonl_chunk=chunk)

    async with connection.channel(address) as channel:
        stub = transcript_pb2_grpc.TranscriptServiceStub(channel)
        return await stub.ImportTranscript(requests(), timeout=TRANSFER_TIMEOUT)


def report_import(response: tpb.ImportTranscriptResponse) -> None:
    for warning in response.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"imported {response.imported_events} events; state version {response.state_version}")
