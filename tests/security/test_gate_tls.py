"""The completion service calls external gates over TLS: a gate whose certificate
the configured CA signed is consulted and its client sees the completion
service's identity certificate; a gate with a certificate of another CA fails
closed; plaintext gates are refused at start unless they are on loopback and
explicitly allowed; the gate never receives the service's bearer token."""

from __future__ import annotations

import grpc
import pytest

from completion_service.clients.outbound import OutboundRefused
from funnel.auth.pki import COMPLETION_IDENTITY, ensure_local_pki
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import gate_messages_pb2 as gate_messages
from funnel.completion.v1 import gate_service_pb2_grpc as gate_grpc
from tests import credentials
from tests.security.support import WS


class Gate(gate_grpc.CompletionGateServicer):
    def __init__(self) -> None:
        self.seen: list[tuple[dict, dict]] = []

    async def EvaluateGate(self, request, context):
        self.seen.append((dict(context.invocation_metadata() or ()), dict(context.auth_context())))
        return gate_messages.EvaluateGateResponse(status=completion_enums.GATE_STATUS_PASSED, reason="reviewed")


async def tls_gate(pki, require_client_certificate: bool) -> tuple[grpc.aio.Server, Gate, str]:
    gate = Gate()
    server = grpc.aio.server()
    gate_grpc.add_CompletionGateServicer_to_server(gate, server)
    creds = grpc.ssl_server_credentials(
        [(pki.key("lifecycle").read_bytes(), pki.cert("lifecycle").read_bytes())],
        root_certificates=pki.ca.read_bytes() if require_client_certificate else None,
        require_client_auth=require_client_certificate,
    )
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    return server, gate, f"127.0.0.1:{port}"


def policy(address: str) -> dict:
    return {"workspaces": {WS: {"external_gates": [{"id": "acme.review", "address": address, "timeout_ms": 2000}]}}}


def outbound(**overrides):
    identity = {
        "cert": str(credentials.PKI.cert("completion-identity")),
        "key": str(credentials.PKI.key("completion-identity")),
    }
    from funnel.auth.tls import ClientTlsFiles

    settings = dict(
        gates_insecure=False,
        gate_ca=str(credentials.PKI.ca),
        lifecycle_tls=ClientTlsFiles(None, identity["cert"], identity["key"]),
    )
    settings.update(overrides)
    return credentials.outbound_security(**settings)


async def attempt(funnel) -> completion_messages.AttemptCompletionResponse:
    claim = await funnel.f.registered_and_claimed("t-1")
    return await funnel.f.attempt(claim)


async def test_a_gate_behind_tls_is_consulted_and_sees_the_service_certificate_not_its_token(secured):
    server, gate, address = await tls_gate(credentials.PKI, require_client_certificate=True)
    try:
        funnel = await secured(policy=policy(address), completion={"outbound": outbound()})
        answer = await attempt(funnel)
        assert answer.decision.verdict == completion_enums.VERDICT_ALLOW
        [(metadata, auth)] = gate.seen
        assert "authorization" not in metadata  # the service's token never leaves towards a gate
        assert auth["x509_subject_alternative_name"] == [COMPLETION_IDENTITY.encode()]
    finally:
        await server.stop(None)


async def test_a_gate_with_a_certificate_of_another_ca_fails_closed(secured, tmp_path):
    other = ensure_local_pki(tmp_path / "other")
    server, gate, address = await tls_gate(other, require_client_certificate=False)
    try:
        funnel = await secured(policy=policy(address), completion={"outbound": outbound()})
        answer = await attempt(funnel)
        assert answer.decision.verdict != completion_enums.VERDICT_ALLOW
        assert answer.decision.next_action == completion_enums.AGENT_ACTION_RETRY_LATER
        assert gate.seen == []
    finally:
        await server.stop(None)


async def test_plaintext_gates_must_be_on_loopback_and_allowed(secured):
    with pytest.raises(OutboundRefused, match="loopback"):
        await secured(policy=policy("10.1.2.3:7000"), completion={"outbound": outbound(gates_insecure=True)})
