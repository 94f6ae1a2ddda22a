"""End-to-end tests of the lifecycle service over real gRPC, on a real SQLite file
and on PostgreSQL (the `server_backend` of tests/lifecycle/conftest.py): every RPC,
every rejection reason a client can provoke, bad input, idempotency, paging,
parents and children, limits and health."""

from __future__ import annotations

import asyncio
import sqlite3

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import errors_pb2 as lifecycle_errors
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.errors import instant
from funnel.runtime.grpc_errors import error_info, field_violations
from funnel.runtime.postgres import is_postgres_url
from lifecycle_service.api.service import SERVICE_NAME
from lifecycle_service.core import intents as i
from lifecycle_service.core.model import LinkMode, ParentLink, Policy
from lifecycle_service.core.rules import decide
from lifecycle_service.errors import Reason
from lifecycle_service.units import Command, apply_intent
from tests import credentials
from tests.lifecycle.conftest import open_store
from tests.lifecycle.grpc_support import WS, Client, Code, micros, rejected, ts

OTHER_WS = "ws-2"
REGISTERED, ACTIVE, SUSPENDED, TERMINAL = (
    lifecycle_enums.GENERATION_STATE_REGISTERED,
    lifecycle_enums.GENERATION_STATE_ACTIVE,
    lifecycle_enums.GENERATION_STATE_SUSPENDED,
    lifecycle_enums.GENERATION_STATE_TERMINAL,
)


@pytest.fixture
def c(lifecycle) -> Client:
    return Client(lifecycle[1])


async def workspace_state(c: Client, workspace: str = WS):
    """Everything a client can read about a workspace: its tasks and their histories."""
    client = Client(c.stub, workspace)
    listing = await c.stub.ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=workspace, page_size=1000))
    return [(task, await client.events(task.task_id)) for task in listing.tasks]


# ---------------------------------------------------------------------------
# Happy paths of every RPC.


async def test_register_creates_generation_one_at_revision_one(c, clock):
    cause = lifecycle_types.Cause(source="host:ide", reason="user asked", originating_ids={"run_id": "run-1"})
    response = await c.register("t1", request_id="req-1", cause=cause)
    task, event = response.task, response.event
    now = clock.now_micros()
    assert (task.workspace_id, task.task_id, task.generation, task.revision) == (WS, "t1", 1, 1)
    assert (task.state, task.outcome, task.cancellation, task.work_status) == (
        REGISTERED,
        lifecycle_enums.TERMINAL_OUTCOME_UNSPECIFIED,
        lifecycle_enums.CANCELLATION_STATE_NONE,
        lifecycle_enums.WORK_STATUS_READY,
    )
    assert not task.HasField("parent") and not task.HasField("cancellation_request_time")
    assert task.completion_id == ""
    assert micros(task.create_time) == micros(task.update_time) == now
    assert event.sequence >= 1
    assert (event.workspace_id, event.task_id, event.generation, event.revision) == (WS, "t1", 1, 1)
    assert (event.intent, event.from_state, event.to_state) == (
        lifecycle_enums.INTENT_REGISTER_TASK,
        lifecycle_enums.GENERATION_STATE_UNSPECIFIED,
        REGISTERED,
    )
    assert event.cause == cause and event.request_id == "req-1"
    assert micros(event.commit_time) == now
    assert await c.get("t1") == lifecycle_messages.GetTaskResponse(task=task)
    assert await c.events("t1") == [event]


async def test_free_text_round_trips_whatever_characters_it_holds(c):
    """Cause source, reason and originating id values are free text: U+0000 (which a
    PostgreSQL TEXT column cannot hold), controls, quotes, and characters beyond the BMP."""
    odd = "a\x00b\n\t'\"%?\\ \u200b\U0001f600"
    cause = lifecycle_types.Cause(source=odd, reason=odd * 3, originating_ids={"run_id": odd})
    event = (await c.register("t1", cause=cause)).event
    assert event.cause == cause
    stream = c.stub.WatchLifecycleEvents(lifecycle_messages.WatchLifecycleEventsRequest(workspace_id=WS))
    try:
        assert (await stream.read()).event == event
    finally:
        stream.cancel()
    assert await c.events("t1") == [event]


async def test_a_generation_walks_through_its_states(c, clock):
    await c.register("t1")
    steps = []
    clock.advance(1_000_000)
    steps.append(await c.activate("t1", work_status=lifecycle_enums.WORK_STATUS_IN_PROGRESS))
    clock.advance(1_000_000)
    steps.append(await c.suspend("t1"))
    clock.advance(1_000_000)
    steps.append(await c.resume("t1"))
    clock.advance(1_000_000)
    steps.append(await c.work("t1", lifecycle_enums.WORK_STATUS_BLOCKED))
    clock.advance(1_000_000)
    steps.append(await c.request_cancellation("t1"))
    fence = clock.now_micros()
    clock.advance(1_000_000)
    steps.append(await c.settle_cancellation("t1"))

    expected = [
        (lifecycle_enums.INTENT_ACTIVATE_GENERATION, REGISTERED, ACTIVE, lifecycle_enums.WORK_STATUS_IN_PROGRESS),
        (lifecycle_enums.INTENT_SUSPEND_GENERATION, ACTIVE, SUSPENDED, lifecycle_enums.WORK_STATUS_IN_PROGRESS),
        (lifecycle_enums.INTENT_RESUME_WITH_GENERATION, SUSPENDED, ACTIVE, lifecycle_enums.WORK_STATUS_IN_PROGRESS),
        (lifecycle_enums.INTENT_SET_WORK_STATUS, ACTIVE, ACTIVE, lifecycle_enums.WORK_STATUS_BLOCKED),
        (lifecycle_enums.INTENT_REQUEST_CANCELLATION, ACTIVE, ACTIVE, lifecycle_enums.WORK_STATUS_BLOCKED),
        (lifecycle_enums.INTENT_SETTLE_CANCELLATION, ACTIVE, TERMINAL, lifecycle_enums.WORK_STATUS_CANCELLED),
    ]
    for revision, (response, (intent, from_state, to_state, status)) in enumerate(
        zip(steps, expected, strict=True), start=2
    ):
        event, task = response.event, response.task
        assert (event.intent, event.from_state, event.to_state, event.work_status) == (
            intent,
            from_state,
            to_state,
            status,
        )
        assert event.revision == task.revision == revision
        assert (task.state, task.work_status) == (to_state, status)
        assert micros(task.update_time) == micros(event.commit_time)
    requested, settled = steps[-2].task, steps[-1].task
    assert requested.cancellation == lifecycle_enums.CANCELLATION_STATE_REQUESTED
    assert micros(requested.cancellation_request_time) == fence
    assert (settled.outcome, settled.cancellation, micros(settled.cancellation_request_time)) == (
        lifecycle_enums.TERMINAL_OUTCOME_CANCELLED,
        lifecycle_enums.CANCELLATION_STATE_REQUESTED,
        fence,
    )
    assert steps[-1].event.outcome == lifecycle_enums.TERMINAL_OUTCOME_CANCELLED
    history = await c.events("t1")
    assert [e.revision for e in history] == list(range(1, 8))
    assert [e.sequence for e in history] == sorted({e.sequence for e in history})
    assert history[1:] == [step.event for step in steps]
    assert await c.task("t1") == settled


