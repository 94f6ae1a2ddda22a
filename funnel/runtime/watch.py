"""In-process fan-out of committed events to watch streams.

Publishing never blocks and never allocates per event beyond one reference per
matching stream: each stream has a bounded buffer, and a stream that falls behind
it is marked overflowed. It then delivers what it holds and ends, and the client
resumes from its cursor; commits are never slowed by a slow watcher.

When the server stops, `EventBroker.close()` ends every stream at once (and any
that opens later) instead of letting them hold the shutdown for its whole grace:
what a stream still buffers is dropped, as it is committed and the client reads
it again from its cursor. (A stream whose client stopped reading, stuck in a
write that flow control holds, is ended only by gRPC when the grace runs out.)
"""

from __future__ import annotations

import asyncio
import collections
import enum
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from funnel.runtime.errors import ServiceError, reject

Item = TypeVar("Item")


class WatchOverflow(Exception):
    """The stream fell more than its buffer behind the commits."""


class WatchClosed(Exception):
    """The server is stopping: the stream ends now."""


class Subscription(Generic[Item]):
    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: collections.deque[Item] = collections.deque()
        self._wakeup = asyncio.Event()
        self.overflowed = False
        self.closed = False

    def offer(self, item: Item) -> None:
        if self.overflowed or self.closed:
            return
        if len(self._items) >= self._capacity:
            self.overflowed = True
        else:
            self._items.append(item)
        self._wakeup.set()

    def close(self) -> None:
        self.closed = True
        self._wakeup.set()

    async def next(self) -> Item:
        """The next buffered item; raises WatchOverflow once the buffer has run dry
        after an overflow, and WatchClosed as soon as the subscription is closed."""
        while True:
            if self.closed:
                raise WatchClosed()
            if self._items:
                return self._items.popleft()
            if self.overflowed:
                raise WatchOverflow()
            self._wakeup.clear()
            await self._wakeup.wait()

    def __len__(self) -> int:
        return len(self._items)


class EventBroker(Generic[Item]):
    """Routes items by (scope, key) to subscriptions of that key and to the scope's
    unfiltered subscriptions (key None)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.closed = False
        # Per slot its subscriptions in the order they came (a dict as an ordered set):
        # a set of objects iterates in the order of their addresses, and the order in
        # which streams are woken would differ from run to run (funnel_sim replays runs).
        self._subscriptions: dict[tuple[Hashable, Hashable], dict[Subscription[Item], None]] = {}

    def close(self) -> None:
        """The server is stopping: ends every subscription, and closes any opened later."""
        self.closed = True
        for members in self._subscriptions.values():
            for subscription in members:
                subscription.close()

    @contextmanager
    def subscribe(self, scope: Hashable, key: Hashable | None) -> Iterator[Subscription[Item]]:
        subscription: Subscription[Item] = Subscription(self.capacity)
        if self.closed:
            subscription.close()
        slot = (scope, key)
        self._subscriptions.setdefault(slot, {})[subscription] = None
        try:
            yield subscription
        finally:
            members = self._subscriptions.get(slot)
            if members is not None:
                members.pop(subscription, None)
                if not members:
                    del self._subscriptions[slot]

    def publish(self, scope: Hashable, key: Hashable, make_item: Callable[[], Item]) -> None:
        """Offers an item to the matching streams; it is built only if one exists."""
        item = None
        for slot in ((scope, key), (scope, None)):
            for subscription in self._subscriptions.get(slot, ()):
                if item is None:
                    item = make_item()
                subscription.offer(item)

    @property
    def subscriber_count(self) -> int:
        return sum(len(members) for members in self._subscriptions.values())


Event = TypeVar("Event")
WATCH_BATCH = 500


async def follow(
    read_after: Callable[[int, int], Awaitable[list[Event]]],
    broker: EventBroker[Item],
    scope: Hashable,
    key: Hashable | None,
    cursor: int,
    wrap: Callable[[Event], Item],
    sequence_of: Callable[[Item], int],
    ends: WatchEnds,
) -> AsyncIterator[Item]:
    """Streams committed events after `cursor`: the stored backlog, then live ones,
    with no gap and no duplicate. Raises ends.overflowed(last_sequence) when the
    stream falls more than the broker's buffer behind, and
    ends.shutting_down(last_sequence) once the broker is closed (between two
    backlog batches, or at once while waiting for live events).

    It subscribes only once the backlog is drained, then reads the store once
    more: an event committed before the subscription is in the store, one
    committed after it is in the buffer, and sequences filter the overlap."""

    async def backlog() -> AsyncIterator[Item]:
        nonlocal cursor
        while True:
            if broker.closed:
                raise ends.shutting_down(cursor)
            events = await read_after(cursor, WATCH_BATCH)
            for event in events:
                item = wrap(event)
                cursor = sequence_of(item)
                yield item
            if len(events) < WATCH_BATCH:
                return

    async for item in backlog():
        yield item
    with broker.subscribe(scope, key) as live:
        async for item in backlog():
            yield item
        async for item in _live(live, cursor, sequence_of, ends):
            yield item


async def follow_from_head(
    read_head: Callable[[], Awaitable[int]],
    broker: EventBroker[Item],
    scope: Hashable,
    key: Hashable | None,
    marker: Callable[[int], Item],
    sequence_of: Callable[[Item], int],
    ends: WatchEnds,
) -> AsyncIterator[Item]:
    """Streams marker(head), then every event committed after `head`, the last
    sequence committed once the stream is subscribed. Subscribing before reading
    the head leaves no gap: an event committed in between is at most the head
    (a read after the marker sees it) or in the buffer; sequences filter both."""
    with broker.subscribe(scope, key) as live:
        # Subscribed to a closed broker, the stream still says where to resume: the
        # marker, then the shutdown with the head as its cursor.
        head = await read_head()
        yield marker(head)
        async for item in _live(live, head, sequence_of, ends):
            yield item


async def _live(
    live: Subscription[Item], cursor: int, sequence_of: Callable[[Item], int], ends: WatchEnds
) -> AsyncIterator[Item]:
    """The subscription's items after `cursor`, until it overflows or closes."""
    while True:
        try:
            item = await live.next()
        except WatchOverflow:
            raise ends.overflowed(cursor) from None
        except WatchClosed:
            raise ends.shutting_down(cursor) from None
        if sequence_of(item) <= cursor:
            continue
        cursor = sequence_of(item)
        yield item


