"""Bearer tokens: JWTs verified against a JWKS file, and issued for local use.

Verification is PyJWT's (signature, `aud`, `iss`); only EdDSA and ES256 are
accepted. The times (`exp`, `nbf`, `iat`) are checked here: finite numbers of
the years 1970 to 9999, `exp` and `nbf` against the clock with a small leeway.
A verified token is cached by its text until the key set changes, so a client
that reuses its token pays the signature check once, not on every call; a cached
token's times are checked on every call exactly as a fresh verification checks
them, so the cache never accepts what verification would refuse.
"""

from __future__ import annotations

import enum
import json
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from funnel.auth.principal import Principal, parse_permissions, subject_problem, with_completion_service

ALGORITHMS = ("EdDSA", "ES256")
LEEWAY_SECONDS = 30
DEFAULT_ISSUER = "funnel"
DEFAULT_AUDIENCE = "funnel"
_CACHE_LIMIT = 10_000
# The times a token may name: from 1970-01-01 to 9999-12-31T23:59:59Z. Outside
# that a number is a forgery or a bug (1e300, or NaN, which compares false with
# every time), never a real validity period.
_LAST_SECOND = 253_402_300_799
_TIME_CLAIMS = ("exp", "nbf", "iat")


class Problem(enum.Enum):
    """Why a credential was refused; the names are catalogue reasons."""

    MISSING = "CREDENTIALS_MISSING"
    INVALID = "CREDENTIALS_INVALID"
    EXPIRED = "CREDENTIALS_EXPIRED"


class Unauthenticated(Exception):
    def __init__(self, problem: Problem, message: str) -> None:
        super().__init__(message)
        self.problem = problem
        self.message = message


class KeySetError(Exception):
    """The JWKS file cannot be used."""


def load_key_set(path: str | Path) -> jwt.PyJWKSet:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        keys = jwt.PyJWKSet.from_dict(data)
    except (OSError, ValueError, jwt.PyJWKSetError, jwt.PyJWKError) as exc:
        raise KeySetError(f"cannot use JWKS file {str(path)!r}: {exc}") from None
    unusable = [k.key_id or "(no kid)" for k in keys.keys if k.algorithm_name not in ALGORITHMS]
    if unusable:
        raise KeySetError(f"JWKS file {str(path)!r} has keys for other algorithms than {ALGORITHMS}: {unusable}")
    return keys


@dataclass(frozen=True)
class _Times:
    expires_at: float
    not_before: float | None


@dataclass(frozen=True)
class _Verified:
    principal: Principal
    times: _Times


def _times(claims: dict[str, Any]) -> _Times:
    """The token's validity period, or raises Unauthenticated (INVALID) for a time
    claim that is not a finite number of the years 1970..9999 (booleans are not
    numbers here, though Python counts them as ints)."""
    for name in _TIME_CLAIMS:
        if name not in claims:
            continue
        value = claims[name]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise Unauthenticated(Problem.INVALID, f"the token's `{name}` is not a number")
        # NaN compares false with everything, infinities lie outside: both refused.
        if not 0 <= value <= _LAST_SECOND:
            raise Unauthenticated(Problem.INVALID, f"the token's `{name}` is not a time of the years 1970 to 9999")
    return _Times(float(claims["exp"]), float(claims["nbf"]) if "nbf" in claims else None)


def _check_times(times: _Times, now: float) -> None:
    """Raises Unauthenticated if the token is expired or not valid yet at `now`."""
    if now >= times.expires_at + LEEWAY_SECONDS:
        raise Unauthenticated(Problem.EXPIRED, "the token has expired")
    if times.not_before is not None and now < times.not_before - LEEWAY_SECONDS:
        raise Unauthenticated(Problem.INVALID, "the token is not valid yet (nbf)")


