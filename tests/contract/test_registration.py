"""Every service is added to the gRPC server as a generic handler only: for each
*registered* method grpc.aio keeps a request-call task and waits on all of them
for every call it accepts (funnel/runtime/registration.py). The lifecycle server
is started with reflection on and must register nothing as a method, yet answer
its service and health (both reflection versions: test_reflection.py)."""

from __future__ import annotations

import grpc
import grpc.aio._server
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.runtime import registration
from lifecycle_service.api.service import SERVICE_NAME
from tests.conftest import client_channel


async def test_no_service_is_registered_method_by_method(start_lifecycle, monkeypatch):
    registered: list[str] = []
    real = grpc.aio._server.Server.add_registered_method_handlers

    def spy(self, service, handlers):
        registered.append(service)
        return real(self, service, handlers)

    monkeypatch.setattr(grpc.aio._server.Server, "add_registered_method_handlers", spy)
    running, stub = await start_lifecycle(reflection=True)
    assert registered == []

    with pytest.raises(grpc.aio.AioRpcError) as absent:
        await stub.GetTask(lifecycle_messages.GetTaskRequest(workspace_id="ws", task_id="absent"), timeout=10)
    assert absent.value.code() == grpc.StatusCode.NOT_FOUND
    async with client_channel(running.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_a_servicer_that_registers_no_methods_is_refused():
    def old_style(servicer, server):
        server.add_generic_rpc_handlers(())

    with pytest.raises(RuntimeError, match="old_style registered no method handlers"):
        registration.handlers_of(old_style, object())
