"""One store for both services and every engine: it runs a unit of work (a plain
synchronous function of a transaction) in one transaction of an engine, under
the one rule of docs/specification.md §2.4: what a unit wrote commits when it
returns, and nothing of it is applied when it raises or returns a `Rejection`
(a refused request changes nothing, so a unit may refuse after it has written).

- `Engine[C]`: a database as a store drives it, one transaction per call over
  its connection `C`: `funnel.runtime.sqlite.SqliteEngine`,
  `funnel.runtime.postgres.PostgresDatabase`, and `MemoryEngine` (the in-memory
  fakes').
- `Store[C, W, R]`: an engine, and how a write (`W`) or read (`R`) transaction of
  a service's port opens on its connection. An adapter's store is one of these
  (a subclass only adds how it opens and what its engine offers besides).
- `Transactions[W, R]`: what a shell holds of a store (the simulator's stores
  stand in for one)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar, cast

from funnel.runtime.errors import Rejection
from funnel.runtime.storage_errors import StorageUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")
C = TypeVar("C")
W = TypeVar("W")
R = TypeVar("R")
C_co = TypeVar("C_co", covariant=True)
W_co = TypeVar("W_co", covariant=True)
R_co = TypeVar("R_co", covariant=True)
S = TypeVar("S", bound="Copyable")


class Transactions(Protocol[W_co, R_co]):
    async def write(self, fn: Callable[[W_co], T], after_commit: Callable[[T], None] | None = None) -> T:
        """Runs `fn` in one write transaction, in one hop on the database's own
        connection, and returns its result once committed; a returned Rejection is
        rolled back and returned. `fn` must touch nothing but its transaction (an
        engine may run it again after a conflict). `after_commit` runs on the event
        loop after the commit (never after a rollback), even if the caller was
        cancelled meanwhile; on an engine with one writer (SQLite, memory) in commit
        order, before later writes are acknowledged. Transactions of an engine
        shared by replicas (PostgreSQL) commit concurrently and their hooks run as
        their commits are acknowledged: there, watchers are fed from the event
        tables by cursor (funnel.runtime.tail). Raises StorageUnavailable when
        nothing could be applied."""
        ...

    async def read(self, fn: Callable[[R_co], T]) -> T:
        """Runs `fn` in a read transaction (a consistent snapshot), without waiting for writes."""
        ...

    async def check_writable(self) -> None:
        """Raises StorageUnavailable when a write transaction cannot be taken."""
        ...

    async def close(self) -> None: ...


class Engine(Protocol[C_co]):
    async def write(self, fn: Callable[[C_co], T], after_commit: Callable[[T], None] | None = None) -> T:
        """Runs `fn` in a write transaction and returns its result once committed;
        when `fn` raises, nothing of it is applied and `after_commit` does not run."""
        ...

    async def read(self, fn: Callable[[C_co], T]) -> T: ...

    async def check_writable(self) -> None: ...

    async def close(self) -> None: ...


class RolledBack(Exception):
    """Raised out of a unit that returned a Rejection, so that the engine rolls it back."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


class Store(Generic[C, W, R]):
    def __init__(
        self,
        engine: Engine[C],
        write_tx: Callable[[C], W],
        read_tx: Callable[[C], R],
        *,
        committed: Callable[[W], None] | None = None,
    ) -> None:
        """`committed` is told of the transaction that committed, on the event loop
        before `after_commit` (for what an adapter may keep only once it is durable)."""
        self._engine = engine
        self._write_tx = write_tx
        self._read_tx = read_tx
        self._committed = committed

    async def write(self, fn: Callable[[W], T], after_commit: Callable[[T], None] | None = None) -> T:
        # The transaction of each run: only the last one commits (an engine may rerun fn).
        opened: list[W] = []

        def unit(connection: C) -> T:
            opened.append(self._write_tx(connection))
            result = fn(opened[-1])
            if isinstance(result, Rejection):  # a refused request changes nothing
                raise RolledBack(result)
            return result

        def hooks(result: T) -> None:
            if self._committed is not None:
                self._committed(opened[-1])
            if after_commit is not None:
                after_commit(result)

        try:
            return await self._engine.write(unit, hooks)
        except RolledBack as refused:
            return cast(T, refused.rejection)  # T includes Rejection: fn returned it

    async def read(self, fn: Callable[[R], T]) -> T:
        return await self._engine.read(lambda connection: fn(self._read_tx(connection)))

    async def check_writable(self) -> None:
        await self._engine.check_writable()

    async def close(self) -> None:
        await self._engine.close()


class Copyable(Protocol):
    def copy(self: S) -> S:
        """A snapshot a write may change without changing this one."""
        ...


class MemoryEngine(Generic[S]):
    """The in-memory fakes' engine: a write works on a copy of the state, which
    replaces the state only when the unit returns, so a unit that raises leaves
    nothing behind; hooks run in commit order, each right after its commit.

    `hops`: each call yields to the event loop once, as a real engine's thread hop
    does (the completion fake's; the lifecycle fake answers at once). The
    simulator's recorded seeds depend on both, so each fake keeps its own."""

    def __init__(self, state: S, *, hops: bool) -> None:
        self._state = state
        self._hops = hops
        self._closed = False

    @property
    def state(self) -> S:
        """The committed state (which a write never changes in place)."""
        return self._state

    async def write(self, fn: Callable[[S], T], after_commit: Callable[[T], None] | None = None) -> T:
        self._check_open()
        working = self._state.copy()
        try:
            result = fn(working)
        except RolledBack:
            await self._hop()  # answered like any other write: a caller sees one hop either way
            raise
        self._state = working
        if after_commit is not None:
            try:
                after_commit(result)
            except Exception:  # publishing must not undo an acknowledged commit
                log.exception("after-commit hook failed")
        # A caller cancelled during the hop does not undo (or unpublish) what committed.
        await self._hop()
        return result

    async def read(self, fn: Callable[[S], T]) -> T:
        self._check_open()
        await self._hop()
        return fn(self._state)

    async def check_writable(self) -> None:
        self._check_open()

    async def close(self) -> None:
        self._closed = True

    async def _hop(self) -> None:
        if self._hops:
            await asyncio.sleep(0)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageUnavailable("the store is closed; nothing was applied")
