"""The Starlette application: pages, event streams (SSE) and the action endpoints.

The imperative shell: it reads through the backend, asks view.py what to show
and render.py how; the only state it keeps is per open event stream."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import hmac
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from funnel.auth.hosts import LOOPBACK_NAMES
from funnel.runtime.grpc_errors import error_info
from funnel.runtime.validation import id_problem
from funnel_ui import render, view
from funnel_ui.backend import Backend, Settings

PAGE_SIZE = 50
# A list page follows at most this many rows live (its own page).
MAX_FOLLOWED = 200
# The browser's EventSource waits this long (ms) before reconnecting.
RECONNECT_MS = 500
# Bounded: a browser that stops reading stalls its watches, which the services
# then end with WATCH_OVERFLOW; the watch resumes from its cursor once read again.
QUEUE_SIZE = 256
HTTP_STATUS = {
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 403,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
}


@dataclass
class Context:
    settings: Settings
    workspaces: Sequence[str]
    # Host names the dashboard answers to (funnel.auth.hosts); any other is refused.
    allowed_hosts: Sequence[str] = LOOPBACK_NAMES
    # Put into every action form; a POST without it is refused (with the Origin check, against CSRF).
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    backend: Backend | None = None

    @property
    def live(self) -> Backend:
        assert self.backend is not None, "set by the lifespan"
        return self.backend


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status, headers={
        # Nothing but our own files: an escaping mistake could still not load a script.
        "content-security-policy": "default-src 'self'; frame-ancestors 'none'",
        "x-content-type-options": "nosniff",
        "referrer-policy": "same-origin",
    })


def _rpc_error_page(error: grpc.aio.AioRpcError, back: str) -> HTMLResponse:
    info = error_info(error)
    reason = f" {info.reason}" if info else ""
    return _html(render.error_page(f"{error.code().name}{reason}", error.details() or "", back),
                 HTTP_STATUS.get(error.code(), 502))


def _ids(request: Request, *names: str) -> list[str] | None:
    values = [request.path_params[name] for name in names]
    return None if any(id_problem(v) or not v for v in values) else values


def create_app(context: Context) -> Any:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # gRPC's aio channels belong to the running loop: made here, not before.
        context.backend = Backend(context.settings)
        for workspace in context.workspaces:
            context.backend.heads(workspace)
        try:
            yield
        finally:
            await context.backend.close()

    async def index(request: Request) -> Response:
        return _html(render.index(context.workspaces))

    async def go(request: Request) -> Response:
        workspace = request.query_params.get("workspace", "")
        if id_problem(workspace) or not workspace:
            return _html(render.error_page("Not a workspace id", workspace), 400)
        return RedirectResponse(render.url("w", workspace), 303)

    async def task_list(request: Request) -> Response:
        ids = _ids(request, "workspace")
        if ids is None:
            return _html(render.error_page("Not a workspace id", request.path_params["workspace"]), 404)
        (workspace,) = ids
        query = request.query_params
        filter_ = view.Filter(
            state=_choice(query.get("state", ""), render.STATES),
            outcome=_choice(query.get("outcome", ""), render.OUTCOMES),
            work_status=_choice(query.get("work_status", ""), render.WORK), text=query.get("q", "")[:128],
        )
        backend = context.live
        heads = backend.heads(workspace)
        # Read before listing: the stream then replays at worst what the list already shows.
        cursor = view.Cursor(heads.lifecycle, heads.completion)
        try:
            tasks, next_cursor = await backend.list_page(
                workspace, filter_, view.decode_page_cursor(query.get("page", "")), PAGE_SIZE)
            settlements = await backend.settlements(workspace, tasks)
        except grpc.aio.AioRpcError as error:
            return _rpc_error_page(error, "/")
        return _html(render.task_list(workspace, filter_, tasks, settlements, next_cursor, cursor))

    async def task_page(request: Request) -> Response:
        ids = _ids(request, "workspace", "task")
        if ids is None:
            return _html(render.error_page("Not a task id", request.url.path), 404)
        workspace, task_id = ids
        backend = context.live
        try:
            data = await backend.task_data(workspace, task_id)
        except grpc.aio.AioRpcError as error:
            return _rpc_error_page(error, render.url("w", workspace))
        lifecycle = view.lifecycle_from_task(data.task.task)
        settlements = {c.completion_id: view.settlement_from_completion(c) for c in data.completions}
        head = render.task_head(workspace, lifecycle, settlements,
                                view.task_actions(lifecycle, data.advice, backend.can_act), context.csrf,
                                uuid.uuid4().hex)
        return _html(render.task_page(
            workspace, lifecycle, head, data.events, data.completion_events,
            render.completions_section(data.completions, settlements), render.runs_section(data.runs),
            data.transcript, data.transcript_more, data.cursor,
        ))

    async def task_stream(request: Request) -> Response:
        ids = _ids(request, "workspace", "task")
        if ids is None:
            return Response(status_code=404)
        workspace, task_id = ids
        return EventSourceResponse(
            TaskStream(context, workspace, task_id).run(_start_cursor(request)), ping=15, send_timeout=30)

    async def list_stream(request: Request) -> Response:
        ids = _ids(request, "workspace")
        if ids is None:
            return Response(status_code=404)
        followed = [t for t in request.query_params.get("tasks", "").split(",") if t and not id_problem(t)]
        return EventSourceResponse(
            ListStream(context, ids[0], followed[:MAX_FOLLOWED]).run(_start_cursor(request)), ping=15,
            send_timeout=30)

    async def act(request: Request) -> Response:
        ids = _ids(request, "workspace", "task")
        action = request.path_params["action"]
        if ids is None or action not in ("resume", "new-chat", "cancel"):
            return _html(render.error_page("No such action", request.url.path), 404)
        workspace, task_id = ids
        back = render.url("w", workspace, "t", task_id)
        backend = context.live
        if not backend.can_act:
            return _html(render.error_page("Read only", "this dashboard has no action credential"), 403)
        form = {k: v[0] for k, v in parse_qs((await request.body()).decode(errors="replace")).items()}
        if not same_origin(request.headers) or not hmac.compare_digest(form.get("csrf", ""), context.csrf):
            return _html(render.error_page("Refused", "the form did not come from this dashboard"), 403)
        request_id = form.get("request_id", "")
        generation, revision = form.get("generation", ""), form.get("revision", "")
        if id_problem(request_id) or not request_id or not generation.isdigit() or not revision.isdigit():
            return _html(render.error_page("Bad form", "generation, revision and request id are required"), 400)
        try:
            if action == "resume":
                await backend.resume(workspace, task_id, int(generation), int(revision), request_id)
            elif action == "cancel":
                await backend.cancel(workspace, task_id, int(generation), int(revision), request_id)
            else:
                back = render.url("w", workspace, "t", await backend.new_chat(workspace, task_id, request_id))
        except grpc.aio.AioRpcError as error:
            return _rpc_error_page(error, back)
        return RedirectResponse(back, 303)

    static = StaticFiles(directory=str(resources.files("funnel_ui") / "static"))
    app = Starlette(
        routes=[
            Route("/", index),
            Route("/go", go),
            Route("/w/{workspace}", task_list),
            Route("/w/{workspace}/stream", list_stream),
            Route("/w/{workspace}/t/{task}", task_page),
            Route("/w/{workspace}/t/{task}/stream", task_stream),
            Route("/w/{workspace}/t/{task}/{action}", act, methods=["POST"]),
            Mount("/static", static),
        ],
        lifespan=lifespan,
        # Outermost first: a request must name one of the dashboard's own hosts (a page
        # of another site that rebinds its DNS name to this address would otherwise be
        # same-origin with the dashboard, read it and post its forms), then come from
        # no other origin (its streams and actions serve this dashboard's pages only).
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=list(context.allowed_hosts),
                               www_redirect=False),
                    Middleware(OriginCheck)],
    )
    return app


class OriginCheck:
    """Refuses (403) a request whose Origin names another origin than the one it
    is addressed to. A browser sends Origin on posts and on cross-origin
    fetches and event streams; a plain navigation sends none and passes."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and foreign_origin(Headers(scope=scope)):
            await Response("cross-origin request refused", 403)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _choice(value: str, allowed: Sequence[str]) -> str:
    return value if value in allowed else ""


