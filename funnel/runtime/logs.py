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

import asyncio
import atexit
import contextlib
import datetime
import fcntl
import json
import logging
import os
import re
import sys
import threading
import time
from typing import Any, TextIO

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


# One encoder for every line: json.dumps with arguments of its own builds a new
# encoder per call, a sizeable share of a request line's cost.
_JSON = json.JSONEncoder(ensure_ascii=False, default=str)


class JsonFormatter(logging.Formatter):
    """time, level, logger, message, the record's fields, and its exception if any."""

    def __init__(self) -> None:
        super().__init__()
        # The time of the last line, to the second, as text: lines come many a second.
        self._second = -1
        self._second_text = ""

    def format(self, record: logging.LogRecord) -> str:
        extra: dict[str, Any] = {}
        if record.exc_info:
            extra["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            extra["stack"] = self.formatStack(record.stack_info)
        return self.line(
            record.created, record.levelname, record.name, record.getMessage(), getattr(record, "fields", {}), extra
        )

    def line(
        self, created: float, level: str, logger: str, message: str, values: dict[str, Any], extra: dict[str, Any]
    ) -> str:
        """The line of a record made at `created` (time.time()) with these fields."""
        entry: dict[str, Any] = {"time": self._time(created), "level": level, "logger": logger, "message": message}
        entry.update(values)
        if "trace_id" not in entry:
            current = trace_id()
            if current is not None:
                entry["trace_id"] = current
        entry.update(extra)
        # JSON escapes control characters itself, not the rest of what one_line does.
        return one_line(_JSON.encode(entry))

    def _time(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            moment = datetime.datetime.fromtimestamp(second, datetime.UTC)
            self._second, self._second_text = second, moment.strftime("%Y-%m-%dT%H:%M:%S")
        return f"{self._second_text}.{int((created - second) * 1000):03d}Z"


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


class LineHandler(logging.StreamHandler[TextIO]):
    """Writes each line to the stream (stderr), the lines of one turn of the event
    loop together: a line logged on the loop's thread is formatted at once and
    written with the others of that turn by a callback at its end. Each write is a
    system call that lets go of the GIL, which the service's other threads then
    take under load; one write per turn instead of one per line is most of what a
    request's line can save. A line of WARNING or above, one logged off the loop,
    and a flush (logging.shutdown at exit) write at once, after whatever is
    pending: lines stay in order."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._pending: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # noqa: BLE001 - logging's own rule: a bad record must not break its caller
            self.handleError(record)
            return
        self.emit_line(line, record.levelno)

    def emit_line(self, line: str, level: int) -> None:
        self._pending.append(line + self.terminator)
        if level < logging.WARNING:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                pass
            else:
                if len(self._pending) == 1:
                    loop.call_soon(self.flush)
                return
        self.flush()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            pending, self._pending = self._pending, []
            try:
                if pending:
                    self.stream.write("".join(pending))
                super().flush()
            except (OSError, ValueError):  # a closed or broken stream
                if pending:  # reported as StreamHandler.emit would; flushing nothing into it is no loss
                    self.handleError(logging.makeLogRecord({"msg": f"{len(pending)} log lines not written"}))


class _Direct:
    """A structured line written straight to the handler `configure` installed:
    the line `logger.log` would write, without making the record, walking up the
    loggers and locking the handler around it. Taken only while that handler is
    the only one the record would reach and nothing filters it on the way (a test
    that captures logs adds a handler: then `logger.log` it is)."""

    def __init__(self, handler: LineHandler, formatter: JsonFormatter) -> None:
        self._handler = handler
        self._formatter = formatter

    def takes(self, logger: logging.Logger) -> bool:
        handler = self._handler
        if handler.filters or handler.level > logging.NOTSET:
            return False
        node: logging.Logger | None = logger
        while node is not None:
            if node.filters or (node.handlers and node.handlers != [handler]):
                return False
            if node.handlers:
                return True
            if not node.propagate:
                return False
            node = node.parent
        return False

    def write(self, level: int, logger: logging.Logger, message: str, values: dict[str, Any]) -> None:
        line = self._formatter.line(time.time(), logging.getLevelName(level), logger.name, message, values, {})
        self._handler.emit_line(line, level)


_direct: _Direct | None = None


def log(logger: logging.Logger, level: int, message: str, **values: Any) -> None:
    """`logger.log(level, message, extra=fields(**values))`, in fewer steps where the
    line goes to the JSON handler of `configure` alone (the request lines, one per
    RPC, are the largest share of what the server boundary costs)."""
    if not logger.isEnabledFor(level):
        return
    structured = {name: value for name, value in values.items() if value is not None and value != ""}
    direct = _direct
    if direct is not None and direct.takes(logger):
        direct.write(level, logger, message, structured)
    else:
        logger.log(level, message, extra={"fields": structured})


def configure(level: str, log_format: str) -> None:
    global _direct
    # Neither format shows the caller's source line, thread or process: not looking
    # them up makes each line ~20 % cheaper (the Logging HOWTO's "Optimization";
    # a request's line is the largest single cost of the lifecycle service's calls).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = LineHandler(sys.stderr)
    formatter = JsonFormatter() if log_format == "json" else TextFormatter()
    handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    _direct = _Direct(handler, formatter) if isinstance(formatter, JsonFormatter) else None


# -- what the gRPC core writes -------------------------------------------------
#
# gRPC's C core logs through absl straight to file descriptor 2, past Python's
# logging, in absl's own format: `I1202 00:07:26.678545   20824 file.cc:2563] text`.
# In JSON mode that descriptor becomes a pipe whose lines a thread turns into
# records of the logger `grpc.core` (level from the letter; `source`, the core's
# file and line; `native_thread`), written by the same handler as every other
# line. Python's own writes to sys.stderr (the handler, tracebacks, warnings) go
# to the original stream directly.
#
# The pipe's write end does not block (a core thread must never wait on Python):
# with the pipe full (1 MiB) the core's line is dropped, not the call. A line the
# core writes just before the process aborts (absl's FATAL) may be lost with it.

NATIVE_LOGGER = "grpc.core"
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+(\d+) ([^\]\s]+)\] ?(.*)$")
_ABSL_LEVELS = {"I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}
_F_SETPIPE_SZ = 1031  # Linux's fcntl.F_SETPIPE_SZ (Python 3.10+ names it; not every platform has it)
_PIPE_BYTES = 1 << 20
_captured = False


def native_record(line: str) -> tuple[int, str, dict[str, Any]]:
    """The level, message and fields of one line the gRPC core wrote: absl's
    format parsed; any other line (another native library's) as a WARNING."""
    match = _ABSL_LINE.match(line)
    if match is None:
        return logging.WARNING, line, {"source": "stderr"}
    letter, thread, source, message = match.groups()
    return _ABSL_LEVELS[letter], message, {"source": source, "native_thread": int(thread)}


def capture_native_stderr() -> None:
    """Sends what native code writes to file descriptor 2 (the gRPC core) through
    the logging handlers (`configure` after this, so that its handler writes to
    the original stream). Once per process; Linux and macOS."""
    global _captured
    if _captured:
        return
    _captured = True
    sys.stderr.flush()
    original = os.dup(2)
    read, write = os.pipe()
    with contextlib.suppress(OSError):  # the default size (64 KiB) then
        fcntl.fcntl(write, getattr(fcntl, "F_SETPIPE_SZ", _F_SETPIPE_SZ), _PIPE_BYTES)
    os.set_blocking(write, False)
    os.dup2(write, 2)
    os.close(write)
    # Open for the rest of the process, as sys.stderr is.
    sys.stderr = open(original, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)  # noqa: SIM115
    relay = threading.Thread(target=_relay, args=(read,), name="native-stderr", daemon=True)
    relay.start()

    def drain() -> None:
        # The pipe's last write end closes: the relay reads what is left, then ends.
        os.dup2(original, 2)
        relay.join(timeout=1.0)

    atexit.register(drain)


def _relay(read: int) -> None:
    logger = logging.getLogger(NATIVE_LOGGER)
    with open(read, "rb") as pipe:
        for raw in pipe:
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if not line.strip():
                continue
            level, message, values = native_record(line)
            with contextlib.suppress(Exception):  # the relay must outlive one bad line
                logger.log(level, message, extra={"fields": values})
