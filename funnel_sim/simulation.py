"""One simulation: a seed (and optionally which steps of its workload to keep)
in, a history and the invariants it broke out.

The seed feeds four independent random streams (the workload, the network, the
faults, the chaos schedule), so a shrunk workload keeps the rest of its world.
The run plays the workload against both services under chaos (crashes at fault
points and at random moments, restarts, partitions, storage errors, lossy
links), then calms everything, lets the outbox, the propagations and the
watchers drain in virtual time, and hands the durable state and the history to
the checkers."""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
from dataclasses import dataclass, field
from typing import Any, Literal

from completion_service.core.gates import WorkspacePolicy
from completion_service.policy import PolicyBook
from funnel.auth.principal import Role
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel_sim import loop, threads
from funnel_sim.actors import Agent, Host, Rendezvous, Watcher
from funnel_sim.checkers import EVERYTHING, Evidence, check
from funnel_sim.clocks import SimClock
from funnel_sim.history import History
from funnel_sim.network import LinkFaults, Network
from funnel_sim.nodes import (
    Chaos,
    CompletionNode,
    LifecycleNode,
    Storage,
    adopting_task_factory,
    memory_storages,
    sqlite_storages,
)
from funnel_sim.workload import CREW_HOST, RENDEZVOUS_SECONDS, Step, Workload, generate, is_crew
from lifecycle_service.core.model import Policy
from lifecycle_service.storage.port import TaskQuery

MAX_CLOCK_OFFSET_MICROS = 500_000
# Virtual seconds, at most, the calmed world gets to settle everything that is owed.
DRAIN_SECONDS = 120.0
# The drain ends sooner once nothing has changed for this long: twice the longest wait of
# any of the services' loops (the settlement outbox's backoff, at most 10 s; leases 4 s),
# so anything still owed was tried again, to no effect, within it. Looked at this often.
QUIET_SECONDS = 20.0
QUIET_LOOK = 5.0
Engine = Literal["memory", "sqlite"]
ENGINES: tuple[Engine, ...] = ("memory", "sqlite")


def engine_of(seed: int) -> Engine:
    """The engine a seed runs on when both are run ("mixed"): drawn from the seed."""
    return random.Random(f"{seed}:engine").choice(ENGINES)


@dataclass(frozen=True)
class Config:
    tasks: int = 4
    workspaces: int = 2
    hosts: int = 2
    agents: int = 3
    steps: int = 100
    # Agents of the finale, completing together in one workspace (0: no finale).
    crew: int = 4
    # Per fault-point hit: the node crashes / the reply is dropped.
    crash_at_point: float = 0.03
    drop_at_point: float = 0.03
    # Per write handed to a store with a writer of its own (SQLite): a crash with it queued.
    crash_at_handover: float = 0.005
    # Per statement of a unit of work or read.
    storage_error: float = 0.002
    # Per write: another process takes the write lock (for up to nodes.LOCK_HELD seconds).
    locked: float = 0.001
    # Per message.
    message_loss: float = 0.02
    duplicate: float = 0.03
    latency: tuple[float, float] = (0.001, 0.05)
    # Seconds, at most, of each trip to and from a database.
    storage_latency: float = 0.005
    stream_lifetime: float = 20.0
    # Mean virtual seconds between chaos actions (a crash, a partition).
    chaos_interval: float = 6.0
    watch_buffer: int = 8


@dataclass
class Result:
    seed: int
    workload: Workload
    violations: list[str]
    history: History
    operations: int
    virtual_seconds: float
    engine: Engine = "memory"
    digest: str = ""
    figures: dict[str, int] = field(default_factory=dict)


def simulate(
    seed: int,
    config: Config = Config(),
    keep: frozenset[int] | None = None,
    keep_lines: bool = False,
    engine: Engine = "memory",
) -> Result:
    workload = generate(
        random.Random(f"{seed}:workload"),
        tasks=config.tasks,
        workspaces=config.workspaces,
        hosts=config.hosts,
        agents=config.agents,
        steps=config.steps,
        crew=config.crew,
    )
    if keep is not None:
        workload = workload.keep(keep)
    if engine == "memory":
        return loop.run(_simulate(seed, config, workload, keep_lines, None))
    # Each job on a database thread takes up to a storage trip's time, seeded.
    lockstep = threads.Lockstep(random.Random(f"{seed}:database"), config.storage_latency)
    scratch = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="funnel-sim-", dir=scratch) as directory, lockstep.installed():
        return loop.run(_simulate(seed, config, workload, keep_lines, (directory, lockstep)))


