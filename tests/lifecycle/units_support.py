"""Support of the lifecycle tests that run units of work through a store: the
`Harness` (a store, the units that apply intents on it, what committed), builders
of intents, and a look at the pending propagations."""

from __future__ import annotations

from funnel.runtime.idempotency import RequestKey
from lifecycle_service.authority import LifecycleAuthority
from lifecycle_service.core import intents as i
from lifecycle_service.core.model import LifecycleEvent, Policy, TaskRecord, WorkStatus
from lifecycle_service.core.rules import decide
from lifecycle_service.storage.port import LifecycleStore
from lifecycle_service.units import ApplyResult, Command, Committed, apply_intent

POLICY = Policy()
WS = "ws"
FP_A = b"A" * 32
FP_B = b"B" * 32
T0 = 1_700_000_000_000_000


class Boom(Exception):
    pass


def render(task: TaskRecord, event: LifecycleEvent) -> bytes:
    """A stand-in for the service's serialized response: the port stores bytes only."""
    return repr((task, event)).encode()


def exploding_render(task, event):
    raise Boom("render failed")


async def pending(store: LifecycleStore, limit=100):
    """The pending propagations, oldest first. A look, not a hold: the claim's lease
    is zero, so it has lapsed at once and the authority's deliverer may take them."""
    return await store.write(lambda tx: tx.propagations.claim(T0, "test", 0, limit))


class Harness:
    """A store, the units that apply intents on it, and what committed (published)."""

    def __init__(self, store: LifecycleStore, clock):
        self.store = store
        self.clock = clock
        self.published: list[LifecycleEvent] = []
        self.authority = LifecycleAuthority(store, POLICY, clock, publish=self.published.append)

    async def apply(self, intent, *, fingerprint=None, render=render, decide_with=None, method="SetWorkStatus"):
        self.clock.advance(1_000)
        request = None
        if intent.request_id:
            request = RequestKey(
                intent.workspace_id, intent.caller.subject, method, intent.request_id, fingerprint or FP_A
            )
        command = Command(intent, decide_with or (lambda s: decide(intent, s, POLICY)), render, request)
        now = self.clock.now_micros()

        def publish(result: ApplyResult) -> None:
            if isinstance(result, Committed):
                self.published.append(result.event)

        return await self.store.write(lambda tx: apply_intent(tx, command, now), after_commit=publish)

    async def ok(self, intent, **kw) -> Committed:
        result = await self.apply(intent, **kw)
        assert isinstance(result, Committed), result
        return result

    async def task(self, task_id, workspace=WS):
        return await self.store.read(lambda tx: tx.tasks.load(workspace, task_id))

    async def children(self, task_id):
        return await self.store.read(lambda tx: tx.tasks.open_attached_children(tx.tasks.load(WS, task_id)))

    async def events(self, task_id, workspace=WS):
        return await self.store.read(lambda tx: tx.events.history(workspace, task_id, 0, 1000))

    async def all_events(self, workspace=WS):
        return await self.store.read(lambda tx: tx.events.page(workspace, 0, None, 10_000))


def register(task_id, *, parent=None, request_id=None, workspace=WS):
    return i.RegisterTask(workspace_id=workspace, task_id=task_id, parent=parent, request_id=request_id)


def activate(task_id, generation=1, **kw):
    return i.ActivateGeneration(workspace_id=WS, task_id=task_id, generation=generation, **kw)


def work(task_id, status=WorkStatus.IN_PROGRESS, generation=1, **kw):
    return i.SetWorkStatus(workspace_id=WS, task_id=task_id, generation=generation, work_status=status, **kw)


def plain(cls, task_id, generation=1, **kw):
    return cls(workspace_id=WS, task_id=task_id, generation=generation, **kw)


async def active_task(h, task_id, parent=None):
    await h.ok(register(task_id, parent=parent))
    await h.ok(activate(task_id))
