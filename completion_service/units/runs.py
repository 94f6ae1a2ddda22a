"""Units of work for agent runs and leases: claim, renew, close a
run (with its audit row) and close stalled runs. Each is a plain function over one
transaction (storage/port.py): load, let the pure core decide, write, remember the
response of a request id. No I/O, no clock: `now` and new ids come in."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from completion_service.core.model import (
    AuditEntry,
    CompletionEvent,
    CompletionEventKind,
    FinalStatus,
    Lease,
    RunOutcome,
    RunRecord,
    SettlementStatus,
)
from completion_service.core.runs import (
    LeaseGranted,
    LeaseHeld,
    RenewalProblem,
    is_stalled,
    judge_claim,
    judge_renewal,
)
from completion_service.core.settlement import fence_refused
from completion_service.errors import Reason
from completion_service.storage.port import CompletionReadTx, CompletionTx
from completion_service.units.request_ids import answer, peek, recalled
from completion_service.units.transcripts import repair as repair_transcript
from funnel.auth.principal import Caller
from funnel.runtime.errors import Rejection, instant, reject
from funnel.runtime.idempotency import Replay, RequestKey

# This service's own background work (the stall sweeper), as recorded on audit rows.
SELF = Caller("completion_service", "service")
AUDIT_ACTION = "task.completed"


@dataclass(frozen=True)
class ClaimCommand:
    workspace_id: str
    task_id: str
    agent_id: str
    # The generation the lifecycle service reported for the task.
    generation: int
    ttl_micros: int
    # The id of the run this claim opens.
    run_id: str
    request: RequestKey | None = None
    render: Callable[[Claimed], bytes] | None = None


@dataclass(frozen=True)
class Claimed:
    run: RunRecord
    lease: Lease
    # The previous holder had left a turn open: the claim closed it (transcript repair).
    repaired: bool = False
    # The RUN_CLAIMED event the claim appended (to publish once committed).
    events: tuple[CompletionEvent, ...] = ()


@dataclass(frozen=True)
class RenewCommand:
    workspace_id: str
    run_id: str
    epoch: int
    ttl_micros: int
    # The agent that must hold the run (a caller acting as an agent), or None.
    holder: str | None = None
    request: RequestKey | None = None
    render: Callable[[Lease], bytes] | None = None


@dataclass(frozen=True)
class CloseCommand:
    workspace_id: str
    run_id: str
    outcome: RunOutcome
    tokens_input: int | None
    tokens_output: int | None
    tokens_total: int
    notes: str
    notes_truncated: bool
    error: str
    final_status: FinalStatus | None
    closed_by: str
    # Who closed it, recorded on the audit row.
    caller: Caller
    request: RequestKey | None = None
    render: Callable[[RunRecord], bytes] | None = None
    # The completion of the run's generation as the close was decided on
    # (completion id and settlement), None for none: see close_run.
    completion_seen: tuple[str, SettlementStatus] | None = None


@dataclass(frozen=True)
class Closed:
    """A run a transaction closed, and the RUN_CLOSED event it appended (to publish once committed)."""

    run: RunRecord
    event: CompletionEvent


@dataclass(frozen=True)
class Replan:
    """The lifecycle service refused the generation's completion for the
    cancellation fence after the close was decided, so the close must be decided
    again (it now settles the cancellation). Nothing was written."""


def claim(tx: CompletionTx, command: ClaimCommand, now: int) -> Claimed | Replay | Rejection:
    """Opens a run and takes the task's lease unless another open run holds a live
    one; the epoch grows on every claim, fencing every earlier holder."""
    seen = recalled(tx.requests, command.request)
    if seen is not None:
        return seen
    verdict = judge_lease(tx, command, now)
    if isinstance(verdict, LeaseHeld):
        return lease_held(verdict, command.task_id)
    run = RunRecord(
        workspace_id=command.workspace_id,
        run_id=command.run_id,
        task_id=command.task_id,
        agent_id=command.agent_id,
        generation=command.generation,
        epoch=verdict.epoch,
        claimed_at=now,
        lease_expires_at=verdict.expires_at,
    )
    lease = Lease(command.task_id, run.run_id, verdict.epoch, verdict.expires_at)
    # The previous holder is gone: close the turn it left open before the new run
    # starts its own (the repair of docs/specification.md §4.5, at the hand-over).
    repaired = repair_transcript(tx, command.workspace_id, command.task_id, now)
    tx.runs.insert(run)
    tx.runs.save_lease(command.workspace_id, lease)
    event = tx.events.append(
        CompletionEvent(run.workspace_id, run.task_id, run.generation, CompletionEventKind.RUN_CLAIMED, run.run_id, now)
    )
    return answer(tx.requests, command.request, command.render, Claimed(run, lease, repaired.repaired, (event,)), now)


def claim_refusal(tx: CompletionReadTx, command: ClaimCommand, now: int) -> Replay | Rejection | None:
    """What would answer the claim at `now` instead of granting it: its request id
    (a replay, or REQUEST_ID_REUSED) or a live lease of another open run. Read
    before the lifecycle service is asked for the claim; the claim's transaction
    judges again."""
    seen = peek(tx, command.request)
    if seen is not None:
        return seen
    verdict = judge_lease(tx, command, now)
    return lease_held(verdict, command.task_id) if isinstance(verdict, LeaseHeld) else None


def judge_lease(tx: CompletionReadTx, command: ClaimCommand, now: int) -> LeaseGranted | LeaseHeld:
    """Whether the claim would get the task's lease at `now`."""
    current = tx.runs.load_lease(command.workspace_id, command.task_id)
    holder = tx.runs.load(command.workspace_id, current.run_id) if current is not None else None
    return judge_claim(current, holder is not None and holder.open, now, command.ttl_micros)


