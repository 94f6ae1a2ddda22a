"""What the server boundary costs per call: one read RPC (the lifecycle service's
`GetTask`, answered from memory by a handler that does nothing else) served twice
by the same process code, once through the real boundary of a service (bearer
token verification, the authorization table, the per-RPC metrics, the tracing hook
and the request's log line, as `funnel.runtime.server.new_server` builds it) and
once bare, both over TLS with client certificates as the lifecycle listener runs.
The difference in server CPU per call is what the boundary adds (issue 25's
target: <= 0.08 ms per unary call).

    python bench/boundary.py                       # 3 alternating pairs of 4 s at 16 in flight
    python bench/boundary.py --pairs 5 --seconds 6 --concurrency 16

Each server is its own process (`serve` below), started with the lifecycle
service's own flags and local PKI (bench.common), logging JSON lines to a file as
a supervised service does; the client is this process. The two servers are
measured in alternating order, so a drift of the shared machine favours neither.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import WORKSPACE, Credentials, cpu_seconds, ensure_pki, lifecycle_arguments, load_average

TARGET_MS = 0.08
METHOD = "/funnel.lifecycle.v1.TaskLifecycleService/GetTask"


# -- the servers (child processes) ---------------------------------------------------


async def serve(bounded: bool, argv: list[str]) -> None:
    from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
    from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
    from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
    from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
    from funnel.runtime import registration
    from funnel.runtime import security as security_settings
    from funnel.runtime import server as runtime
    from funnel.runtime.metrics import ServiceMetrics
    from lifecycle_service.errors import DOMAIN, Reason
    from lifecycle_service.server import parse_args

    config = parse_args(argv)
    security = security_settings.prepare(config.security, config.listen, config.max_message_bytes)
    answer = lifecycle_messages.GetTaskResponse(
        task=lifecycle_types.Task(
            workspace_id=WORKSPACE, task_id="t", generation=1, revision=1, state=lifecycle_enums.GENERATION_STATE_ACTIVE
        )
    )

    class Canned(lifecycle_grpc.TaskLifecycleServiceServicer):
        async def GetTask(self, request, context):
            return answer

    # The same server (its options, its TLS, its generic registration) either way: only
    # the boundary differs.
    server, boundary = runtime.new_server(security, DOMAIN, Reason, ServiceMetrics().rpc)
    if bounded:
        boundary.add(server, lifecycle_grpc.add_TaskLifecycleServiceServicer_to_server, Canned())
    else:
        registration.add_servicer(server, lifecycle_grpc.add_TaskLifecycleServiceServicer_to_server, Canned())
    port = runtime.bind(server, config.listen, security)
    await server.start()
    gc.freeze()  # as the services do once started (funnel.runtime.server.serve_process)
    print(f"serving on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


# -- the driver --------------------------------------------------------------------


class Server:
    def __init__(self, bounded: bool, pki, log_path: Path) -> None:
        self.bounded = bounded
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "serve",
                "--bounded" if bounded else "--bare",
                "--",
                "--listen",
                "127.0.0.1:0",
                "--log-format",
                "json",
                *lifecycle_arguments(pki),
            ],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self.process.stdout is not None  # opened with stdout=PIPE
        line = self.process.stdout.readline()
        if not line.startswith("serving on "):
            raise RuntimeError(f"the {'bounded' if bounded else 'bare'} server did not start: {line!r}")
        self.address = line.removeprefix("serving on ").strip()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        self._log.close()


async def drive(address: str, credentials: Credentials, concurrency: int, seconds: float, pid: int) -> dict:
    from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
    from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc

    metadata = credentials.host_metadata()
    request = lifecycle_messages.GetTaskRequest(workspace_id=WORKSPACE, task_id="t")
    async with credentials.lifecycle_channel(address) as channel:
        stub = lifecycle_grpc.TaskLifecycleServiceStub(channel)
        for _ in range(200):  # warm up: connection, caches, the token's verification
            await stub.GetTask(request, metadata=metadata, timeout=30)
        calls = 0
        stop_at = 0.0

        async def loop() -> None:
            nonlocal calls
            while time.monotonic() < stop_at:
                await stub.GetTask(request, metadata=metadata, timeout=30)
                calls += 1

        before = cpu_seconds(pid)
        started = time.monotonic()
        stop_at = started + seconds
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
        used = cpu_seconds(pid) - before
    return {"calls": calls, "calls_per_s": calls / elapsed, "server_cpu_ms_per_call": 1000 * used / calls}


def measure_boundary(pairs: int, seconds: float, concurrency: int, say=print) -> dict:
    """Both servers in `pairs` alternating pairs; the CPU per call the boundary adds
    (bounded minus bare) in each pair and their median, in ms."""
    data = Path(tempfile.mkdtemp(prefix="funnel-bench-boundary-"))
    pki = ensure_pki(data)
    credentials = Credentials(pki.directory)
    servers = {
        bounded: Server(bounded, pki, data / f"{'bounded' if bounded else 'bare'}.log") for bounded in (False, True)
    }
    results: dict[bool, list[dict]] = {False: [], True: []}
    try:
        for pair in range(pairs):
            order = (False, True) if pair % 2 == 0 else (True, False)
            for bounded in order:
                server = servers[bounded]
                results[bounded].append(
                    asyncio.run(drive(server.address, credentials, concurrency, seconds, server.process.pid))
                )
            bare, bounded_result = results[False][-1], results[True][-1]
            say(
                f"  boundary pair {pair + 1}: bare {bare['calls_per_s']:.0f} calls/s "
                f"{bare['server_cpu_ms_per_call']:.3f} ms, bounded {bounded_result['calls_per_s']:.0f} calls/s "
                f"{bounded_result['server_cpu_ms_per_call']:.3f} ms CPU per call"
            )
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(data, ignore_errors=True)
    added = [
        b["server_cpu_ms_per_call"] - a["server_cpu_ms_per_call"]
        for a, b in zip(results[False], results[True], strict=True)
    ]
    return {
        "added_ms": statistics.median(added),
        "pairs_ms": added,
        "concurrency": concurrency,
        "bare_ms": statistics.median(r["server_cpu_ms_per_call"] for r in results[False]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    print(f"load average at start: {load_average()}")
    result = measure_boundary(args.pairs, args.seconds, args.concurrency)
    print(f"load average at end: {load_average()}")
    verdict = "met" if result["added_ms"] <= TARGET_MS else "NOT MET"
    print(
        f"CPU the boundary adds per unary call (median of {args.pairs} pairs, {args.concurrency} in flight): "
        f"{result['added_ms']:.3f} ms (pairs: {', '.join(f'{a:.3f}' for a in result['pairs_ms'])}; a bare call "
        f"{result['bare_ms']:.3f} ms); target <= {TARGET_MS} ms {verdict}"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        mode, rest = sys.argv[2], sys.argv[sys.argv.index("--") + 1 :]
        from funnel.runtime.server import run

        run(serve(mode == "--bounded", rest))
    else:
        sys.exit(main())
