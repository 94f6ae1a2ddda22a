"""The two services as simulated nodes: the real authorities, servicers and
background loops over a store of either engine (memory, or the real SQLite
stores on files), wired as the servers wire them (lifecycle_service/server.py,
completion_service/server.py) minus gRPC, TLS, metrics endpoints and the health
probe.

What a node is made of splits along what a crash keeps. The store is durable:
one in-memory store for the life of the simulation, its state replaced only by
whole committed transactions, or one SQLite file, which each incarnation opens
afresh as a restarted process does (its own connections, writer and owner
tasks). Everything else is one incarnation: the authority, the watch broker, the
projection, the settle batches, the tasks serving calls, the background loops,
and on SQLite the Database objects with their owner tasks. `crash()` ends the
incarnation at once: every one of its tasks is cancelled (a SQLite writer's owner
with them: what it committed stays, what it held fails unapplied), and its store
handle refuses every later read and write (`NodeCrashed`), so no code of a dead
incarnation changes durable state, even from a `finally` block; a transaction
under way when it died (a fault point or a storage error inside a unit of work)
never committed. `start()` builds the next incarnation from the durable state, as
a restarted process does; on SQLite it serves only once its store is open.

A write handed to a SQLite store lives on when its caller is cancelled (the
writer owes it an answer: committed, or failed unapplied; funnel.runtime.sqlite);
the run checks at its end that every one was answered (`unwound`)."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import contextvars
import random
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from completion_service.api.service import CompletionService
from completion_service.api.service import publisher as completion_publisher
from completion_service.api.transcript_service import TranscriptService
from completion_service.authority import CompletionAuthority
from completion_service.clients.external_gates import ExternalGates
from completion_service.clients.lifecycle_client import LifecycleClient
from completion_service.errors import DOMAIN as COMPLETION_DOMAIN
from completion_service.errors import Reason as CompletionReason
from completion_service.policy import PolicyBook
from completion_service.storage.memory import MemoryCompletionStore
from completion_service.storage.sqlite import SqliteCompletionStore
from funnel.auth.principal import Principal, Role
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.runtime import calls, idempotency, sqlite
from funnel.runtime.budget import ByteBudget
from funnel.runtime.faults import DroppedReply, Faults
from funnel.runtime.shutdown import Drain
from funnel.runtime.storage_errors import StorageUnavailable
from funnel.runtime.watch import EventBroker, WatchQuota
from funnel_sim.clocks import SimClock, SimIds
from funnel_sim.network import Failed, Network, Ok, SimContext, StreamEnded
from lifecycle_service.api.service import LifecycleService
from lifecycle_service.api.service import publisher as lifecycle_publisher
from lifecycle_service.authority import LifecycleAuthority
from lifecycle_service.core.model import Policy
from lifecycle_service.errors import DOMAIN as LIFECYCLE_DOMAIN
from lifecycle_service.errors import Reason as LifecycleReason
from lifecycle_service.storage.memory import MemoryLifecycleStore
from lifecycle_service.storage.sqlite import SqliteLifecycleStore

T = TypeVar("T")
LIFECYCLE = "lifecycle"
COMPLETION = "completion"
# The RPCs of the completion node's second servicer.
TRANSCRIPT_METHODS = frozenset(
    ("AppendTranscript", "LoadTranscript", "ExportTranscript", "ImportTranscript", "ResolveResume")
)
# The completion service's identity at the lifecycle service.
COMPLETION_CALLER = calls.Call(Principal(COMPLETION), Role.COMPLETION_SERVICE, False, "")


class NodeCrashed(BaseException):
    """The incarnation this code runs in has crashed: nothing of it may go on.
    A BaseException, so that the shells' `except Exception` (a loop surviving any
    single failure) does not carry a dead process on."""


class Chaos:
    """The seeded faults a node's code meets: a crash or a dropped reply at the
    named fault points (funnel.runtime.faults), a database fault at any statement
    of a unit of work or read (each kind the driver raises), the write lock taken
    by another process when a write begins (`locked`, per write)."""

    def __init__(
        self,
        rng: random.Random,
        *,
        crash: float = 0.0,
        drop: float = 0.0,
        storage: float = 0.0,
        locked: float = 0.0,
        storage_latency: float = 0.0,
        handover: float = 0.0,
    ) -> None:
        self.rng = rng
        self.crash = crash
        self.drop = drop
        self.storage = storage
        self.locked = locked
        # Until when (virtual time) another process holds the write lock.
        self.held_until = 0.0
        # Seconds a trip to the database takes at most (each way); kept when calmed.
        self.storage_latency = storage_latency
        # Per write handed to a store's writer: the node crashes with it queued, not taken
        # yet (a moment only a store with a writer of its own has).
        self.handover = handover

    def calm(self) -> None:
        self.crash = self.drop = self.storage = self.locked = self.handover = 0.0


@dataclass(frozen=True)
class StatementFault:
    code: int
    message: str
    # Whether a read meets it too (a full disk or a read-only file fails writes only).
    on_reads: bool

    def error(self) -> sqlite3.OperationalError:
        """The fault as SQLite's driver raises it."""
        error = sqlite3.OperationalError(self.message)
        error.sqlite_errorcode = self.code
        return error


