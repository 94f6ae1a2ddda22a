"""JSONL interop of transcripts, through gRPC (TranscriptService.Export/Import),
through the CLI functions (funnel_cli.transcripts) and through the `funnel`
command itself: an exact round trip, the one tolerated kind of damage (a torn
final line), loud failures with line numbers that import nothing, and a ~50 MB
file streamed in bounded memory."""

from __future__ import annotations

import asyncio
import io
import json
import re
import sys
import time
from pathlib import Path

import grpc
import pytest

from completion_service.api.jsonl import to_line
from funnel.client.connection import Connection
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.runtime.grpc_errors import error_info
from funnel.runtime.sqlite import CACHE_SIZE
from funnel_cli.transcripts import export_transcript, import_transcript
from tests import credentials
from tests.completion.e2e_support import WS, Code, query, rejected, table_dump
from tests.transcripts.support import P, a_full_turn, append, body, export_bytes, import_bytes, load, load_all

SECOND = 1_000_000
FUNNEL = str(Path(sys.executable).with_name("funnel"))

# The CLI's transfers, as the semantic suites call: plaintext on loopback with the test token.
CONNECTION = Connection(credentials.SUPERUSER, insecure=True)


async def rich_transcript(both, task_id: str) -> bytes:
    """A transcript with everything an export has to carry: unicode and escapes,
    checkpoints, a repaired interrupted turn (synthetic events), a completion and a
    second generation opened by user feedback. Returns its export."""
    f, ts = both.f, both.ts
    await f.register(task_id)
    await f.claim(task_id, agent="agent-1", ttl_seconds=1)
    # Non-ASCII text on purpose (the en dash included): it must round-trip unchanged.
    await append(ts, task_id, [P.user_message('fix "the bug" – ünïcödé ✓\n\ttabs'), P.checkpoint("k1")])  # noqa: RUF001
    await append(ts, task_id, a_full_turn("t1") + [P.checkpoint("k2")])
    await append(
        ts,
        task_id,
        [
            P.turn_start("t2"),
            P.step_start("s1"),
            P.tool_call("c1"),
            P.tool_call("c2"),
            P.tool_result("c2", "boom", is_error=True),
        ],
    )
    f.clock.advance(2 * SECOND)  # agent-1 is gone
    assert (await load(ts, task_id)).repaired
    claim = await f.claim(task_id, agent="agent-2")
    allowed = await f.attempt(claim)
    assert allowed.decision.verdict == completion_enums.VERDICT_ALLOW, allowed.decision
    f.clock.advance(SECOND)
    reopened = await append(
        ts, task_id, [P.feedback("not quite"), P.turn_start("t3"), P.assistant_message("again"), P.turn_end("t3")]
    )
    assert (reopened.resumed, reopened.generation) == (True, 2)
    exported = await export_bytes(ts, task_id)
    assert exported.count(b"\n") == 2 + 8 + 5 + 3 + 4
    return exported


def lines_of(exported: bytes) -> list[bytes]:
    assert exported.endswith(b"\n")
    return exported.split(b"\n")[:-1]


def numbered(events: list[completion_types.SessionEvent], generation: int = 1) -> bytes:
    """JSONL of events as an export writes them (sequence 1..n, record time set)."""
    out = []
    for sequence, event in enumerate(events, start=1):
        event = completion_types.SessionEvent.FromString(event.SerializeToString())
        event.sequence, event.generation = sequence, generation
        event.record_time.FromMicroseconds(1_700_000_000_000_000 + sequence)
        out.append(to_line(event))
    return b"".join(out)


SIMPLE = [P.user_message("hi"), *a_full_turn("t1"), P.checkpoint("k1")]  # 9 events


async def assert_empty(both, task_id: str) -> None:
    """What a user sees of a transcript nothing was imported into; and no staged debris."""
    page = await load(both.ts, task_id)
    assert (list(page.events), page.state_version) == ([], 0)
    assert await export_bytes(both.ts, task_id) == b""
    assert table_dump(both.f.completion_db)["transcript_staging"] == []


