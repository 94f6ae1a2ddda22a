"""N replicas of each service on one PostgreSQL database, as real processes with
TLS and tokens. Replica i of the completion service settles through replica i of
the lifecycle service. A killed replica restarts on its port."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import grpc

from funnel.completion.v1 import completion_service_pb2_grpc as completion_grpc
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel_cli.supervisor import ServiceProcess, completion_tls_arguments, lifecycle_tls_arguments, spawn
from tests import credentials
from tests.reliability.harness import CHANNEL_OPTIONS, POLICY, unused_port


@dataclass
class Replica:
    name: str
    module: str
    arguments: list[str]
    log: Path
    port: int = field(default_factory=unused_port)
    process: ServiceProcess | None = None
    channel: grpc.aio.Channel | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = spawn(self.name, self.module, ["--listen", self.address, *self.arguments], self.log)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=10)


class Cluster:
    def __init__(self, directory: Path, database_url: str, replicas: int = 2) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._retired: list[grpc.aio.Channel] = []
        policy = directory / "policy.toml"
        policy.write_text(POLICY, encoding="utf-8")
        pki = credentials.PKI
        self.lifecycles = [
            Replica(
                f"lifecycle-{n}",
                "lifecycle_service",
                ["--database", database_url, *lifecycle_tls_arguments(pki)],
                directory / f"lifecycle-{n}.log",
            )
            for n in range(replicas)
        ]
        self.completions = [
            Replica(
                f"completion-{n}",
                "completion_service",
                [
                    "--database",
                    database_url,
                    *completion_tls_arguments(pki),
                    "--lifecycle-address",
                    self.lifecycles[n].address,
                    "--settle-interval",
                    "0.05",
                    "--lifecycle-timeout",
                    "2",
                    "--policy-file",
                    str(policy),
                ],
                directory / f"completion-{n}.log",
            )
            for n in range(replicas)
        ]

    def start(self) -> Cluster:
        for replica in self.lifecycles + self.completions:
            replica.start()
        return self

    def lifecycle(self, n: int) -> lifecycle_grpc.TaskLifecycleServiceStub:
        return lifecycle_grpc.TaskLifecycleServiceStub(self._channel(self.lifecycles[n], lifecycle=True))

    def completion(self, n: int) -> completion_grpc.CompletionServiceStub:
        return completion_grpc.CompletionServiceStub(self._channel(self.completions[n], lifecycle=False))

    def _channel(self, replica: Replica, *, lifecycle: bool) -> grpc.aio.Channel:
        if replica.channel is None:
            if lifecycle:
                replica.channel = credentials.tls_channel(replica.address, options=CHANNEL_OPTIONS)
            else:
                replica.channel = credentials.tls_channel(replica.address, identity=None, options=CHANNEL_OPTIONS)
        return replica.channel

    async def restart(self, replica: Replica) -> None:
        """Starts a killed replica again on its port, with a fresh channel. The old
        channel is closed only at the end: closing it now would cancel the calls
        still waiting on it, which must instead fail over to another replica."""
        if replica.channel is not None:
            self._retired.append(replica.channel)
            replica.channel = None
        replica.start()

    async def stop(self) -> None:
        for channel in self._retired:
            await channel.close()
        for replica in self.completions + self.lifecycles:
            if replica.channel is not None:
                await replica.channel.close()
            replica.stop()
