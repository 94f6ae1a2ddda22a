"""The request-id rule of brief §2, as a pure decision."""

from __future__ import annotations

import enum
import hashlib


class RequestIdVerdict(enum.Enum):
    NEW = "new"
    REPLAY = "replay"
    REUSED = "reused"


def fingerprint(method: str, request_bytes: bytes) -> bytes:
    """Identifies a request: the RPC name and its deterministic serialization."""
    return hashlib.sha256(method.encode() + b"\0" + request_bytes).digest()


def judge_request_id(stored_fingerprint: bytes | None, fingerprint: bytes) -> RequestIdVerdict:
    if stored_fingerprint is None:
        return RequestIdVerdict.NEW
    return RequestIdVerdict.REPLAY if stored_fingerprint == fingerprint else RequestIdVerdict.REUSED
