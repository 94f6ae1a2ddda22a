"""Shrinking a failing run to a minimal workload: steps are deleted while the
run, with the same seed (so the same network, faults and chaos streams), still
breaks an invariant. Greedy: halves first, then single steps (ddmin's coarse
end), until no deletion keeps it failing."""

from __future__ import annotations

from collections.abc import Callable


def shrink(steps: frozenset[int], fails: Callable[[frozenset[int]], bool], budget: int = 200) -> frozenset[int]:
    """The smallest subset of `steps` found on which `fails` still holds (at most `budget` runs)."""
    kept = sorted(steps)
    chunk = max(1, len(kept) // 2)
    runs = 0
    while chunk >= 1 and runs < budget:
        removed_any = False
        start = 0
        while start < len(kept) and runs < budget:
            candidate = kept[:start] + kept[start + chunk :]
            runs += 1
            if candidate and fails(frozenset(candidate)):
                kept, removed_any = candidate, True
            else:
                start += chunk
        if not removed_any:
            chunk //= 2
    return frozenset(kept)
