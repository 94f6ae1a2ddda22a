"""Whatever a caller sends stays one safe line in the services' logs: both
formatters (funnel/runtime/logs.py) escape every character that is not
printable (control, format and bidirectional characters, line separators, …)
wherever it appears, and a JSON line still decodes to the original values."""

from __future__ import annotations

import json
import logging

import pytest

from funnel.runtime import logs

HOSTILE = [
    "t-1\n2026-01-01T00:00:00Z INFO funnel.request: forged line",
    "a\r\nb",
    "nul\x00",
    "del\x7f",
    "nel\x85",
    "csi\x1b[31mred",
    "\u202egnp.exe",
    "\u2066isolate\u2069",
    "zero\u200bwidth",
    "line\u2028separator",
    "para\u2029graph",
    "bom\ufeff",
    "nbsp\u00a0",
    "tag\U000e0041",
    "private\ue000",
    "unassigned\u0378",
    'quote" key=value',
    "back\\slash",
]


def record(message: str, *args: object, exc: BaseException | None = None, **values: object) -> logging.LogRecord:
    made = logging.LogRecord(
        "funnel.request",
        logging.WARNING,
        __file__,
        1,
        message,
        args,
        (type(exc), exc, exc.__traceback__) if exc else None,
    )
    made.__dict__.update(logs.fields(**values))
    return made


def safe(line: str) -> None:
    assert "\n" not in line and "\r" not in line, line
    assert line.isprintable(), ascii(line)


@pytest.mark.parametrize("text", HOSTILE)
def test_a_json_line_is_one_printable_line_that_decodes_to_what_was_logged(text):
    line = logs.JsonFormatter().format(record("denied %s", text, subject=text, task=text))
    safe(line)
    entry = json.loads(line)
    assert (entry["message"], entry["subject"], entry["task"]) == (f"denied {text}", text, text)


def test_a_json_line_holds_an_exception_in_one_line():
    try:
        raise ValueError("bad \u202e\nvalue")
    except ValueError as exc:
        line = logs.JsonFormatter().format(record("fault", exc=exc))
    safe(line)
    assert "bad \u202e\nvalue" in json.loads(line)["exception"]


@pytest.mark.parametrize("text", HOSTILE)
def test_a_text_line_is_one_printable_line(text):
    line = logs.TextFormatter().format(record("denied %s", text, subject=text, task=text))
    safe(line)
    assert line.count(" subject=") == 1 and line.count(" task=") == 1


def test_printable_text_is_written_as_it_is():
    for formatter in (logs.JsonFormatter(), logs.TextFormatter()):
        line = formatter.format(record("claimed t\u00e2che-\u30bf", subject="host@acme", task="t\u00e2che"))
        assert "claimed t\u00e2che-\u30bf" in line and "t\u00e2che" in line.replace("claimed t\u00e2che", "")
        safe(line)
