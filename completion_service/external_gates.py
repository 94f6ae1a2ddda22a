"""Calls external `CompletionGate` servers; any failure becomes an answer that
fails closed."""

from __future__ import annotations

import asyncio

import grpc

from completion_service.convert import evidence_to_proto
from completion_service.core.gates import ExternalAnswer, ExternalGate
from completion_service.core.model import EvidenceRecord, Snapshot
from funnel.completion.v1 import completion_pb2 as pb
from funnel.completion.v1 import completion_pb2_grpc


class ExternalGates:
    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _stub(self, address: str) -> completion_pb2_grpc.CompletionGateStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(address)
        return completion_pb2_grpc.CompletionGateStub(channel)

    async def ask_all(
        self, gates: tuple[ExternalGate, ...], snapshot: Snapshot, evidence: list[EvidenceRecord]
    ) -> dict[str, ExternalAnswer]:
        answers = await asyncio.gather(*(self._ask(gate, snapshot, evidence) for gate in gates))
        return {gate.gate_id: answer for gate, answer in zip(gates, answers)}

    async def _ask(self, gate: ExternalGate, snapshot: Snapshot, evidence: list[EvidenceRecord]) -> ExternalAnswer:
        request = pb.EvaluateGateRequest(
            gate_id=gate.gate_id,
            workspace_id=snapshot.workspace_id,
            task_id=snapshot.task_id,
            generation=snapshot.run.generation,
            run_id=snapshot.run.run_id,
            outcome=snapshot.outcome.value,
            result=snapshot.result,
            state_version=snapshot.evaluated_state_version,
            checkpoint=snapshot.transcript.checkpoint,
            evidence=[evidence_to_proto(e) for e in evidence],
        )
        try:
            response = await self._stub(gate.address).EvaluateGate(request, timeout=gate.timeout_ms / 1000)
        except grpc.aio.AioRpcError as error:
            return ExternalAnswer(None, f"{error.code().name}: {error.details()}")
        if response.status == pb.GATE_STATUS_PASSED:
            return ExternalAnswer(True, response.reason)
        if response.status == pb.GATE_STATUS_FAILED:
            return ExternalAnswer(False, response.reason)
        return ExternalAnswer(None, "the gate answered without a PASSED or FAILED status")

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