def lease_held(verdict: LeaseHeld, task_id: str) -> Rejection:
    return reject(
        Reason.LEASE_HELD,
        f"run {verdict.holder.run_id} holds a live lease on task {task_id!r}",
        holder_run_id=verdict.holder.run_id,
        lease_expire_time=instant(verdict.holder.expires_at),
    )


def renew(tx: CompletionTx, command: RenewCommand, now: int) -> Lease | Replay | Rejection:
    """Extends the live lease of the current epoch."""
    seen = recalled(tx.requests, command.request)
    if seen is not None:
        return seen
    run = tx.runs.load(command.workspace_id, command.run_id)
    if run is None:
        return run_not_found(command.run_id)
    if command.holder is not None and run.agent_id != command.holder:
        return not_held(run)
    lease = tx.runs.load_lease(command.workspace_id, run.task_id)
    problem = judge_renewal(run.open, run.run_id, command.epoch, lease, now)
    if problem is RenewalProblem.RUN_CLOSED:
        return already_finished(run)
    if problem is RenewalProblem.NOT_CURRENT or lease is None:  # no lease is never current
        return reject(
            Reason.LEASE_NOT_CURRENT,
            f"the lease of epoch {command.epoch} was superseded",
            epoch=command.epoch,
            current_epoch=lease.epoch if lease else 0,
        )
    if problem is RenewalProblem.EXPIRED:
        return reject(
            Reason.LEASE_EXPIRED, "the lease expired; claim the task again", lease_expire_time=instant(lease.expires_at)
        )
    renewed = dataclasses.replace(lease, expires_at=now + command.ttl_micros)
    tx.runs.save_lease(command.workspace_id, renewed)
    tx.runs.update(dataclasses.replace(run, lease_expires_at=renewed.expires_at))
    return answer(tx.requests, command.request, command.render, renewed, now)


