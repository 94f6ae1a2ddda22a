"""The services' log lines: one JSON object per line for log collectors, or
readable text on a terminal (`--log-format`). Structured values travel with a
record as `extra=fields(name=value, …)`; each line also carries the trace id of
the OpenTelemetry span current where it was logged, if there is one.

Every line is one line of printable text, whatever a caller sent: characters
that are not printable (`str.isprintable`: control, format and bidirectional
characters, line and paragraph separators, spaces other than U+0020,
unassigned and private-use code points) are written as JSON `\\u` escapes. A
JSON line still decodes to the values logged; a text line quotes a message or
value it escaped. (In the text format a traceback follows its line, as in any
Python log.)"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

from opentelemetry import trace

FORMATS = ("json", "text")
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def fields(**values: Any) -> dict[str, Any]:
    """`extra` for a log call: the structured values of the line (None and "" are left out)."""
    return {"fields": {name: value for name, value in values.items() if value is not None and value != ""}}


def trace_id() -> str | None:
    """The current span's trace id in W3C form (32 hex digits), or None outside a trace."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def _escape(ch: str) -> str:
    code = ord(ch)
    if code > 0xFFFF:  # a JSON escape names UTF-16 code units: a surrogate pair
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def one_line(text: str) -> str:
    """`text` with every character that is not printable as a JSON `\\u` escape.
    Inside a JSON string literal the result is the same string."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def _values(record: logging.LogRecord) -> dict[str, Any]:
    values = dict(getattr(record, "fields", {}))
    if "trace_id" not in values:
        current = trace_id()
        if current is not None:
            values["trace_id"] = current
    return values


class JsonFormatter(logging.Formatter):
    """time, level, logger, message, the record's fields, and its exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        entry: dict[str, Any] = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_values(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # JSON escapes control characters itself, not the rest of what one_line does.
        return one_line(json.dumps(entry, ensure_ascii=False, default=str))


class TextFormatter(logging.Formatter):
    """The classic line, followed by the record's fields as key=value."""

    def __init__(self) -> None:
        super().__init__(_TEXT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        if not record.message.isprintable():
            record = logging.makeLogRecord({**record.__dict__, "message": _quoted(record.message)})
        line = super().formatMessage(record)
        values = _values(record)
        if not values:
            return line
        return line + " " + " ".join(f"{name}={_text(value)}" for name, value in values.items())


def _text(value: Any) -> str:
    text = str(value)
    return _quoted(text) if not text or not text.isprintable() or any(c in text for c in ' "=') else text


def _quoted(text: str) -> str:
    return one_line(json.dumps(text, ensure_ascii=False))


def default_format() -> str:
    """JSON unless stderr is a terminal."""
    return "text" if sys.stderr.isatty() else "json"


def configure(level: str, log_format: str) -> None:
    # Neither format shows the caller's source line, thread or process: not looking
    # them up makes each line ~20 % cheaper (the Logging HOWTO's "Optimization";
    # a request's line is the largest single cost of the lifecycle service's calls).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
