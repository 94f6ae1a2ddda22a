"""The stall sweeper: closes runs whose lease expired longer than `stall_after`
ago as STALLED (runs.close_stalled_runs, one transaction per batch)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from completion_service.authority.metrics import Metrics
from completion_service.core.model import CompletionEvent
from completion_service.storage.port import CompletionStore
from completion_service.units import runs
from funnel.runtime.clock import Clock
from funnel.runtime.logs import fields

log = logging.getLogger(__name__)
BATCH = 100


class StallSweeper:
    def __init__(
        self,
        store: CompletionStore,
        clock: Clock,
        stall_after: float | None,
        metrics: Metrics,
        publish: Callable[[list[CompletionEvent]], None],
    ) -> None:
        self._store = store
        self._publish = publish
        self._clock = clock
        self._stall_after = stall_after
        self._metrics = metrics

    @property
    def enabled(self) -> bool:
        return self._stall_after is not None

    async def sweep(self) -> int:
        """One pass; returns how many runs it closed."""
        if self._stall_after is None:
            return 0
        closed = await self._store.write(
            functools.partial(
                runs.close_stalled_runs,
                now=self._clock.now_micros(),
                stall_after_micros=int(self._stall_after * 1_000_000),
                limit=BATCH,
            ),
            after_commit=lambda closed: self._publish([c.event for c in closed]),
        )
        for run in (c.run for c in closed):
            log.info(
                "closed stalled run %s of task %s",
                run.run_id,
                run.task_id,
                extra=fields(event="stall_sweep", workspace=run.workspace_id, task=run.task_id, run=run.run_id),
            )
        self._metrics.stalled(len(closed))
        return len(closed)

    async def run_forever(self) -> None:
        """The stall sweeper (a background loop; only when `stall_after` is set)."""
        if self._stall_after is None:
            return
        interval = max(0.05, min(self._stall_after / 2, 30.0))
        while True:
            try:
                await self.sweep()
            except Exception:  # the sweeper must survive any single failure
                log.exception("stall sweep failed")
            await asyncio.sleep(interval)
