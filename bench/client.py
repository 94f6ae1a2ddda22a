"""The benchmark's load client: one process, one asyncio loop, grpc.aio, one channel
per server it talks to. Started by bench/run.py; not meant to be run by hand.

    python bench/client.py '<json config>'

Line protocol on stdout (stderr is free text):
    PROXY host:port   (calibrate only) the counting proxy is listening
    READY             preparation done; waiting for GO on stdin
    RESULT {json}     the measurement
and the client waits for one line `GO` on stdin before it starts measuring, so the
driver can read every process's CPU counters right before and right after.

Modes (config["mode"]):
  calibrate  run the story a few times through a counting proxy that sits between the
             completion and the lifecycle service; report every message size and which
             lifecycle calls the completion service makes per client call
  attempt    pre-register and pre-claim a pool of tasks, then each op is one
             AttemptCompletion that must come back ALLOW + SETTLED
  story      each op is RegisterTask + ClaimTask + AttemptCompletion (ALLOW + SETTLED)
  baseline   each op is a fixed sequence of raw-bytes calls to the echo servers

Every call goes over TLS with a bearer token, as a production caller's would
(config["tls_dir"]: the local PKI of bench/common.py): RegisterTask (and the other
lifecycle reads) as the host `bench-host` (`bench:host`), claims and attempts as the
agent itself (subject == agent_id, `bench:agent`). Lifecycle calls present the local
client certificate (the lifecycle listener requires one). The baseline sends the same
tokens to the echo servers.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import grpc
from google.protobuf.duration_pb2 import Duration

from bench.common import AGENT_ID, WORKSPACE, Credentials, percentile
from bench.echo import METHOD as ECHO_METHOD
from bench.echo import encode_request
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import completion_service_pb2_grpc as completion_grpc
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types

CALL_TIMEOUT = 60.0
LEASE_TTL = Duration(seconds=6 * 3600)
RESULT_TEXT = "Implemented the change; all tests pass."


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class OpFailed(Exception):
    pass


class Exhausted(Exception):
    pass


# -- the real services ---------------------------------------------------------


class Funnel:
    """The services' stubs. An address may list several replicas, comma-separated:
    each task's calls then go to one of them (by a hash of its id), as one agent's
    channel does behind a balancer that spreads connections, and the tasks spread
    evenly over the replicas. (Spreading one task's calls too would make each
    replica read afresh, at the lifecycle service, what another replica's claim
    taught the other one: a cost of that routing, not of the replicas.)"""

    def __init__(self, lifecycle_address: str, completion_address: str, request_ids: bool, tls_dir: str) -> None:
        credentials = Credentials(tls_dir)
        lifecycle_channels = [credentials.lifecycle_channel(a) for a in lifecycle_address.split(",")]
        completion_channels = [credentials.completion_channel(a) for a in completion_address.split(",")]
        self._channels = [*lifecycle_channels, *completion_channels]
        self._lifecycles = [lifecycle_grpc.TaskLifecycleServiceStub(c) for c in lifecycle_channels]
        self._completions = [completion_grpc.CompletionServiceStub(c) for c in completion_channels]
        # Per-call metadata (no interceptor): the host registers, the agent claims and attempts.
        self.host = credentials.host_metadata()
        self.agent = credentials.agent_metadata()
        self.request_ids = request_ids
        self.sizes: dict[str, tuple[int, int]] = {}
        self.requests: dict[str, bytes] = {}  # last request of each method (calibration)

    @property
    def lifecycle(self) -> lifecycle_grpc.TaskLifecycleServiceStub:
        """The first replica's (the reads of the calibration and the preload check)."""
        return self._lifecycles[0]

    @property
    def completion(self) -> completion_grpc.CompletionServiceStub:
        return self._completions[0]

    def _replica(self, task_id: str) -> int:
        return zlib.crc32(task_id.encode()) % len(self._completions)

    def _rid(self, task_id: str, step: str) -> str:
        return f"{task_id}:{step}" if self.request_ids else ""

    def register_request(self, task_id: str) -> lifecycle_messages.RegisterTaskRequest:
        return lifecycle_messages.RegisterTaskRequest(
            workspace_id=WORKSPACE,
            task_id=task_id,
            request_id=self._rid(task_id, "register"),
            cause=lifecycle_types.Cause(source="bench", reason="benchmark task"),
        )

    def claim_request(self, task_id: str) -> completion_messages.ClaimTaskRequest:
        return completion_messages.ClaimTaskRequest(
            workspace_id=WORKSPACE,
            task_id=task_id,
            agent_id=AGENT_ID,
            lease_ttl=LEASE_TTL,
            request_id=self._rid(task_id, "claim"),
        )

    def attempt_request(self, task_id: str, run_id: str, epoch: int) -> completion_messages.AttemptCompletionRequest:
        return completion_messages.AttemptCompletionRequest(
            workspace_id=WORKSPACE,
            task_id=task_id,
            run_id=run_id,
            epoch=epoch,
            outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
            result=RESULT_TEXT,
            request_id=self._rid(task_id, "attempt"),
        )

    async def register(self, task_id: str) -> lifecycle_messages.RegisterTaskResponse:
        request = self.register_request(task_id)
        lifecycle = self._lifecycles[self._replica(task_id) % len(self._lifecycles)]
        response = await lifecycle.RegisterTask(request, timeout=CALL_TIMEOUT, metadata=self.host)
        self.sizes["RegisterTask"] = (request.ByteSize(), response.ByteSize())
        self.requests["RegisterTask"] = request.SerializeToString()
        return response

    async def claim(self, task_id: str) -> completion_messages.ClaimTaskResponse:
        request = self.claim_request(task_id)
        completion = self._completions[self._replica(task_id)]
        response = await completion.ClaimTask(request, timeout=CALL_TIMEOUT, metadata=self.agent)
        self.sizes["ClaimTask"] = (request.ByteSize(), response.ByteSize())
        self.requests["ClaimTask"] = request.SerializeToString()
        return response

    async def attempt(self, task_id: str, run_id: str, epoch: int) -> completion_messages.AttemptCompletionResponse:
        request = self.attempt_request(task_id, run_id, epoch)
        completion = self._completions[self._replica(task_id)]
        response = await completion.AttemptCompletion(request, timeout=CALL_TIMEOUT, metadata=self.agent)
        check_settled(response)
        self.sizes["AttemptCompletion"] = (request.ByteSize(), response.ByteSize())
        self.requests["AttemptCompletion"] = request.SerializeToString()
        return response

    async def complete_run(self, task_id: str, run_id: str) -> completion_messages.CompleteRunResponse:
        request = completion_messages.CompleteRunRequest(
            workspace_id=WORKSPACE,
            run_id=run_id,
            outcome=completion_enums.RUN_OUTCOME_SUCCEEDED,
            tokens_input=1200,
            tokens_output=300,
            notes=RESULT_TEXT,
            request_id=self._rid(task_id, "complete"),
        )
        completion = self._completions[self._replica(task_id)]
        response = await completion.CompleteRun(request, timeout=CALL_TIMEOUT, metadata=self.agent)
        self.sizes["CompleteRun"] = (request.ByteSize(), response.ByteSize())
        self.requests["CompleteRun"] = request.SerializeToString()
        return response

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()