async def _simulate(
    seed: int,
    config: Config,
    workload: Workload,
    keep_lines: bool,
    sqlite: tuple[str, threads.Lockstep] | None,
) -> Result:
    running = asyncio.get_running_loop()
    history = History(running.time)
    storages: tuple[Storage, Storage]
    if sqlite is None:
        storages = memory_storages()
    else:
        running.set_task_factory(adopting_task_factory)  # type: ignore[arg-type]
        # The database threads judge lock deadlines on virtual time: they read it only
        # while the loop waits for them (threads.py), so it is the time of the hand-over,
        # and whether a deadline has passed is the same every run (real time is not).
        storages = sqlite_storages(sqlite[0], running.time)
    if keep_lines:
        history.keep_lines()
    fault_rng = random.Random(f"{seed}:faults")
    chaos_rng = random.Random(f"{seed}:chaos")
    half = MAX_CLOCK_OFFSET_MICROS // 2
    # Each clock off true time by up to half the allowed offset: at most the offset apart.
    lifecycle_clock = SimClock(chaos_rng.randint(-half, half))
    completion_clock = SimClock(chaos_rng.randint(-half, half))
    links = LinkFaults(config.latency, config.message_loss, config.duplicate, config.stream_lifetime)
    network = Network(random.Random(f"{seed}:network"), links, history.record)
    policy = Policy(max_clock_offset_micros=MAX_CLOCK_OFFSET_MICROS)
    lifecycle_chaos = Chaos(
        fault_rng,
        crash=config.crash_at_point,
        drop=config.drop_at_point,
        storage=config.storage_error,
        locked=config.locked,
        storage_latency=config.storage_latency,
        handover=config.crash_at_handover,
    )
    completion_chaos = Chaos(
        fault_rng,
        crash=config.crash_at_point,
        drop=config.drop_at_point,
        storage=config.storage_error,
        locked=config.locked,
        storage_latency=config.storage_latency,
        handover=config.crash_at_handover,
    )
    lifecycle = LifecycleNode(
        lifecycle_chaos, history.record, lifecycle_clock, policy, config.watch_buffer, storages[0]
    )
    policies = PolicyBook(
        workspaces={workspace: WorkspacePolicy(required_evidence=("tests",)) for workspace in workload.workspaces}
    )
    completion = CompletionNode(
        completion_chaos,
        history.record,
        completion_clock,
        network,
        lifecycle,
        policies,
        lifecycle_timeout=1.0,
        stall_after=2.0,
        settle_interval=0.5,
        storage=storages[1],
    )
    lifecycle.start()
    completion.start()
    tree = {task.name: task for task in workload.tasks}
    actors = [
        (Host if name.startswith("host") else Agent)(
            name, network, lifecycle, completion, Role.HOST if name.startswith("host") else Role.AGENT
        )
        for name in workload.actors
    ]
    rendezvous = Rendezvous(workload.rendezvous, RENDEZVOUS_SECONDS)
    for actor in actors:
        if is_crew(actor.name):
            actor.rendezvous = rendezvous
    watchers = [
        watcher
        for workspace in workload.workspaces
        for watcher in (
            Watcher(
                f"lifecycle-watcher/{workspace}",
                network,
                workspace,
                lifecycle,
                "WatchLifecycleEvents",
                lifecycle_messages.WatchLifecycleEventsRequest,
            ),
            Watcher(
                f"completion-watcher/{workspace}",
                network,
                workspace,
                completion,
                "WatchCompletionEvents",
                completion_messages.WatchCompletionEventsRequest,
            ),
        )
    ]

    async def play(actor: Host | Agent, steps: list[Step] | None = None) -> None:
        for step in workload.of(actor.name) if steps is None else steps:
            await actor.step(step, tree)
            if step.action != "rendezvous":  # its own seeded wait makes the crew's next steps meet
                await asyncio.sleep(chaos_rng.uniform(0, 0.3))

    async def finale() -> None:
        """The crew (workload.py): its host registers the tasks, then the members work them
        side by side, the host (when it calls one off) with them."""
        setup = workload.crew_setup
        crew = [actor for actor in actors if is_crew(actor.name)]
        for actor in crew:
            if actor.name == CREW_HOST:
                await play(actor, setup)
        await asyncio.gather(
            *(play(actor, [step for step in workload.of(actor.name) if step not in setup]) for actor in crew)
        )

    # One owner for the watchers, the chaos and the supervisor: cancelled, each is
    # awaited, and one that fails ends the run with its error instead of dying unseen.
    async with asyncio.TaskGroup() as group:
        following = [group.create_task(watcher.follow()) for watcher in watchers]
        playing = asyncio.gather(*(play(actor) for actor in actors if not is_crew(actor.name)))
        chaos = group.create_task(_chaos(chaos_rng, network, lifecycle, completion, config.chaos_interval))
        supervisor = group.create_task(_supervise(chaos_rng, (lifecycle, completion)))
        await playing
        # Still under chaos: the crew's finale, after every other step (so those steps play as without it).
        await finale()
        chaos.cancel()
        supervisor.cancel()
        lifecycle_chaos.calm()
        completion_chaos.calm()
        network.faults = LinkFaults(config.latency)
        network.heal()
        for node in (lifecycle, completion):
            node.start()
        await _drain(history, storages, watchers, workload.workspaces)
        # Every transcript read once more, by then with no live lease: an interrupted final turn is closed.
        auditor = Host("auditor", network, lifecycle, completion, Role.HOST)
        for audited in workload.tasks:
            await auditor.load(audited)
        for task in following:
            task.cancel()
    virtual_seconds = running.time()
    for node in (lifecycle, completion):
        node.crash("at the end of the simulation")
    await asyncio.sleep(1.0)  # the cancelled tasks unwind
    left = lifecycle.unwound() + completion.unwound()
    if sqlite is not None and (open_connections := sqlite[1].open_connections()):
        left.append(f"{open_connections} database connections of crashed incarnations never closed")
    async with storages[0].durable() as lifecycle_store, storages[1].durable() as completion_store:
        evidence = Evidence(
            history=history,
            lifecycle=lifecycle_store,
            completion=completion_store,
            workspaces=workload.workspaces,
            tasks={task.name: task.workspace for task in workload.tasks},
            watchers={watcher.name: (watcher.workspace, watcher.seen) for watcher in watchers},
            transcript_reads=[read for actor in [*actors, auditor] if isinstance(actor, Host) for read in actor.reads],
            audited={task.name for task, _ in auditor.reads},
            lifecycle_clock=lifecycle_clock,
            completion_clock=completion_clock,
            policy=policy,
            left_behind=left,
        )
        violations = await check(evidence)
    engine: Engine = "memory" if sqlite is None else "sqlite"
    return Result(seed, workload, violations, history, len(history.calls), virtual_seconds, engine, history.digest)


