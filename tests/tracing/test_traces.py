"""Traces across both services (funnel/runtime/tracing.py), with the services as
real processes configured only by OTEL_* variables: each exports its spans over
OTLP/gRPC to a collector this test runs (opentelemetry-proto's TraceService),
and the test's own client spans go to the SDK's in-memory exporter.

Covered: one trace from the client through the completion service to the
lifecycle service, with the right parent of every span; a refused call traced
with its real gRPC code; a settlement the outbox retries after the lifecycle
service came back joins the trace of the attempt that committed it; the console
exporter writes spans to the service log under OTEL_SERVICE_NAME; an exporter
that is not installed refuses the start; and without an exporter nothing is
installed."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from funnel.auth.client import bearer_interceptors
from funnel.completion.v1 import completion_messages_pb2 as completion_messages
from funnel.completion.v1 import completion_service_pb2_grpc as completion_grpc
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel.runtime import tracing
from funnel.runtime.tracing import ClientSpans
from funnel_cli.supervisor import (
    ServiceProcess,
    StartupFailed,
    completion_tls_arguments,
    lifecycle_tls_arguments,
    spawn,
)
from tests import credentials
from tests.reliability.harness import unused_port

WS = "ws-1"
CALL_TIMEOUT = 10.0
COMPLETION = "funnel.completion.v1.CompletionService"
LIFECYCLE = "funnel.lifecycle.v1.TaskLifecycleService"
SERVER = trace_pb2.Span.SPAN_KIND_SERVER
CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT
INTERNAL = trace_pb2.Span.SPAN_KIND_INTERNAL


# -- the collector ----------------------------------------------------------------


@dataclass(frozen=True)
class Exported:
    """One span as a service exported it."""

    service: str
    span: trace_pb2.Span

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_id(self) -> str:
        return self.span.parent_span_id.hex()

    def attribute(self, key: str):
        for kv in self.span.attributes:
            if kv.key == key:
                return getattr(kv.value, kv.value.WhichOneof("value"))
        raise KeyError(key)


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver that keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Exported] = []

    async def Export(self, request, context):
        for resource_spans in request.resource_spans:
            service = next(
                kv.value.string_value for kv in resource_spans.resource.attributes if kv.key == "service.name"
            )
            for scope in resource_spans.scope_spans:
                self.spans.extend(Exported(service, span) for span in scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    async def wait_for(self, what: str, found, timeout: float = 15.0):
        """Polls until `found(spans)` is truthy (returned); the services export every 50 ms."""
        deadline = time.monotonic() + timeout
        while True:
            value = found(self.spans)
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} exported within {timeout}s; got {[(s.service, s.name) for s in self.spans]}")
            await asyncio.sleep(0.05)


def only(spans: list[Exported], **wanted) -> Exported:
    matching = [
        s for s in spans if all(getattr(s, k) == v if k != "kind" else s.span.kind == v for k, v in wanted.items())
    ]
    assert len(matching) == 1, (wanted, [(s.service, s.name, s.span.kind) for s in spans])
    return matching[0]


# -- both services, exporting to the collector --------------------------------------


@dataclass
class TracedPair:
    directory: Path
    collector: Collector
    # The spans of the test's own calls to the completion service (ClientSpans).
    client_spans: InMemorySpanExporter
    faults: Path
    lifecycle_port: int
    # The OTEL_* environment of each service.
    lifecycle_env: dict[str, str]
    completion_env: dict[str, str]
    lifecycle: ServiceProcess | None = None
    completion: ServiceProcess | None = None
    lc: lifecycle_grpc.TaskLifecycleServiceStub | None = None
    cs: completion_grpc.CompletionServiceStub | None = None

    def arm_lifecycle(self, spec: str) -> None:
        fresh = self.faults.with_suffix(".tmp")  # a new inode: the service sees the change
        fresh.write_text(spec, encoding="utf-8")
        os.replace(fresh, self.faults)

    async def start_lifecycle(self) -> None:
        """Starts (or restarts, on the same port and database) the lifecycle service."""
        if self.lifecycle is not None:  # a restart: reap the one that died, close its pipe
            self.lifecycle.kill()
        self.lifecycle = await asyncio.to_thread(
            spawn,
            "lifecycle_service",
            "lifecycle_service",
            [
                "--listen",
                f"127.0.0.1:{self.lifecycle_port}",
                "--database",
                str(self.directory / "lifecycle.sqlite3"),
                *lifecycle_tls_arguments(credentials.PKI),
            ],
            self.directory / "lifecycle.log",
            self.lifecycle_env | {"FUNNEL_FAULTS_FILE": str(self.faults)},
        )

    async def start_completion(self) -> None:
        self.completion = await asyncio.to_thread(
            spawn,
            "completion_service",
            "completion_service",
            [
                "--listen",
                "127.0.0.1:0",
                "--database",
                str(self.directory / "completion.sqlite3"),
                *completion_tls_arguments(credentials.PKI),
                "--lifecycle-address",
                f"127.0.0.1:{self.lifecycle_port}",
                "--settle-interval",
                "0.05",
                "--lifecycle-timeout",
                "1",
            ],
            self.directory / "completion.log",
            self.completion_env,
        )

    def client_span(self, name: str) -> ReadableSpan:
        [span] = [s for s in self.client_spans.get_finished_spans() if s.name == name]
        return span


@pytest.fixture
async def start_pair(tmp_path) -> AsyncIterator:
    """A factory: `await start_pair(lifecycle_env=…, completion_env=…)` starts both
    services with those OTEL_* variables (by default: OTLP to the collector)."""
    collector = Collector()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    collector_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    otlp = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector_port}",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    started: list[TracedPair] = []
    channels: list[grpc.aio.Channel] = []

    async def start(lifecycle_env: dict[str, str] = otlp, completion_env: dict[str, str] = otlp) -> TracedPair:
        provider = TracerProvider()
        client_spans = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(client_spans))
        faults = tmp_path / "lifecycle.faults"
        faults.write_text("", encoding="utf-8")
        p = TracedPair(tmp_path, collector, client_spans, faults, unused_port(), lifecycle_env, completion_env)
        started.append(p)
        await p.start_lifecycle()
        await p.start_completion()
        assert p.completion is not None
        # The host's calls to the lifecycle service are not traced by the test; its
        # calls to the completion service start the traces.
        lifecycle_channel = credentials.tls_channel(f"127.0.0.1:{p.lifecycle_port}")
        completion_channel = grpc.aio.secure_channel(
            p.completion.address,
            grpc.ssl_channel_credentials(credentials.PKI.ca.read_bytes()),
            interceptors=[ClientSpans(provider), *bearer_interceptors(lambda: credentials.SUPERUSER)],
            options=[("grpc.ssl_target_name_override", "localhost")],
        )
        channels.extend([lifecycle_channel, completion_channel])
        p.lc = lifecycle_grpc.TaskLifecycleServiceStub(lifecycle_channel)
        p.cs = completion_grpc.CompletionServiceStub(completion_channel)
        return p

    try:
        yield start
    finally:
        for channel in channels:
            await channel.close()
        for p in started:
            for process in (p.completion, p.lifecycle):
                if process is not None:
                    await asyncio.to_thread(process.stop, 10)
        await server.stop(None)


@pytest.fixture
async def pair(start_pair) -> TracedPair:
    return await start_pair()


async def registered_and_claimed(p: TracedPair, task_id: str) -> completion_messages.ClaimTaskResponse:
    await p.lc.RegisterTask(
        lifecycle_messages.RegisterTaskRequest(
            workspace_id=WS,
            task_id=task_id,
            request_id=f"register-{task_id}",
            cause=lifecycle_types.Cause(source="host", reason="planned"),
        ),
        timeout=CALL_TIMEOUT,
    )
    return await p.cs.ClaimTask(
        completion_messages.ClaimTaskRequest(
            workspace_id=WS,
            task_id=task_id,
            agent_id="agent-1",
            lease_ttl=Duration(seconds=600),
            request_id=f"claim-{task_id}",
        ),
        timeout=CALL_TIMEOUT,
    )


async def attempt(
    p: TracedPair, claim: completion_messages.ClaimTaskResponse
) -> completion_messages.AttemptCompletionResponse:
    return await p.cs.AttemptCompletion(
        completion_messages.AttemptCompletionRequest(
            workspace_id=WS,
            task_id=claim.run.task_id,
            run_id=claim.run.run_id,
            epoch=claim.lease.epoch,
            outcome=completion_enums.REQUESTED_OUTCOME_COMPLETED,
            result="done",
            request_id=f"attempt-{claim.run.task_id}",
        ),
        timeout=CALL_TIMEOUT,
    )


def trace_id_of(span: ReadableSpan) -> str:
    return format(span.context.trace_id, "032x")


def span_id_of(span: ReadableSpan) -> str:
    return format(span.context.span_id, "016x")


# -- the tests ------------------------------------------------------------------------


async def test_one_trace_runs_from_the_client_through_the_completion_service_to_the_lifecycle_service(pair):
    p = pair
    answer = await attempt(p, await registered_and_claimed(p, "task-1"))
    assert answer.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED

    client = p.client_span(f"{COMPLETION}/AttemptCompletion")
    trace_id = trace_id_of(client)
    expected = {
        ("completion_service", SERVER, f"{COMPLETION}/AttemptCompletion"),
        ("completion_service", CLIENT, f"{LIFECYCLE}/GetTask"),
        ("completion_service", CLIENT, f"{LIFECYCLE}/SettleCompletion"),
        ("lifecycle_service", SERVER, f"{LIFECYCLE}/GetTask"),
        ("lifecycle_service", SERVER, f"{LIFECYCLE}/SettleCompletion"),
    }

    def whole_trace(spans: list[Exported]) -> list[Exported] | None:
        mine = [s for s in spans if s.trace_id == trace_id]
        # Every span's parent is exported too, but the test's own client span.
        closed = {s.parent_id for s in mine} - {s.span_id for s in mine} == {span_id_of(client)}
        return mine if closed and {(s.service, s.span.kind, s.name) for s in mine} >= expected else None

    spans = await p.collector.wait_for("spans of the attempt on both services", whole_trace)
    server = only(spans, service="completion_service", kind=SERVER)
    assert (server.name, server.parent_id) == (f"{COMPLETION}/AttemptCompletion", span_id_of(client))
    assert (server.attribute("rpc.method"), server.attribute("rpc.grpc.status_code")) == ("AttemptCompletion", 0)
    # The completion service's calls to the lifecycle service: its view of the task,
    # then the settlement, each a child of the attempt's span (or of the outbox's,
    # which is, when its periodic pass found the committed row first: the lifecycle
    # service applies the request id once) and the parent of the lifecycle
    # service's span of the same call.
    by_id = {s.span_id: s for s in spans}
    outbox = [s for s in spans if s.name == "settle pending completion"]
    assert all((s.span.kind, s.parent_id) == (INTERNAL, server.span_id) for s in outbox), outbox
    calls = [s for s in spans if s.service == "completion_service" and s.span.kind == CLIENT]
    assert {s.name for s in calls} == {f"{LIFECYCLE}/GetTask", f"{LIFECYCLE}/SettleCompletion"}
    for call in calls:
        parent = by_id[call.parent_id]
        assert parent is server or (parent in outbox and call.name == f"{LIFECYCLE}/SettleCompletion"), parent
        assert call.attribute("rpc.grpc.status_code") == 0
        served = only(spans, service="lifecycle_service", parent_id=call.span_id)
        assert (served.name, served.span.kind, served.attribute("rpc.grpc.status_code")) == (call.name, SERVER, 0)
    assert len(spans) == 1 + len(outbox) + 2 * len(calls)

    # A refused call is traced with its gRPC code (PERMISSION_DENIED: the caller's
    # problem, so the span's status stays unset).
    outsider = credentials.token("host-2", ["ws-2:host"])
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await p.cs.GetCompletion(
            completion_messages.GetCompletionRequest(workspace_id=WS, task_id="task-1", generation=1),
            metadata=credentials.metadata(outsider),
            timeout=CALL_TIMEOUT,
        )
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    refused_trace = trace_id_of(p.client_span(f"{COMPLETION}/GetCompletion"))
    denied = await p.collector.wait_for(
        "span of the refused call",
        lambda spans: next((s for s in spans if s.trace_id == refused_trace), None),
    )
    assert denied.attribute("rpc.grpc.status_code") == grpc.StatusCode.PERMISSION_DENIED.value[0]
    assert denied.span.status.code == trace_pb2.Status.STATUS_CODE_UNSET


async def test_a_settlement_retried_after_the_lifecycle_service_came_back_joins_the_attempts_trace(pair):
    p = pair
    claim = await registered_and_claimed(p, "task-1")
    # The lifecycle service dies as the settlement reaches it (SIGKILL, before its commit).
    p.arm_lifecycle("lifecycle.before_commit:crash:1")
    answer = await attempt(p, claim)
    assert answer.completion.settlement == completion_enums.SETTLEMENT_STATUS_PENDING
    assert await asyncio.to_thread(p.lifecycle.process.wait, 10) != 0
    p.arm_lifecycle("")
    attempt_trace = trace_id_of(p.client_span(f"{COMPLETION}/AttemptCompletion"))
    await p.start_lifecycle()  # same port, same database

    # The outbox settles it, in a span of the attempt's trace: the outbox's span,
    # its call to the lifecycle service, and the lifecycle service's span of it.
    def retried(spans: list[Exported]) -> tuple[Exported, Exported, Exported] | None:
        by_id = {s.span_id: s for s in spans}
        for served in spans:
            if served.service == "lifecycle_service" and served.name == f"{LIFECYCLE}/SettleCompletion":
                call = by_id.get(served.parent_id)
                outbox = by_id.get(call.parent_id) if call else None
                if call and outbox:
                    return outbox, call, served
        return None

    outbox, call, served = await p.collector.wait_for("retried settlement", retried, timeout=30.0)
    spans = [s for s in p.collector.spans if s.trace_id == attempt_trace]
    server = only(spans, service="completion_service", kind=SERVER)
    assert {outbox.trace_id, call.trace_id, served.trace_id} == {attempt_trace}
    assert (served.span.kind, served.attribute("rpc.grpc.status_code")) == (SERVER, 0)
    assert (call.service, call.span.kind, call.name) == ("completion_service", CLIENT, f"{LIFECYCLE}/SettleCompletion")
    assert (outbox.service, outbox.name, outbox.span.kind) == (
        "completion_service",
        "settle pending completion",
        INTERNAL,
    )
    # A child of the attempt's span, which ended before the retry began.
    assert outbox.parent_id == server.span_id
    assert outbox.span.start_time_unix_nano > server.span.end_time_unix_nano
    assert outbox.attribute("funnel.completion_id") == answer.completion.completion_id
    # The settlement that met the dying service is in the same trace, failed.
    failed = [
        s
        for s in spans
        if s.span.kind == CLIENT and s.name == f"{LIFECYCLE}/SettleCompletion" and s.parent_id == server.span_id
    ]
    assert [s.attribute("rpc.grpc.status_code") for s in failed] == [grpc.StatusCode.UNAVAILABLE.value[0]]
    settled = await p.cs.GetCompletion(
        completion_messages.GetCompletionRequest(workspace_id=WS, task_id="task-1", generation=1), timeout=CALL_TIMEOUT
    )
    assert settled.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED


async def test_the_console_exporter_writes_each_span_as_one_json_line_to_the_service_log(tmp_path):
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "lifecycle-east", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    log = tmp_path / "lifecycle.log"
    service = await asyncio.to_thread(
        spawn,
        "lifecycle_service",
        "lifecycle_service",
        [
            "--listen",
            "127.0.0.1:0",
            "--database",
            str(tmp_path / "lifecycle.sqlite3"),
            *lifecycle_tls_arguments(credentials.PKI),
        ],
        log,
        env,
    )
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    try:
        async with credentials.tls_channel(service.address) as channel:
            await lifecycle_grpc.TaskLifecycleServiceStub(channel).RegisterTask(
                lifecycle_messages.RegisterTaskRequest(
                    workspace_id=WS,
                    task_id="task-1",
                    request_id="register-1",
                    cause=lifecycle_types.Cause(source="host", reason="planned"),
                ),
                metadata=(("traceparent", f"00-{trace_id}-{parent_id}-01"),),
                timeout=CALL_TIMEOUT,
            )
    finally:
        assert await asyncio.to_thread(service.stop, 10) == 0  # stopping exports what is still buffered
    # The log's own lines may be JSON too; a span is the object with a span context.
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.startswith("{")]
    [span] = [s for s in lines if "context" in s and s["name"] == f"{LIFECYCLE}/RegisterTask"]
    assert (span["context"]["trace_id"], span["parent_id"], span["kind"]) == (
        f"0x{trace_id}",
        f"0x{parent_id}",
        "SpanKind.SERVER",
    )
    assert span["attributes"]["rpc.grpc.status_code"] == 0
    assert span["resource"]["attributes"]["service.name"] == "lifecycle-east"


def test_an_exporter_that_is_not_installed_refuses_the_start(tmp_path):
    log = tmp_path / "lifecycle.log"
    with pytest.raises(StartupFailed):
        spawn(
            "lifecycle_service",
            "lifecycle_service",
            [
                "--listen",
                "127.0.0.1:0",
                "--database",
                str(tmp_path / "lifecycle.sqlite3"),
                *lifecycle_tls_arguments(credentials.PKI),
            ],
            log,
            {"OTEL_TRACES_EXPORTER": "zipkin_json"},
        )
    assert "refuses to start: OTEL_TRACES_EXPORTER asks for 'zipkin_json', which is not installed" in log.read_text()


@pytest.mark.parametrize(
    ("env", "exporters"),
    [
        ({}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, ["otlp", "console"]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, []),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, []),
    ],
)
def test_only_an_exporter_or_an_endpoint_in_the_environment_installs_the_sdk(monkeypatch, env, exporters):
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert tracing.exporter_names() == exporters
    if not exporters:
        assert not tracing.configure_tracing("lifecycle_service").exporting


async def test_without_an_exporter_a_service_makes_no_spans_but_passes_the_callers_context_on(start_pair):
    # The completion service has no exporter; the lifecycle service writes its spans to its log.
    p = await start_pair(
        lifecycle_env={"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "50"}, completion_env={}
    )
    answer = await attempt(p, await registered_and_claimed(p, "task-1"))
    assert answer.completion.settlement == completion_enums.SETTLEMENT_STATUS_SETTLED
    assert p.lifecycle is not None and await asyncio.to_thread(p.lifecycle.stop, 10) == 0
    client = p.client_span(f"{COMPLETION}/AttemptCompletion")
    lines = [
        json.loads(line)
        for line in (p.directory / "lifecycle.log").read_text(encoding="utf-8").splitlines()
        if line.startswith("{")
    ]
    served = {s["name"]: s for s in lines if "context" in s and s["context"]["trace_id"] == f"0x{trace_id_of(client)}"}
    # The completion service made no span of its own between the client's and the lifecycle service's.
    assert set(served) == {f"{LIFECYCLE}/GetTask", f"{LIFECYCLE}/SettleCompletion"}
    assert {s["parent_id"] for s in served.values()} == {f"0x{span_id_of(client)}"}
    assert "exporting traces" not in (p.directory / "completion.log").read_text(encoding="utf-8")
