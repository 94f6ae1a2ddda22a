"""When a client stream's next message is due (a pure rule; the boundary,
funnel/runtime/boundary.py, enforces it).

A client stream must not be silent for the idle timeout, and must not trickle:
from the end of its first idle timeout on, the bytes it has sent must pay for the
time it has been open at the minimum rate. A stream that sends one byte a second
never falls silent, yet holds its share of the import buffer for nothing; this
rule ends it too, as soon as its bytes no longer cover its age."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Late(enum.Enum):
    IDLE = "idle"
    SLOW = "slow"


@dataclass(frozen=True)
class Pace:
    idle_seconds: float
    # 0: no minimum rate, only the idle timeout.
    min_bytes_per_second: float = 0.0

    def due(self, started: float, received: int, now: float) -> tuple[float, Late]:
        """The time by which the next message must have arrived, and what the
        stream is if it has not."""
        idle_at = now + self.idle_seconds
        if self.min_bytes_per_second <= 0:
            return idle_at, Late.IDLE
        slow_at = started + self.idle_seconds + received / self.min_bytes_per_second
        return (slow_at, Late.SLOW) if slow_at < idle_at else (idle_at, Late.IDLE)
