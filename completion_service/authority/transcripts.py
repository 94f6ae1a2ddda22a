"""The transcript shell: appends, loads with interrupted-turn repair, and the
staging of streamed imports, each through the transcript units in one
transaction."""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection, Mapping, Sequence

from completion_service.authority.metrics import Metrics
from completion_service.core.transcript import SessionEvent, Tail
from completion_service.storage.port import CompletionStore, CompletionTx, TranscriptState
from completion_service.units import transcripts
from completion_service.units.transcripts import AppendCommand, Appended, Repaired, TranscriptPage
from funnel.runtime import calls
from funnel.runtime.clock import Clock
from funnel.runtime.errors import Rejection, ServiceError
from funnel.runtime.faults import NO_FAULTS, Faults
from funnel.runtime.idempotency import Replay
from funnel.runtime.logs import fields

log = logging.getLogger(__name__)


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
        return await self._store.read(lambda tx: tx.load_tail(workspace_id, task_id))

    async def checkpoints(self, workspace_id: str, task_id: str, ids: Collection[str]) -> dict[str, int]:
        return await self._store.read(lambda tx: tx.load_checkpoints(workspace_id, task_id, ids))

    async def events_after(
        self, workspace_id: str, task_id: str, after_sequence: int, limit: int
    ) -> list[SessionEvent]:
        return await self._store.read(lambda tx: tx.load_transcript(workspace_id, task_id, after_sequence, limit))

    # -- streamed imports ----------------------------------------------------------------

    async def stage_import(self, import_id: str, events: Sequence[SessionEvent]) -> None:
        await self._store.write(lambda tx: tx.stage_import(import_id, events))

    async def discard_import(self, import_id: str | None) -> None:
        """Drops one import's staged events, or every import's (None): staged
        imports belong to the process that streamed them, after a restart they are debris.
        Not bound by the caller's deadline: an import broken off by it would
        otherwise leave its staged rows behind until the next restart."""
        with calls.past_the_deadline():
            await self._store.write(lambda tx: tx.discard_import(import_id))

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