def line_of(error: grpc.aio.AioRpcError) -> str:
    return error_info(error).metadata["line"]


# -- round trip -------------------------------------------------------------------------


async def test_export_then_import_into_another_task_then_export_is_byte_identical(both):
    exported = await rich_transcript(both, "src")
    documents = [json.loads(line) for line in lines_of(exported)]
    assert [d["sequence"] for d in documents] == [str(n) for n in range(1, 23)]  # int64 as JSON strings
    assert {d["generation"] for d in documents} == {"1", "2"}
    assert [list(d)[-1] for d in documents if d.get("synthetic")] == ["tool_result", "step_end", "turn_end"]
    assert [d["turn_end"]["reason"] for d in documents if d.get("synthetic") and "turn_end" in d] == [
        "TURN_END_REASON_INTERRUPTED"
    ]

    await both.f.register("copy")
    response = await import_bytes(both.ts, "copy", exported, chunk=13)
    assert (response.imported_events, list(response.warnings)) == (22, [])
    assert response.state_version == 1
    assert await export_bytes(both.ts, "copy") == exported
    assert await load_all(both.ts, "copy") == await load_all(both.ts, "src")


async def test_cli_functions_round_trip_through_files(both, tmp_path):
    exported = await rich_transcript(both, "src")
    first = tmp_path / "src.jsonl"
    with open(first, "wb") as out:
        assert await export_transcript(CONNECTION, both.address, WS, "src", out) == 22
    assert first.read_bytes() == exported

    await both.f.register("copy")
    response = await import_transcript(CONNECTION, both.address, WS, "copy", first)
    assert (response.imported_events, list(response.warnings)) == (22, [])
    again = io.BytesIO()
    assert await export_transcript(CONNECTION, both.address, WS, "copy", again) == 22
    assert again.getvalue() == exported


class Terminal(io.StringIO):
    """Standard error as a terminal: progress is drawn on it."""

    def isatty(self) -> bool:
        return True


async def test_import_draws_a_bar_of_the_bytes_read_and_export_counts_the_events(both, tmp_path):
    exported = await rich_transcript(both, "src")
    path = tmp_path / "src.jsonl"
    path.write_bytes(exported)
    exporting = Terminal()
    with open(tmp_path / "again.jsonl", "wb") as out:
        assert await export_transcript(CONNECTION, both.address, WS, "src", out, progress_to=exporting) == 22
    # The total is not known before the events arrive: a count, no bar.
    assert re.fullmatch(r"(\rexporting src \d+ events \d+\.\d s)+\n", exporting.getvalue())
    assert exporting.getvalue().rsplit("\r", 1)[1].startswith("exporting src 22 events ")

    await both.f.register("copy")
    importing = Terminal()
    response = await import_transcript(CONNECTION, both.address, WS, "copy", path, progress_to=importing)
    assert response.imported_events == 22
    assert importing.getvalue().endswith("\n")
    assert importing.getvalue().rsplit("\r", 1)[1].startswith(f"importing src.jsonl [{'#' * 30}] 100% ")

    # A refused import ends the line where it stopped, without claiming it finished.
    refused = Terminal()
    with pytest.raises(grpc.aio.AioRpcError):
        await import_transcript(CONNECTION, both.address, WS, "copy", path, progress_to=refused)
    assert refused.getvalue().endswith("\n")


async def test_the_funnel_command_exports_imports_and_reports_damage(both, tmp_path):
    await both.f.register("src")
    await append(both.ts, "src", SIMPLE)
    exported = tmp_path / "src.jsonl"

    async def funnel(*argv: str) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            FUNNEL,
            "transcript",
            *argv,
            "--workspace",
            WS,
            "--completion",
            both.address,
            "--insecure",
            "--token",
            credentials.SUPERUSER,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), timeout=30)
        return process.returncode, out.decode(), err.decode()

    assert await funnel("export", "src", "-o", str(exported)) == (0, "", f"exported 9 events to {exported}\n")
    assert exported.read_bytes() == await export_bytes(both.ts, "src")

    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(exported.read_bytes() + b'{"sequence":"10","generation":"1","tur')
    await both.f.register("copy")
    code, out, err = await funnel("import", str(torn), "--task", "copy")
    assert (code, out) == (0, "imported 9 events; state version 1\n")
    assert "warning: line 10 is torn" in err

    damaged = tmp_path / "damaged.jsonl"
    lines = exported.read_bytes().split(b"\n")
    lines[2] = b"{ this is not json"
    damaged.write_bytes(b"\n".join(lines))
    await both.f.register("other")
    code, out, err = await funnel("import", str(damaged), "--task", "other")
    assert (code, out) == (1, "")
    assert err.startswith("funnel transcript import: INVALID_ARGUMENT: line 3: ")
    assert "nothing was imported" in err
    await assert_empty(both, "other")


