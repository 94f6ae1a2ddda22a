"""Import memory, bounded and stated (docs/security.md, "Limits"): round after
round of stalled and of admitted imports from many callers against a real
completion service; its resident memory stays under the bound the document
states, and falls back once each round has ended."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import grpc

from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import transcript_service_pb2_grpc as transcript_grpc
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.runtime.grpc_errors import error_info
from tests import credentials
from tests.prometheus import scrape, value
from tests.security.support import rss_bytes
from tests.transcripts.support import import_bytes

MB = 1024 * 1024
DOC = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text(encoding="utf-8")
# The sentence of the document that states the bound, and how much more the
# process may hold after the last round than after the first (caches warming up).
BOUND = re.compile(r"stays within (\d+) MiB of its idle size")
GROWTH_MB = 24
WORKSPACES = [f"ws-mem-{n}" for n in range(4)]
CALLERS = [(workspace, f"host-{workspace}-{n}") for workspace in WORKSPACES for n in range(2)]
STALLED_PER_CALLER = 8
WHOLE_PER_CALLER = 2
ROUNDS = 6
# A stalled import sends one message just under the 4 MiB limit: a line it never
# finishes. A file is 1,000 events, sent as the CLI sends it (64 KiB chunks).
STALLED_CHUNK = b'{"sequence":"1","generation":"1","user_message":{"text":"' + b"s" * (4 * MB - 1024)
FILE_EVENTS = 1000
IMPORT_BUFFER_GAUGE = "funnel_completion_import_buffer_bytes"
CHUNK = 64 * 1024


def documented_bound() -> int:
    found = BOUND.search(DOC)
    assert found, "docs/security.md states no bound on the completion service's memory under imports"
    return int(found.group(1)) * MB


def jsonl_file(events: int) -> bytes:
    lines = [
        f'{{"sequence":"{n}","generation":"1","user_message":{{"text":"{"w" * 1000} {n}"}}}}\n'.encode()
        for n in range(1, events + 1)
    ]
    return b"".join(lines)


class Sampler:
    """The highest RSS of a process, read every 50 ms while it runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_bytes(self.pid))
            await asyncio.sleep(0.05)

    def take_peak(self) -> int:
        peak, self.peak = max(self.peak, rss_bytes(self.pid)), 0
        return peak

    def stop(self) -> None:
        self._task.cancel()


async def stalled(ts, workspace: str, task_id: str, stop: asyncio.Event) -> str:
    async def requests():
        yield transcript_messages.ImportTranscriptRequest(
            target=transcript_messages.ImportTarget(workspace_id=workspace, task_id=task_id)
        )
        yield transcript_messages.ImportTranscriptRequest(jsonl_chunk=STALLED_CHUNK)
        await stop.wait()

    try:
        await ts.ImportTranscript(requests(), timeout=120)
    except grpc.aio.AioRpcError as error:
        if hidden_refusal(error):
            return "IMPORT_BUFFER_EXHAUSTED"
        info = error_info(error)
        return info.reason if info is not None else f"{error.code().name}: {error.details()}"
    return "OK"


def hidden_refusal(error: grpc.aio.AioRpcError) -> bool:
    """A refusal that came while the client was writing its next message reaches it
    as INTERNAL without ErrorInfo (grpc/grpc#36066)."""
    return error.code() == grpc.StatusCode.INTERNAL and error_info(error) is None


async def whole(ts, workspace: str, task_id: str, data: bytes) -> int:
    """Imports `data`, retrying while the buffer is taken, as a client should."""
    deadline = time.monotonic() + 240
    while True:
        try:
            answer = await import_bytes(ts, task_id, data, workspace=workspace, chunk=CHUNK, timeout=120)
            return answer.imported_events
        except grpc.aio.AioRpcError as error:
            info = error_info(error)
            refused = hidden_refusal(error) or (info is not None and info.reason == "IMPORT_BUFFER_EXHAUSTED")
            if not refused or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


