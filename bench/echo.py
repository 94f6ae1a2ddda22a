"""The baseline's servers: a bare asyncio gRPC echo service with raw-bytes
(de)serializers, no proto file, no storage.

    python bench/echo.py --listen 127.0.0.1:0                      # a "back" server
    python bench/echo.py --listen 127.0.0.1:0 --back HOST:PORT     # a "front" server

Prints `echo serving on HOST:PORT` once it listens.

Transport security, to match the services it stands in for (bench/run.py passes the
local PKI's files): `--cert`/`--key` serve TLS, `--client-ca` also requires client
certificates signed by that CA (mTLS, as the lifecycle service does); a front calls
its back over TLS verified with `--ca`, presenting `--client-cert`/`--client-key`
(as the completion service presents its identity certificate). Without `--cert` the
server is plaintext. The servers do not verify the callers' bearer tokens; the
client sends them anyway, so per-call metadata is the size the services receive.

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
from collections.abc import Sequence

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


def encode_request(size: int, response_size: int, hops: Sequence[tuple[int, int]] = ()) -> bytes:
    """A request of exactly max(size, header) bytes."""
    header = _HEADER.pack(len(hops), response_size) + b"".join(_HOP.pack(a, b) for a, b in hops)
    return header + padding(max(0, size - len(header)))


def decode_request(request: bytes) -> tuple[int, list[tuple[int, int]]]:
    count, response_size = _HEADER.unpack_from(request, 0)
    hops = [_HOP.unpack_from(request, _HEADER.size + i * _HOP.size) for i in range(count)]
    return response_size, hops


def identity(data: bytes) -> bytes:
    return data


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def back_channel(back: str, ca: str | None, client_cert: str | None, client_key: str | None) -> grpc.aio.Channel:
    if ca is None and client_cert is None:
        return grpc.aio.insecure_channel(back)
    credentials = grpc.ssl_channel_credentials(_read(ca), _read(client_key), _read(client_cert))
    return grpc.aio.secure_channel(back, credentials)


async def serve(listen: str, back: str | None, tls: argparse.Namespace) -> None:
    server = grpc.aio.server()
    channel = back_channel(back, tls.ca, tls.client_cert, tls.client_key) if back else None
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
    if tls.cert:
        key, cert = _read(tls.key), _read(tls.cert)
        assert key is not None and cert is not None, "main() takes --cert only with --key"
        credentials = grpc.ssl_server_credentials(
            [(key, cert)],
            root_certificates=_read(tls.client_ca),
            require_client_auth=tls.client_ca is not None,
        )
        port = server.add_secure_port(listen, credentials)
    else:
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
    parser.add_argument("--cert", default=None, help="PEM certificate of this server (serve TLS)")
    parser.add_argument("--key", default=None, help="PEM key of --cert")
    parser.add_argument("--client-ca", default=None, help="PEM CA: require client certificates it signed (mTLS)")
    parser.add_argument("--ca", default=None, help="PEM CA that verifies the back server (front only)")
    parser.add_argument("--client-cert", default=None, help="PEM client certificate presented to the back server")
    parser.add_argument("--client-key", default=None, help="PEM key of --client-cert")
    args = parser.parse_args()
    if (args.cert is None) != (args.key is None) or (args.client_cert is None) != (args.client_key is None):
        parser.error("--cert/--key and --client-cert/--client-key go in pairs")
    if args.client_ca and not args.cert:
        parser.error("--client-ca needs --cert")
    asyncio.run(serve(args.listen, args.back, args))


if __name__ == "__main__":
    main()