# -- the torn final line -------------------------------------------------------------------


@pytest.mark.parametrize("cut", [1, 20, -1])
async def test_a_torn_final_line_is_dropped_with_a_warning_and_the_rest_imported(both, cut):
    await both.f.register("copy")
    good = numbered(SIMPLE)
    tenth = to_line(
        completion_types.SessionEvent(sequence=10, generation=1, user_message=completion_types.UserMessage(text="more"))
    )
    torn = tenth[:cut] if cut > 0 else tenth[: cut - 1]  # cut == -1: all but the last brace (and the newline)
    response = await import_bytes(both.ts, "copy", good + torn)
    assert response.imported_events == 9
    assert len(response.warnings) == 1
    assert "line 10" in response.warnings[0] and "torn" in response.warnings[0]
    assert await export_bytes(both.ts, "copy") == good


async def test_a_complete_final_event_without_its_newline_is_imported(both):
    await both.f.register("copy")
    good = numbered(SIMPLE)
    response = await import_bytes(both.ts, "copy", good[:-1])
    assert (response.imported_events, list(response.warnings)) == (9, [])
    assert await export_bytes(both.ts, "copy") == good


async def test_cli_import_reports_the_torn_line_warning(both, tmp_path):
    await both.f.register("copy")
    path = tmp_path / "torn.jsonl"
    path.write_bytes(numbered(SIMPLE) + b'{"sequence":"10","gen\xc3')  # torn inside a UTF-8 sequence too
    response = await import_transcript(CONNECTION, both.address, WS, "copy", path)
    assert response.imported_events == 9
    assert len(response.warnings) == 1
    assert "line 10 is torn" in response.warnings[0]


# -- damage before the final line ------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        b'{"sequence":"3","generation":"1","turn_start":{"turn_i',  # torn, but not at the end
        b"",  # an empty line
        b'{"sequence":"3","generation":"1"}',  # no body
        b'{"sequence":"3","generation":"1","turn_start":{"turn_id":"t1"},"bogus":1}',  # unknown field
        b"[1, 2, 3]",
        b'{"sequence":"7","generation":"1","turn_start":{"turn_id":"t1"}}',  # a gap in the sequence
        b'{"generation":"1","turn_start":{"turn_id":"t1"}}',  # no sequence
        b'{"sequence":"3","generation":"1","turn_end":{"turn_id":"t1"}}',  # turn end without reason
        b'{"sequence":"3","generation":"1","turn_start":{"turn_id":"has space"}}',  # malformed id
    ],
)
async def test_a_damaged_middle_line_fails_with_its_number_and_imports_nothing(both, damage):
    await both.f.register("copy")
    lines = lines_of(numbered(SIMPLE))
    lines[2] = damage
    error = await rejected(
        import_bytes(both.ts, "copy", b"\n".join(lines) + b"\n"),
        Code.INVALID_ARGUMENT,
        "TRANSCRIPT_LINE_INVALID",
        metadata={"line"},
    )
    assert line_of(error) == "3"
    assert "line 3" in error.details()
    await assert_empty(both, "copy")
    # Nothing half-imported blocks a good import afterwards.
    assert (await import_bytes(both.ts, "copy", numbered(SIMPLE))).imported_events == 9


