"""The SQLite adapter of the lifecycle store: `SqliteLifecycleStore` runs units of
work on `funnel.runtime.sqlite.SqliteEngine` (one hop per transaction, group commit);
`SqliteLifecycleTx` maps rows and nothing else. The PostgreSQL adapter
(`storage.postgres`) runs the same row mapping through `SqliteStyle` and
overrides only what differs between the engines."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Sequence
from typing import Any, Protocol, cast

from funnel.auth.principal import Caller
from funnel.runtime.idempotency import RequestKey
from funnel.runtime.sqlite import CommitObserver, SqliteEngine, database_bytes, migrations_in
from funnel.runtime.store import Store
from lifecycle_service.core.model import (
    SETTABLE_WORK_STATUSES,
    Cause,
    ChildRef,
    GenerationState,
    IntentKind,
    LifecycleEvent,
    LinkMode,
    Outcome,
    ParentLink,
    Propagation,
    TaskRecord,
    WorkStatus,
)
from lifecycle_service.storage.port import (
    InvariantViolated,
    LifecycleFigures,
    LifecycleStore,
    LifecycleTx,
    PendingPropagation,
    TaskCount,
    TaskQuery,
)

MIGRATIONS_PACKAGE = "lifecycle_service.storage.migrations"

_TASK_COLUMNS = (
    "workspace_id, task_id, generation, revision, state, outcome, cancellation_requested_at, work_status, "
    "parent_task_id, parent_generation, parent_mode, completion_id, created_at, updated_at"
)
_TASK_COLUMNS_OF_T = ", ".join(f"t.{column.strip()}" for column in _TASK_COLUMNS.split(","))
_EVENT_FIELDS = (
    "workspace_id, task_id, generation, revision, intent, from_state, to_state, outcome, "
    "cancellation_requested_at, work_status, cause_source, cause_reason, cause_originating_ids, "
    "completion_id, authoritative_at, committed_at, request_id, {caller}, parent_task_id, parent_generation, "
    "parent_mode"
)
# An event names its caller by number (callers holds each subject and role once);
# events written before migration 0006 carry the text in their own row instead.
EVENT_VALUES = _EVENT_FIELDS.format(caller="caller_id")
EVENT_COLUMNS = "sequence, " + _EVENT_FIELDS.format(
    caller="COALESCE(callers.subject, caller_subject), COALESCE(callers.role, caller_role)"
)
EVENTS = "lifecycle_events LEFT JOIN callers USING (caller_id)"
# The caller's free text (cause source and reason): positions in _event_values and in a row.
CAUSE_TEXT_VALUES = (10, 11)
CAUSE_TEXT_COLUMNS = (11, 12)
INSERT_EVENT = f"INSERT INTO lifecycle_events ({EVENT_VALUES}) VALUES ({', '.join(['?'] * 21)})"
PROPAGATION_COLUMNS = (
    "id, workspace_id, parent_task_id, parent_generation, parent_sequence, child_task_id, child_generation, intent"
)


class Connection(Protocol):
    """What the row mapping needs of a connection: `sqlite3.Connection`, or a
    psycopg connection in `funnel.runtime.postgres.SqliteStyle`."""

    def execute(self, sql: str, params: Any = (), /) -> Any: ...

    def executemany(self, sql: str, rows: Any, /) -> Any: ...


class SqliteLifecycleStore(Store[sqlite3.Connection, "SqliteLifecycleTx", "SqliteLifecycleTx"]):
    """The lifecycle store on a SQLite file (funnel.runtime.store.Store)."""

    def __init__(self, engine: SqliteEngine) -> None:
        super().__init__(engine, SqliteLifecycleTx, SqliteLifecycleTx)
        self._sqlite = engine

    @classmethod
    async def open(cls, path: str, *, commits: CommitObserver | None = None) -> SqliteLifecycleStore:
        """Opens (creating and migrating if needed) the database, or raises StorageRefused."""
        return cls(await SqliteEngine.open(path, migrations_in(MIGRATIONS_PACKAGE), commits=commits))

    async def check_integrity(self) -> str | None:
        """The full integrity check (SqliteEngine.check_integrity)."""
        return await self._sqlite.check_integrity()


class SqliteLifecycleTx:
    """The port's transaction API over one connection already in a transaction
    (`sqlite3.Connection`; for the PostgreSQL subclass, a `SqliteStyle` one)."""

    # INDEXED BY: without statistics SQLite's planner prefers walking the whole
    # workspace by primary key (measured: 30% of the service's CPU at 6k tasks).
    _TASKS_BY_PARENT = "tasks INDEXED BY tasks_by_parent"

    def __init__(self, db: sqlite3.Connection | Connection) -> None:
        self._db: Connection = db

    # -- reads -------------------------------------------------------------

    def load_task(self, workspace_id: str, task_id: str) -> TaskRecord | None:
        # No row locks: BEGIN IMMEDIATE holds the database's write lock already.
        return self._load(workspace_id, task_id, "")

    def load_parent(self, workspace_id: str, task_id: str) -> TaskRecord | None:
        return self._load(workspace_id, task_id, "")

    def _load(self, workspace_id: str, task_id: str, lock: str) -> TaskRecord | None:
        row = self._db.execute(
            f"SELECT {_TASK_COLUMNS} FROM tasks WHERE workspace_id = ? AND task_id = ?{lock}", (workspace_id, task_id)
        ).fetchone()
        return _task_from_row(row) if row else None

    def open_attached_children(self, task: TaskRecord, limit: int | None = None) -> tuple[ChildRef, ...]:
        sql = (
            f"SELECT task_id, generation FROM {self._TASKS_BY_PARENT} "
            "WHERE workspace_id = ? AND parent_task_id = ? AND parent_generation = ? "
            "AND parent_mode = 'ATTACHED' AND state != 'TERMINAL' ORDER BY task_id"
        )
        params: tuple[str | int, ...] = (task.workspace_id, task.task_id, task.generation)
        if limit is not None:
            sql += " LIMIT ?"
            params += (limit,)
        return tuple(ChildRef(r[0], r[1]) for r in self._db.execute(sql, params))

    def terminal_event(self, task: TaskRecord) -> LifecycleEvent:
        row = self._db.execute(
            f"SELECT {EVENT_COLUMNS} FROM {EVENTS} WHERE workspace_id = ? AND task_id = ? "
            "AND generation = ? AND to_state = 'TERMINAL' ORDER BY sequence LIMIT 1",
            (task.workspace_id, task.task_id, task.generation),
        ).fetchone()
        if row is None:
            raise InvariantViolated(f"terminal task {task.task_id!r} has no terminal event")
        return self._event(row)

    def list_tasks(self, workspace_id: str, query: TaskQuery, after_task_id: str, limit: int) -> list[TaskRecord]:
        terms, params = _task_terms(query, "")
        sql = (
            f"SELECT {_TASK_COLUMNS} FROM tasks WHERE workspace_id = ? AND task_id > ?{terms} ORDER BY task_id LIMIT ?"
        )
        return [_task_from_row(r) for r in self._db.execute(sql, [workspace_id, after_task_id, *params, limit])]

    def list_tasks_by_change(
        self, workspace_id: str, query: TaskQuery, before_sequence: int | None, limit: int
    ) -> list[tuple[int, TaskRecord]]:
        terms, params = _task_terms(query, "t.")
        # CROSS JOIN: SQLite keeps this join order (the history newest first, each
        # event's task by its key); a task is listed at its latest event only.
        sql = (
            f"SELECT e.sequence, {_TASK_COLUMNS_OF_T} FROM lifecycle_events e CROSS JOIN tasks t "
            "WHERE e.workspace_id = ? AND e.sequence < ? AND t.workspace_id = e.workspace_id "
            f"AND t.task_id = e.task_id AND t.revision = e.revision{terms} ORDER BY e.sequence DESC LIMIT ?"
        )
        before = before_sequence if before_sequence is not None else MAX_SEQUENCE
        rows = self._db.execute(sql, [workspace_id, before, *params, limit])
        return [(r[0], _task_from_row(r[1:])) for r in rows]

    def count_tasks(self, workspace_id: str) -> list[TaskCount]:
        rows = self._db.execute(
            "SELECT state, outcome, work_status, COUNT(*) FROM tasks WHERE workspace_id = ? "
            "GROUP BY state, outcome, work_status",
            (workspace_id,),
        )
        counts = [
            TaskCount(GenerationState[r[0]], Outcome[r[1]] if r[1] else None, WorkStatus[r[2]], r[3]) for r in rows
        ]
        return sorted(counts, key=_count_order)

    def list_events(self, workspace_id: str, task_id: str, after_revision: int, limit: int) -> list[LifecycleEvent]:
        sql = (
            f"SELECT {EVENT_COLUMNS} FROM {EVENTS} WHERE workspace_id = ? AND task_id = ? AND revision > ? "
            "ORDER BY revision LIMIT ?"
        )
        return [self._event(r) for r in self._db.execute(sql, (workspace_id, task_id, after_revision, limit))]

    def events_after(
        self, workspace_id: str, after_sequence: int, task_id: str | None, limit: int
    ) -> list[LifecycleEvent]:
        if task_id:
            sql = (
                f"SELECT {EVENT_COLUMNS} FROM {EVENTS} WHERE workspace_id = ? AND task_id = ? "
                "AND sequence > ? ORDER BY sequence LIMIT ?"
            )
            params: tuple[str | int, ...] = (workspace_id, task_id, after_sequence, limit)
        else:
            sql = (
                f"SELECT {EVENT_COLUMNS} FROM {EVENTS} WHERE workspace_id = ? AND sequence > ?"
                f"{self._deliverable('sequence')} ORDER BY sequence LIMIT ?"
            )
            params = (workspace_id, after_sequence, limit)
        return [self._event(r) for r in self._db.execute(sql, params)]

    def last_sequence(self) -> int:
        return cast(int, self._db.execute("SELECT COALESCE(MAX(sequence), 0) FROM lifecycle_events").fetchone()[0])

    def _deliverable(self, column: str) -> str:
        """The condition (` AND …`) a read by cursor across tasks adds so that it
        returns no event a later commit could still number below; none here: the
        writer holds the database's write lock to its commit, so events are
        numbered in commit order (PostgresLifecycleTx overrides it)."""
        return ""

    def _event(self, row: Sequence[Any]) -> LifecycleEvent:
        return _event_from_row(row)

    # -- records and events --------------------------------------------------

    def insert_task(self, task: TaskRecord) -> None:
        self._db.execute(
            "INSERT INTO tasks (generation, revision, state, outcome, cancellation_requested_at, work_status, "
            "parent_task_id, parent_generation, parent_mode, completion_id, created_at, updated_at, workspace_id, "
            "task_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            _task_values(task),
        )

    def update_task(self, task: TaskRecord) -> None:
        updated = self._db.execute(
            "UPDATE tasks SET generation = ?, revision = ?, state = ?, outcome = ?, cancellation_requested_at = ?, "
            "work_status = ?, parent_task_id = ?, parent_generation = ?, parent_mode = ?, completion_id = ?, "
            "created_at = ?, updated_at = ? WHERE workspace_id = ? AND task_id = ? AND revision = ?",
            _task_values(task) + (task.revision - 1,),
        ).rowcount
        if updated != 1:
            raise InvariantViolated(f"task {task.task_id!r} changed under its write lock")

    def append_event(self, event: LifecycleEvent) -> LifecycleEvent:
        # AUTOINCREMENT: the writer holds the database's write lock until it commits.
        cursor = self._db.execute(INSERT_EVENT, self._event_values(event))
        assert cursor.lastrowid is not None, "an INSERT sets lastrowid"
        return dataclasses.replace(event, sequence=cursor.lastrowid)

    # Any, not the columns' types: PostgresLifecycleTx encodes the cause's text values.
    def _event_values(self, event: LifecycleEvent) -> tuple[Any, ...]:
        return _event_values(event, self._caller_id(event.caller))

    def _caller_id(self, caller: Caller) -> int:
        """The caller's number, made with its first event. Read first: after that
        first event, a caller costs one indexed lookup and no write."""
        find = "SELECT caller_id FROM callers WHERE subject = ? AND role = ?"
        row = self._db.execute(find, (caller.subject, caller.role)).fetchone()
        if row is None:
            # Two first events of one caller at once (replicas on PostgreSQL): the
            # second's insert waits for the first's to commit, then does nothing
            # and finds its row (or, if that rolled back, makes it).
            self._db.execute(
                "INSERT INTO callers (subject, role) VALUES (?, ?) ON CONFLICT (subject, role) DO NOTHING",
                (caller.subject, caller.role),
            )
            row = self._db.execute(find, (caller.subject, caller.role)).fetchone()
        return int(row[0])

    # -- propagations ----------------------------------------------------------

    def insert_propagations(
        self, parent_event: LifecycleEvent, propagations: Sequence[Propagation], created_at: int
    ) -> None:
        self._db.executemany(
            "INSERT INTO pending_propagations (workspace_id, parent_task_id, parent_generation, parent_sequence, "
            "child_task_id, child_generation, intent, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    parent_event.workspace_id,
                    parent_event.task_id,
                    parent_event.generation,
                    parent_event.sequence,
                    propagation.child.task_id,
                    propagation.child.generation,
                    propagation.intent.name,
                    created_at,
                )
                for propagation in propagations
            ],
        )

    def discharge_propagation(self, propagation_id: int) -> bool:
        deleted = self._db.execute("DELETE FROM pending_propagations WHERE id = ?", (propagation_id,))
        return cast(int, deleted.rowcount) == 1

    def claim_propagations(self, now: int, owner: str, lease_micros: int, limit: int) -> list[PendingPropagation]:
        # One process owns the file: no claim is recorded (see the port).
        rows = self._db.execute(f"SELECT {PROPAGATION_COLUMNS} FROM pending_propagations ORDER BY id LIMIT ?", (limit,))
        return [propagation_from_row(r) for r in rows]

    def load_figures(self) -> LifecycleFigures:
        (propagations,) = self._db.execute("SELECT count(*) FROM pending_propagations").fetchone()
        (request_ids,) = self._db.execute("SELECT count(*) FROM request_ids").fetchone()
        return LifecycleFigures(propagations, request_ids, self._database_bytes())

    def _database_bytes(self) -> int | None:
        return database_bytes(self._db)

    # -- request ids -------------------------------------------------------------

    def recall_request(
        self, workspace_id: str, caller: str, method: str, request_id: str
    ) -> tuple[bytes, bytes] | None:
        row = self._db.execute(
            "SELECT fingerprint, response FROM request_ids "
            "WHERE workspace_id = ? AND caller = ? AND method = ? AND request_id = ?",
            (workspace_id, caller, method, request_id),
        ).fetchone()
        return (row[0], row[1]) if row else None

    def remember_request(self, key: RequestKey, response: bytes, created_at: int) -> None:
        self._db.execute(
            "INSERT INTO request_ids (workspace_id, caller, method, request_id, fingerprint, response, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (key.workspace_id, key.caller, key.method, key.request_id, key.fingerprint, response, created_at),
        )

    def forget_requests(self, created_before: int, limit: int) -> int:
        forgotten = self._db.execute(
            "DELETE FROM request_ids WHERE rowid IN "
            "(SELECT rowid FROM request_ids WHERE created_at < ? ORDER BY created_at LIMIT ?)",
            (created_before, limit),
        )
        return cast(int, forgotten.rowcount)


def _conforms(store: SqliteLifecycleStore, tx: SqliteLifecycleTx) -> tuple[LifecycleStore, LifecycleTx]:
    """Never called: makes mypy check both classes against the port."""
    return store, tx


def _event_values(event: LifecycleEvent, caller_id: int) -> tuple[Any, ...]:
    """Values for the columns of INSERT_EVENT (the event's fields but its sequence)."""
    return (
        event.workspace_id,
        event.task_id,
        event.generation,
        event.revision,
        event.intent.name,
        event.from_state.name if event.from_state else None,
        event.to_state.name,
        event.outcome.name if event.outcome else None,
        event.cancellation_requested_at,
        event.work_status.name,
        event.cause.source,
        event.cause.reason,
        json.dumps(dict(event.cause.originating_ids), sort_keys=True, ensure_ascii=False),
        event.completion_id,
        event.authoritative_at,
        event.committed_at,
        event.request_id,
        caller_id,
        *_link_values(event.parent),
    )


def _link_values(link: ParentLink | None) -> tuple[str, int, str] | tuple[None, None, None]:
    return (link.task_id, link.generation, link.mode.name) if link else (None, None, None)


def _link_from(r: Sequence[Any]) -> ParentLink | None:
    """A parent link from its three columns (task, generation, mode)."""
    return ParentLink(r[0], r[1], LinkMode[r[2]]) if r[0] else None


def propagation_from_row(r: Sequence[Any]) -> PendingPropagation:
    return PendingPropagation(r[0], r[1], r[2], r[3], r[4], ChildRef(r[5], r[6]), IntentKind[r[7]])


def _task_values(task: TaskRecord) -> tuple[str | int | None, ...]:
    """Values for the columns of insert_task and update_task, keys last."""
    parent = task.parent
    return (
        task.generation,
        task.revision,
        task.state.name,
        task.outcome.name if task.outcome else None,
        task.cancellation_requested_at,
        task.work_status.name,
        parent.task_id if parent else None,
        parent.generation if parent else None,
        parent.mode.name if parent else None,
        task.completion_id,
        task.created_at,
        task.updated_at,
        task.workspace_id,
        task.task_id,
    )


# What the partial indexes of migration 0007 hold: a query names the condition
# itself, so that SQLite (which matches it as written) may use the index.
_OPEN_STATE = "{t}state != 'TERMINAL'"
_OPEN_WORK = "{t}work_status IN ('READY', 'IN_PROGRESS', 'BLOCKED')"
_ABNORMAL_END = "{t}outcome IN ('CANCELLED', 'FAILED', 'TIMED_OUT')"
# Greater than any id's code points (ids have no U+10FFFF): the end of a prefix's range.
_PREFIX_END = "\U0010ffff"
# Greater than any sequence an event can have (integer inputs stay below 2^53).
MAX_SEQUENCE = 2**63 - 1


def _task_terms(query: TaskQuery, t: str) -> tuple[str, list[object]]:
    """The query's filters as " AND ..." terms on the tasks columns (prefixed `t`)."""
    terms: list[str] = []
    params: list[object] = []
    if query.parent_task_id is not None:
        terms.append(f"{t}parent_task_id = ?")
        params.append(query.parent_task_id)
    if query.state is not None:
        terms.append(f"{t}state = ?")
        params.append(query.state.name)
        if query.state is not GenerationState.TERMINAL:
            terms.append(_OPEN_STATE.format(t=t))
    if query.outcome is not None:
        terms.append(f"{t}outcome = ?")
        params.append(query.outcome.name)
        if query.outcome is not Outcome.COMPLETED:
            terms.append(_ABNORMAL_END.format(t=t))
    if query.work_status is not None:
        terms.append(f"{t}work_status = ?")
        params.append(query.work_status.name)
        if query.work_status in SETTABLE_WORK_STATUSES:
            terms.append(_OPEN_WORK.format(t=t))
    if query.task_id_prefix:
        terms.append(f"{t}task_id >= ? AND {t}task_id < ?")
        params += [query.task_id_prefix, query.task_id_prefix + _PREFIX_END]
    return "".join(f" AND {term}" for term in terms), params


def _count_order(count: TaskCount) -> tuple[int, int, int]:
    return count.state.value, count.outcome.value if count.outcome else 0, count.work_status.value


def _task_from_row(r: Sequence[Any]) -> TaskRecord:
    return TaskRecord(
        workspace_id=r[0],
        task_id=r[1],
        generation=r[2],
        revision=r[3],
        state=GenerationState[r[4]],
        outcome=Outcome[r[5]] if r[5] else None,
        cancellation_requested_at=r[6],
        work_status=WorkStatus[r[7]],
        parent=_link_from(r[8:11]),
        completion_id=r[11],
        created_at=r[12],
        updated_at=r[13],
    )


def _event_from_row(r: Sequence[Any]) -> LifecycleEvent:
    return LifecycleEvent(
        sequence=r[0],
        workspace_id=r[1],
        task_id=r[2],
        generation=r[3],
        revision=r[4],
        intent=IntentKind[r[5]],
        from_state=GenerationState[r[6]] if r[6] else None,
        to_state=GenerationState[r[7]],
        outcome=Outcome[r[8]] if r[8] else None,
        cancellation_requested_at=r[9],
        work_status=WorkStatus[r[10]],
        cause=Cause(r[11], r[12], tuple(sorted(json.loads(r[13]).items()))),
        completion_id=r[14],
        authoritative_at=r[15],
        committed_at=r[16],
        request_id=r[17],
        caller=Caller(r[18], r[19]),
        parent=_link_from(r[20:23]),
    )
