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
import math
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
# A string as that encoder writes it (ensure_ascii=False).
_string = json.encoder.encode_basestring
# The fields every line has, before the record's own.
_OWN = frozenset({"time", "level", "logger", "message", "trace_id"})


def _json_value(value: Any) -> str:
    """`value` as `_JSON` writes it inside an object."""
    kind = type(value)
    if kind is str:
        return _string(value)
    if kind is int or (kind is float and math.isfinite(value)):
        return repr(value)
    return _JSON.encode(value)


def _json_fields(values: dict[str, Any]) -> str:
    """The `, "name": value` pairs of `values` as `_JSON` writes them inside an
    object, None and "" left out."""
    return "".join(
        f", {_string(name)}: {_json_value(value)}"
        for name, value in values.items()
        if value is not None and value != ""
    )


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

    def prepared_line(
        self, created: float, level: str, logger: str, message: str, fixed: str, values: dict[str, Any]
    ) -> str:
        """What `line` makes of the fields `{**first, **values}` with no `extra`,
        where `fixed` is `_json_fields(first)` (PreparedLines): the pairs written
        out, not encoded through a dict. Names must not repeat the line's own
        (time, level, logger, message, trace_id) nor one another."""
        line = (
            f'{{"time": {_string(self._time(created))}, "level": {_string(level)}, "logger": {_string(logger)}, '
            f'"message": {_string(message)}{fixed}{_json_fields(values)}'
        )
        current = trace_id()
        if current is not None:
            line += f', "trace_id": "{current}"'
        return one_line(line + "}")

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


# Request lines (PreparedLines) are written at most this often by the event
# loop's thread, all those waiting together (LineHandler); at most this many wait.
FLUSH_SECONDS = 0.05
MAX_PENDING = 1024


class LineHandler(logging.StreamHandler[TextIO]):
    """Writes the lines to the stream (stderr), several in one write where it can.
    A line logged on the event loop's thread below WARNING is formatted at once
    and written at the end of that turn of the loop with every other line
    waiting; a request line (PreparedLines), when the last write was less than
    FLUSH_SECONDS ago, waits for the first write after that (or until
    MAX_PENDING wait). Each write is a system call that lets go of the GIL, which
    the service's other threads then take under load: at 16 requests in flight,
    one write per turn (one or two request lines) cost a call 0.03-0.05 ms of
    CPU (bench/boundary.py), one every 50 ms almost nothing. A line of WARNING or
    above, one logged off the loop, and a flush (logging.shutdown at exit) write
    at once, after whatever is waiting: lines stay in order. A process killed
    outright loses at most the last FLUSH_SECONDS of its request lines."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        self._written = -math.inf  # time.monotonic() of the last write
        # The loop on which a write is due at the end of this turn, and the loop
        # on which one is due within FLUSH_SECONDS (a loop may close before).
        self._soon: asyncio.AbstractEventLoop | None = None
        self._later: asyncio.AbstractEventLoop | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # noqa: BLE001 - logging's own rule: a bad record must not break its caller
            self.handleError(record)
            return
        self.emit_line(line, record.levelno)

    def emit_line(self, line: str, level: int, may_wait: bool = False) -> None:
        """`may_wait`: a request line, which may wait FLUSH_SECONDS for a write."""
        with self.lock:  # type: ignore[union-attr]
            self._pending.append(line + self.terminator)
            waiting = len(self._pending)
        if level < logging.WARNING and waiting < MAX_PENDING:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                pass
            else:
                wait = self._written + FLUSH_SECONDS - time.monotonic() if may_wait else 0.0
                if wait <= 0:
                    if self._soon is not loop:
                        self._soon = loop
                        loop.call_soon(self._flush_soon)
                elif self._later is not loop and self._soon is not loop:
                    self._later = loop
                    loop.call_later(wait, self._flush_later)
                return
        self.flush()

    def _flush_soon(self) -> None:
        self._soon = None
        self.flush()

    def _flush_later(self) -> None:
        self._later = None
        self.flush()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            pending, self._pending = self._pending, []
            try:
                if pending:
                    self._written = time.monotonic()
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

    def write_prepared(
        self, level: int, logger: logging.Logger, message: str, fixed: str, values: dict[str, Any]
    ) -> None:
        line = self._formatter.prepared_line(
            time.time(), logging.getLevelName(level), logger.name, message, fixed, values
        )
        self._handler.emit_line(line, level, may_wait=True)


_direct: _Direct | None = None


class PreparedLines:
    """The lines of one logger that begin with the same fields (a method's
    request lines: event, service, method). `log(level, message, **values)`
    writes the line `log(logger, level, message, **first, **values)` would, with
    the first fields encoded once, when the lines are made, and the others
    written out without a dict between (one request line per RPC: the largest
    share of what the server boundary adds to a call)."""

    def __init__(self, logger: logging.Logger, **first: Any) -> None:
        taken = _OWN.intersection(first)
        if taken:
            raise ValueError(f"fields {sorted(taken)} are every line's own")
        self._logger = logger
        self._first = {name: value for name, value in first.items() if value is not None and value != ""}
        self._fixed = _json_fields(self._first)
        self._taken = _OWN | frozenset(first)

    def log(self, level: int, message: str, **values: Any) -> None:
        logger = self._logger
        if not logger.isEnabledFor(level):
            return
        if not self._taken.isdisjoint(values):
            raise ValueError(f"fields {sorted(self._taken.intersection(values))} are the line's own or its first")
        direct = _direct
        if direct is not None and direct.takes(logger):
            direct.write_prepared(level, logger, message, self._fixed, values)
        else:
            logger.log(level, message, extra=fields(**self._first, **values))


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
