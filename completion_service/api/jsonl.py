"""JSONL interop for transcripts: one `SessionEvent` per line in the protobuf JSON
mapping (proto field names), and a streaming reader that tolerates exactly one
kind of damage: a torn final line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

from google.protobuf import json_format

from funnel.completion.v1 import types_pb2 as completion_types

MAX_LINE_BYTES = 8 * 1024 * 1024


def to_line(event: completion_types.SessionEvent) -> bytes:
    document = json_format.MessageToDict(event, preserving_proto_field_name=True)
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


class LineDamaged(Exception):
    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line
        self.problem = problem


def parse_line(raw: bytes, line: int) -> completion_types.SessionEvent:
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: deeply nested arrays/objects
        raise LineDamaged(line, f"not a JSON document ({exc})") from None
    if not isinstance(document, dict):
        raise LineDamaged(line, "not a JSON object")
    event = completion_types.SessionEvent()
    try:
        json_format.ParseDict(document, event)
    except json_format.ParseError as exc:
        raise LineDamaged(line, f"not a SessionEvent ({exc})") from None
    return event


def is_torn(raw: bytes) -> bool:
    """Whether an unterminated final line can be an event line cut short by a crash:
    it opens a JSON object that never closes. Anything else on it is damage."""
    if not raw.lstrip().startswith(b"{"):
        return False
    try:
        json.loads(raw.decode("utf-8"))
    except RecursionError:
        return False  # nested deeper than any event: damage, not a torn event line
    except (UnicodeDecodeError, ValueError):
        return True
    return False


@dataclass
class LineSplitter:
    """Takes bytes, gives complete lines with their numbers, one at a time; keeps
    at most one partial line (and the chunk being split) in memory."""

    pending: bytearray = field(default_factory=bytearray)
    line_number: int = 0

    def feed(self, chunk: bytes) -> None:
        self.pending += chunk

    def lines(self) -> Iterator[tuple[int, bytes]]:
        """The complete lines fed so far, each taken out of the buffer as it is given
        (one copy of it, never two); then refuses a partial line grown too long."""
        while (end := self.pending.find(b"\n")) >= 0:
            self.line_number += 1
            with memoryview(self.pending) as view:
                line = bytes(view[:end])
            del self.pending[: end + 1]
            yield self.line_number, line
        if len(self.pending) > MAX_LINE_BYTES:
            raise LineDamaged(self.line_number + 1, f"longer than {MAX_LINE_BYTES} bytes")

    def final(self) -> tuple[int, bytes] | None:
        """The last line if the input did not end with a newline."""
        if not self.pending:
            return None
        self.line_number += 1
        return self.line_number, bytes(self.pending)
