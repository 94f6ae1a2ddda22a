"""The request-id rule of brief §2: a pure decision, and the sweep that forgets
ids after their retention."""

from __future__ import annotations

import asyncio
import enum
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from funnel.runtime.clock import Clock

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


def sweeper(sweep: Callable[[int, int], Awaitable[int]], clock: Clock, retention_seconds: float):
    """The background loop that forgets request ids after the retention; it runs
    often enough that ids outlive the retention by at most a tenth of it."""
    interval = max(1.0, min(retention_seconds / 10, 600.0))
    return lambda: sweep_forever(sweep, clock, retention_seconds, interval)
