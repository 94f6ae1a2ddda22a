"""A reference external completion gate: a `funnel.completion.v1.CompletionGate`
server that a workspace policy names (see deploy/policy.example.toml). Write
yours in any language; this one shows the contract in a few lines.

It approves a result unless the result still says TODO or WIP, or some evidence
of the attempt failed; its reason is what the agent is told to address.

    python examples/review_gate.py --listen 127.0.0.1:7000 \\
        --tls-cert funnel-data/tls/gate.pem --tls-key funnel-data/tls/gate.key
    python examples/review_gate.py --listen 127.0.0.1:7000 --insecure   # with --gates-insecure

Prints `review_gate serving on HOST:PORT` once it listens; stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
from pathlib import Path

import grpc

from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import gate_messages_pb2 as gate_messages
from funnel.completion.v1 import gate_service_pb2_grpc as gate_grpc

UNFINISHED = re.compile(r"\b(TODO|WIP)\b")


def review(request: gate_messages.EvaluateGateRequest) -> gate_messages.EvaluateGateResponse:
    """A pure verdict on the snapshot: the gate may be called more than once per attempt."""
    if UNFINISHED.search(request.result):
        return gate_messages.EvaluateGateResponse(
            status=completion_enums.GATE_STATUS_FAILED, reason="the result still says TODO or WIP; finish it"
        )
    failing = sorted({e.kind for e in request.evidence if e.verdict == completion_enums.EVIDENCE_VERDICT_FAILED})
    if failing:
        return gate_messages.EvaluateGateResponse(
            status=completion_enums.GATE_STATUS_FAILED, reason=f"failing evidence: {', '.join(failing)}"
        )
    return gate_messages.EvaluateGateResponse(
        status=completion_enums.GATE_STATUS_PASSED, reason=f"reviewed {len(request.evidence)} evidence facts"
    )


class ReviewGate(gate_grpc.CompletionGateServicer):
    async def EvaluateGate(self, request, context):
        return review(request)


async def serve(listen: str, cert: str | None, key: str | None) -> None:
    server = grpc.aio.server()
    gate_grpc.add_CompletionGateServicer_to_server(ReviewGate(), server)
    if cert and key:
        credentials = grpc.ssl_server_credentials([(Path(key).read_bytes(), Path(cert).read_bytes())])
        port = server.add_secure_port(listen, credentials)
    else:
        port = server.add_insecure_port(listen)
    await server.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print(f"review_gate serving on {listen.rsplit(':', 1)[0]}:{port}", flush=True)
    await stop.wait()
    await server.stop(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="127.0.0.1:7000")
    parser.add_argument("--tls-cert", help="PEM certificate the completion service's --gate-ca trusts")
    parser.add_argument("--tls-key")
    parser.add_argument("--insecure", action="store_true", help="plaintext (loopback, with --gates-insecure)")
    args = parser.parse_args()
    if not args.insecure and not (args.tls_cert and args.tls_key):
        parser.error("pass --tls-cert and --tls-key, or --insecure")
    asyncio.run(serve(args.listen, None if args.insecure else args.tls_cert, None if args.insecure else args.tls_key))


if __name__ == "__main__":
    main()