def check_settled(response: completion_messages.AttemptCompletionResponse) -> None:
    decision = response.decision
    if decision.verdict != completion_enums.VERDICT_ALLOW:
        raise OpFailed(
            f"attempt {completion_enums.Verdict.Name(decision.verdict)} "
            f"(next action {completion_enums.AgentAction.Name(decision.next_action)}): {decision.instruction}"
        )
    completion = response.completion
    if completion.settlement != completion_enums.SETTLEMENT_STATUS_SETTLED:
        detail = completion.terminalization_error_reason or "no error recorded"
        raise OpFailed(f"completion {completion_enums.SettlementStatus.Name(completion.settlement)} ({detail})")
    if response.existing_completion:
        raise OpFailed("attempt returned an existing completion")


# -- the closed loop ---------------------------------------------------------------


async def closed_loop(op, concurrency: int, seconds: float) -> dict:
    """`concurrency` workers, each issuing `op()` back to back until `seconds` have
    passed; then no new op starts and the ones in flight are awaited."""
    latencies: list[float] = []
    failures: collections.Counter = collections.Counter()
    exhausted = False
    perf = time.perf_counter
    start = perf()
    end = start + seconds

    async def worker() -> None:
        nonlocal exhausted
        while perf() < end:
            t = perf()
            try:
                await op()
            except Exhausted:
                exhausted = True
                return
            except OpFailed as exc:
                failures[str(exc)] += 1
                continue
            except grpc.aio.AioRpcError as exc:
                failures[f"{exc.code().name}: {exc.details()}"] += 1
                continue
            latencies.append(perf() - t)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = perf() - start
    latencies.sort()
    ops = len(latencies)
    return {
        "concurrency": concurrency,
        "ops": ops,
        "failures": sum(failures.values()),
        "failure_samples": failures.most_common(5),
        "elapsed_s": elapsed,
        "ops_per_s": ops / elapsed if elapsed > 0 else 0.0,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p90_ms": percentile(latencies, 90) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "max_ms": (latencies[-1] * 1000) if latencies else 0.0,
        "mean_ms": (sum(latencies) / ops * 1000) if ops else 0.0,
        "pool_exhausted": exhausted,
    }


