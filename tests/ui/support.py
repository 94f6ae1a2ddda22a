"""Real services and real `funnel ui` processes for the browser tests, and a
synchronous gRPC driver that walks tasks through the story as a host."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf.duration_pb2 import Duration

from funnel.auth.pki import LocalPki, ensure_local_pki
from funnel.client.connection import Connection
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import completion_service_pb2_grpc as completion_grpc
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import transcript_service_pb2_grpc as transcript_grpc
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime.grpc_errors import retry_delay
from funnel_cli.supervisor import ServiceProcess, lifecycle_tls_arguments, spawn, start_pair
from tests.prometheus import scrape, value
from tests.reliability.harness import unused_port

FUNNEL = Path(sys.executable).parent / "funnel"
# `kids` leaves the open-children check to the lifecycle service (its settlement
# refuses ACTIVE_ATTACHED_CHILD): a completion it commits can be rejected.
POLICY = (
    '[defaults]\nrequired_evidence = []\n\n[workspaces.demo]\nrequired_evidence = ["tests"]\n\n'
    '[workspaces.kids]\ndisabled_gates = ["lifecycle.no_active_children"]\n'
)
CONCURRENT = 64
OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 500)]


@dataclass
class Services:
    """Both services on fixed loopback ports, so the lifecycle service can stop and
    come back where the completion service (and the dashboard) expect it."""

    data: Path
    lifecycle_port: int = field(default_factory=unused_port)
    completion_port: int = field(default_factory=unused_port)
    lifecycle_metrics_port: int = field(default_factory=unused_port)
    lifecycle: ServiceProcess | None = None
    completion: ServiceProcess | None = None

    def start(self) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        (self.data / "policy.toml").write_text(POLICY)
        self.lifecycle, self.completion = start_pair(
            self.data,
            self.lifecycle_address,
            self.completion_address,
            str(self.data / "policy.toml"),
            extra_completion=["--settle-interval", "0.2"],
            env=self.fault_env,
            lifecycle_metrics=self.lifecycle_metrics_address,
        )

    @property
    def lifecycle_address(self) -> str:
        return f"127.0.0.1:{self.lifecycle_port}"

    @property
    def completion_address(self) -> str:
        return f"127.0.0.1:{self.completion_port}"

    @property
    def lifecycle_metrics_address(self) -> str:
        return f"127.0.0.1:{self.lifecycle_metrics_port}"

    def lifecycle_calls(self, method: str) -> float:
        """How many `method` calls the lifecycle service has started (its metrics)."""
        samples = scrape(f"http://{self.lifecycle_metrics_address}/metrics")
        started = value(
            samples,
            "grpc_server_started_total",
            grpc_service="funnel.lifecycle.v1.TaskLifecycleService",
            grpc_method=method,
            grpc_type="unary",
        )
        return started or 0.0

    @property
    def fault_env(self) -> dict[str, str]:
        # The services' own fault points (funnel/runtime/faults.py), off until armed.
        return {"FUNNEL_FAULTS_FILE": str(self.data / "faults")}

    def arm_lifecycle(self, spec: str) -> None:
        fresh = self.data / "faults.tmp"  # a new inode: the service sees the change
        fresh.write_text(spec, encoding="utf-8")
        fresh.replace(self.data / "faults")

    def restart_lifecycle(self) -> None:
        """Stops it (SIGTERM: its watch streams end with SERVER_SHUTTING_DOWN), or
        reaps it if it died, and starts it as start_pair did: same port, same database."""
        assert self.lifecycle is not None
        self.lifecycle.stop()
        self.arm_lifecycle("")
        pki = ensure_local_pki(self.data / "tls")
        self.lifecycle = spawn(
            "lifecycle_service",
            "lifecycle_service",
            [
                "--listen",
                self.lifecycle_address,
                "--database",
                str(self.data / "lifecycle.sqlite3"),
                *lifecycle_tls_arguments(pki),
                "--metrics-listen",
                self.lifecycle_metrics_address,
            ],
            self.data / "lifecycle.log",
            self.fault_env,
        )

    def stop(self) -> None:
        for service in (self.completion, self.lifecycle):
            if service is not None:
                service.stop()

    @contextmanager
    def completion_writes_held(self):
        """Holds the completion database's write lock (as a backup or a long
        transaction of another process would): the service's reads go on, its
        commits wait for the lock (up to their deadline) and land once it is let go."""
        db = sqlite3.connect(self.data / "completion.sqlite3", isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            yield
        finally:
            db.close()  # rolls back what was never written

    def token(self, subject: str, permissions: list[str]) -> str:
        return LocalPki(self.data / "tls").load_signing_key().issue(subject, permissions, 3600)


@dataclass
class Dashboard:
    """A `funnel ui` process; restart() brings it back on the same port."""

    services: Services
    workspaces: list[str]
    action_token: str | None
    port: int = field(default_factory=unused_port)
    process: subprocess.Popen | None = None
    host: str = "127.0.0.1"
    extra: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [
            str(FUNNEL),
            "ui",
            "--listen",
            f"{self.host}:{self.port}",
            "--data-dir",
            str(self.services.data),
            "--lifecycle",
            self.services.lifecycle_address,
            "--completion",
            self.services.completion_address,
            *self.extra,
        ]
        for workspace in self.workspaces:
            command += ["--workspace", workspace]
        if self.action_token:
            command += ["--action-token", self.action_token]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("funnel ui serving on "), line + self.process.stdout.read()

    def kill(self) -> None:
        """As a crash (or a dropped connection) would: every open event stream breaks."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        self.process.stdout.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(15)
            self.process.stdout.close()


