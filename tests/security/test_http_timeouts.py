"""Slowloris: half-sent HTTP requests are closed after the request timeout
(funnel/runtime/http.py, docs/security.md "Limits") on each HTTP server, as real
processes: the completion service's /metrics, the dashboard (`funnel ui`) and
MCP over HTTP (`funnel mcp --http`). Meanwhile a whole request is answered."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from funnel.runtime.http import REQUEST_SECONDS
from tests import credentials
from tests.mcp.support import FUNNEL, http_server
from tests.security.support import WS

HALF_SENT = 200
# How much later than the timeout a loaded 2-core machine may close a connection.
MARGIN = 20.0
# What each connection sends before it stops: nothing; half a head; a whole head
# with a tenth of the body it announces.
PARTS = [
    b"",
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
    b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    + b"{" * 100,
]


async def half_sent(host: str, port: int, part: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(part)
    await writer.drain()
    return reader, writer


async def closed_by_server(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(ConnectionError):
        while await reader.read(65536):
            pass  # an answer to the broken request (400, 408) may come first


def answered(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as refused:  # an HTTP answer all the same
        return refused.code


async def assert_half_sent_requests_are_closed(url: str) -> None:
    where = urlsplit(url)
    connections = [await half_sent(where.hostname, where.port, PARTS[n % len(PARTS)]) for n in range(HALF_SENT)]
    opened = time.monotonic()
    assert await asyncio.to_thread(answered, url) < 500  # the server still answers a whole request
    pending = {asyncio.ensure_future(closed_by_server(reader)) for reader, _ in connections}
    _, pending = await asyncio.wait(pending, timeout=REQUEST_SECONDS + MARGIN)
    for task in pending:
        task.cancel()
    for _, writer in connections:
        writer.close()
    assert not pending, (
        f"{len(pending)} of {HALF_SENT} half-sent requests still open "
        f"{time.monotonic() - opened:.0f} s after they were sent (timeout {REQUEST_SECONDS:g} s)"
    )


async def test_metrics(pair):
    p = await pair(completion_args=["--metrics-listen", "127.0.0.1:0"])
    await assert_half_sent_requests_are_closed(p.completion.process.metrics_url)


async def test_dashboard(pair):
    p = await pair()
    pki = credentials.PKI
    process = subprocess.Popen(
        [
            str(FUNNEL),
            "ui",
            "--listen",
            "127.0.0.1:0",
            "--workspace",
            WS,
            "--lifecycle",
            p.lifecycle.address,
            "--completion",
            p.completion.address,
            "--ca",
            str(pki.ca),
            "--cert",
            str(pki.cert("client")),
            "--key",
            str(pki.key("client")),
            "--token",
            credentials.token("viewer-1", [f"{WS}:viewer"]),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = await asyncio.to_thread(process.stdout.readline)
        assert line.startswith("funnel ui serving on "), line
        await assert_half_sent_requests_are_closed(line.split()[4])
    finally:
        process.terminate()
        process.wait(15)
        process.stdout.close()


async def test_mcp_over_http(pair, tmp_path):
    p = await pair()
    with http_server(p, tmp_path / "mcp.log") as url:
        await assert_half_sent_requests_are_closed(url)
