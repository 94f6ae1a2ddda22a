"""TLS, mTLS and the refusals, against real service processes.

Every service here is a real `python -m …` process (funnel_cli.supervisor.spawn)
with real certificates of the test PKI (tests/credentials.py): client
certificates required by the lifecycle listener, the completion service's
identity proved by its certificate, plaintext and unauthenticated listeners
refused off loopback, certificates reloaded without a restart (SIGHUP and file
changes, a bad replacement refused), and `funnel token issue`."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import grpc
import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.protobuf.timestamp_pb2 import Timestamp

from funnel.auth.client import bearer_interceptors
from funnel.auth.pki import COMPLETION_IDENTITY, ensure_local_pki, issue_leaf
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.runtime.grpc_errors import error_info
from funnel_cli.supervisor import ServiceProcess, lifecycle_tls_arguments
from tests import credentials
from tests.security.processes import lifecycle_process, log_text

PKI = credentials.PKI
CALL_TIMEOUT = 5.0
# How long a reload may take to show (SIGHUP is handled at once; the periodic
# check below runs every 0.2 s).
RELOAD_WITHIN = 10.0
REFUSAL_TIMEOUT = 30.0
# A new channel must open its own connection, never reuse one of another channel.
FRESH_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


# -- helpers -----------------------------------------------------------------


def port_of(process: ServiceProcess) -> int:
    return int(process.address.rsplit(":", 1)[1])


def channel(address: str, bearer: str | None, identity: str | None, **kwargs) -> grpc.aio.Channel:
    return credentials.tls_channel(address, bearer, identity=identity, **kwargs)


def foreign_channel(address: str, other, trust_other_ca: bool) -> grpc.aio.Channel:
    """A channel presenting the "client" certificate of another CA, trusting that
    CA (`trust_other_ca`) or the test PKI's one, with a token good for everything."""
    ca = (other.ca if trust_other_ca else PKI.ca).read_bytes()
    creds = grpc.ssl_channel_credentials(ca, other.key("client").read_bytes(), other.cert("client").read_bytes())
    return grpc.aio.secure_channel(
        address,
        creds,
        interceptors=bearer_interceptors(lambda: credentials.SUPERUSER),
        options=[("grpc.ssl_target_name_override", "localhost"), *FRESH_CONNECTION],
    )


async def list_tasks(ch: grpc.aio.Channel, workspace: str = "ws-1") -> lifecycle_messages.ListTasksResponse:
    return await lifecycle_grpc.TaskLifecycleServiceStub(ch).ListTasks(
        lifecycle_messages.ListTasksRequest(workspace_id=workspace), timeout=CALL_TIMEOUT
    )


def settle_request() -> lifecycle_messages.SettleCompletionRequest:
    return lifecycle_messages.SettleCompletionRequest(
        workspace_id="ws-1",
        task_id="no-such-task",
        generation=1,
        completion_id="cmp-1",
        authoritative_time=Timestamp(seconds=1_700_000_000),
    )


