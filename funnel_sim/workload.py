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
actor may send its last mutation again, with its request id, long after it was answered.

After those steps, still under chaos, comes the crew's finale: an orchestrator
(`host-crew`) registers a few more tasks in one workspace and a crew of agents,
one per task, works them in parallel, waits for the others' tests to pass (a
rendezvous, as a fan-out's orchestrator waits for its workers) and completes at
nearly the same virtual time. Their settlements meet in the completion
service's line of that workspace: while one settle call is in flight the others
queue and go together in one `SettleCompletions` call (settle_batches.py),
which the random steps, with completions rare and spread out, never make. The
finale is drawn after every other step, from the same stream, so the steps
before it are those of the workload without it."""

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
# The finale's actors (played after every other actor's steps) carry this in their names.
CREW = "crew"
CREW_HOST = f"host-{CREW}"
# A crew member's wait for the others at the rendezvous, at most (one may never come: its
# claim refused, its steps shrunk away), in virtual seconds; well inside a lease.
RENDEZVOUS_SECONDS = 2.0


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

    @property
    def crew_setup(self) -> list[Step]:
        """The crew host's registrations: played before the members start."""
        return [step for step in self.of(CREW_HOST) if step.action == "register"]

    @property
    def rendezvous(self) -> int:
        """How many crew members meet before completing (those with a rendezvous step kept)."""
        return len({step.actor for step in self.steps if step.action == "rendezvous"})


def is_crew(actor: str) -> bool:
    return actor.split("-")[1:2] == [CREW]


def generate(
    rng: random.Random,
    *,
    tasks: int = 4,
    workspaces: int = 2,
    hosts: int = 2,
    agents: int = 3,
    steps: int = 100,
    crew: int = 4,
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
    if crew:
        finale, crew_tasks = _finale(rng, sorted(roots), crew)
        plan += finale
        tree += crew_tasks
    return Workload(tuple(tree), tuple(plan))


def _finale(rng: random.Random, workspaces: list[str], size: int) -> tuple[list[Step], list[Task]]:
    """The crew's steps: `host-crew` registers one top-level task per member in one
    workspace; each member claims its task (which activates it), records passing
    tests, meets the others and attempts its completion a few seeded milliseconds
    after the last one arrived (the rendezvous step's arg): the allowed attempt
    ends its session, so there is nothing more to close. Half the time the host
    meets them too and requests the cancellation of one member's task."""
    workspace = rng.choice(workspaces)
    tasks = [Task(f"{workspace}-crew-{n}", workspace, None) for n in range(size)]
    steps = [Step(CREW_HOST, "register", task.name, 0) for task in tasks]
    if rng.random() < 0.5:
        # Half the time the orchestrator calls one member off as the crew completes: its
        # cancellation races the member's attempt, and its settlement may be refused at
        # the fence in the same call as the others' (each item judged alone).
        called_off = rng.choice(tasks).name
        steps += [
            Step(CREW_HOST, "rendezvous", called_off, rng.randrange(10)),
            Step(CREW_HOST, "cancel", called_off, 0),
        ]
    for n, task in enumerate(tasks):
        member = f"agent-{CREW}-{n}"
        # Evidence's arg passes when not a multiple of 4 (actors.py).
        steps += [
            Step(member, "claim", task.name, 0),
            Step(member, "evidence", task.name, 1),
            Step(member, "rendezvous", task.name, rng.randrange(10)),
            Step(member, "attempt", task.name, 0),
        ]
    return steps, tasks


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