async def test_completion_settles_the_generation_and_a_repeat_returns_the_original(c, clock):
    await c.active("t1")
    at = clock.now_micros() - 2_000_000
    cause = lifecycle_types.Cause(source="completion_service", originating_ids={"completion_id": "cmp-1"})
    done = await c.complete("t1", completion_id="cmp-1", authoritative_at=at, request_id="settle-1", cause=cause)
    assert (done.task.state, done.task.outcome, done.task.work_status, done.task.completion_id) == (
        TERMINAL,
        lifecycle_enums.TERMINAL_OUTCOME_COMPLETED,
        lifecycle_enums.WORK_STATUS_DONE,
        "cmp-1",
    )
    assert (done.event.intent, done.event.completion_id, micros(done.event.authoritative_time)) == (
        lifecycle_enums.INTENT_SETTLE_COMPLETION,
        "cmp-1",
        at,
    )
    clock.advance(5_000_000)
    again = await c.complete("t1", completion_id="cmp-1", authoritative_at=at + 1, request_id="settle-2")
    assert again == done
    await rejected(
        c.complete("t1", completion_id="cmp-2", authoritative_at=at),
        Code.FAILED_PRECONDITION,
        "GENERATION_TERMINAL",
        metadata={"generation", "outcome"},
    )
    assert len(await c.events("t1")) == 3


@pytest.mark.parametrize(
    "settle, outcome",
    [("fail", lifecycle_enums.TERMINAL_OUTCOME_FAILED), ("time_out", lifecycle_enums.TERMINAL_OUTCOME_TIMED_OUT)],
)
async def test_failure_and_timeout_settle_the_generation(c, settle, outcome):
    await c.active("t1")
    settled = await getattr(c, settle)("t1")
    assert (settled.task.state, settled.task.outcome, settled.task.work_status) == (
        TERMINAL,
        outcome,
        lifecycle_enums.WORK_STATUS_BLOCKED,
    )
    assert settled.event.outcome == outcome
    assert await getattr(c, settle)("t1") == settled
    other = "time_out" if settle == "fail" else "fail"
    await rejected(getattr(c, other)("t1"), Code.FAILED_PRECONDITION, "GENERATION_TERMINAL")


async def test_a_new_generation_after_a_terminal_one(c):
    await c.active("t1")
    done = await c.complete("t1", authoritative_at=1)
    resumed = await c.resume("t1", generation=2, expected_revision=3)
    task = resumed.task
    assert (task.generation, task.revision, task.state, task.work_status) == (
        2,
        4,
        ACTIVE,
        lifecycle_enums.WORK_STATUS_READY,
    )
    assert (task.outcome, task.cancellation, task.completion_id) == (
        lifecycle_enums.TERMINAL_OUTCOME_UNSPECIFIED,
        lifecycle_enums.CANCELLATION_STATE_NONE,
        "",
    )
    assert (resumed.event.generation, resumed.event.from_state, resumed.event.to_state) == (2, TERMINAL, ACTIVE)
    history = await c.events("t1")
    # The terminal generation and its events stay as they were.
    assert history[2] == done.event
    assert [e.generation for e in history] == [1, 1, 1, 2]
    await c.work("t1", generation=2)


async def test_get_task_lists_open_attached_children(c):
    await c.active("parent")
    await c.register("c-b", parent="parent")
    await c.active("c-a", parent="parent")
    await c.register("d-1", parent="parent", mode=lifecycle_enums.PARENT_LINK_MODE_DETACHED)
    await c.active("c-done", parent="parent")
    await c.fail("c-done")
    view = await c.get("parent")
    assert list(view.open_attached_child_task_ids) == ["c-a", "c-b"]
    child = await c.task("c-b")
    assert child.parent == lifecycle_types.ParentLink(
        task_id="parent", generation=1, mode=lifecycle_enums.PARENT_LINK_MODE_ATTACHED
    )
    # The registration event names the parent too (a watcher learns of the child from it); no other event does.
    registered, activated = await c.events("c-a")
    assert registered.parent == child.parent and not activated.HasField("parent")


async def test_list_tasks_pages_through_a_workspace(c):
    ids = [f"task-{n:02d}" for n in range(7)]
    for task_id in reversed(ids):
        await c.register(task_id)
    await Client(c.stub, OTHER_WS).register("task-99")
    seen, token, pages = [], "", 0
    while True:
        page = await c.ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=WS, page_size=3, page_token=token))
        pages += 1
        seen += [t.task_id for t in page.tasks]
        assert len(page.tasks) <= 3
        token = page.next_page_token
        if not token:
            break
    assert seen == ids and pages == 3
    everything = await c.ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=WS))
    assert [t.task_id for t in everything.tasks] == ids and everything.next_page_token == ""


async def test_list_tasks_filters_by_parent(c):
    await c.active("parent")
    await c.register("kid-1", parent="parent")
    await c.register("kid-2", parent="parent", mode=lifecycle_enums.PARENT_LINK_MODE_DETACHED)
    await c.register("stranger")
    page = await c.ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=WS, parent_task_id="parent", page_size=1))
    assert [t.task_id for t in page.tasks] == ["kid-1"]
    rest = await c.ListTasks(
        lifecycle_messages.ListTasksRequest(
            workspace_id=WS, parent_task_id="parent", page_size=1, page_token=page.next_page_token
        )
    )
    assert [t.task_id for t in rest.tasks] == ["kid-2"] and rest.next_page_token == ""
    # A token is bound to its listing.
    await rejected(
        c.ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=WS, page_token=page.next_page_token)),
        Code.INVALID_ARGUMENT,
        "FIELD_MALFORMED",
        field="page_token",
    )


async def test_list_tasks_filters_orders_by_last_change_and_counts_on_the_server(c):
    await c.register("t-ready")
    await c.active("t-active")
    await c.active("t-failed")
    await c.fail("t-failed")
    await c.register("u-other")
    await c.work("t-active", lifecycle_enums.WORK_STATUS_BLOCKED)  # the latest change

    async def ids(**kw) -> list[str]:
        return [
            t.task_id for t in (await c.ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=WS, **kw))).tasks
        ]

    assert await ids(state=lifecycle_enums.GENERATION_STATE_ACTIVE) == ["t-active"]
    assert await ids(outcome=lifecycle_enums.TERMINAL_OUTCOME_FAILED) == ["t-failed"]
    assert await ids(work_status=lifecycle_enums.WORK_STATUS_BLOCKED) == ["t-active", "t-failed"]
    assert await ids(task_id_prefix="t-") == ["t-active", "t-failed", "t-ready"]
    assert await ids(state=lifecycle_enums.GENERATION_STATE_REGISTERED, task_id_prefix="u") == ["u-other"]
    assert await ids(order=lifecycle_enums.TASK_ORDER_LAST_CHANGE) == ["t-active", "u-other", "t-failed", "t-ready"]
    # Pages of a filtered listing in last-change order; the token is for that listing only.
    first = await c.ListTasks(
        lifecycle_messages.ListTasksRequest(
            workspace_id=WS, task_id_prefix="t-", page_size=2, order=lifecycle_enums.TASK_ORDER_LAST_CHANGE
        )
    )
    rest = await c.ListTasks(
        lifecycle_messages.ListTasksRequest(
            workspace_id=WS,
            task_id_prefix="t-",
            page_size=2,
            order=lifecycle_enums.TASK_ORDER_LAST_CHANGE,
            page_token=first.next_page_token,
        )
    )
    assert [t.task_id for t in (*first.tasks, *rest.tasks)] == ["t-active", "t-failed", "t-ready"]
    assert not rest.next_page_token
    for other in ({"page_size": 2, "task_id_prefix": "t-"}, {"order": lifecycle_enums.TASK_ORDER_LAST_CHANGE}):
        await rejected(
            c.ListTasks(
                lifecycle_messages.ListTasksRequest(workspace_id=WS, page_token=first.next_page_token, **other)
            ),
            Code.INVALID_ARGUMENT,
            "FIELD_MALFORMED",
            field="page_token",
        )

    counted = await c.stub.CountTasks(lifecycle_messages.CountTasksRequest(workspace_id=WS))
    assert counted.total == 4
    assert [(n.state, n.outcome, n.work_status, n.tasks) for n in counted.counts] == [
        (lifecycle_enums.GENERATION_STATE_REGISTERED, 0, lifecycle_enums.WORK_STATUS_READY, 2),
        (lifecycle_enums.GENERATION_STATE_ACTIVE, 0, lifecycle_enums.WORK_STATUS_BLOCKED, 1),
        (
            lifecycle_enums.GENERATION_STATE_TERMINAL,
            lifecycle_enums.TERMINAL_OUTCOME_FAILED,
            lifecycle_enums.WORK_STATUS_BLOCKED,
            1,
        ),
    ]
    assert (await c.stub.CountTasks(lifecycle_messages.CountTasksRequest(workspace_id=OTHER_WS))).total == 0