async def failure(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    return raised.value


def served_certificate(port: int) -> x509.Certificate:
    """The certificate a new TLS connection to 127.0.0.1:port is served, the
    connection presenting the test PKI's client certificate (the listener
    requires one) and verifying the server against the test CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(PKI.ca))
    context.load_cert_chain(str(PKI.cert("client")), str(PKI.key("client")))
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=CALL_TIMEOUT) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der, "no certificate served"
    return x509.load_der_x509_certificate(der)


def served_serial(port: int) -> int:
    return served_certificate(port).serial_number


async def wait_for_serial(port: int, serial: int, within: float = RELOAD_WITHIN) -> None:
    deadline = time.monotonic() + within
    seen = None
    while time.monotonic() < deadline:
        seen = await asyncio.to_thread(served_serial, port)
        if seen == serial:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"new connections still get serial {seen}, not the reloaded {serial}, after {within}s")


def wait_for_log(process: ServiceProcess, text: str, within: float = RELOAD_WITHIN, count: int = 1) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if log_text(process).count(text) >= count:
            return
        time.sleep(0.05)
    pytest.fail(f"{text!r} not logged {count} time(s) within {within}s:\n{log_text(process)[-2000:]}")


def ca_material() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    ca_key = serialization.load_pem_private_key(PKI.key("ca").read_bytes(), password=None)
    return ca_key, x509.load_pem_x509_certificate(PKI.ca.read_bytes())


def new_lifecycle_leaf() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    ca_key, ca_cert = ca_material()
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    return issue_leaf(ca_key, ca_cert, "lifecycle_service", names, server=True, client=False)


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def install(cert_path: Path, key_path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    """Replaces both files (each atomically: a new inode) with `cert` and `key`."""
    write_atomically(
        key_path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    write_atomically(cert_path, cert.public_bytes(serialization.Encoding.PEM))


def copied_tls(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """The "lifecycle" leaf of the test PKI copied under tmp_path, and the
    listener flags that use the copies (client certificates required)."""
    directory = tmp_path / "tls"
    directory.mkdir()
    cert, key = directory / "lifecycle.pem", directory / "lifecycle.key"
    shutil.copyfile(PKI.cert("lifecycle"), cert)
    shutil.copyfile(PKI.key("lifecycle"), key)
    args = [
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
        "--tls-client-ca",
        str(PKI.ca),
        "--jwks-file",
        str(PKI.jwks),
        "--completion-identity",
        COMPLETION_IDENTITY,
    ]
    return cert, key, args


def initial_serial() -> int:
    return x509.load_pem_x509_certificate(PKI.cert("lifecycle").read_bytes()).serial_number


# -- 1. client certificates are required -------------------------------------


async def test_lifecycle_listener_requires_a_client_certificate_of_its_ca(tmp_path):
    other = ensure_local_pki(tmp_path / "other")
    with lifecycle_process(tmp_path, lifecycle_tls_arguments(PKI)) as process:
        address = process.address
        # The test PKI's client certificate and a valid token: served.
        async with channel(address, credentials.SUPERUSER, "client") as ch:
            assert list((await list_tasks(ch)).tasks) == []
            got = await failure(
                lifecycle_grpc.TaskLifecycleServiceStub(ch).GetTask(
                    lifecycle_messages.GetTaskRequest(workspace_id="ws-1", task_id="no-such-task"), timeout=CALL_TIMEOUT
                )
            )
            # Past TLS and authorization: the service itself answered.
            assert got.code() == grpc.StatusCode.NOT_FOUND
            assert error_info(got).reason == "TASK_NOT_FOUND"

        # Certificate and trusted CA both of another CA: no handshake. With a
        # token good for everything, a call that reached the service would succeed.
        async with foreign_channel(address, other, trust_other_ca=True) as ch:
            got = await failure(list_tasks(ch))
            assert got.code() == grpc.StatusCode.UNAVAILABLE, got
            assert error_info(got) is None

        # The client trusts the right CA, but its certificate is another CA's:
        # the listener itself refuses the handshake.
        async with foreign_channel(address, other, trust_other_ca=False) as ch:
            got = await failure(list_tasks(ch))
            assert got.code() == grpc.StatusCode.UNAVAILABLE, got
            assert error_info(got) is None

        # No client certificate at all: refused too, token or not.
        async with channel(address, credentials.SUPERUSER, None, options=FRESH_CONNECTION) as ch:
            got = await failure(list_tasks(ch))
            assert got.code() == grpc.StatusCode.UNAVAILABLE, got
            assert error_info(got) is None

        # The refused connections never reached the service's boundary (it logs
        # every denied call), and the service still serves.
        assert "denied" not in log_text(process)
        async with channel(address, credentials.SUPERUSER, "client", options=FRESH_CONNECTION) as ch:
            assert list((await list_tasks(ch)).tasks) == []


# -- 2. the completion service's identity ------------------------------------


async def test_completion_identity_certificate_may_settle_and_an_operator_may_not(tmp_path):
    with lifecycle_process(tmp_path, lifecycle_tls_arguments(PKI)) as process:
        address = process.address
        # The completion-identity certificate and no token: the completion service,
        # past authorization; the unknown task is the service's own answer.
        async with channel(address, None, "completion-identity") as ch:
            got = await failure(
                lifecycle_grpc.TaskLifecycleServiceStub(ch).SettleCompletion(settle_request(), timeout=CALL_TIMEOUT)
            )
            assert got.code() == grpc.StatusCode.NOT_FOUND, got
            assert error_info(got).reason == "TASK_NOT_FOUND"

        # The local client certificate with an operator token: not permitted.
        async with channel(address, credentials.token("ops", ["*:operator"]), "client") as ch:
            got = await failure(
                lifecycle_grpc.TaskLifecycleServiceStub(ch).SettleCompletion(settle_request(), timeout=CALL_TIMEOUT)
            )
            assert got.code() == grpc.StatusCode.PERMISSION_DENIED, got
            assert error_info(got).reason == "ROLE_NOT_PERMITTED"

        # Where client certificates are verified, a token naming the completion
        # identity does not stand in for its certificate.
        async with channel(address, credentials.token(COMPLETION_IDENTITY, ["*:operator"]), "client") as ch:
            got = await failure(
                lifecycle_grpc.TaskLifecycleServiceStub(ch).SettleCompletion(settle_request(), timeout=CALL_TIMEOUT)
            )
            assert got.code() == grpc.StatusCode.PERMISSION_DENIED, got
            assert error_info(got).reason == "ROLE_NOT_PERMITTED"

        # The local client certificate alone proves nothing: a token is needed.
        async with channel(address, None, "client") as ch:
            got = await failure(list_tasks(ch))
            assert got.code() == grpc.StatusCode.UNAUTHENTICATED, got
            assert error_info(got).reason == "CREDENTIALS_MISSING"


# -- 3. unsafe configurations refuse to start --------------------------------


def _lifecycle_tls_only() -> list[str]:
    return [
        "--tls-cert",
        str(PKI.cert("lifecycle")),
        "--tls-key",
        str(PKI.key("lifecycle")),
        "--tls-client-ca",
        str(PKI.ca),
    ]


REFUSALS = {
    "insecure-off-loopback": (
        "lifecycle_service",
        lambda: ["--listen", "0.0.0.0:0", "--insecure", "--jwks-file", str(credentials.JWKS_FILE)],
        ["--insecure", "loopback", "0.0.0.0:0"],
    ),
    "no-auth-off-loopback": (
        "lifecycle_service",
        lambda: ["--listen", "0.0.0.0:0", *_lifecycle_tls_only(), "--no-auth"],
        ["--no-auth", "loopback", "0.0.0.0:0"],
    ),
    "no-tls-and-not-insecure": (
        "lifecycle_service",
        lambda: ["--listen", "127.0.0.1:0", "--jwks-file", str(credentials.JWKS_FILE)],
        ["--tls-cert"],
    ),
    "no-jwks-and-not-no-auth": (
        "lifecycle_service",
        lambda: ["--listen", "127.0.0.1:0", *_lifecycle_tls_only()],
        ["--jwks-file"],
    ),
    "unsafe-completion-identity": (
        "lifecycle_service",
        lambda: [
            *_lifecycle_tls_only(),
            "--listen",
            "127.0.0.1:0",
            "--jwks-file",
            str(credentials.JWKS_FILE),
            "--completion-identity",
            "spiffe://funnel.local/completion\nservice",
        ],
        ["--completion-identity", "U+000A"],
    ),
    "completion-plaintext-to-remote-lifecycle": (
        "completion_service",
        lambda: [
            "--listen",
            "127.0.0.1:0",
            "--insecure",
            "--jwks-file",
            str(credentials.JWKS_FILE),
            "--lifecycle-insecure",
            "--lifecycle-address",
            "10.1.2.3:50051",
        ],
        ["--lifecycle-insecure", "loopback", "10.1.2.3:50051"],
    ),
}


def _clean_environment() -> dict[str, str]:
    """The environment without any service setting (each flag defaults to one)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("LIFECYCLE_", "COMPLETION_"))}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_unsafe_configuration_refuses_to_start(tmp_path, case):
    module, args, mentions = REFUSALS[case]
    database = tmp_path / "db.sqlite3"
    process = subprocess.Popen(
        [sys.executable, "-m", module, *args(), "--database", str(database)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_clean_environment(),
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=REFUSAL_TIMEOUT)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    message = stderr.decode(errors="replace")
    assert process.returncode not in (0, None), message
    assert f"{module} refuses to start" in message
    for mention in mentions:
        assert mention in message, message
    assert b"serving on" not in stdout
    # Refused before anything was created.
    assert not database.exists()


async def test_plaintext_on_loopback_is_allowed(tmp_path):
    """The control of the refusals above: the same flags on loopback start and serve."""
    with lifecycle_process(tmp_path, ["--insecure", "--jwks-file", str(credentials.JWKS_FILE)]) as process:
        assert process.address.startswith("127.0.0.1:")
        # A served call also means the process handles SIGTERM by now (it installs
        # its signal handlers just after printing that it serves).
        async with credentials.insecure_channel(process.address, credentials.SUPERUSER) as ch:
            assert list((await list_tasks(ch)).tasks) == []


# -- 4. certificate reload keeps serving --------------------------------------


async def test_sighup_reloads_the_certificate_for_new_connections_only(tmp_path):
    cert_path, key_path, args = copied_tls(tmp_path)
    # A reload only on SIGHUP: the periodic check would take an hour.
    with lifecycle_process(tmp_path, args, "--reload-interval", "3600") as process:
        port = port_of(process)
        assert await asyncio.to_thread(served_serial, port) == initial_serial()
        async with channel(process.address, credentials.SUPERUSER, "client", options=FRESH_CONNECTION) as old:
            await list_tasks(old)

            key, cert = new_lifecycle_leaf()
            install(cert_path, key_path, cert, key)
            # Without a signal nothing changes.
            await asyncio.sleep(0.3)
            assert await asyncio.to_thread(served_serial, port) == initial_serial()

            process.process.send_signal(signal.SIGHUP)
            await wait_for_serial(port, cert.serial_number)
            assert process.process.poll() is None, "SIGHUP ended the process"
            assert "TLS certificate reloaded" in log_text(process)

            # The connection opened before the reload still serves.
            await list_tasks(old)
            # A new gRPC connection verifies the new certificate and is served.
            async with channel(process.address, credentials.SUPERUSER, "client", options=FRESH_CONNECTION) as new:
                await list_tasks(new)
            await list_tasks(old)
            assert served_serial(port) == cert.serial_number


async def test_changed_files_are_reloaded_without_a_signal(tmp_path):
    cert_path, key_path, args = copied_tls(tmp_path)
    with lifecycle_process(tmp_path, args, "--reload-interval", "0.2") as process:
        port = port_of(process)
        async with channel(process.address, credentials.SUPERUSER, "client", options=FRESH_CONNECTION) as old:
            await list_tasks(old)
            assert await asyncio.to_thread(served_serial, port) == initial_serial()
            for _ in range(2):  # twice: the second change is noticed as well
                key, cert = new_lifecycle_leaf()
                install(cert_path, key_path, cert, key)
                await wait_for_serial(port, cert.serial_number)
                await list_tasks(old)
            assert process.process.poll() is None
            async with channel(process.address, credentials.SUPERUSER, "client", options=FRESH_CONNECTION) as new:
                await list_tasks(new)


# -- 5. a bad replacement is refused, the certificate in use stays ------------


async def test_a_certificate_that_does_not_match_its_key_is_not_taken(tmp_path):
    cert_path, key_path, args = copied_tls(tmp_path)
    refused = "TLS files not reloaded"
    with lifecycle_process(tmp_path, args, "--reload-interval", "3600") as process:
        port = port_of(process)
        async with channel(process.address, credentials.SUPERUSER, "client", options=FRESH_CONNECTION) as old:
            await list_tasks(old)
            assert await asyncio.to_thread(served_serial, port) == initial_serial()

            # A new certificate with somebody else's key.
            _, mismatched_cert = new_lifecycle_leaf()
            install(cert_path, key_path, mismatched_cert, ec.generate_private_key(ec.SECP256R1()))
            process.process.send_signal(signal.SIGHUP)
            await asyncio.to_thread(wait_for_log, process, refused)
            assert "does not belong to the certificate" in log_text(process)
            assert process.process.poll() is None
            # New connections keep getting the certificate in use, and are served.
            for _ in range(3):
                assert await asyncio.to_thread(served_serial, port) == initial_serial()
            async with channel(process.address, credentials.SUPERUSER, "client", options=FRESH_CONNECTION) as new:
                await list_tasks(new)
            await list_tasks(old)

            # A good pair afterwards is taken: the check above could have seen a change.
            key, cert = new_lifecycle_leaf()
            install(cert_path, key_path, cert, key)
            process.process.send_signal(signal.SIGHUP)
            await wait_for_serial(port, cert.serial_number)
            assert log_text(process).count(refused) == 1


# -- 6. `funnel token issue` ---------------------------------------------------


def funnel_cli(*args: str) -> subprocess.CompletedProcess:
    executable = Path(sys.executable).with_name("funnel")
    return subprocess.run([str(executable), *args], capture_output=True, text=True, timeout=REFUSAL_TIMEOUT)


def test_token_issue_prints_a_token_signed_by_the_local_key(tmp_path):
    made = funnel_cli("pki", "init", "--data-dir", str(tmp_path))
    assert made.returncode == 0 and str(tmp_path / "tls") in made.stdout, made.stderr
    result = funnel_cli(
        "token", "issue", "--workspace", "acme", "--role", "host", "--ttl", "15m", "--data-dir", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    assert token and "\n" not in token
    jwks = jwt.PyJWKSet.from_json((tmp_path / "tls" / "jwks.json").read_text(encoding="utf-8"))
    kid = jwt.get_unverified_header(token)["kid"]
    key = next(k for k in jwks.keys if k.key_id == kid)
    claims = jwt.decode(token, key=key, algorithms=["EdDSA", "ES256"], audience="funnel", issuer="funnel")
    assert claims["sub"] == "host@acme"
    assert claims["permissions"] == ["acme:host"]
    assert claims["exp"] - claims["iat"] == 900
    assert claims["iss"] == "funnel" and claims["aud"] == "funnel"
    assert abs(claims["iat"] - time.time()) < 60
    # Another key (the test PKI's) does not verify it.
    other = jwt.PyJWKSet.from_json(credentials.JWKS_FILE.read_text(encoding="utf-8")).keys[0]
    with pytest.raises(jwt.InvalidTokenError):
        jwt.decode(token, key=other, algorithms=["EdDSA", "ES256"], audience="funnel", issuer="funnel")


def test_token_issue_refuses_an_unknown_role(tmp_path):
    result = funnel_cli("token", "issue", "--workspace", "acme", "--role", "admin", "--data-dir", str(tmp_path))
    assert result.returncode == 2
    assert "unknown role" in result.stderr and "admin" in result.stderr
    assert result.stdout.strip() == ""


def test_token_issue_refuses_a_malformed_workspace(tmp_path):
    result = funnel_cli("token", "issue", "--workspace", "a/b", "--role", "host", "--data-dir", str(tmp_path))
    assert result.returncode != 0
    assert "workspace 'a/b'" in result.stderr
    assert result.stdout.strip() == ""


@pytest.mark.parametrize(
    "args, shown",
    [
        (["--workspace", "acme", "--role", "agent", "--subject", "agent 7\u202e"], "U+0020"),
        # The default subject, <role>@<workspace>, of a workspace id beyond ASCII.
        (["--workspace", "t\u00e2che", "--role", "host"], "U+00E2"),
    ],
)
def test_token_issue_refuses_a_subject_the_services_would_refuse(tmp_path, args, shown):
    result = funnel_cli("token", "issue", *args, "--data-dir", str(tmp_path))
    assert result.returncode == 2, result.stdout
    assert "subject" in result.stderr and shown in result.stderr and "--subject" in result.stderr
    assert result.stdout.strip() == ""
