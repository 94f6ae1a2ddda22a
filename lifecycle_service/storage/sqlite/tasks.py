"""Task records: the one a unit changes, its parent, and the listings (port `Tasks`)."""

from __future__ import annotations

from lifecycle_service.core.model import (
    SETTABLE_WORK_STATUSES,
    ChildRef,
    GenerationState,
    Outcome,
    TaskRecord,
    WorkStatus,
)
from lifecycle_service.storage.port import InvariantViolated, TaskCount, TaskQuery
from lifecycle_service.storage.sqlite import rows
from lifecycle_service.storage.sqlite.rows import TASK_COLUMNS, TASK_COLUMNS_OF_T
from lifecycle_service.storage.sqlite.session import Session

# What the partial indexes of migration 0007 hold: a query names the condition
# itself, so that SQLite (which matches it as written) may use the index.
_OPEN_STATE = "{t}state != 'TERMINAL'"
_OPEN_WORK = "{t}work_status IN ('READY', 'IN_PROGRESS', 'BLOCKED')"
_ABNORMAL_END = "{t}outcome IN ('CANCELLED', 'FAILED', 'TIMED_OUT')"
# Greater than any id's code points (ids have no U+10FFFF): the end of a prefix's range.
_PREFIX_END = "\U0010ffff"
# Greater than any sequence an event can have (integer inputs stay below 2^53).
MAX_SEQUENCE = 2**63 - 1


class SqliteTasks:
    def __init__(self, session: Session) -> None:
        self._s = session

    def load(self, workspace_id: str, task_id: str) -> TaskRecord | None:
        return self._load(workspace_id, task_id, self._s.task_lock())

    def load_parent(self, workspace_id: str, task_id: str) -> TaskRecord | None:
        return self._load(workspace_id, task_id, self._s.parent_lock())

    def _load(self, workspace_id: str, task_id: str, lock: str) -> TaskRecord | None:
        row = self._s.db.execute(
            f"SELECT {TASK_COLUMNS} FROM tasks WHERE workspace_id = ? AND task_id = ?{lock}", (workspace_id, task_id)
        ).fetchone()
        return rows.task(row) if row else None

    def open_attached_children(self, task: TaskRecord, limit: int | None = None) -> tuple[ChildRef, ...]:
        sql = (
            f"SELECT task_id, generation FROM {self._s.tasks_by_parent} "
            "WHERE workspace_id = ? AND parent_task_id = ? AND parent_generation = ? "
            "AND parent_mode = 'ATTACHED' AND state != 'TERMINAL' ORDER BY task_id"
        )
        params: tuple[str | int, ...] = (task.workspace_id, task.task_id, task.generation)
        if limit is not None:
            sql += " LIMIT ?"
            params += (limit,)
        return tuple(ChildRef(r[0], r[1]) for r in self._s.db.execute(sql, params))

    def page(self, workspace_id: str, query: TaskQuery, after_task_id: str, limit: int) -> list[TaskRecord]:
        terms, params = _task_terms(query, "")
        sql = f"SELECT {TASK_COLUMNS} FROM tasks WHERE workspace_id = ? AND task_id > ?{terms} ORDER BY task_id LIMIT ?"
        return [rows.task(r) for r in self._s.db.execute(sql, [workspace_id, after_task_id, *params, limit])]

    def page_by_change(
        self, workspace_id: str, query: TaskQuery, before_sequence: int | None, limit: int
    ) -> list[tuple[int, TaskRecord]]:
        terms, params = _task_terms(query, "t.")
        # CROSS JOIN: SQLite keeps this join order (the history newest first, each
        # event's task by its key); a task is listed at its latest event only.
        sql = (
            f"SELECT e.sequence, {TASK_COLUMNS_OF_T} FROM lifecycle_events e CROSS JOIN tasks t "
            "WHERE e.workspace_id = ? AND e.sequence < ? AND t.workspace_id = e.workspace_id "
            f"AND t.task_id = e.task_id AND t.revision = e.revision{terms} ORDER BY e.sequence DESC LIMIT ?"
        )
        before = before_sequence if before_sequence is not None else MAX_SEQUENCE
        found = self._s.db.execute(sql, [workspace_id, before, *params, limit])
        return [(r[0], rows.task(r[1:])) for r in found]

    def count(self, workspace_id: str) -> list[TaskCount]:
        found = self._s.db.execute(
            "SELECT state, outcome, work_status, COUNT(*) FROM tasks WHERE workspace_id = ? "
            "GROUP BY state, outcome, work_status",
            (workspace_id,),
        )
        counts = [
            TaskCount(GenerationState[r[0]], Outcome[r[1]] if r[1] else None, WorkStatus[r[2]], r[3]) for r in found
        ]
        return sorted(counts, key=_count_order)

    def insert(self, task: TaskRecord) -> None:
        self._s.db.execute(
            "INSERT INTO tasks (generation, revision, state, outcome, cancellation_requested_at, work_status, "
            "parent_task_id, parent_generation, parent_mode, completion_id, created_at, updated_at, workspace_id, "
            "task_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows.task_values(task),
        )

    def update(self, task: TaskRecord) -> None:
        updated = self._s.db.execute(
            "UPDATE tasks SET generation = ?, revision = ?, state = ?, outcome = ?, cancellation_requested_at = ?, "
            "work_status = ?, parent_task_id = ?, parent_generation = ?, parent_mode = ?, completion_id = ?, "
            "created_at = ?, updated_at = ? WHERE workspace_id = ? AND task_id = ? AND revision = ?",
            rows.task_values(task) + (task.revision - 1,),
        ).rowcount
        if updated != 1:
            raise InvariantViolated(f"task {task.task_id!r} changed under its write lock")


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
