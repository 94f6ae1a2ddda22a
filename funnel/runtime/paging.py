"""Opaque page tokens bound to the listing that issued them, and a client's walk
through every page of a List call."""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from google.protobuf.message import Message

# A page token's cursor: a str or int key, or a list of them.
C = TypeVar("C")

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
# The servers' default `max_message_bytes` (funnel/runtime/server.py).
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def encode_token(listing: list[str], cursor: str | int | list[Any]) -> str:
    raw = json.dumps([listing, cursor], separators=(",", ":"), ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str, listing: list[str], cursor_type: type[C]) -> C | None:
    """The cursor in `token`, or None when the token is malformed or was issued for another listing."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        issued_for, cursor = json.loads(raw)
    except (ValueError, TypeError, RecursionError):  # RecursionError: a forged token nesting arrays deeply
        return None
    if issued_for != listing or type(cursor) is not cursor_type or not _fits_int64(cursor):
        return None
    return cursor


def _fits_int64(value: object) -> bool:
    """A forged token may carry integers the database cannot bind (OverflowError,
    which would surface as INTERNAL); such a token is malformed, not a fault."""
    if isinstance(value, list):
        return all(_fits_int64(item) for item in value)
    return not isinstance(value, int) or -(2**63) <= value < 2**63


def page_size(requested: int) -> int:
    return requested or DEFAULT_PAGE_SIZE


def response_budget(max_message_bytes: int) -> int:
    """Bytes of items one response may carry: the rest of the message limit is
    left for the envelope (tokens, versions)."""
    return max(max_message_bytes - 64 * 1024, max_message_bytes // 2)


def fitting(messages: Sequence[Message], budget: int) -> int:
    """How many leading `messages` fit in `budget` serialized bytes (at least one).
    A page of `page_size` large items (events with long causes, runs with long
    errors, transcript events of up to 1 MiB) can exceed the message limit, which
    gRPC would answer with a bare RESOURCE_EXHAUSTED and no way to read past it:
    such a page ends early and its `next_page_token` continues it."""
    total = 0
    for count, message in enumerate(messages):
        total += message.ByteSize() + 6  # field tag and length prefix
        if total > budget and count > 0:
            return count
    return len(messages)


async def every_page(fetch: Callable[[str], Awaitable[Any]], items: str, limit: int | None = None) -> list[Any]:
    """Every item of a paged List call (up to `limit`): `fetch(page_token)` returns
    one page, whose `items` field holds its items."""
    found: list[Any] = []
    token = ""
    while True:
        page = await fetch(token)
        found += list(getattr(page, items))
        token = page.next_page_token
        if not token or (limit is not None and len(found) >= limit):
            return found[:limit] if limit is not None else found
