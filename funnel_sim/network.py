"""The simulated network: what gRPC carries between the clients and the two
services, and between the completion service's lifecycle client and the
lifecycle service, with seeded latency, loss, duplication and partitions.

A unary call is a request message and a reply message, each delayed on its own
(so concurrent calls are reordered), each maybe lost; a request may be delivered
twice (a retransmission the server cannot tell apart). The handler is the real
servicer method, run in its own task owned by the serving node (a crash cancels
it, and a reply not yet sent is lost with it), with `funnel.runtime.calls` set as
the server boundary would set it: authentication, authorization and admission
are not simulated (the boundary is bypassed; the caller's identity and lock deadline are
set as it sets them).
Failures become the statuses the boundary would send (`ServiceError`,
`StorageUnavailable`, a dropped reply), so the caller sees what a gRPC client
sees; a call without a reply by its deadline ends DEADLINE_EXCEEDED, and a call
to a node that is down or cut off fails UNAVAILABLE (connection refused).

A server stream (the watch RPCs) delivers its items in order with lag, under a
flow-control window (a slow reader makes the server's buffer overflow, as HTTP/2
flow control does), and may be cut at any moment: the reader sees UNAVAILABLE and
loses what was in flight."""

from __future__ import annotations

import asyncio
import collections
import enum
import functools
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from google.rpc import status_pb2

from funnel.runtime import calls
from funnel.runtime.boundary import lock_deadline
from funnel.runtime.errors import Rejection, ServiceError, storage_unavailable
from funnel.runtime.faults import DroppedReply
from funnel.runtime.grpc_errors import status_error_info, status_message
from funnel.runtime.storage_errors import StorageUnavailable

# google.rpc.Code numbers of the statuses the network itself produces.
CANCELLED = 1
UNAVAILABLE = 14
DEADLINE_EXCEEDED = 4
INTERNAL = 13


@dataclass(frozen=True)
class Ok:
    response: Any


@dataclass(frozen=True)
class Failed:
    """A call that ended with a status: the service's (with its ErrorInfo) or the network's."""

    status: status_pb2.Status

    @property
    def code(self) -> int:
        return self.status.code

    @property
    def reason(self) -> str:
        info = status_error_info(self.status)
        return info.reason if info is not None else ""


Answer = Ok | Failed


def network_failure(code: int, message: str) -> Failed:
    return Failed(status_pb2.Status(code=code, message=message))


def no_answer(answer: Answer) -> bool:
    """Whether the caller cannot know if the call was applied (it must retry)."""
    if isinstance(answer, Ok):
        return False
    return answer.code in (CANCELLED, UNAVAILABLE, DEADLINE_EXCEEDED) or answer.reason == "STORAGE_UNAVAILABLE"


class Server(Protocol):
    """A node as the network sees it: whether it is up, the tasks it owns, how its
    failures are named (its error catalogue and ErrorInfo domain)."""

    name: str
    incarnation: int
    catalogue: Any
    domain: str

    @property
    def up(self) -> bool: ...

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...

    def fault(self, where: str, error: BaseException) -> None:
        """An unexpected exception in a handler (the boundary would log it as INTERNAL)."""
        ...


@dataclass
class LinkFaults:
    """Per message: latency drawn uniformly from `latency` seconds; lost with
    probability `drop`; a request delivered twice with probability `duplicate`."""

    latency: tuple[float, float] = (0.001, 0.02)
    drop: float = 0.0
    duplicate: float = 0.0
    # Mean seconds a watch stream lives before the network cuts it (None: never).
    stream_lifetime: float | None = None


class SimContext:
    """What the servicers ask of a grpc.aio.ServicerContext: the time left."""

    def __init__(self, deadline: float | None) -> None:
        self._deadline = deadline

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return self._deadline - asyncio.get_running_loop().time()