def same_origin(headers: Any) -> bool:
    """A browser names the page a POST comes from: Sec-Fetch-Site, or Origin
    against Host. A request naming another site is refused; one that names none
    (not a browser) still needs the form's token."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    return not foreign_origin(headers)


def foreign_origin(headers: Any) -> bool:
    """Whether the request names an Origin other than the one it is addressed to."""
    origin = headers.get("origin")
    return origin is not None and urlsplit(origin).netloc != headers.get("host", "")


def _start_cursor(request: Request) -> view.Cursor:
    """Last-Event-ID (a reconnecting EventSource) wins over the page's own cursor."""
    return (view.parse_cursor(request.headers.get("last-event-id"))
            or view.parse_cursor(request.query_params.get("after")) or view.Cursor())


async def _merged(backend: Backend, workspace: str, task_id: str, cursor: view.Cursor) -> AsyncIterator[Any]:
    """Both watches as one sequence of (source, kind, item)."""
    queue: asyncio.Queue[tuple[str, str, Any]] = asyncio.Queue(QUEUE_SIZE)

    async def pump(source: str, events: AsyncIterator[tuple[str, Any]]) -> None:
        async for kind, item in events:
            await queue.put((source, kind, item))

    pumps = [
        asyncio.create_task(pump("lifecycle", backend.watch_lifecycle(workspace, task_id, cursor.lifecycle))),
        asyncio.create_task(pump("completion", backend.watch_completion(workspace, task_id, cursor.completion))),
    ]
    try:
        while True:
            yield await queue.get()
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