async def _drain(
    history: History, storages: tuple[Storage, Storage], watchers: list[Watcher], workspaces: list[str]
) -> None:
    """Lets the calmed world settle what it owes, in virtual time: until nothing the
    checkers read (the history, both stores, what the watchers saw) has changed for
    QUIET_SECONDS, and for DRAIN_SECONDS at most. The services' idle loops would
    otherwise poll for the rest of DRAIN_SECONDS (a third of a run's CPU) to no effect.
    Only stores that can be read as they are, at once (in memory), are looked at: SQLite
    files would be opened anew each time, so SQLite runs drain for DRAIN_SECONDS."""
    loop = asyncio.get_running_loop()
    lifecycle, completion = (storage.at_once() for storage in storages)
    if lifecycle is None or completion is None:
        await asyncio.sleep(DRAIN_SECONDS)
        return
    ends = loop.time() + DRAIN_SECONDS
    last: tuple[Any, ...] = ()
    since = loop.time()
    while loop.time() < ends:
        await asyncio.sleep(QUIET_LOOK)
        now = await _visible(history, lifecycle, completion, watchers, workspaces)
        if now != last:
            last, since = now, loop.time()
        elif loop.time() - since >= QUIET_SECONDS:
            return


async def _visible(
    history: History, lifecycle: Any, completion: Any, watchers: list[Watcher], workspaces: list[str]
) -> tuple[Any, ...]:
    """What the checkers read of the world, as one comparable value."""
    seen: list[Any] = [len(history.calls), len(history.notes), tuple(len(watcher.seen) for watcher in watchers)]
    for workspace in workspaces:
        seen += [
            await lifecycle.read(
                lambda tx, ws=workspace: (
                    tx.events.page(ws, 0, None, EVERYTHING),
                    tx.tasks.page(ws, TaskQuery(), "", EVERYTHING),
                )
            ),
            await completion.read(lambda tx, ws=workspace: tx.completions.page(ws, None, None, None, EVERYTHING)),
            await completion.read(lambda tx, ws=workspace: tx.events.page(ws, 0, None, EVERYTHING)),
            await completion.read(lambda tx, ws=workspace: tx.runs.page(ws, None, None, EVERYTHING)),
        ]
    return tuple(seen)


async def _chaos(
    rng: random.Random, network: Network, lifecycle: LifecycleNode, completion: CompletionNode, interval: float
) -> None:
    """Crashes and partitions at seeded moments, until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(rng.expovariate(1 / interval))
        roll = rng.random()
        if roll < 0.5:
            rng.choice((lifecycle, completion)).crash("at a random moment")
        elif roll < 0.8:
            network.partition(lifecycle.name, completion.name)
            loop.call_later(rng.uniform(0.5, 4.0), network.heal)
        else:
            client = rng.choice(("host-0", "agent-0", "agent-1"))
            network.partition(client, rng.choice((lifecycle.name, completion.name)))
            loop.call_later(rng.uniform(0.5, 4.0), network.heal)


async def _supervise(rng: random.Random, nodes: tuple[LifecycleNode, CompletionNode]) -> None:
    """Restarts a node that is down, a little later, as a process supervisor does."""
    while True:
        await asyncio.sleep(rng.uniform(0.2, 2.0))
        for node in nodes:
            node.start()
