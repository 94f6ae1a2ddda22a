"""The SQLite adapter of the lifecycle store: `SqliteLifecycleStore` runs units of
work on `funnel.runtime.sqlite.SqliteEngine` (one hop per transaction, group
commit); `SqliteLifecycleTx` is the port's transaction over that connection, one
object per aggregate, each in its module (requests, tasks, events, propagations),
mapping rows and nothing else through the shared row mapping (rows.py). The
PostgreSQL adapter (`storage.postgres`) runs the same statements through
`SqliteStyle`; what differs is in the session's hooks (session.py) and in its
own modules."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from funnel.runtime.sqlite import CommitObserver, SqliteEngine, migrations_in
from funnel.runtime.store import Store
from lifecycle_service.storage.port import LifecycleFigures, LifecycleStore
from lifecycle_service.storage.sqlite.events import SqliteEvents
from lifecycle_service.storage.sqlite.propagations import SqlitePropagations
from lifecycle_service.storage.sqlite.requests import SqliteRequestIds
from lifecycle_service.storage.sqlite.session import Connection, Session
from lifecycle_service.storage.sqlite.tasks import SqliteTasks

MIGRATIONS_PACKAGE = "lifecycle_service.storage.migrations"


class SqliteLifecycleTx:
    """The port's transaction over one connection already in a transaction."""

    def __init__(self, session: Session) -> None:
        self._s = session
        self.requests = SqliteRequestIds(session)
        self.tasks = SqliteTasks(session)
        self.events = SqliteEvents(session)
        self.propagations = SqlitePropagations(session)

    @classmethod
    def over(cls, db: sqlite3.Connection | Connection) -> SqliteLifecycleTx:
        return cls(Session(db))

    def load_figures(self) -> LifecycleFigures:
        return figures(self._s)


def figures(s: Session) -> LifecycleFigures:
    """The operator's gauges (LifecycleReadTx.load_figures), across the aggregates' tables."""
    (propagations,) = s.db.execute("SELECT count(*) FROM pending_propagations").fetchone()
    (request_ids,) = s.db.execute("SELECT count(*) FROM request_ids").fetchone()
    return LifecycleFigures(propagations, request_ids, s.database_bytes())


class SqliteLifecycleStore(Store[sqlite3.Connection, SqliteLifecycleTx, SqliteLifecycleTx]):
    """The lifecycle store on a SQLite file (funnel.runtime.store.Store)."""

    def __init__(self, engine: SqliteEngine) -> None:
        super().__init__(engine, SqliteLifecycleTx.over, SqliteLifecycleTx.over)
        self._sqlite = engine

    @classmethod
    async def open(
        cls, path: str, *, commits: CommitObserver | None = None, clock: Callable[[], float] = time.monotonic
    ) -> SqliteLifecycleStore:
        """Opens (creating and migrating if needed) the database, or raises StorageRefused."""
        return cls(await SqliteEngine.open(path, migrations_in(MIGRATIONS_PACKAGE), commits=commits, clock=clock))

    async def check_integrity(self) -> str | None:
        """The full integrity check (SqliteEngine.check_integrity)."""
        return await self._sqlite.check_integrity()


def _conforms(store: SqliteLifecycleStore) -> LifecycleStore:
    """Never called: makes mypy check the store and its transaction against the port."""
    return store
