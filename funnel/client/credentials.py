"""What a client presents: the CA it trusts, its optional client certificate,
and where its bearer token comes from; read from files, or from the `tls/`
folder of `funnel up`'s data directory."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from funnel.auth.pki import LocalPki

TokenSource = Callable[[], str]
"""Called before every call; returns the bearer token to send (without `Bearer `)."""

# A minted token is replaced once less than this share of its lifetime is left,
# so that a call never leaves with a token about to expire on the way.
_RENEW_AT_REMAINING = 0.2


@dataclass(frozen=True)
class Tls:
    """PEM bytes: `ca` verifies the services' certificates (None: the system's
    trusted roots); `cert` and `key` (both or neither) are the client
    certificate the lifecycle service asks for. `server_name` overrides the name checked in a service's certificate
    (an address that is not one of its names, e.g. through a tunnel)."""

    ca: bytes | None
    cert: bytes | None = None
    key: bytes | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("a client certificate needs both cert and key")

    @classmethod
    def from_files(
        cls,
        ca: str | Path,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        *,
        server_name: str | None = None,
    ) -> Tls:
        """Reads the PEM files. Raises OSError for a file it cannot read."""
        return cls(
            Path(ca).read_bytes(),
            Path(cert).read_bytes() if cert is not None else None,
            Path(key).read_bytes() if key is not None else None,
            server_name,
        )

    @classmethod
    def from_data_dir(cls, data_dir: str | Path) -> Tls:
        """The local CA and client certificate that `funnel up` created in
        `<data_dir>/tls`. Raises OSError when they are not there."""
        pki = LocalPki(Path(data_dir) / "tls")
        return cls.from_files(pki.ca, pki.cert("client"), pki.key("client"))


def token_file(path: str | Path) -> TokenSource:
    """A token read from `path` at each call (surrounding whitespace dropped), so
    that a token rotated in the file is picked up without a restart."""
    return lambda: Path(path).read_text(encoding="utf-8").strip()


def local_tokens(data_dir: str | Path, subject: str, permissions: Sequence[str], ttl: float = 3600.0) -> TokenSource:
    """Tokens for `subject` with `permissions` (e.g. `["acme:host"]`), signed by
    the local key of `funnel up` in `<data_dir>/tls`, each valid for `ttl`
    seconds and replaced before it runs out. Only services started by that
    `funnel up` accept them: local use, not a deployment's identity provider.
    Raises (now) OSError when the data directory holds no signing key, and
    `funnel.auth.tokens.SigningKeyError` when the key is unusable."""
    key = LocalPki(Path(data_dir) / "tls").load_signing_key()
    lock = threading.Lock()
    current: tuple[str, float] | None = None

    def token() -> str:
        nonlocal current
        with lock:
            if current is None or time.time() >= current[1]:
                current = (key.issue(subject, list(permissions), ttl), time.time() + ttl * (1 - _RENEW_AT_REMAINING))
            return current[0]

    return token
