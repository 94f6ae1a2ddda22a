"""`python -m funnel.runtime.healthcheck`, the command the image's HEALTHCHECK and
the Kubernetes probes run, against real service processes with TLS: the
lifecycle service requires a client certificate, the completion service does not."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from funnel.runtime import healthcheck
from funnel_cli.supervisor import completion_tls_arguments, lifecycle_tls_arguments, spawn
from tests.credentials import PKI

PROBE_CLIENT = ["--ca", str(PKI.ca), "--cert", str(PKI.cert("client")), "--key", str(PKI.key("client"))]


def check(*argv: str) -> tuple[bool, str]:
    return healthcheck.check(healthcheck.parse_args(list(argv)))


@pytest.fixture(scope="module")
def lifecycle(tmp_path_factory):
    directory = tmp_path_factory.mktemp("healthcheck")
    service = spawn(
        "lifecycle_service",
        "lifecycle_service",
        [
            "--listen",
            "127.0.0.1:0",
            "--database",
            str(directory / "lifecycle.sqlite3"),
            "--health-interval",
            "0.2",
            *lifecycle_tls_arguments(PKI),
        ],
        directory / "lifecycle.log",
    )
    yield service, directory / "lifecycle.sqlite3"
    assert service.stop() == 0


def test_the_command_passes_on_a_serving_lifecycle_service_with_the_probe_client_certificate(lifecycle):
    service, _ = lifecycle
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "funnel.runtime.healthcheck",
            service.address,
            *PROBE_CLIENT,
            "--server-name",
            "localhost",
            "--service",
            "funnel.lifecycle.v1.TaskLifecycleService",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"{service.address}: SERVING"), done.stderr


def test_the_options_come_from_the_environment_as_in_the_image(lifecycle):
    service, _ = lifecycle
    env = {
        "FUNNEL_HEALTHCHECK_ADDRESS": service.address,
        "FUNNEL_HEALTHCHECK_CA": str(PKI.ca),
        "FUNNEL_HEALTHCHECK_CERT": str(PKI.cert("client")),
        "FUNNEL_HEALTHCHECK_KEY": str(PKI.key("client")),
    }
    done = subprocess.run(
        [sys.executable, "-m", "funnel.runtime.healthcheck"], capture_output=True, text=True, timeout=30, env=env
    )
    assert done.returncode == 0, done.stderr
    without = subprocess.run(
        [sys.executable, "-m", "funnel.runtime.healthcheck"], capture_output=True, text=True, timeout=30, env={}
    )
    assert without.returncode != 0 and "FUNNEL_HEALTHCHECK_ADDRESS" in without.stderr


def test_without_a_client_certificate_the_lifecycle_service_refuses_the_probe(lifecycle):
    service, _ = lifecycle
    healthy, message = check(service.address, "--ca", str(PKI.ca))
    assert not healthy and "UNAVAILABLE" in message


def test_an_unknown_service_name_fails(lifecycle):
    service, _ = lifecycle
    assert check(service.address, *PROBE_CLIENT, "--service", "no.such.Service") == (
        False,
        f"{service.address}: NOT_FOUND",
    )


def _wait_for_status(address: str, wanted: int) -> None:
    credentials = grpc.ssl_channel_credentials(
        PKI.ca.read_bytes(), PKI.key("client").read_bytes(), PKI.cert("client").read_bytes()
    )
    with grpc.secure_channel(address, credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 20
        while stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status != wanted:
            assert time.monotonic() < deadline, "the service did not change its health status"
            time.sleep(0.05)


def test_an_unwritable_database_fails_readiness_but_not_liveness(lifecycle):
    service, database = lifecycle
    blocker = sqlite3.connect(database, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        _wait_for_status(service.address, health_pb2.HealthCheckResponse.NOT_SERVING)
        assert check(service.address, *PROBE_CLIENT) == (False, f"{service.address}: NOT_SERVING")
        assert check(service.address, *PROBE_CLIENT, "--alive") == (True, f"{service.address}: NOT_SERVING")
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    _wait_for_status(service.address, health_pb2.HealthCheckResponse.SERVING)
    assert check(service.address, *PROBE_CLIENT) == (True, f"{service.address}: SERVING")


def test_the_completion_service_needs_only_the_ca(tmp_path):
    service = spawn(
        "completion_service",
        "completion_service",
        [
            "--listen",
            "127.0.0.1:0",
            "--database",
            str(tmp_path / "completion.sqlite3"),
            "--lifecycle-address",
            "127.0.0.1:1",
            *completion_tls_arguments(PKI),
        ],
        tmp_path / "completion.log",
    )
    try:
        assert check(service.address, "--ca", str(PKI.ca)) == (True, f"{service.address}: SERVING")
        healthy, message = check(service.address)  # the system roots do not know the local CA
        assert not healthy and "UNAVAILABLE" in message
    finally:
        assert service.stop() == 0


def test_nothing_listening_and_unreadable_files_fail_with_the_reason(tmp_path):
    healthy, message = check("127.0.0.1:1", "--ca", str(PKI.ca))
    assert not healthy and "UNAVAILABLE" in message
    assert check("127.0.0.1:1", "--ca", str(tmp_path / "missing.pem")) == (
        False,
        f"cannot read CA bundle {str(tmp_path / 'missing.pem')!r}: No such file or directory",
    )
