"""Injected time and identifiers (docs/specification.md §2.7), so tests and simulations are deterministic."""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Protocol


class Clock(Protocol):
    def now_micros(self) -> int:
        """Wall-clock time in microseconds since the Unix epoch (UTC)."""
        ...


class SystemClock:
    def now_micros(self) -> int:
        return time.time_ns() // 1000


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start_micros: int = 1_700_000_000_000_000) -> None:
        self._now = start_micros

    def now_micros(self) -> int:
        return self._now

    def advance(self, micros: int) -> None:
        self._now += micros

    def set(self, micros: int) -> None:
        self._now = micros


class IdSource(Protocol):
    def new_id(self, prefix: str) -> str: ...


class RandomIds:
    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{uuid.uuid4().hex}"


class SequentialIds:
    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._counter):08d}"
