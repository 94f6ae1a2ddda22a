"""A listener's security settings: TLS (optionally requiring client
certificates), bearer-token authentication, rate limits and stream caps; the
refusals that keep an unprotected service off the network; and the reload of
certificates and key sets when their files change or the process gets SIGHUP."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from funnel.auth import tokens
from funnel.auth.principal import subject_problem
from funnel.auth.tls import ServerTls, ServerTlsFiles, TlsError, file_signature, is_loopback
from funnel.runtime.boundary import Admission, Authenticator
from funnel.runtime.pace import Pace
from funnel.runtime.ratelimit import RateLimiter
from funnel.runtime.validation import id_problem

log = logging.getLogger(__name__)


class SecurityRefused(Exception):
    """The service would be unsafe as configured; the message says what to pass."""


@dataclass(frozen=True)
class ServerSecurity:
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    # Plaintext, on a loopback address only.
    insecure: bool = False
    jwks_file: str | None = None
    token_issuer: str = tokens.DEFAULT_ISSUER
    token_audience: str = tokens.DEFAULT_AUDIENCE
    # No authentication (every caller is an anonymous operator), loopback only.
    no_auth: bool = False
    # Whose calls count as the completion service's (lifecycle service only).
    completion_identity: str | None = None
    rate_limit: float = 1000.0
    rate_burst: float = 2000.0
    # The completion service multiplexes every caller's lifecycle calls on one
    # connection: the cap must not throttle it under load.
    max_streams_per_connection: int = 1000
    stream_idle_seconds: float = 30.0
    # A client stream slower than this on average, once its first idle timeout is
    # over, is ended (funnel/runtime/pace.py); 0: no minimum.
    stream_min_bytes_per_second: float = 1024.0
    # Connections (funnel/runtime/server.py, connection_options): a new one must
    # finish its TLS and HTTP/2 handshake within the first; one without a call is
    # closed after the second; a peer that leaves a ping unanswered for the fourth,
    # once the third has passed without traffic, is cut off.
    handshake_timeout_seconds: float = 20.0
    connection_idle_seconds: float = 300.0
    keepalive_seconds: float = 60.0
    keepalive_timeout_seconds: float = 20.0
    reload_interval: float = 2.0


def add_arguments(parser: argparse.ArgumentParser, env: Callable[[str, str], str]) -> None:
    """The listener security flags; each defaults to its environment variable."""
    d = ServerSecurity()
    group = parser.add_argument_group("security (docs/security.md)")
    group.add_argument("--tls-cert", default=env("tls_cert", "") or None, help="PEM certificate chain of this listener")
    group.add_argument("--tls-key", default=env("tls_key", "") or None, help="PEM private key of --tls-cert")
    group.add_argument(
        "--tls-client-ca",
        default=env("tls_client_ca", "") or None,
        help="PEM CA bundle: require client certificates it signed (mTLS)",
    )
    group.add_argument(
        "--insecure",
        action="store_true",
        default=env("insecure", "") in ("1", "true", "yes"),
        help="serve plaintext; refused unless --listen is a loopback address",
    )
    group.add_argument(
        "--jwks-file",
        default=env("jwks_file", "") or None,
        help="JWKS (EdDSA or ES256 keys) that verifies callers' bearer tokens; reloaded on change",
    )
    group.add_argument("--token-issuer", default=env("token_issuer", d.token_issuer), help="required `iss` of tokens")
    group.add_argument(
        "--token-audience", default=env("token_audience", d.token_audience), help="required `aud` of tokens"
    )
    group.add_argument(
        "--no-auth",
        action="store_true",
        default=env("no_auth", "") in ("1", "true", "yes"),
        help="accept calls without credentials as an anonymous operator; refused unless --listen is loopback",
    )
    group.add_argument(
        "--rate-limit",
        type=float,
        default=float(env("rate_limit", str(d.rate_limit))),
        help="requests per second per caller (0: no limit)",
    )
    group.add_argument(
        "--rate-burst",
        type=float,
        default=float(env("rate_burst", str(d.rate_burst))),
        help="requests a caller may send at once above the rate",
    )
    group.add_argument(
        "--max-streams-per-connection",
        type=int,
        default=int(env("max_streams_per_connection", str(d.max_streams_per_connection))),
        help="concurrent calls one client connection may have open",
    )
    group.add_argument(
        "--stream-idle-seconds",
        type=float,
        default=float(env("stream_idle_seconds", str(d.stream_idle_seconds))),
        help="a client stream (transcript import) silent this long is ended",
    )
    # Flags named after their ServerSecurity field, with its default.
    for field_name, meaning in (
        (
            "stream_min_bytes_per_second",
            "a client stream that has sent less than this per second on average, once "
            "its first idle timeout is over, is ended (0: no minimum)",
        ),
        (
            "handshake_timeout_seconds",
            "a connection that has not finished its TLS and HTTP/2 handshake by then is closed",
        ),
        (
            "connection_idle_seconds",
            "a connection without a call for this long is closed (the client reconnects when it needs to)",
        ),
        (
            "keepalive_seconds",
            "the server pings a connection quiet this long, and closes it when the ping stays "
            "unanswered for --keepalive-timeout-seconds",
        ),
        ("keepalive_timeout_seconds", "how long a keepalive ping may stay unanswered"),
    ):
        group.add_argument(
            "--" + field_name.replace("_", "-"),
            type=float,
            default=float(env(field_name, str(getattr(d, field_name)))),
            help=meaning,
        )
    group.add_argument(
        "--reload-interval",
        type=float,
        default=float(env("reload_interval", str(d.reload_interval))),
        help="seconds between checks for changed certificate and JWKS files (SIGHUP reloads at once)",
    )


def from_arguments(args: argparse.Namespace, completion_identity: str | None = None) -> ServerSecurity:
    return ServerSecurity(
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        insecure=args.insecure,
        jwks_file=args.jwks_file,
        token_issuer=args.token_issuer,
        token_audience=args.token_audience,
        no_auth=args.no_auth,
        completion_identity=completion_identity,
        rate_limit=args.rate_limit,
        rate_burst=args.rate_burst,
        max_streams_per_connection=args.max_streams_per_connection,
        stream_idle_seconds=args.stream_idle_seconds,
        stream_min_bytes_per_second=args.stream_min_bytes_per_second,
        handshake_timeout_seconds=args.handshake_timeout_seconds,
        connection_idle_seconds=args.connection_idle_seconds,
        keepalive_seconds=args.keepalive_seconds,
        keepalive_timeout_seconds=args.keepalive_timeout_seconds,
        reload_interval=args.reload_interval,
    )


class Reloadable(Protocol):
    async def reload_if_changed(self, force: bool = False) -> bool: ...


class KeySetFile:
    """The JWKS file behind a TokenVerifier, re-read when it changes."""

    def __init__(self, path: str, verifier: tokens.TokenVerifier) -> None:
        self.path = path
        self.verifier = verifier
        self.signature = file_signature([path])

    async def reload_if_changed(self, force: bool = False) -> bool:
        signature = file_signature([self.path])
        if not force and signature == self.signature:
            return False
        self.signature = signature
        try:
            self.verifier.replace_keys(tokens.load_key_set(self.path))
        except tokens.KeySetError as exc:
            log.error("JWKS not reloaded, the keys in use stay: %s", exc)
            return False
        log.info("JWKS reloaded from %s", self.path)
        return True


@dataclass
class PreparedSecurity:
    """What a listener runs with, built from ServerSecurity."""

    tls: ServerTls | None
    admission: Admission
    reloadables: list[Reloadable]
    settings: ServerSecurity


def prepare(settings: ServerSecurity, listen: str, max_message_bytes: int) -> PreparedSecurity:
    """Loads the TLS files and the key set, or raises SecurityRefused."""
    identity = settings.completion_identity
    # The identity becomes the subject of the completion service's calls.
    if identity is not None and subject_problem(identity):
        raise SecurityRefused(f"--completion-identity {identity!a} {subject_problem(identity)}")
    plaintext_ok = is_loopback(listen)
    tls = None
    if settings.insecure:
        if settings.tls_cert or settings.tls_key or settings.tls_client_ca:
            raise SecurityRefused("--insecure and --tls-cert/--tls-key/--tls-client-ca exclude each other")
        if not plaintext_ok:
            raise SecurityRefused(
                f"--insecure serves plaintext and is allowed only on a loopback address (127.0.0.1, ::1, "
                f"localhost), not on {listen}; pass --tls-cert and --tls-key instead"
            )
    elif settings.tls_cert and settings.tls_key:
        try:
            tls = ServerTls(ServerTlsFiles(settings.tls_cert, settings.tls_key, settings.tls_client_ca))
        except TlsError as exc:
            raise SecurityRefused(str(exc)) from None
    else:
        raise SecurityRefused(
            "no TLS certificate: pass --tls-cert and --tls-key (and --tls-client-ca to require client "
            "certificates), or --insecure to serve plaintext on a loopback address"
        )
    reloadables: list[Reloadable] = [tls] if tls else []
    verifier = None
    if settings.no_auth:
        if settings.jwks_file:
            raise SecurityRefused("--no-auth and --jwks-file exclude each other")
        if not plaintext_ok:
            raise SecurityRefused(
                f"--no-auth lets anyone call as an operator and is allowed only on a loopback address, not on "
                f"{listen}; pass --jwks-file instead"
            )
        log.warning("authentication is OFF: every caller is an anonymous operator (--no-auth)")
    elif settings.jwks_file:
        try:
            keys = tokens.load_key_set(settings.jwks_file)
        except tokens.KeySetError as exc:
            raise SecurityRefused(str(exc)) from None
        trust_certificates = tls is not None and settings.tls_client_ca is not None
        verifier = tokens.TokenVerifier(
            keys,
            settings.token_issuer,
            settings.token_audience,
            lambda workspace: id_problem(workspace) is None,
            settings.completion_identity,
            # Where client certificates are verified only a certificate proves the
            # completion service; elsewhere its service token does.
            service_by_token=not trust_certificates,
        )
        reloadables.append(KeySetFile(settings.jwks_file, verifier))
    else:
        raise SecurityRefused(
            "no key material to authenticate callers: pass --jwks-file with the JWKS that verifies their "
            "bearer tokens (or --no-auth on a loopback address to accept anyone as an operator)"
        )
    authenticator = Authenticator(
        verifier,
        settings.completion_identity,
        trust_certificates=tls is not None and settings.tls_client_ca is not None,
    )
    limiter = RateLimiter(settings.rate_limit, settings.rate_burst) if settings.rate_limit > 0 else None
    pace = Pace(settings.stream_idle_seconds, settings.stream_min_bytes_per_second)
    admission = Admission(authenticator, limiter, max_message_bytes, pace)
    return PreparedSecurity(tls, admission, reloadables, settings)


class Reloader:
    """Re-reads changed certificate and key files every `interval` seconds, and at
    once when `trigger` is called (SIGHUP)."""

    def __init__(self, reloadables: list[Reloadable], interval: float) -> None:
        self._reloadables = reloadables
        self._interval = interval
        self._forced = asyncio.Event()

    def trigger(self) -> None:
        self._forced.set()

    async def run_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._forced.wait(), timeout=self._interval)
            forced = self._forced.is_set()
            self._forced.clear()
            for reloadable in self._reloadables:
                try:
                    await reloadable.reload_if_changed(force=forced)
                except Exception:  # a reload failure keeps the material in use
                    log.exception("reload failed; the material in use stays")