@pytest.mark.parametrize(
    ("fields", "reason", "field"),
    [
        ({"state": 9}, "ENUM_UNSPECIFIED", "state"),
        ({"outcome": 9}, "ENUM_UNSPECIFIED", "outcome"),
        ({"work_status": 9}, "ENUM_UNSPECIFIED", "work_status"),
        ({"order": 9}, "ENUM_UNSPECIFIED", "order"),
        ({"task_id_prefix": "has space"}, "FIELD_MALFORMED", "task_id_prefix"),
        ({"task_id_prefix": "x" * 129}, "FIELD_TOO_LONG", "task_id_prefix"),
    ],
)
async def test_list_tasks_refuses_a_filter_it_does_not_know(c, fields, reason, field):
    await rejected(
        c.ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=WS, **fields)),
        Code.INVALID_ARGUMENT,
        reason,
        field=field,
    )


async def test_list_lifecycle_events_pages_through_a_history(c):
    await c.active("t1")
    for n in range(5):
        await c.work("t1", [lifecycle_enums.WORK_STATUS_BLOCKED, lifecycle_enums.WORK_STATUS_IN_PROGRESS][n % 2])
    revisions, token = [], ""
    while True:
        page = await c.ListLifecycleEvents(
            lifecycle_messages.ListLifecycleEventsRequest(workspace_id=WS, task_id="t1", page_size=2, page_token=token)
        )
        revisions += [e.revision for e in page.events]
        token = page.next_page_token
        if not token:
            break
    assert revisions == list(range(1, 8))


@pytest.mark.parametrize(
    "listing, foreign_token_from",
    [
        ("tasks", "events"),
        ("events", "tasks"),
        ("tasks", "tasks-of-another-workspace"),
        ("events", "events-of-another-task"),
        ("events", "garbage"),
    ],
)
async def test_a_page_token_from_another_listing_is_malformed(c, listing, foreign_token_from):
    for task_id in ("a", "b", "c"):
        await c.active(task_id)
        await Client(c.stub, OTHER_WS).register(task_id)
    tokens = {
        "events": (
            await c.ListLifecycleEvents(
                lifecycle_messages.ListLifecycleEventsRequest(workspace_id=WS, task_id="a", page_size=1)
            )
        ).next_page_token,
        "events-of-another-task": (
            await c.ListLifecycleEvents(
                lifecycle_messages.ListLifecycleEventsRequest(workspace_id=WS, task_id="b", page_size=1)
            )
        ).next_page_token,
        "tasks": (await c.ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=WS, page_size=1))).next_page_token,
        "tasks-of-another-workspace": (
            await c.ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=OTHER_WS, page_size=1))
        ).next_page_token,
        "garbage": "bm90IGEgdG9rZW4",
    }
    assert all(tokens.values())
    token = tokens[foreign_token_from]
    if listing == "tasks":
        call = c.ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=WS, page_token=token))
    else:
        call = c.ListLifecycleEvents(
            lifecycle_messages.ListLifecycleEventsRequest(workspace_id=WS, task_id="a", page_token=token)
        )
    await rejected(call, Code.INVALID_ARGUMENT, "FIELD_MALFORMED", metadata={"field"}, field="page_token")


# ---------------------------------------------------------------------------
# Every rejection reason a client can provoke: code, ErrorInfo, metadata, and nothing changed.


async def _task_not_found(c):
    return lambda: c.work("ghost")


async def _parent_not_found(c):
    return lambda: c.register("child", parent="ghost")


async def _task_already_exists(c):
    await c.register("t1")
    return lambda: c.register("t1")


async def _revision_mismatch(c):
    await c.active("t1")
    return lambda: c.work("t1", expected_revision=1)


async def _register_revision_mismatch(c):
    return lambda: c.register("t1", expected_revision=3)


async def _stale_generation(c):
    await c.active("t1")
    await c.fail("t1")
    await c.resume("t1", generation=2)
    return lambda: c.work("t1", generation=1)


async def _future_generation(c):
    await c.active("t1")
    return lambda: c.work("t1", generation=2)


async def _generation_terminal(c):
    await c.active("t1")
    await c.fail("t1")
    return lambda: c.work("t1")


async def _invalid_transition(c):
    await c.register("t1")
    return lambda: c.suspend("t1")


async def _cancellation_fenced(c):
    await c.active("t1")
    await c.request_cancellation("t1")
    return lambda: c.work("t1")


async def _completion_fenced(c):
    await c.active("t1")
    await c.request_cancellation("t1")
    return lambda: c.complete("t1", authoritative_at=1_700_000_000_000_000)


async def _cancellation_not_requested(c):
    await c.active("t1")
    return lambda: c.settle_cancellation("t1")


async def _cancellation_already_requested(c):
    await c.active("t1")
    await c.request_cancellation("t1")
    return lambda: c.request_cancellation("t1")


async def _active_attached_child(c):
    await c.active("parent")
    await c.register("child", parent="parent")
    return lambda: c.complete("parent", authoritative_at=1)


async def _parent_generation_mismatch(c):
    await c.active("parent")
    return lambda: c.register("child", parent="parent", generation=2)


async def _parent_not_active(c):
    await c.register("parent")
    return lambda: c.register("child", parent="parent")


async def _parent_cancellation_fenced(c):
    await c.active("parent")
    await c.request_cancellation("parent")
    return lambda: c.register("child", parent="parent")


async def _parent_terminal(c):
    await c.active("parent")
    await c.fail("parent")
    return lambda: c.register("child", parent="parent")


async def _parent_not_terminal(c):
    await c.active("parent")
    await c.active("child", parent="parent")
    return lambda: c.propagate("child")


async def _not_attached_child(c):
    await c.active("parent")
    await c.active("child", parent="parent", mode=lifecycle_enums.PARENT_LINK_MODE_DETACHED)
    return lambda: c.propagate("child")


