"""Keeps the leases of open runs alive while their holders live, so that an agent
never renews one itself, and a run whose holder went away frees its task at once.

The holder of a run is what claimed it (or, after a restart of this server, the
first call that touched it while its lease was live):
- `PROCESS` over stdio: it ends when the host closes the pipe (stdin EOF);
- a Streamable HTTP session (`Mcp-Session-Id`): it ends when the SDK ends the
  session, i.e. when the client deletes it, when it goes `--session-idle-timeout`
  without a request in flight (an open GET stream is one), or when it crashes;
- `SESSIONLESS` over HTTP (the 2026-07-28 protocol, where no connection outlives
  a request): it ends when no call has named the run for the idle timeout.
When a holder ends, its runs stop being renewed and are withdrawn (closed
`stalled`, see `Withdraw`). A run also stops being renewed, without a withdrawal,
when it closes, when its lease is lost (superseded, expired, run finished) or
when the server stops.

One task per held run, all owned by one task group that the MCP server's
lifespan opens and closes: nothing outlives the server. Withdrawals under way
when it stops get WITHDRAW_GRACE seconds to finish."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType

from funnel.client import FunnelError
from funnel_mcp.failures import RETRYABLE

log = logging.getLogger("funnel.mcp.leases")

# A failed renewal is tried again this soon (seconds), while the lease lasts.
RETRY_DELAY = 1.0
# Seconds the withdrawals under way when the server stops may still take.
WITHDRAW_GRACE = 5.0

PROCESS = "process"
SESSIONLESS = "sessionless"


@dataclass(frozen=True)
class HeldRun:
    workspace: str
    run_id: str
    epoch: int
    # The credential the run was claimed with (Streamable HTTP: the caller's own).
    token: str


# Renews the run's lease; raises FunnelError when the services refuse or do not answer.
Renew = Callable[[HeldRun], Awaitable[None]]
# Ends a run whose holder is gone (`why` says how), through the services.
Withdraw = Callable[[HeldRun, str], Awaitable[None]]


@dataclass
class _Hold:
    run: HeldRun
    holder: str
    # SESSIONLESS: the loop time from which the run counts as abandoned.
    idle_until: float | None
    # Why the holder is gone; set, the run is withdrawn instead of renewed.
    gone: str | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class LeaseKeeper:
    def __init__(self, renew: Renew, withdraw: Withdraw, ttl: float, idle_timeout: float) -> None:
        self._renew = renew
        self._withdraw = withdraw
        self.ttl = ttl
        self.idle_timeout = idle_timeout
        self._group: asyncio.TaskGroup | None = None
        self._holds: dict[str, _Hold] = {}

    async def __aenter__(self) -> LeaseKeeper:
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        group, self._group = self._group, None  # no hold() after this
        assert group is not None
        withdrawing = []
        for hold in list(self._holds.values()):
            assert hold.task is not None
            if hold.gone is None:
                hold.task.cancel()
            else:
                withdrawing.append(hold.task)
        if withdrawing:
            await asyncio.wait(withdrawing, timeout=WITHDRAW_GRACE)
            for task in withdrawing:
                task.cancel()
        await group.__aexit__(exc_type, exc, traceback)
        self._holds.clear()  # a task cancelled before it ran never removed its hold

    def held(self) -> set[str]:
        return set(self._holds)

    def hold(self, run: HeldRun, holder: str) -> None:
        """Start renewing `run` for `holder`. A run renewed already keeps its
        holder; a SESSIONLESS one counts this as a call naming it."""
        loop = asyncio.get_running_loop()
        held = self._holds.get(run.run_id)
        if held is not None:
            if held.idle_until is not None:
                held.idle_until = loop.time() + self.idle_timeout
            return
        if self._group is None:
            return
        idle_until = loop.time() + self.idle_timeout if holder == SESSIONLESS else None
        hold = _Hold(run, holder, idle_until)
        hold.task = self._group.create_task(self._keep(hold), name=f"lease {run.run_id}")
        self._holds[run.run_id] = hold

    def end(self, holder: str, why: str) -> None:
        """`holder` is gone: its runs are withdrawn."""
        for hold in self._holds.values():
            if hold.holder == holder and hold.gone is None:
                hold.gone = why
                hold.wake.set()

    def release(self, run_id: str) -> None:
        """The run closed: stop renewing it."""
        hold = self._holds.pop(run_id, None)
        if hold is not None and hold.task is not None:
            hold.task.cancel()

    async def _keep(self, hold: _Hold) -> None:
        run = hold.run
        loop = asyncio.get_running_loop()
        renew_at = loop.time() + self.ttl / 3
        try:
            while hold.gone is None:
                now = loop.time()
                if hold.idle_until is not None and now >= hold.idle_until:
                    hold.gone = f"no call named the run for {self.idle_timeout:g} s"
                    break
                if now < renew_at:
                    wake_at = renew_at if hold.idle_until is None else min(renew_at, hold.idle_until)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wake_at - now):
                            await hold.wake.wait()
                    continue
                try:
                    await self._renew(run)
                    renew_at = loop.time() + self.ttl / 3
                except FunnelError as error:
                    if error.code not in RETRYABLE:
                        log.info("stopped renewing run %s: %s %s", run.run_id, error.code.name, error.message)
                        return
                    renew_at = loop.time() + RETRY_DELAY
            log.info("withdrawing run %s: %s", run.run_id, hold.gone)
            await self._withdraw(run, hold.gone)
        except asyncio.CancelledError:
            raise
        except Exception:
            # One run's renewal must never take the server's other runs down with it.
            log.exception("stopped renewing run %s", run.run_id)
        finally:
            if self._holds.get(run.run_id) is hold:
                del self._holds[run.run_id]
