"""The request-id rule of docs/specification.md §2.3, once for both services: a pure decision, the
unit-of-work helpers over a tiny storage protocol, and the sweep that forgets ids
after their retention.

Use inside a write transaction (each service's `tx.requests` is a `RequestIds`):

    seen = recall(tx.requests, key)          # None (new), Replay(response) or Reused(request_id)
    ...decide and write...
    remember(tx.requests, key, response_bytes, now)

`Reused` is turned into the service's own REQUEST_ID_REUSED rejection with
`seen.rejection(Reason.REQUEST_ID_REUSED)`. Responses are stored as bytes only:
a serialized response, deflated when that makes it smaller (see `stored_response`).
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import logging
import zlib
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from funnel.runtime.clock import Clock
from funnel.runtime.errors import Rejection, reject

log = logging.getLogger(__name__)
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600
SWEEP_BATCH = 1000


@dataclass(frozen=True)
class RequestKey:
    """A request id in its scope (workspace, authenticated caller, RPC), with the
    fingerprint of the request it was first used for."""

    workspace_id: str
    caller: str
    method: str
    request_id: str
    fingerprint: bytes


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


class RequestIdReads(Protocol):
    """What a transaction offers the rule: remembered request ids, scoped by
    (workspace, caller, method, request id)."""

    def recall(self, workspace_id: str, caller: str, method: str, request_id: str) -> tuple[bytes, bytes] | None:
        """The remembered (fingerprint, response), or None."""
        ...


class RequestIds(RequestIdReads, Protocol):
    """The same in a write transaction (each service's `tx.requests`)."""

    def remember(self, key: RequestKey, response: bytes, created_at: int) -> None:
        """Remembers `key` (with its fingerprint) and the response a repeat must get."""
        ...

    def forget(self, created_before: int, limit: int) -> int:
        """Forgets up to `limit` request ids remembered before `created_before`; returns how many."""
        ...


@dataclass(frozen=True)
class Replay:
    """The id was seen with an identical request: return its original response."""

    response: bytes


@dataclass(frozen=True)
class Reused:
    """The id was seen with a different request."""

    request_id: str

    def rejection(self, reason: enum.Enum) -> Rejection:
        """The refusal, with the service's own REQUEST_ID_REUSED catalogue member."""
        return reject(
            reason,
            f"request_id {self.request_id!r} was already used for a different request",
            request_id=self.request_id,
        )


def recall(requests: RequestIdReads, key: RequestKey | None) -> Replay | Reused | None:
    """Judges `key` against what `requests` remembers: None for a new request (or no key)."""
    if key is None:
        return None
    stored = requests.recall(key.workspace_id, key.caller, key.method, key.request_id)
    verdict = judge_request_id(stored[0] if stored else None, key.fingerprint)
    if verdict is RequestIdVerdict.REPLAY:
        assert stored is not None
        return Replay(response_of(bytes(stored[1])))
    if verdict is RequestIdVerdict.REUSED:
        return Reused(key.request_id)
    return None


def remember(requests: RequestIds, key: RequestKey | None, response: bytes, created_at: int) -> None:
    """Remembers the response of a new request (a no-op without a key)."""
    if key is not None:
        requests.remember(key, stored_response(response), created_at)


# Marks a deflated response. A serialized protobuf message never starts with a
# zero byte (field number 0 is invalid), so a stored value that does is ours.
_DEFLATED = b"\x00"
# Below this, deflating saves too little to be worth the CPU.
_DEFLATE_FROM = 256


def stored_response(response: bytes) -> bytes:
    """The stored form: a response that embeds a decision or a task record is
    mostly repeated text, and request ids stay for the whole retention (issue 13)."""
    marked = response[:1] == _DEFLATED  # not a protobuf message; stored deflated so it reads back
    if len(response) < _DEFLATE_FROM and not marked:
        return response
    packed = _DEFLATED + zlib.compress(response, 6)
    return packed if marked or len(packed) < len(response) else response


def response_of(stored: bytes) -> bytes:
    """The response as first answered, from its stored form."""
    return zlib.decompress(stored[1:]) if stored[:1] == _DEFLATED else stored


async def sweep_forever(
    sweep: Callable[[int, int], Awaitable[int]], clock: Clock, retention_seconds: float, interval: float
) -> None:
    """Forgets request ids older than the retention, in batches (a background loop).
    A retry after the retention is applied as a new request."""
    while True:
        try:
            cutoff = clock.now_micros() - int(retention_seconds * 1_000_000)
            swept = batch = await sweep(cutoff, SWEEP_BATCH)
            while batch == SWEEP_BATCH:
                batch = await sweep(cutoff, SWEEP_BATCH)
                swept += batch
            if swept:
                log.info("forgot %d request ids older than %.0f s", swept, retention_seconds)
        except Exception:  # the sweeper must survive any single failure
            log.exception("request id sweep failed; retrying later")
        await asyncio.sleep(interval)


def sweeper(
    sweep: Callable[[int, int], Awaitable[int]], clock: Clock, retention_seconds: float
) -> Callable[[], Coroutine[Any, Any, None]]:
    """The background loop that forgets request ids after the retention; it runs
    often enough that ids outlive the retention by at most a tenth of it."""
    interval = max(1.0, min(retention_seconds / 10, 600.0))
    return lambda: sweep_forever(sweep, clock, retention_seconds, interval)
