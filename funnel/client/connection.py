"""How a command (the `funnel` CLI, `funnel mcp`, `funnel ui`) reaches the
services: TLS material and the caller's token, from flags, environment
variables, or the local trust material that `funnel up` keeps in its data
directory. Here, not in funnel_cli, so that the MCP server and the dashboard,
which the CLI starts, do not import the CLI back.

Precedence: explicit flags (`--ca`, `--cert`, `--key`, `--token`,
`--token-file`), then environment (`FUNNEL_CA`, `FUNNEL_CERT`, `FUNNEL_KEY`,
`FUNNEL_TOKEN`), then `<data-dir>/tls` (its CA and local client certificate, and
a short-lived operator token signed with its key: local use only).

Every command that takes a flag below reads the same environment variable for
its default (`funnel mcp` and `funnel ui` as much as the operator's commands):
`--data-dir` FUNNEL_DATA_DIR, `--lifecycle` FUNNEL_LIFECYCLE, `--completion`
FUNNEL_COMPLETION, `--workspace` FUNNEL_WORKSPACE; a flag given wins."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from funnel.auth.client import bearer_interceptors
from funnel.auth.pki import LocalPki
from funnel.client import FunnelClient, RetryPolicy, Tls
from funnel.client.client import DEFAULT_TIMEOUT

DEFAULT_DATA_DIR = "funnel-data"
DEFAULT_LIFECYCLE = "127.0.0.1:50051"
DEFAULT_COMPLETION = "127.0.0.1:50052"
LOCAL_TOKEN_TTL = 3600.0


class ConnectionSetupError(RuntimeError):
    """The CLI cannot tell how to reach the services safely."""


@dataclass(frozen=True)
class Connection:
    token: str | None
    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    insecure: bool = False

    def channel(self, address: str) -> grpc.aio.Channel:
        token = self.token
        interceptors = bearer_interceptors(lambda: token) if token else []
        if self.insecure:
            return grpc.aio.insecure_channel(address, interceptors=interceptors)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )
        return grpc.aio.secure_channel(address, credentials, interceptors=interceptors)

    def client(
        self, lifecycle: str, completion: str, *, timeout: float = DEFAULT_TIMEOUT, retry: RetryPolicy | None = None
    ) -> FunnelClient:
        """A funnel.client for both services with this TLS material and token;
        `timeout` and `retry` as for FunnelClient."""
        return FunnelClient(lifecycle, completion, tls=self.tls, token=self.token, timeout=timeout, retry=retry)

    @property
    def tls(self) -> Tls | None:
        """The TLS material as FunnelClient takes it (None: plaintext)."""
        return None if self.insecure else Tls(self.ca, self.cert, self.key)

    def with_token(self, token: str | None) -> Connection:
        return Connection(token, self.ca, self.cert, self.key, self.insecure)


def env(name: str, default: str) -> str:
    """The default of a flag: the environment variable `name` when set and not empty."""
    return os.environ.get(name) or default


def add_data_dir(parser: argparse.ArgumentParser | argparse._ArgumentGroup, purpose: str) -> None:
    parser.add_argument(
        "--data-dir",
        default=env("FUNNEL_DATA_DIR", DEFAULT_DATA_DIR),
        help=f"{purpose} (FUNNEL_DATA_DIR; default: {DEFAULT_DATA_DIR})",
    )


def add_addresses(parser: argparse.ArgumentParser, *, lifecycle: bool = True, completion: bool = True) -> None:
    if lifecycle:
        parser.add_argument(
            "--lifecycle",
            default=env("FUNNEL_LIFECYCLE", DEFAULT_LIFECYCLE),
            help=f"lifecycle_service address (FUNNEL_LIFECYCLE; default: {DEFAULT_LIFECYCLE})",
        )
    if completion:
        parser.add_argument(
            "--completion",
            default=env("FUNNEL_COMPLETION", DEFAULT_COMPLETION),
            help=f"completion_service address (FUNNEL_COMPLETION; default: {DEFAULT_COMPLETION})",
        )


def add_workspace(parser: argparse.ArgumentParser, default: str = "demo") -> None:
    parser.add_argument(
        "--workspace",
        "-w",
        default=env("FUNNEL_WORKSPACE", default),
        help=f"the workspace (FUNNEL_WORKSPACE; default: {default})",
    )


# What an UNAVAILABLE says when nothing answered at all (no listener, no such host,
# no route): not a handshake that the server ended.
_NOT_A_HANDSHAKE = (
    "connection refused",
    "dns resolution",
    "name resolution",
    "no route to host",
    "network is unreachable",
    "deadline exceeded",
)


def missing_certificate_hint(connection: Connection, code: grpc.StatusCode, details: str | None) -> str:
    """What to add to an UNAVAILABLE that a missing client certificate explains.

    A listener that requires client certificates (the lifecycle service's, with
    --tls-client-ca, as under `funnel up`) ends the TLS handshake of a caller
    without one: before any gRPC status can be sent, so the caller sees only an
    opaque UNAVAILABLE ("Socket closed"). The services keep requiring the
    certificate in the handshake (docs/security.md, "Transport"); the CLI says what
    is missing instead."""
    if connection.insecure or connection.cert is not None or code != grpc.StatusCode.UNAVAILABLE:
        return ""
    if any(words in (details or "").lower() for words in _NOT_A_HANDSHAKE):
        return ""
    return (
        "; the connection was made without a client certificate, and the lifecycle service requires one "
        "(it ends the TLS handshake of a caller without one, a token is not enough): pass --cert and --key "
        "(FUNNEL_CERT, FUNNEL_KEY), e.g. the client.pem and client.key in the tls/ folder of `funnel up`'s "
        "--data-dir, or leave out --ca to use that folder"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection")
    add_data_dir(group, "where `funnel up` keeps its files; its tls/ folder is used when nothing else is given")
    group.add_argument("--ca", default=os.environ.get("FUNNEL_CA"), help="PEM CA bundle of the services (FUNNEL_CA)")
    group.add_argument("--cert", default=os.environ.get("FUNNEL_CERT"), help="PEM client certificate (FUNNEL_CERT)")
    group.add_argument("--key", default=os.environ.get("FUNNEL_KEY"), help="PEM client key (FUNNEL_KEY)")
    group.add_argument("--token", default=os.environ.get("FUNNEL_TOKEN"), help="bearer token (FUNNEL_TOKEN)")
    group.add_argument("--token-file", help="file holding the bearer token")
    group.add_argument("--insecure", action="store_true", help="plaintext (services started with --insecure)")


def _read(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConnectionSetupError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None


def local_token(data_dir: Path, subject: str, permissions: list[str], ttl: float = LOCAL_TOKEN_TTL) -> str:
    pki = LocalPki(data_dir / "tls")
    if not pki.signing_key.exists():
        raise ConnectionSetupError(
            f"no token given and no local signing key in {pki.directory} (start `funnel up` there, or pass --token)"
        )
    return pki.load_signing_key().issue(subject, permissions, ttl)


def from_arguments(args: argparse.Namespace, *, local_operator: bool = True) -> Connection:
    """With `local_operator` False no token is made up from the local signing key:
    a command that acts for someone else (`funnel mcp`) must be given its token."""
    data_dir = Path(args.data_dir)
    pki = LocalPki(data_dir / "tls")
    local = pki.ca.exists()
    token = args.token
    if token is None and args.token_file:
        token = _read(args.token_file).decode().strip()
    if token is None and local and local_operator:
        token = local_token(data_dir, "local-operator", ["*:operator"])
    if args.insecure:
        return Connection(token, insecure=True)
    ca = _read(args.ca) if args.ca else (_read(pki.ca) if local else None)
    cert_path = args.cert or (str(pki.cert("client")) if local and not args.ca else None)
    key_path = args.key or (str(pki.key("client")) if local and not args.ca else None)
    if (cert_path is None) != (key_path is None):
        raise ConnectionSetupError("--cert and --key go together")
    return Connection(token, ca, _read(cert_path) if cert_path else None, _read(key_path) if key_path else None)
