"""TLS material for listeners and outbound channels, reloadable without a restart.

A listener's credentials are gRPC's dynamic SSL credentials: gRPC asks for the
current certificate on every new handshake, so a reload (SIGHUP or a changed
file, see `funnel.runtime.reload`) takes effect for new connections while the
open ones keep serving. Files are read and checked (certificate and key match)
before they replace the ones in use; a bad replacement is refused and logged.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

log = logging.getLogger(__name__)


class TlsError(Exception):
    """TLS files that cannot be used."""


def is_loopback(listen: str) -> bool:
    """Whether `host:port` names only this machine (127.0.0.0/8, ::1, localhost)."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read {what} {path!r}: {exc.strerror or exc}") from None


def _check_pair(cert_pem: bytes, key_pem: bytes, cert_path: str, key_path: str) -> None:
    try:
        certificate = x509.load_pem_x509_certificates(cert_pem)[0]
    except ValueError as exc:
        raise TlsError(f"{cert_path!r} is not a PEM certificate: {exc}") from None
    now = datetime.datetime.now(datetime.UTC)
    if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
        raise TlsError(
            f"the certificate {cert_path!r} is valid from {certificate.not_valid_before_utc:%Y-%m-%d %H:%M} to "
            f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, not now"
        )
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise TlsError(f"{key_path!r} is not an unencrypted PEM private key: {exc}") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if certificate.public_key().public_bytes(serialization.Encoding.PEM, public) != key.public_key().public_bytes(
        serialization.Encoding.PEM, public
    ):
        raise TlsError(f"the key {key_path!r} does not belong to the certificate {cert_path!r}")


def _check_bundle(pem: bytes, path: str) -> None:
    try:
        if not x509.load_pem_x509_certificates(pem):
            raise ValueError("no certificate")
    except ValueError as exc:
        raise TlsError(f"{path!r} is not a PEM certificate bundle: {exc}") from None


def file_signature(paths: list[str]) -> tuple[tuple[object, ...], ...]:
    """Changes when any of the files is replaced or rewritten."""
    signature: list[tuple[object, ...]] = []
    for path in paths:
        try:
            stat = os.stat(path)
            signature.append((path, stat.st_ino, stat.st_size, stat.st_mtime_ns))
        except OSError:
            signature.append((path, None))
    return tuple(signature)


@dataclass(frozen=True)
class ServerTlsFiles:
    cert: str
    key: str
    # With a client CA, every client must present a certificate it signed (mTLS).
    client_ca: str | None = None

    @property
    def paths(self) -> list[str]:
        return [self.cert, self.key] + ([self.client_ca] if self.client_ca else [])


class ServerTls:
    """A listener's certificate, swapped in place on reload."""

    def __init__(self, files: ServerTlsFiles) -> None:
        self.files = files
        # gRPC calls _fetch on its own threads; the lock makes the hand-over atomic.
        self._lock = threading.Lock()
        self._pending: grpc.ServerCertificateConfiguration | None = None
        self._initial = self._load()
        self.signature = file_signature(files.paths)

    def _load(self) -> grpc.ServerCertificateConfiguration:
        cert = _read(self.files.cert, "certificate")
        key = _read(self.files.key, "private key")
        _check_pair(cert, key, self.files.cert, self.files.key)
        root = None
        if self.files.client_ca:
            root = _read(self.files.client_ca, "client CA bundle")
            _check_bundle(root, self.files.client_ca)
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=root)

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._initial,
            # gRPC documents None from the fetcher as "no change"; types-grpcio's
            # Callable[[], ServerCertificateConfiguration] leaves that out.
            self._fetch,  # type: ignore[arg-type]
            require_client_authentication=self.files.client_ca is not None,
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC on each handshake: hand over a reloaded configuration once.
        with self._lock:
            pending, self._pending = self._pending, None
        return pending

    async def reload_if_changed(self, force: bool = False) -> bool:
        signature = file_signature(self.files.paths)
        if not force and signature == self.signature:
            return False
        self.signature = signature
        try:
            loaded = self._load()
        except TlsError as exc:
            log.error("TLS files not reloaded, the ones in use stay: %s", exc)
            return False
        with self._lock:
            self._pending = loaded
        log.info("TLS certificate reloaded from %s", self.files.cert)
        return True


@dataclass(frozen=True)
class ClientTlsFiles:
    """What an outbound channel trusts and presents."""

    # CA bundle that signed the server; None: the system's roots.
    ca: str | None = None
    # A client certificate (the caller's identity for mTLS), or none.
    cert: str | None = None
    key: str | None = None
    # The name to verify in the server's certificate when it differs from the
    # host part of the address (for example when dialling an IP address).
    server_name: str | None = None

    @property
    def paths(self) -> list[str]:
        return [p for p in (self.ca, self.cert, self.key) if p]

    def load(self) -> grpc.ChannelCredentials:
        root = None
        if self.ca:
            root = _read(self.ca, "CA bundle")
            _check_bundle(root, self.ca)
        if (self.cert is None) != (self.key is None):
            raise TlsError("a client certificate needs both its certificate and its key file")
        cert = key = None
        if self.cert and self.key:
            cert = _read(self.cert, "client certificate")
            key = _read(self.key, "client key")
            _check_pair(cert, key, self.cert, self.key)
        return grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=cert)

    def options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
