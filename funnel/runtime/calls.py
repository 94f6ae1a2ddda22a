"""What the server boundary learned about the call being served: who calls, in
which role, and by when the database must have been reached. Set once per RPC
by `funnel.runtime.boundary` (each RPC runs in its own asyncio task, so the
values never leak between calls); read by the services' shells and by the
SQLite writer. Background work runs outside any call and sees none."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

from funnel.auth.principal import Caller, Principal, Role


@dataclass(frozen=True)
class Call:
    principal: Principal
    # The role the call was admitted under (the caller's most privileged one
    # that the authorization table permits for this RPC in this workspace).
    role: Role
    # The caller acts as an agent: it may only touch runs (leases) it holds.
    holder_only: bool
    # The RPC's short name, e.g. `AttemptCompletion`.
    method: str

    @property
    def caller(self) -> Caller:
        return Caller(self.principal.subject, self.role.value)


_call: contextvars.ContextVar[Call | None] = contextvars.ContextVar("funnel_call", default=None)
# Event-loop time after which the call's writes must not wait for the database lock.
_lock_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("funnel_lock_deadline", default=None)


def current() -> Call | None:
    return _call.get()


def served() -> Call:
    """The call being served, for the services' RPC handlers (which run only
    behind the boundary, so there always is one)."""
    call = _call.get()
    if call is None:
        raise RuntimeError("no call is being served: only the server boundary starts RPC handlers")
    return call


def enter(call: Call, lock_deadline: float | None) -> None:
    _call.set(call)
    _lock_deadline.set(lock_deadline)


def lock_deadline() -> float | None:
    return _lock_deadline.get()


@contextlib.contextmanager
def past_the_deadline() -> Iterator[None]:
    """Writes in this block wait for the database lock as background work does:
    for cleanup the call owes even once its deadline has passed."""
    token = _lock_deadline.set(None)
    try:
        yield
    finally:
        _lock_deadline.reset(token)
