"""The completion service's outbound channels: to the lifecycle service, as
itself (its client certificate for mTLS, or its service token), and to external
gates (TLS and its certificate, never its token: a gate is a third party that
must not be able to replay the credential that settles completions). Every call
on them carries the caller's trace context (`traceparent`, funnel/runtime/tracing.py).

Certificates, CA bundles and the token file are re-read when they change (or on
SIGHUP); a changed certificate opens a new channel, and the previous one is
closed at the next reload, after its calls had time to finish."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from funnel.auth.tls import ClientTlsFiles, TlsError, file_signature, is_loopback
from funnel.runtime.tracing import ClientSpans

log = logging.getLogger(__name__)
# gRPC's default reconnect backoff grows to 120 s: after a lifecycle outage the
# settlement outbox and every claim would keep failing fast for up to two minutes
# although the lifecycle service is back. Reconnect within a second or two instead.
# Not grpc.min_reconnect_backoff_ms: gRPC takes it as the time a connection attempt
# is given (20 s by default), and 100 ms failed every attempt to a peer slow to
# answer the handshake (a loaded machine, a slow network).
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


class OutboundRefused(Exception):
    """Outbound security settings that would leak or could not work."""


@dataclass(frozen=True)
class OutboundSecurity:
    # TLS to the lifecycle service (CA bundle, client certificate, server name);
    # a None CA means the system's roots. The client certificate is also what
    # the service presents to external gates.
    lifecycle_tls: ClientTlsFiles = field(default_factory=ClientTlsFiles)
    # Plaintext to a loopback lifecycle service.
    lifecycle_insecure: bool = False
    # A file holding this service's bearer token for the lifecycle service.
    identity_token_file: str | None = None
    # TLS to external gates: CA bundle; the client certificate is lifecycle_tls's.
    gate_ca: str | None = None
    # Plaintext to loopback gates.
    gates_insecure: bool = False


def check(settings: OutboundSecurity, lifecycle_address: str, gate_addresses: list[str]) -> None:
    """Raises OutboundRefused for settings that cannot be used safely."""
    tls = settings.lifecycle_tls
    if settings.lifecycle_insecure:
        if tls.ca or tls.server_name:
            raise OutboundRefused("--lifecycle-insecure and --lifecycle-ca/--lifecycle-server-name exclude each other")
        if not is_loopback(lifecycle_address):
            raise OutboundRefused(
                f"--lifecycle-insecure sends this service's credentials in plaintext and is allowed only to a "
                f"loopback address, not to {lifecycle_address}; pass --lifecycle-ca instead"
            )
    elif not (tls.cert or settings.identity_token_file):
        raise OutboundRefused(
            "no identity for the lifecycle service, which accepts settlements only from this service: pass "
            "--identity-cert and --identity-key (a client certificate whose URI SAN is the completion identity) "
            "or --identity-token-file"
        )
    if (tls.cert is None) != (tls.key is None):
        raise OutboundRefused("--identity-cert and --identity-key go together")
    for address in gate_addresses:
        if settings.gates_insecure and not is_loopback(address):
            raise OutboundRefused(
                f"--gates-insecure allows plaintext only to loopback gates, not to {address}; pass --gate-ca instead"
            )


class TokenFile:
    """A bearer token kept in a file (rotated by whoever issues it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.signature: tuple[tuple[object, ...], ...] = ()
        self.token = ""
        self._read()

    def _read(self) -> None:
        try:
            token = Path(self.path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise TlsError(f"cannot read token file {self.path!r}: {exc.strerror or exc}") from None
        if not token:
            raise TlsError(f"token file {self.path!r} is empty")
        self.token = token
        self.signature = file_signature([self.path])

    def reload_if_changed(self) -> bool:
        if file_signature([self.path]) == self.signature:
            return False
        try:
            self._read()
        except TlsError as exc:
            log.error("service token not reloaded, the one in use stays: %s", exc)
            return False
        log.info("service token reloaded from %s", self.path)
        return True


def keepalive_options(seconds: float) -> list[tuple[str, int]]:
    """HTTP/2 pings every `seconds` while a call is open (the lifecycle projection's
    streams always are), and the connection closed when one goes unanswered as
    long (`ping_timeout_ms` is the bound gRPC 1.8x applies to them, measured): a
    lifecycle service that froze, or a connection that died without a word, ends
    the streams instead of leaving them quietly open. The servers admit pings this
    often (funnel.runtime.server)."""
    millis = max(1000, int(seconds * 1000))
    return [
        ("grpc.keepalive_time_ms", millis),
        ("grpc.keepalive_timeout_ms", millis),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_time_between_pings_ms", millis),
        ("grpc.http2.ping_timeout_ms", millis),
    ]


class LifecycleChannel:
    """The channel to the lifecycle service, re-opened when its TLS files change."""

    def __init__(self, address: str, settings: OutboundSecurity, keepalive_seconds: float = 20.0) -> None:
        self._address = address
        self._settings = settings
        self._options = RECONNECT_OPTIONS + keepalive_options(keepalive_seconds)
        self._token = TokenFile(settings.identity_token_file) if settings.identity_token_file else None
        self._signature = file_signature(settings.lifecycle_tls.paths)
        self.channel = self._open()
        self._retired: list[grpc.aio.Channel] = []

    def _open(self) -> grpc.aio.Channel:
        # No interceptors: calls carry their metadata (metadata(); spans and the
        # trace context, LifecycleClient), which costs far less per call.
        if self._settings.lifecycle_insecure:
            return grpc.aio.insecure_channel(self._address, options=self._options)
        tls = self._settings.lifecycle_tls
        return grpc.aio.secure_channel(self._address, tls.load(), options=self._options + tls.options())

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What every call on the channel sends: this service's bearer token, when it
        proves itself with one (--identity-token-file), re-read as it rotates."""
        return (("authorization", f"Bearer {self._token.token}"),) if self._token is not None else ()

    async def reload_if_changed(self, force: bool = False) -> bool:
        if self._token is not None:
            self._token.reload_if_changed()
        for old in self._retired:
            await old.close()
        self._retired.clear()
        signature = file_signature(self._settings.lifecycle_tls.paths)
        if self._settings.lifecycle_insecure or (not force and signature == self._signature):
            return False
        self._signature = signature
        try:
            fresh = self._open()
        except TlsError as exc:
            log.error("lifecycle channel not reloaded, the one in use stays: %s", exc)
            return False
        self._retired.append(self.channel)
        self.channel = fresh
        log.info("lifecycle channel re-opened with reloaded TLS files")
        return True

    async def close(self) -> None:
        for channel in (*self._retired, self.channel):
            await channel.close()


class GateChannels:
    """Channels to external gates by address, re-opened when the TLS files change."""

    def __init__(self, settings: OutboundSecurity) -> None:
        self._settings = settings
        self._tls = ClientTlsFiles(settings.gate_ca, settings.lifecycle_tls.cert, settings.lifecycle_tls.key)
        self._signature = file_signature(self._tls.paths)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._credentials = None if settings.gates_insecure else self._tls.load()

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(address, interceptors=[ClientSpans()])
            else:
                channel = grpc.aio.secure_channel(address, self._credentials, interceptors=[ClientSpans()])
            self._channels[address] = channel
        return channel

    async def reload_if_changed(self, force: bool = False) -> bool:
        signature = file_signature(self._tls.paths)
        if self._settings.gates_insecure or (not force and signature == self._signature):
            return False
        self._signature = signature
        try:
            self._credentials = self._tls.load()
        except TlsError as exc:
            log.error("gate TLS files not reloaded, the ones in use stay: %s", exc)
            return False
        await self.close()  # new channels open on the next gate call
        return True

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
