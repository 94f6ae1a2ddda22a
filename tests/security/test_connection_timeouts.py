"""Connections end instead of lingering (docs/security.md, "Limits"), against real
service processes over TLS: raw TCP connections that never send are closed after
the handshake timeout; a connection without a call is closed after the idle
timeout while one with an open watch stream stays; a peer that stops answering
pings is cut off after the keepalive timeout."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc

from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import completion_service_pb2_grpc as completion_grpc
from funnel.runtime.security import ServerSecurity
from tests import credentials
from tests.security.support import WS

SILENT_PER_SERVICE = 100
# How much later than its timeout a loaded 2-core machine may close a connection.
MARGIN = 20.0
HOST = credentials.token("host-1", [f"{WS}:host"])


async def closed_by_server(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(ConnectionError):
        while await reader.read(1024):
            pass


async def test_silent_tcp_connections_are_closed_after_the_handshake_timeout(pair):
    p = await pair()
    timeout = ServerSecurity().handshake_timeout_seconds  # the documented default, 20 s
    connections = []
    for service in (p.lifecycle, p.completion):
        for _ in range(SILENT_PER_SERVICE):
            connections.append(await asyncio.open_connection("127.0.0.1", service.port))
    opened = time.monotonic()
    # The services still serve while the silent connections are open.
    await p.cs.ListRuns(completion_messages.ListRunsRequest(workspace_id=WS), timeout=10)
    pending = {asyncio.ensure_future(closed_by_server(reader)) for reader, _ in connections}
    _, pending = await asyncio.wait(pending, timeout=timeout + MARGIN)
    open_after = len(pending)
    for task in pending:
        task.cancel()
    for _, writer in connections:
        writer.close()
    assert open_after == 0, (
        f"{open_after} of {len(connections)} silent connections still open "
        f"{time.monotonic() - opened:.0f} s after they were opened"
    )


async def test_a_connection_without_calls_is_closed_after_the_idle_timeout(pair):
    p = await pair(completion_args=["--connection-idle-seconds", "2"])
    idle = credentials.tls_channel(p.completion.address, HOST, identity=None)
    watching = credentials.tls_channel(p.completion.address, HOST, identity=None)
    try:
        await completion_grpc.CompletionServiceStub(idle).ListRuns(
            completion_messages.ListRunsRequest(workspace_id=WS), timeout=10
        )
        watch = completion_grpc.CompletionServiceStub(watching).WatchCompletionEvents(
            completion_messages.WatchCompletionEventsRequest(workspace_id=WS), timeout=120
        )
        await until_state(watching, grpc.ChannelConnectivity.READY)
        assert idle.get_state() == grpc.ChannelConnectivity.READY
        # The server ends the connection without a call (GOAWAY): the channel goes idle.
        await until_state(idle, grpc.ChannelConnectivity.IDLE, timeout=2 + MARGIN)
        # The one with a watch stream open is still connected, its stream still open.
        assert watching.get_state() == grpc.ChannelConnectivity.READY
        assert not watch.done()
        watch.cancel()
    finally:
        await idle.close()
        await watching.close()


async def until_state(channel: grpc.aio.Channel, wanted: grpc.ChannelConnectivity, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (state := channel.get_state()) != wanted:
        left = deadline - time.monotonic()
        assert left > 0, f"the channel is {state.name}, not {wanted.name}"
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(channel.wait_for_state_change(state), left)


class Blackhole:
    """A TCP relay to `target` that can stop relaying while keeping both
    connections open: the peer on either side goes silent, as a client whose
    network vanished does."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.relaying = True
        self.server_closed = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def _accept(self, client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [client_writer, server_writer]
        self._tasks += [
            asyncio.ensure_future(self._pipe(client_reader, server_writer)),
            asyncio.ensure_future(self._pipe(server_reader, client_writer, from_server=True)),
        ]

    async def _pipe(self, reader, writer, from_server: bool = False) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if self.relaying:
                    writer.write(data)
        if from_server:
            self.server_closed.set()

    async def close(self) -> None:
        self._server.close()
        for task in self._tasks:
            task.cancel()
        for writer in self._writers:
            writer.close()


async def test_a_peer_that_stops_answering_pings_is_cut_off(pair):
    p = await pair(completion_args=["--keepalive-seconds", "1", "--keepalive-timeout-seconds", "1"])
    relay = Blackhole(p.completion.port)
    port = await relay.start()
    channel = credentials.tls_channel(f"127.0.0.1:{port}", HOST, identity=None)
    try:
        stub = completion_grpc.CompletionServiceStub(channel)
        watch = stub.WatchCompletionEvents(
            completion_messages.WatchCompletionEventsRequest(workspace_id=WS), timeout=120
        )
        # A call answered after the watch began means the server has the watch's
        # stream (frames arrive in order): silenced before, the server would hold a
        # connection without calls, which it does not ping (gRPC pings only
        # connections with calls) and closes only at the idle timeout.
        await stub.ListRuns(completion_messages.ListRunsRequest(workspace_id=WS), timeout=30)
        relay.relaying = False  # the client's side goes silent, its watch stream still open
        await asyncio.wait_for(relay.server_closed.wait(), 1 + 1 + MARGIN)
        watch.cancel()
    finally:
        await channel.close()
        await relay.close()
