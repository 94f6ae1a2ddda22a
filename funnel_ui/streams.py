"""The live pages' event streams (SSE): each open page is one stream that follows
both services' watches and turns what committed into fragments for its page.

One owner per page: a stream's two watches run as tasks of one TaskGroup, entered
in the response's own task; when the client goes, the response cancels that task
and the group cancels and awaits both watches with it. Nothing runs unowned.

Updates are coalesced: a stream takes every event that arrives within its
`coalesce` window of the first into one message, and renders each fragment the
batch changed once (a list under 100 updates per second sends a few messages a
second, each row at most once per message, not a message per update)."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from sse_starlette import ServerSentEvent

from funnel.client import BreakHook, FunnelError
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import types_pb2 as completion_types
from funnel_ui import render, view
from funnel_ui.together import together

if TYPE_CHECKING:
    from funnel_ui.app import Context

# The browser's EventSource waits this long (ms) before reconnecting.
RECONNECT_MS = 500
# Bounded: a browser that stops reading stalls its watches, which the services
# then end with WATCH_OVERFLOW; the watch resumes from its cursor once read again.
QUEUE_SIZE = 256
# A read that failed (a service away) is tried again this much later.
RETRY_SECONDS = 1.0
# After a lease's expiry, before the runs are read again: the services' clock
# and this host's may differ by a little.
LEASE_SLACK = 0.25

Op = dict[str, str]
RUN_KINDS = (completion_enums.COMPLETION_EVENT_KIND_RUN_CLAIMED, completion_enums.COMPLETION_EVENT_KIND_RUN_CLOSED)
SETTLEMENT_KINDS = (
    completion_enums.COMPLETION_EVENT_KIND_COMPLETION_COMMITTED,
    completion_enums.COMPLETION_EVENT_KIND_COMPLETION_SETTLED,
    completion_enums.COMPLETION_EVENT_KIND_TERMINALIZATION_ERROR,
)


async def _pump(
    queue: asyncio.Queue[tuple[str, str, Any]], source: str, watch: Callable[[BreakHook], AsyncIterator[Any]]
) -> None:
    """Puts ("event", e) on the queue for every event of `watch`; ("notice", text)
    when its stream breaks (once until it delivers again, then an empty one), and
    once before it gives up."""
    broken = False

    async def on_break(error: FunnelError, after: int) -> None:
        nonlocal broken
        if not broken:
            broken = True
            await queue.put((source, "notice", f"{source} service unavailable; resuming after event #{after}"))

    try:
        async for event in watch(on_break):
            if broken:
                broken = False
                await queue.put((source, "notice", ""))
            await queue.put((source, "event", event))
    except FunnelError as error:
        await queue.put((source, "notice", f"{source} events: {error.code.name} {error.reason} {error.message}"))


async def _batch(
    queue: asyncio.Queue[tuple[str, str, Any]], window: float, deadline: float | None
) -> list[tuple[str, str, Any]]:
    """The next item and every one that follows within `window` seconds; [] if
    none came before `deadline` (Unix seconds)."""
    timeout = None if deadline is None else max(0.0, deadline - time.time())
    try:
        batch = [await asyncio.wait_for(queue.get(), timeout)]
    except TimeoutError:
        return []
    loop = asyncio.get_running_loop()
    end = loop.time() + window
    while (remaining := end - loop.time()) > 0:
        try:
            batch.append(await asyncio.wait_for(queue.get(), remaining))
        except TimeoutError:
            break
    while not queue.empty():
        batch.append(queue.get_nowait())
    return batch


class Stream(abc.ABC):
    """What every stream shares: the cursor (each message's id), the notices, the
    loop. A subclass keeps its page's state and renders its operations."""

    # Seconds a message waits for more updates to go with it.
    coalesce = 0.05

    def __init__(self, context: Context, workspace: str, task_filter: str = "") -> None:
        self.context = context
        self.backend = context.live
        self.workspace = workspace
        self.task_filter = task_filter  # "" follows the whole workspace
        self.notices: dict[str, str] = {}

    def message(self, cursor: view.Cursor, ops: list[Op], first: bool = False) -> ServerSentEvent:
        notice = " · ".join(text for text in self.notices.values() if text)
        return ServerSentEvent(
            json.dumps({"ops": ops, "notice": notice}), id=cursor.event_id(), retry=RECONNECT_MS if first else None
        )

    async def run(self, cursor: view.Cursor) -> AsyncIterator[ServerSentEvent]:
        yield self.message(cursor, await self.start(), first=True)
        queue: asyncio.Queue[tuple[str, str, Any]] = asyncio.Queue(QUEUE_SIZE)
        async with asyncio.TaskGroup() as owner:
            owner.create_task(
                _pump(
                    queue,
                    "lifecycle",
                    functools.partial(self.backend.watch_lifecycle, self.workspace, self.task_filter, cursor.lifecycle),
                )
            )
            owner.create_task(
                _pump(
                    queue,
                    "completion",
                    functools.partial(
                        self.backend.watch_completion, self.workspace, self.task_filter, cursor.completion
                    ),
                )
            )
            while True:
                ops: list[Op] = []
                noticed = False
                for source, kind, item in await _batch(queue, self.coalesce, self.deadline()):
                    if kind != "event":
                        self.notices[source] = item
                        noticed = True
                        continue
                    if source == "lifecycle":
                        cursor = view.Cursor(item.sequence, cursor.completion)
                        ops += self.on_lifecycle(item)
                    else:
                        cursor = view.Cursor(cursor.lifecycle, item.sequence)
                        ops += self.on_completion(item)
                ops += await self.flush(time.time())
                if ops or noticed:
                    yield self.message(cursor, ops)

    def deadline(self) -> float | None:
        """When to flush even if no event came (Unix seconds), or None."""
        return None

    @abc.abstractmethod
    async def start(self) -> list[Op]:
        """The first message's operations: the page as it stands at the cursor."""

    @abc.abstractmethod
    def on_lifecycle(self, event: Any) -> list[Op]:
        """Takes one committed lifecycle event in; returns what to append at once."""

    @abc.abstractmethod
    def on_completion(self, event: Any) -> list[Op]:
        """Takes one committed completion event in; returns what to append at once."""

    @abc.abstractmethod
    async def flush(self, now: float) -> list[Op]:
        """Reads what the batch made stale and renders each changed fragment once."""


async def _read(what: Callable[[], Awaitable[Any]]) -> Any:
    """A read for a fragment, or None when the service did not answer (the
    fragment stays stale and is read again later)."""
    with contextlib.suppress(FunnelError):
        return await what()
    return None


class TaskStream(Stream):
    """One task page: appends timeline and event rows, re-renders the head, the
    completions and the runs as the events say they changed. A run's lease
    renewal commits no event: the runs are read again when the soonest live lease
    shown lapses, which shows the renewal or the lapse."""

    def __init__(self, context: Context, workspace: str, task_id: str) -> None:
        super().__init__(context, workspace, task_id)
        self.lifecycle: view.Lifecycle | None = None
        self.settlements: dict[str, view.Settlement] = {}
        self.completions: list[completion_types.Completion] = []
        self.runs: list[completion_types.Run] = []
        self.advice: Any = None
        self.stale: set[str] = set()
        self._deadline: float | None = None

    async def start(self) -> list[Op]:
        # A fresh read: after a reconnect the page must not wait for the next event.
        try:
            (self.lifecycle,) = await self.backend.tasks(self.workspace, [self.task_filter]) or (None,)
        except FunnelError:
            self.lifecycle = None  # the lifecycle service is away; its events will bring the state
        self.stale = {"completions", "runs", "evidence", "advice", "head"}
        return await self.flush(time.time())

    def deadline(self) -> float | None:
        return self._deadline

    def on_lifecycle(self, event: Any) -> list[Op]:
        before = self.lifecycle
        self.lifecycle = view.newer(self.lifecycle, view.lifecycle_from_event(event))
        self.stale |= {"head", "advice"} if self.lifecycle is not before else {"head"}
        return [{"op": "append", "target": "timeline", "html": render.lifecycle_row(event)}]

    def on_completion(self, event: Any) -> list[Op]:
        if event.kind in SETTLEMENT_KINDS:
            self.settlements = view.apply_completion_event(self.settlements, event)
            self.stale |= {"completions", "head"}
        elif event.kind in RUN_KINDS:
            self.stale.add("runs")
        elif event.kind == completion_enums.COMPLETION_EVENT_KIND_EVIDENCE_RECORDED:
            self.stale.add("evidence")
        return [{"op": "append", "target": "attempts", "html": render.completion_event_row(event)}]

    async def flush(self, now: float) -> list[Op]:
        if self._deadline is not None and now >= self._deadline:
            self.stale.add("runs")  # a lease shown live has lapsed, or a read is due again
        backend, ws, task = self.backend, self.workspace, self.task_filter
        reads: dict[str, Callable[[], Awaitable[Any]]] = {
            "runs": lambda: backend.runs(ws, task),
            "completions": lambda: backend.completions(ws, task),
            "evidence": lambda: backend.evidence(ws, task),
        }
        if self.lifecycle is not None:
            lifecycle = self.lifecycle
            reads["advice"] = lambda: backend.advice(ws, lifecycle)
        wanted = [name for name in reads if name in self.stale]
        got = dict(zip(wanted, await together(*(_read(reads[name]) for name in wanted)), strict=True))
        failed = False
        ops: list[Op] = []
        for name, value in got.items():
            if value is None and name != "advice":
                failed = True
                continue
            self.stale.discard(name)
            if name == "runs":
                self.runs = value
                ops.append({"op": "replace", "id": "runs", "html": render.runs_section(self.runs, now)})
            elif name == "completions":
                self.completions = value
                # A completion settled or refused before the page opened has no event
                # this stream will see: the head's badge learns it from the read.
                self.settlements = view.merged(self.settlements, map(view.settlement_from_completion, value))
                self.stale.add("head")
                ops.append(
                    {
                        "op": "replace",
                        "id": "completions",
                        "html": render.completions_section(self.completions, self.settlements),
                    }
                )
            elif name == "evidence":
                ops.append({"op": "replace", "id": "evidence", "html": render.evidence_section(value)})
            else:
                self.advice = value
                self.stale.add("head")
        if "head" in self.stale and self.lifecycle is not None:
            self.stale.discard("head")
            actions = view.task_actions(self.lifecycle, self.advice, self.backend.permitted(self.workspace))
            ops.append(
                {
                    "op": "replace",
                    "id": "task-head",
                    "html": render.task_head(
                        self.workspace, self.lifecycle, self.settlements, actions, self.context.csrf, uuid.uuid4().hex
                    ),
                }
            )
        lapse = view.lease_deadline(self.runs, now)
        self._deadline = now + RETRY_SECONDS if failed else (lapse + LEASE_SLACK if lapse is not None else None)
        return ops


class ListStream(Stream):
    """A list page: re-renders the rows it shows when their task changes (in
    last-change order, moved to the top of the first page), inserts where the
    order puts it a task that now belongs on the page (newly registered, or
    changed into the filter) once a read confirms it, keeps at most MAX_ROWS
    rows, and re-reads the counts once per message that had lifecycle events."""

    coalesce = 0.25
    MAX_ROWS = 200

    def __init__(self, context: Context, workspace: str, page: view.ListedPage, followed: Sequence[str]) -> None:
        super().__init__(context, workspace)
        self.page = page
        self.rows: dict[str, view.Lifecycle] = {}
        self.followed = list(followed)[: self.MAX_ROWS]
        self.settlements: dict[str, dict[str, view.Settlement]] = {}
        self.changed: set[str] = set()
        self.candidates: set[str] = set()
        self.counts_stale = False

    @property
    def by_change(self) -> bool:
        return self.page.filter.order == "changed"

    async def start(self) -> list[Op]:
        try:
            tasks = await self.backend.tasks(self.workspace, self.followed)
            self.settlements = await self.backend.settlements(self.workspace, tasks)
        except FunnelError:
            return []  # the events will bring the rows up to date
        self.rows = {task.task_id: task for task in tasks}
        return [self._row(task_id) for task_id in self.rows]

    def _html(self, task_id: str) -> str:
        return render.task_row(self.workspace, self.rows[task_id], self.settlements.get(task_id, {}))

    def _row(self, task_id: str) -> Op:
        return {"op": "replace", "id": f"row-{task_id}", "html": self._html(task_id)}

    def _to_top(self, task_id: str) -> Op:
        return {"op": "insert", "target": "tasks", "before": "", "at": "start", "html": self._html(task_id)}

    def on_lifecycle(self, event: Any) -> list[Op]:
        self.counts_stale = True
        seen = view.lifecycle_from_event(event)
        if event.task_id in self.rows:
            self.rows[event.task_id] = view.newer(self.rows[event.task_id], seen)
            self.changed.add(event.task_id)
        elif self.page.admits(seen):
            self.candidates.add(event.task_id)
        return []

    def on_completion(self, event: Any) -> list[Op]:
        if event.task_id in self.rows and event.kind in SETTLEMENT_KINDS:
            self.settlements[event.task_id] = view.apply_completion_event(
                self.settlements.get(event.task_id, {}), event
            )
            self.changed.add(event.task_id)
        return []

    async def flush(self, now: float) -> list[Op]:
        changed, self.changed = self.changed, set()
        entering = await self._entering()
        if self.by_change and self.page.first_page:
            # Oldest change first, each to the top, moved and entering rows alike
            # (an entering row's change may be older than a moved one's): the newest
            # ends up first.
            self.rows.update((task.task_id, task) for task in entering)
            moved = changed | {task.task_id for task in entering}
            ops = [self._to_top(t) for t in sorted(moved, key=lambda t: (self.rows[t].changed, t))]
        else:
            ops = [self._row(task_id) for task_id in sorted(changed)]
            for task in entering:  # one at a time: each goes before a row already shown
                self.rows[task.task_id] = task
                before = view.next_in_order(task.task_id, self.rows)
                ops.append(
                    {
                        "op": "insert",
                        "target": "tasks",
                        "before": f"row-{before}" if before else "",
                        "html": self._html(task.task_id),
                    }
                )
        if entering:
            ops += self._trim()
        if self.counts_stale:
            counted = await _read(lambda: self.backend.counts(self.workspace))
            if counted is not None:
                self.counts_stale = False
                ops.append({"op": "replace", "id": "counts", "html": render.counts(self.workspace, counted)})
        return ops

    async def _entering(self) -> list[view.Lifecycle]:
        """The candidates that belong on the page as read now (oldest change first),
        with their settlements read."""
        if not self.candidates:
            return []
        # An event seen from before the list was read may no longer hold: a read decides.
        wanted, self.candidates = sorted(self.candidates), set()
        read = await _read(lambda: self.backend.tasks(self.workspace, wanted))
        entering = [t for t in read or () if t.task_id not in self.rows and self.page.admits(t)]
        if entering:
            self.settlements.update(await _read(lambda: self.backend.settlements(self.workspace, entering)) or {})
        return sorted(entering, key=lambda t: (t.changed, t.task_id))

    def _trim(self) -> list[Op]:
        """The page keeps its size bounded: the rows at its end (by its order) go."""
        ops: list[Op] = []
        while len(self.rows) > self.MAX_ROWS:
            last = (
                min(self.rows.values(), key=lambda t: (t.changed, t.task_id))
                if self.by_change
                else self.rows[max(self.rows)]
            )
            del self.rows[last.task_id]
            ops.append({"op": "remove", "id": f"row-{last.task_id}"})
        return [*ops, {"op": "replace", "id": "shown", "html": render.shown(len(self.rows))}]


class AttentionStream(Stream):
    """The attention page: read again (whole, at most once per message) when a
    settlement, a run or a lifecycle event may have changed it, and when time
    alone changes it (a live lease lapses, an open run crosses the bound)."""

    coalesce = 0.5

    def __init__(self, context: Context, workspace: str) -> None:
        super().__init__(context, workspace)
        self.stale = True
        self._deadline: float | None = None

    async def start(self) -> list[Op]:
        return await self.flush(time.time())

    def deadline(self) -> float | None:
        return self._deadline

    def on_lifecycle(self, event: Any) -> list[Op]:
        self.stale = True
        return []

    def on_completion(self, event: Any) -> list[Op]:
        self.stale = self.stale or event.kind in SETTLEMENT_KINDS or event.kind in RUN_KINDS
        return []

    async def flush(self, now: float) -> list[Op]:
        if not self.stale and (self._deadline is None or now < self._deadline):
            return []
        bound = self.context.long_run_seconds
        read = await _read(lambda: self.backend.attention(self.workspace, bound))
        if read is None:
            self.stale, self._deadline = True, now + RETRY_SECONDS
            return []
        facts, open_runs = read
        self.stale = False
        moment = view.attention_deadline(open_runs, now, bound)
        self._deadline = moment + LEASE_SLACK if moment is not None else None
        return [{"op": "replace", "id": "attention", "html": render.attention(self.workspace, facts, bound, now)}]
