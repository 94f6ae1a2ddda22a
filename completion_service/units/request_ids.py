"""The request-id rule of funnel.runtime.idempotency as the completion units use it:
a replay, this service's REQUEST_ID_REUSED rejection, or None for a new request."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from completion_service.errors import Reason
from completion_service.storage.port import CompletionReadTx
from funnel.runtime.errors import Rejection
from funnel.runtime.idempotency import Replay, RequestKey, RequestMemory, Reused, recall, remember

T = TypeVar("T")


def recalled(tx: RequestMemory, key: RequestKey | None) -> Replay | Rejection | None:
    """What a request id stands for inside a write transaction."""
    seen = recall(tx, key)
    if isinstance(seen, Reused):
        return seen.rejection(Reason.REQUEST_ID_REUSED)
    return seen


def peek(tx: CompletionReadTx, key: RequestKey | None) -> Replay | Rejection | None:
    """The same, read without the write lock: a shell checks it before calling
    another service for a request that may be a replay."""
    return recalled(_ReadOnly(tx), key)


def answer(tx: RequestMemory, key: RequestKey | None, render: Callable[[T], bytes] | None, value: T, now: int) -> T:
    """Remembers the rendered response of a new request (nothing without a key or
    a renderer) and returns `value`."""
    if key is not None and render is not None:
        remember(tx, key, render(value), now)
    return value


class _ReadOnly:
    """A read transaction as the RequestMemory that recall() reads."""

    def __init__(self, tx: CompletionReadTx) -> None:
        self._tx = tx

    def recall_request(
        self, workspace_id: str, caller: str, method: str, request_id: str
    ) -> tuple[bytes, bytes] | None:
        return self._tx.recall_request(workspace_id, caller, method, request_id)

    def remember_request(self, key: RequestKey, response: bytes, created_at: int) -> None:
        raise TypeError("a read transaction remembers nothing")