async def _work_status_reserved(c):
    await c.active("t1")
    return lambda: c.work("t1", lifecycle_enums.WORK_STATUS_DONE)


async def _request_id_reused(c):
    await c.active("t1")
    await c.work("t1", lifecycle_enums.WORK_STATUS_BLOCKED, request_id="req-1")
    return lambda: c.work("t1", lifecycle_enums.WORK_STATUS_READY, request_id="req-1")


FENCE_KEYS = {"cancellation_request_time", "fenced_task_id"}
REJECTIONS = {
    "TASK_NOT_FOUND": (_task_not_found, Code.NOT_FOUND, {"task_id"}),
    "PARENT_NOT_FOUND": (_parent_not_found, Code.NOT_FOUND, {"parent_task_id"}),
    "TASK_ALREADY_EXISTS": (_task_already_exists, Code.ALREADY_EXISTS, {"task_id"}),
    "REVISION_MISMATCH": (_revision_mismatch, Code.ABORTED, {"expected_revision", "actual_revision"}),
    "REVISION_MISMATCH/register": (_register_revision_mismatch, Code.ABORTED, {"expected_revision", "actual_revision"}),
    "STALE_GENERATION": (_stale_generation, Code.FAILED_PRECONDITION, {"generation", "current_generation"}),
    "FUTURE_GENERATION": (_future_generation, Code.FAILED_PRECONDITION, {"generation", "current_generation"}),
    "GENERATION_TERMINAL": (_generation_terminal, Code.FAILED_PRECONDITION, {"generation", "outcome"}),
    "INVALID_TRANSITION": (_invalid_transition, Code.FAILED_PRECONDITION, {"state", "intent"}),
    "CANCELLATION_FENCED": (_cancellation_fenced, Code.FAILED_PRECONDITION, FENCE_KEYS),
    "CANCELLATION_FENCED/completion": (
        _completion_fenced,
        Code.FAILED_PRECONDITION,
        FENCE_KEYS | {"max_clock_offset_ms"},
    ),
    "CANCELLATION_NOT_REQUESTED": (_cancellation_not_requested, Code.FAILED_PRECONDITION, set()),
    "CANCELLATION_ALREADY_REQUESTED": (
        _cancellation_already_requested,
        Code.FAILED_PRECONDITION,
        {"cancellation_request_time"},
    ),
    "ACTIVE_ATTACHED_CHILD": (_active_attached_child, Code.FAILED_PRECONDITION, {"child_task_ids"}),
    "PARENT_GENERATION_MISMATCH": (
        _parent_generation_mismatch,
        Code.FAILED_PRECONDITION,
        {"parent_task_id", "parent_generation", "current_parent_generation"},
    ),
    "PARENT_NOT_ACTIVE": (_parent_not_active, Code.FAILED_PRECONDITION, {"parent_task_id", "parent_state"}),
    "PARENT_CANCELLATION_FENCED": (_parent_cancellation_fenced, Code.FAILED_PRECONDITION, {"parent_task_id"}),
    "PARENT_TERMINAL": (_parent_terminal, Code.FAILED_PRECONDITION, {"parent_task_id", "parent_outcome"}),
    "PARENT_NOT_TERMINAL": (_parent_not_terminal, Code.FAILED_PRECONDITION, {"parent_task_id"}),
    "NOT_ATTACHED_CHILD": (_not_attached_child, Code.FAILED_PRECONDITION, set()),
    "WORK_STATUS_RESERVED": (_work_status_reserved, Code.INVALID_ARGUMENT, {"field"}),
    "REQUEST_ID_REUSED": (_request_id_reused, Code.INVALID_ARGUMENT, {"request_id"}),
}


@pytest.mark.parametrize("name", list(REJECTIONS))
async def test_each_rejection_reason(c, name):
    setup, code, metadata = REJECTIONS[name]
    attempt = await setup(c)
    before = await workspace_state(c)
    await rejected(attempt(), code, name.split("/")[0], metadata=metadata)
    assert await workspace_state(c) == before


async def test_parent_generation_replacement_waits_for_attached_children(lifecycle):
    running, stub = lifecycle
    c = Client(stub)
    await c.active("parent")
    await c.active("child", parent="parent")
    # Hold back propagation delivery, as if the process were slow to reach the child.
    await running.background.stop()
    await c.fail("parent")
    assert (await c.task("child")).state == ACTIVE
    before = await workspace_state(c)
    await rejected(
        c.resume("parent", generation=2), Code.FAILED_PRECONDITION, "ACTIVE_ATTACHED_CHILD", metadata={"child_task_ids"}
    )
    # The parent's termination decides the child's fate: its own failure is refused.
    await rejected(
        c.fail("child"), Code.FAILED_PRECONDITION, "PARENT_TERMINAL", metadata={"parent_task_id", "parent_outcome"}
    )
    await rejected(c.complete("child", authoritative_at=1), Code.FAILED_PRECONDITION, "PARENT_TERMINAL")
    assert await workspace_state(c) == before
    assert await running.authority.deliver_pending() == 1  # delivery resumes with what is pending
    await c.eventually("child", cancelled)
    assert (await c.resume("parent", generation=2)).task.generation == 2


def test_every_reason_of_the_catalogue_is_covered_and_matches_the_contract():
    # An EnumTypeWrapper is not iterable: keys() it is.
    contract = {name for name in lifecycle_errors.ErrorReason.keys() if name != "ERROR_REASON_UNSPECIFIED"}  # noqa: SIM118
    assert {reason.name for reason in Reason} == contract
    for reason in Reason:
        assert lifecycle_errors.ErrorReason.Value(reason.name) >= 1
    covered_here = {name.split("/")[0] for name in REJECTIONS}
    # Bad input, storage and watch reasons have tests of their own (below and in test_watch.py).
    covered_elsewhere = {
        "FIELD_REQUIRED",
        "FIELD_MALFORMED",
        "FIELD_TOO_LONG",
        "ENUM_UNSPECIFIED",
        "VALUE_OUT_OF_RANGE",
        "STORAGE_UNAVAILABLE",
        "WATCH_OVERFLOW",
        "SERVER_SHUTTING_DOWN",  # test_watch.py and tests/reliability/test_shutdown.py
        # tests/security: the authorization matrix and the resource limits.
        "CREDENTIALS_MISSING",
        "CREDENTIALS_INVALID",
        "CREDENTIALS_EXPIRED",
        "WORKSPACE_NOT_GRANTED",
        "ROLE_NOT_PERMITTED",
        "RATE_LIMITED",
        "MESSAGE_TOO_LARGE",
        "WATCHERS_EXHAUSTED",
    }
    # Not producible on purpose: the caller's deadline has normally expired on its own
    # side first, and an internal fault is a bug.
    unreachable = {"DEADLINE_EXPIRED", "INTERNAL_FAULT"}
    assert covered_here | covered_elsewhere | unreachable == contract


# ---------------------------------------------------------------------------
# Bad input on every RPC.

NOW_TS = ts(1_700_000_000_000_000)
MUTATING = [
    "RegisterTask",
    "ActivateGeneration",
    "SuspendGeneration",
    "ResumeWithGeneration",
    "RequestCancellation",
    "SettleCancellation",
    "SettleCompletion",
    "SettleFailure",
    "SettleTimeout",
    "PropagateParentTermination",
    "SetWorkStatus",
]
READS = ["GetTask", "ListTasks", "ListLifecycleEvents", "WatchLifecycleEvents"]
WITH_GENERATION = [rpc for rpc in MUTATING if rpc != "RegisterTask"]
WITH_REQUIRED_TASK = [rpc for rpc in MUTATING + READS if rpc not in ("ListTasks", "WatchLifecycleEvents")]
WITH_TASK = WITH_REQUIRED_TASK + ["WatchLifecycleEvents"]
ON_EXISTING_TASK = [rpc for rpc in WITH_REQUIRED_TASK if rpc != "RegisterTask"]


