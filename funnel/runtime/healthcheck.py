"""A container health check through the standard gRPC health service.

    python -m funnel.runtime.healthcheck ADDRESS [--ca FILE] [--cert FILE --key FILE]
        [--server-name NAME] [--service NAME] [--alive] [--timeout SECONDS]

Exit status 0 when the service answers SERVING (with `--alive`: when it answers
at all, SERVING or NOT_SERVING), 1 otherwise, with the reason on stderr: what
Docker's HEALTHCHECK and a Kubernetes exec probe read. Every option also comes
from `FUNNEL_HEALTHCHECK_<OPTION>` (FUNNEL_HEALTHCHECK_ADDRESS, …_CA, …), so one
HEALTHCHECK line in the image serves both services, each container naming its own.

Both services listen with TLS only (the lifecycle service also requires a client
certificate), which Kubernetes' native gRPC probe cannot speak: this command is
what the deploy files probe with (deploy/kubernetes/base).
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from funnel.auth.tls import ClientTlsFiles, TlsError

ENV_PREFIX = "FUNNEL_HEALTHCHECK_"
ALIVE = (health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING)


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(ENV_PREFIX + name.upper(), default) or default


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m funnel.runtime.healthcheck",
        description="Exit 0 if the gRPC health service at ADDRESS reports SERVING, 1 otherwise.",
    )
    parser.add_argument("address", nargs="?", default=_env("address"), help=f"host:port ({ENV_PREFIX}ADDRESS)")
    parser.add_argument(
        "--ca",
        default=_env("ca"),
        help=f"PEM CA bundle of the service's certificate (default: system roots) ({ENV_PREFIX}CA)",
    )
    parser.add_argument(
        "--cert", default=_env("cert"), help=f"client certificate, where the service requires one ({ENV_PREFIX}CERT)"
    )
    parser.add_argument("--key", default=_env("key"), help=f"the key of --cert ({ENV_PREFIX}KEY)")
    parser.add_argument(
        "--server-name",
        default=_env("server_name"),
        help=f"name to verify in the service's certificate ({ENV_PREFIX}SERVER_NAME)",
    )
    parser.add_argument(
        "--service",
        default=_env("service", ""),
        help=f"service name to ask about; empty: the whole server ({ENV_PREFIX}SERVICE)",
    )
    parser.add_argument(
        "--alive",
        action="store_true",
        default=_env("alive", "") in ("1", "true", "yes"),
        help="pass on any answer of the health service, NOT_SERVING too (a liveness probe: a "
        f"service whose database is briefly unwritable needs no restart) ({ENV_PREFIX}ALIVE)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=float(_env("timeout", "3") or 3),
        help=f"seconds to wait for the answer ({ENV_PREFIX}TIMEOUT)",
    )
    args = parser.parse_args(argv)
    if not args.address:
        parser.error(f"no address: pass ADDRESS or set {ENV_PREFIX}ADDRESS")
    return args


def check(args: argparse.Namespace) -> tuple[bool, str]:
    """(healthy, what to print) for one health call."""
    tls = ClientTlsFiles(args.ca, args.cert, args.key, args.server_name)
    try:
        credentials = tls.load()
    except TlsError as exc:
        return False, str(exc)
    with grpc.secure_channel(args.address, credentials, options=tls.options()) as channel:
        # types-grpcio-health-checking declares HealthStub without its methods.
        health_check = health_pb2_grpc.HealthStub(channel).Check  # type: ignore[attr-defined]
        try:
            response = health_check(health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)
        except grpc.RpcError as exc:
            details = f": {exc.details()}" if exc.details() else ""
            return False, f"{args.address}: {exc.code().name}{details}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    healthy = response.status in ALIVE if args.alive else response.status == health_pb2.HealthCheckResponse.SERVING
    return healthy, f"{args.address}: {status}"


def main(argv: list[str] | None = None) -> None:
    healthy, message = check(parse_args(argv))
    print(message, file=sys.stdout if healthy else sys.stderr)
    sys.exit(0 if healthy else 1)


if __name__ == "__main__":
    main()
