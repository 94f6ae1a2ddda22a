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
import random
from dataclasses import dataclass, field

from completion_service.core.gates import WorkspacePolicy
from completion_service.policy import PolicyBook
from funnel.auth.principal import Role
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel_sim import loop
from funnel_sim.actors import Agent, Host, Watcher
from funnel_sim.checkers import Evidence, check
from funnel_sim.clocks import SimClock
from funnel_sim.history import History
from funnel_sim.network import LinkFaults, Network
from funnel_sim.nodes import Chaos, CompletionNode, LifecycleNode
from funnel_sim.workload import Workload, generate
from lifecycle_service.core.model import Policy

MAX_CLOCK_OFFSET_MICROS = 500_000
# Virtual seconds the calmed world gets to settle everything that is owed.
DRAIN_SECONDS = 120.0


@dataclass(frozen=True)
class Config:
    tasks: int = 4
    workspaces: int = 2
    hosts: int = 2
    agents: int = 3
    steps: int = 100
    # Per fault-point hit: the node crashes / the reply is dropped.
    crash_at_point: float = 0.03
    drop_at_point: float = 0.03
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
    digest: str = ""
    figures: dict[str, int] = field(default_factory=dict)


def simulate(
    seed: int, config: Config = Config(), keep: frozenset[int] | None = None, keep_lines: bool = False
) -> Result:
    workload = generate(
        random.Random(f"{seed}:workload"),
        tasks=config.tasks,
        workspaces=config.workspaces,
        hosts=config.hosts,
        agents=config.agents,
        steps=config.steps,
    )
    if keep is not None:
        workload = workload.keep(keep)
    return loop.run(_simulate(seed, config, workload, keep_lines))


async def _simulate(seed: int, config: Config, workload: Workload, keep_lines: bool) -> Result:
    history = History()
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
    )
    completion_chaos = Chaos(
        fault_rng,
        crash=config.crash_at_point,
        drop=config.drop_at_point,
        storage=config.storage_error,
        locked=config.locked,
        storage_latency=config.storage_latency,
    )
    lifecycle = LifecycleNode(lifecycle_chaos, history.record, lifecycle_clock, policy, config.watch_buffer)
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

    async def play(actor: Host | Agent) -> None:
        for step in workload.of(actor.name):
            await actor.step(step, tree)
            await asyncio.sleep(chaos_rng.uniform(0, 0.3))

    # One owner for the watchers, the chaos and the supervisor: cancelled, each is
    # awaited, and one that fails ends the run with its error instead of dying unseen.
    async with asyncio.TaskGroup() as group:
        following = [group.create_task(watcher.follow()) for watcher in watchers]
        playing = asyncio.gather(*(play(actor) for actor in actors))
        chaos = group.create_task(_chaos(chaos_rng, network, lifecycle, completion, config.chaos_interval))
        supervisor = group.create_task(_supervise(chaos_rng, (lifecycle, completion)))
        await playing
        chaos.cancel()
        supervisor.cancel()
        lifecycle_chaos.calm()
        completion_chaos.calm()
        network.faults = LinkFaults(config.latency)
        network.heal()
        for node in (lifecycle, completion):
            if not node.up:
                node.start()
        await asyncio.sleep(DRAIN_SECONDS)
        # Every transcript read once more, by then with no live lease: an interrupted final turn is closed.
        auditor = Host("auditor", network, lifecycle, completion, Role.HOST)
        for audited in workload.tasks:
            await auditor.load(audited)
        for task in following:
            task.cancel()
    evidence = Evidence(
        history=history,
        lifecycle=lifecycle.durable,
        completion=completion.durable,
        workspaces=workload.workspaces,
        tasks={task.name: task.workspace for task in workload.tasks},
        watchers={watcher.name: (watcher.workspace, watcher.seen) for watcher in watchers},
        transcript_reads=[read for actor in [*actors, auditor] if isinstance(actor, Host) for read in actor.reads],
        audited={task.name for task, _ in auditor.reads},
        lifecycle_clock=lifecycle_clock,
        completion_clock=completion_clock,
        policy=policy,
    )
    violations = await check(evidence)
    virtual_seconds = asyncio.get_running_loop().time()
    for node in (lifecycle, completion):
        node.crash("at the end of the simulation")
    await asyncio.sleep(1.0)  # the cancelled tasks unwind
    return Result(seed, workload, violations, history, len(history.calls), virtual_seconds, history.digest)


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
            if not node.up:
                node.start()