def base_request(rpc: str, workspace: str = WS, task_id: str = "t1"):
    """A well-formed request of `rpc` (about the existing task t1 where it names one)."""
    request_type = getattr(lifecycle_messages, f"{rpc}Request")
    if rpc == "RegisterTask":
        return request_type(workspace_id=workspace, task_id="new-task")
    if rpc == "ListTasks":
        return request_type(workspace_id=workspace)
    if rpc == "WatchLifecycleEvents":
        return request_type(workspace_id=workspace)
    if rpc in READS:
        return request_type(workspace_id=workspace, task_id=task_id)
    request = request_type(workspace_id=workspace, task_id=task_id, generation=1)
    if rpc == "SettleCompletion":
        request.completion_id = "cmp-1"
        request.authoritative_time.CopyFrom(NOW_TS)
    if rpc == "SetWorkStatus":
        request.work_status = lifecycle_enums.WORK_STATUS_IN_PROGRESS
    return request


async def call(stub, rpc: str, request):
    if rpc == "WatchLifecycleEvents":
        stream = stub.WatchLifecycleEvents(request)
        try:
            return await asyncio.wait_for(stream.read(), timeout=0.5)
        except TimeoutError:
            return None  # a valid watch with nothing to deliver yet
        finally:
            stream.cancel()
    return await getattr(stub, rpc)(request)


def setter(path: str, value):
    def mutate(request):
        *parents, leaf = path.split(".")
        target = request
        for name in parents:
            target = getattr(target, name)
        setattr(target, leaf, value)

    return mutate


def clearer(name: str):
    return lambda request: request.ClearField(name)


def originating_ids(ids: dict):
    return lambda request: request.cause.originating_ids.update(ids)


def parent_link(**fields):
    def mutate(request):
        link = {"task_id": "t1", "generation": 1, "mode": lifecycle_enums.PARENT_LINK_MODE_ATTACHED}
        link.update(fields)
        request.parent.CopyFrom(lifecycle_types.ParentLink(**link))

    return mutate


def nanos(value):
    return lambda request: setattr(request.authoritative_time, "nanos", value)


BAD_INPUT = [
    # (name, rpcs, mutation, reason, field)
    ("workspace-empty", MUTATING + READS, setter("workspace_id", ""), "FIELD_REQUIRED", "workspace_id"),
    ("workspace-space", MUTATING + READS, setter("workspace_id", "a b"), "FIELD_MALFORMED", "workspace_id"),
    ("workspace-nul", MUTATING + READS, setter("workspace_id", "\x00"), "FIELD_MALFORMED", "workspace_id"),
    ("workspace-not-nfc", MUTATING + READS, setter("workspace_id", "cafe\u0301"), "FIELD_MALFORMED", "workspace_id"),
    ("workspace-too-long", MUTATING + READS, setter("workspace_id", "w" * 129), "FIELD_TOO_LONG", "workspace_id"),
    ("task-empty", WITH_REQUIRED_TASK, setter("task_id", ""), "FIELD_REQUIRED", "task_id"),
    ("task-space", WITH_TASK, setter("task_id", "a b"), "FIELD_MALFORMED", "task_id"),
    ("task-nul", WITH_TASK, setter("task_id", "t\x001"), "FIELD_MALFORMED", "task_id"),
    ("task-newline", WITH_TASK, setter("task_id", "t1\n"), "FIELD_MALFORMED", "task_id"),
    ("task-too-long", WITH_TASK, setter("task_id", "t" * 129), "FIELD_TOO_LONG", "task_id"),
    ("generation-zero", WITH_GENERATION, setter("generation", 0), "VALUE_OUT_OF_RANGE", "generation"),
    ("generation-negative", WITH_GENERATION, setter("generation", -1), "VALUE_OUT_OF_RANGE", "generation"),
    ("generation-beyond-2^53", WITH_GENERATION, setter("generation", 2**53), "VALUE_OUT_OF_RANGE", "generation"),
    ("request-id-malformed", MUTATING, setter("request_id", "a b"), "FIELD_MALFORMED", "request_id"),
    ("request-id-too-long", MUTATING, setter("request_id", "r" * 129), "FIELD_TOO_LONG", "request_id"),
    (
        "expected-revision-negative",
        MUTATING,
        setter("expected_revision", -1),
        "VALUE_OUT_OF_RANGE",
        "expected_revision",
    ),
    ("cause-reason-too-long", MUTATING, setter("cause.reason", "x" * 1025), "FIELD_TOO_LONG", "cause.reason"),
    ("cause-source-too-long", MUTATING, setter("cause.source", "s" * 129), "FIELD_TOO_LONG", "cause.source"),
    (
        "cause-too-many-ids",
        MUTATING,
        originating_ids({f"k{n}": "v" for n in range(17)}),
        "VALUE_OUT_OF_RANGE",
        "cause.originating_ids",
    ),
    (
        "cause-id-key-malformed",
        MUTATING,
        originating_ids({"a b": "v"}),
        "FIELD_MALFORMED",
        "cause.originating_ids['a b']",
    ),
    (
        "cause-id-value-too-long",
        MUTATING,
        originating_ids({"run_id": "v" * 257}),
        "FIELD_TOO_LONG",
        "cause.originating_ids['run_id']",
    ),
    ("work-status-unspecified", ["SetWorkStatus"], setter("work_status", 0), "ENUM_UNSPECIFIED", "work_status"),
    (
        "work-status-unknown",
        ["SetWorkStatus", "ActivateGeneration"],
        setter("work_status", 99),
        "ENUM_UNSPECIFIED",
        "work_status",
    ),
    (
        "work-status-done",
        ["SetWorkStatus", "ActivateGeneration"],
        setter("work_status", lifecycle_enums.WORK_STATUS_DONE),
        "WORK_STATUS_RESERVED",
        "work_status",
    ),
    (
        "work-status-cancelled",
        ["SetWorkStatus", "ActivateGeneration"],
        setter("work_status", lifecycle_enums.WORK_STATUS_CANCELLED),
        "WORK_STATUS_RESERVED",
        "work_status",
    ),
    ("parent-mode-unspecified", ["RegisterTask"], parent_link(mode=0), "ENUM_UNSPECIFIED", "parent.mode"),
    ("parent-generation-zero", ["RegisterTask"], parent_link(generation=0), "VALUE_OUT_OF_RANGE", "parent.generation"),
    ("parent-task-empty", ["RegisterTask"], parent_link(task_id=""), "FIELD_REQUIRED", "parent.task_id"),
    ("parent-task-malformed", ["RegisterTask"], parent_link(task_id="a b"), "FIELD_MALFORMED", "parent.task_id"),
    ("parent-is-itself", ["RegisterTask"], parent_link(task_id="new-task"), "FIELD_MALFORMED", "parent.task_id"),
    ("completion-id-empty", ["SettleCompletion"], setter("completion_id", ""), "FIELD_REQUIRED", "completion_id"),
    (
        "completion-id-malformed",
        ["SettleCompletion"],
        setter("completion_id", "a b"),
        "FIELD_MALFORMED",
        "completion_id",
    ),
    (
        "authoritative-time-missing",
        ["SettleCompletion"],
        clearer("authoritative_time"),
        "FIELD_REQUIRED",
        "authoritative_time",
    ),
    ("authoritative-time-bad-nanos", ["SettleCompletion"], nanos(-1), "FIELD_MALFORMED", "authoritative_time"),
    (
        "authoritative-at-year-10000",
        ["SettleCompletion"],
        setter("authoritative_time.seconds", 253402300800),
        "FIELD_MALFORMED",
        "authoritative_time",
    ),
    (
        "page-size-negative",
        ["ListTasks", "ListLifecycleEvents"],
        setter("page_size", -1),
        "VALUE_OUT_OF_RANGE",
        "page_size",
    ),
    (
        "page-size-too-big",
        ["ListTasks", "ListLifecycleEvents"],
        setter("page_size", 1001),
        "VALUE_OUT_OF_RANGE",
        "page_size",
    ),
    (
        "page-token-garbage",
        ["ListTasks", "ListLifecycleEvents"],
        setter("page_token", "%%%"),
        "FIELD_MALFORMED",
        "page_token",
    ),
    ("parent-filter-malformed", ["ListTasks"], setter("parent_task_id", "a b"), "FIELD_MALFORMED", "parent_task_id"),
    (
        "after-sequence-negative",
        ["WatchLifecycleEvents"],
        setter("after_sequence", -1),
        "VALUE_OUT_OF_RANGE",
        "after_sequence",
    ),
]
BAD_INPUT_CASES = [
    pytest.param(rpc, mutation, reason, field, id=f"{rpc}-{name}")
    for name, rpcs, mutation, reason, field in BAD_INPUT
    for rpc in rpcs
]


