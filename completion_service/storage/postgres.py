"""The PostgreSQL adapter of the completion store, for several replicas on one
database: `PostgresCompletionStore` runs units of work on
`funnel.runtime.postgres.PostgresDatabase` (one hop per transaction on a pooled
connection; a transaction that loses a race runs again from the start), in the
schema `funnel_completion`. `PostgresCompletionTx` is the SQLite adapter's row
mapping (through `SqliteStyle`) with only the engine hooks overridden:

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

import hashlib
import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any

import psycopg

from completion_service.core.model import (
    CompletionEvent,
    CompletionRecord,
    Decision,
    EvidenceRecord,
    Lease,
    RunRecord,
    decision_to_json,
)
from completion_service.core.transcript import SessionEvent
from completion_service.storage.port import (
    AttemptRecord,
    CompletionStore,
    CompletionTx,
    TranscriptState,
)
from completion_service.storage.sqlite import COMPLETION_COLUMNS, EVENT_COLUMNS, SqliteCompletionTx
from funnel.runtime.postgres import (
    HORIZON,
    OWN_POSITION,
    SCHEMA_BYTES,
    Announcer,
    PostgresDatabase,
    SqliteStyle,
    tail_read,
    task_number,
)
from funnel.runtime.sqlite import CommitObserver, migrations_in
from funnel.runtime.store import Store
from funnel.runtime.tail import TailRead

MIGRATIONS_PACKAGE = "completion_service.storage.migrations_postgresql"
SCHEMA = "funnel_completion"
# Sent by the event table's insert trigger (migrations_postgresql/0001_initial.sql).
EVENTS_CHANNEL = "funnel_completion_events"
# The first keys of the two-key advisory locks (the second is a hash of what is
# locked). Two-key locks never collide with one-key ones (the engine's migration
# lock), nor with the lifecycle service's ("lic") when both share a database.
TASK_LOCKS = 0x636D74  # "cmt"
REQUEST_ID_LOCKS = 0x636D72  # "cmr"
# The number of a task's next event, computed in its INSERT: no round trip of its own.
_EVENT_NUMBER = task_number("completion_events")
# Staged imports whose last batch is older than this are a vanished replica's debris.
STALE_IMPORT = "1 day"


class PostgresCompletionStore(Store[psycopg.Connection[Any], "PostgresCompletionTx", "PostgresCompletionTx"]):
    """The completion store on a PostgreSQL schema (funnel.runtime.store.Store), with
    the tail of its events for the watchers of every replica."""

    def __init__(self, database: PostgresDatabase) -> None:
        # Qualifies this store's staged imports (see PostgresCompletionTx.stage_import).
        self.instance = uuid.uuid4().hex
        super().__init__(
            database,
            lambda conn: PostgresCompletionTx(conn, writable=True, instance=self.instance),
            lambda conn: PostgresCompletionTx(conn, writable=False),
        )
        self._database = database
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

    @property
    def database(self) -> PostgresDatabase:
        return self._database

    # -- the event tail (funnel.runtime.tail): every workspace, by sequence ----------

    async def latest_sequence(self) -> int:
        """The sequence of the last committed completion event (0 before the first)."""
        return await self._database.last_sequence("completion_events")

    async def events_since(self, after_sequence: int, limit: int) -> TailRead[CompletionEvent]:
        """Committed completion events of every workspace after `after_sequence`
        and below the horizon, by sequence."""
        return await self._database.read(
            lambda conn: PostgresCompletionTx(conn, writable=False).all_events_after(after_sequence, limit)
        )

    def notifications(self, poll: float = 1.0) -> AsyncIterator[None]:
        """Wake-ups after completion events committed by any replica (and every `poll` seconds)."""
        return self._database.notifications(EVENTS_CHANNEL, poll)


class PostgresCompletionTx(SqliteCompletionTx):
    """The port's transaction API over one psycopg connection in a transaction."""

    def __init__(self, conn: psycopg.Connection[Any], *, writable: bool, instance: str = "") -> None:
        super().__init__(SqliteStyle(conn))
        self._writable = writable
        self._instance = instance
        self._locked_tasks: set[tuple[str, str]] = set()
        self._ordinal = 0  # rows this transaction has numbered

    # -- the engine hooks of the row mapping --------------------------------------

    def _locking(self) -> str:
        return " FOR UPDATE" if self._writable else ""

    def _skip_locked(self) -> str:
        return " FOR UPDATE SKIP LOCKED" if self._writable else ""

    def _database_bytes(self) -> int | None:
        (size,) = self._db.execute(SCHEMA_BYTES).fetchone()
        return int(size)

    def _number(self, log: str, workspace_id: str, task_id: str) -> tuple[str, tuple[object, ...]]:
        # The transaction's own position plus an ordinal (funnel.runtime.postgres);
        # an event also above the task's last (task_number), under the task's lock.
        ordinal = self._ordinal
        self._ordinal += 1
        if log != "completion_events":
            return f"{OWN_POSITION} + ?", (ordinal,)
        self._lock_task(workspace_id, task_id)
        return _EVENT_NUMBER, (ordinal, workspace_id, task_id)

    def _deliverable(self, column: str) -> str:
        return f" AND {column} < {HORIZON}"

    def _put_text(self, text: str | None) -> object:
        return None if text is None else text.encode("utf-8")

    def _get_text(self, stored: Any) -> Any:
        return None if stored is None else bytes(stored).decode("utf-8")

    def _put_decision(self, decision: Decision) -> object:
        # The column is JSON text; the server compresses large values itself (TOAST).
        return decision_to_json(decision)

    # -- the task lock: every write of a task's state holds it -----------------------

    def _lock_task(self, workspace_id: str, task_id: str) -> None:
        if not self._writable or (workspace_id, task_id) in self._locked_tasks:
            return
        self._db.execute("SELECT pg_advisory_xact_lock(?, ?)", (TASK_LOCKS, _lock_key(workspace_id, task_id)))
        self._locked_tasks.add((workspace_id, task_id))

    def _try_lock_task(self, workspace_id: str, task_id: str) -> bool:
        """Takes the task's lock if no other transaction holds it; never waits."""
        if (workspace_id, task_id) not in self._locked_tasks:
            (taken,) = self._db.execute(
                "SELECT pg_try_advisory_xact_lock(?, ?)", (TASK_LOCKS, _lock_key(workspace_id, task_id))
            ).fetchone()
            if not taken:
                return False
            self._locked_tasks.add((workspace_id, task_id))
        return True

    def claim_stalled_runs(self, expired_before: int, limit: int) -> list[RunRecord]:
        # The run rows come locked; of those, the runs whose task another writer
        # holds are left to the next sweep (see the module docstring).
        return [
            run
            for run in super().claim_stalled_runs(expired_before, limit)
            if self._try_lock_task(run.workspace_id, run.task_id)
        ]

    def load_run(self, workspace_id: str, run_id: str) -> RunRecord | None:
        if self._writable:
            # The task's lock comes before the run row's (one lock order for all writers).
            row = self._db.execute(
                "SELECT task_id FROM agent_runs WHERE workspace_id = ? AND run_id = ?", (workspace_id, run_id)
            ).fetchone()
            if row is None:
                return None
            self._lock_task(workspace_id, row[0])
        return super().load_run(workspace_id, run_id)

    def load_lease(self, workspace_id: str, task_id: str) -> Lease | None:
        self._lock_task(workspace_id, task_id)
        return super().load_lease(workspace_id, task_id)

    def load_evidence(self, workspace_id: str, task_id: str, generation: int) -> list[EvidenceRecord]:
        self._lock_task(workspace_id, task_id)
        return super().load_evidence(workspace_id, task_id, generation)

    def load_attempts(self, workspace_id: str, task_id: str, generation: int) -> list[AttemptRecord]:
        self._lock_task(workspace_id, task_id)
        return super().load_attempts(workspace_id, task_id, generation)

    def load_completion(self, workspace_id: str, task_id: str, generation: int) -> CompletionRecord | None:
        self._lock_task(workspace_id, task_id)
        return super().load_completion(workspace_id, task_id, generation)

    def load_tail(self, workspace_id: str, task_id: str) -> TranscriptState:
        self._lock_task(workspace_id, task_id)
        return super().load_tail(workspace_id, task_id)

    def load_checkpoints(self, workspace_id: str, task_id: str, ids: Collection[str]) -> dict[str, int]:
        self._lock_task(workspace_id, task_id)
        return super().load_checkpoints(workspace_id, task_id, ids)

    # -- request ids ---------------------------------------------------------------

    def recall_request(
        self, workspace_id: str, caller: str, method: str, request_id: str
    ) -> tuple[bytes, bytes] | None:
        if self._writable:
            # Held until this transaction ends; the SELECT that follows runs after the
            # wait, so it sees what a concurrent transaction with this id committed.
            self._db.execute(
                "SELECT pg_advisory_xact_lock(?, ?)",
                (REQUEST_ID_LOCKS, _lock_key(workspace_id, caller, method, request_id)),
            )
        found = super().recall_request(workspace_id, caller, method, request_id)
        return (bytes(found[0]), bytes(found[1])) if found else None

    # -- the settlement outbox ---------------------------------------------------------

    def claim_due_settlements(self, now: int, owner: str, lease_micros: int, limit: int) -> list[CompletionRecord]:
        # Rows locked by another transaction are skipped, not waited for; a claim
        # lasts until its lease runs out, and its owner may take its rows again.
        columns = ", ".join(f"c.{column}" for column in COMPLETION_COLUMNS.split(", "))
        rows = self._db.execute(
            "WITH due AS ("
            " SELECT workspace_id, task_id, generation FROM task_completions"
            " WHERE settlement = 'PENDING' AND next_settle_at <= ?"
            " AND (claimed_by IS NULL OR claimed_by = ? OR claimed_until <= ?)"
            " ORDER BY next_settle_at LIMIT ? FOR UPDATE SKIP LOCKED)"
            " UPDATE task_completions AS c SET claimed_by = ?, claimed_until = ? FROM due"
            " WHERE (c.workspace_id, c.task_id, c.generation) = (due.workspace_id, due.task_id, due.generation)"
            f" RETURNING c.next_settle_at, {columns}",
            (now, owner, now, limit, owner, now + lease_micros),
        ).fetchall()
        rows.sort(key=lambda r: (r[0], r[1], r[2], r[3]))
        return [self._completion(r[1:]) for r in rows]

    # -- events ---------------------------------------------------------------------

    def all_events_after(self, after_sequence: int, limit: int) -> TailRead[CompletionEvent]:
        """Every workspace's completion events after `after_sequence` and below the
        horizon, by sequence (for the tail), and whether any beyond wait for it."""
        rows = self._db.execute(
            f"SELECT {EVENT_COLUMNS}, {HORIZON} FROM completion_events WHERE sequence > ? ORDER BY sequence LIMIT ?",
            (after_sequence, limit),
        ).fetchall()
        return tail_read(rows, self._event)

    # -- staged imports: each store's own ------------------------------------------------

    def _staged(self, import_id: str) -> str:
        return f"{self._instance}/{import_id}"

    def stage_import(self, import_id: str, events: Sequence[SessionEvent]) -> None:
        super().stage_import(self._staged(import_id), events)

    def move_staged_import(self, import_id: str, workspace_id: str, task_id: str) -> None:
        super().move_staged_import(self._staged(import_id), workspace_id, task_id)

    def discard_import(self, import_id: str | None) -> None:
        if import_id is not None:
            super().discard_import(self._staged(import_id))
            return
        # Every import of this store, and those of replicas gone long ago; never
        # another live replica's import in flight.
        self._db.execute(
            "DELETE FROM transcript_staging WHERE starts_with(import_id, ?) OR import_id IN ("
            " SELECT import_id FROM transcript_staging GROUP BY import_id"
            f" HAVING max(staged_at) < now() - interval '{STALE_IMPORT}')",
            (self._staged(""),),
        )


def _lock_key(*scope: str) -> int:
    """A signed 32-bit hash of what is locked (a collision only makes two writers wait for each other)."""
    digest = hashlib.blake2b("\x1f".join(scope).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


def _conforms(store: PostgresCompletionStore, tx: PostgresCompletionTx) -> tuple[CompletionStore, CompletionTx]:
    """Never called: makes mypy check both classes against the port."""
    return store, tx