class Driver:
    """A host walking tasks through the story (synchronous gRPC)."""

    def __init__(self, services: Services, token: str) -> None:
        pki = LocalPki(services.data / "tls")
        credentials = grpc.ssl_channel_credentials(
            pki.ca.read_bytes(), pki.key("client").read_bytes(), pki.cert("client").read_bytes()
        )
        self.metadata = [("authorization", f"Bearer {token}")]
        self._channels = [
            grpc.secure_channel(address, credentials, options=OPTIONS)
            for address in (services.lifecycle_address, services.completion_address)
        ]
        self.lifecycle = lifecycle_grpc.TaskLifecycleServiceStub(self._channels[0])
        self.completion = completion_grpc.CompletionServiceStub(self._channels[1])
        self.transcripts = transcript_grpc.TranscriptServiceStub(self._channels[1])

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def register(
        self, workspace: str, task_id: str, parent: lifecycle_types.ParentLink | None = None
    ) -> lifecycle_messages.RegisterTaskResponse:
        return self.lifecycle.RegisterTask(
            lifecycle_messages.RegisterTaskRequest(
                workspace_id=workspace,
                task_id=task_id,
                cause=lifecycle_types.Cause(source="test", reason="a task to finish"),
                parent=parent,
            ),
            metadata=self.metadata,
            timeout=10,
        )

    def claim(self, workspace: str, task_id: str, seconds: int = 60) -> completion_messages.ClaimTaskResponse:
        return self.completion.ClaimTask(
            completion_messages.ClaimTaskRequest(
                workspace_id=workspace, task_id=task_id, agent_id="agent-1", lease_ttl=Duration(seconds=seconds)
            ),
            metadata=self.metadata,
            timeout=10,
        )

    def attempt(
        self, workspace: str, claim: completion_messages.ClaimTaskResponse
    ) -> completion_messages.AttemptCompletionResponse:
        return self.completion.AttemptCompletion(
            completion_messages.AttemptCompletionRequest(
                workspace_id=workspace,
                task_id=claim.run.task_id,
                run_id=claim.run.run_id,
                epoch=claim.lease.epoch,
                outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
                result="done; all tests pass",
            ),
            metadata=self.metadata,
            timeout=10,
        )

    def evidence(
        self, workspace: str, claim: completion_messages.ClaimTaskResponse
    ) -> completion_messages.RecordEvidenceResponse:
        return self.completion.RecordEvidence(
            completion_messages.RecordEvidenceRequest(
                workspace_id=workspace,
                task_id=claim.run.task_id,
                generation=claim.run.generation,
                kind="tests",
                verdict=completion_enums.EVIDENCE_VERDICT_PASSED,
                details="pytest: 42 passed",
                run_id=claim.run.run_id,
            ),
            metadata=self.metadata,
            timeout=10,
        )

    def complete_run(
        self,
        workspace: str,
        claim: completion_messages.ClaimTaskResponse,
        outcome: int = completion_enums.RUN_OUTCOME_SUCCEEDED,
    ) -> completion_messages.CompleteRunResponse:
        return self.completion.CompleteRun(
            completion_messages.CompleteRunRequest(
                workspace_id=workspace,
                run_id=claim.run.run_id,
                outcome=outcome,
                tokens_total=1500,
                notes="Implemented the change.",
            ),
            metadata=self.metadata,
            timeout=10,
        )

    def renew(
        self, workspace: str, claim: completion_messages.ClaimTaskResponse, seconds: int
    ) -> completion_messages.RenewLeaseResponse:
        return self.completion.RenewLease(
            completion_messages.RenewLeaseRequest(
                workspace_id=workspace,
                run_id=claim.run.run_id,
                epoch=claim.lease.epoch,
                lease_ttl=Duration(seconds=seconds),
            ),
            metadata=self.metadata,
            timeout=10,
        )

    def append(self, workspace: str, task_id: str, *events: completion_types.SessionEvent) -> None:
        self.transcripts.AppendTranscript(
            transcript_messages.AppendTranscriptRequest(workspace_id=workspace, task_id=task_id, events=events),
            metadata=self.metadata,
            timeout=10,
        )

    def lifecycle_sequences(self, workspace: str, task_id: str) -> list[int]:
        listed = self.lifecycle.ListLifecycleEvents(
            lifecycle_messages.ListLifecycleEventsRequest(workspace_id=workspace, task_id=task_id),
            metadata=self.metadata,
            timeout=10,
        )
        return [event.sequence for event in listed.events]

    def settle_attempts(self, workspace: str, task_id: str) -> int:
        """The settlement attempts of the task's completions so far."""
        listed = self.completion.ListCompletions(
            completion_messages.ListCompletionsRequest(workspace_id=workspace, task_id=task_id),
            metadata=self.metadata,
            timeout=10,
        )
        return sum(completion.settle_attempts for completion in listed.completions)

    def completion_sequences(self, workspace: str, task_id: str) -> list[int]:
        listed = self.completion.ListCompletionEvents(
            completion_messages.ListCompletionEventsRequest(workspace_id=workspace, task_id=task_id),
            metadata=self.metadata,
            timeout=10,
        )
        return [event.sequence for event in listed.events]

    def completed(self, workspace: str, task_id: str) -> completion_messages.ClaimTaskResponse:
        """register -> claim -> evidence -> attempt (ALLOW, settled)."""
        self.register(workspace, task_id)
        claim = self.claim(workspace, task_id)
        self.evidence(workspace, claim)
        allowed = self.attempt(workspace, claim)
        assert allowed.decision.verdict == completion_enums.VERDICT_ALLOW, allowed.decision.instruction
        return claim


