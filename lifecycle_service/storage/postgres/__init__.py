"""The PostgreSQL adapter of the lifecycle store, for several replicas on one
database: `PostgresLifecycleStore` runs units of work on
`funnel.runtime.postgres.PostgresDatabase` (one hop per transaction on a pooled
connection; a transaction that loses a race runs again), in the schema
`funnel_lifecycle`. `PostgresLifecycleTx` is the SQLite adapter's aggregates and
row mapping (through `SqliteStyle`) over a session whose hooks are this engine's
(session.py), with what else differs in a module per aggregate:

- Compare-and-set in the database: the task a unit changes is loaded `FOR UPDATE`,
  its parent `FOR SHARE`, and `tasks.update` replaces only the loaded revision. Two
  registers of one task race on the primary key; the loser is rerun by the engine
  and finds the task (TASK_ALREADY_EXISTS).
- Event sequences are numbered from the writing transaction's id
  (`funnel.runtime.postgres.OWN_POSITION`), so writers share no counter and never
  wait for one another's commit; a read by cursor across tasks returns only
  numbers below the horizon (`HORIZON`), which no running transaction can take,
  so it never skips an event committed late. An event is numbered under its
  task's row lock, above the task's last, so a task's history is in its commit
  order. After a commit with events the store's `Announcer` NOTIFYs
  `funnel_lifecycle_events` for the other replicas' tails.
- A request id is held by a transaction-scoped advisory lock from its recall to
  the commit: the same id sent to two replicas at once is applied once, and the
  second transaction replays the first's remembered response.
- Pending propagations are claimed with `FOR UPDATE SKIP LOCKED` and a lease
  (claimed_by, claimed_until), so replicas replaying them never take the same rows.
- The caller's free text (cause source and reason) is stored as UTF-8 BYTEA: TEXT
  cannot hold U+0000, which the contract accepts there."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import psycopg

from funnel.auth.principal import Caller
from funnel.runtime.postgres import HORIZON, Announcer, PostgresDatabase, tail_read
from funnel.runtime.sqlite import CommitObserver, migrations_in
from funnel.runtime.store import Store
from funnel.runtime.tail import TailRead
from lifecycle_service.core.model import LifecycleEvent
from lifecycle_service.storage.port import LifecycleFigures, LifecycleStore
from lifecycle_service.storage.postgres.events import PostgresEvents
from lifecycle_service.storage.postgres.propagations import PostgresPropagations
from lifecycle_service.storage.postgres.requests import PostgresRequestIds
from lifecycle_service.storage.postgres.session import PostgresSession
from lifecycle_service.storage.sqlite import figures, rows
from lifecycle_service.storage.sqlite.rows import EVENT_COLUMNS, EVENTS
from lifecycle_service.storage.sqlite.tasks import SqliteTasks

MIGRATIONS_PACKAGE = "lifecycle_service.storage.migrations_postgresql"
SCHEMA = "funnel_lifecycle"
# Sent by the store's Announcer after each commit with events, signed with the
# sender's instance (funnel.runtime.postgres).
EVENTS_CHANNEL = "funnel_lifecycle_events"
# Callers' numbers a store remembers at most; past it, it starts again (a lookup each).
CALLERS_KEPT = 10_000


class PostgresLifecycleTx:
    """The port's transaction over one psycopg connection in a transaction: the
    SQLite adapter's aggregates, but where this engine's differ."""

    def __init__(self, session: PostgresSession, callers: Mapping[Caller, int] | None = None) -> None:
        self._s = session
        self.requests = PostgresRequestIds(session)
        self.tasks = SqliteTasks(session)
        self.events = PostgresEvents(session, callers)
        self.propagations = PostgresPropagations(session)

    def load_figures(self) -> LifecycleFigures:
        return figures(self._s)


class PostgresLifecycleStore(Store[psycopg.Connection[Any], PostgresLifecycleTx, PostgresLifecycleTx]):
    """The lifecycle store on a PostgreSQL schema (funnel.runtime.store.Store), with
    the tail of its events for the watchers of every replica."""

    def __init__(self, database: PostgresDatabase) -> None:
        # Callers' numbers (the callers table), each known committed: a number never
        # changes once made, so an event of a known caller needs no lookup.
        self._callers: dict[Caller, int] = {}
        super().__init__(
            database,
            lambda conn: PostgresLifecycleTx(PostgresSession(conn, writable=True), self._callers),
            lambda conn: PostgresLifecycleTx(PostgresSession(conn, writable=False)),
            committed=self._learn_callers,
        )
        self.database = database
        self.announcer = Announcer(database, EVENTS_CHANNEL)

    @classmethod
    async def open(
        cls, url: str, *, schema: str = SCHEMA, pool_size: int = 8, commits: CommitObserver | None = None
    ) -> PostgresLifecycleStore:
        """Connects, creates the schema and applies its migrations (under the engine's
        advisory lock: replicas starting together apply each once), or raises StorageRefused."""
        database = await PostgresDatabase.open(
            url, schema, migrations_in(MIGRATIONS_PACKAGE), pool_size=pool_size, commits=commits
        )
        return cls(database)

    def _learn_callers(self, committed: PostgresLifecycleTx) -> None:
        if len(self._callers) > CALLERS_KEPT:  # callers may come and go (one per agent, say)
            self._callers.clear()
        self._callers.update(committed.events.callers_seen)

    # -- the event tail (funnel.runtime.tail): every workspace, by sequence ----------

    async def latest_sequence(self) -> int:
        """The sequence of the last committed event (0 before the first)."""
        return await self.database.last_sequence("lifecycle_events")

    async def events_since(self, after_sequence: int, limit: int) -> TailRead[LifecycleEvent]:
        """Committed events of every workspace after `after_sequence` and below the
        horizon, by sequence, and whether any beyond wait for it."""

        def read(conn: psycopg.Connection[Any]) -> TailRead[LifecycleEvent]:
            session = PostgresSession(conn, writable=False)
            found = session.db.execute(
                f"SELECT {EVENT_COLUMNS}, {HORIZON} FROM {EVENTS} WHERE sequence > ? ORDER BY sequence LIMIT ?",
                (after_sequence, limit),
            ).fetchall()
            return tail_read(found, lambda r: rows.event(session, r))

        return await self.database.read(read, one_statement=True)

    def notifications(self, poll: float = 1.0) -> AsyncIterator[None]:
        """Wake-ups after events committed by any replica (and every `poll` seconds)."""
        return self.database.notifications(EVENTS_CHANNEL, poll)


def _conforms(store: PostgresLifecycleStore) -> LifecycleStore:
    """Never called: makes mypy check the store and its transaction against the port."""
    return store
