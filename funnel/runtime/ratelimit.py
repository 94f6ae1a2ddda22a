"""Per-caller request rate limits: one token bucket per caller subject."""

from __future__ import annotations

import time
from collections.abc import Callable

# Buckets of callers that went quiet are dropped once this many exist; a full
# bucket carries no state worth keeping.
_PRUNE_ABOVE = 10_000


class RateLimiter:
    """`rate` requests per second on average, bursts of up to `burst`."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("the rate must be positive and the burst at least 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, key: str) -> float | None:
        """Takes one token for `key`: None when the request may proceed, else the
        seconds until a token is available (for RetryInfo)."""
        now = self._clock()
        tokens, stamp = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - stamp) * self.rate)
        if tokens < 1:
            self._buckets[key] = (tokens, now)
            return (1 - tokens) / self.rate
        if len(self._buckets) > _PRUNE_ABOVE:
            self._prune(now)
        self._buckets[key] = (tokens - 1, now)
        return None

    def _prune(self, now: float) -> None:
        full = [k for k, (tokens, stamp) in self._buckets.items() if tokens + (now - stamp) * self.rate >= self.burst]
        for key in full:
            del self._buckets[key]
