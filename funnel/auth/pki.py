"""A local certificate authority and token signing key for `funnel up`: on first
start it creates, under the data directory, everything both services need to run
with TLS between them and bearer tokens for callers. Later starts reuse it;
leaf certificates are renewed when they near their end.

Real deployments bring their own certificates and JWKS (docs/security.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from funnel.auth.tokens import SigningKey

TRUST_DOMAIN = "funnel.local"
COMPLETION_IDENTITY = f"spiffe://{TRUST_DOMAIN}/funnel/completion-service"
LOCAL_CLIENT_IDENTITY = f"spiffe://{TRUST_DOMAIN}/funnel/local-client"
CA_DAYS = 3650
LEAF_DAYS = 397
RENEW_WHEN_DAYS_LEFT = 30


@dataclass(frozen=True)
class LocalPki:
    """Paths of the local trust material (all PEM, keys readable by the owner only)."""

    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def ca(self) -> Path:
        return self.path("ca.pem")

    def cert(self, name: str) -> Path:
        return self.path(f"{name}.pem")

    def key(self, name: str) -> Path:
        return self.path(f"{name}.key")

    @property
    def signing_key(self) -> Path:
        return self.path("token-signing.key")

    @property
    def jwks(self) -> Path:
        return self.path("jwks.json")

    def load_signing_key(self) -> SigningKey:
        key_id = json.loads(self.jwks.read_text(encoding="utf-8"))["keys"][0]["kid"]
        return SigningKey.load(self.signing_key, key_id)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _needs_renewal(path: Path) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return True
    return cert.not_valid_after_utc - _now() < datetime.timedelta(days=RENEW_WHEN_DAYS_LEFT)


def _ca(pki: LocalPki) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    if pki.ca.exists() and pki.key("ca").exists() and not _needs_renewal(pki.ca):
        key = serialization.load_pem_private_key(pki.key("ca").read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{pki.key('ca')} is not an EC private key (this local CA makes only those)")
        return key, x509.load_pem_x509_certificate(pki.ca.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "funnel local CA")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(pki.key("ca"), _key_pem(key), private=True)
    _write(pki.ca, _cert_pem(cert))
    # A new CA invalidates every leaf it did not sign.
    for leaf in pki.directory.glob("*.pem"):
        if leaf != pki.ca:
            leaf.unlink()
    return key, cert


def issue_leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    common_name: str,
    names: list[x509.GeneralName],
    *,
    server: bool,
    client: bool,
    days: int = LEAF_DAYS,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _loopback_names() -> list[x509.GeneralName]:
    return [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]


# name -> (common name, SANs, server use, client use)
_LEAVES: dict[str, tuple[str, Callable[[], list[x509.GeneralName]], bool, bool]] = {
    "lifecycle": ("lifecycle_service", _loopback_names, True, False),
    "completion": ("completion_service", _loopback_names, True, False),
    # For a local external gate (examples/review_gate.py).
    "gate": ("completion gate", _loopback_names, True, False),
    "completion-identity": (
        "completion_service",
        lambda: [x509.UniformResourceIdentifier(COMPLETION_IDENTITY)],
        False,
        True,
    ),
    "client": ("funnel local client", lambda: [x509.UniformResourceIdentifier(LOCAL_CLIENT_IDENTITY)], False, True),
}


def ensure_local_pki(directory: Path) -> LocalPki:
    """Creates (or completes, or renews) the local trust material under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    pki = LocalPki(directory)
    ca_key, ca_cert = _ca(pki)
    for name, (common_name, names, server, client) in _LEAVES.items():
        if pki.cert(name).exists() and pki.key(name).exists() and not _needs_renewal(pki.cert(name)):
            continue
        key, cert = issue_leaf(ca_key, ca_cert, common_name, names(), server=server, client=client)
        _write(pki.key(name), _key_pem(key), private=True)
        _write(pki.cert(name), _cert_pem(cert))
    if not (pki.signing_key.exists() and pki.jwks.exists()):
        signing = SigningKey.generate()
        _write(pki.signing_key, signing.private_pem(), private=True)
        _write(pki.jwks, json.dumps(signing.jwks(), indent=2).encode())
    return pki