class _Stream(abc.ABC):
    """What every stream shares: the cursor (each message's id), and the notices.
    A subclass renders the operations for its page."""

    def __init__(self, context: Context, workspace: str, task_filter: str = "") -> None:
        self.context = context
        self.backend = context.live
        self.workspace = workspace
        self.task_filter = task_filter  # "" follows the whole workspace
        self.notices: dict[str, str] = {}

    def message(self, cursor: view.Cursor, ops: list[dict[str, str]], first: bool = False) -> ServerSentEvent:
        notice = " · ".join(text for text in self.notices.values() if text)
        return ServerSentEvent(json.dumps({"ops": ops, "notice": notice}), id=cursor.event_id(),
                               retry=RECONNECT_MS if first else None)

    async def run(self, cursor: view.Cursor) -> AsyncIterator[ServerSentEvent]:
        yield self.message(cursor, await self.start(), first=True)
        async for source, kind, item in _merged(self.backend, self.workspace, self.task_filter, cursor):
            if kind == "event":
                if source == "lifecycle":
                    cursor = view.Cursor(item.sequence, cursor.completion)
                    ops = await self.on_lifecycle(item)
                else:
                    cursor = view.Cursor(cursor.lifecycle, item.sequence)
                    ops = await self.on_completion(item)
            else:
                self.notices[source] = item
                ops = []
            if ops or kind != "event":
                yield self.message(cursor, ops)

    @abc.abstractmethod
    async def start(self) -> list[dict[str, str]]:
        """The first message's operations: the page as it stands at the cursor."""

    @abc.abstractmethod
    async def on_lifecycle(self, event: Any) -> list[dict[str, str]]:
        """The operations one committed lifecycle event causes on this page."""

    @abc.abstractmethod
    async def on_completion(self, event: Any) -> list[dict[str, str]]:
        """The operations one committed completion event causes on this page."""


