"""Both services in-process for the security tests: plaintext on loopback with
authentication on (tests/credentials.py), clients that authenticate as any
credential, and whole-database snapshots to prove that a denial changed nothing."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from funnel.auth.pki import COMPLETION_IDENTITY
from funnel.auth.tokens import SigningKey
from funnel.completion.v1 import completion_service_pb2_grpc as completion_grpc
from funnel.completion.v1 import transcript_service_pb2_grpc as transcript_grpc
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from tests import credentials
from tests.completion.e2e_support import Funnel, table_dump

WS = "ws-1"
OTHER_WS = "ws-2"
AGENT = "agent-1"
# A key that is not in the services' JWKS but carries the same key id.
FORGER = SigningKey(SigningKey.generate().private_key, credentials.KEY.key_id)


def credential_tokens() -> dict[str, str | None]:
    """The credentials of the authorization matrix, by name."""
    now = time.time()
    return {
        "none": None,
        "expired": credentials.KEY.issue("host-1", [f"{WS}:host"], 60, now=now - 3600),
        "wrong-signature": FORGER.issue("host-1", [f"{WS}:host"], 3600),
        "wrong-audience": credentials.KEY.issue("host-1", [f"{WS}:host"], 3600, audience="another-service"),
        "viewer": credentials.token("viewer-1", [f"{WS}:viewer"]),
        "agent": credentials.token(AGENT, [f"{WS}:agent"]),
        "host": credentials.token("host-1", [f"{WS}:host"]),
        "foreign-operator": credentials.token("operator-2", [f"{OTHER_WS}:operator"]),
        "operator": credentials.token("operator-1", [f"{WS}:operator"]),
        "completion-service": credentials.token(COMPLETION_IDENTITY, []),
    }


def rss_bytes(pid: int) -> int:
    """The resident memory of process `pid`."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@dataclass
class Clients:
    """Stubs of the three services for one credential."""

    lc: lifecycle_grpc.TaskLifecycleServiceStub
    cs: completion_grpc.CompletionServiceStub
    ts: transcript_grpc.TranscriptServiceStub


class SecuredFunnel:
    """Both services, and clients per credential (channels closed at the end)."""

    def __init__(self, funnel: Funnel) -> None:
        self.f = funnel
        self._channels: list[grpc.aio.Channel] = []

    def clients(self, bearer: str | None) -> Clients:
        lifecycle = credentials.insecure_channel(self.f.lifecycle.address, bearer)
        completion = credentials.insecure_channel(self.f.completion.address, bearer)
        self._channels += [lifecycle, completion]
        return Clients(
            lifecycle_grpc.TaskLifecycleServiceStub(lifecycle),
            completion_grpc.CompletionServiceStub(completion),
            transcript_grpc.TranscriptServiceStub(completion),
        )

    def snapshot(self) -> tuple[dict, dict]:
        return table_dump(self.f.lifecycle_config.database), table_dump(self.f.completion_db)

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        await self.f.close()