class TokenVerifier:
    """Turns a bearer token into a `Principal`, or raises `Unauthenticated`."""

    def __init__(
        self,
        keys: jwt.PyJWKSet,
        issuer: str,
        audience: str,
        is_workspace_id: Callable[[str], bool],
        service_subject: str | None = None,
        service_by_token: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._keys = keys
        self._issuer = issuer
        self._audience = audience
        self._is_workspace_id = is_workspace_id
        # The completion service's identity. A token with this `sub` acts as the
        # completion service where `service_by_token` (no client certificates are
        # verified), or together with a client certificate proving it.
        self._service_subject = service_subject
        self._service_by_token = service_by_token
        self._clock = clock
        self._cache: dict[str, _Verified] = {}

    def replace_keys(self, keys: jwt.PyJWKSet) -> None:
        self._keys = keys
        self._cache.clear()

    def verify(self, token: str, certified: str | None = None) -> Principal:
        """`certified`: the identity a verified client certificate proves, if any."""
        principal = self._verified(token)
        if certified is not None and principal.subject != certified:
            raise Unauthenticated(
                Problem.INVALID, f"the token's subject {principal.subject!r} is not the client certificate's identity"
            )
        is_service = principal.subject == self._service_subject
        if is_service and (self._service_by_token or certified is not None):
            return Principal(principal.subject, with_completion_service(principal.grants))
        return principal

    def _verified(self, token: str) -> Principal:
        now = self._clock()
        cached = self._cache.get(token)
        if cached is not None:
            try:
                _check_times(cached.times, now)
            except Unauthenticated:
                del self._cache[token]  # from now on a fresh verification answers it
                raise
            return cached.principal
        claims = self._decode(token)
        times = _times(claims)
        _check_times(times, now)
        subject = claims["sub"]
        if not isinstance(subject, str):
            raise Unauthenticated(Problem.INVALID, "the token's `sub` claim is not a string")
        problem = subject_problem(subject)
        if problem is not None:
            raise Unauthenticated(Problem.INVALID, f"the token's `sub` claim {problem}")
        permissions = claims.get("permissions", [])
        if not isinstance(permissions, list):
            raise Unauthenticated(Problem.INVALID, "the token's `permissions` claim is not a list")
        principal = Principal(subject, parse_permissions(permissions, self._is_workspace_id))
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[token] = _Verified(principal, times)
        return principal

    def _decode(self, token: str) -> dict[str, Any]:
        """PyJWT checks the signature, audience and issuer; the times are checked
        by the caller against the injected clock (PyJWT would read the system's)."""
        try:
            header = jwt.get_unverified_header(token)
            key = self._key_for(header.get("kid"))
            claims = jwt.decode(
                token,
                key=key.key,
                algorithms=[key.algorithm_name],
                audience=self._audience,
                issuer=self._issuer,
                options={
                    "require": ["exp", "sub", "iss", "aud"],
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                },
            )
        except jwt.InvalidAudienceError:
            raise Unauthenticated(Problem.INVALID, f"the token is not for audience {self._audience!r}") from None
        except jwt.InvalidIssuerError:
            raise Unauthenticated(Problem.INVALID, f"the token was not issued by {self._issuer!r}") from None
        except jwt.InvalidSignatureError:
            raise Unauthenticated(Problem.INVALID, "the token's signature does not verify") from None
        except jwt.MissingRequiredClaimError as exc:
            raise Unauthenticated(Problem.INVALID, f"the token has no {exc.claim!r} claim") from None
        except jwt.InvalidTokenError as exc:
            raise Unauthenticated(Problem.INVALID, f"the token is malformed: {exc}") from None
        return claims

    def _key_for(self, kid: object) -> jwt.PyJWK:
        keys = self._keys.keys
        if kid is None:
            if len(keys) == 1:
                return keys[0]
            raise Unauthenticated(Problem.INVALID, "the token names no key (`kid`) and the key set has several")
        for key in keys:
            if key.key_id == kid:
                return key
        raise Unauthenticated(Problem.INVALID, f"the token's key {kid!r} is not in the key set")


def bearer_token(metadata: Iterable[tuple[str, str | bytes]]) -> str:
    """The token of an `authorization: Bearer …` header, or raises Unauthenticated."""
    for key, value in metadata:
        if key == "authorization":
            text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
            scheme, _, token = text.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated(Problem.INVALID, "the authorization header is not `Bearer <token>`")
            return token.strip()
    raise Unauthenticated(
        Problem.MISSING, "no credential: send `authorization: Bearer <token>` (see `funnel token issue`)"
    )


# -- issuing ---------------------------------------------------------------


class SigningKeyError(Exception):
    pass


@dataclass(frozen=True)
class SigningKey:
    """A private key that signs tokens, with the key id its JWKS entry carries."""

    private_key: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey
    key_id: str

    @property
    def algorithm(self) -> str:
        return "EdDSA" if isinstance(self.private_key, ed25519.Ed25519PrivateKey) else "ES256"

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(ed25519.Ed25519PrivateKey.generate(), uuid.uuid4().hex[:16])

    @classmethod
    def load(cls, path: str | Path, key_id: str) -> SigningKey:
        try:
            key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise SigningKeyError(f"cannot read signing key {str(path)!r}: {exc}") from None
        if not isinstance(key, (ed25519.Ed25519PrivateKey, ec.EllipticCurvePrivateKey)):
            raise SigningKeyError(f"signing key {str(path)!r} is neither Ed25519 nor EC P-256")
        return cls(key, key_id)

    def private_pem(self) -> bytes:
        return self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def jwks(self) -> dict[str, Any]:
        """The public half as a JWKS document."""
        algorithm = jwt.get_algorithm_by_name(self.algorithm)
        jwk = json.loads(algorithm.to_jwk(self.private_key.public_key()))
        jwk.update({"kid": self.key_id, "alg": self.algorithm, "use": "sig"})
        return {"keys": [jwk]}

    def issue(
        self,
        subject: str,
        permissions: list[str],
        ttl_seconds: float,
        issuer: str = DEFAULT_ISSUER,
        audience: str = DEFAULT_AUDIENCE,
        now: float | None = None,
    ) -> str:
        issued = int(time.time() if now is None else now)
        claims = {
            "iss": issuer,
            "aud": audience,
            "sub": subject,
            "iat": issued,
            "nbf": issued,
            "exp": issued + int(ttl_seconds),
            "permissions": permissions,
        }
        return jwt.encode(claims, self.private_key, algorithm=self.algorithm, headers={"kid": self.key_id})
