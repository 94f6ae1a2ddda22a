"""A shared byte budget: memory that concurrent work (transcript imports) may
hold together. Reservations never wait: when the budget is taken the work is
refused at once with a clear error, instead of queueing or growing the process."""

from __future__ import annotations


class ByteBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def reserve(self, size: int) -> Reservation | None:
        if self.used + size > self.limit:
            return None
        self.used += size
        return Reservation(self, size)


class Reservation:
    def __init__(self, budget: ByteBudget, size: int) -> None:
        self._budget = budget
        self.size = size

    def grow_to(self, size: int) -> bool:
        """Holds `size` bytes in all (never shrinks); False when the budget lacks the difference."""
        extra = size - self.size
        if extra <= 0:
            return True
        if self._budget.used + extra > self._budget.limit:
            return False
        self._budget.used += extra
        self.size = size
        return True

    def release(self) -> None:
        self._budget.used -= self.size
        self.size = 0