async def test_floods_of_stalled_and_admitted_imports_stay_under_the_documented_memory_bound(pair):
    """Each round: a stalled import per caller takes the whole buffer (8 MiB each:
    room for a message and its partial line), then a flood of stalled imports is
    refused, then files are imported (retrying while the buffer is taken) once the
    stalled imports have ended at the idle timeout."""
    bound = documented_bound()
    p = await pair(
        completion_args=["--stream-idle-seconds", "4", "--lifecycle-timeout", "30", "--metrics-listen", "127.0.0.1:0"]
    )
    pid = p.completion.process.process.pid
    # Per caller a connection for its stalled imports and one for its files, so that
    # the files never wait behind the stalled imports' chunks.
    channels = {
        (caller, kind): credentials.tls_channel(
            p.completion.address, credentials.token(caller, [f"{workspace}:host"]), identity=None
        )
        for workspace, caller in CALLERS
        for kind in ("stalled", "whole")
    }
    stubs = {key: transcript_grpc.TranscriptServiceStub(channel) for key, channel in channels.items()}
    data = jsonl_file(FILE_EVENTS)
    held_by_first_wave = len(CALLERS) * (4 * MB + len(STALLED_CHUNK))
    await asyncio.sleep(1.0)  # start-up done: background loops ran once
    baseline = rss_bytes(pid)
    sampler = Sampler(pid)
    report: list[str] = []
    rounds: list[tuple[int, int]] = []
    try:
        for round_ in range(ROUNDS):
            stall_task = f"stall-{round_}"
            for workspace in WORKSPACES:
                await p.lc.RegisterTask(
                    lifecycle_messages.RegisterTaskRequest(workspace_id=workspace, task_id=stall_task), timeout=30
                )
            wholes = []
            for workspace, caller in CALLERS:
                for n in range(WHOLE_PER_CALLER):
                    task_id = f"whole-{round_}-{caller}-{n}"
                    await p.lc.RegisterTask(
                        lifecycle_messages.RegisterTaskRequest(workspace_id=workspace, task_id=task_id), timeout=30
                    )
                    wholes.append((stubs[caller, "whole"], workspace, task_id))
            stop = asyncio.Event()
            first_wave = [
                asyncio.ensure_future(stalled(stubs[caller, "stalled"], workspace, stall_task, stop))
                for workspace, caller in CALLERS
            ]
            await buffer_holds(p.completion.process.metrics_url, held_by_first_wave)
            flood = [
                asyncio.ensure_future(stalled(stubs[caller, "stalled"], workspace, stall_task, stop))
                for workspace, caller in CALLERS
                for _ in range(STALLED_PER_CALLER - 1)
            ]
            refused = await asyncio.gather(*flood)
            imported = await asyncio.gather(*(whole(ts, ws, task, data) for ts, ws, task in wholes))
            ended = await asyncio.gather(*first_wave)
            peak = sampler.take_peak()
            settled = await _settled(pid)
            rounds.append((peak, settled))
            report.append(
                f"round {round_}: peak +{(peak - baseline) / MB:.0f} MB, then +{(settled - baseline) / MB:.0f} MB"
            )
            assert set(ended) == {"STREAM_IDLE"}, ended
            assert set(refused) == {"IMPORT_BUFFER_EXHAUSTED"}, refused
            assert imported == [FILE_EVENTS] * len(wholes)
        assert all(peak - baseline < bound for peak, _ in rounds), "\n".join(report)
        # What the imports held is given back: the rounds leave nothing behind.
        assert rounds[-1][1] - rounds[0][1] < GROWTH_MB * MB, "\n".join(report)
    finally:
        sampler.stop()
        print(f"\ncompletion service idle at {baseline / MB:.0f} MB; bound +{bound / MB:.0f} MB\n" + "\n".join(report))
        for channel in channels.values():
            await channel.close()


async def buffer_holds(metrics_url: str, size: int) -> None:
    """Waits until the imports in flight hold `size` bytes of the import buffer."""
    deadline = time.monotonic() + 60
    while (held := value(await asyncio.to_thread(scrape, metrics_url), IMPORT_BUFFER_GAUGE)) != size:
        assert time.monotonic() < deadline, f"the imports hold {held} bytes of the buffer, not {size}"
        await asyncio.sleep(0.1)


async def _settled(pid: int) -> int:
    """The RSS once it has stopped falling (for 1 s, or after 10 s)."""
    deadline = time.monotonic() + 10
    lowest, since = rss_bytes(pid), time.monotonic()
    while time.monotonic() - since < 1.0 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        if (rss := rss_bytes(pid)) < lowest - MB:
            lowest, since = rss, time.monotonic()
    return min(lowest, rss_bytes(pid))
