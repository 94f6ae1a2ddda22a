"""The SQLite adapter of the completion store. Every public method is one
transaction, run on the connection's thread in a single hop."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import sqlite3
from collections.abc import Callable

from google.protobuf.message import Message

from completion_service.core import gates
from completion_service.core.duplicates import CompletionKey, DuplicateVerdict, judge_duplicate
from completion_service.core.gates import snapshot_basis
from completion_service.core.identity import IdentityInput, completion_identity, identity_payload
from completion_service.core.model import (
    AuditEntry,
    CompletionEvent,
    CompletionEventKind,
    CompletionRecord,
    EvidenceFact,
    EvidenceRecord,
    FinalStatus,
    Lease,
    PriorAttempt,
    RequestedOutcome,
    RunOutcome,
    RunRecord,
    SettlementStatus,
    Snapshot,
    TranscriptTail,
    decision_from_json,
    decision_to_json,
)
from completion_service.core.runs import LeaseHeld, RenewalProblem, judge_claim, judge_renewal
from completion_service.core.settlement import refusal_decision, supersedable
from completion_service.errors import Reason
from completion_service.storage.port import (
    AttemptCommand,
    AttemptOutcome,
    ClaimCommand,
    Claimed,
    CloseCommand,
    CompletionCorrupted,
    Page,
    Remembered,
    Settlement,
)
from completion_service.storage.transcripts import TranscriptStorage
from funnel.auth.principal import Caller
from funnel.runtime.clock import Clock, IdSource
from funnel.runtime.errors import Rejection, instant, reject
from funnel.runtime.faults import NO_FAULTS, Faults
from funnel.runtime.idempotency import RequestIdVerdict, RequestKey, judge_request_id
from funnel.runtime.sqlite import Database, migrations_in, probe_writable

log = logging.getLogger(__name__)
MIGRATIONS_PACKAGE = "completion_service.storage.migrations"

_RUN_COLUMNS = (
    "workspace_id, run_id, task_id, agent_id, generation, epoch, claimed_at, lease_expires_at, finished_at, outcome, "
    "tokens_input, tokens_output, tokens_total, notes, notes_truncated, error, final_status"
)
_COMPLETION_COLUMNS = (
    "workspace_id, task_id, generation, completion_id, identity, payload, outcome, result, run_id, state_version, "
    "checkpoint, decision, committed_at, settlement, settle_attempts, lifecycle_revision, lifecycle_event_sequence, "
    "settled_at, error_reason, error_message"
)
_EVENT_COLUMNS = (
    "sequence, workspace_id, task_id, generation, kind, run_id, completion_id, outcome, decision, lifecycle_revision, "
    "lifecycle_event_sequence, error_reason, error_message, committed_at"
)
_EVIDENCE_COLUMNS = (
    "evidence_id, workspace_id, task_id, generation, kind, passed, checkpoint, details, run_id, recorded_at"
)


class _RolledBack(Exception):
    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


class SqliteCompletionStore(TranscriptStorage):
    def __init__(
        self,
        writer: Database,
        reader: Database,
        clock: Clock,
        ids: IdSource,
        on_commit: Callable[[list[CompletionEvent]], None] = lambda events: None,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self._writer = writer
        self._reader = reader
        self._clock = clock
        self._ids = ids
        self._on_commit = on_commit
        self._faults = faults

    @classmethod
    async def open(
        cls,
        path: str,
        clock: Clock,
        ids: IdSource,
        on_commit: Callable[[list[CompletionEvent]], None] = lambda events: None,
        faults: Faults = NO_FAULTS,
    ) -> SqliteCompletionStore:
        writer = await Database.open(path, migrations_in(MIGRATIONS_PACKAGE))
        reader = await Database.open_reader(writer)
        return cls(writer, reader, clock, ids, on_commit, faults)

    async def close(self) -> None:
        if self._reader is not self._writer:
            await self._reader.close()
        await self._writer.close()

    async def check_writable(self) -> None:
        await self._writer.run(probe_writable)

    async def _write(self, body: Callable[[sqlite3.Connection, list[CompletionEvent]], object]):
        """One write transaction; the events it appended are published after commit.
        A body that returns a Rejection is rolled back: a refused request changes nothing."""
        events: list[CompletionEvent] = []

        def publish(_: object) -> None:
            if events:
                self._on_commit(list(events))

        def run(db: sqlite3.Connection) -> object:
            events.clear()
            result = body(db, events)
            if isinstance(result, Rejection):
                raise _RolledBack(result)
            return result

        try:
            return await self._writer.write(run, after_commit=publish)
        except _RolledBack as rolled_back:
            return rolled_back.rejection

    # -- request ids -------------------------------------------------------

    def _recall(self, db: sqlite3.Connection, request: RequestKey | None):
        """Remembered, a REQUEST_ID_REUSED rejection, or None for a new request."""
        if request is None:
            return None
        row = db.execute(
            "SELECT fingerprint, response FROM request_ids "
            "WHERE workspace_id = ? AND caller = ? AND method = ? AND request_id = ?",
            (request.workspace_id, request.caller, request.method, request.request_id),
        ).fetchone()
        verdict = judge_request_id(row[0] if row else None, request.fingerprint)
        if verdict is RequestIdVerdict.REPLAY:
            return Remembered(row[1])
        if verdict is RequestIdVerdict.REUSED:
            return reject(
                Reason.REQUEST_ID_REUSED,
                f"request_id {request.request_id!r} was already used for a different request",
                request_id=request.request_id,
            )
        return None

    def _remember(self, db: sqlite3.Connection, request: RequestKey | None, response: Message) -> None:
        if request is not None:
            db.execute(
                "INSERT INTO request_ids (workspace_id, caller, method, request_id, fingerprint, response, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    request.workspace_id,
                    request.caller,
                    request.method,
                    request.request_id,
                    request.fingerprint,
                    response.SerializeToString(),
                    self._clock.now_micros(),
                ),
            )

    async def recall(self, request: RequestKey | None):
        """Reads what a request id stands for, without taking the write lock."""
        return await self._reader.read(lambda db: self._recall(db, request))

    async def sweep_request_ids(self, created_before: int, limit: int) -> int:
        return await self._write(
            lambda db, events: db.execute(
                "DELETE FROM request_ids WHERE rowid IN "
                "(SELECT rowid FROM request_ids WHERE created_at < ? ORDER BY created_at LIMIT ?)",
                (created_before, limit),
            ).rowcount
        )

    # -- runs and leases ---------------------------------------------------

    async def claim(self, command: ClaimCommand):
        def body(db: sqlite3.Connection, events: list) -> object:
            recalled = self._recall(db, command.request)
            if recalled is not None:
                return recalled
            now = self._clock.now_micros()
            current = _load_lease(db, command.workspace_id, command.task_id)
            holder_open = current is not None and _run_is_open(db, command.workspace_id, current.run_id)
            verdict = judge_claim(current, holder_open, now, command.ttl_micros)
            if isinstance(verdict, LeaseHeld):
                return reject(
                    Reason.LEASE_HELD,
                    f"run {verdict.holder.run_id} holds a live lease on task {command.task_id!r}",
                    holder_run_id=verdict.holder.run_id,
                    lease_expire_time=instant(verdict.holder.expires_at),
                )
            run = RunRecord(
                workspace_id=command.workspace_id,
                run_id=self._ids.new_id("run"),
                task_id=command.task_id,
                agent_id=command.agent_id,
                generation=command.generation,
                epoch=verdict.epoch,
                claimed_at=now,
                lease_expires_at=verdict.expires_at,
            )
            lease = Lease(command.task_id, run.run_id, verdict.epoch, verdict.expires_at)
            # The previous holder is gone: close the turn it left open before the
            # new run starts its own (the repair of brief §4, at the hand-over).
            self._repair(db, command.workspace_id, command.task_id)
            db.execute(
                f"INSERT INTO agent_runs ({_RUN_COLUMNS}) VALUES ({', '.join('?' * 17)})", _run_values(run)
            )
            db.execute(
                "INSERT INTO task_leases (workspace_id, task_id, run_id, epoch, expires_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (workspace_id, task_id) DO UPDATE SET run_id = excluded.run_id, epoch = excluded.epoch, "
                "expires_at = excluded.expires_at",
                (command.workspace_id, command.task_id, lease.run_id, lease.epoch, lease.expires_at),
            )
            self._remember(db, command.request, command.render(run, lease))
            return Claimed(run, lease)

        return await self._write(body)

    async def withdraw_claim(self, workspace_id: str, run_id: str, request: RequestKey | None, reason: str) -> None:
        """Undoes a claim the lifecycle service refused: the run closes as cancelled,
        its lease is released, and its request id is forgotten so a retry claims anew."""

        def body(db: sqlite3.Connection, events: list) -> None:
            now = self._clock.now_micros()
            db.execute(
                "UPDATE agent_runs SET finished_at = ?, outcome = 'CANCELLED', error = ?, lease_expires_at = "
                "MIN(lease_expires_at, ?) "
                "WHERE workspace_id = ? AND run_id = ? AND finished_at IS NULL",
                (now, f"claim withdrawn: {reason}", now, workspace_id, run_id),
            )
            db.execute(
                "UPDATE task_leases SET expires_at = MIN(expires_at, ?) WHERE workspace_id = ? AND run_id = ?",
                (now, workspace_id, run_id),
            )
            if request is not None:
                db.execute(
                    "DELETE FROM request_ids WHERE workspace_id = ? AND caller = ? AND method = ? AND request_id = ?",
                    (request.workspace_id, request.caller, request.method, request.request_id),
                )

        await self._write(body)

    async def renew(self, workspace_id: str, run_id: str, epoch: int, ttl_micros: int, holder, request, render):
        def body(db: sqlite3.Connection, events: list) -> object:
            recalled = self._recall(db, request)
            if recalled is not None:
                return recalled
            run = _load_run(db, workspace_id, run_id)
            if run is None:
                return _run_not_found(run_id)
            if holder is not None and run.agent_id != holder:
                return _not_held(run)
            now = self._clock.now_micros()
            lease = _load_lease(db, workspace_id, run.task_id)
            problem = judge_renewal(run.open, run.run_id, epoch, lease, now)
            if problem is RenewalProblem.RUN_CLOSED:
                return _already_finished(run)
            if problem is RenewalProblem.NOT_CURRENT or lease is None:  # no lease is never current
                return reject(
                    Reason.LEASE_NOT_CURRENT,
                    f"the lease of epoch {epoch} was superseded",
                    epoch=epoch,
                    current_epoch=lease.epoch if lease else 0,
                )
            if problem is RenewalProblem.EXPIRED:
                return reject(
                    Reason.LEASE_EXPIRED, "the lease expired; claim the task again",
                    lease_expire_time=instant(lease.expires_at),
                )
            renewed = dataclasses.replace(lease, expires_at=now + ttl_micros)
            db.execute(
                "UPDATE task_leases SET expires_at = ? WHERE workspace_id = ? AND task_id = ?",
                (renewed.expires_at, workspace_id, run.task_id),
            )
            db.execute(
                "UPDATE agent_runs SET lease_expires_at = ? WHERE workspace_id = ? AND run_id = ?",
                (renewed.expires_at, workspace_id, run_id),
            )
            self._remember(db, request, render(renewed))
            return renewed

        return await self._write(body)

    async def close_run(self, command: CloseCommand):
        """Closes an open run and writes its audit row, atomically."""

        def body(db: sqlite3.Connection, events: list) -> object:
            recalled = self._recall(db, command.request)
            if recalled is not None:
                return recalled
            run = _load_run(db, command.workspace_id, command.run_id)
            if run is None:
                return _run_not_found(command.run_id)
            if not run.open:
                return _already_finished(run)
            now = self._clock.now_micros()
            closed = dataclasses.replace(
                run,
                finished_at=now,
                outcome=command.outcome,
                tokens_input=command.tokens_input,
                tokens_output=command.tokens_output,
                tokens_total=command.tokens_total,
                notes=command.notes,
                notes_truncated=command.notes_truncated,
                error=command.error,
                final_status=command.final_status,
            )
            db.execute(
                "UPDATE agent_runs SET finished_at = ?, outcome = ?, tokens_input = ?, tokens_output = ?, tokens_total "
                "= ?, "
                "notes = ?, notes_truncated = ?, error = ?, final_status = ? WHERE workspace_id = ? AND run_id = ?",
                (
                    now,
                    command.outcome.name,
                    command.tokens_input,
                    command.tokens_output,
                    command.tokens_total,
                    command.notes,
                    int(command.notes_truncated),
                    command.error,
                    command.final_status.name if command.final_status else None,
                    command.workspace_id,
                    command.run_id,
                ),
            )
            metadata = {
                "outcome": command.outcome.name,
                "final_status": command.final_status.name if command.final_status else "UNCHANGED",
                "closed_by": command.closed_by,
            }
            db.execute(
                "INSERT INTO audit_log (workspace_id, action, run_id, task_id, metadata, recorded_at, caller_subject, "
                "caller_role) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    command.workspace_id,
                    "task.completed",
                    run.run_id,
                    run.task_id,
                    json.dumps(metadata, sort_keys=True),
                    now,
                    command.caller.subject,
                    command.caller.role,
                ),
            )
            if command.render is not None:
                self._remember(db, command.request, command.render(closed))
            return closed

        return await self._write(body)

    async def get_run(self, workspace_id: str, run_id: str) -> RunRecord | None:
        return await self._reader.read(lambda db: _load_run(db, workspace_id, run_id))

    async def get_lease(self, workspace_id: str, task_id: str) -> Lease | None:
        return await self._reader.read(lambda db: _load_lease(db, workspace_id, task_id))

    async def list_runs(self, workspace_id: str, task_id: str | None, before: tuple | None, limit: int) -> Page:
        sql = f"SELECT {_RUN_COLUMNS} FROM agent_runs WHERE workspace_id = ?"
        params: list = [workspace_id]
        if task_id:
            sql += " AND task_id = ?"
            params.append(task_id)
        if before is not None:
            sql += " AND (claimed_at, run_id) < (?, ?)"
            params += list(before)
        sql += " ORDER BY claimed_at DESC, run_id DESC LIMIT ?"
        params.append(limit + 1)
        rows = await self._reader.read(lambda db: [_run_from_row(r) for r in db.execute(sql, params)])
        return Page(rows[:limit], len(rows) > limit)

    async def stalled_runs(self, now: int, stall_after_micros: int, limit: int) -> list[RunRecord]:
        sql = (
            f"SELECT {_RUN_COLUMNS} FROM agent_runs WHERE finished_at IS NULL AND lease_expires_at <= ? "
            "ORDER BY lease_expires_at LIMIT ?"
        )
        return await self._reader.read(
            lambda db: [_run_from_row(r) for r in db.execute(sql, (now - stall_after_micros, limit))]
        )

    # -- evidence ----------------------------------------------------------

    async def record_evidence(self, record: EvidenceRecord, holder, request, render):
        def body(db: sqlite3.Connection, events: list) -> object:
            recalled = self._recall(db, request)
            if recalled is not None:
                return recalled
            if holder is not None:
                # An agent vouches only for its own open run of this task.
                run = _load_run(db, record.workspace_id, record.run_id) if record.run_id else None
                if run is None or run.task_id != record.task_id or run.agent_id != holder or not run.open:
                    return reject(
                        Reason.RUN_NOT_HELD,
                        "an agent records evidence only with an open run of the task that it holds (run_id)",
                        run_id=record.run_id or "",
                    )
            stored = dataclasses.replace(
                record, evidence_id=self._ids.new_id("evd"), recorded_at=self._clock.now_micros()
            )
            db.execute(
                f"INSERT INTO evidence ({_EVIDENCE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    stored.evidence_id,
                    stored.workspace_id,
                    stored.task_id,
                    stored.generation,
                    stored.kind,
                    int(stored.passed),
                    stored.checkpoint,
                    stored.details,
                    stored.run_id,
                    stored.recorded_at,
                ),
            )
            self._remember(db, request, render(stored))
            return stored

        return await self._write(body)

    async def list_evidence(self, workspace_id: str, task_id: str, generation: int) -> list[EvidenceRecord]:
        sql = (
            f"SELECT {_EVIDENCE_COLUMNS} FROM evidence WHERE workspace_id = ? AND task_id = ? AND generation = ? "
            "ORDER BY sequence"
        )
        return await self._reader.read(
            lambda db: [_evidence_from_row(r) for r in db.execute(sql, (workspace_id, task_id, generation))]
        )

    # -- the completion transaction ----------------------------------------

    async def snapshot(self, command: AttemptCommand) -> Snapshot | Rejection:
        """The snapshot an attempt would be judged on now (read only)."""

        def read(db: sqlite3.Connection) -> Snapshot | Rejection:
            run = _load_run(db, command.workspace_id, command.run_id)
            if run is None or run.task_id != command.task_id:
                return _run_not_found(command.run_id)
            if command.holder is not None and run.agent_id != command.holder:
                return _not_held(run)
            return _load_snapshot(db, command, run, self._clock.now_micros())

        return await self._reader.read(read)

    async def attempt(self, command: AttemptCommand):
        """Steps 1-5 of the completion transaction under one write lock: the
        snapshot is loaded, judged and committed against the same state."""

        def body(db: sqlite3.Connection, events: list) -> object:
            recalled = self._recall(db, command.request)
            if recalled is not None:
                return recalled
            run = _load_run(db, command.workspace_id, command.run_id)
            if run is None or run.task_id != command.task_id:
                return _run_not_found(command.run_id)
            if command.holder is not None and run.agent_id != command.holder:
                return _not_held(run)
            now = self._clock.now_micros()
            snapshot = _load_snapshot(db, command, run, now)
            if command.external_basis is not None and snapshot_basis(snapshot) != command.external_basis:
                return reject(
                    Reason.SNAPSHOT_CHANGED,
                    "the lease or the state version changed while external gates were consulted; retry",
                    what="lease_or_state_version",
                )
            assert command.policy is not None, "the authority fills in the workspace's policy"
            decision = gates.decide(snapshot, command.policy, command.external_answers)
            db.execute(
                "INSERT INTO completion_attempts (workspace_id, task_id, generation, run_id, checkpoint, "
                "result_digest, "
                "verdict, state_version, attempted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    command.workspace_id,
                    command.task_id,
                    run.generation,
                    run.run_id,
                    snapshot.transcript.checkpoint,
                    snapshot.result_digest,
                    decision.verdict.name,
                    snapshot.evaluated_state_version,
                    now,
                ),
            )
            if not decision.allowed:
                events.append(
                    _insert_event(
                        db,
                        CompletionEvent(
                            command.workspace_id,
                            command.task_id,
                            run.generation,
                            CompletionEventKind.DECISION_BLOCKED,
                            run.run_id,
                            now,
                            outcome=command.outcome,
                            decision=decision,
                        ),
                    )
                )
                return self._answer(db, command, AttemptOutcome(decision))
            identity_input = IdentityInput(
                workspace_id=command.workspace_id,
                task_id=command.task_id,
                generation=run.generation,
                state_version=snapshot.evaluated_state_version,
                checkpoint=snapshot.transcript.checkpoint,
                outcome=command.outcome.name,
                decision_schema=decision.decision_schema,
            )
            key = CompletionKey(
                completion_identity(identity_input), identity_payload(identity_input), command.outcome.name
            )
            stored = _load_completion(db, command.workspace_id, command.task_id, run.generation)
            superseded = stored is not None and supersedable(stored)
            if superseded:  # refused for a reason that has passed: this attempt replaces it
                stored = None
            verdict = judge_duplicate(
                CompletionKey(stored.identity, stored.payload, stored.outcome.name) if stored else None, key
            )
            if verdict is not DuplicateVerdict.INSERT:
                assert stored is not None, "only a stored completion is anything but INSERT"
                if verdict is DuplicateVerdict.CORRUPTED:
                    raise CompletionCorrupted(stored.completion_id)
                if verdict is DuplicateVerdict.CONFLICT:
                    return reject(
                        Reason.COMPLETION_CONFLICT,
                        f"generation {run.generation} already has a {stored.outcome.name} completion",
                        completion_id=stored.completion_id,
                        outcome=stored.outcome.name,
                    )
                return self._answer(db, command, AttemptOutcome(decision, stored, existing=True))
            record = CompletionRecord(
                workspace_id=command.workspace_id,
                task_id=command.task_id,
                generation=run.generation,
                completion_id=self._ids.new_id("cmp"),
                identity=key.identity,
                payload=key.payload,
                outcome=command.outcome,
                result=command.result,
                run_id=run.run_id,
                state_version=snapshot.evaluated_state_version,
                checkpoint=snapshot.transcript.checkpoint,
                decision=decision,
                committed_at=now,
                settlement=SettlementStatus.PENDING,
            )
            if superseded:
                db.execute(
                    "DELETE FROM task_completions WHERE workspace_id = ? AND task_id = ? AND generation = ?",
                    (record.workspace_id, record.task_id, record.generation),
                )
            _insert_completion(db, record)
            events.append(
                _insert_event(
                    db,
                    CompletionEvent(
                        record.workspace_id,
                        record.task_id,
                        record.generation,
                        CompletionEventKind.COMPLETION_COMMITTED,
                        record.run_id,
                        now,
                        completion_id=record.completion_id,
                        outcome=record.outcome,
                        decision=decision,
                    ),
                )
            )
            return self._answer(db, command, AttemptOutcome(decision, record, inserted=True))

        return await self._write(body)

    def _answer(self, db: sqlite3.Connection, command: AttemptCommand, outcome: AttemptOutcome) -> AttemptOutcome:
        if command.render is not None:
            self._remember(db, command.request, command.render(outcome))
        return outcome

    async def record_settlement(self, completion: CompletionRecord, settlement: Settlement) -> CompletionRecord | None:
        """Records the lifecycle's final answer for a pending row, exactly once:
        returns the updated row, or None when it was no longer pending."""

        def body(db: sqlite3.Connection, events: list) -> CompletionRecord | None:
            now = self._clock.now_micros()
            status = SettlementStatus.REJECTED if settlement.rejected else SettlementStatus.SETTLED
            updated = db.execute(
                "UPDATE task_completions SET settlement = ?, lifecycle_revision = ?, lifecycle_event_sequence = ?, "
                "settled_at = ?, error_reason = ?, error_message = ?, settle_attempts = settle_attempts + 1 "
                "WHERE workspace_id = ? AND task_id = ? AND generation = ? AND settlement = 'PENDING'",
                (
                    status.name,
                    settlement.lifecycle_revision,
                    settlement.lifecycle_event_sequence,
                    now,
                    settlement.error_reason,
                    settlement.error_message,
                    completion.workspace_id,
                    completion.task_id,
                    completion.generation,
                ),
            ).rowcount
            if updated == 0:
                return None
            events.append(
                _insert_event(
                    db,
                    CompletionEvent(
                        completion.workspace_id,
                        completion.task_id,
                        completion.generation,
                        CompletionEventKind.TERMINALIZATION_ERROR
                        if settlement.rejected
                        else CompletionEventKind.COMPLETION_SETTLED,
                        completion.run_id,
                        now,
                        completion_id=completion.completion_id,
                        outcome=completion.outcome,
                        lifecycle_revision=settlement.lifecycle_revision,
                        lifecycle_event_sequence=settlement.lifecycle_event_sequence,
                        error_reason=settlement.error_reason,
                        error_message=settlement.error_message,
                        decision=refusal_decision(
                            completion.decision, settlement.error_reason or "", settlement.error_message or ""
                        )
                        if settlement.rejected
                        else None,
                    ),
                )
            )
            # The row as just written, without reading it back and decoding its decision.
            return dataclasses.replace(
                completion,
                settlement=status,
                settle_attempts=completion.settle_attempts + 1,
                lifecycle_revision=settlement.lifecycle_revision,
                lifecycle_event_sequence=settlement.lifecycle_event_sequence,
                settled_at=now,
                error_reason=settlement.error_reason,
                error_message=settlement.error_message,
            )

        return await self._write(body)

    async def postpone_settlement(self, completion: CompletionRecord, next_attempt_at: int) -> None:
        await self._write(
            lambda db, events: db.execute(
                "UPDATE task_completions SET settle_attempts = settle_attempts + 1, next_settle_at = ? "
                "WHERE workspace_id = ? AND task_id = ? AND generation = ? AND settlement = 'PENDING'",
                (next_attempt_at, completion.workspace_id, completion.task_id, completion.generation),
            )
        )

    async def due_settlements(self, now: int, limit: int) -> list[CompletionRecord]:
        sql = (
            f"SELECT {_COMPLETION_COLUMNS} FROM task_completions WHERE settlement = 'PENDING' AND next_settle_at <= ? "
            "ORDER BY next_settle_at LIMIT ?"
        )
        return await self._reader.read(lambda db: [_completion_from_row(r) for r in db.execute(sql, (now, limit))])

    async def get_completion(self, workspace_id: str, task_id: str, generation: int) -> CompletionRecord | None:
        return await self._reader.read(lambda db: _load_completion(db, workspace_id, task_id, generation))

    async def settled_completion(self, workspace_id: str, task_id: str, generation: int) -> CompletionRecord | None:
        completion = await self.get_completion(workspace_id, task_id, generation)
        return completion if completion and completion.settlement is SettlementStatus.SETTLED else None

    async def list_completions(self, workspace_id: str, task_id: str | None, after: tuple | None, limit: int) -> Page:
        sql = f"SELECT {_COMPLETION_COLUMNS} FROM task_completions WHERE workspace_id = ?"
        params: list = [workspace_id]
        if task_id:
            sql += " AND task_id = ?"
            params.append(task_id)
        if after is not None:
            sql += " AND (committed_at, completion_id) > (?, ?)"
            params += list(after)
        sql += " ORDER BY committed_at, completion_id LIMIT ?"
        params.append(limit + 1)
        rows = await self._reader.read(lambda db: [_completion_from_row(r) for r in db.execute(sql, params)])
        return Page(rows[:limit], len(rows) > limit)

    # -- events and audit --------------------------------------------------

    async def events_after(
        self, workspace_id: str, after_sequence: int, task_id: str | None, limit: int
    ) -> list[CompletionEvent]:
        sql = f"SELECT {_EVENT_COLUMNS} FROM completion_events WHERE workspace_id = ? AND sequence > ?"
        params: list = [workspace_id, after_sequence]
        if task_id:
            sql = (
                f"SELECT {_EVENT_COLUMNS} FROM completion_events "
                "WHERE workspace_id = ? AND task_id = ? AND sequence > ?"
            )
            params = [workspace_id, task_id, after_sequence]
        sql += " ORDER BY sequence LIMIT ?"
        params.append(limit)
        return await self._reader.read(lambda db: [_event_from_row(r) for r in db.execute(sql, params)])

    async def list_audit(
        self, workspace_id: str, task_id: str | None, run_id: str | None, after_id: int, limit: int
    ) -> Page:
        sql = (
            "SELECT audit_id, workspace_id, action, run_id, task_id, metadata, recorded_at, caller_subject, "
            "caller_role "
            "FROM audit_log WHERE workspace_id = ? AND audit_id > ?"
        )
        params: list = [workspace_id, after_id]
        if task_id:
            sql += " AND task_id = ?"
            params.append(task_id)
        if run_id:
            sql += " AND run_id = ?"
            params.append(run_id)
        sql += " ORDER BY audit_id LIMIT ?"
        params.append(limit + 1)

        def read(db: sqlite3.Connection) -> list[AuditEntry]:
            return [
                AuditEntry(
                    r[1], r[2], r[3], r[4], tuple(sorted(json.loads(r[5]).items())), r[6], audit_id=r[0],
                    caller=Caller(r[7], r[8]),
                )
                for r in db.execute(sql, params)
            ]

        rows = await self._reader.read(read)
        return Page(rows[:limit], len(rows) > limit)


def _load_snapshot(db: sqlite3.Connection, command: AttemptCommand, run: RunRecord, now: int) -> Snapshot:
    assert command.lifecycle is not None, "the authority fills in the lifecycle view"
    tail = _load_tail(db, command.workspace_id, command.task_id)
    evidence = tuple(
        EvidenceFact(r[0], bool(r[1]), r[2], r[3], r[4])
        for r in db.execute(
            "SELECT kind, passed, checkpoint, generation, sequence FROM evidence "
            "WHERE workspace_id = ? AND task_id = ? AND generation = ? ORDER BY sequence",
            (command.workspace_id, command.task_id, run.generation),
        )
    )
    attempts = tuple(
        PriorAttempt(r[0], r[1], r[2] != "ALLOW")
        for r in db.execute(
            "SELECT checkpoint, result_digest, verdict FROM completion_attempts "
            "WHERE workspace_id = ? AND task_id = ? AND generation = ? ORDER BY id",
            (command.workspace_id, command.task_id, run.generation),
        )
    )
    return Snapshot(
        workspace_id=command.workspace_id,
        task_id=command.task_id,
        now=now,
        run=run.view(),
        lease=_load_lease(db, command.workspace_id, command.task_id),
        claimed_epoch=command.claimed_epoch,
        transcript=tail,
        evaluated_state_version=tail.state_version if command.state_version is None else command.state_version,
        evidence=evidence,
        lifecycle=command.lifecycle,
        attempts=attempts,
        outcome=command.outcome,
        result=command.result,
        result_digest=hashlib.sha256(command.result.encode("utf-8")).hexdigest(),
    )


def _load_tail(db: sqlite3.Connection, workspace_id: str, task_id: str) -> TranscriptTail:
    row = db.execute(
        "SELECT state_version, open_turn, open_step, open_calls, checkpoint FROM transcript_tails "
        "WHERE workspace_id = ? AND task_id = ?",
        (workspace_id, task_id),
    ).fetchone()
    if row is None:
        return TranscriptTail()
    return TranscriptTail(row[0], row[1], row[2], tuple(json.loads(row[3])), row[4])


def _load_lease(db: sqlite3.Connection, workspace_id: str, task_id: str) -> Lease | None:
    row = db.execute(
        "SELECT task_id, run_id, epoch, expires_at FROM task_leases WHERE workspace_id = ? AND task_id = ?",
        (workspace_id, task_id),
    ).fetchone()
    return Lease(*row) if row else None


def _run_is_open(db: sqlite3.Connection, workspace_id: str, run_id: str) -> bool:
    row = db.execute(
        "SELECT finished_at IS NULL FROM agent_runs WHERE workspace_id = ? AND run_id = ?", (workspace_id, run_id)
    ).fetchone()
    return bool(row and row[0])


def _load_run(db: sqlite3.Connection, workspace_id: str, run_id: str) -> RunRecord | None:
    row = db.execute(
        f"SELECT {_RUN_COLUMNS} FROM agent_runs WHERE workspace_id = ? AND run_id = ?", (workspace_id, run_id)
    ).fetchone()
    return _run_from_row(row) if row else None


def _run_not_found(run_id: str) -> Rejection:
    return reject(Reason.RUN_NOT_FOUND, f"run {run_id!r} does not exist", run_id=run_id)


def _not_held(run: RunRecord) -> Rejection:
    return reject(
        Reason.RUN_NOT_HELD, f"run {run.run_id} belongs to another agent; an agent acts only on its own runs",
        run_id=run.run_id,
    )


def _already_finished(run: RunRecord) -> Rejection:
    assert run.finished_at is not None, "only a closed run is already finished"
    return reject(
        Reason.RUN_ALREADY_FINISHED,
        f"run {run.run_id} was already closed",
        run_id=run.run_id,
        finish_time=instant(run.finished_at),
    )


def _run_values(run: RunRecord) -> tuple:
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
        run.notes,
        int(run.notes_truncated),
        run.error,
        run.final_status.name if run.final_status else None,
    )


def _run_from_row(r: tuple) -> RunRecord:
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
        notes=r[13] or "",
        notes_truncated=bool(r[14]),
        error=r[15] or "",
        final_status=FinalStatus[r[16]] if r[16] else None,
    )


def _evidence_from_row(r: tuple) -> EvidenceRecord:
    return EvidenceRecord(r[0], r[1], r[2], r[3], r[4], bool(r[5]), r[6], r[7], r[8], r[9])


def _insert_completion(db: sqlite3.Connection, c: CompletionRecord) -> None:
    db.execute(
        f"INSERT INTO task_completions ({_COMPLETION_COLUMNS}, next_settle_at) VALUES ({', '.join('?' * 21)})",
        (
            c.workspace_id,
            c.task_id,
            c.generation,
            c.completion_id,
            c.identity,
            c.payload,
            c.outcome.name,
            c.result,
            c.run_id,
            c.state_version,
            c.checkpoint,
            decision_to_json(c.decision),
            c.committed_at,
            c.settlement.name,
            c.settle_attempts,
            c.lifecycle_revision,
            c.lifecycle_event_sequence,
            c.settled_at,
            c.error_reason,
            c.error_message,
            c.committed_at,
        ),
    )


def _load_completion(
    db: sqlite3.Connection, workspace_id: str, task_id: str, generation: int
) -> CompletionRecord | None:
    row = db.execute(
        f"SELECT {_COMPLETION_COLUMNS} FROM task_completions WHERE workspace_id = ? AND task_id = ? AND generation = ?",
        (workspace_id, task_id, generation),
    ).fetchone()
    return _completion_from_row(row) if row else None


def _completion_from_row(r: tuple) -> CompletionRecord:
    return CompletionRecord(
        workspace_id=r[0],
        task_id=r[1],
        generation=r[2],
        completion_id=r[3],
        identity=r[4],
        payload=bytes(r[5]),
        outcome=RequestedOutcome[r[6]],
        result=r[7],
        run_id=r[8],
        state_version=r[9],
        checkpoint=r[10],
        decision=decision_from_json(r[11]),
        committed_at=r[12],
        settlement=SettlementStatus[r[13]],
        settle_attempts=r[14],
        lifecycle_revision=r[15],
        lifecycle_event_sequence=r[16],
        settled_at=r[17],
        error_reason=r[18],
        error_message=r[19],
    )


def _insert_event(db: sqlite3.Connection, e: CompletionEvent) -> CompletionEvent:
    cursor = db.execute(
        "INSERT INTO completion_events (workspace_id, task_id, generation, kind, run_id, completion_id, outcome, "
        "decision, "
        "lifecycle_revision, lifecycle_event_sequence, error_reason, error_message, committed_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            e.workspace_id,
            e.task_id,
            e.generation,
            e.kind.name,
            e.run_id,
            e.completion_id,
            e.outcome.name if e.outcome else None,
            decision_to_json(e.decision) if e.decision else None,
            e.lifecycle_revision,
            e.lifecycle_event_sequence,
            e.error_reason,
            e.error_message,
            e.committed_at,
        ),
    )
    assert cursor.lastrowid is not None, "an INSERT sets lastrowid"
    return dataclasses.replace(e, sequence=cursor.lastrowid)


def _event_from_row(r: tuple) -> CompletionEvent:
    return CompletionEvent(
        sequence=r[0],
        workspace_id=r[1],
        task_id=r[2],
        generation=r[3],
        kind=CompletionEventKind[r[4]],
        run_id=r[5],
        completion_id=r[6],
        outcome=RequestedOutcome[r[7]] if r[7] else None,
        decision=decision_from_json(r[8]) if r[8] else None,
        lifecycle_revision=r[9],
        lifecycle_event_sequence=r[10],
        error_reason=r[11],
        error_message=r[12],
        committed_at=r[13],
    )
