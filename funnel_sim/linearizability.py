"""A small linearizability checker (Wing & Gong's search, with the memo of Lowe's
refinement): is there an order of the operations, each taking effect at one
instant between its invocation and its response, in which a sequential model
gives every answer that was observed?

An operation whose response never came (`returned=None`) may take effect at any
time after its invocation, or never. The model is `step(state, operation)`: the
state after it, or None when the model cannot give that answer from that state.
Plain and generic; checkers.py applies it to each task's lifecycle record."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

S = TypeVar("S", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True)
class Operation(Generic[V]):
    invoked: float
    returned: float | None
    value: V


def linearizable(
    operations: Sequence[Operation[V]], initial: S, step: Callable[[S, V], S | None], budget: int = 200_000
) -> bool | None:
    """True or False; None when the search gave up after `budget` states."""
    ops = sorted(operations, key=lambda op: op.invoked)
    done_mask = sum(1 << n for n, op in enumerate(ops) if op.returned is not None)
    seen: set[tuple[int, S]] = set()
    # Depth-first over (operations linearized so far, model state).
    stack: list[tuple[int, S]] = [(0, initial)]
    while stack:
        taken, state = stack.pop()
        if taken & done_mask == done_mask:
            return True
        if (taken, state) in seen:
            continue
        seen.add((taken, state))
        if len(seen) > budget:
            return None
        # Only an operation invoked before every pending response may go next.
        horizon = min(
            (op.returned for n, op in enumerate(ops) if not taken >> n & 1 and op.returned is not None),
            default=float("inf"),
        )
        for n, op in enumerate(ops):
            if taken >> n & 1 or op.invoked > horizon:
                continue
            after = step(state, op.value)
            if after is not None:
                stack.append((taken | 1 << n, after))
    return False
