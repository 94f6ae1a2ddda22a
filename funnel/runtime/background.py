"""One structured owner for a service's background loops (settlement outbox,
sweepers, propagation replay, health probe, file reloads, the integrity check): a single task holding
an `asyncio.TaskGroup`, so that stopping the service stops every loop and waits
for each to finish, and no loop runs unowned."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Background:
    def __init__(self, name: str) -> None:
        self._name = name
        self._loops: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = []
        self._owner: asyncio.Task[None] | None = None

    def add(self, name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Registers a loop; loops catch their own failures and run until cancelled
        (or, one-shot work such as the integrity check after start, until done)."""
        if self._owner is not None:
            raise RuntimeError("loops are added before the owner starts")
        self._loops.append((name, loop))

    def start(self) -> None:
        self._owner = asyncio.create_task(self._run(), name=f"{self._name}-background")
        self._owner.add_done_callback(self._report)

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for name, loop in self._loops:
                group.create_task(loop(), name=name)

    def _report(self, owner: asyncio.Task[None]) -> None:
        if not owner.cancelled() and owner.exception() is not None:
            log.critical("background work of %s stopped: %r", self._name, owner.exception())

    async def stop(self) -> None:
        if self._owner is None:
            return
        self._owner.cancel()
        try:
            await self._owner
        except asyncio.CancelledError:
            pass
        except Exception:  # noqa: BLE001 - already reported by _report
            pass
        self._owner = None
