"""A shared byte budget: memory that concurrent work (transcript imports) may
hold together, with a share per caller and per workspace so that one caller (or
one tenant) cannot hold all of it. Reservations never wait: when a scope's
bytes are taken the work is refused at once with a clear error, instead of
queueing or growing the process."""

from __future__ import annotations

import collections
from dataclasses import dataclass

GLOBAL = "global"
PER_CALLER = "per_caller"
PER_WORKSPACE = "per_workspace"


@dataclass(frozen=True)
class Shortfall:
    """Which scope lacked the bytes, and its limit."""

    scope: str
    limit: int


class ByteBudget:
    def __init__(self, limit: int, per_caller: int | None = None, per_workspace: int | None = None) -> None:
        self.limit = limit
        self.per_caller = limit if per_caller is None else per_caller
        self.per_workspace = limit if per_workspace is None else per_workspace
        self.used = 0
        self._by_caller: collections.Counter[str] = collections.Counter()
        self._by_workspace: collections.Counter[str] = collections.Counter()

    def reserve(self, size: int, caller: str, workspace: str) -> Reservation | Shortfall:
        reservation = Reservation(self, caller, workspace)
        shortfall = reservation.hold(size)
        return reservation if shortfall is None else shortfall

    def _shortfall(self, extra: int, caller: str, workspace: str) -> Shortfall | None:
        if self._by_caller[caller] + extra > self.per_caller:
            return Shortfall(PER_CALLER, self.per_caller)
        if self._by_workspace[workspace] + extra > self.per_workspace:
            return Shortfall(PER_WORKSPACE, self.per_workspace)
        if self.used + extra > self.limit:
            return Shortfall(GLOBAL, self.limit)
        return None

    def _add(self, extra: int, caller: str, workspace: str) -> None:
        self.used += extra
        for counter, key in ((self._by_caller, caller), (self._by_workspace, workspace)):
            counter[key] += extra
            if not counter[key]:
                del counter[key]


class Reservation:
    """Bytes one piece of work holds, in its caller's and workspace's shares."""

    def __init__(self, budget: ByteBudget, caller: str, workspace: str) -> None:
        self._budget = budget
        self._caller = caller
        self._workspace = workspace
        self.size = 0

    def hold(self, size: int) -> Shortfall | None:
        """Holds exactly `size` bytes in all: less always succeeds; more only when
        every scope has the difference (else the Shortfall, and nothing changes)."""
        extra = size - self.size
        if extra > 0:
            shortfall = self._budget._shortfall(extra, self._caller, self._workspace)
            if shortfall is not None:
                return shortfall
        self._budget._add(extra, self._caller, self._workspace)
        self.size = size
        return None

    def release(self) -> None:
        self.hold(0)
