"""The lifecycle projection's shell (issue 13): per workspace, one
`WatchLifecycleEvents` stream from the head feeding a `WorkspaceProjection`
(core/projection.py), so that an attempt on a task the projection holds is judged
without a `GetTask`. Reads made for other reasons (claims, attempts it cannot
serve) fill it.

A stream is opened the first time a workspace is asked about, and runs under
`run_forever`'s task group; at most `workspaces` streams are open. When all are,
the least recently asked about is closed for a new workspace only if it has not
been asked about for `idle_seconds`: many workspaces taking turns read instead of
opening and closing streams on every attempt. While a workspace's stream is not live nothing
is served from it or kept: a new projection starts each time the stream goes live
again (the head marker), so a disconnect never leaves a stale record behind. What
the ended stream had seen is kept until then for one use only: an attempt that
cannot read the lifecycle service (it is down) is judged on it, so that it commits
(settlement pending) instead of failing; the lifecycle fences it once it is back."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass

import grpc

from completion_service.authority.lifecycle import read_task
from completion_service.authority.metrics import Metrics
from completion_service.clients.lifecycle_client import LifecycleClient, change_of, record_of
from completion_service.core.model import LifecycleView
from completion_service.core.projection import WorkspaceProjection
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages

log = logging.getLogger(__name__)
# Records kept per workspace (~450 bytes each), the most recently read or served.
TASKS_PER_WORKSPACE = 10_000
MAX_RETRY_SECONDS = 30.0


@dataclass
class _Stream:
    # None while the stream is not live.
    projection: WorkspaceProjection | None = None
    # The projection of the stream that ended last, until the next one is live.
    last: WorkspaceProjection | None = None
    # The last lifecycle sequence the projection reflects (the head, then each event's).
    sequence: int = 0
    task: asyncio.Task[None] | None = None
    asked_at: float = 0.0


class LifecycleProjection:
    def __init__(
        self,
        lifecycle: LifecycleClient,
        metrics: Metrics,
        *,
        workspaces: int,
        tasks_per_workspace: int = TASKS_PER_WORKSPACE,
        retry_seconds: float = 1.0,
        idle_seconds: float = 60.0,
    ) -> None:
        self._lifecycle = lifecycle
        self._metrics = metrics
        self._workspaces = workspaces
        self._tasks = tasks_per_workspace
        self._retry = retry_seconds
        self._idle = idle_seconds
        self._streams: collections.OrderedDict[str, _Stream] = collections.OrderedDict()
        self._group: asyncio.TaskGroup | None = None

    @property
    def enabled(self) -> bool:
        return self._workspaces > 0

    async def run_forever(self) -> None:
        """Owns the streams until cancelled (a background loop)."""
        async with asyncio.TaskGroup() as group:
            self._group = group
            try:
                await asyncio.get_running_loop().create_future()
            finally:
                self._group = None
                self._streams.clear()
                self._metrics.lifecycle_streams_live(0)

    def position(self, workspace_id: str) -> int | None:
        """The last lifecycle sequence the workspace's projection reflects; None
        while its stream is not live (nothing is served from it then)."""
        stream = self._streams.get(workspace_id)
        return stream.sequence if stream is not None and stream.projection is not None else None

    def last_seen(self, workspace_id: str, task_id: str) -> LifecycleView | None:
        """The view the workspace's ended stream had seen, if it may be served: for an
        attempt while the lifecycle service cannot be read."""
        stream = self._streams.get(workspace_id)
        return stream.last.view(task_id) if stream is not None and stream.last is not None else None

    def view(self, workspace_id: str, task_id: str) -> LifecycleView | None:
        """The task's view if the projection may serve it, else None (read it)."""
        projection = self._projection(workspace_id)
        return projection.view(task_id) if projection is not None else None

    async def read(self, workspace_id: str, task_id: str) -> lifecycle_messages.GetTaskResponse:
        """The lifecycle record read fresh (errors mapped as read_task's), kept by
        the projection unless a change overtook the read."""
        projection = self._projection(workspace_id)
        if projection is None:
            return await read_task(self._lifecycle, workspace_id, task_id)
        reading = projection.begin_read(task_id)
        result = None
        try:
            current = await read_task(self._lifecycle, workspace_id, task_id)
            result = record_of(current)
            return current
        finally:
            projection.end_read(reading, result)

    def _projection(self, workspace_id: str) -> WorkspaceProjection | None:
        group = self._group
        if group is None:
            return None
        now = time.monotonic()
        stream = self._streams.get(workspace_id)
        if stream is not None:
            self._streams.move_to_end(workspace_id)
            stream.asked_at = now
            return stream.projection
        if len(self._streams) >= self._workspaces:
            oldest = next(iter(self._streams.values()))
            if now - oldest.asked_at < self._idle:
                return None
            self._streams.popitem(last=False)
            if oldest.task is not None:
                oldest.task.cancel()
            self._count_live()
        stream = _Stream(asked_at=now)
        stream.task = group.create_task(self._follow(workspace_id, stream), name=f"lifecycle-watch:{workspace_id}")
        self._streams[workspace_id] = stream
        return None

    async def _follow(self, workspace_id: str, stream: _Stream) -> None:
        # Doubled after each stream that never went live (down, or refused by the
        # lifecycle's cap of watchers), so that such a workspace is not retried every second.
        delay = self._retry
        while True:
            call = self._lifecycle.watch_from_head(workspace_id)
            try:
                async for message in call:
                    if not message.HasField("event"):  # the head marker: live from here on
                        stream.projection, stream.last = WorkspaceProjection(self._tasks), None
                        stream.sequence = message.head_sequence
                        self._count_live()
                        delay = self._retry
                    elif stream.projection is not None:
                        stream.projection.apply(change_of(message.event))
                        stream.sequence = message.event.sequence
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any end of the stream means: not live
                level = logging.WARNING if stream.projection is not None else logging.DEBUG
                log.log(
                    level,
                    "lifecycle events of workspace %s not followed (%s); attempts read the lifecycle "
                    "service until the stream is back",
                    workspace_id,
                    _why(exc),
                )
            finally:
                went_live = stream.projection is not None
                if went_live:
                    stream.last = stream.projection
                stream.projection = None
                self._count_live()
                call.cancel()
            await asyncio.sleep(delay)
            if not went_live:
                delay = min(delay * 2, MAX_RETRY_SECONDS)

    def _count_live(self) -> None:
        self._metrics.lifecycle_streams_live(sum(s.projection is not None for s in self._streams.values()))


def _why(exc: Exception) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return repr(exc)