# The faults a statement meets on a real database, as the driver raises them; the
# store (funnel.runtime.sqlite.operational_fault) makes each StorageUnavailable.
# Busy (another connection's lock), disk full, I/O error, read-only file.
STATEMENT_FAULTS = (
    StatementFault(sqlite3.SQLITE_BUSY, "database is locked", True),
    StatementFault(sqlite3.SQLITE_FULL, "database or disk is full", False),
    StatementFault(sqlite3.SQLITE_IOERR, "disk I/O error", True),
    StatementFault(sqlite3.SQLITE_READONLY, "attempt to write a readonly database", False),
)
# Seconds another holder (a backup, an operator's shell) keeps the write lock, at most.
LOCK_HELD = 3.0


class SimFaults(Faults):
    """The product's fault points, fired by the simulation's dice."""

    def __init__(self, node: Node) -> None:
        super().__init__()
        self._node = node

    def hit(self, point: str) -> None:
        chaos = self._node.chaos
        if chaos.crash and chaos.rng.random() < chaos.crash:
            self._node.crash(f"at {point}")
            raise NodeCrashed(point)
        if chaos.drop and chaos.rng.random() < chaos.drop:
            self._node.record("fault", self._node.name, f"drop at {point}")
            raise DroppedReply(point)


class _FaultyTx:
    """A transaction whose every statement may fail as the database would: its
    methods, and those of its aggregates (`tx.runs`, …), wrapped the same way."""

    def __init__(self, tx: Any, chaos: Chaos, writing: bool) -> None:
        self._tx = tx
        self._chaos = chaos
        self._writing = writing

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._tx, name)
        if not callable(found):
            return _FaultyTx(found, self._chaos, self._writing)
        if not self._chaos.storage:
            return found
        chaos, writing = self._chaos, self._writing

        def statement(*args: Any, **kwargs: Any) -> Any:
            if chaos.rng.random() < chaos.storage:
                fault = chaos.rng.choice([f for f in STATEMENT_FAULTS if writing or f.on_reads])
                raise fault.error()
            return found(*args, **kwargs)

        return statement


