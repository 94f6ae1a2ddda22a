"""The SQLite adapter of the lifecycle store."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Callable

from google.protobuf.message import Message

from funnel.auth.principal import Caller
from funnel.runtime.clock import Clock
from funnel.runtime.errors import Rejection, reject
from funnel.runtime.faults import NO_FAULTS, Faults
from funnel.runtime.idempotency import RequestIdVerdict, judge_request_id
from funnel.runtime.sqlite import Database, migrations_in, probe_writable
from lifecycle_service.core.intents import Intent, RegisterTask
from lifecycle_service.core.model import (
    Cause,
    ChildRef,
    GenerationState,
    IntentKind,
    LifecycleEvent,
    LinkMode,
    Outcome,
    ParentLink,
    Situation,
    TaskRecord,
    WorkStatus,
)
from lifecycle_service.core.rules import AlreadySettled, Transition
from lifecycle_service.errors import Reason
from lifecycle_service.storage.port import (
    ApplyResult,
    Command,
    Committed,
    Discharged,
    PendingPropagation,
    Replayed,
    Resettled,
    TaskView,
)

MIGRATIONS_PACKAGE = "lifecycle_service.storage.migrations"
# GetTask reports at most this many open children; enough to explain a block.
_OPEN_CHILDREN_LIMIT = 1000

_TASK_COLUMNS = (
    "workspace_id, task_id, generation, revision, state, outcome, cancellation_requested_at, work_status, "
    "parent_task_id, parent_generation, parent_mode, completion_id, created_at, updated_at"
)
_EVENT_COLUMNS = (
    "sequence, workspace_id, task_id, generation, revision, intent, from_state, to_state, outcome, "
    "cancellation_requested_at, work_status, cause_source, cause_reason, cause_originating_ids, "
    "completion_id, authoritative_at, committed_at, request_id, caller_subject, caller_role"
)


class SqliteLifecycleStore:
    def __init__(
        self,
        writer: Database,
        reader: Database,
        clock: Clock,
        on_commit: Callable[[LifecycleEvent], None] = lambda event: None,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self._writer = writer
        self._reader = reader
        self._clock = clock
        self._on_commit = on_commit
        self._faults = faults

    @classmethod
    async def open(
        cls,
        path: str,
        clock: Clock,
        on_commit: Callable[[LifecycleEvent], None] = lambda event: None,
        faults: Faults = NO_FAULTS,
    ) -> SqliteLifecycleStore:
        writer = await Database.open(path, migrations_in(MIGRATIONS_PACKAGE))
        reader = await Database.open_reader(writer)
        return cls(writer, reader, clock, on_commit, faults)

    def set_on_commit(self, on_commit: Callable[[LifecycleEvent], None]) -> None:
        self._on_commit = on_commit

    async def close(self) -> None:
        if self._reader is not self._writer:
            await self._reader.close()
        await self._writer.close()

    async def apply(self, command: Command) -> ApplyResult:
        def publish(result: ApplyResult) -> None:
            if isinstance(result, Committed):
                self._on_commit(result.event)

        return await self._writer.write(lambda db: self._apply(db, command), after_commit=publish)

    def _apply(self, db: sqlite3.Connection, command: Command) -> ApplyResult:
        intent = command.intent
        if command.propagation_id is not None:
            if (
                db.execute("SELECT 1 FROM pending_propagations WHERE id = ?", (command.propagation_id,)).fetchone()
                is None
            ):
                return Discharged()
            db.execute("DELETE FROM pending_propagations WHERE id = ?", (command.propagation_id,))
        if intent.request_id:
            assert command.fingerprint is not None, "a request id comes with the request's fingerprint"
            row = db.execute(
                "SELECT fingerprint, response FROM request_ids "
                "WHERE workspace_id = ? AND caller = ? AND method = ? AND request_id = ?",
                (intent.workspace_id, intent.caller.subject, command.method, intent.request_id),
            ).fetchone()
            verdict = judge_request_id(row[0] if row else None, command.fingerprint)
            if verdict is RequestIdVerdict.REPLAY:
                return Replayed(row[1])
            if verdict is RequestIdVerdict.REUSED:
                return reject(
                    Reason.REQUEST_ID_REUSED,
                    f"request_id {intent.request_id!r} was already used for a different request",
                    request_id=intent.request_id,
                )
        now = self._clock.now_micros()
        task = _load_task(db, intent.workspace_id, intent.task_id)
        link = intent.parent if isinstance(intent, RegisterTask) else (task.parent if task else None)
        parent = _load_task(db, intent.workspace_id, link.task_id) if link else None
        children = _open_attached_children(db, task, limit=None) if task else ()
        decision = command.decide(Situation(now=now, task=task, parent=parent, open_attached_children=children))
        if isinstance(decision, Rejection):
            return decision
        if isinstance(decision, AlreadySettled):
            original = _terminal_event(db, decision.task)
            if intent.request_id:
                assert command.render is not None, "a request id comes with the rendering of its response"
                _remember(db, intent, command, command.render(decision.task, original), now)
            return Resettled(decision.task, original)
        assert isinstance(decision, Transition)
        _write_task(db, decision.task, insert=task is None)
        event = _insert_event(db, decision.event)
        for propagation in decision.propagations:
            db.execute(
                "INSERT INTO pending_propagations (workspace_id, parent_task_id, parent_generation, parent_sequence, "
                "child_task_id, child_generation, intent, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    event.workspace_id,
                    event.task_id,
                    event.generation,
                    event.sequence,
                    propagation.child.task_id,
                    propagation.child.generation,
                    propagation.intent.name,
                    now,
                ),
            )
        response = command.render(decision.task, event) if command.render else None
        if intent.request_id:
            assert response is not None, "a request id comes with the rendering of its response"
            _remember(db, intent, command, response, now)
        self._faults.hit("lifecycle.before_commit")
        return Committed(decision.task, event, response, len(decision.propagations))

    async def get_task(self, workspace_id: str, task_id: str) -> TaskView | None:
        def read(db: sqlite3.Connection) -> TaskView | None:
            task = _load_task(db, workspace_id, task_id)
            if task is None:
                return None
            return TaskView(task, _open_attached_children(db, task, limit=_OPEN_CHILDREN_LIMIT))

        return await self._reader.read(read)

    async def list_tasks(
        self, workspace_id: str, after_task_id: str, limit: int, parent_task_id: str | None
    ) -> list[TaskRecord]:
        sql = f"SELECT {_TASK_COLUMNS} FROM tasks WHERE workspace_id = ? AND task_id > ?"
        params: list[object] = [workspace_id, after_task_id]
        if parent_task_id:
            sql += " AND parent_task_id = ?"
            params.append(parent_task_id)
        sql += " ORDER BY task_id LIMIT ?"
        params.append(limit)
        return await self._reader.read(lambda db: [_task_from_row(r) for r in db.execute(sql, params)])

    async def list_events(
        self, workspace_id: str, task_id: str, after_revision: int, limit: int
    ) -> list[LifecycleEvent]:
        sql = (
            f"SELECT {_EVENT_COLUMNS} FROM lifecycle_events WHERE workspace_id = ? AND task_id = ? AND revision > ? "
            "ORDER BY revision LIMIT ?"
        )
        return await self._reader.read(
            lambda db: [_event_from_row(r) for r in db.execute(sql, (workspace_id, task_id, after_revision, limit))]
        )

    async def events_after(
        self, workspace_id: str, after_sequence: int, task_id: str | None, limit: int
    ) -> list[LifecycleEvent]:
        if task_id:
            sql = (
                f"SELECT {_EVENT_COLUMNS} FROM lifecycle_events WHERE workspace_id = ? AND task_id = ? AND sequence > "
                "? "
                "ORDER BY sequence LIMIT ?"
            )
            params: tuple = (workspace_id, task_id, after_sequence, limit)
        else:
            sql = (
                f"SELECT {_EVENT_COLUMNS} FROM lifecycle_events WHERE workspace_id = ? AND sequence > ? "
                "ORDER BY sequence LIMIT ?"
            )
            params = (workspace_id, after_sequence, limit)
        return await self._reader.read(lambda db: [_event_from_row(r) for r in db.execute(sql, params)])

    async def pending_propagations(self, limit: int) -> list[PendingPropagation]:
        sql = (
            "SELECT id, workspace_id, parent_task_id, parent_generation, parent_sequence, child_task_id, "
            "child_generation, intent FROM pending_propagations ORDER BY id LIMIT ?"
        )

        def read(db: sqlite3.Connection) -> list[PendingPropagation]:
            return [
                PendingPropagation(r[0], r[1], r[2], r[3], r[4], ChildRef(r[5], r[6]), IntentKind[r[7]])
                for r in db.execute(sql, (limit,))
            ]

        return await self._writer.run(read)

    async def sweep_request_ids(self, created_before: int, limit: int) -> int:
        return await self._writer.write(
            lambda db: db.execute(
                "DELETE FROM request_ids WHERE rowid IN "
                "(SELECT rowid FROM request_ids WHERE created_at < ? ORDER BY created_at LIMIT ?)",
                (created_before, limit),
            ).rowcount
        )

    async def check_writable(self) -> None:
        await self._writer.run(probe_writable)


def _remember(db: sqlite3.Connection, intent: Intent, command: Command, response: Message, now: int) -> None:
    db.execute(
        "INSERT INTO request_ids (workspace_id, caller, method, request_id, fingerprint, response, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            intent.workspace_id,
            intent.caller.subject,
            command.method,
            intent.request_id,
            command.fingerprint,
            response.SerializeToString(),
            now,
        ),
    )


def _load_task(db: sqlite3.Connection, workspace_id: str, task_id: str) -> TaskRecord | None:
    row = db.execute(
        f"SELECT {_TASK_COLUMNS} FROM tasks WHERE workspace_id = ? AND task_id = ?", (workspace_id, task_id)
    ).fetchone()
    return _task_from_row(row) if row else None


def _open_attached_children(db: sqlite3.Connection, task: TaskRecord, limit: int | None) -> tuple[ChildRef, ...]:
    sql = (
        # INDEXED BY: without statistics the planner prefers walking the whole
        # workspace by primary key (measured: 30% of the service's CPU at 6k tasks).
        "SELECT task_id, generation FROM tasks INDEXED BY tasks_by_parent "
        "WHERE workspace_id = ? AND parent_task_id = ? AND parent_generation = ? "
        "AND parent_mode = 'ATTACHED' AND state != 'TERMINAL' ORDER BY task_id"
    )
    params: tuple = (task.workspace_id, task.task_id, task.generation)
    if limit is not None:
        sql += " LIMIT ?"
        params += (limit,)
    return tuple(ChildRef(r[0], r[1]) for r in db.execute(sql, params))


def _terminal_event(db: sqlite3.Connection, task: TaskRecord) -> LifecycleEvent:
    row = db.execute(
        f"SELECT {_EVENT_COLUMNS} FROM lifecycle_events WHERE workspace_id = ? AND task_id = ? AND generation = ? "
        "AND to_state = 'TERMINAL' ORDER BY sequence LIMIT 1",
        (task.workspace_id, task.task_id, task.generation),
    ).fetchone()
    if row is None:
        raise sqlite3.DatabaseError(f"terminal task {task.task_id!r} has no terminal event")
    return _event_from_row(row)


def _write_task(db: sqlite3.Connection, task: TaskRecord, *, insert: bool) -> None:
    parent = task.parent
    values = (
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
    if insert:
        db.execute(
            "INSERT INTO tasks (generation, revision, state, outcome, cancellation_requested_at, work_status, "
            "parent_task_id, parent_generation, parent_mode, completion_id, created_at, updated_at, workspace_id, "
            "task_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            values,
        )
        return
    updated = db.execute(
        "UPDATE tasks SET generation = ?, revision = ?, state = ?, outcome = ?, cancellation_requested_at = ?, "
        "work_status = ?, parent_task_id = ?, parent_generation = ?, parent_mode = ?, completion_id = ?, "
        "created_at = ?, updated_at = ? WHERE workspace_id = ? AND task_id = ? AND revision = ?",
        values + (task.revision - 1,),
    ).rowcount
    if updated != 1:
        raise sqlite3.DatabaseError(f"task {task.task_id!r} changed under its write lock")


def _insert_event(db: sqlite3.Connection, event: LifecycleEvent) -> LifecycleEvent:
    cursor = db.execute(
        "INSERT INTO lifecycle_events (workspace_id, task_id, generation, revision, intent, from_state, to_state, "
        "outcome, cancellation_requested_at, work_status, cause_source, cause_reason, cause_originating_ids, "
        "completion_id, authoritative_at, committed_at, request_id, caller_subject, caller_role) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
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
            event.caller.subject,
            event.caller.role,
        ),
    )
    assert cursor.lastrowid is not None, "an INSERT sets lastrowid"
    return _with_sequence(event, cursor.lastrowid)


def _with_sequence(event: LifecycleEvent, sequence: int) -> LifecycleEvent:
    return dataclasses.replace(event, sequence=sequence)


def _task_from_row(r: tuple) -> TaskRecord:
    return TaskRecord(
        workspace_id=r[0],
        task_id=r[1],
        generation=r[2],
        revision=r[3],
        state=GenerationState[r[4]],
        outcome=Outcome[r[5]] if r[5] else None,
        cancellation_requested_at=r[6],
        work_status=WorkStatus[r[7]],
        parent=ParentLink(r[8], r[9], LinkMode[r[10]]) if r[8] else None,
        completion_id=r[11],
        created_at=r[12],
        updated_at=r[13],
    )


def _event_from_row(r: tuple) -> LifecycleEvent:
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
    )
