"""How the operator commands print: aligned tables for people, JSON for scripts
(`-o json`: protobuf's JSON mapping with the proto field names, one document per
command, or one line per event for streams), and a progress bar on standard
error for long work when it is a terminal."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

Column = tuple[str, Callable[[Any], object]]


def as_json(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def print_json(value: object, out: TextIO = sys.stdout) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False), file=out)


def print_json_line(value: object, out: TextIO = sys.stdout) -> None:
    print(json.dumps(value, ensure_ascii=False, separators=(",", ":")), file=out, flush=True)


def when(timestamp: Timestamp) -> str:
    """A timestamp for people: RFC 3339 to the second, `-` when unset."""
    if not timestamp.seconds and not timestamp.nanos:
        return "-"
    return timestamp.ToJsonString()[:19] + "Z"


def enum_word(name: str, prefix: str) -> str:
    rest = name.removeprefix(prefix)
    return "-" if rest == "UNSPECIFIED" else rest


def print_table(rows: Sequence[Any], columns: Sequence[Column], out: TextIO = sys.stdout) -> None:
    cells = [[str(get(row)) if get(row) not in ("", None) else "-" for _, get in columns] for row in rows]
    headers = [name for name, _ in columns]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    print("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(), file=out)
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def print_fields(pairs: Sequence[tuple[str, object]], out: TextIO = sys.stdout) -> None:
    width = max(len(name) for name, _ in pairs)
    for name, value in pairs:
        print(f"{name.ljust(width)}  {value if value not in ('', None) else '-'}", file=out)


class Progress:
    """`label [#####.....] 42% 1.2 s`, or `label 1234 events 1.2 s` when the total
    is not known (None), redrawn on standard error (`out`) at most ten times a
    second; silent when it is not a terminal (scripts, logs)."""

    def __init__(self, label: str, total: int | None, out: TextIO | None = None, unit: str = "") -> None:
        self.label = label
        self.total = None if total is None else max(total, 1)
        self.unit = unit
        self.out = sys.stderr if out is None else out
        self.enabled = self.out.isatty()
        self.started = time.monotonic()
        self.done = 0
        self._drawn = 0.0

    def update(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if not self.enabled or (now - self._drawn < 0.1 and (self.total is None or done < self.total)):
            return
        self._draw(now)

    def finish(self) -> None:
        """Shows the work as done and ends the line."""
        if self.total is not None:
            self.done = self.total
        self.stop()

    def stop(self) -> None:
        """Ends the line where the work stands (after a failure: where it stopped)."""
        if self.enabled:
            self._draw(time.monotonic())
            print(file=self.out, flush=True)

    def _draw(self, now: float) -> None:
        self._drawn = now
        elapsed = f"{now - self.started:.1f} s"
        if self.total is None:
            line = f"{self.label} {self.done}{f' {self.unit}' if self.unit else ''} {elapsed}"
        else:
            share = min(self.done / self.total, 1.0)
            line = f"{self.label} [{('#' * int(share * 30)).ljust(30, '.')}] {share:4.0%} {elapsed}"
        print(f"\r{line}", end="", file=self.out, flush=True)
