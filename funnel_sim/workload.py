"""Seeded workloads: what hosts and agents do, as plain steps that the actors
(actors.py) carry out against the services, and that shrinking can delete one by
one.

A workload mixes the intents that race in production, in several workspaces at
once: hosts register a tree of tasks in each (attached and detached children of
its root), read them, suspend and activate them, set their work status, request
and settle cancellations, settle timeouts, resume finished tasks into a new
generation, append user feedback to transcripts (which reopens a completed
generation into the next one) and load transcripts page by page (which repairs
an interrupted turn); agents fight over claims (several agents, short leases,
pauses longer than a lease so that the stall sweeper closes their runs), append
turns to the transcript under their lease (whole, interrupted by the user, or
cut off mid-call and continued later), record passing and failing evidence (the
policy requires a passing `tests` fact, so attempts are allowed or blocked),
attempt completions and failures, close runs every way, and keep calling with
the run they hold after its generation was replaced (stale callbacks). Any
actor may send its last mutation again, with its request id, long after it was answered."""

from __future__ import annotations

import random
from dataclasses import dataclass

HOST_ACTIONS = (
    "get",
    "cancel",
    "settle_cancel",
    "timeout",
    "resume",
    "suspend",
    "activate",
    "work_status",
    "feedback",
    "load",
    "replay",
    "pause",
)
HOST_WEIGHTS = (3, 1, 1, 1, 4, 1, 1, 2, 2, 2, 1, 4)
AGENT_ACTIONS = (
    "claim",
    "renew",
    "evidence",
    "attempt",
    "attempt_failed",
    "close",
    "close_failed",
    "close_cancelled",
    "transcript",
    "replay",
    "pause",
)
AGENT_WEIGHTS = (4, 1, 3, 4, 1, 2, 1, 1, 2, 1, 2)


@dataclass(frozen=True)
class Task:
    name: str
    workspace: str
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

    @property
    def workspaces(self) -> list[str]:
        return sorted({task.workspace for task in self.tasks})

    def of(self, actor: str) -> list[Step]:
        return [step for step in self.steps if step.actor == actor]

    @property
    def actors(self) -> list[str]:
        return sorted({step.actor for step in self.steps})


def generate(
    rng: random.Random, *, tasks: int = 4, workspaces: int = 2, hosts: int = 2, agents: int = 3, steps: int = 100
) -> Workload:
    names = [f"t{n}" for n in range(tasks)]
    # Task n in workspace n mod workspaces; the first task of each is its root.
    roots = {f"ws-{n}": names[n] for n in range(min(workspaces, tasks))}
    tree = [Task(root, workspace, None) for workspace, root in roots.items()]
    for n, name in enumerate(names[len(roots) :], start=len(roots)):
        workspace = f"ws-{n % len(roots)}"
        roll = rng.random()
        tree.append(Task(name, workspace, (roots[workspace], roll < 0.5) if roll < 0.75 else None))
    actors = [f"host-{n}" for n in range(hosts)] + [f"agent-{n}" for n in range(agents)]
    # The roots are activated before the children register: a child needs an active parent.
    plan = [Step("host-0", action, task.name, 0) for task in tree for action in ("register", "activate")]
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
