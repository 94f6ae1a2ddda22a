"""Client-side helpers for the lifecycle gRPC tests: a thin typed client and error assertions."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.grpc_errors import error_info, field_violations

DOMAIN = "funnel.lifecycle.v1"
WS = "ws-1"
Code = grpc.StatusCode


def ts(micros: int) -> Timestamp:
    seconds, rest = divmod(micros, 1_000_000)
    return Timestamp(seconds=seconds, nanos=rest * 1000)


def micros(timestamp) -> int:
    return timestamp.seconds * 1_000_000 + timestamp.nanos // 1000


async def rejected(
    awaitable, code: grpc.StatusCode, reason: str, *, metadata: set[str] | None = None, field: str | None = None
):
    """Awaits a call that must fail with `code` and one ErrorInfo of this service with
    `reason` (and exactly the `metadata` keys, when given). With `field`, the error
    names that field in ErrorInfo and in a BadRequest violation."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await awaitable
    error = caught.value
    assert error.code() == code, (error.code(), error.details())
    info = error_info(error)
    assert info is not None, error.details()
    assert (info.reason, info.domain) == (reason, DOMAIN), (info.reason, error.details())
    if metadata is not None:
        assert set(info.metadata) == metadata, dict(info.metadata)
    if field is not None:
        assert info.metadata["field"] == field
        assert field in [name for name, _ in field_violations(error)], field_violations(error)
    return error


class Client:
    """The lifecycle API for one workspace, with defaults that keep tests short."""

    def __init__(self, stub, workspace: str = WS) -> None:
        self.stub = stub
        self.ws = workspace

    def __getattr__(self, name):
        return getattr(self.stub, name)

    async def register(
        self, task_id, *, parent=None, generation=1, mode=lifecycle_enums.PARENT_LINK_MODE_ATTACHED, **kw
    ):
        request = lifecycle_messages.RegisterTaskRequest(workspace_id=self.ws, task_id=task_id, **kw)
        if parent:
            request.parent.CopyFrom(lifecycle_types.ParentLink(task_id=parent, generation=generation, mode=mode))
        return await self.stub.RegisterTask(request)

    async def activate(self, task_id, generation=1, **kw):
        return await self.stub.ActivateGeneration(
            lifecycle_messages.ActivateGenerationRequest(
                workspace_id=self.ws, task_id=task_id, generation=generation, **kw
            )
        )

    async def active(self, task_id, **register_kw):
        await self.register(task_id, **register_kw)
        return await self.activate(task_id)

    async def suspend(self, task_id, generation=1, **kw):
        return await self.stub.SuspendGeneration(
            lifecycle_messages.SuspendGenerationRequest(
                workspace_id=self.ws, task_id=task_id, generation=generation, **kw
            )
        )

    async def resume(self, task_id, generation=1, **kw):
        return await self.stub.ResumeWithGeneration(
            lifecycle_messages.ResumeWithGenerationRequest(
                workspace_id=self.ws, task_id=task_id, generation=generation, **kw
            )
        )

    async def request_cancellation(self, task_id, generation=1, **kw):
        return await self.stub.RequestCancellation(
            lifecycle_messages.RequestCancellationRequest(
                workspace_id=self.ws, task_id=task_id, generation=generation, **kw
            )
        )

    async def settle_cancellation(self, task_id, generation=1, **kw):
        return await self.stub.SettleCancellation(
            lifecycle_messages.SettleCancellationRequest(
                workspace_id=self.ws, task_id=task_id, generation=generation, **kw
            )
        )

    async def complete(self, task_id, generation=1, *, completion_id="cmp-1", authoritative_at=None, **kw):
        request = lifecycle_messages.SettleCompletionRequest(
            workspace_id=self.ws, task_id=task_id, generation=generation, completion_id=completion_id, **kw
        )
        if authoritative_at is not None:
            request.authoritative_time.CopyFrom(ts(authoritative_at))
        return await self.stub.SettleCompletion(request)

    async def fail(self, task_id, generation=1, **kw):
        return await self.stub.SettleFailure(
            lifecycle_messages.SettleFailureRequest(workspace_id=self.ws, task_id=task_id, generation=generation, **kw)
        )

    async def time_out(self, task_id, generation=1, **kw):
        return await self.stub.SettleTimeout(
            lifecycle_messages.SettleTimeoutRequest(workspace_id=self.ws, task_id=task_id, generation=generation, **kw)
        )

    async def propagate(self, task_id, generation=1, **kw):
        return await self.stub.PropagateParentTermination(
            lifecycle_messages.PropagateParentTerminationRequest(
                workspace_id=self.ws, task_id=task_id, generation=generation, **kw
            )
        )

    async def work(self, task_id, status=lifecycle_enums.WORK_STATUS_IN_PROGRESS, generation=1, **kw):
        return await self.stub.SetWorkStatus(
            lifecycle_messages.SetWorkStatusRequest(
                workspace_id=self.ws, task_id=task_id, generation=generation, work_status=status, **kw
            )
        )

    async def get(self, task_id) -> lifecycle_messages.GetTaskResponse:
        return await self.stub.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=self.ws, task_id=task_id))

    async def task(self, task_id) -> lifecycle_types.Task:
        return (await self.get(task_id)).task

    async def events(self, task_id) -> list[lifecycle_types.LifecycleEvent]:
        found, token = [], ""
        while True:
            page = await self.stub.ListLifecycleEvents(
                lifecycle_messages.ListLifecycleEventsRequest(
                    workspace_id=self.ws, task_id=task_id, page_size=1000, page_token=token
                )
            )
            found += page.events
            token = page.next_page_token
            if not token:
                return found

    async def snapshot(self, task_id):
        """What a rejected request must leave unchanged: the record and its history."""
        return await self.task(task_id), await self.events(task_id)

    async def eventually(self, task_id, predicate, timeout: float = 30.0) -> lifecycle_types.Task:
        """Polls GetTask until predicate(task) holds (propagations are asynchronous)."""
        deadline = time.monotonic() + timeout
        while True:
            task = await self.task(task_id)
            if predicate(task):
                return task
            assert time.monotonic() < deadline, f"{task_id} never reached the expected state: {task}"
            await asyncio.sleep(0.02)