async def test_damage_after_thousands_of_staged_events_still_imports_nothing(both, tmp_path):
    await both.f.register("copy")
    turns = [e for n in range(400) for e in a_full_turn(f"t{n}", f"s{n}", f"c{n}")]  # 2800 events
    lines = lines_of(numbered(turns))
    lines[2500] = b"garbage"
    path = tmp_path / "damaged.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await import_transcript(CONNECTION, both.address, WS, "copy", path)
    assert caught.value.code() == Code.INVALID_ARGUMENT
    assert line_of(caught.value) == "2501"
    await assert_empty(both, "copy")


async def test_a_line_that_breaks_the_grammar_fails_with_its_number_and_rule(both):
    await both.f.register("copy")
    events = [P.user_message("hi"), P.turn_start("t1"), P.step_start("s1"), P.turn_end("t1"), P.step_end("s1")]
    error = await rejected(
        import_bytes(both.ts, "copy", numbered(events)),
        Code.FAILED_PRECONDITION,
        "TRANSCRIPT_GRAMMAR_VIOLATION",
        metadata={"line", "rule"},
    )
    assert dict(error_info(error).metadata) == {"line": "4", "rule": "TURN_END_WITH_OPEN_STEP"}
    await assert_empty(both, "copy")


async def test_a_torn_final_line_does_not_hide_a_grammar_violation_before_it(both):
    await both.f.register("copy")
    events = [P.user_message("hi"), P.tool_result("c9")]
    data = numbered(events) + b'{"sequence":"3"'
    error = await rejected(
        import_bytes(both.ts, "copy", data), Code.FAILED_PRECONDITION, "TRANSCRIPT_GRAMMAR_VIOLATION"
    )
    assert line_of(error) == "2"
    await assert_empty(both, "copy")


# -- empty and foreign files -----------------------------------------------------------------


async def test_an_empty_file_imports_zero_events(both, tmp_path):
    await both.f.register("copy")
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    response = await import_transcript(CONNECTION, both.address, WS, "copy", path)
    assert (response.imported_events, list(response.warnings)) == (0, [])
    assert list((await load(both.ts, "copy")).events) == []
    # An empty import leaves the transcript empty: a real one can follow.
    assert (await import_bytes(both.ts, "copy", numbered(SIMPLE))).imported_events == 9


@pytest.mark.parametrize(
    "content",
    [
        b"# My notes\nThis is a README, not a transcript.\n",
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00",
        b"name,age\nada,36\n",
        b"not json at all",  # a single line without a newline is not a torn event
        b'{"foo": 1}',  # nor is a complete JSON object that is not an event
        b"   \n",
    ],
)
async def test_a_file_that_is_not_json_fails_at_line_1(both, tmp_path, content):
    await both.f.register("copy")
    path = tmp_path / "foreign.txt"
    path.write_bytes(content)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await import_transcript(CONNECTION, both.address, WS, "copy", path)
    assert caught.value.code() == Code.INVALID_ARGUMENT
    assert line_of(caught.value) == "1"
    await assert_empty(both, "copy")


async def test_import_into_a_task_with_a_transcript_is_refused(both):
    await both.f.register("busy")
    await append(both.ts, "busy", [P.user_message("already here")])
    before = await export_bytes(both.ts, "busy")
    await rejected(import_bytes(both.ts, "busy", numbered(SIMPLE)), Code.FAILED_PRECONDITION, "TRANSCRIPT_NOT_EMPTY")
    assert await export_bytes(both.ts, "busy") == before
    assert (await load(both.ts, "busy")).state_version == 1
    assert table_dump(both.f.completion_db)["transcript_staging"] == []


async def test_an_import_refuses_a_transcript_appended_while_it_streamed(both):
    """The emptiness check is repeated when the import commits."""
    await both.f.register("race")
    data = numbered(SIMPLE)
    appended = asyncio.Event()

    async def requests():
        yield transcript_messages.ImportTranscriptRequest(
            target=transcript_messages.ImportTarget(workspace_id=WS, task_id="race")
        )
        yield transcript_messages.ImportTranscriptRequest(jsonl_chunk=data[:50])
        await appended.wait()
        yield transcript_messages.ImportTranscriptRequest(jsonl_chunk=data[50:])

    call = asyncio.ensure_future(both.ts.ImportTranscript(requests(), timeout=10))
    await asyncio.sleep(0.2)
    await append(both.ts, "race", [P.user_message("meanwhile")])
    appended.set()
    await rejected(call, Code.FAILED_PRECONDITION, "TRANSCRIPT_NOT_EMPTY")
    assert [body(e) for e in await load_all(both.ts, "race")] == ["user_message"]
    assert table_dump(both.f.completion_db)["transcript_staging"] == []


