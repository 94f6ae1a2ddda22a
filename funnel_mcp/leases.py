"""Keeps the leases of open runs alive, so that an agent never renews one itself.

One renewal task per held run, all owned by one task group that the MCP server's
lifespan opens and closes: nothing outlives the server, and a run stops being
renewed when it closes, when its lease is lost (superseded, expired, run
finished) or when the server stops. After a restart a run is held again as soon
as a tool touches it while its lease is live."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType

import grpc

from funnel_mcp.failures import RETRYABLE

log = logging.getLogger("funnel.mcp.leases")

# A failed renewal is tried again this soon (seconds), while the lease lasts.
RETRY_DELAY = 1.0


@dataclass(frozen=True)
class HeldRun:
    workspace: str
    run_id: str
    epoch: int
    # The credential the run was claimed with (Streamable HTTP: the caller's own).
    token: str


Renew = Callable[[HeldRun], Awaitable[None]]


class LeaseKeeper:
    def __init__(self, renew: Renew, ttl: float) -> None:
        self._renew = renew
        self.ttl = ttl
        self._group: asyncio.TaskGroup | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def __aenter__(self) -> LeaseKeeper:
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        group, self._group = self._group, None  # no hold() after this
        assert group is not None
        await group.__aexit__(exc_type, exc, traceback)

    def held(self) -> set[str]:
        return set(self._tasks)

    def hold(self, run: HeldRun) -> None:
        """Start renewing `run` (no-op if it is renewed already)."""
        if run.run_id in self._tasks or self._group is None:
            return
        self._tasks[run.run_id] = self._group.create_task(self._keep(run), name=f"lease {run.run_id}")

    def release(self, run_id: str) -> None:
        task = self._tasks.pop(run_id, None)
        if task is not None:
            task.cancel()

    async def _keep(self, run: HeldRun) -> None:
        try:
            delay = self.ttl / 3
            while True:
                await asyncio.sleep(delay)
                try:
                    await self._renew(run)
                    delay = self.ttl / 3
                except grpc.aio.AioRpcError as error:
                    if error.code() not in RETRYABLE:
                        log.info("stopped renewing run %s: %s %s", run.run_id, error.code().name, error.details())
                        return
                    delay = RETRY_DELAY
        except asyncio.CancelledError:
            raise
        except Exception:
            # One run's renewal must never take the server's other runs down with it.
            log.exception("stopped renewing run %s", run.run_id)
        finally:
            if self._tasks.get(run.run_id) is asyncio.current_task():
                del self._tasks[run.run_id]
