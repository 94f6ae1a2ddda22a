"""Who a caller is, against real lifecycle service processes with the TLS, mTLS
and token setup of `funnel up`:

1. only a URI SAN of a client certificate proves the completion service's
   identity: a certificate of the trusted CA whose DNS, email or IP SAN equals
   `--completion-identity`, or whose URI SAN is another one (another trust
   domain, a longer path), is no proof, and its forged, back-dated
   `SettleCompletion` is refused and changes nothing;
2. a token whose `exp`, `nbf` or `iat` is not a finite time of the years
   1970..9999 is `CREDENTIALS_INVALID`, every time it is sent;
3. a token whose `sub` is outside the safe set is `CREDENTIALS_INVALID`, and
   whatever a caller sends stays one safe line in the service's log, in both
   log formats."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from google.protobuf.timestamp_pb2 import Timestamp

from funnel.auth.client import bearer_interceptors
from funnel.auth.pki import COMPLETION_IDENTITY, issue_leaf
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.runtime.grpc_errors import error_info
from funnel_cli.supervisor import ServiceProcess, lifecycle_tls_arguments
from tests import credentials
from tests.completion.e2e_support import table_dump
from tests.security.processes import lifecycle_database, lifecycle_process, log_text

PKI = credentials.PKI
T = 10.0
WS = "ws-1"
HOST = credentials.token("host-1", [f"{WS}:host"])
# A new channel must open its own connection: its certificate is the point.
FRESH_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
IP_IDENTITY = "10.9.8.7"
# The identity's path in another trust domain.
FOREIGN_IDENTITY = "spiffe://evil.example/funnel/completion-service"
URI = x509.UniformResourceIdentifier
DNS = x509.DNSName
EMAIL = x509.RFC822Name


def ip(text: str) -> x509.IPAddress:
    return x509.IPAddress(ipaddress.ip_address(text))


# name: (the lifecycle's --completion-identity, the client certificate's SANs, whether it proves the identity)
SAN_CASES: dict[str, tuple[str, list[x509.GeneralName], bool]] = {
    "uri": (COMPLETION_IDENTITY, [URI(COMPLETION_IDENTITY)], True),
    "several-uris": (
        COMPLETION_IDENTITY,
        [URI("spiffe://funnel.local/funnel/local-client"), URI(COMPLETION_IDENTITY), URI("urn:example:x")],
        True,
    ),
    "uri-beside-dns-and-ip": (COMPLETION_IDENTITY, [DNS("localhost"), ip("127.0.0.1"), URI(COMPLETION_IDENTITY)], True),
    "dns": (COMPLETION_IDENTITY, [DNS(COMPLETION_IDENTITY)], False),
    "email": (COMPLETION_IDENTITY, [EMAIL(COMPLETION_IDENTITY)], False),
    "ip": (IP_IDENTITY, [ip(IP_IDENTITY)], False),
    "uri-of-another-trust-domain": (COMPLETION_IDENTITY, [URI(FOREIGN_IDENTITY)], False),
    "uri-with-a-longer-path": (COMPLETION_IDENTITY, [URI(COMPLETION_IDENTITY + "/x")], False),
    "uri-in-capitals": (COMPLETION_IDENTITY, [URI(COMPLETION_IDENTITY.upper())], False),
    "several-uris-none-equal": (
        COMPLETION_IDENTITY,
        [URI("spiffe://funnel.local/funnel/local-client"), URI("spiffe://evil.example/x")],
        False,
    ),
    "every-other-type-equal": (
        COMPLETION_IDENTITY,
        [DNS(COMPLETION_IDENTITY), EMAIL(COMPLETION_IDENTITY), URI(FOREIGN_IDENTITY)],
        False,
    ),
    # The control of "ip": that lifecycle takes a URI SAN naming its identity.
    "uri-naming-an-ip-identity": (IP_IDENTITY, [URI(IP_IDENTITY)], True),
}


# -- the processes ---------------------------------------------------------------


@dataclass(frozen=True)
class Lifecycle:
    process: ServiceProcess
    directory: Path

    @property
    def address(self) -> str:
        return self.process.address

    def snapshot(self) -> dict:
        return table_dump(str(lifecycle_database(self.directory)))

    def log_lines(self) -> list[str]:
        return log_text(self.process).splitlines()


@pytest.fixture(scope="module")
def lifecycles(tmp_path_factory) -> Iterator[Callable[..., Lifecycle]]:
    """`lifecycles(identity, *flags)`: the lifecycle process of `funnel up`
    (mTLS, tokens) with that --completion-identity and flags, started once per
    module and stopped at its end."""
    started: dict[tuple[str, ...], Lifecycle] = {}
    with contextlib.ExitStack() as stack:

        def lifecycle(identity: str, *flags: str) -> Lifecycle:
            if (identity, *flags) not in started:
                directory = tmp_path_factory.mktemp("lifecycle")
                args = [*lifecycle_tls_arguments(PKI), "--completion-identity", identity, *flags]
                process = stack.enter_context(lifecycle_process(directory, args))
                started[(identity, *flags)] = Lifecycle(process, directory)
            return started[(identity, *flags)]

        yield lifecycle


def client_certificate(names: list[x509.GeneralName]) -> tuple[bytes, bytes]:
    """(key, certificate) PEM of a client certificate of the test CA with these SANs."""
    ca_key = serialization.load_pem_private_key(PKI.key("ca").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(PKI.ca.read_bytes())
    key, cert = issue_leaf(ca_key, ca_cert, "completion_service", names, server=False, client=True)
    return (
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        cert.public_bytes(serialization.Encoding.PEM),
    )


def channel(address: str, certificate: tuple[bytes, bytes], bearer: str | None) -> grpc.aio.Channel:
    key, cert = certificate
    sends = bearer_interceptors(lambda: bearer) if bearer is not None else []
    return grpc.aio.secure_channel(
        address,
        grpc.ssl_channel_credentials(PKI.ca.read_bytes(), key, cert),
        interceptors=sends,
        options=[("grpc.ssl_target_name_override", "localhost"), *FRESH_CONNECTION],
    )


def local_client() -> tuple[bytes, bytes]:
    """The local tools' client certificate of `funnel up` (URI SAN spiffe://…/local-client)."""
    return PKI.key("client").read_bytes(), PKI.cert("client").read_bytes()


