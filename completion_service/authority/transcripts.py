"""The transcript shell: appends, loads with interrupted-turn repair, and the
staging of streamed imports, each through the transcript units in one
transaction; and the reopening of a completed generation (a resume at the
lifecycle service) that a batch may ask for."""

from __future__ import annotations

import functools
import hashlib
import logging
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from completion_service.authority.metrics import Metrics
from completion_service.clients.lifecycle_client import LifecycleClient, LifecycleRejected, LifecycleUnavailable
from completion_service.core import transcript as grammar
from completion_service.core.transcript import SessionEvent, Tail, Violation, grammar_rejection
from completion_service.errors import Reason
from completion_service.storage.port import CompletionStore, CompletionTx, TranscriptState
from completion_service.units import transcripts
from completion_service.units.transcripts import AppendCommand, Appended, Repaired, TranscriptPage, version_mismatch
from funnel.auth.table import RESUMING_ROLES
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime import calls
from funnel.runtime.clock import Clock
from funnel.runtime.errors import Rejection, ServiceError, reject
from funnel.runtime.faults import NO_FAULTS, Faults
from funnel.runtime.idempotency import Replay, RequestKey
from funnel.runtime.logs import fields
from funnel.runtime.validation import MAX_ID_LENGTH

log = logging.getLogger(__name__)
_REOPEN_CAUSE = "the transcript reopened the completed generation"


class Transcripts:
    def __init__(
        self, store: CompletionStore, clock: Clock, faults: Faults = NO_FAULTS, *, metrics: Metrics | None = None
    ) -> None:
        self._store = store
        self._clock = clock
        self._faults = faults
        self._metrics = metrics if metrics is not None else Metrics()

    async def append(self, command: AppendCommand) -> Appended | Replay:
        result = await self._store.write(
            functools.partial(transcripts.append, command=command, now=self._clock.now_micros())
        )
        if isinstance(result, Rejection):
            raise ServiceError(result)
        return result

    async def load(
        self, workspace_id: str, task_id: str, after_sequence: int, limit: int, *, repair_first: bool
    ) -> TranscriptPage:
        """A page of events; the first page (repair_first) first closes an
        interrupted final turn that no live lease owns, in its own transaction."""
        repaired = Repaired()
        if repair_first:
            state = await self.state(workspace_id, task_id)
            if state.tail.open_turn is not None:
                repaired = await self.repair(workspace_id, task_id)
        page = await self._store.read(
            functools.partial(
                transcripts.page,
                workspace_id=workspace_id,
                task_id=task_id,
                after_sequence=after_sequence,
                limit=limit,
            )
        )
        return TranscriptPage(page.events, page.state_version, page.more, repaired.repaired, repaired.turn_in_progress)

    async def repair(self, workspace_id: str, task_id: str) -> Repaired:
        now = self._clock.now_micros()

        def unit(tx: CompletionTx) -> Repaired:
            repaired = transcripts.repair(tx, workspace_id, task_id, now)
            # The fault point sits inside the transaction, before the commit.
            if repaired.repaired:
                self._faults.hit("completion.transcript_repair")
            return repaired

        repaired = await self._store.write(unit)
        if repaired.repaired:
            self._metrics.repaired()
            log.info(
                "closed the interrupted final turn of task %s",
                task_id,
                extra=fields(event="transcript_repair", workspace=workspace_id, task=task_id),
            )
        return repaired

    async def state(self, workspace_id: str, task_id: str) -> TranscriptState:
        return await self._store.read(lambda tx: tx.transcripts.load_tail(workspace_id, task_id))

    async def checkpoints(self, workspace_id: str, task_id: str, ids: Collection[str]) -> dict[str, int]:
        return await self._store.read(lambda tx: tx.transcripts.load_checkpoints(workspace_id, task_id, ids))

    async def events_after(
        self, workspace_id: str, task_id: str, after_sequence: int, limit: int
    ) -> list[SessionEvent]:
        return await self._store.read(lambda tx: tx.transcripts.page(workspace_id, task_id, after_sequence, limit))

    # -- streamed imports ----------------------------------------------------------------

    async def stage_import(self, import_id: str, events: Sequence[SessionEvent]) -> None:
        await self._store.write(lambda tx: tx.imports.stage(import_id, events))

    async def discard_import(self, import_id: str | None) -> None:
        """Drops one import's staged events, or every import's (None): staged
        imports belong to the process that streamed them, after a restart they are debris.
        Not bound by the caller's deadline: an import broken off by it would
        otherwise leave its staged rows behind until the next restart."""
        with calls.past_the_deadline():
            await self._store.write(lambda tx: tx.imports.discard(import_id))

    async def commit_import(
        self, import_id: str, workspace_id: str, task_id: str, final_tail: Tail, checkpoints: Mapping[str, int]
    ) -> int | Rejection:
        return await self._store.write(
            functools.partial(
                transcripts.commit_import,
                import_id=import_id,
                workspace_id=workspace_id,
                task_id=task_id,
                final_tail=final_tail,
                checkpoints=checkpoints,
            )
        )


