"""Operating the pair as an operator would: `funnel up --demo` with both metrics
endpoints on, one call denied by a token for another workspace, then a scrape
of both endpoints over HTTP and a read of both service logs. The RPC and domain
series carry the story's counts; every log line is a JSON object, each request
has its line (with caller, workspace, task, duration and trace id), and the
denied call's line says who was denied and why."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from funnel.runtime import logs
from tests.postgres import fresh_database
from tests.prometheus import Samples, scrape, value

FUNNEL = Path(sys.executable).parent / "funnel"
LIFECYCLE = "funnel.lifecycle.v1.TaskLifecycleService"
COMPLETION = "funnel.completion.v1.CompletionService"


def handled(samples: Samples, service: str, method: str, code: str = "OK", reason: str = "") -> float | None:
    return value(
        samples,
        "grpc_server_handled_total",
        grpc_service=service,
        grpc_method=method,
        grpc_type="unary",
        grpc_code=code,
        reason=reason,
    )


def scraped_when(url: str, ready: Callable[[Samples], object], what: str, timeout: float = 30.0) -> Samples:
    """The endpoint's samples once `ready` holds for them."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(url)
        if ready(samples):
            return samples
        assert time.monotonic() < deadline, f"the endpoint never showed {what}"
        time.sleep(0.1)


