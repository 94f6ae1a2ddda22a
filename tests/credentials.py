"""Credentials for tests: one token signing key per test process, its JWKS file,
tokens for any subject and permissions, and client channels that send one.

In-process servers of the semantic suites listen in plaintext on loopback with
authentication on (`server_security()`); the default test caller is the
completion service's identity with `*:operator`, so that one client may call
every RPC. tests/security exercises TLS, mTLS and every role separately."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

import grpc

from completion_service.clients.outbound import OutboundSecurity
from funnel.auth.client import bearer_interceptors
from funnel.auth.pki import COMPLETION_IDENTITY, ensure_local_pki
from funnel.runtime.security import ServerSecurity

DIRECTORY = Path(tempfile.mkdtemp(prefix="funnel-test-keys-"))
atexit.register(shutil.rmtree, DIRECTORY, True)
# A local CA with the services' certificates, the completion service's identity
# certificate and a token signing key, as `funnel up` makes them.
PKI = ensure_local_pki(DIRECTORY / "pki")
KEY = PKI.load_signing_key()
JWKS_FILE = PKI.jwks


def token(subject: str, permissions: list[str], ttl_seconds: float = 24 * 3600, **claims: Any) -> str:
    return KEY.issue(subject, permissions, ttl_seconds, **claims)


# The default caller of the semantic suites: every role in every workspace.
SUPERUSER = token(COMPLETION_IDENTITY, ["*:operator"])
SERVICE_TOKEN_FILE = DIRECTORY / "completion-service.token"
SERVICE_TOKEN_FILE.write_text(token(COMPLETION_IDENTITY, []), encoding="utf-8")


def server_security(**overrides: Any) -> ServerSecurity:
    """Plaintext on loopback, tokens verified against JWKS_FILE, no rate limit."""
    settings = dict(insecure=True, jwks_file=str(JWKS_FILE), completion_identity=COMPLETION_IDENTITY, rate_limit=0.0)
    settings.update(overrides)
    return ServerSecurity(**settings)


def outbound_security(**overrides: Any) -> OutboundSecurity:
    """The in-process completion service calls its loopback lifecycle service with its token."""
    settings: dict[str, Any] = dict(
        lifecycle_insecure=True, identity_token_file=str(SERVICE_TOKEN_FILE), gates_insecure=True
    )
    settings.update(overrides)
    return OutboundSecurity(**settings)


def metadata(bearer: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {bearer}"),)


def tls_channel(
    address: str, bearer: str | None = SUPERUSER, *, identity: str | None = "completion-identity", **kwargs: Any
) -> grpc.aio.Channel:
    """A TLS channel to a service of the test PKI, presenting the client
    certificate `identity` (a name in PKI: `completion-identity` or `client`;
    None: no certificate) and authenticating as `bearer`."""
    key = PKI.key(identity).read_bytes() if identity else None
    cert = PKI.cert(identity).read_bytes() if identity else None
    credentials = grpc.ssl_channel_credentials(PKI.ca.read_bytes(), key, cert)
    sends = bearer_interceptors(lambda: bearer) if bearer is not None else []
    options = [("grpc.ssl_target_name_override", "localhost"), *kwargs.pop("options", [])]
    return grpc.aio.secure_channel(address, credentials, interceptors=sends, options=options, **kwargs)


def insecure_channel(
    address: str, bearer: str | None = SUPERUSER, *, interceptors=(), **kwargs: Any
) -> grpc.aio.Channel:
    """A plaintext channel that authenticates as `bearer` (None: sends no token)."""
    sends = bearer_interceptors(lambda: bearer) if bearer is not None else []
    return grpc.aio.insecure_channel(address, interceptors=[*sends, *interceptors], **kwargs)
