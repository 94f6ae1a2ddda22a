"""`SettleCompletions` over real gRPC, on each engine: each item is answered as
`SettleCompletion` answers it alone (its own fences, its own request id in the
scope of `SettleCompletion`), a refused item refuses only itself, and the call's
own fields are checked before any item is applied."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import code_pb2

from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.runtime.grpc_errors import status_error_info
from tests import credentials
from tests.conftest import CLOCK_START_MICROS, client_channel
from tests.lifecycle.grpc_support import DOMAIN, WS, Client, Code, rejected, ts

pytestmark = pytest.mark.asyncio


@pytest.fixture
def c(lifecycle) -> Client:
    return Client(lifecycle[1])


def item(
    task_id: str, completion_id: str, *, workspace: str = WS, request_id: str = ""
) -> lifecycle_messages.SettleCompletionRequest:
    return lifecycle_messages.SettleCompletionRequest(
        workspace_id=workspace,
        task_id=task_id,
        generation=1,
        completion_id=completion_id,
        authoritative_time=ts(CLOCK_START_MICROS),
        request_id=request_id or f"settle:{completion_id}",
    )


def batch(*items: lifecycle_messages.SettleCompletionRequest) -> lifecycle_messages.SettleCompletionsRequest:
    return lifecycle_messages.SettleCompletionsRequest(workspace_id=WS, items=list(items))


def reason_of(result: lifecycle_messages.SettleCompletionsResult) -> tuple[str, str, str]:
    assert result.WhichOneof("result") == "error", result
    info = status_error_info(result.error)
    assert info is not None, result.error
    return code_pb2.Code.Name(result.error.code), info.reason, info.domain


async def test_each_item_is_settled_as_settle_completion_settles_it_alone(c):
    for task in ("t1", "t2", "t3"):
        await c.active(task)
    await c.request_cancellation("t3")
    answer = await c.SettleCompletions(batch(item("t1", "cmp-1"), item("t2", "cmp-2"), item("t3", "cmp-3")))
    first, second, fenced = answer.results
    for result, task, completion in ((first, "t1", "cmp-1"), (second, "t2", "cmp-2")):
        assert result.WhichOneof("result") == "settled"
        assert result.settled.task.task_id == task
        assert result.settled.task.state == lifecycle_enums.GENERATION_STATE_TERMINAL
        assert result.settled.task.outcome == lifecycle_enums.TERMINAL_OUTCOME_COMPLETED
        assert result.settled.event.completion_id == completion
        assert result.settled == await c.complete(
            task, completion_id=completion, request_id=f"settle:{completion}", authoritative_time=ts(CLOCK_START_MICROS)
        )
    # The refused item refuses only itself, with the reason SettleCompletion gives it.
    assert reason_of(fenced) == ("FAILED_PRECONDITION", "CANCELLATION_FENCED", DOMAIN)
    assert (await c.task("t3")).state == lifecycle_enums.GENERATION_STATE_ACTIVE


async def test_an_items_request_id_is_the_one_of_settle_completion_whichever_way_it_comes(c):
    await c.active("t1")
    await c.active("t2")
    alone = await c.complete(
        "t1", completion_id="cmp-1", request_id="settle:cmp-1", authoritative_time=ts(CLOCK_START_MICROS)
    )
    together = await c.SettleCompletions(batch(item("t1", "cmp-1"), item("t2", "cmp-2")))
    assert together.results[0].settled == alone  # a replay, not a second settlement
    again = await c.complete(
        "t2", completion_id="cmp-2", request_id="settle:cmp-2", authoritative_time=ts(CLOCK_START_MICROS)
    )
    assert again == together.results[1].settled
    assert [e.completion_id for e in await c.events("t1") if e.completion_id] == ["cmp-1"]
    # The same request id for another settlement is refused, for that item alone.
    await c.active("t3")
    reused, fresh = (
        await c.SettleCompletions(batch(item("t3", "cmp-other", request_id="settle:cmp-1"), item("t3", "cmp-3")))
    ).results
    assert reason_of(reused)[1] == "REQUEST_ID_REUSED"
    assert fresh.settled.event.completion_id == "cmp-3"


async def test_an_invalid_item_is_refused_with_its_field_and_the_others_apply(c):
    await c.active("t1")
    broken = item("t9", "cmp-9")
    broken.ClearField("authoritative_time")
    refused, applied = (await c.SettleCompletions(batch(broken, item("t1", "cmp-1")))).results
    assert reason_of(refused) == ("INVALID_ARGUMENT", "FIELD_REQUIRED", DOMAIN)
    assert status_error_info(refused.error).metadata["field"] == "authoritative_time"
    assert applied.settled.task.outcome == lifecycle_enums.TERMINAL_OUTCOME_COMPLETED


@pytest.mark.parametrize(
    ("name", "request_of", "reason", "field"),
    [
        (
            "no workspace",
            lambda: lifecycle_messages.SettleCompletionsRequest(items=[item("t1", "cmp-1")]),
            "FIELD_REQUIRED",
            "workspace_id",
        ),
        ("no items", lambda: lifecycle_messages.SettleCompletionsRequest(workspace_id=WS), "FIELD_REQUIRED", "items"),
        ("65 items", lambda: batch(*(item(f"t{n}", f"cmp-{n}") for n in range(65))), "VALUE_OUT_OF_RANGE", "items"),
        (
            "an item of another workspace",
            lambda: batch(item("t1", "cmp-1"), item("t2", "cmp-2", workspace="ws-2")),
            "FIELD_MALFORMED",
            "items[1].workspace_id",
        ),
    ],
)
async def test_the_calls_own_fields_are_checked_before_any_item_is_applied(c, name, request_of, reason, field):
    await c.active("t1")
    await rejected(c.SettleCompletions(request_of()), Code.INVALID_ARGUMENT, reason, field=field)
    assert (await c.task("t1")).state == lifecycle_enums.GENERATION_STATE_ACTIVE


async def test_a_batch_is_refused_to_a_caller_other_than_the_completion_service(start_lifecycle):
    running, stub = await start_lifecycle()
    await Client(stub).active("t1")
    host = credentials.token("host-1", [f"host:{WS}"])
    async with client_channel(running.address, host) as channel:
        refused = lifecycle_grpc.TaskLifecycleServiceStub(channel).SettleCompletions(batch(item("t1", "cmp-1")))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await refused
    assert caught.value.code() == Code.PERMISSION_DENIED
    assert (await Client(stub).task("t1")).state == lifecycle_enums.GENERATION_STATE_ACTIVE