class Reopener:
    """Reopens a completed generation for a transcript batch that may reopen it
    (user feedback, a prompt resend, a restore): every check of the append first,
    then the resume at the lifecycle service, which decides."""

    def __init__(self, store: CompletionStore, transcripts: Transcripts, lifecycle: LifecycleClient) -> None:
        self._store = store
        self._transcripts = transcripts
        self._lifecycle = lifecycle

    async def reopen(
        self,
        workspace: str,
        task: lifecycle_types.Task,
        events: list[grammar.SessionEvent],
        expected_state_version: int | None,
        batch: RequestKey | None,
    ) -> Reopened:
        """A batch for a terminal generation is accepted only when its first event
        reopens a completed one; the task then moves to generation + 1 first. That
        is a resume, authorized as one (a role that may call ResumeWithGeneration,
        which the lifecycle service checks again on the relayed caller), and every
        check the append would make comes before it, so that a refused batch leaves
        the task as it was. (A concurrent append can still refuse the batch after
        the resume: the task is then reopened, and a retry appends normally.)

        The resume's request id is the batch's (`batch`), so a retried batch
        replays its resume and another batch makes a resume of its own. When two
        batches race to reopen the same generation, one resume wins and the
        other is refused; the loser's batch then finds generation + 1 live and
        lands there like any append (`by_this_batch` false)."""
        refused = ServiceError(
            reject(
                Reason.GENERATION_TERMINAL,
                f"generation {task.generation} is terminal ({lifecycle_enums.TerminalOutcome.Name(task.outcome)}); "
                "only user feedback, a prompt resend or a restore to an earlier checkpoint reopens a completed "
                "generation",
                generation=task.generation,
                outcome=lifecycle_enums.TerminalOutcome.Name(task.outcome),
            )
        )
        outcome = lifecycle_enums.TerminalOutcome.Name(task.outcome).removeprefix("TERMINAL_OUTCOME_")
        completion = await self._store.read(lambda tx: tx.completions.load(workspace, task.task_id, task.generation))
        referenced = grammar.checkpoints_referenced(events) | ({completion.checkpoint} if completion else set())
        sequences = await self._transcripts.checkpoints(workspace, task.task_id, referenced)
        completion_checkpoint = sequences.get(completion.checkpoint) if completion and completion.checkpoint else None
        if grammar.admits_terminal_append(outcome, events, completion_checkpoint, sequences) is None:
            raise refused
        call = calls.served()
        if call.role not in RESUMING_ROLES:
            raise ServiceError(
                reject(
                    Reason.ROLE_NOT_PERMITTED,
                    f"this batch would reopen completed generation {task.generation}, which is a resume: it needs "
                    f"one of the roles {', '.join(r.value for r in RESUMING_ROLES)}, and {call.principal.subject!r} "
                    f"acts as {call.role.value}; user feedback reaches a completed task through its host",
                    permitted_roles=",".join(r.value for r in RESUMING_ROLES),
                )
            )
        state = await self._transcripts.state(workspace, task.task_id)
        if expected_state_version is not None and expected_state_version != state.state_version:
            raise ServiceError(version_mismatch(expected_state_version, state.state_version))
        checked = grammar.validate(state.tail, events, sequences)
        if isinstance(checked, Violation):
            raise ServiceError(grammar_rejection(checked))
        following = task.generation + 1
        try:
            await self._lifecycle.resume_with_generation(
                workspace,
                task.task_id,
                following,
                reopen_request_id(task.task_id, following, batch),
                _REOPEN_CAUSE,
                call.caller,
            )
        except LifecycleRejected as exc:
            if await self._reopened_meanwhile(workspace, task.task_id, following):
                return Reopened(following, by_this_batch=False)
            raise ServiceError(
                reject(
                    Reason.LIFECYCLE_REJECTED,
                    f"the lifecycle service refused to resume: {exc.message}",
                    lifecycle_reason=exc.reason,
                )
            ) from None
        except LifecycleUnavailable as exc:
            raise ServiceError(
                reject(Reason.LIFECYCLE_UNAVAILABLE, f"the lifecycle service did not answer: {exc}")
            ) from None
        return Reopened(following, by_this_batch=True)

    async def _reopened_meanwhile(self, workspace: str, task_id: str, following: int) -> bool:
        """Whether another batch's resume has made `following` the live generation."""
        try:
            task = (await self._lifecycle.get_task(workspace, task_id)).task
        except (LifecycleRejected, LifecycleUnavailable):
            return False
        return task.generation == following and task.state != lifecycle_enums.GENERATION_STATE_TERMINAL


@dataclass(frozen=True)
class Reopened:
    """The generation a reopening batch lands in, and whether its own resume opened it."""

    generation: int
    by_this_batch: bool


def reopen_request_id(task_id: str, following: int, batch: RequestKey | None) -> str:
    """The resume's request id: one per batch request (its scope and id; a batch
    without a request id is never retried as the same one) and generation. It names
    the task where that fits the lifecycle service's id limit."""
    scope = (batch.workspace_id, batch.caller, batch.method, batch.request_id) if batch else (uuid.uuid4().hex,)
    digest = hashlib.sha256("\x1f".join((*scope, task_id)).encode()).hexdigest()
    readable = f"reopen:{task_id}:{following}:{digest[:16]}"
    return readable if len(readable) <= MAX_ID_LENGTH else f"reopen:{following}:{digest[:40]}"