def stub(ch: grpc.aio.Channel) -> lifecycle_grpc.TaskLifecycleServiceStub:
    return lifecycle_grpc.TaskLifecycleServiceStub(ch)


async def refused(call) -> tuple[grpc.StatusCode, str | None]:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    info = error_info(raised.value)
    return raised.value.code(), info.reason if info else None


# -- 1. only a URI SAN proves the completion service ------------------------------


@pytest.mark.parametrize("case", list(SAN_CASES))
async def test_only_an_exact_uri_san_proves_the_completion_service(lifecycles, case):
    identity, names, proves = SAN_CASES[case]
    lifecycle = lifecycles(identity)
    task_id = f"t-{case}"
    forged = lifecycle_messages.SettleCompletionRequest(
        workspace_id=WS,
        task_id=task_id,
        generation=1,
        completion_id="cmp_forged",
        authoritative_time=Timestamp(seconds=1),  # back-dated: "before any cancellation"
    )
    certificate = client_certificate(names)
    async with channel(lifecycle.address, local_client(), HOST) as host_channel:
        host = stub(host_channel)
        await host.RegisterTask(lifecycle_messages.RegisterTaskRequest(workspace_id=WS, task_id=task_id), timeout=T)
        await host.ActivateGeneration(
            lifecycle_messages.ActivateGenerationRequest(workspace_id=WS, task_id=task_id, generation=1), timeout=T
        )
        before = lifecycle.snapshot()
        async with channel(lifecycle.address, certificate, None) as alone:
            if proves:
                await stub(alone).SettleCompletion(forged, timeout=T)
                task = (
                    await host.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id=task_id), timeout=T)
                ).task
                assert (task.state, task.outcome) == (
                    lifecycle_enums.GENERATION_STATE_TERMINAL,
                    lifecycle_enums.TERMINAL_OUTCOME_COMPLETED,
                )
                return
            # The certificate alone is no credential; with an operator's token it is that operator.
            assert await refused(stub(alone).SettleCompletion(forged, timeout=T)) == (
                grpc.StatusCode.UNAUTHENTICATED,
                "CREDENTIALS_MISSING",
            )
        async with channel(lifecycle.address, certificate, credentials.token("ops", ["*:operator"])) as operator:
            assert await refused(stub(operator).SettleCompletion(forged, timeout=T)) == (
                grpc.StatusCode.PERMISSION_DENIED,
                "ROLE_NOT_PERMITTED",
            )
            assert await refused(
                stub(operator).SettleFailure(
                    lifecycle_messages.SettleFailureRequest(workspace_id=WS, task_id=task_id, generation=1), timeout=T
                )
            ) == (grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_PERMITTED")
        assert lifecycle.snapshot() == before
        task = (await host.GetTask(lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id=task_id), timeout=T)).task
        assert task.state == lifecycle_enums.GENERATION_STATE_ACTIVE


