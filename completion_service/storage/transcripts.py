"""Transcript storage of the SQLite completion store (mixed into
SqliteCompletionStore, sharing its connections and transactions)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from google.protobuf.message import Message

from completion_service.core.model import CompletionEvent, Lease
from completion_service.core.runs import judge_renewal
from completion_service.core.transcript import (
    EventKind,
    SessionEvent,
    Tail,
    TurnEndReason,
    Violation,
    checkpoints_referenced,
    grammar_rejection,
    repair,
    validate,
)
from completion_service.errors import Reason
from completion_service.storage.port import Appended, Remembered, TranscriptPage
from funnel.runtime.clock import Clock
from funnel.runtime.errors import Rejection, reject
from funnel.runtime.faults import Faults
from funnel.runtime.idempotency import RequestKey
from funnel.runtime.sqlite import Database

_EVENT_COLUMNS = "sequence, generation, kind, ref, name, body, is_error, reason, synthetic, recorded_at"


class TranscriptStorage:
    """Requires the host class to provide _write, _recall, _remember, _reader, _clock and _faults."""

    _reader: Database
    _clock: Clock
    _faults: Faults

    if TYPE_CHECKING:
        # Implemented by the host class (SqliteCompletionStore).
        async def _write(self, body: Callable[[sqlite3.Connection, list[CompletionEvent]], object]) -> Any: ...
        def _recall(self, db: sqlite3.Connection, request: RequestKey | None) -> Remembered | Rejection | None: ...
        def _remember(self, db: sqlite3.Connection, request: RequestKey | None, response: Message) -> None: ...

    async def transcript_tail(self, workspace_id: str, task_id: str) -> tuple[Tail, int]:
        return await self._reader.read(lambda db: _load_tail(db, workspace_id, task_id))

    async def checkpoint_sequences(self, workspace_id: str, task_id: str, ids: set[str]) -> dict[str, int]:
        return await self._reader.read(lambda db: _checkpoints(db, workspace_id, task_id, ids))

    async def append_transcript(
        self,
        workspace_id: str,
        task_id: str,
        events: Sequence[SessionEvent],
        generation: int,
        expected_state_version: int | None,
        holder: str | None,
        request: RequestKey | None,
        render: Callable[[Appended], Message],
    ):
        def body(db: sqlite3.Connection, published: list) -> object:
            recalled = self._recall(db, request)
            if recalled is not None:
                return recalled
            if holder is not None and _live_holder(db, workspace_id, task_id, self._clock.now_micros()) != holder:
                return reject(
                    Reason.RUN_NOT_HELD,
                    f"an agent appends only to a task whose live lease it holds; it holds none on {task_id!r}",
                    task_id=task_id,
                )
            tail, version = _load_tail(db, workspace_id, task_id)
            if expected_state_version is not None and expected_state_version != version:
                return reject(
                    Reason.STATE_VERSION_MISMATCH,
                    f"expected state version {expected_state_version}, the transcript is at {version}",
                    expected=expected_state_version,
                    actual=version,
                )
            known = _checkpoints(db, workspace_id, task_id, checkpoints_referenced(events))
            following = validate(tail, events, known)
            if isinstance(following, Violation):
                return grammar_rejection(following)
            now = self._clock.now_micros()
            stamped = [
                _stamp(event, tail.last_sequence + 1 + i, generation, now) for i, event in enumerate(events)
            ]
            _insert_events(db, workspace_id, task_id, stamped)
            _save_tail(db, workspace_id, task_id, following, version + 1)
            appended = Appended(version + 1, tail.last_sequence + 1)
            self._remember(db, request, render(appended))
            return appended

        return await self._write(body)

    async def load_transcript(
        self, workspace_id: str, task_id: str, after_sequence: int, limit: int, *, repair_first: bool
    ) -> TranscriptPage:
        """A page of events; the first page (repair_first) first closes an
        interrupted final turn that no live lease owns, in its own transaction."""
        repaired = False
        in_progress = False
        if repair_first:
            tail, _ = await self.transcript_tail(workspace_id, task_id)
            if tail.open_turn is not None:
                repaired, in_progress = await self._write(lambda db, published: self._repair(db, workspace_id, task_id))

        def read(db: sqlite3.Connection) -> TranscriptPage:
            _, version = _load_tail(db, workspace_id, task_id)
            rows = db.execute(
                f"SELECT {_EVENT_COLUMNS} FROM transcript_events WHERE workspace_id = ? AND task_id = ? AND sequence > "
                "? "
                "ORDER BY sequence LIMIT ?",
                (workspace_id, task_id, after_sequence, limit + 1),
            ).fetchall()
            return TranscriptPage([_event_from_row(r) for r in rows[:limit]], version, len(rows) > limit)

        page = await self._reader.read(read)
        return TranscriptPage(page.events, page.state_version, page.more, repaired, in_progress)

    def _repair(self, db: sqlite3.Connection, workspace_id: str, task_id: str) -> tuple[bool, bool]:
        """(repaired, turn_in_progress). Re-checked under the write lock, so that of
        many concurrent loads exactly one repairs."""
        tail, version = _load_tail(db, workspace_id, task_id)
        if tail.open_turn is None:
            return False, False
        now = self._clock.now_micros()
        if _live_holder(db, workspace_id, task_id, now) is not None:
            return False, True
        last = db.execute(
            "SELECT generation FROM transcript_events WHERE workspace_id = ? AND task_id = ? ORDER BY sequence DESC "
            "LIMIT 1",
            (workspace_id, task_id),
        ).fetchone()
        closers = repair(tail, last[0])
        following = validate(tail, closers)
        assert not isinstance(following, Violation), following
        stamped = [_stamp(e, tail.last_sequence + 1 + i, e.generation, now) for i, e in enumerate(closers)]
        _insert_events(db, workspace_id, task_id, stamped)
        _save_tail(db, workspace_id, task_id, following, version + 1)
        self._faults.hit("completion.transcript_repair")
        return True, False

    async def transcript_events_after(
        self, workspace_id: str, task_id: str, after_sequence: int, limit: int
    ) -> list[SessionEvent]:
        sql = (
            f"SELECT {_EVENT_COLUMNS} FROM transcript_events WHERE workspace_id = ? AND task_id = ? AND sequence > ? "
            "ORDER BY sequence LIMIT ?"
        )
        return await self._reader.read(
            lambda db: [_event_from_row(r) for r in db.execute(sql, (workspace_id, task_id, after_sequence, limit))]
        )

    # -- streamed imports --------------------------------------------------

    async def stage_import(self, import_id: str, events: Sequence[SessionEvent]) -> None:
        def body(db: sqlite3.Connection, published: list) -> None:
            db.executemany(
                f"INSERT INTO transcript_staging (import_id, {_EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                "?)",
                [(import_id, *_event_values(e)) for e in events],
            )

        await self._write(body)

    async def discard_import(self, import_id: str) -> None:
        await self._write(
            lambda db, published: db.execute("DELETE FROM transcript_staging WHERE import_id = ?", (import_id,))
        )

    async def discard_all_imports(self) -> None:
        """Staged imports belong to the process that streamed them; after a restart they are debris."""
        await self._write(lambda db, published: db.execute("DELETE FROM transcript_staging"))

    async def commit_import(
        self, import_id: str, workspace_id: str, task_id: str, final_tail: Tail, checkpoints: dict[str, int]
    ) -> int | Rejection:
        """Moves a fully validated import into the transcript in one transaction;
        returns the new state version."""

        def body(db: sqlite3.Connection, published: list) -> object:
            tail, version = _load_tail(db, workspace_id, task_id)
            if tail.last_sequence != 0:
                db.execute("DELETE FROM transcript_staging WHERE import_id = ?", (import_id,))
                return _not_empty(task_id)
            db.execute(
                f"INSERT INTO transcript_events (workspace_id, task_id, {_EVENT_COLUMNS}) "
                f"SELECT ?, ?, {_EVENT_COLUMNS} FROM transcript_staging WHERE import_id = ? ORDER BY sequence",
                (workspace_id, task_id, import_id),
            )
            db.execute("DELETE FROM transcript_staging WHERE import_id = ?", (import_id,))
            db.executemany(
                "INSERT INTO transcript_checkpoints (workspace_id, task_id, checkpoint_id, sequence) VALUES (?, ?, ?, "
                "?)",
                [(workspace_id, task_id, checkpoint, sequence) for checkpoint, sequence in checkpoints.items()],
            )
            _save_tail(db, workspace_id, task_id, final_tail, version + 1)
            return version + 1

        return await self._write(body)


def _not_empty(task_id: str) -> Rejection:
    return reject(Reason.TRANSCRIPT_NOT_EMPTY, f"task {task_id!r} already has a transcript", task_id=task_id)


def _stamp(event: SessionEvent, sequence: int, generation: int, now: int) -> SessionEvent:
    return SessionEvent(
        kind=event.kind,
        ref=event.ref,
        name=event.name,
        text=event.text,
        is_error=event.is_error,
        reason=event.reason,
        synthetic=event.synthetic,
        generation=generation,
        sequence=sequence,
        recorded_at=now,
    )


def _load_tail(db: sqlite3.Connection, workspace_id: str, task_id: str) -> tuple[Tail, int]:
    row = db.execute(
        "SELECT state_version, open_turn, open_step, open_calls, checkpoint, last_sequence FROM transcript_tails "
        "WHERE workspace_id = ? AND task_id = ?",
        (workspace_id, task_id),
    ).fetchone()
    if row is None:
        return Tail(), 0
    return Tail(row[1], row[2], tuple(json.loads(row[3])), row[4], row[5]), row[0]


def _save_tail(db: sqlite3.Connection, workspace_id: str, task_id: str, tail: Tail, state_version: int) -> None:
    db.execute(
        "INSERT INTO transcript_tails (workspace_id, task_id, state_version, open_turn, open_step, open_calls, "
        "checkpoint, "
        "last_sequence) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (workspace_id, task_id) DO UPDATE SET "
        "state_version = excluded.state_version, open_turn = excluded.open_turn, open_step = excluded.open_step, "
        "open_calls = excluded.open_calls, checkpoint = excluded.checkpoint, last_sequence = excluded.last_sequence",
        (
            workspace_id,
            task_id,
            state_version,
            tail.open_turn,
            tail.open_step,
            json.dumps(list(tail.open_calls)),
            tail.checkpoint,
            tail.last_sequence,
        ),
    )


def _checkpoints(db: sqlite3.Connection, workspace_id: str, task_id: str, ids: set[str]) -> dict[str, int]:
    found = {}
    for checkpoint in ids:
        row = db.execute(
            "SELECT sequence FROM transcript_checkpoints WHERE workspace_id = ? AND task_id = ? AND checkpoint_id = ?",
            (workspace_id, task_id, checkpoint),
        ).fetchone()
        if row:
            found[checkpoint] = row[0]
    return found


def _live_holder(db: sqlite3.Connection, workspace_id: str, task_id: str, now: int) -> str | None:
    """The agent of the open run holding the task's live lease, if any."""
    row = db.execute(
        "SELECT l.run_id, l.epoch, l.expires_at, r.finished_at IS NULL, r.epoch, r.agent_id FROM task_leases l "
        "JOIN agent_runs r ON r.workspace_id = l.workspace_id AND r.run_id = l.run_id "
        "WHERE l.workspace_id = ? AND l.task_id = ?",
        (workspace_id, task_id),
    ).fetchone()
    if row is None:
        return None
    run_id, epoch, expires_at, run_open, run_epoch, agent_id = row
    live = judge_renewal(bool(run_open), run_id, run_epoch, Lease(task_id, run_id, epoch, expires_at), now) is None
    return agent_id if live else None