class TaskStream(_Stream):
    """One task page: appends timeline and attempt rows, re-renders the head."""

    def __init__(self, context: Context, workspace: str, task_id: str) -> None:
        super().__init__(context, workspace, task_id)
        self.lifecycle: view.Lifecycle | None = None
        self.settlements: dict[str, view.Settlement] = {}
        self.completions: list[Any] = []
        self.advice: Any = None

    async def start(self) -> list[dict[str, str]]:
        # A fresh read: after a reconnect the head must not wait for the next event.
        try:
            (self.lifecycle,) = await self.backend.tasks(self.workspace, [self.task_filter]) or (None,)
        except grpc.aio.AioRpcError:
            self.lifecycle = None  # the lifecycle service is away; its events will bring the state
        with contextlib.suppress(grpc.aio.AioRpcError):
            self.completions = await self.backend.completions(self.workspace, self.task_filter)
            self.settlements = {c.completion_id: view.settlement_from_completion(c) for c in self.completions}
        await self._refresh_advice()
        return self._head()

    async def _refresh_advice(self) -> None:
        if self.lifecycle is not None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                self.advice = await self.backend.advice(self.workspace, self.lifecycle)

    def _head(self) -> list[dict[str, str]]:
        if self.lifecycle is None:
            return []
        actions = view.task_actions(self.lifecycle, self.advice, self.backend.can_act)
        return [{"op": "replace", "id": "task-head", "html": render.task_head(
            self.workspace, self.lifecycle, self.settlements, actions, self.context.csrf, uuid.uuid4().hex)}]

    async def on_lifecycle(self, event: Any) -> list[dict[str, str]]:
        before = self.lifecycle
        self.lifecycle = view.newer(self.lifecycle, view.lifecycle_from_event(event))
        if self.lifecycle is not before:
            await self._refresh_advice()
        ops = [{"op": "append", "target": "timeline", "html": render.lifecycle_row(event)}]
        with contextlib.suppress(grpc.aio.AioRpcError):
            # Claims and closed runs show up as lifecycle transitions (activation, work status).
            ops.append({"op": "replace", "id": "runs",
                        "html": render.runs_section(await self.backend.runs(self.workspace, self.task_filter))})
        return ops + self._head()

    async def on_completion(self, event: Any) -> list[dict[str, str]]:
        self.settlements = view.apply_completion_event(self.settlements, event)
        with contextlib.suppress(grpc.aio.AioRpcError):
            self.completions = await self.backend.completions(self.workspace, self.task_filter)
        return [
            {"op": "append", "target": "attempts", "html": render.completion_event_row(event)},
            {"op": "replace", "id": "completions",
             "html": render.completions_section(self.completions, self.settlements)},
        ] + self._head()


class ListStream(_Stream):
    """A list page: re-renders the rows it shows when their task changes."""

    def __init__(self, context: Context, workspace: str, followed: Sequence[str]) -> None:
        super().__init__(context, workspace)
        self.rows: dict[str, view.Lifecycle] = {}
        self.followed = set(followed)
        self.settlements: dict[str, dict[str, view.Settlement]] = {}

    async def start(self) -> list[dict[str, str]]:
        try:
            tasks = await self.backend.tasks(self.workspace, sorted(self.followed))
            self.settlements = await self.backend.settlements(self.workspace, tasks)
        except grpc.aio.AioRpcError:
            return []  # the events will bring the rows up to date
        self.rows = {task.task_id: task for task in tasks}
        return [self._row(task_id) for task_id in self.rows]

    def _row(self, task_id: str) -> dict[str, str]:
        return {"op": "replace", "id": f"row-{task_id}", "html": render.task_row(
            self.workspace, self.rows[task_id], self.settlements.get(task_id, {}))}

    async def on_lifecycle(self, event: Any) -> list[dict[str, str]]:
        if event.task_id not in self.followed:
            return []
        self.rows[event.task_id] = view.newer(self.rows.get(event.task_id), view.lifecycle_from_event(event))
        return [self._row(event.task_id)]

    async def on_completion(self, event: Any) -> list[dict[str, str]]:
        if event.task_id not in self.followed:
            return []
        self.settlements[event.task_id] = view.apply_completion_event(self.settlements.get(event.task_id, {}), event)
        return [self._row(event.task_id)] if event.task_id in self.rows else []
