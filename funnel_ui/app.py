"""The Starlette application: pages, event streams (SSE) and the action endpoints.

The imperative shell: it reads through the backend, asks view.py what to show
and render.py how; the only state it keeps is per open event stream."""

from __future__ import annotations

import hmac
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from funnel.auth.hosts import LOOPBACK_NAMES
from funnel.client import FunnelError
from funnel.runtime.validation import id_problem
from funnel_ui import render, view
from funnel_ui.backend import Backend, Settings
from funnel_ui.streams import AttentionStream, ListStream, TaskStream
from funnel_ui.together import together

PAGE_SIZE = 50
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
    # The attention page lists runs open longer than this (seconds) with a live lease.
    long_run_seconds: float = 3600.0

    @property
    def live(self) -> Backend:
        assert self.backend is not None, "set by the lifespan"
        return self.backend


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        body,
        status,
        headers={
            # Nothing but our own files: an escaping mistake could still not load a script.
            "content-security-policy": "default-src 'self'; frame-ancestors 'none'",
            "x-content-type-options": "nosniff",
            "referrer-policy": "same-origin",
        },
    )


def _rpc_error_page(error: FunnelError, back: str) -> HTMLResponse:
    reason = f" {error.reason}" if error.reason else ""
    return _html(render.error_page(f"{error.code.name}{reason}", error.message, back), HTTP_STATUS.get(error.code, 502))


def _ids(request: Request, *names: str) -> list[str] | None:
    values = [request.path_params[name] for name in names]
    return None if any(id_problem(v) or not v for v in values) else values


def create_app(context: Context) -> Any:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # gRPC's aio channels belong to the running loop: made here, not before.
        async with Backend(context.settings) as backend:
            context.backend = backend
            for workspace in context.workspaces:
                backend.heads(workspace)
            yield

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
        filter_ = _filter(query)
        backend = context.live
        heads = backend.heads(workspace)
        # Read before listing: the stream then replays at worst what the list already shows.
        cursor = view.Cursor(heads.lifecycle, heads.completion)
        token = query.get("page", "")[:4096]
        try:
            try:
                tasks, next_token = await backend.list_page(workspace, filter_, token, PAGE_SIZE)
            except FunnelError as error:
                if not token or error.code != grpc.StatusCode.INVALID_ARGUMENT:
                    raise
                # A page link of another filter or order (or garbage): from the top instead.
                token = ""
                tasks, next_token = await backend.list_page(workspace, filter_, token, PAGE_SIZE)
            counts, settlements = await together(backend.counts(workspace), backend.settlements(workspace, tasks))
        except FunnelError as error:
            return _rpc_error_page(error, "/")
        return _html(
            render.task_list(workspace, filter_, tasks, settlements, next_token, cursor, counts, first_page=not token)
        )

    async def attention_page(request: Request) -> Response:
        ids = _ids(request, "workspace")
        if ids is None:
            return _html(render.error_page("Not a workspace id", request.path_params["workspace"]), 404)
        (workspace,) = ids
        heads = context.live.heads(workspace)
        cursor = view.Cursor(heads.lifecycle, heads.completion)
        try:
            facts, _ = await context.live.attention(workspace, context.long_run_seconds)
        except FunnelError as error:
            return _rpc_error_page(error, render.url("w", workspace))
        return _html(render.attention_page(workspace, facts, context.long_run_seconds, time.time(), cursor))

    async def attention_stream(request: Request) -> Response:
        ids = _ids(request, "workspace")
        if ids is None:
            return Response(status_code=404)
        return EventSourceResponse(
            AttentionStream(context, ids[0]).run(_start_cursor(request)), ping=15, send_timeout=30
        )

    async def task_page(request: Request) -> Response:
        ids = _ids(request, "workspace", "task")
        if ids is None:
            return _html(render.error_page("Not a task id", request.url.path), 404)
        workspace, task_id = ids
        backend = context.live
        try:
            data = await backend.task_data(workspace, task_id)
        except FunnelError as error:
            return _rpc_error_page(error, render.url("w", workspace))
        lifecycle = view.lifecycle_from_task(data.task.task)
        settlements = {c.completion_id: view.settlement_from_completion(c) for c in data.completions}
        head = render.task_head(
            workspace,
            lifecycle,
            settlements,
            view.task_actions(lifecycle, data.advice, backend.permitted(workspace)),
            context.csrf,
            uuid.uuid4().hex,
        )
        return _html(
            render.task_page(
                workspace,
                lifecycle,
                head,
                data.events,
                data.completion_events,
                render.completions_section(data.completions, settlements),
                render.runs_section(data.runs, time.time()),
                render.evidence_section(data.evidence),
                data.transcript,
                data.transcript_more,
                data.cursor,
            )
        )

    async def task_stream(request: Request) -> Response:
        ids = _ids(request, "workspace", "task")
        if ids is None:
            return Response(status_code=404)
        workspace, task_id = ids
        return EventSourceResponse(
            TaskStream(context, workspace, task_id).run(_start_cursor(request)), ping=15, send_timeout=30
        )

    async def list_stream(request: Request) -> Response:
        ids = _ids(request, "workspace")
        if ids is None:
            return Response(status_code=404)
        query = request.query_params
        followed = [t for t in query.get("tasks", "").split(",") if t and not id_problem(t)]
        page = view.ListedPage(
            _filter(query), query.get("first", ""), query.get("last", ""), first_page=query.get("page") != "later"
        )
        return EventSourceResponse(
            ListStream(context, ids[0], page, followed).run(_start_cursor(request)), ping=15, send_timeout=30
        )

    async def act(request: Request) -> Response:
        ids = _ids(request, "workspace", "task")
        action = request.path_params["action"]
        if ids is None or action not in view.ACTIONS:
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
        except FunnelError as error:
            # The services enforce the grants (the buttons only follow them) and the
            # task's state: what they said, with their reason, is what the operator sees.
            return _html(
                render.refusal_page(view.ACTIONS[action].label, error.code.name, error.reason, error.message, back),
                HTTP_STATUS.get(error.code, 502),
            )
        return RedirectResponse(back, 303)

    static = StaticFiles(directory=str(resources.files("funnel_ui") / "static"))
    app = Starlette(
        routes=[
            Route("/", index),
            Route("/go", go),
            Route("/w/{workspace}", task_list),
            Route("/w/{workspace}/stream", list_stream),
            Route("/w/{workspace}/attention", attention_page),
            Route("/w/{workspace}/attention/stream", attention_stream),
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
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=list(context.allowed_hosts), www_redirect=False),
            Middleware(OriginCheck),
        ],
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


def _filter(query: Any) -> view.Filter:
    """A list page's filter from its query; unknown values filter nothing, and a
    prefix that is no id's beginning is dropped."""
    prefix = query.get("q", "").strip()[:128]
    return view.Filter(
        state=_choice(query.get("state", ""), render.STATES),
        outcome=_choice(query.get("outcome", ""), render.OUTCOMES),
        work_status=_choice(query.get("work_status", ""), render.WORK),
        prefix="" if id_problem(prefix) else prefix,
        order=_choice(query.get("sort", ""), view.ORDERS) or "id",
    )


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
    return (
        view.parse_cursor(request.headers.get("last-event-id"))
        or view.parse_cursor(request.query_params.get("after"))
        or view.Cursor()
    )
