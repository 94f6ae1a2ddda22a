"""Transcript events, checkpoints and the tail (port `Transcripts`), and the
staging area of streamed imports (port `Imports`)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence

from completion_service.core.transcript import SessionEvent, Tail
from completion_service.storage.port import TranscriptState
from completion_service.storage.sqlite import rows
from completion_service.storage.sqlite.rows import TRANSCRIPT_COLUMNS
from completion_service.storage.sqlite.session import Session


class SqliteTranscripts:
    def __init__(self, session: Session) -> None:
        self._s = session

    def load_tail(self, workspace_id: str, task_id: str) -> TranscriptState:
        self._s.lock_task(workspace_id, task_id)
        row = self._s.db.execute(
            "SELECT state_version, open_turn, open_step, open_calls, checkpoint, last_sequence FROM transcript_tails "
            f"WHERE workspace_id = ? AND task_id = ?{self._s.locking()}",
            (workspace_id, task_id),
        ).fetchone()
        if row is None:
            return TranscriptState()
        return TranscriptState(Tail(row[1], row[2], tuple(json.loads(row[3])), row[4], row[5]), row[0])

    def save_tail(self, workspace_id: str, task_id: str, state: TranscriptState) -> None:
        tail = state.tail
        self._s.db.execute(
            "INSERT INTO transcript_tails (workspace_id, task_id, state_version, open_turn, open_step, open_calls, "
            "checkpoint, last_sequence) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (workspace_id, task_id) DO UPDATE "
            "SET state_version = excluded.state_version, open_turn = excluded.open_turn, "
            "open_step = excluded.open_step, open_calls = excluded.open_calls, checkpoint = excluded.checkpoint, "
            "last_sequence = excluded.last_sequence",
            (
                workspace_id,
                task_id,
                state.state_version,
                tail.open_turn,
                tail.open_step,
                json.dumps(list(tail.open_calls)),
                tail.checkpoint,
                tail.last_sequence,
            ),
        )

    def load_checkpoints(self, workspace_id: str, task_id: str, ids: Collection[str]) -> dict[str, int]:
        self._s.lock_task(workspace_id, task_id)
        found = {}
        for checkpoint in ids:
            row = self._s.db.execute(
                "SELECT sequence FROM transcript_checkpoints "
                "WHERE workspace_id = ? AND task_id = ? AND checkpoint_id = ?",
                (workspace_id, task_id, checkpoint),
            ).fetchone()
            if row:
                found[checkpoint] = row[0]
        return found

    def insert_checkpoints(self, workspace_id: str, task_id: str, checkpoints: Mapping[str, int]) -> None:
        self._s.db.executemany(
            "INSERT INTO transcript_checkpoints (workspace_id, task_id, checkpoint_id, sequence) VALUES (?, ?, ?, ?)",
            [(workspace_id, task_id, checkpoint, sequence) for checkpoint, sequence in checkpoints.items()],
        )

    def page(self, workspace_id: str, task_id: str, after_sequence: int, limit: int) -> list[SessionEvent]:
        found = self._s.db.execute(
            f"SELECT {TRANSCRIPT_COLUMNS} FROM transcript_events "
            "WHERE workspace_id = ? AND task_id = ? AND sequence > ? ORDER BY sequence LIMIT ?",
            (workspace_id, task_id, after_sequence, limit),
        )
        return [rows.transcript_event(self._s, r) for r in found]

    def append(self, workspace_id: str, task_id: str, events: Sequence[SessionEvent]) -> None:
        self._s.db.executemany(
            f"INSERT INTO transcript_events (workspace_id, task_id, {TRANSCRIPT_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(workspace_id, task_id, *rows.transcript_event_values(self._s, e)) for e in events],
        )


class SqliteImports:
    def __init__(self, session: Session) -> None:
        self._s = session

    def stage(self, import_id: str, events: Sequence[SessionEvent]) -> None:
        self._s.db.executemany(
            f"INSERT INTO transcript_staging (import_id, {TRANSCRIPT_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(import_id, *rows.transcript_event_values(self._s, e)) for e in events],
        )

    def move(self, import_id: str, workspace_id: str, task_id: str) -> None:
        self._s.db.execute(
            f"INSERT INTO transcript_events (workspace_id, task_id, {TRANSCRIPT_COLUMNS}) "
            f"SELECT ?, ?, {TRANSCRIPT_COLUMNS} FROM transcript_staging WHERE import_id = ? ORDER BY sequence",
            (workspace_id, task_id, import_id),
        )
        self._s.db.execute("DELETE FROM transcript_staging WHERE import_id = ?", (import_id,))

    def discard(self, import_id: str | None) -> None:
        if import_id is None:
            self._s.db.execute("DELETE FROM transcript_staging")
        else:
            self._s.db.execute("DELETE FROM transcript_staging WHERE import_id = ?", (import_id,))
