"""The SQLite adapter of the completion store: `SqliteCompletionStore` runs a unit
of work in one transaction, in one hop on the connection's own thread (with group
commit, see funnel.runtime.sqlite and funnel.runtime.store); `SqliteCompletionTx`
is the port's transaction over that connection, one object per aggregate, each in
its module (requests, runs, evidence, completions, events, transcripts), mapping
rows and nothing else through the shared row mapping (rows.py). What differs on
PostgreSQL, which runs the same statements, is in the session's hooks (session.py)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from completion_service.storage.port import CompletionFigures, CompletionStore
from completion_service.storage.sqlite.completions import SqliteCompletions
from completion_service.storage.sqlite.events import SqliteEvents
from completion_service.storage.sqlite.evidence import SqliteEvidence
from completion_service.storage.sqlite.requests import SqliteRequestIds
from completion_service.storage.sqlite.runs import SqliteRuns
from completion_service.storage.sqlite.session import Connection, Session
from completion_service.storage.sqlite.transcripts import SqliteImports, SqliteTranscripts
from funnel.runtime.sqlite import CommitObserver, SqliteEngine, migrations_in
from funnel.runtime.store import Store

MIGRATIONS_PACKAGE = "completion_service.storage.migrations"


class SqliteCompletionTx:
    """The port's transaction over one connection already in a transaction."""

    def __init__(self, session: Session) -> None:
        self._s = session
        self.requests = SqliteRequestIds(session)
        self.runs = SqliteRuns(session)
        self.evidence = SqliteEvidence(session)
        self.completions = SqliteCompletions(session)
        self.events = SqliteEvents(session)
        self.transcripts = SqliteTranscripts(session)
        self.imports = SqliteImports(session)

    @classmethod
    def over(cls, db: sqlite3.Connection | Connection) -> SqliteCompletionTx:
        return cls(Session(db))

    def load_figures(self, now: int) -> CompletionFigures:
        return figures(self._s, now)


def figures(s: Session, now: int) -> CompletionFigures:
    """The operator's gauges (CompletionReadTx.load_figures), across the aggregates' tables."""
    pending, oldest = s.db.execute(
        "SELECT count(*), min(committed_at) FROM task_completions WHERE settlement = 'PENDING'"
    ).fetchone()
    open_runs, live = s.db.execute(
        "SELECT count(*), coalesce(sum(CASE WHEN lease_expires_at > ? THEN 1 ELSE 0 END), 0) "
        "FROM agent_runs WHERE finished_at IS NULL",
        (now,),
    ).fetchone()
    (request_ids,) = s.db.execute("SELECT count(*) FROM request_ids").fetchone()
    return CompletionFigures(pending, oldest, open_runs, int(live), request_ids, s.database_bytes())


class SqliteCompletionStore(Store[sqlite3.Connection, SqliteCompletionTx, SqliteCompletionTx]):
    """The completion store on a SQLite file (funnel.runtime.store.Store)."""

    def __init__(self, engine: SqliteEngine) -> None:
        super().__init__(engine, SqliteCompletionTx.over, SqliteCompletionTx.over)
        self._sqlite = engine

    @classmethod
    async def open(
        cls, path: str, *, commits: CommitObserver | None = None, clock: Callable[[], float] = time.monotonic
    ) -> SqliteCompletionStore:
        return cls(await SqliteEngine.open(path, migrations_in(MIGRATIONS_PACKAGE), commits=commits, clock=clock))

    async def check_integrity(self) -> str | None:
        """The full integrity check (SqliteEngine.check_integrity)."""
        return await self._sqlite.check_integrity()


def _conforms(store: SqliteCompletionStore) -> CompletionStore:
    """Never called: makes mypy check the store and its transaction against the port."""
    return store