def close_run(tx: CompletionTx, command: CloseCommand, now: int) -> Closed | Replay | Rejection | Replan:
    """Closes an open run and writes its audit row.

    A fenced refusal of the generation's completion that the close was not decided
    on is Replan: recorded after the decision, it found this run still open (see
    settlements.record_settlement), so ending the generation falls to this close.
    Of the two transactions one sees the other, so the fence is always ended."""
    seen = recalled(tx.requests, command.request)
    if seen is not None:
        return seen
    run = tx.runs.load(command.workspace_id, command.run_id)
    if run is None:
        return run_not_found(command.run_id)
    if not run.open:
        return already_finished(run)
    completion = tx.completions.load(command.workspace_id, run.task_id, run.generation)
    if (
        fence_refused(completion)
        and completion is not None
        and ((completion.completion_id, completion.settlement) != command.completion_seen)
    ):
        return Replan()
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
    event = _close(tx, closed, command.closed_by, command.caller, now)
    answer(tx.requests, command.request, command.render, closed, now)
    return Closed(closed, event)


def close_stalled_runs(tx: CompletionTx, now: int, stall_after_micros: int, limit: int) -> list[Closed]:
    """Closes runs whose lease expired longer than `stall_after_micros` ago as
    STALLED, leaving their tasks as they are; returns the closed runs."""
    closed = []
    for run in tx.runs.claim_stalled(now - stall_after_micros, limit):
        if not is_stalled(run.open, run.lease_expires_at, now, stall_after_micros):
            continue
        stalled = dataclasses.replace(
            run,
            finished_at=now,
            outcome=RunOutcome.STALLED,
            tokens_total=0,
            error=f"lease expired at {run.lease_expires_at}; closed by the stall sweeper",
        )
        closed.append(Closed(stalled, _close(tx, stalled, "stall_sweeper", SELF, now)))
    return closed


def _close(tx: CompletionTx, closed: RunRecord, closed_by: str, caller: Caller, now: int) -> CompletionEvent:
    """Stores the closed run with its audit row and appends its RUN_CLOSED event."""
    tx.runs.update(closed)
    metadata = {
        "outcome": closed.outcome.name if closed.outcome else "",
        "final_status": closed.final_status.name if closed.final_status else "UNCHANGED",
        "closed_by": closed_by,
    }
    tx.events.append_audit(
        AuditEntry(
            closed.workspace_id,
            AUDIT_ACTION,
            closed.run_id,
            closed.task_id,
            tuple(sorted(metadata.items())),
            now,
            caller=caller,
        )
    )
    return tx.events.append(
        CompletionEvent(
            closed.workspace_id,
            closed.task_id,
            closed.generation,
            CompletionEventKind.RUN_CLOSED,
            closed.run_id,
            now,
            run_outcome=closed.outcome,
        )
    )


# -- reads ----------------------------------------------------------------------------


def owned_run(tx: CompletionReadTx, workspace_id: str, run_id: str, holder: str | None) -> RunRecord | Rejection:
    """The run, if it exists and (for an agent) belongs to `holder`."""
    run = tx.runs.load(workspace_id, run_id)
    if run is None:
        return run_not_found(run_id)
    if holder is not None and run.agent_id != holder:
        return not_held(run)
    return run


# -- refusals ----------------------------------------------------------------------------


def run_not_found(run_id: str) -> Rejection:
    return reject(Reason.RUN_NOT_FOUND, f"run {run_id!r} does not exist", run_id=run_id)


def not_held(run: RunRecord) -> Rejection:
    return reject(
        Reason.RUN_NOT_HELD,
        f"run {run.run_id} belongs to another agent; an agent acts only on its own runs",
        run_id=run.run_id,
    )


def already_finished(run: RunRecord) -> Rejection:
    assert run.finished_at is not None, "only a closed run is already finished"
    return reject(
        Reason.RUN_ALREADY_FINISHED,
        f"run {run.run_id} was already closed",
        run_id=run.run_id,
        finish_time=instant(run.finished_at),
    )
