"""What happened in one simulation, in order: every call with its answer, every
crash, restart and injected fault. Its digest is the replay check: the same seed
and workload give the same history, byte for byte."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import text_format
from google.protobuf.message import Message

from funnel.runtime.grpc_errors import status_error_info
from funnel_sim.network import Answer, Ok


@dataclass(frozen=True)
class Call:
    invoked: float
    answered: float
    source: str
    target: str
    method: str
    request: Any
    answer: Answer


@dataclass(frozen=True)
class Note:
    at: float
    kind: str
    node: str
    text: str


class History:
    def __init__(self, now: Callable[[], float]) -> None:
        # Virtual time, read also on a database thread (a crash at a fault point inside
        # a unit of work), which has no running loop of its own.
        self._now = now
        self.calls: list[Call] = []
        self.notes: list[Note] = []
        self._digest = hashlib.sha256()
        self._lines: list[str] | None = None

    def keep_lines(self) -> None:
        """Keep the rendered history too (for printing a failing run)."""
        self._lines = []

    def record(self, kind: str, *fields: Any) -> None:
        now = self._now()
        if kind == "call":
            source, target, method, request, answer, invoked = fields
            call = Call(invoked, now, source, target, method, request, answer)
            self.calls.append(call)
            # The digest reads the messages' deterministic bytes; the text is made only when printed.
            self._digest.update(f"{invoked:.6f}-{now:.6f} {source}->{target} {method} ".encode())
            self._digest.update(request.SerializeToString(deterministic=True))
            self._digest.update(_answer_bytes(answer))
            if self._lines is not None:
                self._lines.append(
                    f"{invoked:.6f}-{now:.6f} {source}->{target} {method} {_message(request)} => {_answer(answer)}"
                )
        else:
            node, text = fields
            self.notes.append(Note(now, kind, node, text))
            self._line(f"{now:.6f} {kind} {node} {text}")

    def _line(self, line: str) -> None:
        self._digest.update(line.encode())
        self._digest.update(b"\n")
        if self._lines is not None:
            self._lines.append(line)

    @property
    def digest(self) -> str:
        return self._digest.hexdigest()

    @property
    def lines(self) -> list[str]:
        return list(self._lines or [])

    def anomalies(self) -> list[Note]:
        return [note for note in self.notes if note.kind == "anomaly"]


def _message(message: Any) -> str:
    return text_format.MessageToString(message, as_one_line=True)


def _answer(answer: Answer) -> str:
    if isinstance(answer, Ok):
        return f"OK {_message(answer.response)}"
    info = status_error_info(answer.status)
    metadata = sorted(info.metadata.items()) if info is not None else []
    return f"{answer.code} {answer.reason} {answer.status.message} {metadata}"


def _answer_bytes(answer: Answer) -> bytes:
    if isinstance(answer, Ok):
        response: Message = answer.response
        return b" OK " + response.SerializeToString(deterministic=True) + b"\n"
    # Not the status's bytes: its ErrorInfo was packed into an Any with its metadata map
    # in hash order, which differs between processes (PYTHONHASHSEED).
    return f" FAILED {_answer(answer)}\n".encode()