class NodeStore:
    """One incarnation's handle on the durable store."""

    def __init__(self, durable: Any, node: Node) -> None:
        self._durable = durable
        self._node = node
        self._incarnation = node.incarnation

    def _alive(self) -> None:
        if not self._node.up or self._node.incarnation != self._incarnation:
            raise NodeCrashed("the store of a crashed incarnation")

    def _faulty(self, fn: Callable[[Any], T], writing: bool) -> Callable[[Any], T]:
        chaos = self._node.chaos
        return lambda tx: fn(_FaultyTx(tx, chaos, writing))

    async def _hop(self) -> None:
        """The trip to the database (or back): a real store answers on its own thread,
        and other tasks run meanwhile (the in-memory stores barely yield)."""
        chaos = self._node.chaos
        await asyncio.sleep(chaos.rng.uniform(0, chaos.storage_latency))
        self._alive()

    async def _lock(self) -> None:
        """The write lock, which another process (a backup, an operator's shell)
        takes now and then for a while: a write waits for it until the call's lock
        deadline (funnel.runtime.calls; background work DEFAULT_LOCK_WAIT), then
        fails unapplied, as the SQLite writer does."""
        chaos = self._node.chaos
        now = asyncio.get_running_loop().time()
        if chaos.locked and chaos.rng.random() < chaos.locked:
            held = chaos.rng.uniform(0, LOCK_HELD)
            chaos.held_until = max(chaos.held_until, now + held)
            self._node.record("fault", self._node.name, f"write lock taken for {held:.3f} s")
        if chaos.held_until <= now:
            return
        wait = min(calls.lock_deadline() or float("inf"), now + sqlite.DEFAULT_LOCK_WAIT) - now
        if chaos.held_until - now > wait:
            await asyncio.sleep(max(0.0, wait))
            self._alive()
            raise StorageUnavailable(sqlite.LOCKED_PAST_THE_DEADLINE)
        await asyncio.sleep(chaos.held_until - now)
        self._alive()

    async def write(self, fn: Callable[[Any], T], after_commit: Callable[[T], None] | None = None) -> T:
        await self._hop()
        await self._lock()
        try:
            writing = self._durable.write(self._faulty(fn, True), after_commit=after_commit)
            result: T = await (self._node.hand_over(writing) if self._node.storage.has_writer else writing)
        except sqlite3.OperationalError as exc:
            raise sqlite.operational_fault(exc) from exc
        await self._hop()
        return result

    async def read(self, fn: Callable[[Any], T]) -> T:
        await self._hop()
        try:
            result: T = await self._durable.read(self._faulty(fn, False))
        except sqlite3.OperationalError as exc:
            raise sqlite.operational_fault(exc) from exc
        await self._hop()
        return result

    async def check_writable(self) -> None:
        self._alive()

    async def close(self) -> None:
        return None


class MemoryStorage:
    """An in-memory store, durable for the life of the simulation: every incarnation
    is handed it as it is, at once."""

    has_writer = False

    def __init__(self, store: Any) -> None:
        self.store = store

    def at_once(self) -> Any:
        return self.store

    async def open(self) -> Any:
        return self.store

    @contextlib.asynccontextmanager
    async def durable(self) -> AsyncIterator[Any]:
        yield self.store


class SqliteStorage:
    """A SQLite file that each incarnation opens afresh: `opener(path, clock=)` is the
    store's own open (SqliteLifecycleStore.open, SqliteCompletionStore.open)."""

    has_writer = True

    def __init__(self, opener: Callable[..., Awaitable[Any]], path: str, clock: Callable[[], float]) -> None:
        self._opener = opener
        self.path = path
        self._clock = clock

    def at_once(self) -> Any:
        return None

    async def open(self) -> Any:
        return await self._opener(self.path, clock=self._clock)

    @contextlib.asynccontextmanager
    async def durable(self) -> AsyncIterator[Any]:
        """What survived: the file opened afresh, once every incarnation is gone."""
        store = await self.open()
        try:
            yield store
        finally:
            await store.close()


Storage = MemoryStorage | SqliteStorage

# The node incarnation whose store is opening: a task started meanwhile (a SQLite
# Database's owner, and what that starts) belongs to it (adopting_task_factory).
_OPENING: contextvars.ContextVar[tuple[Node, int] | None] = contextvars.ContextVar("sim_opening", default=None)