def _event_values(e: SessionEvent) -> tuple:
    return (
        e.sequence,
        e.generation,
        e.kind.name,
        e.ref,
        e.name,
        e.text,
        int(e.is_error),
        e.reason.name if e.reason else None,
        int(e.synthetic),
        e.recorded_at,
    )


def _insert_events(db: sqlite3.Connection, workspace_id: str, task_id: str, events: Sequence[SessionEvent]) -> None:
    db.executemany(
        f"INSERT INTO transcript_events (workspace_id, task_id, {_EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, "
        "?, ?, ?)",
        [(workspace_id, task_id, *_event_values(e)) for e in events],
    )
    db.executemany(
        "INSERT OR IGNORE INTO transcript_checkpoints (workspace_id, task_id, checkpoint_id, sequence) VALUES (?, ?, "
        "?, ?)",
        [(workspace_id, task_id, e.ref, e.sequence) for e in events if e.kind is EventKind.CHECKPOINT],
    )


def _event_from_row(r: tuple) -> SessionEvent:
    return SessionEvent(
        sequence=r[0],
        generation=r[1],
        kind=EventKind[r[2]],
        ref=r[3],
        name=r[4],
        text=r[5],
        is_error=bool(r[6]),
        reason=TurnEndReason[r[7]] if r[7] else None,
        synthetic=bool(r[8]),
        recorded_at=r[9],
    )
