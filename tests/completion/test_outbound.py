"""The completion service's channel to the lifecycle service (completion_service.clients.outbound),
against a real gRPC server behind a loopback proxy that plays a slow network."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from completion_service.clients.outbound import LifecycleChannel, OutboundSecurity

# How long the proxy holds the server's first bytes (its HTTP/2 SETTINGS): a loaded
# machine or a slow network, slower than a connection attempt was once given (100 ms).
HANDSHAKE_DELAY = 0.5


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float = 0.0) -> None:
    try:
        with contextlib.suppress(ConnectionError):
            data = await reader.read(65536)
            await asyncio.sleep(delay)  # the slow peer itself, not a wait of the test
            while data:
                writer.write(data)
                await writer.drain()
                data = await reader.read(65536)
    finally:
        writer.close()


async def test_the_lifecycle_channel_connects_to_a_service_slow_to_answer_its_handshake():
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    pipes: set[asyncio.Task] = set()

    async def slow_network(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", port)
        pipes.update(
            {
                asyncio.create_task(pipe(client_reader, server_writer)),
                asyncio.create_task(pipe(server_reader, client_writer, HANDSHAKE_DELAY)),
            }
        )

    proxy = await asyncio.start_server(slow_network, "127.0.0.1", 0)
    address = f"127.0.0.1:{proxy.sockets[0].getsockname()[1]}"
    channel = LifecycleChannel(address, OutboundSecurity(lifecycle_insecure=True))
    try:
        stub = health_pb2_grpc.HealthStub(channel.channel)
        answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await channel.close()
        proxy.close()
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        await proxy.wait_closed()
        await server.stop(None)
