"""With --reflection, both services describe themselves over gRPC reflection, v1
(what current tools use) and v1alpha, without credentials, like health."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2

from lifecycle_service.api.service import SERVICE_NAME


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
async def test_reflection_lists_and_describes_the_service(start_lifecycle, version):
    running, _ = await start_lifecycle(reflection=True)
    async with grpc.aio.insecure_channel(running.address) as channel:
        info = channel.stream_stream(
            f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        call = info(timeout=10)
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        listed = {s.name for s in (await call.read()).list_services_response.service}
        assert {SERVICE_NAME, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} <= listed
        await call.write(reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAME))
        files = (await call.read()).file_descriptor_response.file_descriptor_proto
        described = [descriptor_pb2.FileDescriptorProto.FromString(raw) for raw in files]
        [lifecycle] = [d for d in described if d.package == "funnel.lifecycle.v1"]
        assert "TaskLifecycleService" in [s.name for s in lifecycle.service]
        await call.done_writing()