class Network:
    def __init__(self, rng: random.Random, faults: LinkFaults, record: Callable[..., None]) -> None:
        self._rng = rng
        self.faults = faults
        self._record = record
        self._cut: set[frozenset[str]] = set()
        self._streams: list[Stream] = []

    # -- partitions ----------------------------------------------------------------

    def partition(self, a: str, b: str) -> None:
        self._cut.add(frozenset((a, b)))
        for stream in list(self._streams):
            if {stream.source, stream.server.name} == {a, b}:
                stream.cut("the network between them is partitioned")

    def heal(self) -> None:
        self._cut.clear()

    def cut_off(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self._cut

    def _latency(self) -> float:
        low, high = self.faults.latency
        return self._rng.uniform(low, high)

    def _lost(self) -> bool:
        return self.faults.drop > 0 and self._rng.random() < self.faults.drop

    # -- unary calls -------------------------------------------------------------------

    async def call(
        self,
        source: str,
        server: Server,
        method: str,
        handler: Callable[[Any, SimContext], Awaitable[Any]],
        request: Any,
        caller: calls.Call,
        timeout: float,
    ) -> Answer:
        loop = asyncio.get_running_loop()
        invoked = loop.time()
        deadline = invoked + timeout
        if not server.up or self.cut_off(source, server.name):
            await asyncio.sleep(self._latency())
            answer: Answer = network_failure(UNAVAILABLE, f"{server.name} is unreachable (connection refused)")
            self._record("call", source, server.name, method, request, answer, invoked)
            return answer
        reply: asyncio.Future[Answer] = loop.create_future()
        copies = 2 if self.faults.duplicate > 0 and self._rng.random() < self.faults.duplicate else 1
        for _ in range(copies):
            if not self._lost():
                loop.call_later(
                    self._latency(),
                    self._deliver,
                    source,
                    server,
                    server.incarnation,
                    method,
                    handler,
                    request,
                    caller,
                    deadline,
                    reply,
                )
        # The deadline answers the call itself, as the first reply would (later ones find it
        # answered): one timer, where wait_for and shield took three futures, and three turns
        # of the loop from reply to caller instead of one.
        expiry = loop.call_at(deadline, _expire, reply)
        try:
            answer = await reply
        except asyncio.CancelledError:
            # The caller is gone (its process crashed): the call is in the history all the
            # same, since the request may have been applied.
            self._record(
                "call",
                source,
                server.name,
                method,
                request,
                network_failure(CANCELLED, "the caller went away"),
                invoked,
            )
            raise
        finally:
            expiry.cancel()
        self._record("call", source, server.name, method, request, answer, invoked)
        return answer

    def _deliver(
        self,
        source: str,
        server: Server,
        incarnation: int,
        method: str,
        handler: Callable[..., Awaitable[Any]],
        request: Any,
        caller: calls.Call,
        deadline: float,
        reply: asyncio.Future[Answer],
    ) -> None:
        if not server.up or server.incarnation != incarnation or self.cut_off(source, server.name):
            return  # the connection the request travelled on is gone
        server.spawn(self._serve(source, server, method, handler, request, caller, deadline, reply), method)

    async def _serve(
        self,
        source: str,
        server: Server,
        method: str,
        handler: Callable[..., Awaitable[Any]],
        request: Any,
        caller: calls.Call,
        deadline: float,
        reply: asyncio.Future[Answer],
    ) -> None:
        context = SimContext(deadline)
        # As the boundary: writes stop waiting for the database lock a margin before the deadline.
        calls.enter(caller, lock_deadline(context))  # type: ignore[arg-type]
        answer: Answer
        try:
            answer = Ok(await handler(request, context))
        except ServiceError as exc:
            answer = Failed(status_message(exc.rejection, server.domain))
        except StorageUnavailable as exc:
            answer = Failed(status_message(storage_unavailable(server.catalogue, exc), server.domain))
        except DroppedReply as exc:
            answer = network_failure(UNAVAILABLE, f"reply dropped at {exc}")
        except Exception as exc:  # noqa: BLE001 - the boundary's INTERNAL_FAULT, and a finding of the simulation
            server.fault(f"{server.name}.{method}", exc)
            rejection = Rejection(server.catalogue["INTERNAL_FAULT"], "internal fault; see the server log")
            answer = Failed(status_message(rejection, server.domain))
        if self._lost() or self.cut_off(source, server.name):
            return
        asyncio.get_running_loop().call_later(self._latency(), _settle, reply, answer)

    # -- server streams --------------------------------------------------------------------

    def stream(
        self,
        source: str,
        server: Server,
        method: str,
        handler: Callable[[Any, SimContext], AsyncIterator[Any]],
        request: Any,
        caller: calls.Call,
        window: int = 4,
    ) -> Stream:
        stream = Stream(self, source, server, window)
        self._streams.append(stream)
        if not server.up or self.cut_off(source, server.name):
            stream.end(network_failure(UNAVAILABLE, f"{server.name} is unreachable (connection refused)"), 0.0)
            return stream
        lifetime = self.faults.stream_lifetime
        if lifetime is not None:
            asyncio.get_running_loop().call_later(
                self._rng.expovariate(1 / lifetime), stream.cut, "the connection was reset"
            )
        stream.pump = server.spawn(self._pump(stream, handler, request, caller), f"{method}-stream")
        stream.pump.add_done_callback(functools.partial(self._pumped, stream))
        return stream

    def _pumped(self, stream: Stream, pump: asyncio.Task[Any]) -> None:
        """A pump cancelled because its server died resets the reader's connection, at
        whatever point it was: in its first latency, or before its first step, its own
        `except` never ran, and the reader waited on an open stream until a random cut."""
        if pump.cancelled() and not stream.server.up:
            stream.end(network_failure(UNAVAILABLE, f"{stream.server.name} went away"), self._latency())

    async def _pump(
        self,
        stream: Stream,
        handler: Callable[[Any, SimContext], AsyncIterator[Any]],
        request: Any,
        caller: calls.Call,
    ) -> None:
        calls.enter(caller, None)
        await asyncio.sleep(self._latency())
        server = stream.server
        try:
            async for item in handler(request, SimContext(None)):
                await stream.room()
                stream.send(item, self._latency())
            stream.end(None, self._latency())
        except ServiceError as exc:
            stream.end(Failed(status_message(exc.rejection, server.domain)), self._latency())
        except StorageUnavailable as exc:
            stream.end(
                Failed(status_message(storage_unavailable(server.catalogue, exc), server.domain)), self._latency()
            )
        except Exception as exc:  # noqa: BLE001 - as in _serve
            server.fault(f"{server.name}.stream", exc)
            stream.end(network_failure(INTERNAL, "internal fault"), self._latency())

    def forget(self, stream: Stream) -> None:
        if stream in self._streams:
            self._streams.remove(stream)


def _settle(reply: asyncio.Future[Answer], answer: Answer) -> None:
    if not reply.done():  # a duplicated request's second reply finds the call answered
        reply.set_result(answer)


def _expire(reply: asyncio.Future[Answer]) -> None:
    _settle(reply, network_failure(DEADLINE_EXCEEDED, "deadline exceeded"))


class _End(enum.Enum):
    """The end of a stream not reached yet (None is a clean end)."""

    OPEN = 0


class Stream:
    """One server stream as its reader sees it: items in order, then its end (None:
    the server finished, else the failure)."""

    def __init__(self, network: Network, source: str, server: Server, window: int) -> None:
        self._network = network
        self.source = source
        self.server = server
        self._window = window
        self._arrived: collections.deque[Any] = collections.deque()
        self._in_flight = 0
        self._last_arrival = 0.0
        self._end: Failed | _End | None = _End.OPEN
        self._wakeup = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.pump: asyncio.Task[Any] | None = None
        self._ended = False

    async def room(self) -> None:
        """Waits while the window is full (the reader has not taken what was sent)."""
        while self._in_flight >= self._window:
            self._room.clear()
            await self._room.wait()

    def _at(self, latency: float) -> float:
        loop = asyncio.get_running_loop()
        # One connection keeps its order: nothing overtakes what was sent before it, and
        # nothing arrives at the same instant either (the loop's timer heap does not keep
        # the order of timers due at one time).
        self._last_arrival = max(self._last_arrival + 1e-9, loop.time() + latency)
        return self._last_arrival

    def send(self, item: Any, latency: float) -> None:
        self._in_flight += 1
        asyncio.get_running_loop().call_at(self._at(latency), self._arrive, item)

    def _arrive(self, item: Any) -> None:
        if self._ended:
            return
        self._arrived.append(item)
        self._wakeup.set()

    def end(self, failure: Failed | None, latency: float) -> None:
        if self._ended:
            return
        asyncio.get_running_loop().call_at(self._at(latency), self._finish, failure)

    def _finish(self, failure: Failed | None) -> None:
        if self._end is _End.OPEN:
            self._end = failure
            self._wakeup.set()

    def cut(self, why: str) -> None:
        """The connection breaks now: what was in flight is lost with it."""
        if self._ended or self._end is not _End.OPEN:
            return
        self._ended = True
        self._arrived.clear()
        self._end = network_failure(UNAVAILABLE, why)
        self._wakeup.set()
        self._stop_pump()

    def cancel(self) -> None:
        """The reader is done with the stream."""
        self._ended = True
        self._stop_pump()

    def _stop_pump(self) -> None:
        if self.pump is not None and not self.pump.done():
            self.pump.cancel()
        self._network.forget(self)

    async def next(self) -> Any:
        """The next item; raises StreamEnded at the end."""
        while True:
            if self._arrived:
                self._in_flight -= 1
                self._room.set()
                return self._arrived.popleft()
            if not isinstance(self._end, _End):
                self._network.forget(self)
                raise StreamEnded(self._end)
            self._wakeup.clear()
            await self._wakeup.wait()


class StreamEnded(Exception):
    def __init__(self, failure: Failed | None) -> None:
        super().__init__(failure.status.message if failure is not None else "end of stream")
        self.failure = failure
