"""The README's Python client example, runnable against `funnel up`:

    export FUNNEL_TOKEN=$(funnel token issue --workspace acme --role host)
    python examples/register_task.py

Registers task `fix-login` in workspace `acme` (a retry with the same request id
returns the same answer) and reads it back. FUNNEL_LIFECYCLE and FUNNEL_TLS point
elsewhere than `funnel up`'s defaults."""

import asyncio
import os
from pathlib import Path

import grpc

from funnel.auth.client import bearer_interceptors
from funnel.lifecycle.v1 import lifecycle_pb2, lifecycle_pb2_grpc


async def main() -> None:
    address = os.environ.get("FUNNEL_LIFECYCLE", "127.0.0.1:50051")
    tls_dir = Path(os.environ.get("FUNNEL_TLS", "funnel-data/tls"))
    token = os.environ["FUNNEL_TOKEN"]
    credentials = grpc.ssl_channel_credentials(
        (tls_dir / "ca.pem").read_bytes(),
        (tls_dir / "client.key").read_bytes(),  # the lifecycle service wants a client certificate
        (tls_dir / "client.pem").read_bytes(),
    )
    async with grpc.aio.secure_channel(
        address, credentials, interceptors=bearer_interceptors(lambda: token)
    ) as channel:
        lifecycle = lifecycle_pb2_grpc.TaskLifecycleServiceStub(channel)
        registered = await lifecycle.RegisterTask(
            lifecycle_pb2.RegisterTaskRequest(
                workspace_id="acme", task_id="fix-login", request_id="register-fix-login"
            ),
            timeout=5,
        )
        task = await lifecycle.GetTask(
            lifecycle_pb2.GetTaskRequest(workspace_id="acme", task_id="fix-login"), timeout=5
        )
        print(f"registered {registered.task.task_id} (revision {registered.task.revision}): generation "
              f"{task.task.generation}, {lifecycle_pb2.GenerationState.Name(task.task.state)}")


if __name__ == "__main__":
    asyncio.run(main())
