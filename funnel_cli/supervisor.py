"""Starts the two services as separate processes and waits until both serve."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from funnel.auth.pki import COMPLETION_IDENTITY, LocalPki, ensure_local_pki
from funnel.client.connection import Connection

READY_TIMEOUT = 20.0


class StartupFailed(RuntimeError):
    pass


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen[bytes]
    address: str = ""
    log_path: Path | None = None
    extra: dict[str, object] = field(default_factory=dict)
    # http://…/metrics, when the service was started with --metrics-listen.
    metrics_url: str | None = None

    def stop(self, timeout: float = 10.0) -> int:
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    return self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.process.kill()
            return self.process.wait()
        finally:
            self._close_pipe()

    def kill(self) -> int:
        """Ends the process at once (SIGKILL), as a crash would."""
        try:
            if self.process.poll() is None:
                self.process.kill()
            return self.process.wait()
        finally:
            self._close_pipe()

    def _close_pipe(self) -> None:
        # The read end of the service's stdout: left open, it is reported as unclosed.
        if self.process.stdout is not None:
            self.process.stdout.close()


def spawn(name: str, module: str, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> ServiceProcess:
    """Starts `python -m module args`; stdout carries the one `serving on` line,
    stderr goes to log_path."""
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=subprocess.PIPE,
            stderr=log,
            env={**os.environ, **(env or {})},
            # Its own session: a terminal's Ctrl-C reaches only the supervisor, which
            # then stops each service once, gracefully, with SIGTERM.
            start_new_session=True,
        )
    service = ServiceProcess(name, process, log_path=log_path)
    try:
        service.address = _read_address(service)
    except BaseException:
        service.stop()
        raise
    return service


def _read_address(service: ServiceProcess) -> str:
    deadline = time.monotonic() + READY_TIMEOUT
    stdout = service.process.stdout
    assert stdout is not None, "spawn() pipes the service's stdout"
    pending = b""
    ended = False
    while time.monotonic() < deadline:
        if b"\n" not in pending and not ended:
            # Waited for with the deadline, from the descriptor itself (no buffered
            # reads): a service stuck before its line, or one whose start failed and
            # whose threads keep it alive, must not hang `funnel up`.
            readable, _, _ = select.select([stdout], [], [], max(deadline - time.monotonic(), 0.0))
            if not readable:
                break
            chunk = os.read(stdout.fileno(), 4096)
            ended = not chunk
            pending += chunk
            continue
        raw, newline, pending = pending.partition(b"\n")
        line = raw.decode(errors="replace").strip()
        if line:
            if " metrics on " in line:
                service.metrics_url = line.rsplit(" ", 1)[1]
            if " serving on " in line:
                return line.rsplit(" ", 1)[1]
            continue
        if ended and not newline:
            try:
                service.process.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                break  # stdout closed, the process still there: stopped below
            tail = service.log_path.read_text(errors="replace")[-2000:] if service.log_path else ""
            raise StartupFailed(f"{service.name} exited with code {service.process.returncode}:\n{tail}")
    service.stop()
    raise StartupFailed(f"{service.name} did not start within {READY_TIMEOUT:.0f}s")


async def wait_serving(connection: Connection, address: str, timeout: float = READY_TIMEOUT) -> None:
    """Polls the standard health service until it reports SERVING."""
    deadline = time.monotonic() + timeout
    async with connection.channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                # types-grpcio-health-checking declares HealthStub without its methods.
                check = stub.Check  # type: ignore[attr-defined]
                response = await check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                raise StartupFailed(f"{address} did not report SERVING within {timeout:.0f}s")
            await asyncio.sleep(0.05)


def lifecycle_tls_arguments(pki: LocalPki) -> list[str]:
    """The lifecycle service with the local PKI: TLS, client certificates required
    (the completion service proves its identity with one), tokens for callers."""
    return [
        "--tls-cert",
        str(pki.cert("lifecycle")),
        "--tls-key",
        str(pki.key("lifecycle")),
        "--tls-client-ca",
        str(pki.ca),
        "--jwks-file",
        str(pki.jwks),
        "--completion-identity",
        COMPLETION_IDENTITY,
    ]


def completion_tls_arguments(pki: LocalPki) -> list[str]:
    """The completion service with the local PKI: TLS for its callers (tokens),
    and its client certificate towards the lifecycle service and gates."""
    return [
        "--tls-cert",
        str(pki.cert("completion")),
        "--tls-key",
        str(pki.key("completion")),
        "--jwks-file",
        str(pki.jwks),
        "--lifecycle-ca",
        str(pki.ca),
        "--lifecycle-server-name",
        "localhost",
        "--identity-cert",
        str(pki.cert("completion-identity")),
        "--identity-key",
        str(pki.key("completion-identity")),
        "--gate-ca",
        str(pki.ca),
    ]


def start_pair(
    data_dir: Path,
    lifecycle_listen: str,
    completion_listen: str,
    policy_file: str,
    extra_lifecycle: Sequence[str] = (),
    extra_completion: Sequence[str] = (),
    env: dict[str, str] | None = None,
    database_url: str | None = None,
    lifecycle_metrics: str | None = None,
    completion_metrics: str | None = None,
    reflection: bool = False,
) -> tuple[ServiceProcess, ServiceProcess]:
    """Both services over SQLite files in `data_dir` (or both on the PostgreSQL
    database `database_url`, each in its own schema), with TLS between them and
    tokens for callers, from the local PKI in `data_dir/tls` (created on first start).
    `*_metrics` (HOST:PORT) has a service serve Prometheus metrics there; with
    `reflection` both serve gRPC reflection (grpcurl, `buf curl`)."""
    reflecting = ["--reflection"] if reflection else []
    data_dir.mkdir(parents=True, exist_ok=True)
    pki = ensure_local_pki(data_dir / "tls")
    lifecycle = spawn(
        "lifecycle_service",
        "lifecycle_service",
        [
            "--listen",
            lifecycle_listen,
            "--database",
            database_url or str(data_dir / "lifecycle.sqlite3"),
            *lifecycle_tls_arguments(pki),
            *_metrics_arguments(lifecycle_metrics),
            *reflecting,
            *extra_lifecycle,
        ],
        data_dir / "lifecycle.log",
        env,
    )
    try:
        completion = spawn(
            "completion_service",
            "completion_service",
            [
                "--listen",
                completion_listen,
                "--database",
                database_url or str(data_dir / "completion.sqlite3"),
                "--lifecycle-address",
                lifecycle.address,
                "--policy-file",
                policy_file,
                *completion_tls_arguments(pki),
                *_metrics_arguments(completion_metrics),
                *reflecting,
                *extra_completion,
            ],
            data_dir / "completion.log",
            env,
        )
    except BaseException:
        lifecycle.stop()
        raise
    return lifecycle, completion


def _metrics_arguments(listen: str | None) -> list[str]:
    return ["--metrics-listen", listen] if listen else []