async def wait_for_go() -> None:
    print("READY", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if line.strip() != "GO":
        raise SystemExit(f"expected GO, got {line!r}")


async def run_attempt(config: dict) -> dict:
    funnel = Funnel(config["lifecycle"], config["completion"], config["request_ids"], config["tls_dir"])
    prefix = config["task_prefix"]
    pool_size = int(config["pool"])
    pool: list[tuple[str, str, int]] = []
    prep_failures: collections.Counter = collections.Counter()
    counter = iter(range(pool_size))
    t0 = time.perf_counter()
    prep_deadline = t0 + float(config.get("prep_max_s", 1e9))
    prep_cut = False

    async def progress() -> None:
        while True:
            await asyncio.sleep(10)
            say(f"  ... {len(pool)} of {pool_size} claimed after {time.perf_counter() - t0:.0f}s")

    async def prepare() -> None:
        nonlocal prep_cut
        for i in counter:
            if time.perf_counter() > prep_deadline:
                prep_cut = True
                return
            task_id = f"{prefix}-{i:07d}"
            try:
                await funnel.register(task_id)
                claim = await funnel.claim(task_id)
                pool.append((task_id, claim.run.run_id, claim.lease.epoch))
            except grpc.aio.AioRpcError as exc:
                prep_failures[f"{exc.code().name}: {exc.details()}"] += 1

    reporter = asyncio.create_task(progress())
    await asyncio.gather(*(prepare() for _ in range(int(config.get("prep_concurrency", 32)))))
    reporter.cancel()
    prep_s = time.perf_counter() - t0
    say(
        f"  prepared {len(pool)} claimed tasks in {prep_s:.1f}s ({len(pool) / max(prep_s, 1e-9):.0f}/s)"
        + (" - stopped at the preparation time limit" if prep_cut else "")
    )
    if prep_failures:
        say(f"  preparation failures: {prep_failures.most_common(5)}")
    prepared = len(pool)
    # pop() hands out the newest claim first: an agent attempts soon after its claim,
    # and what the completion service keeps of recent claims (its lifecycle
    # projection, 10,000 tasks per workspace) is what the attempt meets then.

    async def op() -> None:
        if not pool:
            raise Exhausted
        task_id, run_id, epoch = pool.pop()
        await funnel.attempt(task_id, run_id, epoch)

    await wait_for_go()
    result = await closed_loop(op, config["concurrency"], config["seconds"])
    result.update(
        prep_s=prep_s,
        prep_rate=prepared / max(prep_s, 1e-9),
        pool=pool_size,
        prepared=prepared,
        prep_cut=prep_cut,
        prep_failures=sum(prep_failures.values()),
        unused=len(pool),
    )
    await funnel.close()
    return result


async def run_story(config: dict) -> dict:
    funnel = Funnel(config["lifecycle"], config["completion"], config["request_ids"], config["tls_dir"])
    prefix = config["task_prefix"]
    numbers = iter(range(10**9))

    async def op() -> None:
        task_id = f"{prefix}-{next(numbers):07d}"
        await funnel.register(task_id)
        claim = await funnel.claim(task_id)
        await funnel.attempt(task_id, claim.run.run_id, claim.lease.epoch)

    await wait_for_go()
    result = await closed_loop(op, config["concurrency"], config["seconds"])
    await funnel.close()
    return result


async def run_baseline(config: dict) -> dict:
    """config["calls"]: [{"target": "front"|"back", "as": "host"|"agent", "request": n, "response": n,
    "hops": [[req, resp], ...]}]. The front stands in for the completion service (TLS,
    CA-verified), the back for the lifecycle service (TLS, client certificate required);
    every call carries the token the real call would carry ("as")."""
    credentials = Credentials(config["tls_dir"])
    channels = {
        "front": credentials.completion_channel(config["front"]),
        "back": credentials.lifecycle_channel(config["back"]),
    }
    tokens = {"host": credentials.host_metadata(), "agent": credentials.agent_metadata()}
    calls = []
    for call in config["calls"]:
        method = channels[call["target"]].unary_unary(ECHO_METHOD)
        request = encode_request(call["request"], call["response"], [tuple(h) for h in call.get("hops", ())])
        role = call.get("as") or ("host" if call["target"] == "back" else "agent")
        calls.append((method, request, call["response"], tokens[role]))

    async def op() -> None:
        for method, request, response_size, metadata in calls:
            response = await method(request, timeout=CALL_TIMEOUT, metadata=metadata)
            if len(response) != response_size:
                raise OpFailed(f"echo answered {len(response)} bytes instead of {response_size}")

    # Warm the connections up (the real services' clients are warmed by preparation).
    for _ in range(20):
        await op()
    await wait_for_go()
    result = await closed_loop(op, config["concurrency"], config["seconds"])
    for channel in channels.values():
        await channel.close()
    return result


# -- calibration: message sizes and the completion service's lifecycle calls ----------


class CountingProxy:
    """A raw-bytes unary proxy in front of the lifecycle service that records every
    call the completion service makes: method, request size, response size.

    Toward the completion service it serves TLS with the lifecycle service's
    certificate and requires a client certificate, as the lifecycle listener does
    (the completion service verifies it with --lifecycle-ca and the server name
    `localhost`); upstream it presents the completion service's identity
    certificate, so the lifecycle service still recognizes the completion service
    (the proxy forwards the calls' metadata, and the completion service sends no
    token where its certificate proves it)."""

    def __init__(self, upstream: str, tls_dir: str) -> None:
        from funnel.auth.pki import LocalPki

        pki = LocalPki(Path(tls_dir))
        ca = pki.ca.read_bytes()
        upstream_credentials = grpc.ssl_channel_credentials(
            ca, pki.key("completion-identity").read_bytes(), pki.cert("completion-identity").read_bytes()
        )
        self.channel = grpc.aio.secure_channel(upstream, upstream_credentials)
        self.calls: list[tuple[str, int, int]] = []
        self.raw: list[tuple[str, bytes]] = []  # (method, request bytes) of every call
        self.server = grpc.aio.server()
        proxy = self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details):
                method = details.method
                if method.endswith("/WatchLifecycleEvents"):  # the completion service's projection
                    return grpc.unary_stream_rpc_method_handler(self.stream(method))
                # Without (de)serializers the channel passes the raw message bytes through.
                forward: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = proxy.channel.unary_unary(method)

                async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                    proxy.raw.append((method.rsplit("/", 1)[1], request))
                    remaining = context.time_remaining()
                    try:
                        response = await forward(
                            request, timeout=remaining, metadata=tuple(context.invocation_metadata() or ())
                        )
                    except grpc.aio.AioRpcError as exc:
                        proxy.calls.append((method.rsplit("/", 1)[1], len(request), -1))
                        await context.abort(exc.code(), exc.details() or "", exc.trailing_metadata())
                    proxy.calls.append((method.rsplit("/", 1)[1], len(request), len(response)))
                    return response

                return grpc.unary_unary_rpc_method_handler(call)

            def stream(self, method: str):
                forward: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = proxy.channel.unary_stream(method)

                async def call(request: bytes, context: grpc.aio.ServicerContext):
                    upstream = forward(request, metadata=tuple(context.invocation_metadata() or ()))
                    try:
                        async for message in upstream:
                            yield message
                    finally:
                        upstream.cancel()

                return call

        self.server.add_generic_rpc_handlers((Handler(),))
        server_credentials = grpc.ssl_server_credentials(
            [(pki.key("lifecycle").read_bytes(), pki.cert("lifecycle").read_bytes())],
            root_certificates=ca,
            require_client_auth=True,
        )
        self.port = self.server.add_secure_port("127.0.0.1:0", server_credentials)

    def drain(self) -> list[tuple[str, int, int]]:
        calls, self.calls = self.calls, []
        return calls

    def drain_raw(self) -> list[tuple[str, bytes]]:
        raw, self.raw = self.raw, []
        return raw