@dataclass(frozen=True)
class WatchEnds:
    """The errors that end a watch stream, each naming the cursor to resume from:
    the last sequence the stream delivered."""

    catalogue: type[enum.Enum]
    capacity: int

    def overflowed(self, cursor: int) -> ServiceError:
        return ServiceError(
            reject(
                self.catalogue["WATCH_OVERFLOW"],
                f"the watcher fell more than {self.capacity} events behind; resume from the last sequence received",
                resume_after_sequence=cursor,
            )
        )

    def shutting_down(self, cursor: int) -> ServiceError:
        return ServiceError(
            reject(
                self.catalogue["SERVER_SHUTTING_DOWN"],
                "the server is shutting down; watch again (on another replica, or once it is back) with "
                "after_sequence set to the last sequence received",
                resume_after_sequence=cursor,
            )
        )


class WatchQuota:
    """Caps on open watch streams per caller and per workspace, so that one caller
    cannot hold the service's memory and file descriptors with watchers."""

    def __init__(self, catalogue: type[enum.Enum], per_caller: int, per_workspace: int) -> None:
        self._reason = catalogue["WATCHERS_EXHAUSTED"]
        self.per_caller = per_caller
        self.per_workspace = per_workspace
        self._by_caller: collections.Counter[str] = collections.Counter()
        self._by_workspace: collections.Counter[str] = collections.Counter()

    @contextmanager
    def admit(self, caller: str, workspace: str) -> Iterator[None]:
        if self._by_caller[caller] >= self.per_caller:
            raise self._exhausted(
                f"{caller!r} already has {self.per_caller} open watch streams", "per_caller", self.per_caller
            )
        if self._by_workspace[workspace] >= self.per_workspace:
            raise self._exhausted(
                f"workspace {workspace!r} already has {self.per_workspace} open watch streams",
                "per_workspace",
                self.per_workspace,
            )
        self._by_caller[caller] += 1
        self._by_workspace[workspace] += 1
        try:
            yield
        finally:
            for counter, key in ((self._by_caller, caller), (self._by_workspace, workspace)):
                counter[key] -= 1
                if not counter[key]:
                    del counter[key]

    def _exhausted(self, message: str, scope: str, limit: int) -> ServiceError:
        return ServiceError(
            reject(self._reason, f"{message}; close one or resume later from its cursor", scope=scope, limit=limit)
        )
