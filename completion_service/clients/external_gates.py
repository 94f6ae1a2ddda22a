"""Calls external `CompletionGate` servers over the channels of
`completion_service.clients.outbound` (TLS unless explicitly plaintext on loopback);
any failure becomes an answer that fails closed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import grpc

from completion_service.api.convert import evidence_to_proto
from completion_service.clients.outbound import GateChannels
from completion_service.core.gates import ExternalAnswer, ExternalGate
from completion_service.core.model import EvidenceRecord, Snapshot
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import gate_messages_pb2 as gate_messages
from funnel.completion.v1 import gate_service_pb2_grpc as gate_grpc
from funnel.runtime.proto_enums import proto_enum


class _Stub(Protocol):
    """What this module calls on the generated CompletionGate stub."""

    EvaluateGate: grpc.aio.UnaryUnaryMultiCallable[
        gate_messages.EvaluateGateRequest, gate_messages.EvaluateGateResponse
    ]


# The generated stub module has no .pyi, so its constructor is untyped: this is its type as used here.
_new_stub: Callable[[grpc.aio.Channel], _Stub] = gate_grpc.CompletionGateStub


class ExternalGates:
    def __init__(self, channels: GateChannels) -> None:
        self._channels = channels

    def _stub(self, address: str) -> _Stub:
        return _new_stub(self._channels.channel(address))

    async def ask_all(
        self, gates: tuple[ExternalGate, ...], snapshot: Snapshot, evidence: list[EvidenceRecord]
    ) -> dict[str, ExternalAnswer]:
        answers = await asyncio.gather(*(self._ask(gate, snapshot, evidence) for gate in gates))
        return {gate.gate_id: answer for gate, answer in zip(gates, answers, strict=True)}

    async def _ask(self, gate: ExternalGate, snapshot: Snapshot, evidence: list[EvidenceRecord]) -> ExternalAnswer:
        request = gate_messages.EvaluateGateRequest(
            gate_id=gate.gate_id,
            workspace_id=snapshot.workspace_id,
            task_id=snapshot.task_id,
            generation=snapshot.run.generation,
            run_id=snapshot.run.run_id,
            outcome=proto_enum(completion_enums.RequestedOutcome, snapshot.outcome.value),
            result=snapshot.result,
            state_version=snapshot.evaluated_state_version,
            checkpoint=snapshot.transcript.checkpoint,
            evidence=[evidence_to_proto(e) for e in evidence],
        )
        try:
            response = await self._stub(gate.address).EvaluateGate(request, timeout=gate.timeout_ms / 1000)
        except grpc.aio.AioRpcError as error:
            return ExternalAnswer(None, f"{error.code().name}: {error.details()}")
        if response.status == completion_enums.GATE_STATUS_PASSED:
            return ExternalAnswer(True, response.reason)
        if response.status == completion_enums.GATE_STATUS_FAILED:
            return ExternalAnswer(False, response.reason)
        return ExternalAnswer(None, "the gate answered without a PASSED or FAILED status")