async def run_calibrate(config: dict) -> dict:
    proxy = CountingProxy(config["lifecycle"], config["tls_dir"])
    await proxy.server.start()
    print(f"PROXY 127.0.0.1:{proxy.port}", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    completion_address = line.strip()
    funnel = Funnel(config["lifecycle"], completion_address, config["request_ids"], config["tls_dir"])
    stories = []
    for i in range(int(config.get("stories", 3))):
        task_id = f"{config['task_prefix']}-{i:07d}"
        proxy.drain()
        proxy.drain_raw()
        await funnel.register(task_id)
        register_calls = proxy.drain()
        claim = await funnel.claim(task_id)
        claim_calls = proxy.drain()
        attempt = await funnel.attempt(task_id, claim.run.run_id, claim.lease.epoch)
        attempt_calls = proxy.drain()
        # Close the run as complete_task would, so the story leaves what a finished
        # task leaves behind (the preload clones the last story's rows).
        await funnel.complete_run(task_id, claim.run.run_id)
        complete_calls = proxy.drain()
        stories.append(
            {
                "task_id": task_id,
                "run_id": claim.run.run_id,
                "epoch": claim.lease.epoch,
                "completion_id": attempt.completion.completion_id,
                "identity": attempt.completion.identity,
                "sizes": dict(funnel.sizes),
                "lifecycle_calls": {
                    "RegisterTask": register_calls,
                    "ClaimTask": claim_calls,
                    "AttemptCompletion": attempt_calls,
                    "CompleteRun": complete_calls,
                },
                # Every request of the story, for the preload's request-id fingerprints.
                "requests": [
                    ["completion" if m != "RegisterTask" else "lifecycle", m, r.hex()]
                    for m, r in funnel.requests.items()
                ]
                + [["lifecycle", m, r.hex()] for m, r in proxy.drain_raw()],
            }
        )
    await funnel.close()
    await proxy.server.stop(0.5)
    await proxy.channel.close()
    return {"stories": stories, "request_ids": config["request_ids"]}


async def run_verify_preload(config: dict) -> dict:
    """Reads one preloaded clone back through the services and replays its requests:
    the answers must be the stored ones (not REQUEST_ID_REUSED, not a new completion)."""
    funnel = Funnel(config["lifecycle"], config["completion"], config.get("request_ids", True), config["tls_dir"])
    task_id, run_id, completion_id = config["task_id"], config["run_id"], config["completion_id"]
    problems = []
    task = (
        await funnel.lifecycle.GetTask(
            lifecycle_messages.GetTaskRequest(workspace_id=WORKSPACE, task_id=task_id),
            timeout=CALL_TIMEOUT,
            metadata=funnel.host,
        )
    ).task
    if (
        task.state != lifecycle_enums.GENERATION_STATE_TERMINAL
        or task.outcome != lifecycle_enums.TERMINAL_OUTCOME_COMPLETED
    ):
        state = lifecycle_enums.GenerationState.Name(task.state)
        problems.append(f"GetTask: {state} {lifecycle_enums.TerminalOutcome.Name(task.outcome)}")
    if task.completion_id != completion_id:
        problems.append(f"GetTask: completion id {task.completion_id!r}, expected {completion_id!r}")
    events = await funnel.lifecycle.ListLifecycleEvents(
        lifecycle_messages.ListLifecycleEventsRequest(workspace_id=WORKSPACE, task_id=task_id),
        timeout=CALL_TIMEOUT,
        metadata=funnel.host,
    )
    sequences = [e.sequence for e in events.events]
    if sequences != sorted(sequences) or [e.revision for e in events.events] != list(range(1, len(sequences) + 1)):
        problems.append(f"ListLifecycleEvents: sequences {sequences}")
    got = await funnel.completion.GetCompletion(
        completion_messages.GetCompletionRequest(workspace_id=WORKSPACE, task_id=task_id, generation=1),
        timeout=CALL_TIMEOUT,
        metadata=funnel.agent,
    )
    if (
        got.completion.completion_id != completion_id
        or got.completion.settlement != completion_enums.SETTLEMENT_STATUS_SETTLED
    ):
        settlement = completion_enums.SettlementStatus.Name(got.completion.settlement)
        problems.append(f"GetCompletion: {got.completion.completion_id} {settlement}")
    if got.completion.lifecycle_event_sequence not in sequences:
        problems.append(
            f"GetCompletion: lifecycle_event_sequence {got.completion.lifecycle_event_sequence} not in {sequences}"
        )
    if not funnel.request_ids:
        await funnel.close()
        return {"task_id": task_id, "problems": problems, "sequences": sequences}
    try:
        # As the agent that made the template's attempt: request ids are scoped to the caller.
        replay = await funnel.completion.AttemptCompletion(
            funnel.attempt_request(task_id, run_id, 1), timeout=CALL_TIMEOUT, metadata=funnel.agent
        )
        if replay.completion.completion_id != completion_id or replay.completion.identity != got.completion.identity:
            problems.append(f"AttemptCompletion replay answered completion {replay.completion.completion_id}")
    except grpc.aio.AioRpcError as exc:
        problems.append(f"AttemptCompletion replay: {exc.code().name} {exc.details()}")
    try:
        replay = await funnel.lifecycle.RegisterTask(
            funnel.register_request(task_id), timeout=CALL_TIMEOUT, metadata=funnel.host
        )
        if replay.event.sequence != sequences[0]:
            problems.append(f"RegisterTask replay answered event {replay.event.sequence}, expected {sequences[0]}")
    except grpc.aio.AioRpcError as exc:
        problems.append(f"RegisterTask replay: {exc.code().name} {exc.details()}")
    await funnel.close()
    return {"task_id": task_id, "problems": problems, "sequences": sequences}


MODES = {
    "attempt": run_attempt,
    "story": run_story,
    "baseline": run_baseline,
    "calibrate": run_calibrate,
    "verify_preload": run_verify_preload,
}


def main() -> None:
    config = json.loads(sys.argv[1])
    result = asyncio.run(MODES[config["mode"]](config))
    print("RESULT " + json.dumps(result), flush=True)
    if config.get("wait_bye"):
        sys.stdin.readline()


if __name__ == "__main__":
    main()