def adopting_task_factory(
    loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, Any], context: contextvars.Context | None = None
) -> asyncio.Task[Any]:
    """The loop's task factory when stores open at a node's start: a task the store
    starts for itself is one of the incarnation's, cancelled by its crash."""
    task: asyncio.Task[Any] = asyncio.Task(coroutine, loop=loop, context=context)
    opening = _OPENING.get()
    if opening is not None:
        node, incarnation = opening
        if node.incarnation == incarnation and not node.down:
            node.adopt(task)
    return task


class Node(abc.ABC):
    """What the network and the faults see of a service: up or not, the tasks of
    the current incarnation. Each service's node builds its incarnation."""

    def __init__(
        self, name: str, catalogue: Any, domain: str, chaos: Chaos, record: Callable[..., None], storage: Storage
    ) -> None:
        self.name = name
        self.catalogue = catalogue
        self.domain = domain
        self.chaos = chaos
        self.record = record
        self.storage = storage
        self.incarnation = 0
        self._up = False
        self._booting = False
        # Ordered (a dict, not a set of objects): a crash cancels them in the same order every run.
        self._tasks: dict[asyncio.Task[Any], None] = {}
        # Writes handed to the store's writer, not answered yet: (incarnation, virtual time).
        self._handed: dict[asyncio.Task[Any], tuple[int, float]] = {}

    @property
    def up(self) -> bool:
        return self._up

    @property
    def down(self) -> bool:
        """Neither serving nor starting."""
        return not self._up and not self._booting

    def adopt(self, task: asyncio.Task[Any]) -> None:
        self._tasks[task] = None
        task.add_done_callback(self._ended)

    async def hand_over(self, write: Coroutine[Any, Any, T]) -> T:
        """Hands `write` to the store's writer, and waits for its answer: cancelled,
        the caller stops waiting, and the write goes on without it (its own task)."""
        handed = asyncio.ensure_future(write)
        loop = asyncio.get_running_loop()
        self._handed[handed] = (self.incarnation, loop.time())
        handed.add_done_callback(self._answered)
        # Runs after the write's first step (it is queued then) and before the writer's
        # next (which takes it): a crash here leaves it queued.
        loop.call_soon(self._crash_at_handover)
        return await asyncio.shield(handed)

    def _crash_at_handover(self) -> None:
        chaos = self.chaos
        if self._up and chaos.handover and chaos.rng.random() < chaos.handover:
            self.crash("with a write queued on its store")

    def _answered(self, handed: asyncio.Task[Any]) -> None:
        del self._handed[handed]
        if not handed.cancelled():
            handed.exception()  # its caller may be gone: the outcome is the store's to log

    def unwound(self) -> list[str]:
        """What a crashed incarnation left behind: writes handed to the store and never
        answered, tasks that did not end when cancelled. Then forgets them (cancelled)."""
        left = [
            f"{self.name} incarnation {incarnation}: a write handed to its store at {at:.3f} was never answered"
            for incarnation, at in self._handed.values()
        ]
        left += [f"{self.name}: {task.get_name()} still running after its crash" for task in self._tasks]
        for task in [*self._handed, *self._tasks]:
            task.cancel()
        return left

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(_owned(coroutine), name=f"{self.name}/{name}")
        self._tasks[task] = None
        task.add_done_callback(self._ended)
        # A task cancelled before it first ran never started its coroutine: close it,
        # or Python warns that it was never awaited.
        task.add_done_callback(lambda _: coroutine.close())
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            self.fault(f"{task.get_name()} died", task.exception())

    def fault(self, where: str, error: BaseException | None) -> None:
        self.record("anomaly", self.name, f"{where}: {error!r}")

    def crash(self, why: str) -> None:
        if not self._up:
            return
        self._up = False
        self.record("crash", self.name, f"incarnation {self.incarnation} {why}")
        for task in list(self._tasks):
            task.cancel()

    def start(self) -> None:
        if not self.down:
            return
        self.incarnation += 1
        self.record("start", self.name, f"incarnation {self.incarnation}")
        store = self.storage.at_once()
        if store is not None:
            self._up = True
            self.build(NodeStore(store, self))
            return
        self._booting = True
        self.spawn(self._boot(), "boot")

    async def _boot(self) -> None:
        """Opens the store as the server does before it serves, then serves."""
        token = _OPENING.set((self, self.incarnation))
        try:
            store = await self.storage.open()
        finally:
            _OPENING.reset(token)
        self._booting = False
        self._up = True
        self.build(NodeStore(store, self))

    @abc.abstractmethod
    def build(self, store: NodeStore) -> None:
        """Builds the next incarnation over its handle on the durable store."""

    @abc.abstractmethod
    def servicer(self, method: str) -> Any:
        """The current incarnation's servicer of an RPC."""


