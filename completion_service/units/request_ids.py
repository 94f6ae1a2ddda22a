"""The request-id rule of funnel.runtime.idempotency as the completion units use it:
a replay, this service's REQUEST_ID_REUSED rejection, or None for a new request."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from completion_service.errors import Reason
from completion_service.storage.port import CompletionReadTx
from funnel.runtime.errors import Rejection
from funnel.runtime.idempotency import Replay, RequestIdReads, RequestIds, RequestKey, Reused, recall, remember

T = TypeVar("T")


def recalled(requests: RequestIdReads, key: RequestKey | None) -> Replay | Rejection | None:
    """What a request id stands for inside a write transaction."""
    seen = recall(requests, key)
    if isinstance(seen, Reused):
        return seen.rejection(Reason.REQUEST_ID_REUSED)
    return seen


def peek(tx: CompletionReadTx, key: RequestKey | None) -> Replay | Rejection | None:
    """The same, read without the write lock: a shell checks it before calling
    another service for a request that may be a replay."""
    return recalled(tx.requests, key)


def answer(requests: RequestIds, key: RequestKey | None, render: Callable[[T], bytes] | None, value: T, now: int) -> T:
    """Remembers the rendered response of a new request (nothing without a key or
    a renderer) and returns `value`."""
    if key is not None and render is not None:
        remember(requests, key, render(value), now)
    return value
