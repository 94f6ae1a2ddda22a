"""Seeded workloads: what hosts and agents do, as plain steps that the actors
(actors.py) carry out against the services, and that shrinking can delete one by
one.

A workload mixes the intents that race in production: hosts register a tree of
tasks (attached and detached children of a root), read them, request and settle
cancellations, settle timeouts, resume finished tasks into a new generation;
agents fight over claims (several agents, short leases, pauses longer than a
lease so that the stall sweeper closes their runs), record passing and failing
evidence (the policy requires a passing `tests` fact, so attempts are allowed or
blocked), attempt completions and failures, close runs every way, and keep
calling with the run they hold after its generation was replaced (stale
callbacks). Any actor may send its last mutation again, with its request id,
long after it was answered."""

from __future__ import annotations

import random
from dataclasses import dataclass

HOST_ACTIONS = ("get", "cancel", "settle_cancel", "timeout", "resume", "replay", "pause")
HOST_WEIGHTS = (3, 2, 1, 1, 4, 1, 4)
AGENT_ACTIONS = (
    "claim",
    "renew",
    "evidence",
    "attempt",
    "attempt_failed",
    "close",
    "close_failed",
    "close_cancelled",
    "replay",
    "pause",
)
AGENT_WEIGHTS = (4, 1, 3, 4, 1, 2, 1, 1, 1, 2)


@dataclass(frozen=True)
class Task:
    name: str
    # (parent task, attached) or None for a top-level task.
    parent: tuple[str, bool] | None


@dataclass(frozen=True)
class Step:
    actor: str
    action: str
    task: str
    # A seeded number the action reads (a pause's length, a verdict).
    arg: int


@dataclass(frozen=True)
class Workload:
    tasks: tuple[Task, ...]
    steps: tuple[Step, ...]

    def keep(self, indexes: frozenset[int]) -> Workload:
        return Workload(self.tasks, tuple(step for n, step in enumerate(self.steps) if n in indexes))

    def of(self, actor: str) -> list[Step]:
        return [step for step in self.steps if step.actor == actor]

    @property
    def actors(self) -> list[str]:
        return sorted({step.actor for step in self.steps})


def generate(rng: random.Random, *, tasks: int = 4, hosts: int = 2, agents: int = 3, steps: int = 100) -> Workload:
    names = [f"t{n}" for n in range(tasks)]
    tree = [Task(names[0], None)]
    for name in names[1:]:
        roll = rng.random()
        tree.append(Task(name, (names[0], roll < 0.5) if roll < 0.75 else None))
    actors = [f"host-{n}" for n in range(hosts)] + [f"agent-{n}" for n in range(agents)]
    # The root is activated before its children register: a child needs an active parent.
    plan = [Step("host-0", "register", tree[0].name, 0), Step("host-0", "activate", tree[0].name, 0)]
    plan += [Step("host-0", "register", task.name, 0) for task in tree[1:]]
    for _ in range(steps):
        actor = rng.choice(actors)
        actions, weights = (HOST_ACTIONS, HOST_WEIGHTS) if actor.startswith("host") else (AGENT_ACTIONS, AGENT_WEIGHTS)
        action = rng.choices(actions, weights)[0]
        plan.append(Step(actor, action, rng.choice(names), rng.randrange(1000)))
    return Workload(tuple(tree), tuple(plan))


def ranges(indexes: frozenset[int]) -> str:
    """Step indexes as `0-3,7,9` (the replay command's --keep)."""
    ordered = sorted(indexes)
    parts: list[str] = []
    start: int | None = None
    previous = -1
    for n in ordered + [None]:
        if start is not None and (n is None or n != previous + 1):
            parts.append(str(start) if start == previous else f"{start}-{previous}")
            start = None
        if n is not None:
            start = n if start is None else start
            previous = n
    return ",".join(parts)


def parse_ranges(text: str) -> frozenset[int]:
    found: set[int] = set()
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return frozenset(found)