@pytest.fixture
async def with_task(c):
    """t1 exists (ACTIVE) in WS; the other workspace has a task of its own."""
    await c.active("t1")
    await Client(c.stub, OTHER_WS).register("elsewhere")
    return c


@pytest.mark.parametrize("rpc", MUTATING + READS)
async def test_the_base_requests_are_well_formed(with_task, rpc):
    # Guards the bad-input table: without its mutation a request passes validation.
    c = with_task
    try:
        await call(c.stub, rpc, base_request(rpc))
    except grpc.aio.AioRpcError as error:
        assert error.code() != Code.INVALID_ARGUMENT, (rpc, error_info(error))


@pytest.mark.parametrize("rpc, mutation, reason, field", BAD_INPUT_CASES)
async def test_bad_input_is_refused_with_the_field_named_and_changes_nothing(with_task, rpc, mutation, reason, field):
    c = with_task
    request = base_request(rpc)
    mutation(request)
    before = (await workspace_state(c), await workspace_state(c, OTHER_WS))
    error = await rejected(call(c.stub, rpc, request), Code.INVALID_ARGUMENT, reason, field=field)
    if reason == "FIELD_TOO_LONG":
        assert set(error_info(error).metadata) == {"field", "max_length"}
    if reason == "VALUE_OUT_OF_RANGE":
        assert set(error_info(error).metadata) == {"field", "minimum", "maximum"}
    assert (await workspace_state(c), await workspace_state(c, OTHER_WS)) == before


async def test_every_problem_of_a_request_is_reported_at_once(c):
    request = lifecycle_messages.SetWorkStatusRequest(
        workspace_id=WS, task_id="a b", generation=0, work_status=0, request_id="r/1"
    )
    error = await rejected(c.SetWorkStatus(request), Code.INVALID_ARGUMENT, "FIELD_MALFORMED", field="task_id")
    assert [name for name, _ in field_violations(error)] == ["task_id", "generation", "request_id", "work_status"]


async def test_a_malformed_workspace_is_reported_before_anything_else(c):
    # The workspace is checked (and authorized) first, before the request is read.
    request = lifecycle_messages.SetWorkStatusRequest(workspace_id="", task_id="a b", generation=0, work_status=0)
    error = await rejected(c.SetWorkStatus(request), Code.INVALID_ARGUMENT, "FIELD_REQUIRED", field="workspace_id")
    assert [name for name, _ in field_violations(error)] == ["workspace_id"]


@pytest.mark.parametrize("rpc", ON_EXISTING_TASK)
@pytest.mark.parametrize("whose", ["unknown-task", "another-workspaces-task"])
async def test_a_task_that_is_not_in_the_workspace_is_not_found(with_task, rpc, whose):
    c = with_task
    request = base_request(rpc, task_id="ghost") if whose == "unknown-task" else base_request(rpc, workspace=OTHER_WS)
    before = (await workspace_state(c), await workspace_state(c, OTHER_WS))
    error = await rejected(call(c.stub, rpc, request), Code.NOT_FOUND, "TASK_NOT_FOUND", metadata={"task_id"})
    assert error_info(error).metadata["task_id"] == request.task_id
    assert (await workspace_state(c), await workspace_state(c, OTHER_WS)) == before


async def test_workspaces_are_separate(c):
    other = Client(c.stub, OTHER_WS)
    await c.active("t1")
    await c.work("t1", request_id="req-1")
    # The same task id and request id in another workspace are unrelated.
    await other.register("t1", request_id="req-1")
    assert (await other.task("t1")).revision == 1
    assert (await c.task("t1")).revision == 3
    await rejected(other.register("child", parent="t1", generation=1), Code.FAILED_PRECONDITION, "PARENT_NOT_ACTIVE")
    await rejected(Client(c.stub, "ws-3").register("child", parent="t1"), Code.NOT_FOUND, "PARENT_NOT_FOUND")
    assert [
        t.task_id for t in (await c.ListTasks(lifecycle_messages.ListTasksRequest(workspace_id="ws-3"))).tasks
    ] == []


@pytest.mark.parametrize("rpc", MUTATING + READS)
async def test_an_undecodable_request_is_invalid_not_unknown(lifecycle, rpc):
    running, _ = lifecycle
    async with credentials.insecure_channel(running.address) as channel:
        path = f"/{SERVICE_NAME}/{rpc}"
        garbage = b"\x0a\xff\xff\xff\xff\xff"  # a length prefix far beyond the payload
        if rpc == "WatchLifecycleEvents":
            attempt = channel.unary_stream(path)(garbage).read()
        else:
            attempt = channel.unary_unary(path)(garbage)
        await rejected(attempt, Code.INVALID_ARGUMENT, "FIELD_MALFORMED")


# ---------------------------------------------------------------------------
# Idempotency.


async def test_a_request_id_is_scoped_to_its_rpc(c):
    # The same id for another RPC is another request: both apply.
    await c.register("t1", request_id="req-1")
    activated = await c.activate("t1", request_id="req-1")
    assert activated.task.state == lifecycle_enums.GENERATION_STATE_ACTIVE


async def test_a_repeated_request_id_returns_the_original_response_even_after_the_task_moved_on(c, clock):
    await c.active("t1")
    first = await c.work(
        "t1", lifecycle_enums.WORK_STATUS_BLOCKED, request_id="req-1", cause=lifecycle_types.Cause(reason="stuck")
    )
    clock.advance(10_000_000)
    await c.work("t1", lifecycle_enums.WORK_STATUS_IN_PROGRESS)
    before = await c.snapshot("t1")
    again = await c.work(
        "t1", lifecycle_enums.WORK_STATUS_BLOCKED, request_id="req-1", cause=lifecycle_types.Cause(reason="stuck")
    )
    assert again == first
    assert await c.snapshot("t1") == before
    assert before[0].work_status == lifecycle_enums.WORK_STATUS_IN_PROGRESS


