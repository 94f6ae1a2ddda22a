"""Watch-stream benchmark: many WatchLifecycleEvents streams while transitions commit.

    .venv/bin/python bench/watchers.py [--tasks 1000] [--unfiltered 10] [--rate 200]
                                       [--seconds 10] [--processes 2] [--json out.json]

Starts both services (file SQLite, as bench/run.py does), registers --tasks tasks in
one workspace, then opens one stream filtered to each task plus --unfiltered streams
on the whole workspace, spread over --processes watcher processes (one asyncio loop
and one gRPC channel each). A driver in this process then commits --rate transitions
per second for --seconds, open loop (paced, not waiting for answers): SetWorkStatus
toggles (READY <-> BLOCKED) round-robin over the tasks, and every 10th transition a
new task registration (seen only by the unfiltered streams).

Checks that every stream receives exactly the events that match it, in order, no
gaps, no duplicates, nothing foreign (a stream that ends with an error, e.g.
WATCH_OVERFLOW, is resumed from its last sequence, as the contract says, and counted);
measures the delivery lag (receive time minus the event's commit_time: same machine,
same clock) and the services' resident memory and CPU.

The services run secured as in production (bench/common.py: TLS, client certificates
at the lifecycle listener, JWT auth, no per-caller rate limit); the watchers and the
driver call over TLS with the local client certificate and bearer tokens: each
watcher process as its own viewer (`bench-watcher-<n>`, `bench-watch:viewer`), the
driver as the host (`bench-host`, `bench-watch:host`). The lifecycle service's
watch-stream caps (--max-watchers-per-caller, --max-watchers-per-workspace) are
raised to the number of streams opened (plus room for resumed ones).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TypedDict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import grpc

from bench.common import (
    HOST_SUBJECT,
    Credentials,
    cpu_snapshot,
    hwm_mb,
    load_average,
    machine_facts,
    percentile,
    print_facts,
    rss_mb,
    start_services,
)
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import service_pb2_grpc as lifecycle_grpc

WORKSPACE = "bench-watch"
CALL_TIMEOUT = 30.0


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def task_name(i: int) -> str:
    return f"w-{i:05d}"


class WatcherReport(TypedDict):
    """What a watcher process prints on its RESULT line (as JSON) for the driver."""

    streams: int
    complete: int
    missing: int
    duplicates: int
    foreign: int
    out_of_order: int
    errors: int
    error_samples: list[str]
    lags_filtered: list[float]
    lags_unfiltered: list[float]
    incomplete_samples: list[dict[str, object]]


# -- a watcher process ----------------------------------------------------------------


async def watcher_main(config: dict) -> None:
    """Runs in its own process: opens the streams, says READY, records every event
    with its receive time, and when told which events were committed, waits for them
    (up to a timeout) and reports."""
    credentials = Credentials(config["tls_dir"])
    channel = credentials.lifecycle_channel(config["lifecycle"])
    stub = lifecycle_grpc.TaskLifecycleServiceStub(channel)
    metadata = credentials.metadata(config["subject"], [f"{WORKSPACE}:viewer"])
    cursor0 = config["after_sequence"]
    streams: list[dict] = [{"task": t, "received": [], "lags": [], "errors": []} for t in config["tasks"]]
    streams += [{"task": None, "received": [], "lags": [], "errors": []} for _ in range(config["unfiltered"])]
    stopping = False

    async def follow(stream: dict) -> None:
        cursor = cursor0
        while not stopping:
            request = lifecycle_messages.WatchLifecycleEventsRequest(
                workspace_id=WORKSPACE, after_sequence=cursor, task_id=stream["task"] or ""
            )
            call = stub.WatchLifecycleEvents(request, metadata=metadata)
            try:
                async for response in call:
                    now = time.time_ns()
                    event = response.event
                    commit = event.commit_time.seconds * 1_000_000_000 + event.commit_time.nanos
                    stream["received"].append((event.sequence, event.task_id))
                    stream["lags"].append((now - commit) / 1e6)
                    cursor = event.sequence
                return
            except grpc.aio.AioRpcError as exc:
                if stopping and exc.code() == grpc.StatusCode.CANCELLED:
                    return
                stream["errors"].append(f"{exc.code().name}: {exc.details()}")
                await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(follow(s)) for s in streams]
    await asyncio.sleep(config["settle_s"])
    print("READY", flush=True)
    loop = asyncio.get_running_loop()
    line = await loop.run_in_executor(None, sys.stdin.readline)
    expected = json.loads(Path(line.strip()).read_text())  # [[sequence, task_id], ...] in commit order
    by_task: dict[str, list[int]] = {}
    for sequence, task_id in expected:
        by_task.setdefault(task_id, []).append(sequence)
    all_sequences = [s for s, _ in expected]

    def want(stream: dict) -> list[int]:
        return all_sequences if stream["task"] is None else by_task.get(stream["task"], [])

    deadline = time.monotonic() + config["drain_timeout_s"]
    while time.monotonic() < deadline:
        if all(len(s["received"]) >= len(want(s)) for s in streams):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # anything extra that was still on its way
    stopping = True
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await channel.close()

    report: WatcherReport = {
        "streams": len(streams),
        "complete": 0,
        "missing": 0,
        "duplicates": 0,
        "foreign": 0,
        "out_of_order": 0,
        "errors": 0,
        "error_samples": [],
        "lags_filtered": [],
        "lags_unfiltered": [],
        "incomplete_samples": [],
    }
    for stream in streams:
        got = [s for s, _ in stream["received"]]
        wanted = want(stream)
        wanted_set = set(wanted)
        missing = len(wanted_set - set(got))
        duplicates = len(got) - len(set(got))
        foreign = sum(
            1 for s, t in stream["received"] if s not in wanted_set or (stream["task"] and t != stream["task"])
        )
        out_of_order = sum(1 for a, b in itertools.pairwise(got) if b <= a)
        report["missing"] += missing
        report["duplicates"] += duplicates
        report["foreign"] += foreign
        report["out_of_order"] += out_of_order
        report["errors"] += len(stream["errors"])
        report["error_samples"] += stream["errors"][:1]
        if not (missing or duplicates or foreign or out_of_order):
            report["complete"] += 1
        elif len(report["incomplete_samples"]) < 5:
            report["incomplete_samples"].append(
                {
                    "task": stream["task"],
                    "wanted": len(wanted),
                    "got": len(got),
                    "missing": missing,
                    "duplicates": duplicates,
                    "foreign": foreign,
                }
            )
        lags = report["lags_unfiltered"] if stream["task"] is None else report["lags_filtered"]
        lags.extend(stream["lags"])
    report["error_samples"] = report["error_samples"][:5]
    print("RESULT " + json.dumps(report), flush=True)


# -- the driver ------------------------------------------------------------------------


async def register_tasks(stub, count: int, metadata) -> int:
    """Registers the watched tasks; returns the last sequence (the watchers' cursor)."""
    last = 0
    numbers = iter(range(count))

    async def worker() -> None:
        nonlocal last
        for i in numbers:
            response = await stub.RegisterTask(
                lifecycle_messages.RegisterTaskRequest(
                    workspace_id=WORKSPACE, task_id=task_name(i), request_id=f"{task_name(i)}:register"
                ),
                timeout=CALL_TIMEOUT,
                metadata=metadata,
            )
            last = max(last, response.event.sequence)

    await asyncio.gather(*(worker() for _ in range(32)))
    return last


async def drive(stub, tasks: int, rate: float, seconds: float, metadata) -> dict:
    """Open loop: transition k is issued at t0 + k / rate, whatever the answers do."""
    committed: list[tuple[int, str]] = []
    latencies: list[float] = []
    failures: dict[str, int] = {}
    status: dict[str, lifecycle_enums.WorkStatus] = {}
    total = int(rate * seconds)
    in_flight: set[asyncio.Task] = set()
    max_in_flight = 0
    behind_max = 0.0

    async def one(k: int) -> None:
        request: lifecycle_messages.RegisterTaskRequest | lifecycle_messages.SetWorkStatusRequest
        if k % 10 == 9:
            name = f"x-{k:07d}"
            request = lifecycle_messages.RegisterTaskRequest(
                workspace_id=WORKSPACE, task_id=name, request_id=f"{name}:register"
            )
            call = stub.RegisterTask
        else:
            name = task_name(k % tasks)
            new = (
                lifecycle_enums.WORK_STATUS_BLOCKED
                if status.get(name, lifecycle_enums.WORK_STATUS_READY) == lifecycle_enums.WORK_STATUS_READY
                else lifecycle_enums.WORK_STATUS_READY
            )
            status[name] = new
            request = lifecycle_messages.SetWorkStatusRequest(
                workspace_id=WORKSPACE, task_id=name, generation=1, work_status=new, request_id=f"{name}:ws:{k}"
            )
            call = stub.SetWorkStatus
        t = time.perf_counter()
        try:
            response = await call(request, timeout=CALL_TIMEOUT, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            key = f"{exc.code().name}: {exc.details()}"
            failures[key] = failures.get(key, 0) + 1
            return
        latencies.append(time.perf_counter() - t)
        committed.append((response.event.sequence, response.event.task_id))

    t0 = time.perf_counter()
    for k in range(total):
        due = t0 + k / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            behind_max = max(behind_max, -delay)
        task = asyncio.create_task(one(k))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        max_in_flight = max(max_in_flight, len(in_flight))
    await asyncio.gather(*list(in_flight))
    elapsed = time.perf_counter() - t0
    committed.sort()
    latencies.sort()
    return {
        "issued": total,
        "committed": committed,
        "elapsed_s": elapsed,
        "rate": len(committed) / elapsed,
        "failures": failures,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "max_in_flight": max_in_flight,
        "pacer_behind_max_ms": behind_max * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=1000, help="tasks, one filtered stream each (default 1000)")
    parser.add_argument("--unfiltered", type=int, default=10, help="streams on the whole workspace (default 10)")
    parser.add_argument("--rate", type=float, default=200.0, help="transitions per second (default 200)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the driver commits (default 10)")
    parser.add_argument("--processes", type=int, default=2, help="watcher processes (default 2)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds the streams get to attach before driving")
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=15.0,
        help="seconds the watchers wait for missing events after the drive (default 15)",
    )
    parser.add_argument("--data-dir", default=None, help="databases and logs (default: a temp dir, removed at the end)")
    parser.add_argument("--json", default=None, metavar="FILE")
    parser.add_argument("--watch-client", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.watch_client:
        asyncio.run(watcher_main(json.loads(args.watch_client)))
        return 0

    facts = machine_facts()
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="funnel-watch-"))
    log(f"data directory: {data_dir}")
    # Every stream is admitted: the caps at least the streams opened, with room for resumes.
    streams = args.tasks + args.unfiltered
    watch_caps = [
        "--max-watchers-per-caller",
        str(max(64, 2 * streams)),
        "--max-watchers-per-workspace",
        str(max(1024, 2 * streams)),
    ]
    services = start_services(data_dir, extra_lifecycle=watch_caps)
    credentials = Credentials(services.tls_dir)
    host = credentials.metadata(HOST_SUBJECT, [f"{WORKSPACE}:host"])
    watchers: list[subprocess.Popen[str]] = []
    report: dict = {
        "facts": facts,
        "config": vars(args),
        "startup_s": {"lifecycle": services.lifecycle_startup_s, "completion": services.completion_startup_s},
    }
    try:
        pids = services.pids
        report["rss_mb_idle"] = {n: rss_mb(p) for n, p in pids.items()}

        async def setup() -> int:
            async with credentials.lifecycle_channel(services.lifecycle.address) as channel:
                return await register_tasks(lifecycle_grpc.TaskLifecycleServiceStub(channel), args.tasks, host)

        t = time.monotonic()
        cursor = asyncio.run(setup())
        log(f"registered {args.tasks} tasks in {time.monotonic() - t:.1f}s; streams start after sequence {cursor}")

        names = [task_name(i) for i in range(args.tasks)]
        for p in range(args.processes):
            config = {
                "lifecycle": services.lifecycle.address,
                "tls_dir": services.tls_dir,
                "subject": f"bench-watcher-{p}",
                "after_sequence": cursor,
                "tasks": names[p :: args.processes],
                "unfiltered": args.unfiltered // args.processes + (1 if p < args.unfiltered % args.processes else 0),
                "settle_s": args.settle,
                "drain_timeout_s": args.drain_timeout,
            }
            watchers.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--watch-client", json.dumps(config)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for w in watchers:
            assert w.stdout is not None  # opened with stdout=PIPE
            line = w.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"a watcher process failed to start: {line!r}")
        report["rss_mb_streams_open"] = {n: rss_mb(p) for n, p in pids.items()}
        log(
            f"{args.tasks + args.unfiltered} streams open in {args.processes} processes; "
            f"driving {args.rate:g} transitions/s for {args.seconds:g}s ..."
        )
        all_pids = {**pids, **{f"watcher{i}": w.pid for i, w in enumerate(watchers)}}
        before = cpu_snapshot(all_pids)

        async def run_driver() -> dict:
            async with credentials.lifecycle_channel(services.lifecycle.address) as channel:
                return await drive(
                    lifecycle_grpc.TaskLifecycleServiceStub(channel), args.tasks, args.rate, args.seconds, host
                )

        driver = asyncio.run(run_driver())
        after = cpu_snapshot(all_pids)
        expected_path = data_dir / "expected_events.json"
        expected_path.write_text(json.dumps(driver["committed"]))
        for w in watchers:
            assert w.stdin is not None  # opened with stdin=PIPE
            w.stdin.write(f"{expected_path}\n")
            w.stdin.flush()
        results = []
        for w in watchers:
            assert w.stdout is not None  # opened with stdout=PIPE
            for line in w.stdout:
                if line.startswith("RESULT "):
                    results.append(json.loads(line[len("RESULT ") :]))
                    break
            w.wait(30)
        report["rss_mb_after"] = {n: {"rss": rss_mb(p), "peak": hwm_mb(p)} for n, p in pids.items()}
        report["cpu_s"] = {n: after[n] - before[n] for n in all_pids}
    finally:
        for w in watchers:
            if w.poll() is None:
                w.kill()
        services.stop()
        if not args.data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)

    filtered = sorted(lag for r in results for lag in r["lags_filtered"])
    unfiltered = sorted(lag for r in results for lag in r["lags_unfiltered"])
    every = sorted(filtered + unfiltered)
    totals = {
        k: sum(r[k] for r in results)
        for k in ("streams", "complete", "missing", "duplicates", "foreign", "out_of_order", "errors")
    }
    committed = len(driver["committed"])
    expected_deliveries = committed * args.unfiltered + sum(1 for s, t in driver["committed"] if t.startswith("w-"))
    report.update(
        driver={k: v for k, v in driver.items() if k != "committed"},
        committed_events=committed,
        expected_deliveries=expected_deliveries,
        deliveries=len(every),
        streams=totals,
        error_samples=[e for r in results for e in r["error_samples"]][:5],
        incomplete_samples=[e for r in results for e in r["incomplete_samples"]][:5],
        lag_ms={
            "all": {"p50": percentile(every, 50), "p99": percentile(every, 99), "max": every[-1] if every else 0},
            "filtered": {
                "p50": percentile(filtered, 50),
                "p99": percentile(filtered, 99),
                "max": filtered[-1] if filtered else 0,
            },
            "unfiltered": {
                "p50": percentile(unfiltered, 50),
                "p99": percentile(unfiltered, 99),
                "max": unfiltered[-1] if unfiltered else 0,
            },
        },
    )
    report["facts"]["load_average_at_end"] = load_average()

    print()
    print_facts(facts)
    print(
        f"\nwatch streams: {totals['streams']} ({args.tasks} filtered to one task, {args.unfiltered} unfiltered), "
        f"{args.processes} watcher processes"
    )
    d = report["driver"]
    print(
        f"driver: {committed} transitions committed in {d['elapsed_s']:.1f}s = {d['rate']:.0f}/s "
        f"(target {args.rate:g}/s; {sum(d['failures'].values())} failed; call p50 {d['p50_ms']:.1f} ms, "
        f"p99 {d['p99_ms']:.1f} ms; at most {d['max_in_flight']} in flight)"
    )
    for message, count in d["failures"].items():
        print(f"    {count} x {message}")
    ok = totals["complete"] == totals["streams"] and len(every) == expected_deliveries
    print(
        f"delivery: {len(every)} of {expected_deliveries} expected deliveries; "
        f"{totals['complete']}/{totals['streams']} "
        f"streams exact; missing {totals['missing']}, duplicates {totals['duplicates']}, foreign {totals['foreign']}, "
        f"out of order {totals['out_of_order']}, stream errors (resumed) {totals['errors']}"
        f"  -> {'NO LOSS' if ok else 'LOSS OR EXTRA EVENTS'}"
    )
    for sample in report["error_samples"]:
        print(f"    stream error: {sample}")
    for sample in report["incomplete_samples"]:
        print(f"    incomplete stream: {sample}")
    lag = report["lag_ms"]
    for key in ("all", "filtered", "unfiltered"):
        print(
            f"lag {key:<10} p50 {lag[key]['p50']:7.1f} ms  p99 {lag[key]['p99']:7.1f} ms  max {lag[key]['max']:7.1f} ms"
            + (
                "   (target p99 <= 100 ms: " + ("met" if lag[key]["p99"] <= 100 else "NOT MET") + ")"
                if key == "all"
                else ""
            )
        )
    print("time to SERVING: " + ", ".join(f"{n} {s:.2f}s" for n, s in report["startup_s"].items()))
    print(
        "RSS idle: "
        + ", ".join(f"{n} {m:.0f} MiB" for n, m in report["rss_mb_idle"].items())
        + "; streams open: "
        + ", ".join(f"{n} {m:.0f} MiB" for n, m in report["rss_mb_streams_open"].items())
    )
    print(
        "RSS after the run: "
        + ", ".join(
            f"{n} {m['rss']:.0f} MiB (peak {m['peak']:.0f}; target <= 200: {'met' if m['peak'] <= 200 else 'NOT MET'})"
            for n, m in report["rss_mb_after"].items()
        )
    )
    print(
        "CPU during the drive (s): "
        + ", ".join(f"{n} {s:.2f}" for n, s in report["cpu_s"].items())
        + f" over {d['elapsed_s']:.1f}s"
    )
    if args.json:
        for r in results:
            r.pop("lags_filtered"), r.pop("lags_unfiltered")
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