async def _owned(coroutine: Awaitable[Any]) -> Any:
    """A node's task: a crash of its own ends it quietly."""
    try:
        return await coroutine
    except NodeCrashed:
        return None


class LifecycleNode(Node):
    def __init__(
        self,
        chaos: Chaos,
        record: Callable[..., None],
        clock: SimClock,
        policy: Policy,
        watch_buffer: int,
        storage: Storage,
    ) -> None:
        super().__init__(LIFECYCLE, LifecycleReason, LIFECYCLE_DOMAIN, chaos, record, storage)
        self.clock = clock
        self.policy = policy
        self.watch_buffer = watch_buffer
        self.service: LifecycleService | None = None

    def build(self, store: NodeStore) -> None:
        broker: EventBroker[lifecycle_messages.WatchLifecycleEventsResponse] = EventBroker(self.watch_buffer)
        authority = LifecycleAuthority(
            store,
            self.policy,
            self.clock,
            publish=lifecycle_publisher(broker),
            faults=SimFaults(self),
            owner=f"lifecycle/{self.incarnation}",
            retry_delay=0.5,
        )
        self.service = LifecycleService(authority, broker, WatchQuota(LifecycleReason, 64, 64))
        self.spawn(authority.deliver_forever(), "propagations")
        self.spawn(
            idempotency.sweeper(authority.sweep_request_ids, self.clock, idempotency.DEFAULT_RETENTION_SECONDS)(),
            "request-id-sweeper",
        )

    def servicer(self, method: str) -> LifecycleService:
        assert self.service is not None
        return self.service


class SimLifecycleStub:
    """The completion service's stub of TaskLifecycleService: the same calls as
    the generated stub (`method(request, timeout=, metadata=)`), carried by the
    simulated network, failing as grpc.aio does (AioRpcError with the status's
    details in its trailers)."""

    def __init__(self, network: Network, lifecycle: LifecycleNode) -> None:
        self._network = network
        self._lifecycle = lifecycle

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method == "WatchLifecycleEvents":
            return self._watch
        lifecycle = self._lifecycle

        async def handler(request: Any, context: SimContext) -> Any:
            assert lifecycle.service is not None
            return await getattr(lifecycle.service, method)(request, context)

        async def call(request: Any, timeout: float, metadata: Any = ()) -> Any:
            answer = await self._network.call(
                COMPLETION, lifecycle, method, handler, request, COMPLETION_CALLER, timeout
            )
            if isinstance(answer, Ok):
                return answer.response
            raise aio_error(answer)

        return call

    def _watch(self, request: lifecycle_messages.WatchLifecycleEventsRequest, metadata: Any = ()) -> _StreamCall:
        lifecycle = self._lifecycle

        def handler(request: Any, context: SimContext) -> Any:
            assert lifecycle.service is not None
            # SimContext stands in for the grpc context: the servicer reads only its deadline.
            return lifecycle.service.WatchLifecycleEvents(request, context)  # type: ignore[arg-type]

        return _StreamCall(
            self._network.stream(COMPLETION, lifecycle, "WatchLifecycleEvents", handler, request, COMPLETION_CALLER)
        )