async def test_a_lost_reply_can_be_retried_for_every_mutating_rpc(c):
    """Each mutating RPC, sent twice with one request id, applies once."""
    await c.active("parent")
    await c.active("child", parent="parent")
    calls = [
        lambda: c.register("t1", request_id="r-reg"),
        lambda: c.activate("t1", request_id="r-act"),
        lambda: c.work("t1", lifecycle_enums.WORK_STATUS_BLOCKED, request_id="r-work"),
        lambda: c.suspend("t1", request_id="r-sus"),
        lambda: c.resume("t1", request_id="r-res"),
        lambda: c.request_cancellation("t1", request_id="r-rc"),
        lambda: c.complete("t1", authoritative_at=1, request_id="r-cmp"),
        lambda: c.resume("t1", generation=2, request_id="r-gen2"),
        lambda: c.time_out("t1", generation=2, request_id="r-to"),
        lambda: c.resume("t1", generation=3, request_id="r-gen3"),
        lambda: c.request_cancellation("t1", generation=3, request_id="r-rc3"),
        lambda: c.settle_cancellation("t1", generation=3, request_id="r-sc"),
        lambda: c.resume("t1", generation=4, request_id="r-gen4"),
        lambda: c.fail("t1", generation=4, request_id="r-fail"),
        lambda: c.fail("parent", request_id="r-parent"),
        lambda: c.propagate("child", request_id="r-ppt"),
    ]
    for attempt in calls:
        first = await attempt()
        assert await attempt() == first
    history = await c.events("t1")
    assert [e.revision for e in history] == list(range(1, 15))


# ---------------------------------------------------------------------------
# The cancellation proof over the wire.


@pytest.mark.parametrize("offset_ms", [500, 2000])
async def test_a_completion_passes_the_fence_only_with_proof(start_lifecycle, clock, offset_ms):
    _, stub = await start_lifecycle(max_clock_offset_ms=offset_ms)
    c = Client(stub)
    for task_id in ("proven", "equal", "later"):
        await c.active(task_id)
        await c.request_cancellation(task_id)
    fence = clock.now_micros()
    offset = offset_ms * 1000
    clock.advance(3_000_000)
    done = await c.complete("proven", authoritative_at=fence - offset - 1)
    assert done.task.outcome == lifecycle_enums.TERMINAL_OUTCOME_COMPLETED
    assert micros(done.event.authoritative_time) == fence - offset - 1
    for task_id, at in (("equal", fence - offset), ("later", fence + 1)):
        error = await rejected(
            c.complete(task_id, authoritative_at=at),
            Code.FAILED_PRECONDITION,
            "CANCELLATION_FENCED",
            metadata={"cancellation_request_time", "fenced_task_id", "max_clock_offset_ms"},
        )
        assert dict(error_info(error).metadata) == {
            "cancellation_request_time": instant(fence),
            "fenced_task_id": task_id,
            "max_clock_offset_ms": str(offset_ms),
        }
    # Missing proof is not proof.
    request = lifecycle_messages.SettleCompletionRequest(
        workspace_id=WS, task_id="equal", generation=1, completion_id="cmp-1"
    )
    await rejected(c.SettleCompletion(request), Code.INVALID_ARGUMENT, "FIELD_REQUIRED", field="authoritative_time")
    assert (await c.task("equal")).state == ACTIVE
    # Failure cannot pass a fence at all; the cancellation can still be settled.
    await rejected(c.fail("later"), Code.FAILED_PRECONDITION, "CANCELLATION_FENCED")
    assert (await c.settle_cancellation("later")).task.outcome == lifecycle_enums.TERMINAL_OUTCOME_CANCELLED


# ---------------------------------------------------------------------------
# Parents and children.


def fenced(task):
    return task.cancellation == lifecycle_enums.CANCELLATION_STATE_REQUESTED


def cancelled(task):
    return task.state == TERMINAL and task.outcome == lifecycle_enums.TERMINAL_OUTCOME_CANCELLED


async def test_parent_cancellation_propagates_to_attached_children_only(c):
    await c.active("parent")
    await c.active("child", parent="parent")
    await c.register("waiting-child", parent="parent")
    await c.active("detached", parent="parent", mode=lifecycle_enums.PARENT_LINK_MODE_DETACHED)
    await c.active("grandchild", parent="child")
    await c.request_cancellation("parent")
    for task_id in ("child", "waiting-child", "grandchild"):
        task = await c.eventually(task_id, fenced)
        assert task.state != TERMINAL
    # A fenced child can start no new work, nor complete without proof.
    await rejected(c.work("child"), Code.FAILED_PRECONDITION, "CANCELLATION_FENCED")
    await rejected(c.activate("waiting-child"), Code.FAILED_PRECONDITION, "CANCELLATION_FENCED")
    await rejected(
        c.complete("child", authoritative_at=2_000_000_000_000_000), Code.FAILED_PRECONDITION, "CANCELLATION_FENCED"
    )
    await rejected(c.register("late-child", parent="parent"), Code.FAILED_PRECONDITION, "PARENT_CANCELLATION_FENCED")

    await c.settle_cancellation("parent")
    for task_id in ("child", "waiting-child", "grandchild"):
        task = await c.eventually(task_id, cancelled)
        assert task.work_status == lifecycle_enums.WORK_STATUS_CANCELLED
    detached = await c.task("detached")
    assert (detached.state, detached.cancellation) == (ACTIVE, lifecycle_enums.CANCELLATION_STATE_NONE)
    # The detached child governs itself.
    await c.complete("detached", authoritative_at=1)
    child_events = await c.events("child")
    assert [e.intent for e in child_events][-2:] == [
        lifecycle_enums.INTENT_REQUEST_CANCELLATION,
        lifecycle_enums.INTENT_SETTLE_CANCELLATION,
    ]
    assert child_events[-1].cause.source == "lifecycle_service"
    assert child_events[-1].cause.originating_ids["parent_task_id"] == "parent"


@pytest.mark.parametrize("settle", ["fail", "time_out"])
async def test_parent_failure_terminates_attached_descendants(c, settle):
    await c.active("parent")
    await c.active("child", parent="parent")
    await c.active("grandchild", parent="child")
    await c.active("detached", parent="parent", mode=lifecycle_enums.PARENT_LINK_MODE_DETACHED)
    await getattr(c, settle)("parent")
    for task_id in ("child", "grandchild"):
        task = await c.eventually(task_id, cancelled)
        assert task.work_status == lifecycle_enums.WORK_STATUS_CANCELLED
        history = await c.events(task_id)
        assert [e.intent for e in history].count(lifecycle_enums.INTENT_PROPAGATE_PARENT_TERMINATION) == 1
    assert (await c.task("detached")).state == ACTIVE
    # Calling it directly afterwards is idempotent: the original event comes back.
    direct = await c.propagate("child")
    assert direct.event == (await c.events("child"))[-1]
    # With its children terminal the parent may start a new generation.
    assert (await c.resume("parent", generation=2)).task.generation == 2


