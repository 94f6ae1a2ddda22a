"""Reads made together under one owner (issue 28): asyncio.gather leaves the
other calls running, unowned, when one fails; here a TaskGroup cancels and
awaits them first. Cancelling the caller (a browser gone, the server stopping)
cancels and awaits every call it holds."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar, overload

from funnel.client import FunnelError

A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")


@overload
async def together(a: Coroutine[Any, Any, A], b: Coroutine[Any, Any, B], /) -> tuple[A, B]: ...
@overload
async def together(
    a: Coroutine[Any, Any, A], b: Coroutine[Any, Any, B], c: Coroutine[Any, Any, C], /
) -> tuple[A, B, C]: ...
@overload
async def together(*calls: Coroutine[Any, Any, A]) -> tuple[A, ...]: ...
async def together(*calls: Coroutine[Any, Any, Any]) -> tuple[Any, ...]:
    """The calls' results, in order. A failed call's FunnelError is raised as it
    is (the first, when several failed at once), as gather raised it: the pages
    show it; anything else stays in its ExceptionGroup."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(call) for call in calls]
    except* FunnelError as failed:
        raise failed.exceptions[0] from None
    return tuple(task.result() for task in tasks)
