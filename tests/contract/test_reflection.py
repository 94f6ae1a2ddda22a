"""With --reflection, both services describe themselves over gRPC reflection, v1
(what current tools use) and v1alpha, without credentials, like health."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2

from funnel.lifecycle.v1 import errors_pb2 as lifecycle_errors
from funnel.lifecycle.v1 import service_pb2 as lifecycle_service_pb2
from funnel.runtime import server as runtime
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
        # The file that declares the service first, then every file it imports.
        assert described[0].name == "funnel/lifecycle/v1/service.proto"
        assert "TaskLifecycleService" in [s.name for s in described[0].service]
        assert {f"funnel/lifecycle/v1/{name}.proto" for name in ("messages", "types", "enums")} <= {
            d.name for d in described
        }
        await call.done_writing()


async def test_reflection_refuses_to_list_a_service_no_file_given_declares():
    """The stubs do not load the file that declares a service: a server that did not
    pass it would list the service and then answer "not found" for its name."""
    server = grpc.aio.server()
    with pytest.raises(ValueError, match="TaskLifecycleService"):
        runtime.enable_reflection(server, [SERVICE_NAME], [lifecycle_errors.DESCRIPTOR])
    runtime.enable_reflection(server, [SERVICE_NAME], [lifecycle_service_pb2.DESCRIPTOR, lifecycle_errors.DESCRIPTOR])
