"""The PostgreSQL adapter of the lifecycle store, for several replicas on one
database: `PostgresLifecycleStore` runs units of work on
`funnel.runtime.postgres.PostgresDatabase` (one hop per transaction on a pooled
connection; a transaction that loses a race runs again), in the schema
`funnel_lifecycle`. `PostgresLifecycleTx` is the SQLite adapter's row mapping
(through `SqliteStyle`) with what differs between the engines overridden:

- Compare-and-set in the database: the task a unit changes is loaded `FOR UPDATE`,
  its parent `FOR SHARE`, and `update_task` replaces only the loaded revision. Two
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

import dataclasses
import hashlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import psycopg

from funnel.auth.principal import Caller
from funnel.runtime.postgres import (
    HORIZON,
    SCHEMA_BYTES,
    Announcer,
    PostgresDatabase,
    SqliteStyle,
    last_deliverable,
    tail_read,
    task_number,
)
from funnel.runtime.sqlite import CommitObserver, migrations_in
from funnel.runtime.store import Store
from funnel.runtime.tail import TailRead
from lifecycle_service.core.model import LifecycleEvent, TaskRecord
from lifecycle_service.storage.port import LifecycleStore, LifecycleTx, PendingPropagation
from lifecycle_service.storage.sqlite import (
    CAUSE_TEXT_COLUMNS,
    CAUSE_TEXT_VALUES,
    EVENT_COLUMNS,
    EVENT_VALUES,
    EVENTS,
    PROPAGATION_COLUMNS,
    SqliteLifecycleTx,
    propagation_from_row,
)

MIGRATIONS_PACKAGE = "lifecycle_service.storage.migrations_postgresql"
SCHEMA = "funnel_lifecycle"
# Sent by the event table's insert trigger (migrations_postgresql/0001_initial.sql).
EVENTS_CHANNEL = "funnel_lifecycle_events"
# The first key of the two-key advisory locks that hold request ids (the second is
# a hash of the id's scope). Two-key locks never collide with one-key ones, such as
# the engine's migration lock.
REQUEST_ID_LOCKS = 0x6C6963  # "lic"

# Callers' numbers a store remembers at most; past it, it starts again (a lookup each).
CALLERS_KEPT = 10_000
# The number (see PostgresLifecycleTx.append_event) is computed in the INSERT: one round trip.
_INSERT_EVENT = (
    f"INSERT INTO lifecycle_events (sequence, {EVENT_VALUES}) "
    f"VALUES ({task_number('lifecycle_events')}, {', '.join(['?'] * 21)}) RETURNING sequence"
)


class PostgresLifecycleStore(Store[psycopg.Connection[Any], "PostgresLifecycleTx", "PostgresLifecycleTx"]):
    """The lifecycle store on a PostgreSQL schema (funnel.runtime.store.Store), with
    the tail of its events for the watchers of every replica."""

    def __init__(self, database: PostgresDatabase) -> None:
        # Callers' numbers (the callers table), each known committed: a number never
        # changes once made, so an event of a known caller needs no lookup.
        self._callers: dict[Caller, int] = {}
        super().__init__(
            database,
            lambda conn: PostgresLifecycleTx(conn, writable=True, callers=self._callers),
            lambda conn: PostgresLifecycleTx(conn, writable=False),
            committed=self._learn_callers,
        )
        self._database = database
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
        self._callers.update(committed.callers_seen)

    # -- the event tail (funnel.runtime.tail): every workspace, by sequence ----------

    async def latest_sequence(self) -> int:
        """The sequence of the last committed event (0 before the first)."""
        return await self._database.last_sequence("lifecycle_events")

    async def events_since(self, after_sequence: int, limit: int) -> TailRead[LifecycleEvent]:
        """Committed events of every workspace after `after_sequence` and below the horizon, by sequence."""
        return await self._database.read(
            lambda conn: PostgresLifecycleTx(conn, writable=False).all_events_after(after_sequence, limit)
        )

    def notifications(self, poll: float = 1.0) -> AsyncIterator[None]:
        """Wake-ups after events committed by any replica (and every `poll` seconds)."""
        return self._database.notifications(EVENTS_CHANNEL, poll)


class PostgresLifecycleTx(SqliteLifecycleTx):
    """The port's transaction API over one psycopg connection in a transaction."""

    _TASKS_BY_PARENT = "tasks"

    def __init__(
        self, conn: psycopg.Connection[Any], *, writable: bool, callers: Mapping[Caller, int] | None = None
    ) -> None:
        super().__init__(SqliteStyle(conn))
        self._writable = writable
        self._ordinal = 0  # events this transaction has numbered
        self._known_callers = callers or {}
        # The callers' numbers this transaction used: known committed once it is.
        self.callers_seen: dict[Caller, int] = {}

    # -- row locks -------------------------------------------------------------

    def load_task(self, workspace_id: str, task_id: str) -> TaskRecord | None:
        return self._load(workspace_id, task_id, " FOR UPDATE" if self._writable else "")

    def load_parent(self, workspace_id: str, task_id: str) -> TaskRecord | None:
        return self._load(workspace_id, task_id, " FOR SHARE" if self._writable else "")

    def _database_bytes(self) -> int | None:
        (size,) = self._db.execute(SCHEMA_BYTES).fetchone()
        return int(size)

    # -- events ------------------------------------------------------------------

    def append_event(self, event: LifecycleEvent) -> LifecycleEvent:
        # Numbered in its INSERT (funnel.runtime.postgres.task_number): the task's row
        # is locked FOR UPDATE (or inserted) by this transaction.
        values = self._event_values(event)
        (sequence,) = self._db.execute(
            _INSERT_EVENT, (self._ordinal, event.workspace_id, event.task_id, *values)
        ).fetchone()
        self._ordinal += 1
        return dataclasses.replace(event, sequence=sequence)

    def _deliverable(self, column: str) -> str:
        return f" AND {column} < {HORIZON}"

    def last_sequence(self) -> int:
        return last_deliverable(self._db, "lifecycle_events")

    def _caller_id(self, caller: Caller) -> int:
        known = self._known_callers.get(caller)
        if known is None:
            known = self.callers_seen[caller] = super()._caller_id(caller)
        return known

    def _event_values(self, event: LifecycleEvent) -> tuple[Any, ...]:
        values = list(super()._event_values(event))
        for position in CAUSE_TEXT_VALUES:
            values[position] = values[position].encode()
        return tuple(values)

    def _event(self, row: Sequence[Any]) -> LifecycleEvent:
        values = list(row)
        for position in CAUSE_TEXT_COLUMNS:
            values[position] = bytes(values[position]).decode()
        return super()._event(values)

    def all_events_after(self, after_sequence: int, limit: int) -> TailRead[LifecycleEvent]:
        """Every workspace's events after `after_sequence` and below the horizon, by
        sequence (for the tail), and whether any beyond wait for it."""
        rows = self._db.execute(
            f"SELECT {EVENT_COLUMNS}, {HORIZON} FROM {EVENTS} WHERE sequence > ? ORDER BY sequence LIMIT ?",
            (after_sequence, limit),
        ).fetchall()
        return tail_read(rows, self._event)

    # -- propagations ----------------------------------------------------------

    def claim_propagations(self, now: int, owner: str, lease_micros: int, limit: int) -> list[PendingPropagation]:
        # Rows locked by a concurrent claim are skipped, not waited for; a claim
        # lasts until its lease runs out, and its owner gets its rows back.
        rows = self._db.execute(
            "WITH claimable AS ("
            " SELECT id FROM pending_propagations"
            " WHERE claimed_by IS NULL OR claimed_by = ? OR claimed_until <= ?"
            " ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED)"
            " UPDATE pending_propagations AS p SET claimed_by = ?, claimed_until = ?"
            " FROM claimable WHERE p.id = claimable.id"
            f" RETURNING {', '.join('p.' + column for column in PROPAGATION_COLUMNS.split(', '))}",
            (owner, now, limit, owner, now + lease_micros),
        )
        return sorted((propagation_from_row(r) for r in rows), key=lambda p: p.id)

    # -- request ids -------------------------------------------------------------

    def recall_request(
        self, workspace_id: str, caller: str, method: str, request_id: str
    ) -> tuple[bytes, bytes] | None:
        # Held until this transaction ends; the SELECT that follows runs after the
        # wait, so it sees what a concurrent transaction with this id committed.
        self._db.execute(
            "SELECT pg_advisory_xact_lock(?, ?)",
            (REQUEST_ID_LOCKS, _lock_key(workspace_id, caller, method, request_id)),
        )
        found = super().recall_request(workspace_id, caller, method, request_id)
        return (bytes(found[0]), bytes(found[1])) if found else None

    def forget_requests(self, created_before: int, limit: int) -> int:
        return int(
            self._db.execute(
                "DELETE FROM request_ids WHERE (workspace_id, caller, method, request_id) IN "
                "(SELECT workspace_id, caller, method, request_id FROM request_ids WHERE created_at < ? "
                "ORDER BY created_at LIMIT ? FOR UPDATE SKIP LOCKED)",
                (created_before, limit),
            ).rowcount
        )


def _lock_key(*scope: str) -> int:
    """A signed 32-bit hash of a request id's scope (a collision only makes two ids wait for each other)."""
    digest = hashlib.blake2b("\x1f".join(scope).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


def _conforms(store: PostgresLifecycleStore, tx: PostgresLifecycleTx) -> tuple[LifecycleStore, LifecycleTx]:
    """Never called: makes mypy check both classes against the port."""
    return store, tx
