"""How the services' lines reach stderr (funnel/runtime/logs.py): the lines of one
turn of the event loop in one write, in order, the urgent ones at once; and the
direct path of the request lines (PreparedLines) writes exactly what `logger.log`
would."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """The handler `configure` installed as the only one, as in a service process, so
    that PreparedLines takes its direct path (pytest adds its own capture handlers
    for a test's body, after the fixtures ran)."""
    saved = logging.root.handlers[:]
    logging.root.handlers[:] = [handler for handler in saved if isinstance(handler, logs.LineHandler)]
    try:
        assert logs._direct is not None and logs._direct.takes(logging.getLogger("funnel.request"))
        yield
    finally:
        logging.root.handlers[:] = saved


async def test_the_lines_of_one_turn_of_the_loop_are_one_write_in_order(stream):
    log = logging.getLogger("funnel.request")
    lines = logs.PreparedLines(log)
    for number in range(5):
        lines.log(logging.INFO, f"line {number}", n=number)
    log.info("a plain record")
    assert stream.writes == []  # written at the end of this turn
    await asyncio.sleep(0)
    assert len(stream.writes) == 1
    assert [entry["message"] for entry in stream.lines()] == [*(f"line {n}" for n in range(5)), "a plain record"]


def request_line(message: str) -> None:
    """A request line, written as a service writes it (PreparedLines' direct path)."""
    with alone():
        logs.PreparedLines(logging.getLogger("funnel.request")).log(logging.INFO, message)


async def test_request_lines_soon_after_a_write_wait_for_the_next_one(stream):
    request_line("first")
    await asyncio.sleep(0)
    assert len(stream.writes) == 1
    for turn in range(3):  # under load: turn after turn, a line or two each
        request_line(f"busy {turn}")
        await asyncio.sleep(0)
    assert len(stream.writes) == 1
    await asyncio.sleep(logs.FLUSH_SECONDS * 2)
    assert len(stream.writes) == 2
    request_line("waits")
    logging.getLogger("funnel").info("a plain record")  # written at the end of its turn, after what waits
    await asyncio.sleep(0)
    assert [entry["message"] for entry in stream.lines()] == [
        "first",
        "busy 0",
        "busy 1",
        "busy 2",
        "waits",
        "a plain record",
    ]
    assert len(stream.writes) == 3


async def test_request_lines_stop_waiting_once_enough_wait(stream, monkeypatch):
    monkeypatch.setattr(logs, "MAX_PENDING", 3)
    request_line("first")
    await asyncio.sleep(0)
    for number in range(3):
        request_line(f"line {number}")
    assert [entry["message"] for entry in stream.lines()] == ["first", "line 0", "line 1", "line 2"]


def test_a_request_line_waiting_on_a_loop_that_ended_is_written_on_the_next_loop(stream):
    async def log_two() -> None:
        request_line("first")
        await asyncio.sleep(0)
        request_line("second")  # waits, and this loop ends before it is written

    async def log_one_more() -> None:
        request_line("third")
        await asyncio.sleep(logs.FLUSH_SECONDS * 2)

    asyncio.run(log_two())
    asyncio.run(log_one_more())
    assert [entry["message"] for entry in stream.lines()] == ["first", "second", "third"]


async def test_a_warning_is_written_at_once_after_what_is_pending(stream):
    log = logging.getLogger("funnel.request")
    logs.PreparedLines(log).log(logging.INFO, "first")
    log.warning("urgent")
    assert [entry["message"] for entry in stream.lines()] == ["first", "urgent"]


def test_a_line_logged_off_the_loop_is_written_at_once(stream):
    logging.getLogger("funnel").info("no loop here")
    assert [entry["message"] for entry in stream.lines()] == ["no loop here"]


def test_the_direct_path_writes_what_logger_log_writes(stream, monkeypatch):
    lines = logs.PreparedLines(logging.getLogger("funnel.request"), event="rpc")
    values = dict(code="OK", reason="", subject="host@acme", task=None, duration_ms=1.25)
    with alone():
        lines.log(logging.WARNING, "GetTask OK", **values)
    monkeypatch.setattr(logs, "_direct", None)  # the same line through logging itself
    lines.log(logging.WARNING, "GetTask OK", **values)
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
        lines = logs.PreparedLines(logging.getLogger("funnel.request"))
        lines.log(logging.WARNING, "denied", reason="ROLE_NOT_PERMITTED")
    assert [(r.getMessage(), r.fields) for r in caplog.records] == [("denied", {"reason": "ROLE_NOT_PERMITTED"})]
    assert [entry["message"] for entry in stream.lines()] == ["denied"]


def test_a_line_below_the_level_is_not_made(stream):
    logs.PreparedLines(logging.getLogger("funnel.request")).log(logging.DEBUG, "quiet")
    assert stream.writes == []


def test_the_time_of_a_line_is_utc_to_the_millisecond():
    formatter = logs.JsonFormatter()
    assert json.loads(formatter.line(1_800_000_000.2345, "INFO", "x", "m", {}, {}))["time"] == (
        "2027-01-15T08:00:00.234Z"
    )
    assert json.loads(formatter.line(1_800_000_001.0, "INFO", "x", "m", {}, {}))["time"] == "2027-01-15T08:00:01.000Z"


# Values a request line carries: text from callers (any character), numbers, none.
field_values = st.one_of(
    st.none(),
    st.text(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.sampled_from(["", "OK", "ws-1", 'quo"te\\', "\u2028\x00\x7f\U0001f600"]),
)
field_names = st.sampled_from(["event", "service", "code", "reason", "detail", "subject", "peer", "task", "n", "ü"])


@settings(max_examples=300, deadline=None)
@given(
    first=st.dictionaries(field_names, field_values, max_size=4),
    rest=st.dictionaries(field_names.map(lambda name: name + "_"), field_values, max_size=8),
    message=st.text(),
    level=st.sampled_from(["INFO", "WARNING", "ERROR"]),
    created=st.floats(min_value=0, max_value=4e9),
)
def test_a_prepared_line_is_the_line_of_the_same_fields(first, rest, message, level, created):
    """Byte for byte what the formatter makes of the record's fields through a dict."""
    formatter = logs.JsonFormatter()
    lines = logs.PreparedLines(logging.getLogger("x"), **first)
    values = {name: value for name, value in {**first, **rest}.items() if value is not None and value != ""}
    assert formatter.prepared_line(created, level, "x", message, lines._fixed, rest) == formatter.line(
        created, level, "x", message, values, {}
    )


def test_a_prepared_line_refuses_a_field_of_the_lines_own():
    with pytest.raises(ValueError, match="message"):
        logs.PreparedLines(logging.getLogger("x"), message="m")
    lines = logs.PreparedLines(logging.getLogger("x"), event="rpc")
    with pytest.raises(ValueError, match="event"):
        lines.log(logging.WARNING, "m", event="other")