async def register_many(services: Services, token: str, workspace: str, task_ids: list[str]) -> None:
    """RegisterTask calls, CONCURRENT at a time on one channel: the fastest honest
    way to fill a workspace (every task through the service's own intent). Faster
    than the service's rate limit allows a caller: a refused call is sent again after
    the delay its RetryInfo names, as a well-behaved client does."""
    pki = LocalPki(services.data / "tls")
    connection = Connection(token, pki.ca.read_bytes(), pki.cert("client").read_bytes(), pki.key("client").read_bytes())
    async with connection.channel(services.lifecycle_address) as channel:
        stub = lifecycle_grpc.TaskLifecycleServiceStub(channel)
        pending = iter(task_ids)

        async def worker() -> None:
            for task_id in pending:
                request = lifecycle_messages.RegisterTaskRequest(workspace_id=workspace, task_id=task_id)
                await honouring_retry_info(lambda request=request: stub.RegisterTask(request, timeout=60))

        await asyncio.gather(*(worker() for _ in range(CONCURRENT)))


async def change_at_rate(
    services: Services, token: str, workspace: str, changes: list[tuple[str, int]], rate: float
) -> float:
    """SetWorkStatus for each (task id, work status) in order, the i-th sent at
    i / `rate` seconds from the start (never earlier; later only if the service
    answers slower than the pace, with at most CONCURRENT calls in flight);
    returns the seconds from the first call to the last answer."""
    pki = LocalPki(services.data / "tls")
    connection = Connection(token, pki.ca.read_bytes(), pki.cert("client").read_bytes(), pki.key("client").read_bytes())
    async with connection.channel(services.lifecycle_address) as channel:
        stub = lifecycle_grpc.TaskLifecycleServiceStub(channel)
        slots = asyncio.Semaphore(CONCURRENT)
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def change(task_id: str, status: int) -> None:
            try:
                request = lifecycle_messages.SetWorkStatusRequest(
                    workspace_id=workspace, task_id=task_id, generation=1, work_status=status
                )
                await honouring_retry_info(lambda: stub.SetWorkStatus(request, timeout=60))
            finally:
                slots.release()

        calls = []
        for number, (task_id, status) in enumerate(changes):
            await asyncio.sleep(max(0.0, started + number / rate - loop.time()))
            await slots.acquire()
            calls.append(asyncio.create_task(change(task_id, status)))
        await asyncio.gather(*calls)
        return loop.time() - started


async def honouring_retry_info(call, give_up_after: float = 300.0):
    """`call()`, again after each RESOURCE_EXHAUSTED for as long as its RetryInfo
    asks, until `give_up_after` seconds have gone by."""
    deadline = time.monotonic() + give_up_after
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as error:
            delay = retry_delay(error)
            if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or delay is None or time.monotonic() > deadline:
                raise
            await asyncio.sleep(delay)


def wait_until(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