async def test_parent_completion_waits_for_attached_children_but_not_detached_ones(c):
    await c.active("parent")
    await c.active("child", parent="parent")
    await c.active("detached", parent="parent", mode=lifecycle_enums.PARENT_LINK_MODE_DETACHED)
    error = await rejected(
        c.complete("parent", authoritative_at=1),
        Code.FAILED_PRECONDITION,
        "ACTIVE_ATTACHED_CHILD",
        metadata={"child_task_ids"},
    )
    assert error_info(error).metadata["child_task_ids"] == "child"
    await c.complete("child", authoritative_at=1)
    done = await c.complete("parent", authoritative_at=1)
    assert done.task.outcome == lifecycle_enums.TERMINAL_OUTCOME_COMPLETED
    assert (await c.task("detached")).state == ACTIVE


async def test_a_child_completion_after_the_parents_fence_is_rejected(c, clock):
    await c.active("parent")
    await c.active("child", parent="parent")
    await c.active("proven-child", parent="parent")
    early = clock.now_micros() - 10_000_000  # durably committed well before the fence
    clock.advance(1_000_000)
    await c.request_cancellation("parent")
    await rejected(
        c.complete("child", authoritative_at=clock.now_micros()), Code.FAILED_PRECONDITION, "CANCELLATION_FENCED"
    )
    done = await c.complete("proven-child", authoritative_at=early)
    assert done.task.outcome == lifecycle_enums.TERMINAL_OUTCOME_COMPLETED


async def test_attached_children_register_only_under_the_current_active_generation(c):
    await c.register("parent")
    await rejected(c.register("child", parent="parent"), Code.FAILED_PRECONDITION, "PARENT_NOT_ACTIVE")
    await c.activate("parent")
    await rejected(
        c.register("child", parent="parent", generation=2), Code.FAILED_PRECONDITION, "PARENT_GENERATION_MISMATCH"
    )
    await c.register("child", parent="parent")
    await c.suspend("parent")
    await rejected(c.activate("child"), Code.FAILED_PRECONDITION, "PARENT_NOT_ACTIVE")
    await c.resume("parent")
    await c.activate("child")
    # Detached children may name any existing generation and need no active parent.
    await c.suspend("parent")
    await c.register("side", parent="parent", mode=lifecycle_enums.PARENT_LINK_MODE_DETACHED)
    await c.activate("side")


async def test_propagations_left_by_a_crash_are_replayed_at_start(start_lifecycle, lifecycle_database, clock):
    path = await lifecycle_database()
    store = await open_store(path)
    policy = Policy()

    async def apply(intent):
        command = Command(intent, lambda s: decide(intent, s, policy))
        await store.write(lambda tx: apply_intent(tx, command, clock.now_micros()))

    await apply(i.RegisterTask(workspace_id=WS, task_id="parent"))
    await apply(i.ActivateGeneration(workspace_id=WS, task_id="parent", generation=1))
    await apply(i.RegisterTask(workspace_id=WS, task_id="child", parent=ParentLink("parent", 1, LinkMode.ATTACHED)))
    await apply(i.SettleFailure(workspace_id=WS, task_id="parent", generation=1))
    assert len(await store.read(lambda tx: tx.events.page(WS, 0, "child", 10))) == 1
    assert len(await store.write(lambda tx: tx.propagations.claim(clock.now_micros(), "test", 1, 10))) == 1
    await store.close()  # the process died before delivering
    clock.advance(1)  # and its claim (where one is kept) has lapsed

    _, stub = await start_lifecycle(database=path)
    c = Client(stub)
    task = await c.eventually("child", cancelled)
    assert task.work_status == lifecycle_enums.WORK_STATUS_CANCELLED


# ---------------------------------------------------------------------------
# Limits, storage faults and health.


async def test_a_message_larger_than_the_limit_is_resource_exhausted(start_lifecycle):
    _, stub = await start_lifecycle(max_message_bytes=32 * 1024)
    c = Client(stub)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await c.register("t1", cause=lifecycle_types.Cause(reason="x" * 40_000))
    assert caught.value.code() == Code.RESOURCE_EXHAUSTED
    await rejected(c.get("t1"), Code.NOT_FOUND, "TASK_NOT_FOUND")
    # Just under the limit the request is read and judged on its content.
    await rejected(
        c.register("t1", cause=lifecycle_types.Cause(reason="x" * 30_000)),
        Code.INVALID_ARGUMENT,
        "FIELD_TOO_LONG",
        field="cause.reason",
    )


async def _health(channel, service=""):
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        return (await stub.Check(health_pb2.HealthCheckRequest(service=service))).status
    except grpc.aio.AioRpcError as error:  # before the first probe has reported
        assert error.code() == Code.NOT_FOUND
        return None


async def _eventually_health(channel, status, timeout=30.0, service=""):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        current = await _health(channel, service)
        if current == status:
            return
        assert loop.time() < deadline, f"health stayed {current}"
        await asyncio.sleep(0.05)


class SqliteBlocker:
    """Holds the SQLite file's write lock."""

    def __init__(self, path: str) -> None:
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("BEGIN EXCLUSIVE")

    def release(self) -> None:
        self._db.execute("ROLLBACK")
        self._db.close()


class PostgresBlocker:
    """Holds locks that stop every write and the writability probe, but not reads."""

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(url)
        self._conn.execute("LOCK TABLE funnel_lifecycle.schema_migrations, funnel_lifecycle.tasks IN EXCLUSIVE MODE")

    def release(self) -> None:
        self._conn.rollback()
        self._conn.close()


async def test_health_reports_not_serving_while_the_database_is_not_writable(start_lifecycle, lifecycle_database):
    path = await lifecycle_database()
    running, stub = await start_lifecycle(database=path, health_interval=0.1)
    c = Client(stub)
    async with credentials.insecure_channel(running.address) as channel:
        # "" starts SERVING; the service's own status appears with the first probe.
        await _eventually_health(channel, health_pb2.HealthCheckResponse.SERVING, service=SERVICE_NAME)
        assert await _health(channel) == health_pb2.HealthCheckResponse.SERVING
        await c.active("t1")

        blocker = await asyncio.to_thread(PostgresBlocker if is_postgres_url(path) else SqliteBlocker, path)
        try:
            await _eventually_health(channel, health_pb2.HealthCheckResponse.NOT_SERVING)
            assert await _health(channel, SERVICE_NAME) == health_pb2.HealthCheckResponse.NOT_SERVING
            # Writes fail closed and retryably, within the caller's deadline (the store gives up
            # waiting for the lock up to 0.1 s before it); reads still work.
            request = lifecycle_messages.SetWorkStatusRequest(
                workspace_id=WS,
                task_id="t1",
                generation=1,
                work_status=lifecycle_enums.WORK_STATUS_IN_PROGRESS,
                request_id="req-1",
            )
            await rejected(
                stub.SetWorkStatus(request, timeout=2.0), Code.UNAVAILABLE, "STORAGE_UNAVAILABLE", metadata=set()
            )
            assert (await c.task("t1")).revision == 2
        finally:
            await asyncio.to_thread(blocker.release)
        await _eventually_health(channel, health_pb2.HealthCheckResponse.SERVING)
        # The retry with the same request id applies it, once.
        done = await c.work("t1", request_id="req-1")
        assert done.task.revision == 3
        assert await c.work("t1", request_id="req-1") == done
