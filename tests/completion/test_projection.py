"""The lifecycle projection's core (completion_service/core/projection.py): what it
serves, what makes it read again, and a property: with changes delivered in
commit order and reads overtaken at random, a view it serves is the view a read at
that moment returns. Then its shell's streams (authority/projection.py) on a
scripted lifecycle client: which workspaces get one, and going down and back."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from completion_service.authority.metrics import Metrics
from completion_service.authority.projection import LifecycleProjection
from completion_service.core.model import LifecycleState
from completion_service.core.projection import LISTED_CHILDREN, Change, Record, WorkspaceProjection
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types

ACTIVE, TERMINAL, REGISTERED = LifecycleState.ACTIVE, LifecycleState.TERMINAL, LifecycleState.REGISTERED


def record(revision=2, state=ACTIVE, children=(), generation=1, cancel=False) -> Record:
    return Record(generation, revision, state, "COMPLETED" if state is TERMINAL else None, cancel, frozenset(children))


def change(task_id, revision, state=ACTIVE, generation=1, cancel=False, attached_to=None):
    return Change(task_id, generation, revision, state, "COMPLETED" if state is TERMINAL else None, cancel, attached_to)


def read(projection: WorkspaceProjection, task_id: str, result: Record, *during: Change) -> None:
    """A read of `task_id` returning `result`, with `during` delivered meanwhile."""
    reading = projection.begin_read(task_id)
    for c in during:
        projection.apply(c)
    projection.end_read(reading, result)


@pytest.mark.parametrize(
    "result, served",
    [
        (record(), True),
        (record(state=REGISTERED), True),
        (record(state=TERMINAL), False),
        (record(cancel=True), False),
        (record(children=["c"]), False),
    ],
)
def test_only_a_view_nothing_in_which_would_block_is_served(result, served):
    projection = WorkspaceProjection(10)
    read(projection, "t", result)
    view = projection.view("t")
    assert (view is not None) == served
    if view is not None:
        assert (view.generation, view.state, view.cancellation_requested) == (1, result.state, False)


@pytest.mark.parametrize(
    "during, kept",
    [
        ([], True),
        ([change("other", 5)], True),
        ([change("t", 3)], False),  # a newer revision than the read's
        ([change("t", 2)], True),  # a change the read already reflects, delivered late
        ([change("c", 1, REGISTERED, attached_to=("t", 1))], False),  # a child the read does not list
        ([change("c", 1, REGISTERED, attached_to=("other", 1))], True),
        ([change("c", 5, ACTIVE, generation=2, attached_to=("t", 1))], False),  # an unlisted child resumed
        ([change("other", 5, ACTIVE, generation=2)], True),  # a resume naming no parent
    ],
)
def test_a_read_overtaken_by_a_change_of_its_task_counts_for_its_attempt_only(during, kept):
    projection = WorkspaceProjection(10)
    read(projection, "t", record(), *during)
    assert (projection.view("t") is not None) == kept


def test_concurrent_reads_of_one_task_end_in_any_order():
    projection = WorkspaceProjection(10)
    first, second = projection.begin_read("t"), projection.begin_read("t")
    projection.end_read(second, record())
    projection.apply(change("t", 3))  # overtakes the first read only
    projection.end_read(first, record())
    assert projection.view("t") is None


def test_a_read_overtaken_by_a_change_of_a_listed_child_is_not_kept():
    projection = WorkspaceProjection(10)
    read(projection, "t", record(children=["c"]), change("c", 3, TERMINAL))
    assert projection.view("t") is None and len(projection) == 0  # the next attempt reads again
    read(projection, "t", record(children=["c"]), change("c", 1, REGISTERED, attached_to=("t", 1)))
    # The registration is the listed child's: the read was kept, and the child's end frees the task.
    assert projection.view("t") is None
    projection.apply(change("c", 3, TERMINAL))
    assert projection.view("t") is not None
    read(projection, "t", record(children=["c"]))
    projection.apply(change("c", 3, TERMINAL))
    assert projection.view("t") is not None


def test_a_child_resuming_during_a_read_of_its_parent_overtakes_the_read():
    projection = WorkspaceProjection(10)
    read(projection, "t", record())
    projection.apply(change("c", 1, REGISTERED, attached_to=("t", 1)))
    projection.apply(change("c", 2, TERMINAL))
    assert projection.view("t") is not None
    # The read sees the child ended (it does not list it); the resume arrives meanwhile.
    read(projection, "t", record(), change("c", 3, ACTIVE, generation=2, attached_to=("t", 1)))
    assert projection.view("t") is None


def test_changes_keep_a_kept_record_current():
    projection = WorkspaceProjection(10)
    read(projection, "t", record(revision=2))
    projection.apply(change("t", 2, cancel=True))  # not newer than the read: ignored
    assert projection.view("t") is not None
    projection.apply(change("t", 3, cancel=True))
    assert projection.view("t") is None
    read(projection, "u", record(revision=2))
    projection.apply(change("u", 3, TERMINAL))
    assert projection.view("u") is None


def test_children_registered_ended_and_resumed_after_the_read():
    projection = WorkspaceProjection(10)
    read(projection, "t", record(revision=2))
    projection.apply(change("c", 1, REGISTERED, attached_to=("t", 1)))
    assert projection.view("t") is None
    projection.apply(change("c", 2, TERMINAL))
    assert projection.view("t").open_attached_children == ()
    projection.apply(change("c", 3, ACTIVE, generation=2, attached_to=("t", 1)))
    assert projection.view("t") is None
    # A child of another generation of the parent, or a detached one, is no child here.
    projection.apply(change("c", 4, TERMINAL, generation=2))
    projection.apply(change("d", 1, REGISTERED, attached_to=("t", 7)))
    assert projection.view("t") is not None


def test_a_new_generation_of_the_parent_leaves_the_old_generations_children_behind():
    projection = WorkspaceProjection(10)
    read(projection, "t", record(revision=2, children=["c"]))
    projection.apply(change("t", 3, TERMINAL))
    projection.apply(change("t", 4, ACTIVE, generation=2))
    view = projection.view("t")
    assert view is not None and view.generation == 2
    projection.apply(change("c", 5, ACTIVE))  # the old generation's child: no longer counted
    assert projection.view("t") is not None


def test_a_resume_reaches_the_parent_it_names_and_nothing_else():
    projection = WorkspaceProjection(10)
    read(projection, "t", record())
    reading = projection.begin_read("u")
    projection.apply(change("stranger", 3, ACTIVE, generation=2))  # a top-level task: it names no parent
    projection.end_read(reading, record())
    assert projection.view("t") is not None and projection.view("u") is not None
    # A child the projection never saw (it had ended before "t" was read) resumes.
    projection.apply(change("c", 3, ACTIVE, generation=2, attached_to=("t", 1)))
    assert projection.view("t") is None and projection.view("u") is not None


def test_the_least_recently_served_record_leaves_first_and_a_full_child_list_is_never_kept():
    projection = WorkspaceProjection(2)
    read(projection, "a", record())
    read(projection, "b", record())
    assert projection.view("a") is not None
    read(projection, "c", record())
    assert len(projection) == 2 and projection.view("b") is None and projection.view("a") is not None
    read(projection, "p", record(children=[f"c{n}" for n in range(LISTED_CHILDREN)]))
    assert projection.view("p") is None and len(projection) == 2
    failed = projection.begin_read("a")
    projection.end_read(failed, None)  # a failed read forgets nothing
    assert projection.view("a") is not None


# -- the property ----------------------------------------------------------------------


@dataclasses.dataclass
class Task:
    generation: int = 1
    revision: int = 1
    state: LifecycleState = REGISTERED
    cancel: bool = False
    parent: tuple[str, int] | None = None


class Truth:
    """A lifecycle service in miniature: tasks, attached children, and the changes
    it commits (delivered in commit order, some while a read is under way)."""

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}

    def read(self, task_id: str) -> Record:
        task = self.tasks[task_id]
        children = {
            c for c, t in self.tasks.items() if t.parent == (task_id, task.generation) and t.state is not TERMINAL
        }
        return Record(
            task.generation,
            task.revision,
            task.state,
            "COMPLETED" if task.state is TERMINAL else None,
            task.cancel,
            frozenset(children),
        )

    def step(self, op: str, task_id: str, other: str) -> Change | None:
        task = self.tasks.get(task_id)
        if task is None:
            parent = self.tasks.get(other)
            attached = (other, parent.generation) if op == "child" and parent and parent.state is not TERMINAL else None
            self.tasks[task_id] = Task(parent=attached)
            return Change(task_id, 1, 1, REGISTERED, None, False, attached)
        opened = None
        if op == "activate" and task.state is not TERMINAL:
            task.state = ACTIVE
        elif op == "cancel" and task.state is not TERMINAL:
            task.cancel = True
        elif op == "end" and task.state is not TERMINAL:
            task.state = TERMINAL
        elif op == "resume" and task.state is TERMINAL:
            task.generation, task.state, task.cancel = task.generation + 1, ACTIVE, False
            opened = task.parent  # as the lifecycle service names it on the resume's event
        else:
            return None
        task.revision += 1
        return Change(
            task_id,
            task.generation,
            task.revision,
            task.state,
            "COMPLETED" if task.state is TERMINAL else None,
            task.cancel,
            opened,
        )


IDS = ["a", "b", "c", "d", "e"]
STEP = st.tuples(
    st.sampled_from(["child", "top", "activate", "cancel", "end", "resume", "read"]),
    st.sampled_from(IDS),
    st.sampled_from(IDS),
    st.integers(0, 3),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, max_size=60))
# A child that ended before its parent was read resumes: only the resume's parent link tells.
@example(
    [("top", "a", "a", 0), ("child", "b", "a", 0), ("end", "b", "a", 0), ("read", "a", "a", 0), ("resume", "b", "a", 0)]
)
def test_a_served_view_is_what_a_read_returns_at_that_moment(steps):
    truth, projection = Truth(), WorkspaceProjection(3)
    reads: list[tuple[object, str, Record]] = []  # under way: (reading, task, what the read returned)
    for op, task_id, other, finish in steps:
        if op == "read":
            if task_id in truth.tasks:
                reads.append((projection.begin_read(task_id), task_id, truth.read(task_id)))
        else:
            committed = truth.step(op, task_id, other)
            if committed is not None:
                projection.apply(committed)
        # Reads end some steps after they began, having seen the state they began at.
        while reads and len(reads) > finish:
            reading, _, result = reads.pop(0)
            projection.end_read(reading, result)
        for known in truth.tasks:
            view = projection.view(known)
            if view is not None:
                assert view == truth.read(known).view(), (known, steps)


# -- the shell's streams ---------------------------------------------------------------


class Stream:
    """One scripted WatchLifecycleEvents call: `first` (the head marker, or an error),
    then what the test sends."""

    def __init__(self, workspace_id: str, first) -> None:
        self.workspace_id = workspace_id
        self.cancelled = False
        self._items: asyncio.Queue = asyncio.Queue()
        self.send(first)

    def send(self, item) -> None:
        self._items.put_nowait(item)

    def __aiter__(self):
        return self

    async def __anext__(self):
        item = await self._items.get()
        if isinstance(item, Exception):
            raise item
        return item

    def cancel(self) -> None:
        self.cancelled = True


class Lifecycle:
    def __init__(self) -> None:
        self.streams: list[Stream] = []
        self.opened_at: list[float] = []  # time.monotonic() of each stream's opening
        self.refusing = False  # every new stream fails before its head marker

    def watch_from_head(self, workspace_id: str) -> Stream:
        head = lifecycle_messages.WatchLifecycleEventsResponse(head_sequence=7)
        first = RuntimeError("WATCHERS_EXHAUSTED") if self.refusing else head
        self.streams.append(Stream(workspace_id, first))
        self.opened_at.append(time.monotonic())
        return self.streams[-1]


async def until(condition, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


# A second: "just asked" must still hold on a loaded machine a moment later.
IDLE = 1.0


@pytest.fixture
async def shell():
    lifecycle = Lifecycle()
    projection = LifecycleProjection(
        lifecycle, Metrics(), workspaces=1, tasks_per_workspace=10, retry_seconds=0.01, idle_seconds=IDLE
    )
    owner = asyncio.create_task(projection.run_forever())
    await until(lambda: projection.view("a", "t") is None and projection.position("a") == 7)
    yield lifecycle, projection
    owner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await owner


async def test_a_workspace_asked_about_recently_keeps_its_stream_an_idle_one_gives_way(shell):
    lifecycle, projection = shell
    assert projection.view("b", "t") is None  # "a" was asked about just now: "b" reads
    assert [s.workspace_id for s in lifecycle.streams] == ["a"]
    await asyncio.sleep(IDLE * 1.1)  # "a" is idle from here on
    projection.view("b", "t")
    await until(lambda: projection.position("b") == 7)
    assert [s.workspace_id for s in lifecycle.streams] == ["a", "b"]
    assert lifecycle.streams[0].cancelled and projection.position("a") is None


async def test_a_stream_that_ends_serves_nothing_until_it_is_live_again_with_a_new_projection(shell):
    lifecycle, projection = shell
    first = lifecycle.streams[0]
    first.send(
        lifecycle_messages.WatchLifecycleEventsResponse(
            event=lifecycle_types.LifecycleEvent(
                sequence=8,
                workspace_id="a",
                task_id="t",
                generation=1,
                revision=2,
                to_state=lifecycle_enums.GENERATION_STATE_ACTIVE,
            )
        )
    )
    await until(lambda: projection.position("a") == 8)
    first.send(RuntimeError("the lifecycle service went away"))
    await until(lambda: projection.position("a") is None)
    assert first.cancelled
    await until(lambda: projection.position("a") == 7)  # the next stream's head
    assert len(lifecycle.streams) == 2


async def test_a_stream_refused_again_and_again_is_retried_less_and_less_often(shell):
    lifecycle, projection = shell
    lifecycle.refusing = True
    lifecycle.streams[0].send(RuntimeError("the lifecycle service went away"))
    await until(lambda: projection.position("a") is None)
    await until(lambda: len(lifecycle.streams) >= 6)
    # Retried after 10, 10, 20, 40, 80 ms...: each wait at least twice the last
    # (lower bounds, which no load can break; a loaded machine only waits longer).
    gaps = [later - earlier for earlier, later in zip(lifecycle.opened_at, lifecycle.opened_at[1:6], strict=False)]
    least = [0.01, 0.01, 0.02, 0.04, 0.08]
    assert all(gap >= 0.9 * bound for gap, bound in zip(gaps, least, strict=True)), gaps
    lifecycle.refusing = False
    await until(lambda: projection.position("a") == 7)
