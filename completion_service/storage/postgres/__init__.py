"""The PostgreSQL adapter of the completion store, for several replicas on one
database: `PostgresCompletionStore` runs units of work on
`funnel.runtime.postgres.PostgresDatabase` (one hop per transaction on a pooled
connection; a transaction that loses a race runs again from the start), in the
schema `funnel_completion`. `PostgresCompletionTx` is the SQLite adapter's
aggregates and row mapping (through `SqliteStyle`) over a session whose engine
hooks are this engine's (session.py); only runs, the outbox's claim, request ids
and staged imports have a module of their own here:

- Compare-and-set in the database, never in process memory. Every write that
  touches a task (claim, renew, close, attempt, evidence, settlement,
  transcript append, repair, import) first takes a transaction advisory lock of
  the task, at its first load of the task's state (lease, run, completion, tail,
  attempts, evidence), and loads the rows it will change `FOR UPDATE`. The task
  lock also covers rows that do not exist yet (the first lease of a task, the
  first transcript event, a generation's completion), which `FOR UPDATE` cannot
  lock: two replicas claiming one task at once give one lease, two attempts of
  one generation are judged one after the other (the duplicate policy and the
  circuit breaker's count of attempts hold across replicas). Locks are always
  taken in one order (request id, task, run row), so writers do not deadlock.
- A request id is held by a transaction advisory lock from its recall to the
  commit: the same id sent to two replicas at once is applied once, and the second
  transaction replays the first's remembered response.
- Completion event sequences and audit ids are numbered from the writing
  transaction's id (`funnel.runtime.postgres.OWN_POSITION`), so writers share no
  counter and never wait for one another's commit; a read by cursor across tasks
  returns only numbers below the horizon (`HORIZON`), which no running
  transaction can take, so it never skips a row committed late. A task's events
  are numbered under its lock, each above the task's last, so one task's events
  are in its commit order and a task's own listing needs no horizon. After a
  commit with events the store's `Announcer` NOTIFYs `funnel_completion_events`;
  every replica's `funnel.runtime.tail.Tailer` reads the table after it.
- The settlement outbox is claimed with `FOR UPDATE SKIP LOCKED` and a lease
  (claimed_by, claimed_until): replicas never settle the same row at once, and a
  row of a replica that stopped is taken over when its lease ends. The stall
  sweeper claims runs with `FOR UPDATE SKIP LOCKED` and closes them in the same
  transaction, so the row lock is its claim and each run is closed once; it
  closes only the runs whose task lock it gets at once (the others' tasks are
  being written, and the next sweep takes them), so it never waits on a task
  lock while holding a run row, the reverse of every other writer's order.
- Streamed imports are staged under an id qualified with this store's id, so a
  replica discards only its own staging (and debris older than a day).
- Caller free text is stored as UTF-8 BYTEA: TEXT cannot hold U+0000.

Fault points inside a unit (`completion.transcript_repair`) come after the unit's
last statement. A unit runs again only when a statement fails with a conflict
(and READ COMMITTED with immediate constraints does not fail a COMMIT that way),
so a fault point is reached at most once per write, as on SQLite."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg

from completion_service.core.model import CompletionEvent
from completion_service.storage.port import CompletionFigures, CompletionStore
from completion_service.storage.postgres.completions import PostgresCompletions
from completion_service.storage.postgres.requests import PostgresRequestIds
from completion_service.storage.postgres.runs import PostgresRuns
from completion_service.storage.postgres.session import PostgresSession
from completion_service.storage.postgres.transcripts import PostgresImports
from completion_service.storage.sqlite import figures, rows
from completion_service.storage.sqlite.events import SqliteEvents
from completion_service.storage.sqlite.evidence import SqliteEvidence
from completion_service.storage.sqlite.rows import EVENT_COLUMNS
from completion_service.storage.sqlite.transcripts import SqliteTranscripts
from funnel.runtime.postgres import HORIZON, Announcer, PostgresDatabase, tail_read
from funnel.runtime.sqlite import CommitObserver, migrations_in
from funnel.runtime.store import Store
from funnel.runtime.tail import TailRead

MIGRATIONS_PACKAGE = "completion_service.storage.migrations_postgresql"
SCHEMA = "funnel_completion"
# Sent by the store's Announcer after each commit with events, signed with the
# sender's instance (funnel.runtime.postgres).
EVENTS_CHANNEL = "funnel_completion_events"


class PostgresCompletionTx:
    """The port's transaction over one psycopg connection in a transaction: the
    SQLite adapter's aggregates, but where this engine's differ."""

    def __init__(self, session: PostgresSession) -> None:
        self._s = session
        self.requests = PostgresRequestIds(session)
        self.runs = PostgresRuns(session)
        self.evidence = SqliteEvidence(session)
        self.completions = PostgresCompletions(session)
        self.events = SqliteEvents(session)
        self.transcripts = SqliteTranscripts(session)
        self.imports = PostgresImports(session)

    def load_figures(self, now: int) -> CompletionFigures:
        return figures(self._s, now)


class PostgresCompletionStore(Store[psycopg.Connection[Any], PostgresCompletionTx, PostgresCompletionTx]):
    """The completion store on a PostgreSQL schema (funnel.runtime.store.Store), with
    the tail of its events for the watchers of every replica."""

    def __init__(self, database: PostgresDatabase) -> None:
        # Qualifies this store's staged imports (see postgres/transcripts.py).
        self.instance = uuid.uuid4().hex
        super().__init__(
            database,
            lambda conn: PostgresCompletionTx(PostgresSession(conn, writable=True, instance=self.instance)),
            lambda conn: PostgresCompletionTx(PostgresSession(conn, writable=False)),
        )
        self.database = database
        self.announcer = Announcer(database, EVENTS_CHANNEL)

    @classmethod
    async def open(
        cls, url: str, *, schema: str = SCHEMA, pool_size: int = 8, commits: CommitObserver | None = None
    ) -> PostgresCompletionStore:
        """Connects, creates the schema and applies its migrations (under the engine's
        advisory lock: replicas starting together apply each once), or raises StorageRefused."""
        database = await PostgresDatabase.open(
            url, schema, migrations_in(MIGRATIONS_PACKAGE), pool_size=pool_size, commits=commits
        )
        return cls(database)

    # -- the event tail (funnel.runtime.tail): every workspace, by sequence ----------

    async def latest_sequence(self) -> int:
        """The sequence of the last committed completion event (0 before the first)."""
        return await self.database.last_sequence("completion_events")

    async def events_since(self, after_sequence: int, limit: int) -> TailRead[CompletionEvent]:
        """Committed completion events of every workspace after `after_sequence`
        and below the horizon, by sequence, and whether any beyond wait for it."""

        def read(conn: psycopg.Connection[Any]) -> TailRead[CompletionEvent]:
            session = PostgresSession(conn, writable=False)
            found = session.db.execute(
                f"SELECT {EVENT_COLUMNS}, {HORIZON} FROM completion_events WHERE sequence > ? "
                "ORDER BY sequence LIMIT ?",
                (after_sequence, limit),
            ).fetchall()
            return tail_read(found, lambda r: rows.event(session, r))

        return await self.database.read(read, one_statement=True)

    def notifications(self, poll: float = 1.0) -> AsyncIterator[None]:
        """Wake-ups after completion events committed by any replica (and every `poll` seconds)."""
        return self.database.notifications(EVENTS_CHANNEL, poll)


def _conforms(store: PostgresCompletionStore) -> CompletionStore:
    """Never called: makes mypy check the store and its transaction against the port."""
    return store
