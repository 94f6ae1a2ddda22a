"""The baseline's servers: a bare asyncio gRPC echo service with raw-bytes
(de)serializers, no proto file, no storage.

    python bench/echo.py --listen 127.0.0.1:0                      # a "back" server
    python bench/echo.py --listen 127.0.0.1:0 --back HOST:PORT     # a "front" server

Prints `echo serving on HOST:PORT` once it listens.

A request is a small header followed by padding up to the request size the client
chose (so that it matches the serialized size of the real request):

    byte 0      number of back calls the front makes (sequentially, one channel)
    bytes 1-4   size of the response to send back (big-endian uint32)
    then per back call: request size, response size (uint32 each)

The back server ignores the hop count and answers with the asked-for number of bytes;
the front makes its back calls, each with a request carrying the asked-for response size,
then answers. A front without back calls to make is a one-hop echo.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import struct

import grpc

SERVICE = "bench.Echo"
METHOD = f"/{SERVICE}/Call"
BACK_TIMEOUT = 5.0  # like the completion service's lifecycle deadline

_HEADER = struct.Struct(">BI")
_HOP = struct.Struct(">II")
_padding_cache: dict[int, bytes] = {}


def padding(size: int) -> bytes:
    data = _padding_cache.get(size)
    if data is None:
        data = _padding_cache[size] = b"\x00" * size
    return data


def encode_request(size: int, response_size: int, hops: list[tuple[int, int]] = ()) -> bytes:
    """A request of exactly max(size, header) bytes."""
    header = _HEADER.pack(len(hops), response_size) + b"".join(_HOP.pack(a, b) for a, b in hops)
    return header + padding(max(0, size - len(header)))


def decode_request(request: bytes) -> tuple[int, list[tuple[int, int]]]:
    count, response_size = _HEADER.unpack_from(request, 0)
    hops = [_HOP.unpack_from(request, _HEADER.size + i * _HOP.size) for i in range(count)]
    return response_size, hops


def identity(data: bytes) -> bytes:
    return data


async def serve(listen: str, back: str | None) -> None:
    server = grpc.aio.server()
    channel = grpc.aio.insecure_channel(back) if back else None
    call_back = (
        channel.unary_unary(METHOD, request_serializer=identity, response_deserializer=identity) if channel else None
    )

    async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        response_size, hops = decode_request(request)
        if call_back is not None:
            for request_size, back_response_size in hops:
                await call_back(encode_request(request_size, back_response_size), timeout=BACK_TIMEOUT)
        return padding(response_size)

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {"Call": grpc.unary_unary_rpc_method_handler(call, request_deserializer=None, response_serializer=None)},
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(listen)
    await server.start()
    print(f"echo serving on {listen.rsplit(':', 1)[0]}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)
    if channel is not None:
        await channel.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--back", default=None, help="address of the back server (makes this a front server)")
    args = parser.parse_args()
    asyncio.run(serve(args.listen, args.back))


if __name__ == "__main__":
    main()
