"""In-process fan-out of committed events to watch streams.

Publishing never blocks and never allocates per event beyond one reference per
matching stream: each stream has a bounded buffer, and a stream that falls behind
it is marked overflowed. It then delivers what it holds and ends, and the client
resumes from its cursor; commits are never slowed by a slow watcher.
"""

from __future__ import annotations

import asyncio
import collections
import enum
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from funnel.runtime.errors import ServiceError, reject

Item = TypeVar("Item")


class WatchOverflow(Exception):
    """The stream fell more than its buffer behind the commits."""


class Subscription(Generic[Item]):
    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: collections.deque[Item] = collections.deque()
        self._wakeup = asyncio.Event()
        self.overflowed = False

    def offer(self, item: Item) -> None:
        if self.overflowed:
            return
        if len(self._items) >= self._capacity:
            self.overflowed = True
        else:
            self._items.append(item)
        self._wakeup.set()

    async def next(self) -> Item:
        """The next buffered item; raises WatchOverflow once the buffer has run dry after an overflow."""
        while not self._items:
            if self.overflowed:
                raise WatchOverflow()
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)


class EventBroker(Generic[Item]):
    """Routes items by (scope, key) to subscriptions of that key and to the scope's
    unfiltered subscriptions (key None)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._subscriptions: dict[tuple[Hashable, Hashable], set[Subscription[Item]]] = {}

    @contextmanager
    def subscribe(self, scope: Hashable, key: Hashable | None) -> Iterator[Subscription[Item]]:
        subscription: Subscription[Item] = Subscription(self.capacity)
        slot = (scope, key)
        self._subscriptions.setdefault(slot, set()).add(subscription)
        try:
            yield subscription
        finally:
            members = self._subscriptions.get(slot)
            if members is not None:
                members.discard(subscription)
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
    overflowed: Callable[[int], Exception],
) -> AsyncIterator[Item]:
    """Streams committed events after `cursor`: the stored backlog, then live ones,
    with no gap and no duplicate. Raises overflowed(last_sequence) when the
    stream falls more than the broker's buffer behind.

    It subscribes only once the backlog is drained, then reads the store once
    more: an event committed before the subscription is in the store, one
    committed after it is in the buffer, and sequences filter the overlap."""

    async def backlog() -> AsyncIterator[Item]:
        nonlocal cursor
        while True:
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
        while True:
            try:
                item = await live.next()
            except WatchOverflow:
                raise overflowed(cursor) from None
            if sequence_of(item) <= cursor:
                continue
            cursor = sequence_of(item)
            yield item


def overflow_error(catalogue: type[enum.Enum], capacity: int) -> Callable[[int], ServiceError]:
    """The error that ends an overflowed stream, naming the cursor to resume from."""

    def overflowed(cursor: int) -> ServiceError:
        return ServiceError(
            reject(
                catalogue["WATCH_OVERFLOW"],
                f"the watcher fell more than {capacity} events behind; resume from the last sequence received",
                resume_after_sequence=cursor,
            )
        )

    return overflowed


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
                f"workspace {workspace!r} already has {self.per_workspace} open watch streams", "per_workspace",
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
