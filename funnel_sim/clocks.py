"""The services' clocks and id sources in the simulation: wall clocks read off
the loop's virtual time, each service's with its own fixed skew (clocks of two
services are never equal; the lifecycle's fence allows for up to
`max_clock_offset` between them), and ids unique across restarts."""

from __future__ import annotations

import asyncio
import itertools

# 2023-11-14T22:13:20Z: virtual time 0 on every service's wall clock, before skew.
EPOCH_MICROS = 1_700_000_000_000_000


def virtual_micros() -> int:
    """The loop's virtual time in whole microseconds."""
    return round(asyncio.get_running_loop().time() * 1_000_000)


class SimClock:
    def __init__(self, skew_micros: int = 0) -> None:
        self.skew_micros = skew_micros

    def now_micros(self) -> int:
        return EPOCH_MICROS + virtual_micros() + self.skew_micros

    def true_micros(self, reading: int) -> int:
        """The virtual time at which this clock read `reading`."""
        return reading - EPOCH_MICROS - self.skew_micros


class SimIds:
    """Sequential ids, prefixed by the incarnation that made them: a restarted
    process must never hand out an id its predecessor did (real ones are random)."""

    def __init__(self, incarnation: int) -> None:
        self._incarnation = incarnation
        self._counter = itertools.count(1)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{self._incarnation}x{next(self._counter):06d}"
