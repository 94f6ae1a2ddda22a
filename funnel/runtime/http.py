"""Timeouts of the HTTP servers: the dashboard (`funnel ui`) and MCP over HTTP
(`funnel mcp --http`), both on uvicorn, and `/metrics` (funnel/runtime/metrics.py).

A client must send a whole request (line, headers and body) within
REQUEST_SECONDS of connecting, or of the answer to its previous request on the
connection; an idle keep-alive connection is closed after KEEP_ALIVE_SECONDS; a
request's head may be at most MAX_HEAD_BYTES. Neither uvicorn nor the standard
library's WSGI server has the first: a client that connects and sends half a
request (slowloris) kept the connection, and on /metrics a thread, for as long
as it liked (issue 21: 3,000 such requests stayed open). Once a request has
arrived its answer may take as long as it needs: event streams stay open."""

from __future__ import annotations

from typing import Any

REQUEST_SECONDS = 10.0
KEEP_ALIVE_SECONDS = 5
MAX_HEAD_BYTES = 16 * 1024


def uvicorn_config(app: Any, **options: Any) -> Any:
    """A uvicorn.Config for `app` with these timeouts (uvicorn is imported here:
    only the commands that serve HTTP need it)."""
    import uvicorn

    from funnel.runtime.http_h11 import TimedH11Protocol

    return uvicorn.Config(
        app,
        http=TimedH11Protocol,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        **options,
    )


async def serve_asgi(app: Any, host: str, port: int, **options: Any) -> None:
    """Serves `app` on host:port with these timeouts until the process is stopped."""
    import uvicorn

    await uvicorn.Server(uvicorn_config(app, host=host, port=port, **options)).serve()