# -- 2. token times ----------------------------------------------------------------


def signed(payload: str) -> str:
    """A token of the test key whose payload is exactly this JSON text (no JSON
    encoder writes 1e999)."""
    key = credentials.KEY
    return jwt.api_jws.PyJWS().encode(
        payload.encode(), key.private_key, algorithm=key.algorithm, headers={"kid": key.key_id}
    )


def claims(times: str) -> str:
    return f'{{"iss":"funnel","aud":"funnel","sub":"host-1","permissions":["{WS}:host"],{times}}}'


@pytest.mark.parametrize(
    "times",
    [
        '"exp":NaN',
        '"exp":1e999',
        '"exp":1e300',
        '"exp":-1e999',
        '"exp":4102444800,"nbf":NaN',
        '"exp":4102444800,"iat":-Infinity',
        '"exp":4102444800,"iat":true',
    ],
)
async def test_a_token_with_an_impossible_time_is_refused_every_time(lifecycles, times):
    lifecycle = lifecycles(COMPLETION_IDENTITY)
    async with channel(lifecycle.address, local_client(), signed(claims(times))) as ch:
        # Several times: neither the first verification nor the cache lets it pass.
        for _ in range(4):
            assert await refused(
                stub(ch).ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=WS), timeout=T)
            ) == (
                grpc.StatusCode.UNAUTHENTICATED,
                "CREDENTIALS_INVALID",
            )
    # The control: the same claims with a real expiry (2100-01-01) are served.
    async with channel(lifecycle.address, local_client(), signed(claims('"exp":4102444800'))) as ch:
        await stub(ch).ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=WS), timeout=T)


# -- 3. subjects and log lines -----------------------------------------------------

UNSAFE_SUBJECTS = ["agent\n2026-01-01T00:00:00Z INFO forged", "nul\x00", "\u202egnp.exe", "x" * 256, "t\u00e2che"]
HOSTILE = "ws\n\u202e\x00\x85\u2028x"
# The start of a line of `--log-format text`.
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")


def is_json_line(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("log_format", ["json", "text"])
async def test_an_unsafe_subject_is_refused_and_every_log_line_stays_one_safe_line(lifecycles, log_format):
    lifecycle = lifecycles(COMPLETION_IDENTITY, "--log-format", log_format)
    for subject in UNSAFE_SUBJECTS:
        async with channel(lifecycle.address, local_client(), credentials.token(subject, [f"{WS}:host"])) as ch:
            assert await refused(
                stub(ch).ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=WS), timeout=T)
            ) == (
                grpc.StatusCode.UNAUTHENTICATED,
                "CREDENTIALS_INVALID",
            ), ascii(subject)
    async with channel(lifecycle.address, local_client(), HOST) as ch:
        # Ids that break the id rule are refused, and logged as the caller sent them.
        assert await refused(
            stub(ch).ListTasks(lifecycle_messages.ListTasksRequest(workspace_id=HOSTILE), timeout=T)
        ) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_MALFORMED",
        )
        assert await refused(
            stub(ch).GetTask(lifecycle_messages.GetTaskRequest(workspace_id=WS, task_id=HOSTILE), timeout=T)
        ) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_MALFORMED",
        )
    # A call's line may be written just after its answer: wait for the two refusals'.
    lines = await lines_until(lifecycle, lambda ls: sum("INVALID_ARGUMENT FIELD_MALFORMED" in line for line in ls) == 2)
    for line in lines:
        assert line.isprintable(), ascii(line)
        if log_format == "json":
            assert is_json_line(line), line
        else:
            assert TEXT_LINE.match(line), line
    if log_format == "json":
        entries = [json.loads(line) for line in lines]
        assert {e.get("workspace") for e in entries} >= {HOSTILE} and {e.get("task") for e in entries} >= {HOSTILE}
        refusals = [e for e in entries if e.get("reason") == "CREDENTIALS_INVALID"]
        assert len(refusals) == len(UNSAFE_SUBJECTS)
        assert all("U+" in e["detail"] or "longer than" in e["detail"] for e in refusals), refusals
    else:
        assert sum("forged" in line for line in lines) == 0  # the subject is never written
        assert sum(json.dumps(HOSTILE) in line for line in lines) == 2


async def lines_until(lifecycle: Lifecycle, done: Callable[[list[str]], bool], within: float = T) -> list[str]:
    """The log's lines once they are `done` (or after `within` seconds)."""
    deadline = time.monotonic() + within
    lines = lifecycle.log_lines()
    while not done(lines) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        lines = lifecycle.log_lines()
    return lines
