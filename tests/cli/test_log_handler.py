"""How the services' lines reach stderr (funnel/runtime/logs.py): the lines of one
turn of the event loop in one write, in order, the urgent ones at once; and the
direct path of the request lines writes exactly what `logger.log` would."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from funnel.runtime import logs


class Stream:
    """A stream that keeps each write apart."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> None:
        self.writes.append(text)

    def flush(self) -> None:
        pass

    def lines(self) -> list[dict]:
        return [json.loads(line) for line in "".join(self.writes).splitlines()]


@pytest.fixture
def stream(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stream]:
    """The process's logging as `configure` sets it up, onto a Stream."""
    captured = Stream()
    monkeypatch.setattr(sys, "stderr", captured)
    saved = logging.root.handlers[:], logging.root.level
    logs.configure("INFO", "json")
    yield captured
    logging.root.handlers[:], logging.root.level = saved
    monkeypatch.setattr(logs, "_direct", None)


async def test_the_lines_of_one_turn_of_the_loop_are_one_write_in_order(stream):
    log = logging.getLogger("funnel.request")
    for number in range(5):
        logs.log(log, logging.INFO, f"line {number}", n=number)
    log.info("a plain record")
    assert stream.writes == []  # written at the end of this turn
    await asyncio.sleep(0)
    assert len(stream.writes) == 1
    assert [entry["message"] for entry in stream.lines()] == [*(f"line {n}" for n in range(5)), "a plain record"]


async def test_a_warning_is_written_at_once_after_what_is_pending(stream):
    log = logging.getLogger("funnel.request")
    logs.log(log, logging.INFO, "first")
    log.warning("urgent")
    assert [entry["message"] for entry in stream.lines()] == ["first", "urgent"]


def test_a_line_logged_off_the_loop_is_written_at_once(stream):
    logging.getLogger("funnel").info("no loop here")
    assert [entry["message"] for entry in stream.lines()] == ["no loop here"]


def test_the_direct_path_writes_what_logger_log_writes(stream, monkeypatch):
    log = logging.getLogger("funnel.request")
    values = dict(event="rpc", code="OK", reason="", subject="host@acme", task=None, duration_ms=1.25)
    logs.log(log, logging.WARNING, "GetTask OK", **values)
    monkeypatch.setattr(logs, "_direct", None)  # the same line through logging itself
    logs.log(log, logging.WARNING, "GetTask OK", **values)
    direct, logged = stream.lines()
    assert direct.pop("time")[:16] == logged.pop("time")[:16]
    assert (
        direct
        == logged
        == {
            "level": "WARNING",
            "logger": "funnel.request",
            "message": "GetTask OK",
            "event": "rpc",
            "code": "OK",
            "subject": "host@acme",
            "duration_ms": 1.25,
        }
    )


def test_a_handler_added_later_sees_the_lines_the_direct_path_would_write(stream, caplog):
    with caplog.at_level(logging.INFO, logger="funnel.request"):
        logs.log(logging.getLogger("funnel.request"), logging.WARNING, "denied", reason="ROLE_NOT_PERMITTED")
    assert [(r.getMessage(), r.fields) for r in caplog.records] == [("denied", {"reason": "ROLE_NOT_PERMITTED"})]
    assert [entry["message"] for entry in stream.lines()] == ["denied"]


def test_a_line_below_the_level_is_not_made(stream):
    logs.log(logging.getLogger("funnel.request"), logging.DEBUG, "quiet")
    assert stream.writes == []


def test_the_time_of_a_line_is_utc_to_the_millisecond():
    formatter = logs.JsonFormatter()
    assert json.loads(formatter.line(1_800_000_000.2345, "INFO", "x", "m", {}, {}))["time"] == (
        "2027-01-15T08:00:00.234Z"
    )
    assert json.loads(formatter.line(1_800_000_001.0, "INFO", "x", "m", {}, {}))["time"] == "2027-01-15T08:00:01.000Z"
