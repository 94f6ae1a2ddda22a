"""The per-RPC series (funnel.runtime.metrics.RpcMetrics) are plain counts read
at scrape time; a scrape must show what prometheus_client's own Counter,
Histogram and Gauge would show for the same calls, which is what they were
before and what dashboards and alerts read (go-grpc-prometheus's names)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from funnel.runtime.metrics import RPC_BUCKETS, RpcMetrics

CALL = ("grpc_service", "grpc_method", "grpc_type")
METHODS = [("funnel.lifecycle.v1.TaskLifecycleService", "GetTask", "unary"), ("s", "Watch", "server_stream")]
CODES = [("OK", ""), ("NOT_FOUND", "TASK_NOT_FOUND"), ("UNAVAILABLE", "STORAGE_UNAVAILABLE")]


class Reference:
    """The series as the library's own metric objects record them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.started = Counter("grpc_server_started", "RPCs started on the server.", CALL, registry=self.registry)
        self.handled = Counter(
            "grpc_server_handled",
            "RPCs completed on the server, by gRPC code and ErrorInfo reason (empty for OK).",
            (*CALL, "grpc_code", "reason"),
            registry=self.registry,
        )
        self.seconds = Histogram(
            "grpc_server_handling_seconds",
            "Time from the start of an RPC to its status, in seconds.",
            CALL,
            buckets=RPC_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "grpc_server_in_flight_requests", "RPCs started and not finished.", CALL, registry=self.registry
        )
        for call in METHODS:
            self.started.labels(*call)
            self.seconds.labels(*call)
            self.in_flight.labels(*call)

    def start(self, call: tuple[str, str, str]) -> None:
        self.started.labels(*call).inc()
        self.in_flight.labels(*call).inc()

    def finish(self, call: tuple[str, str, str], code: str, reason: str, seconds: float) -> None:
        self.in_flight.labels(*call).dec()
        self.handled.labels(*call, code, reason).inc()
        self.seconds.labels(*call).observe(seconds)


def scraped(registry: CollectorRegistry) -> dict[str, tuple[str, str, list]]:
    """Each family's type, help and samples (in a fixed order: a scrape's order
    of samples within a family means nothing)."""
    text = generate_latest(registry).decode()
    return {
        family.name: (family.type, family.documentation, sorted(family.samples, key=repr))
        for family in text_string_to_metric_families(text)
    }


seconds = st.one_of(st.sampled_from([0.0, *RPC_BUCKETS, 11.0]), st.floats(min_value=0, max_value=30, allow_nan=False))
calls = st.lists(
    st.tuples(st.sampled_from(range(len(METHODS))), st.sampled_from(CODES), seconds, st.booleans()), max_size=40
)


@settings(max_examples=60, deadline=None)
@given(calls)
def test_a_scrape_shows_what_the_librarys_metrics_would(made):
    registry = CollectorRegistry()
    rpc = RpcMetrics(registry)
    methods = [rpc.method(*call) for call in METHODS]
    reference = Reference()
    for index, (code, reason), took, finishes in made:
        methods[index].start()
        reference.start(METHODS[index])
        if finishes:
            methods[index].finish(code, reason, took)
            reference.finish(METHODS[index], code, reason, took)
    assert scraped(registry) == scraped(reference.registry)


def test_a_second_collector_of_the_same_series_is_refused():
    registry = CollectorRegistry()
    RpcMetrics(registry)
    with pytest.raises(ValueError, match="grpc_server_started"):
        RpcMetrics(registry)


def test_a_scrape_from_another_thread_while_calls_finish_stays_consistent():
    """The metrics endpoint scrapes on its own thread while the event loop's
    thread counts: every scrape parses, no count ever goes backwards, and the
    in-flight gauge (started less finished) is never below zero."""
    registry = CollectorRegistry()
    method = RpcMetrics(registry).method(*METHODS[0])
    done = threading.Event()

    def count() -> None:
        for _ in range(20_000):
            method.start()
            method.finish("OK", "", 0.003)
        done.set()

    worker = threading.Thread(target=count)
    worker.start()
    last = 0.0
    while not done.is_set():
        families = scraped(registry)
        started = next(s.value for s in families["grpc_server_started"][2] if s.name == "grpc_server_started_total")
        assert started >= last
        last = started
        assert all(s.value >= 0 for s in families["grpc_server_in_flight_requests"][2])
    worker.join()
    families = scraped(registry)
    histogram = families["grpc_server_handling_seconds"][2]
    values = {s.name: s.value for s in histogram if s.labels.get("le") in (None, "+Inf")}
    assert values["grpc_server_handling_seconds_count"] == 20_000
    assert values["grpc_server_handling_seconds_bucket"] == 20_000