class _StreamCall:
    """What the projection uses of a grpc.aio.UnaryStreamCall."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __aiter__(self) -> _StreamCall:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._stream.next()
        except StreamEnded as end:
            if end.failure is None:
                raise StopAsyncIteration from None
            raise aio_error(end.failure) from None

    def cancel(self) -> bool:
        self._stream.cancel()
        return True


def aio_error(failed: Failed) -> Exception:
    trailing = grpc.aio.Metadata(("grpc-status-details-bin", failed.status.SerializeToString()))
    code = next(c for c in grpc.StatusCode if c.value[0] == failed.code)
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details=failed.status.message)


class _NoChannel:
    """LifecycleClient reads its channel's metadata only; the simulated stub needs none."""

    channel = None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


class SimLifecycleClient(LifecycleClient):
    """The real lifecycle client (classification of answers, settle batches, request
    ids) over the simulated stub."""

    def __init__(self, stub: SimLifecycleStub, timeout: float) -> None:
        super().__init__(_NoChannel(), timeout)  # type: ignore[arg-type]
        self._sim_stub = stub

    @property
    def _stub(self) -> Any:
        return self._sim_stub


class CompletionNode(Node):
    def __init__(
        self,
        chaos: Chaos,
        record: Callable[..., None],
        clock: SimClock,
        network: Network,
        lifecycle: LifecycleNode,
        policies: PolicyBook,
        *,
        lifecycle_timeout: float,
        stall_after: float,
        settle_interval: float,
        storage: Storage,
    ) -> None:
        super().__init__(COMPLETION, CompletionReason, COMPLETION_DOMAIN, chaos, record, storage)
        self.clock = clock
        self.network = network
        self.lifecycle = lifecycle
        self.policies = policies
        self.lifecycle_timeout = lifecycle_timeout
        self.stall_after = stall_after
        self.settle_interval = settle_interval
        self.service: CompletionService | None = None
        self.transcripts: TranscriptService | None = None
        self.authority: CompletionAuthority | None = None

    def build(self, store: NodeStore) -> None:
        broker: EventBroker[completion_messages.WatchCompletionEventsResponse] = EventBroker(64)
        client = SimLifecycleClient(SimLifecycleStub(self.network, self.lifecycle), self.lifecycle_timeout)
        ids = SimIds(self.incarnation)
        authority = CompletionAuthority(
            store,
            client,
            self.policies,
            self.clock,
            ExternalGates(None),  # type: ignore[arg-type]
            ids=ids,
            publish=completion_publisher(broker),
            settle_interval=self.settle_interval,
            settle_lease=max(4 * self.lifecycle_timeout, 1.0),
            stall_after=self.stall_after,
            faults=SimFaults(self),
            projected_workspaces=4,
        )
        self.authority = authority
        self.service = CompletionService(authority, broker, WatchQuota(CompletionReason, 64, 64))
        # Imports are not simulated: any import budget and shutdown drain will do.
        self.transcripts = TranscriptService(authority, ids, ByteBudget(1 << 20), Drain())
        for name, worker in authority.workers(idempotency.DEFAULT_RETENTION_SECONDS):
            self.spawn(worker(), name)

    def servicer(self, method: str) -> CompletionService | TranscriptService:
        found = self.transcripts if method in TRANSCRIPT_METHODS else self.service
        assert found is not None
        return found


def memory_storages() -> tuple[MemoryStorage, MemoryStorage]:
    """(lifecycle, completion): the in-memory stores."""
    return MemoryStorage(MemoryLifecycleStore()), MemoryStorage(MemoryCompletionStore())


def sqlite_storages(directory: str, clock: Callable[[], float]) -> tuple[SqliteStorage, SqliteStorage]:
    """(lifecycle, completion): the services' SQLite stores, on files in `directory`."""
    return (
        SqliteStorage(SqliteLifecycleStore.open, f"{directory}/lifecycle.sqlite3", clock),
        SqliteStorage(SqliteCompletionStore.open, f"{directory}/completion.sqlite3", clock),
    )