def log_lines(path: Path) -> list[dict]:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines, f"{path} is empty"
    return [json.loads(line) for line in lines]  # every line is a JSON object, or this fails


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_after_the_demo_both_endpoints_and_both_logs_tell_the_story(tmp_path, backend):
    data = tmp_path / "data"
    database = ["--database", fresh_database()] if backend == "postgresql" else []
    env = {
        **os.environ,
        "FUNNEL_LIFECYCLE_METRICS_INTERVAL": "0.1",
        "FUNNEL_COMPLETION_METRICS_INTERVAL": "0.1",
        # Spans to the service logs: every request line then carries its trace id.
        "OTEL_TRACES_EXPORTER": "console",
    }
    up = subprocess.Popen(
        [
            str(FUNNEL),
            "up",
            "--demo",
            "--data-dir",
            str(data),
            "--lifecycle-port",
            "0",
            "--completion-port",
            "0",
            "--lifecycle-metrics-port",
            "0",
            "--completion-metrics-port",
            "0",
            *database,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = up.stdout.readline()
            assert line, "\n".join(lines)
            lines.append(line.rstrip())
            if line.startswith("Demo finished"):
                break
        output = "\n".join(lines)
        addresses = dict(re.findall(r"^(lifecycle|completion)_service +(127\.0\.0\.1:\d+) ", output, re.M))
        urls = dict(re.findall(r"^(lifecycle|completion)_service metrics +(http://\S+/metrics)$", output, re.M))
        assert set(urls) == {"lifecycle", "completion"}, output
        task = next(line.split()[3] for line in lines if line.startswith("1. register"))

        # A caller of another workspace tries the story: RegisterTask is denied.
        token = subprocess.run(
            [
                str(FUNNEL),
                "token",
                "issue",
                "--workspace",
                "elsewhere",
                "--role",
                "host",
                "--subject",
                "intruder",
                "--data-dir",
                str(data),
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
        intruder = subprocess.run(
            [
                str(FUNNEL),
                "demo",
                "--lifecycle",
                addresses["lifecycle"],
                "--completion",
                addresses["completion"],
                "--data-dir",
                str(data),
                "--token",
                token,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert intruder.returncode == 1 and "PERMISSION_DENIED" in intruder.stderr, intruder.stderr

        # A call is counted after its status went out, so the intruder can exit first.
        lifecycle = scraped_when(
            urls["lifecycle"],
            lambda samples: handled(samples, LIFECYCLE, "RegisterTask", "PERMISSION_DENIED", "WORKSPACE_NOT_GRANTED"),
            "the denied call",
        )
        # The size is set by the same refresh as the outbox gauges, which start at 0.
        completion = scraped_when(
            urls["completion"],
            lambda samples: (
                value(samples, "funnel_db_size_bytes") and value(samples, "funnel_completion_outbox_pending") == 0
            ),
            "the settled story",
        )
    finally:
        up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=30)
    assert up.returncode == 0, rest

    # -- per RPC -------------------------------------------------------------------
    assert handled(lifecycle, LIFECYCLE, "RegisterTask") == 1
    assert handled(lifecycle, LIFECYCLE, "RegisterTask", "PERMISSION_DENIED", "WORKSPACE_NOT_GRANTED") == 1
    assert (
        value(
            lifecycle,
            "grpc_server_started_total",
            grpc_service=LIFECYCLE,
            grpc_method="RegisterTask",
            grpc_type="unary",
        )
        == 2
    )
    assert handled(lifecycle, LIFECYCLE, "SettleCompletion") == 1
    assert handled(completion, COMPLETION, "AttemptCompletion") == 2
    assert (
        value(
            completion,
            "grpc_server_handling_seconds_count",
            grpc_service=COMPLETION,
            grpc_method="AttemptCompletion",
            grpc_type="unary",
        )
        == 2
    )
    for service, samples in ((LIFECYCLE, lifecycle), (COMPLETION, completion)):
        in_flight = {
            dict(labels)["grpc_method"]: v
            for (name, labels), v in samples.items()
            if name == "grpc_server_in_flight_requests"
        }
        # Nothing in flight but the completion service's stream of the demo workspace's lifecycle events.
        watching = {"WatchLifecycleEvents": 1} if service == LIFECYCLE else {}
        assert in_flight and {m: v for m, v in in_flight.items() if v} == watching, (service, in_flight)

    # -- the completion domain -------------------------------------------------------
    assert value(completion, "funnel_completion_attempts_total", verdict="SOFT_BLOCK", gate="evidence.required") == 1
    assert value(completion, "funnel_completion_attempts_total", verdict="ALLOW", gate="") == 1
    assert value(completion, "funnel_completion_settlements_total", status="SETTLED") == 1
    assert value(completion, "funnel_completion_circuit_breaker_trips_total") == 0
    assert value(completion, "funnel_completion_outbox_pending") == 0
    assert value(completion, "funnel_completion_outbox_oldest_age_seconds") == 0
    assert value(completion, "funnel_completion_open_runs") == 0  # CompleteRun closed the story's run
    assert value(completion, "funnel_completion_active_leases") == 0

    # -- the lifecycle domain ----------------------------------------------------------
    for kind, state in (
        ("REGISTER_TASK", "REGISTERED"),
        ("ACTIVATE_GENERATION", "ACTIVE"),
        ("SETTLE_COMPLETION", "TERMINAL"),
    ):
        assert value(lifecycle, "funnel_lifecycle_transitions_total", kind=kind, state=state) == 1
    assert value(lifecycle, "funnel_lifecycle_propagations_pending") == 0
    assert value(lifecycle, "funnel_request_ids") >= 1  # the demo registers its task with a request id

    # -- both: the database --------------------------------------------------------------
    for samples in (lifecycle, completion):
        assert value(samples, "funnel_db_commit_seconds_count") >= 1
        assert value(samples, "funnel_db_commit_group_size_count") == value(samples, "funnel_db_commit_seconds_count")
        if backend == "postgresql":  # one commit, one unit of work
            groups = value(samples, "funnel_db_commit_group_size_sum")
            assert groups == value(samples, "funnel_db_commit_group_size_count")
        assert value(samples, "funnel_db_size_bytes") > 0
        assert value(samples, "funnel_request_ids") is not None
        assert value(samples, "funnel_watch_streams") == (1 if samples is lifecycle else 0)  # the projection's

    # -- the logs --------------------------------------------------------------------------
    logs = {name: log_lines(data / f"{name}.log") for name in ("lifecycle", "completion")}
    for name, entries in logs.items():
        for entry in entries:
            if "level" in entry:  # a log line (the console exporter's spans are JSON lines too)
                assert {"time", "level", "logger", "message"} <= set(entry), entry
        events = [entry.get("event") for entry in entries]
        assert events.count("start") == 1 and events.count("stopped") == 1, name
        # Start-up's objects are kept out of the collector's full passes (funnel/runtime/server.py).
        (start,) = [entry for entry in entries if entry.get("event") == "start"]
        assert start["frozen_objects"] > 10_000, start
        requests = [entry for entry in entries if entry.get("event") == "rpc"]
        samples = lifecycle if name == "lifecycle" else completion
        # One line per request: as many as the metrics counted (before the scrape: no call came after),
        # and one for each stream still open then (it ended when the services stopped).
        counted = sum(
            v
            for (metric, _), v in samples.items()
            if metric in ("grpc_server_handled_total", "grpc_server_in_flight_requests")
        )
        assert len(requests) == counted, name
        for entry in requests:
            assert {"service", "method", "code", "duration_ms", "workspace", "trace_id"} <= set(entry), entry
            assert re.fullmatch(r"[0-9a-f]{32}", entry["trace_id"]) and entry["trace_id"] != "0" * 32, entry
            assert entry["subject"] and (entry["code"] != "OK" or entry["role"]), entry
            assert entry["workspace"] == "demo" and entry["duration_ms"] >= 0, entry
    denied = [entry for entry in logs["lifecycle"] if entry.get("code") == "PERMISSION_DENIED"]
    assert len(denied) == 1, denied
    assert denied[0]["level"] == "WARNING"
    assert (denied[0]["method"], denied[0]["subject"], denied[0]["reason"]) == (
        "RegisterTask",
        "intruder",
        "WORKSPACE_NOT_GRANTED",
    )
    # The story's own calls name its task; the settlement has its background line.
    attempts = [e for e in logs["completion"] if e.get("event") == "rpc" and e["method"] == "AttemptCompletion"]
    assert [e["task"] for e in attempts] == [task, task] and all(e["run"] for e in attempts)
    [settled] = [e for e in logs["completion"] if e.get("event") == "settlement"]
    assert (settled["result"], settled["task"], settled["workspace"]) == ("SETTLED", task, "demo")
    # The settlement is part of the allowed attempt's trace, on both services.
    [settle_call] = [e for e in logs["lifecycle"] if e.get("method") == "SettleCompletion"]
    assert settled["trace_id"] == attempts[1]["trace_id"] == settle_call["trace_id"]


def test_on_a_terminal_format_the_lines_read_as_text_and_a_busy_metrics_port_refuses_the_start(tmp_path):
    """`--log-format text` (what a terminal gets by default): the classic line
    followed by key=value fields; the metrics endpoint stops with the service;
    a metrics address already taken refuses the start with its reason."""
    service = [
        sys.executable,
        "-m",
        "lifecycle_service",
        "--listen",
        "127.0.0.1:0",
        "--insecure",
        "--no-auth",
        "--database",
        str(tmp_path / "lifecycle.sqlite3"),
        "--metrics-listen",
        "127.0.0.1:0",
    ]
    process = subprocess.Popen(
        [*service, "--log-format", "text"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        metrics_line = process.stdout.readline()
        assert process.stdout.readline().startswith("lifecycle_service serving on 127.0.0.1:")
        url = metrics_line.split()[-1]
        assert metrics_line.startswith("lifecycle_service metrics on http://127.0.0.1:")
        assert value(scrape(url), "funnel_watch_streams") == 0
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()
    log = process.stderr.read()
    process.stderr.close()
    assert re.search(
        r"INFO funnel\.runtime\.server: lifecycle_service serving on port \d+ event=start "
        r"service=lifecycle_service port=\d+ metrics=http://127\.0\.0\.1:\d+/metrics",
        log,
    ), log
    assert "lifecycle_service stopped event=stopped" in log
    with pytest.raises(OSError):  # the endpoint closed its socket when the service stopped
        urllib.request.urlopen(url, timeout=2)

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = subprocess.run([*service[:-1], f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1
    assert f"lifecycle_service refuses to start: cannot serve metrics on 127.0.0.1:{port}" in refused.stderr


def test_a_log_line_does_not_look_up_its_callers_source_thread_or_process(monkeypatch):
    # Neither format shows them; configure() turns the lookups off (funnel/runtime/logs.py).
    for flag in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, flag, getattr(logging, flag))
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logs.configure("INFO", "json")
    root.addHandler(Keep())
    logging.getLogger("funnel.test").info("a line", extra=logs.fields(event="test"))
    (record,) = records
    assert (record.lineno, record.thread, record.process) == (0, None, None)
    assert json.loads(root.handlers[0].format(record))["event"] == "test"
