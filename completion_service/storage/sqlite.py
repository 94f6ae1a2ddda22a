"""The SQLite adapter of the completion store: `SqliteCompletionStore` runs a unit
of work in one transaction, in one hop on the connection's own thread (with group
commit, see funnel.runtime.sqlite and funnel.runtime.store); `SqliteCompletionTx`
maps rows and nothing else.

The SQL keeps to what PostgreSQL also understands (`INSERT … ON CONFLICT`,
`RETURNING`, row values, no SQLite-only functions), so that a PostgreSQL adapter
can run the same row mapping over a psycopg connection in
`funnel.runtime.postgres.SqliteStyle`, overriding only the hooks where the engines
differ: row locks (`_locking`), claims that skip rows others hold (`_skip_locked`),
where event and audit numbers come from (`_number`) and which of them a
reader by cursor may see yet (`_deliverable`), and how caller free text is kept
(`_put_text`, `_get_text`)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol, cast

from completion_service.core.model import (
    AuditEntry,
    CompletionEvent,
    CompletionEventKind,
    CompletionRecord,
    Decision,
    EvidenceRecord,
    FinalStatus,
    Lease,
    RequestedOutcome,
    RunOutcome,
    RunRecord,
    SettlementStatus,
    Verdict,
)
from completion_service.core.transcript import EventKind, SessionEvent, Tail, TurnEndReason
from completion_service.storage import compact
from completion_service.storage.port import (
    AttemptRecord,
    CompletionFigures,
    TranscriptState,
)
from funnel.auth.principal import Caller
from funnel.runtime.idempotency import RequestKey
from funnel.runtime.sqlite import CommitObserver, SqliteEngine, database_bytes, migrations_in
from funnel.runtime.store import Store

MIGRATIONS_PACKAGE = "completion_service.storage.migrations"

_RUN_COLUMNS = (
    "workspace_id, run_id, task_id, agent_id, generation, epoch, claimed_at, lease_expires_at, finished_at, outcome, "
    "tokens_input, tokens_output, tokens_total, notes, notes_truncated, error, final_status"
)
COMPLETION_COLUMNS = (
    "workspace_id, task_id, generation, completion_id, identity, payload, outcome, result, run_id, state_version, "
    "checkpoint, decision, committed_at, settlement, settle_attempts, lifecycle_revision, lifecycle_event_sequence, "
    "settled_at, error_reason, error_message, traceparent, next_settle_at, last_settle_error"
)
EVENT_COLUMNS = (
    "sequence, workspace_id, task_id, generation, kind, run_id, completion_id, outcome, decision, lifecycle_revision, "
    "lifecycle_event_sequence, error_reason, error_message, committed_at, run_outcome, evidence_id"
)
_EVIDENCE_COLUMNS = (
    "evidence_id, workspace_id, task_id, generation, kind, passed, checkpoint, details, run_id, recorded_at, "
    "caller_subject, caller_role"
)
_ATTEMPT_COLUMNS = (
    "workspace_id, task_id, generation, run_id, checkpoint, result_digest, verdict, state_version, attempted_at"
)
_AUDIT_COLUMNS = "audit_id, workspace_id, action, run_id, task_id, metadata, recorded_at, caller_subject, caller_role"
_TRANSCRIPT_COLUMNS = "sequence, generation, kind, ref, name, body, is_error, reason, synthetic, recorded_at"


class Connection(Protocol):
    """What the row mapping needs of a connection: `sqlite3.Connection`, or a
    psycopg connection in `funnel.runtime.postgres.SqliteStyle`."""

    def execute(self, sql: str, params: Any = (), /) -> Any: ...

    def executemany(self, sql: str, rows: Any, /) -> Any: ...


class SqliteCompletionStore(Store[sqlite3.Connection, "SqliteCompletionTx", "SqliteCompletionTx"]):
    """The completion store on a SQLite file (funnel.runtime.store.Store)."""

    def __init__(self, engine: SqliteEngine) -> None:
        super().__init__(engine, SqliteCompletionTx, SqliteCompletionTx)
        self._sqlite = engine

    @classmethod
    async def open(cls, path: str, *, commits: CommitObserver | None = None) -> SqliteCompletionStore:
        return cls(await SqliteEngine.open(path, migrations_in(MIGRATIONS_PACKAGE), commits=commits))

    async def check_integrity(self) -> str | None:
        """The full integrity check (SqliteEngine.check_integrity)."""
        return await self._sqlite.check_integrity()


class SqliteCompletionTx:
    """The port's transaction API over one connection already in a transaction:
    row mapping only."""

    def __init__(self, db: sqlite3.Connection | Connection) -> None:
        self._db: Connection = db

    # -- where the engines differ (storage/postgres.py overrides these) -------------

    def _locking(self) -> str:
        """The clause that locks the rows a load returns for the rest of a write
        transaction; none here: BEGIN IMMEDIATE holds the database's write lock."""
        return ""

    def _skip_locked(self) -> str:
        """The clause with which a claim locks the rows it selects and skips those
        another transaction holds; none here: one writer at a time."""
        return ""

    def _number(self, log: str, workspace_id: str, task_id: str) -> tuple[str, tuple[object, ...]]:
        """The SQL value (and its parameters) that numbers the next row of an
        append-only log read by cursor (`completion_events`, `audit_log`) about a
        task, inside its INSERT; here NULL, which the INTEGER PRIMARY KEY replaces
        (the writer holds the database's write lock to its commit, so numbers are
        given in commit order, without gaps)."""
        return "?", (None,)

    def _deliverable(self, column: str) -> str:
        """The condition (` AND …`) a read by cursor adds so that it returns no
        row a later commit could still number below; none here: numbers are
        given in commit order."""
        return ""

    def _put_text(self, text: str | None) -> object:
        """Free text a caller sent (notes, errors, results, details, transcript
        text), as stored: it may hold U+0000, which SQLite's TEXT keeps."""
        return text

    def _get_text(self, stored: Any) -> Any:
        """Free text as `_put_text` stored it."""
        return stored

    def _put_decision(self, decision: Decision) -> object:
        """A decision as stored: deflated (storage/compact.py)."""
        return compact.encode_decision(decision)

    def _get_decision(self, stored: Any) -> Decision:
        return compact.decode_decision(stored)

    # -- request ids ---------------------------------------------------------------

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
        deleted = self._db.execute(
            "DELETE FROM request_ids WHERE (workspace_id, caller, method, request_id) IN "
            "(SELECT workspace_id, caller, method, request_id FROM request_ids WHERE created_at < ? "
            f"ORDER BY created_at LIMIT ?{self._skip_locked()})",
            (created_before, limit),
        )
        # Connection.execute answers Any (sqlite3's cursor or psycopg's); the row count of both is an int.
        return cast(int, deleted.rowcount)

    # -- runs and leases ---------------------------------------------------------------

    def load_run(self, workspace_id: str, run_id: str) -> RunRecord | None:
        row = self._db.execute(
            f"SELECT {_RUN_COLUMNS} FROM agent_runs WHERE workspace_id = ? AND run_id = ?{self._locking()}",
            (workspace_id, run_id),
        ).fetchone()
        return self._run(row) if row else None

    def load_runs(
        self,
        workspace_id: str,
        task_id: str | None,
        before: tuple[int, str] | None,
        limit: int,
        open_only: bool = False,
    ) -> list[RunRecord]:
        sql = f"SELECT {_RUN_COLUMNS} FROM agent_runs WHERE workspace_id = ?"
        params: list[object] = [workspace_id]
        if task_id:
            sql += " AND task_id = ?"
            params.append(task_id)
        if open_only:
            sql += " AND finished_at IS NULL"  # agent_runs_open_by_claim's condition, as written there
        if before is not None:
            sql += " AND (claimed_at, run_id) < (?, ?)"
            params += list(before)
        sql += " ORDER BY claimed_at DESC, run_id DESC LIMIT ?"
        params.append(limit)
        return [self._run(r) for r in self._db.execute(sql, params)]

    def insert_run(self, run: RunRecord) -> None:
        self._db.execute(
            f"INSERT INTO agent_runs ({_RUN_COLUMNS}) VALUES ({', '.join('?' * 17)})", self._run_values(run)
        )

    def update_run(self, run: RunRecord) -> None:
        self._db.execute(
            "UPDATE agent_runs SET lease_expires_at = ?, finished_at = ?, outcome = ?, tokens_input = ?, "
            "tokens_output = ?, tokens_total = ?, notes = ?, notes_truncated = ?, error = ?, final_status = ? "
            "WHERE workspace_id = ? AND run_id = ?",
            # The columns from lease_expires_at on, as _run_values orders them.
            (*self._run_values(run)[7:], run.workspace_id, run.run_id),
        )

    def claim_stalled_runs(self, expired_before: int, limit: int) -> list[RunRecord]:
        # The claim is the lock on the rows until this transaction closes them (here
        # the database's write lock; see _skip_locked).
        rows = self._db.execute(
            f"SELECT {_RUN_COLUMNS} FROM agent_runs WHERE finished_at IS NULL AND lease_expires_at <= ? "
            f"ORDER BY lease_expires_at LIMIT ?{self._skip_locked()}",
            (expired_before, limit),
        )
        return [self._run(r) for r in rows]

    def load_lease(self, workspace_id: str, task_id: str) -> Lease | None:
        row = self._db.execute(
            "SELECT task_id, run_id, epoch, expires_at FROM task_leases WHERE workspace_id = ? AND task_id = ?"
            f"{self._locking()}",
            (workspace_id, task_id),
        ).fetchone()
        return Lease(*row) if row else None

    def save_lease(self, workspace_id: str, lease: Lease) -> None:
        self._db.execute(
            "INSERT INTO task_leases (workspace_id, task_id, run_id, epoch, expires_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (workspace_id, task_id) DO UPDATE SET run_id = excluded.run_id, epoch = excluded.epoch, "
            "expires_at = excluded.expires_at",
            (workspace_id, lease.task_id, lease.run_id, lease.epoch, lease.expires_at),
        )

    # -- evidence and attempts -------------------------------------------------------------

    def load_evidence(self, workspace_id: str, task_id: str, generation: int) -> list[EvidenceRecord]:
        rows = self._db.execute(
            f"SELECT {_EVIDENCE_COLUMNS} FROM evidence WHERE workspace_id = ? AND task_id = ? AND generation = ? "
            "ORDER BY sequence",
            (workspace_id, task_id, generation),
        )
        return [self._evidence(r) for r in rows]

    def list_evidence(
        self, workspace_id: str, task_id: str, generation: int | None, after: tuple[int, str] | None, limit: int
    ) -> list[EvidenceRecord]:
        sql = f"SELECT {_EVIDENCE_COLUMNS} FROM evidence WHERE workspace_id = ? AND task_id = ?"
        params: list[object] = [workspace_id, task_id]
        if generation is not None:
            sql += " AND generation = ?"
            params.append(generation)
        if after is not None:
            sql += " AND (recorded_at, evidence_id) > (?, ?)"
            params += list(after)
        sql += " ORDER BY recorded_at, evidence_id LIMIT ?"
        params.append(limit)
        return [self._evidence(r) for r in self._db.execute(sql, params)]

    def _evidence(self, r: Sequence[Any]) -> EvidenceRecord:
        return EvidenceRecord(
            r[0], r[1], r[2], r[3], r[4], bool(r[5]), r[6], self._get_text(r[7]), r[8], r[9], Caller(r[10], r[11])
        )

    def insert_evidence(self, record: EvidenceRecord) -> None:
        self._db.execute(
            f"INSERT INTO evidence ({_EVIDENCE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.evidence_id,
                record.workspace_id,
                record.task_id,
                record.generation,
                record.kind,
                int(record.passed),
                record.checkpoint,
                self._put_text(record.details),
                record.run_id,
                record.recorded_at,
                record.recorded_by.subject,
                record.recorded_by.role,
            ),
        )

    def load_attempts(self, workspace_id: str, task_id: str, generation: int) -> list[AttemptRecord]:
        rows = self._db.execute(
            f"SELECT {_ATTEMPT_COLUMNS} FROM completion_attempts "
            "WHERE workspace_id = ? AND task_id = ? AND generation = ? ORDER BY id",
            (workspace_id, task_id, generation),
        )
        return [AttemptRecord(r[0], r[1], r[2], r[3], r[4], r[5], Verdict[r[6]], r[7], r[8]) for r in rows]

    def insert_attempt(self, attempt: AttemptRecord) -> None:
        self._db.execute(
            f"INSERT INTO completion_attempts ({_ATTEMPT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                attempt.workspace_id,
                attempt.task_id,
                attempt.generation,
                attempt.run_id,
                attempt.checkpoint,
                attempt.result_digest,
                attempt.verdict.name,
                attempt.state_version,
                attempt.attempted_at,
            ),
        )

    # -- completions and their settlement outbox ---------------------------------------------

    def load_completion(self, workspace_id: str, task_id: str, generation: int) -> CompletionRecord | None:
        row = self._db.execute(
            f"SELECT {COMPLETION_COLUMNS} FROM task_completions "
            f"WHERE workspace_id = ? AND task_id = ? AND generation = ?{self._locking()}",
            (workspace_id, task_id, generation),
        ).fetchone()
        return self._completion(row) if row else None

    def load_completions(
        self,
        workspace_id: str,
        task_id: str | None,
        settlement: SettlementStatus | None,
        after: tuple[int, str] | None,
        limit: int,
    ) -> list[CompletionRecord]:
        sql = f"SELECT {COMPLETION_COLUMNS} FROM task_completions WHERE workspace_id = ?"
        params: list[object] = [workspace_id]
        if task_id:
            sql += " AND task_id = ?"
            params.append(task_id)
        if settlement is not None:  # task_completions_by_settlement
            sql += " AND settlement = ?"
            params.append(settlement.name)
        if after is not None:
            sql += " AND (committed_at, completion_id) > (?, ?)"
            params += list(after)
        sql += " ORDER BY committed_at, completion_id LIMIT ?"
        params.append(limit)
        return [self._completion(r) for r in self._db.execute(sql, params)]

    def insert_completion(self, record: CompletionRecord) -> None:
        c = record
        self._db.execute(
            f"INSERT INTO task_completions ({COMPLETION_COLUMNS}) VALUES ({', '.join('?' * 23)})",
            (
                c.workspace_id,
                c.task_id,
                c.generation,
                c.completion_id,
                c.identity,
                compact.encode_payload(c.payload),
                c.outcome.name,
                self._put_text(c.result),
                c.run_id,
                c.state_version,
                c.checkpoint,
                self._put_decision(c.decision),
                c.committed_at,
                c.settlement.name,
                c.settle_attempts,
                c.lifecycle_revision,
                c.lifecycle_event_sequence,
                c.settled_at,
                c.error_reason,
                self._put_text(c.error_message),
                c.traceparent,
                c.next_settle_at,
                self._put_text(c.last_settle_error),
            ),
        )

    def delete_completion(self, workspace_id: str, task_id: str, generation: int) -> None:
        self._db.execute(
            "DELETE FROM task_completions WHERE workspace_id = ? AND task_id = ? AND generation = ?",
            (workspace_id, task_id, generation),
        )

    def update_completion(self, record: CompletionRecord) -> None:
        self._db.execute(
            # next_settle_at is NOT NULL: a settled row keeps its last due time,
            # which nothing reads (see _completion).
            "UPDATE task_completions SET settlement = ?, settle_attempts = ?, "
            "next_settle_at = coalesce(?, next_settle_at), last_settle_error = ?, lifecycle_revision = ?, "
            "lifecycle_event_sequence = ?, settled_at = ?, error_reason = ?, error_message = ? "
            "WHERE workspace_id = ? AND task_id = ? AND generation = ?",
            (
                record.settlement.name,
                record.settle_attempts,
                record.next_settle_at,
                self._put_text(record.last_settle_error),
                record.lifecycle_revision,
                record.lifecycle_event_sequence,
                record.settled_at,
                record.error_reason,
                self._put_text(record.error_message),
                record.workspace_id,
                record.task_id,
                record.generation,
            ),
        )

    def claim_due_settlements(self, now: int, owner: str, lease_micros: int, limit: int) -> list[CompletionRecord]:
        # One process owns the file: no claim is recorded (see the port).
        rows = self._db.execute(
            f"SELECT {COMPLETION_COLUMNS} FROM task_completions WHERE settlement = 'PENDING' AND next_settle_at <= ? "
            "ORDER BY next_settle_at LIMIT ?",
            (now, limit),
        )
        return [self._completion(r) for r in rows]

    # -- operation ------------------------------------------------------------------------

    def load_figures(self, now: int) -> CompletionFigures:
        pending, oldest = self._db.execute(
            "SELECT count(*), min(committed_at) FROM task_completions WHERE settlement = 'PENDING'"
        ).fetchone()
        open_runs, live = self._db.execute(
            "SELECT count(*), coalesce(sum(CASE WHEN lease_expires_at > ? THEN 1 ELSE 0 END), 0) "
            "FROM agent_runs WHERE finished_at IS NULL",
            (now,),
        ).fetchone()
        (request_ids,) = self._db.execute("SELECT count(*) FROM request_ids").fetchone()
        return CompletionFigures(pending, oldest, open_runs, int(live), request_ids, self._database_bytes())

    def _database_bytes(self) -> int | None:
        return database_bytes(self._db)

    # -- events and audit -------------------------------------------------------------------

    def append_event(self, event: CompletionEvent) -> CompletionEvent:
        e = event
        number, numbering = self._number("completion_events", e.workspace_id, e.task_id)
        row = self._db.execute(
            f"INSERT INTO completion_events ({EVENT_COLUMNS}) VALUES ({number}, {', '.join('?' * 15)}) "
            "RETURNING sequence",
            (
                *numbering,
                e.workspace_id,
                e.task_id,
                e.generation,
                e.kind.name,
                e.run_id,
                e.completion_id,
                e.outcome.name if e.outcome else None,
                self._put_decision(e.decision) if e.decision else None,
                e.lifecycle_revision,
                e.lifecycle_event_sequence,
                e.error_reason,
                self._put_text(e.error_message),
                e.committed_at,
                e.run_outcome.name if e.run_outcome else None,
                e.evidence_id,
            ),
        ).fetchone()
        return dataclasses.replace(e, sequence=row[0])

    def load_events(
        self, workspace_id: str, after_sequence: int, task_id: str | None, limit: int
    ) -> list[CompletionEvent]:
        if task_id:
            # Nothing to hold back: a task's events are numbered under its lock, each
            # above the task's last (see _number), so in its commit order.
            sql = (
                f"SELECT {EVENT_COLUMNS} FROM completion_events "
                "WHERE workspace_id = ? AND task_id = ? AND sequence > ? ORDER BY sequence LIMIT ?"
            )
            params: tuple[object, ...] = (workspace_id, task_id, after_sequence, limit)
        else:
            sql = (
                f"SELECT {EVENT_COLUMNS} FROM completion_events WHERE workspace_id = ? AND sequence > ?"
                f"{self._deliverable('sequence')} ORDER BY sequence LIMIT ?"
            )
            params = (workspace_id, after_sequence, limit)
        return [self._event(r) for r in self._db.execute(sql, params)]

    def insert_audit(self, entry: AuditEntry) -> None:
        number, numbering = self._number("audit_log", entry.workspace_id, entry.task_id)
        self._db.execute(
            f"INSERT INTO audit_log ({_AUDIT_COLUMNS}) VALUES ({number}, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                *numbering,
                entry.workspace_id,
                entry.action,
                entry.run_id,
                entry.task_id,
                json.dumps(dict(entry.metadata), sort_keys=True),
                entry.recorded_at,
                entry.caller.subject,
                entry.caller.role,
            ),
        )

    def load_audit(
        self, workspace_id: str, task_id: str | None, run_id: str | None, after_id: int, limit: int
    ) -> list[AuditEntry]:
        sql = (
            f"SELECT {_AUDIT_COLUMNS} FROM audit_log WHERE workspace_id = ? AND audit_id > ?"
            f"{self._deliverable('audit_id')}"
        )
        params: list[object] = [workspace_id, after_id]
        if task_id:
            sql += " AND task_id = ?"
            params.append(task_id)
        if run_id:
            sql += " AND run_id = ?"
            params.append(run_id)
        sql += " ORDER BY audit_id LIMIT ?"
        params.append(limit)
        return [
            AuditEntry(
                r[1],
                r[2],
                r[3],
                r[4],
                tuple(sorted(json.loads(r[5]).items())),
                r[6],
                audit_id=r[0],
                caller=Caller(r[7], r[8]),
            )
            for r in self._db.execute(sql, params)
        ]

    # -- transcripts ---------------------------------------------------------------------------

    def load_tail(self, workspace_id: str, task_id: str) -> TranscriptState:
        row = self._db.execute(
            "SELECT state_version, open_turn, open_step, open_calls, checkpoint, last_sequence FROM transcript_tails "
            f"WHERE workspace_id = ? AND task_id = ?{self._locking()}",
            (workspace_id, task_id),
        ).fetchone()
        if row is None:
            return TranscriptState()
        return TranscriptState(Tail(row[1], row[2], tuple(json.loads(row[3])), row[4], row[5]), row[0])

    def save_tail(self, workspace_id: str, task_id: str, state: TranscriptState) -> None:
        tail = state.tail
        self._db.execute(
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
        found = {}
        for checkpoint in ids:
            row = self._db.execute(
                "SELECT sequence FROM transcript_checkpoints "
                "WHERE workspace_id = ? AND task_id = ? AND checkpoint_id = ?",
                (workspace_id, task_id, checkpoint),
            ).fetchone()
            if row:
                found[checkpoint] = row[0]
        return found

    def insert_checkpoints(self, workspace_id: str, task_id: str, checkpoints: Mapping[str, int]) -> None:
        self._db.executemany(
            "INSERT INTO transcript_checkpoints (workspace_id, task_id, checkpoint_id, sequence) VALUES (?, ?, ?, ?)",
            [(workspace_id, task_id, checkpoint, sequence) for checkpoint, sequence in checkpoints.items()],
        )

    def load_transcript(self, workspace_id: str, task_id: str, after_sequence: int, limit: int) -> list[SessionEvent]:
        rows = self._db.execute(
            f"SELECT {_TRANSCRIPT_COLUMNS} FROM transcript_events "
            "WHERE workspace_id = ? AND task_id = ? AND sequence > ? ORDER BY sequence LIMIT ?",
            (workspace_id, task_id, after_sequence, limit),
        )
        return [self._session_event(r) for r in rows]

    def insert_transcript_events(self, workspace_id: str, task_id: str, events: Sequence[SessionEvent]) -> None:
        self._db.executemany(
            f"INSERT INTO transcript_events (workspace_id, task_id, {_TRANSCRIPT_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(workspace_id, task_id, *self._session_event_values(e)) for e in events],
        )

    def stage_import(self, import_id: str, events: Sequence[SessionEvent]) -> None:
        self._db.executemany(
            f"INSERT INTO transcript_staging (import_id, {_TRANSCRIPT_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(import_id, *self._session_event_values(e)) for e in events],
        )

    def move_staged_import(self, import_id: str, workspace_id: str, task_id: str) -> None:
        self._db.execute(
            f"INSERT INTO transcript_events (workspace_id, task_id, {_TRANSCRIPT_COLUMNS}) "
            f"SELECT ?, ?, {_TRANSCRIPT_COLUMNS} FROM transcript_staging WHERE import_id = ? ORDER BY sequence",
            (workspace_id, task_id, import_id),
        )
        self._db.execute("DELETE FROM transcript_staging WHERE import_id = ?", (import_id,))

    def discard_import(self, import_id: str | None) -> None:
        if import_id is None:
            self._db.execute("DELETE FROM transcript_staging")
        else:
            self._db.execute("DELETE FROM transcript_staging WHERE import_id = ?", (import_id,))

    # -- row mapping ------------------------------------------------------------------------

    def _run_values(self, run: RunRecord) -> tuple[object, ...]:
        return (
            run.workspace_id,
            run.run_id,
            run.task_id,
            run.agent_id,
            run.generation,
            run.epoch,
            run.claimed_at,
            run.lease_expires_at,
            run.finished_at,
            run.outcome.name if run.outcome else None,
            run.tokens_input,
            run.tokens_output,
            run.tokens_total,
            self._put_text(run.notes),
            int(run.notes_truncated),
            self._put_text(run.error),
            run.final_status.name if run.final_status else None,
        )

    def _run(self, r: Sequence[Any]) -> RunRecord:
        return RunRecord(
            workspace_id=r[0],
            run_id=r[1],
            task_id=r[2],
            agent_id=r[3],
            generation=r[4],
            epoch=r[5],
            claimed_at=r[6],
            lease_expires_at=r[7],
            finished_at=r[8],
            outcome=RunOutcome[r[9]] if r[9] else None,
            tokens_input=r[10],
            tokens_output=r[11],
            tokens_total=r[12],
            notes=self._get_text(r[13]) or "",
            notes_truncated=bool(r[14]),
            error=self._get_text(r[15]) or "",
            final_status=FinalStatus[r[16]] if r[16] else None,
        )

    def _completion(self, r: Sequence[Any]) -> CompletionRecord:
        settlement = SettlementStatus[r[13]]
        return CompletionRecord(
            workspace_id=r[0],
            task_id=r[1],
            generation=r[2],
            completion_id=r[3],
            identity=r[4],
            payload=compact.decode_payload(r[5]),
            outcome=RequestedOutcome[r[6]],
            result=self._get_text(r[7]),
            run_id=r[8],
            state_version=r[9],
            checkpoint=r[10],
            decision=self._get_decision(r[11]),
            committed_at=r[12],
            settlement=settlement,
            settle_attempts=r[14],
            lifecycle_revision=r[15],
            lifecycle_event_sequence=r[16],
            settled_at=r[17],
            error_reason=r[18],
            error_message=self._get_text(r[19]),
            traceparent=r[20],
            next_settle_at=r[21] if settlement is SettlementStatus.PENDING else None,
            last_settle_error=self._get_text(r[22]),
        )

    def _event(self, r: Sequence[Any]) -> CompletionEvent:
        return CompletionEvent(
            sequence=r[0],
            workspace_id=r[1],
            task_id=r[2],
            generation=r[3],
            kind=CompletionEventKind[r[4]],
            run_id=r[5],
            completion_id=r[6],
            outcome=RequestedOutcome[r[7]] if r[7] else None,
            decision=self._get_decision(r[8]) if r[8] else None,
            lifecycle_revision=r[9],
            lifecycle_event_sequence=r[10],
            error_reason=r[11],
            error_message=self._get_text(r[12]),
            committed_at=r[13],
            run_outcome=RunOutcome[r[14]] if r[14] else None,
            evidence_id=r[15],
        )

    def _session_event_values(self, e: SessionEvent) -> tuple[object, ...]:
        return (
            e.sequence,
            e.generation,
            e.kind.name,
            e.ref,
            self._put_text(e.name),
            self._put_text(e.text),
            int(e.is_error),
            e.reason.name if e.reason else None,
            int(e.synthetic),
            e.recorded_at,
        )

    def _session_event(self, r: Sequence[Any]) -> SessionEvent:
        return SessionEvent(
            sequence=r[0],
            generation=r[1],
            kind=EventKind[r[2]],
            ref=r[3],
            name=self._get_text(r[4]),
            text=self._get_text(r[5]),
            is_error=bool(r[6]),
            reason=TurnEndReason[r[7]] if r[7] else None,
            synthetic=bool(r[8]),
            recorded_at=r[9],
        )