# -- a 50 MB file in bounded memory ------------------------------------------------------------

MB = 1024 * 1024
TEXT_BYTES = 6000


def write_big_transcript(path: Path, target_bytes: int) -> int:
    """Writes turns (start, a long assistant message, end) until the file has
    `target_bytes`; streams to disk so the test itself holds no copy. Returns the
    number of events."""
    filler = ("The quick brown fox jumps over the lazy dog; " * (TEXT_BYTES // 45 + 1))[:TEXT_BYTES]
    stamp = '"record_time":"2023-11-14T22:13:20Z"'
    sequence = 0
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        turn = 0
        while written < target_bytes:
            turn += 1
            chunk = (
                f'{{"sequence":"{sequence + 1}","generation":"1",{stamp},"turn_start":{{"turn_id":"t{turn}"}}}}\n'
                f'{{"sequence":"{sequence + 2}","generation":"1",{stamp},'
                f'"assistant_message":{{"text":"{turn} {filler}"}}}}\n'
                f'{{"sequence":"{sequence + 3}","generation":"1",{stamp},'
                f'"turn_end":{{"turn_id":"t{turn}","reason":"TURN_END_REASON_COMPLETED"}}}}\n'
            )
            out.write(chunk)
            written += len(chunk)
            sequence += 3
    return sequence


def peak_rss_kib() -> int:
    return int(re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))


def current_rss_kib() -> int:
    return int(re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))


def reset_peak_rss() -> bool:
    """Linux: writing 5 to clear_refs resets VmHWM to the current RSS."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@pytest.mark.slow
async def test_a_50_mb_file_is_streamed_in_bounded_memory(both, tmp_path, record_property):
    path = tmp_path / "big.jsonl"
    events = write_big_transcript(path, 50 * MB)
    size = path.stat().st_size
    assert size >= 50 * MB
    await both.f.register("big")

    reset = reset_peak_rss()
    baseline = current_rss_kib() if reset else peak_rss_kib()
    started = time.monotonic()
    response = await import_transcript(CONNECTION, both.address, WS, "big", path)
    elapsed = time.monotonic() - started
    growth = (peak_rss_kib() - baseline) * 1024

    record_property("import_seconds", round(elapsed, 2))
    record_property("peak_rss_growth_mb", round(growth / MB, 1))
    print(
        f"\n50 MB import: {size / MB:.1f} MB, {events} events in {elapsed:.1f}s, "
        f"peak RSS growth {growth / MB:.1f} MB (peak reset: {reset})"
    )
    assert (response.imported_events, list(response.warnings)) == (events, [])
    assert response.state_version == 1
    # The writer's SQLite page cache fills up to its fixed budget whatever the file
    # size; on top of it, the import itself must stay far below the file's size.
    page_cache = -CACHE_SIZE * 1024
    assert growth < 25 * MB + page_cache, f"peak RSS grew by {growth / MB:.1f} MB importing a {size / MB:.0f} MB file"

    [(count, last)] = query(
        both.f.completion_db, "SELECT count(*), max(sequence) FROM transcript_events WHERE task_id = 'big'"
    )
    [(staged,)] = query(both.f.completion_db, "SELECT count(*) FROM transcript_staging")
    assert (count, last, staged) == (events, events, 0)
    page = await load(both.ts, "big", page_size=3)
    assert [body(e) for e in page.events] == ["turn_start", "assistant_message", "turn_end"]
    assert page.events[1].assistant_message.text.startswith("1 The quick brown fox")
    assert not page.turn_in_progress and not page.repaired
