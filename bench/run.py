"""The funnel benchmark: the real services against a bare gRPC echo chain of the same
shape, on this machine, in one run. See bench/README.md.

    .venv/bin/python bench/run.py [--seconds 10] [--concurrency 1,16,64]
                                  [--workload attempt,story] [--baseline-only]
                                  [--tasks-preload N [--compare-empty]] [--postgresql [URL] [--replicas 1,2]]
                                  [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import (
    ROOT,
    Credentials,
    Services,
    WaitSampler,
    completion_arguments,
    cpu_snapshot,
    ensure_pki,
    hwm_mb,
    integrity_check_seconds,
    lifecycle_arguments,
    load_average,
    machine_facts,
    print_facts,
    rss_mb,
    start_services,
    write_policy,
)

BENCH = Path(__file__).resolve().parent
PYTHON = sys.executable
# Issue 25's targets, at 16 in flight against the bare two-hop chain of the same run
# (they replace issue 13's 0.5x, 3x and 2 ms, which no lever reached).
TARGET_THROUGHPUT_RATIO = 0.35
TARGET_P99_RATIO = 4.0
TARGET_CPU_RATIO = 2.5  # all three processes per attempt vs the chain's per op
TARGET_WRITER_BUSY = 0.60  # the completion service's database writer
TARGET_BOUNDARY_MS = 0.08  # CPU the server boundary adds per unary call (bench/boundary.py)
# Issue 13's targets that hold.
TARGET_BYTES_PER_TASK = 3 * 1024  # both databases, per completed task, once request ids are swept
TARGET_STARTUP_S = 1.0
TARGET_PRELOAD_RATIO = 0.9
TARGET_CONCURRENCY = 16
# The footprint point: whole stories (register, claim, attempt, settled) at 16 in flight.
FOOTPRINT_SECONDS = 3.0
FOOTPRINT_CONCURRENCY = 16


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- child processes -------------------------------------------------------------


class Child:
    """A process speaking the client's line protocol (see bench/client.py)."""

    def __init__(self, argv: list[str], cwd: Path = ROOT) -> None:
        self.argv = argv
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=cwd)

    @property
    def pid(self) -> int:
        return self.process.pid

    def expect(self, prefix: str) -> str:
        assert self.process.stdout is not None  # opened with stdout=PIPE
        while True:
            line = self.process.stdout.readline()
            if not line:
                code = self.process.wait()
                raise RuntimeError(f"{self.argv[1]} exited with code {code} before printing {prefix!r}")
            if line.startswith(prefix):
                return line.rstrip("\n")

    def send(self, line: str) -> None:
        assert self.process.stdin is not None  # opened with stdin=PIPE
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def client(config: dict) -> Child:
    return Child([PYTHON, str(BENCH / "client.py"), json.dumps(config)])


def measure(
    config: dict,
    server_pids: dict[str, int],
    metrics: dict[str, str] | None = None,
    database_url: str | None = None,
    snapshot: Callable[[], dict] | None = None,
) -> dict:
    """Runs one client measurement and reads every process's CPU counters (and the
    commit time of each service whose metrics URL `metrics` names) right before GO
    and right after RESULT; on PostgreSQL (`database_url`) it also samples what the
    transactions wait for meanwhile (bench.common.WaitSampler). `snapshot`, when
    given, is taken at both moments too (result["snapshots"]: before, after)."""
    config = {**config, "wait_bye": True}
    metrics = metrics or {}
    child = client(config)
    sampler = WaitSampler(database_url) if database_url else None
    try:
        child.expect("READY")
        pids = {**server_pids, "client": child.pid}
        load = load_average()
        commits_before = {name: commit_seconds(url) for name, url in metrics.items()}
        snapshots = [snapshot()] if snapshot is not None else []
        before = cpu_snapshot(pids)
        if sampler is not None:
            sampler.start()
        child.send("GO")
        line = child.expect("RESULT ")
        waits = sampler.stop() if sampler is not None else None
        after = cpu_snapshot(pids)
        if snapshot is not None:
            snapshots.append(snapshot())
        commits_after = {name: commit_seconds(url) for name, url in metrics.items()}
        child.send("BYE")
        child.process.wait(30)
    finally:
        if sampler is not None:
            sampler.stop()
        child.stop()
    result = json.loads(line[len("RESULT ") :])
    ops = max(result["ops"], 1)
    cpu = {name: after[name] - before[name] for name in pids}
    result["cpu_s"] = cpu
    result["cpu_ms_per_op"] = {name: seconds * 1000 / ops for name, seconds in cpu.items()}
    result["cpu_ms_per_op"]["total"] = sum(cpu.values()) * 1000 / ops
    result["cores_busy"] = sum(cpu.values()) / result["elapsed_s"] if result["elapsed_s"] else 0.0
    result["load_average_before"] = load
    # The share of the point's time its writer spent committing (funnel_db_commit_seconds:
    # from a group's hand-over to the database thread until its answer is back).
    result["writer_busy"] = (
        {name: (commits_after[name] - commits_before[name]) / result["elapsed_s"] for name in metrics}
        if result["elapsed_s"]
        else {}
    )
    if waits is not None:
        result["waits"] = waits
    if snapshots:
        result["snapshots"] = snapshots
    return fold_replicas(result)


def fold_replicas(result: dict) -> dict:
    """Replicas measured as `lifecycle#2`, `completion#2`, ...: CPU added to their
    service's, writer busy shares averaged, so that a point reads like one process's."""
    for figure in ("cpu_s", "cpu_ms_per_op"):
        for name in [n for n in result[figure] if "#" in n]:
            result[figure][name.split("#")[0]] += result[figure].pop(name)
    busy = result["writer_busy"]
    for service in {n.split("#")[0] for n in busy}:
        shares = [busy.pop(n) for n in list(busy) if n.split("#")[0] == service]
        busy[service] = sum(shares) / len(shares)
    return result


def commit_seconds(url: str, sample: str = "funnel_db_commit_seconds_sum") -> float:
    """A sample of the commit histogram a service's metrics endpoint reports: the
    time spent committing (`_sum`, default) or the commits (`_count`)."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(sample):
                return float(line.split()[-1])
    raise RuntimeError(f"{url} reports no {sample}")


# -- calibration ----------------------------------------------------------------


def calibrate(data_dir: Path, request_ids: bool, pki) -> dict:
    """Starts the services on fresh databases, with a counting proxy between the
    completion and the lifecycle service, and walks a few tasks through the story:
    gives the message sizes, the lifecycle calls per client call, and the template
    task for --tasks-preload. Also reports the start-up times on empty databases.
    Secured as in bench.common.start_services; the proxy serves TLS with the
    lifecycle certificate and forwards with the completion service's identity
    certificate (see bench/client.py)."""
    import asyncio

    from funnel_cli import supervisor
    from funnel_cli.supervisor import spawn, wait_serving

    supervisor.READY_TIMEOUT = 600.0
    credentials = Credentials(pki.directory)
    policy = write_policy(data_dir)
    t0 = time.monotonic()
    lifecycle = spawn(
        "lifecycle_service",
        "lifecycle_service",
        [
            "--listen",
            "127.0.0.1:0",
            "--database",
            str(data_dir / "lifecycle.sqlite3"),
            *lifecycle_arguments(pki),
        ],
        data_dir / "lifecycle.log",
    )
    completion = None
    calibrator = None
    try:
        asyncio.run(wait_serving(credentials.lifecycle_connection(), lifecycle.address))
        lifecycle_startup = time.monotonic() - t0
        calibrator = client(
            {
                "mode": "calibrate",
                "lifecycle": lifecycle.address,
                "request_ids": request_ids,
                "task_prefix": "cal",
                "tls_dir": str(pki.directory),
            }
        )
        proxy = calibrator.expect("PROXY ").split()[1]
        t1 = time.monotonic()
        completion = spawn(
            "completion_service",
            "completion_service",
            [
                "--listen",
                "127.0.0.1:0",
                "--database",
                str(data_dir / "completion.sqlite3"),
                "--lifecycle-address",
                proxy,
                "--policy-file",
                str(policy),
                *completion_arguments(pki),
            ],
            data_dir / "completion.log",
        )
        asyncio.run(wait_serving(credentials.completion_connection(), completion.address))
        completion_startup = time.monotonic() - t1
        calibrator.send(completion.address)
        result = json.loads(calibrator.expect("RESULT ")[len("RESULT ") :])
    finally:
        if calibrator is not None:
            calibrator.stop()
        if completion is not None:
            completion.stop()
        lifecycle.stop()
    result["startup_s"] = {"lifecycle": lifecycle_startup, "completion": completion_startup}
    return result


def baseline_variants(calibration: dict, workloads: list[str]) -> dict[str, list[dict]]:
    """The echo-chain ops, shaped from the calibration's last story."""
    story = calibration["stories"][-1]
    sizes = story["sizes"]
    calls = story["lifecycle_calls"]

    def hops(method: str) -> list[list[int]]:
        return [[req, max(resp, 0)] for _, req, resp in calls[method]]

    attempt_hops = hops("AttemptCompletion")
    settle = [
        h for (m, *_), h in zip(calls["AttemptCompletion"], attempt_hops, strict=False) if m == "SettleCompletion"
    ]
    one_hop = settle[-1:] or attempt_hops[-1:]
    req, resp = sizes["AttemptCompletion"]
    # "as": whose token the call carries, as the real call would (see bench/client.py).
    variants = {"chain-1": [{"target": "front", "as": "agent", "request": req, "response": resp, "hops": one_hop}]}
    if "attempt" in workloads and len(attempt_hops) != 1:
        variants["chain-attempt"] = [
            {"target": "front", "as": "agent", "request": req, "response": resp, "hops": attempt_hops}
        ]
    if "story" in workloads:
        register, claim = sizes["RegisterTask"], sizes["ClaimTask"]
        variants["chain-story"] = [
            # RegisterTask goes from the client straight to the lifecycle service: the back server here.
            {"target": "back", "as": "host", "request": register[0], "response": register[1], "hops": []},
            {"target": "front", "as": "agent", "request": claim[0], "response": claim[1], "hops": hops("ClaimTask")},
            {"target": "front", "as": "agent", "request": req, "response": resp, "hops": attempt_hops},
        ]
    return variants


# -- the baseline -----------------------------------------------------------------


def start_echo(pki, back: str | None = None) -> tuple[Child, str]:
    """The back server stands in for the lifecycle service: TLS with its certificate,
    client certificates required. The front stands in for the completion service: TLS
    with its certificate, and toward the back the completion service's identity
    certificate, the CA verifying the back."""
    argv = [PYTHON, str(BENCH / "echo.py"), "--listen", "127.0.0.1:0"]
    if back:
        argv += [
            "--back",
            back,
            "--cert",
            str(pki.cert("completion")),
            "--key",
            str(pki.key("completion")),
            "--ca",
            str(pki.ca),
            "--client-cert",
            str(pki.cert("completion-identity")),
            "--client-key",
            str(pki.key("completion-identity")),
        ]
    else:
        argv += ["--cert", str(pki.cert("lifecycle")), "--key", str(pki.key("lifecycle")), "--client-ca", str(pki.ca)]
    child = Child(argv)
    address = child.expect("echo serving on ").rsplit(" ", 1)[1]
    return child, address


def run_baseline(variants: dict, concurrencies: list[int], seconds: float, pki) -> tuple[dict, dict]:
    back, back_address = start_echo(pki)
    front, front_address = start_echo(pki, back_address)
    results: dict[str, dict[int, dict]] = {}
    try:
        for name, calls in variants.items():
            for concurrency in concurrencies:
                log(f"baseline {name} at {concurrency} in flight ...")
                results.setdefault(name, {})[concurrency] = measure(
                    {
                        "mode": "baseline",
                        "front": front_address,
                        "back": back_address,
                        "tls_dir": str(pki.directory),
                        "calls": calls,
                        "concurrency": concurrency,
                        "seconds": seconds,
                    },
                    {"front": front.pid, "back": back.pid},
                )
        memory = {"front": rss_mb(front.pid), "back": rss_mb(back.pid)}
    finally:
        front.stop()
        back.stop()
    return results, memory


# -- the real services ---------------------------------------------------------------


def run_funnel(
    data_dir: Path,
    workloads: list[str],
    concurrencies: list[int],
    seconds: float,
    request_ids: bool,
    baseline: dict,
    attempt_pool: int | None,
    prep_max_s: float,
    verify: dict | None,
    pki,
    database_url: str | None = None,
    replicas: int = 1,
) -> dict:
    where = f"PostgreSQL, {replicas} replica(s) of each" if database_url else data_dir
    log(f"starting the services on {where} ...")
    metrics_listen = ["--metrics-listen", "127.0.0.1:0"]
    # Each replica's completion service calls the lifecycle replica started with it.
    every: list[Services] = []
    try:
        for n in range(replicas):
            directory = data_dir if n == 0 else data_dir / f"replica-{n + 1}"
            every.append(start_services(directory, metrics_listen, metrics_listen, pki=pki, database_url=database_url))
    except BaseException:
        for started in every:
            started.stop()
        raise
    services = every[0]
    phase: dict = {
        "startup_s": {"lifecycle": services.lifecycle_startup_s, "completion": services.completion_startup_s},
        "results": {},
        "replicas": replicas,
    }
    log(
        f"  SERVING after {services.lifecycle_startup_s:.2f}s (lifecycle), "
        f"{services.completion_startup_s:.2f}s (completion)"
    )
    addresses = {
        "lifecycle": ",".join(s.lifecycle.address for s in every),
        "completion": ",".join(s.completion.address for s in every),
        "tls_dir": services.tls_dir,
    }
    pids: dict[str, int] = {}
    metrics: dict[str, str] = {}
    for n, replica in enumerate(every):
        suffix = f"#{n + 1}" if n else ""
        # Both services were started with --metrics-listen, so each printed its metrics URL.
        assert replica.lifecycle.metrics_url is not None and replica.completion.metrics_url is not None
        pids |= {f"{name}{suffix}": pid for name, pid in replica.pids.items()}
        metrics |= {f"lifecycle{suffix}": replica.lifecycle.metrics_url}
        metrics |= {f"completion{suffix}": replica.completion.metrics_url}
    try:
        if verify is not None:
            child = client({"mode": "verify_preload", **addresses, **verify, "request_ids": request_ids})
            try:
                phase["preload_check"] = json.loads(child.expect("RESULT ")[len("RESULT ") :])
            finally:
                child.stop()
            problems = phase["preload_check"]["problems"]
            log(f"  preloaded clone {verify['task_id']}: {problems if problems else 'consistent'}")
        if database_url is None:
            checks = {
                name: integrity_check_seconds(data_dir / f"{name}.log", services.log_offsets[name])
                for name in ("lifecycle", "completion")
            }
            phase["integrity_check_s"] = checks
            log(
                "  integrity check after SERVING (in the background; the points start after it): "
                + integrity_text(checks)
            )
        tag = f"{os.getpid() % 100000:05d}{int(time.time()) % 1000:03d}"
        for workload in workloads:
            previous_cpu = None
            for concurrency in concurrencies:
                config = {
                    "mode": workload,
                    **addresses,
                    "concurrency": concurrency,
                    "seconds": seconds,
                    "request_ids": request_ids,
                    "task_prefix": f"{workload[0]}{concurrency}r{replicas}-{tag}",
                }
                if workload == "attempt":
                    config["pool"] = attempt_pool or pool_size(seconds, concurrency, baseline, previous_cpu)
                    config["prep_max_s"] = prep_max_s
                    log(f"{workload} at {concurrency} in flight: preparing {config['pool']} claimed tasks ...")
                else:
                    log(f"{workload} at {concurrency} in flight ...")
                try:
                    result = measure(config, pids, metrics, database_url)
                except KeyboardInterrupt:
                    phase["interrupted"] = f"{workload} at {concurrency} in flight"
                    log("interrupted: reporting what was measured")
                    raise Interrupted(phase) from None
                phase["results"].setdefault(workload, {})[concurrency] = result
                previous_cpu = result["cpu_ms_per_op"]["total"] if result["ops"] else None
                if result["pool_exhausted"]:
                    log(
                        f"  WARNING: the {config['pool']} pre-claimed tasks ran out after {result['elapsed_s']:.1f}s; "
                        "pass a larger --attempt-pool for a full-length measurement"
                    )
                if result["failures"]:
                    log(f"  {result['failures']} FAILED ops: {result['failure_samples']}")
        if database_url is None:
            log(f"footprint: whole stories at {FOOTPRINT_CONCURRENCY} in flight for {FOOTPRINT_SECONDS:g}s ...")
            phase["footprint"] = measure_footprint(data_dir, addresses, request_ids, tag, services.pids)
        phase["memory_mb"] = {name: {"rss": rss_mb(pid), "peak": hwm_mb(pid)} for name, pid in pids.items()}
    finally:
        for replica in every:
            replica.stop()
    if database_url is None:
        phase["database_mb"] = database_sizes(data_dir)
    phase["backend"] = "PostgreSQL 16 (its server's CPU not counted)" if database_url else "file SQLite"
    return phase


class Interrupted(Exception):
    def __init__(self, phase: dict) -> None:
        super().__init__("interrupted")
        self.phase = phase


def pool_size(seconds: float, concurrency: int, baseline: dict, previous_cpu_ms: float | None) -> int:
    """Enough pre-claimed tasks for the attempt workload to run `seconds`: the bare
    chain's rate is a ceiling for the real path, and so is what the cores can do at
    the CPU cost per op measured at the previous concurrency."""
    rates = [r[concurrency]["ops_per_s"] for r in baseline.values() if concurrency in r]
    estimate = max(rates) if rates else 2000.0
    if previous_cpu_ms:
        estimate = min(estimate, 1.5 * 1000 * (os.cpu_count() or 1) / previous_cpu_ms)
    return math.ceil(seconds * estimate * 1.3) + 4 * concurrency + 50


def integrity_text(checks: dict[str, float | None]) -> str:
    """How long each service's integrity check after start took."""
    return ", ".join(f"{name} {'damage or no result' if s is None else f'{s:.1f}s'}" for name, s in checks.items())


def database_sizes(data_dir: Path) -> dict:
    sizes = {}
    for name in ("lifecycle", "completion"):
        sizes[name] = sum(p.stat().st_size for p in data_dir.glob(f"{name}.sqlite3*")) / 2**20
    return sizes


def measure_footprint(data_dir: Path, addresses: dict, request_ids: bool, tag: str, pids: dict[str, int]) -> dict:
    """Bytes each completed task adds to the databases: the b-tree pages of every
    table and index (SQLite's dbstat) before and after a burst of whole stories,
    divided by the stories that finished. "Swept" leaves out the request-id tables,
    which the retention sweep empties (docs/specification.md §8.4), i.e. the steady state."""
    before = {name: btree_bytes(data_dir / f"{name}.sqlite3") for name in ("lifecycle", "completion")}
    result = measure(
        {
            "mode": "story",
            **addresses,
            "concurrency": FOOTPRINT_CONCURRENCY,
            "seconds": FOOTPRINT_SECONDS,
            "request_ids": request_ids,
            "task_prefix": f"fp-{tag}",
        },
        pids,
    )
    tasks = max(result["ops"], 1)
    footprint: dict = {"tasks": result["ops"], "failures": result["failures"], "databases": {}}
    for name, old in before.items():
        new = btree_bytes(data_dir / f"{name}.sqlite3")
        grown = {table: (new.get(table, 0) - old.get(table, 0)) / tasks for table in new}
        footprint["databases"][name] = {
            "total": sum(grown.values()),
            "swept": sum(b for table, b in grown.items() if not table.startswith(REQUEST_ID_BTREES)),
            "tables": sorted(grown.items(), key=lambda kv: -kv[1]),
        }
    footprint["total"] = sum(d["total"] for d in footprint["databases"].values())
    footprint["swept"] = sum(d["swept"] for d in footprint["databases"].values())
    return footprint


# The request-id table, its primary-key index and its age index.
REQUEST_ID_BTREES = ("request_ids", "sqlite_autoindex_request_ids")


def btree_bytes(path: Path) -> dict[str, int]:
    """Bytes of pages held by each table and index, read through a read-only connection."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall())
    finally:
        db.close()


def copy_databases(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for path in source.glob("*.sqlite3*"):
        shutil.copy2(path, target / path.name)


# -- the report --------------------------------------------------------------------


def fmt(value: float, width: int = 8, digits: int = 1) -> str:
    return f"{value:{width}.{digits}f}"


def print_report(report: dict) -> None:
    print()
    print_facts(report["facts"])
    config = report["config"]
    print(
        f"  {'run':<22} {config['seconds']:g}s per point, in flight {config['concurrency']}, "
        f"request ids {'on' if config['request_ids'] else 'off'}, started {config['started']}"
    )
    calibration = report["calibration"]
    story = calibration["stories"][-1]
    fresh = calibration["startup_s"]
    print(
        f"\ntime to SERVING on fresh databases: lifecycle {fresh['lifecycle']:.2f}s, completion "
        f"{fresh['completion']:.2f}s"
    )
    print("\nmessage sizes (serialized bytes, request/response) and lifecycle calls per client call")
    for method, (req, resp) in story["sizes"].items():
        inner = ", ".join(f"{m} {q}/{s}" for m, q, s in story["lifecycle_calls"].get(method, [])) or "-"
        print(f"  {method:<18} {req:>5}/{resp:<5}  -> lifecycle: {inner}")
    if "preload" in report:
        pre = report["preload"]
        print(
            f"\npreload: {pre['tasks']:,} registered+completed tasks cloned in {pre['seconds']:.1f}s; "
            f"databases {pre['size_mb']['lifecycle']:.0f} MiB (lifecycle), {pre['size_mb']['completion']:.0f} MiB "
            "(completion)"
        )
        for db in pre["databases"]:
            for warning in db["warnings"]:
                print(f"  WARNING ({db['database']}): {warning}")

    baseline = report.get("baseline", {})
    header = (
        f"  {'':<14} {'in flight':>9} {'ops/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'fail':>5} "
        f"{'cpu ms/op:':>10} {'client':>7} {'{a}':>10} {'{b}':>10} {'total':>7} {'cores':>6}"
    )
    if baseline:
        print("\nbaseline: bare asyncio gRPC echo chain, raw bytes, client -> front -> back, same sizes,")
        print(
            "  same transport security: TLS on both hops, client certificates at the back, bearer tokens from the "
            "client"
        )
        print("  chain-1: one back call per op (the issue's two-hop chain); chain-attempt: the back calls")
        print(
            "  AttemptCompletion makes; chain-story: RegisterTask to back + ClaimTask and AttemptCompletion via front"
        )
        print(header.format(a="front", b="back"))
        for name, by_c in baseline.items():
            for c, r in sorted(by_c.items(), key=lambda kv: int(kv[0])):
                print(_row(name, c, r, "front", "back"))
        if "baseline_memory_mb" in report:
            m = report["baseline_memory_mb"]
            print(f"  echo RSS after the run: front {m['front']:.0f} MiB, back {m['back']:.0f} MiB")

    for phase_name, phase in report.get("phases", {}).items():
        print(
            f"\nfunnel ({phase_name}): client -> completion_service -> lifecycle_service, "
            f"{phase.get('backend', 'file SQLite')}, TLS (mTLS to lifecycle), JWT auth"
        )
        startup = phase["startup_s"]
        print(
            f"  time to SERVING: lifecycle {startup['lifecycle']:.2f}s, completion {startup['completion']:.2f}s "
            f"(target <= {TARGET_STARTUP_S:g}s)"
        )
        if "integrity_check_s" in phase:
            checks = phase["integrity_check_s"]
            print("  integrity check after SERVING (background, before the points): " + integrity_text(checks))
        print(header.format(a="completion", b="lifecycle") + "   vs baseline: ops/s ratio, p99 ratio")
        for workload, by_c in phase["results"].items():
            for c, r in sorted(by_c.items(), key=lambda kv: int(kv[0])):
                ratios = []
                for variant in _comparisons(workload):
                    b = baseline.get(variant, {}).get(c) or baseline.get(variant, {}).get(str(c))
                    if b and b["ops_per_s"] and b["p99_ms"]:
                        ratios.append(
                            f"{variant} {r['ops_per_s'] / b['ops_per_s']:.2f}x {r['p99_ms'] / b['p99_ms']:.2f}x"
                        )
                note = "  " + "; ".join(ratios)
                if r.get("pool_exhausted"):
                    note += f"  [pool ran out after {r['elapsed_s']:.1f}s]"
                print(_row(workload, c, r, "completion", "lifecycle") + note)
                if r.get("writer_busy"):
                    # SQLite has one writer per database, busy some share of the time; on
                    # PostgreSQL the same sum of commit time over the point's length is
                    # how many write transactions a replica has open at once, on average.
                    sqlite = phase.get("backend", "file SQLite") == "file SQLite"
                    label = "database writer busy" if sqlite else "write transactions open (mean, per replica)"
                    print(
                        f"      {label}: "
                        + ", ".join(
                            f"{name} {share:.0%}" if sqlite else f"{name} {share:.1f}"
                            for name, share in r["writer_busy"].items()
                        )
                    )
                for message, count in r.get("failure_samples", []):
                    print(f"      {count} x {message}")
        if phase.get("interrupted"):
            print(f"  INTERRUPTED during {phase['interrupted']}")
        memory = phase.get("memory_mb", {})
        if memory:
            print(
                "  RSS after the run: "
                + ", ".join(f"{n} {m['rss']:.0f} MiB (peak {m['peak']:.0f})" for n, m in memory.items())
            )
        sizes = phase.get("database_mb", {})
        if sizes:
            print("  database files after the run: " + ", ".join(f"{n} {s:.0f} MiB" for n, s in sizes.items()))
        footprint = phase.get("footprint")
        if footprint:
            print(
                f"  bytes per completed task ({footprint['tasks']} stories, {footprint['failures']} failed): "
                f"{footprint['total']:.0f} with request ids, {footprint['swept']:.0f} once they are swept"
            )
            for name, d in footprint["databases"].items():
                largest = ", ".join(f"{table} {b:.0f}" for table, b in d["tables"][:4])
                print(f"    {name:<10} {d['total']:6.0f} ({d['swept']:.0f} swept); largest: {largest}")

    print_scale_out(report.get("phases", {}))
    print_targets(report)


def print_scale_out(phases: dict) -> None:
    """PostgreSQL with 1 and 2 replicas of each service beside SQLite (issue 26's
    table), with the share of transaction time spent waiting on a lock."""
    postgres = sorted((p["replicas"], name) for name, p in phases.items() if name.startswith("postgresql"))
    if not postgres or "empty" not in phases:
        return
    print("\nscale-out: PostgreSQL beside SQLite, same run (ops/s; p99 ms; lock wait as a share of transaction time)")
    sqlite = phases["empty"]["results"]
    for workload in sqlite:
        for c in sorted(sqlite[workload], key=int):
            e = sqlite[workload][c]
            cells = [f"SQLite {e['ops_per_s']:6.0f} ({e['p99_ms']:6.1f})"]
            one = None
            for replicas, name in postgres:
                r = phases[name]["results"].get(workload, {}).get(c)
                if not r:
                    continue
                one = r["ops_per_s"] if replicas == 1 else one
                waits = r.get("waits", {})
                versus = f"{r['ops_per_s'] / e['ops_per_s']:.2f}x SQLite" if e["ops_per_s"] else "-"
                if replicas > 1 and one:
                    versus += f", {r['ops_per_s'] / one:.2f}x 1 replica"
                cells.append(
                    f"PG x{replicas} {r['ops_per_s']:6.0f} ({r['p99_ms']:6.1f}; {versus}; "
                    f"lock wait {waits.get('lock_share', 0.0):.1%})"
                )
            print(f"  {workload:<8} {int(c):>3} in flight: " + " | ".join(cells))
    for replicas, name in postgres:
        for workload, by_c in phases[name]["results"].items():
            for c, r in sorted(by_c.items(), key=lambda kv: int(kv[0])):
                top = ", ".join(f"{event} {share:.1%}" for event, share in r.get("waits", {}).get("top", [])[:5])
                print(f"    PG x{replicas} {workload} {int(c):>3}: waiting on {top or 'nothing sampled'}")


def _comparisons(workload: str) -> list[str]:
    return {"attempt": ["chain-1", "chain-attempt"], "story": ["chain-story"]}.get(workload, ["chain-1"])


def _row(name: str, c, r: dict, a: str, b: str) -> str:
    cpu = r["cpu_ms_per_op"]
    return (
        f"  {name:<14} {int(c):>9} {fmt(r['ops_per_s'], 8, 0)} {fmt(r['p50_ms'], 8, 2)} {fmt(r['p99_ms'], 8, 2)} "
        f"{r['failures']:>5} {'':>10} {fmt(cpu.get('client', 0), 7, 3)} {fmt(cpu.get(a, 0), 10, 3)} "
        f"{fmt(cpu.get(b, 0), 10, 3)} {fmt(cpu['total'], 7, 3)} {fmt(r['cores_busy'], 6, 2)}"
    )


def print_targets(report: dict) -> None:
    lines = []
    baseline = report.get("baseline", {}).get("chain-1", {})
    for phase_name, phase in report.get("phases", {}).items():
        attempt = phase["results"].get("attempt", {})
        r, b = attempt.get(TARGET_CONCURRENCY), baseline.get(TARGET_CONCURRENCY)
        if r and b:
            ratio = r["ops_per_s"] / b["ops_per_s"]
            p99 = r["p99_ms"] / b["p99_ms"]
            lines.append(
                _verdict(
                    f"{phase_name}: attempt throughput at {TARGET_CONCURRENCY} in flight vs chain-1",
                    ratio,
                    f">= {TARGET_THROUGHPUT_RATIO}",
                    ratio >= TARGET_THROUGHPUT_RATIO,
                )
            )
            lines.append(
                _verdict(
                    f"{phase_name}: attempt p99 at {TARGET_CONCURRENCY} in flight vs chain-1",
                    p99,
                    f"<= {TARGET_P99_RATIO}",
                    p99 <= TARGET_P99_RATIO,
                )
            )
        if r and b:
            cpu = r["cpu_ms_per_op"]["total"] / b["cpu_ms_per_op"]["total"]
            lines.append(
                _verdict(
                    f"{phase_name}: CPU per attempt, 3 processes, vs chain-1 per op at {TARGET_CONCURRENCY} in flight",
                    cpu,
                    f"<= {TARGET_CPU_RATIO:g}",
                    cpu <= TARGET_CPU_RATIO,
                )
            )
        busy = (r or {}).get("writer_busy", {}).get("completion")
        if busy is not None and phase.get("backend", "file SQLite") == "file SQLite":
            lines.append(
                _verdict(
                    f"{phase_name}: completion database writer busy at {TARGET_CONCURRENCY} in flight (share)",
                    busy,
                    f"<= {TARGET_WRITER_BUSY:g}",
                    busy <= TARGET_WRITER_BUSY,
                )
            )
        footprint = phase.get("footprint")
        if footprint and footprint["tasks"]:
            lines.append(
                _verdict(
                    f"{phase_name}: bytes per completed task, both databases, request ids swept",
                    footprint["swept"],
                    f"<= {TARGET_BYTES_PER_TASK}",
                    footprint["swept"] <= TARGET_BYTES_PER_TASK,
                )
            )
        for service, seconds in phase["startup_s"].items():
            lines.append(
                _verdict(
                    f"{phase_name}: {service} start-up to SERVING (s)",
                    seconds,
                    f"<= {TARGET_STARTUP_S:g}",
                    seconds <= TARGET_STARTUP_S,
                )
            )
    phases = report.get("phases", {})
    if "empty" in phases and "preloaded" in phases:
        for workload, by_c in phases["preloaded"]["results"].items():
            for c, r in by_c.items():
                e = phases["empty"]["results"].get(workload, {}).get(c)
                if e and e["ops_per_s"]:
                    ratio = r["ops_per_s"] / e["ops_per_s"]
                    lines.append(
                        _verdict(
                            f"preloaded vs empty: {workload} at {c} in flight",
                            ratio,
                            f">= {TARGET_PRELOAD_RATIO}",
                            ratio >= TARGET_PRELOAD_RATIO,
                        )
                    )
    boundary = report.get("boundary")
    if boundary:
        lines.append(
            _verdict(
                f"CPU the boundary adds per unary call (ms; bench/boundary.py, {len(boundary['pairs_ms'])} pairs)",
                boundary["added_ms"],
                f"<= {TARGET_BOUNDARY_MS:g}",
                boundary["added_ms"] <= TARGET_BOUNDARY_MS,
            )
        )
    if lines:
        print("\ntargets (issues 25 and 13; benchmark figures on a shared machine, not timed tests)")
        for line in lines:
            print(line)


def _verdict(label: str, value: float, target: str, ok: bool) -> str:
    return f"  {label:<80} {value:8.2f}  target {target:<7} {'met' if ok else 'NOT MET'}"


# -- main --------------------------------------------------------------------------


def parse_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement length of each point (default 10)")
    parser.add_argument(
        "--concurrency", default="1,16,64", help="requests in flight, comma separated (default 1,16,64)"
    )
    parser.add_argument("--workload", default="attempt,story", help="attempt, story or both (default both)")
    parser.add_argument("--baseline-only", action="store_true", help="measure only the echo chain")
    parser.add_argument("--no-baseline", action="store_true", help="skip the echo chain (no ratios)")
    parser.add_argument(
        "--boundary-pairs",
        type=int,
        default=3,
        metavar="N",
        help="pairs of bench/boundary.py's measurement (the boundary's CPU per unary call; 0: none)",
    )
    parser.add_argument(
        "--tasks-preload",
        type=int,
        default=0,
        metavar="N",
        help="clone N registered+completed tasks into both databases before the services start",
    )
    parser.add_argument(
        "--compare-empty",
        action="store_true",
        help="with --tasks-preload: also measure on empty databases in the same run and print the ratio",
    )
    parser.add_argument(
        "--attempt-pool",
        type=int,
        default=None,
        metavar="N",
        help="pre-claimed tasks per attempt point (default: estimated from the baseline)",
    )
    parser.add_argument(
        "--prep-max-seconds",
        type=float,
        default=None,
        metavar="S",
        help="time limit of each attempt point's preparation (default max(30, 4 x --seconds)); "
        "a point whose pool was cut short ends when the pool runs out",
    )
    parser.add_argument(
        "--no-request-ids",
        action="store_true",
        help="send client calls without request_id (default: every mutating call has one)",
    )
    parser.add_argument(
        "--data-dir", default=None, help="where the databases and service logs go (default: a temp dir)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument(
        "--postgresql",
        nargs="?",
        const="embedded",
        metavar="URL",
        help="also measure both services on PostgreSQL, beside SQLite in the same run: a throwaway server "
        "(pgserver wheel, the test extra) or the database URL given",
    )
    parser.add_argument(
        "--postgresql-only",
        action="store_true",
        help="with --postgresql: measure only the PostgreSQL phases, not SQLite beside them (bench/compare.py)",
    )
    parser.add_argument(
        "--replicas",
        default="1,2",
        metavar="N,M",
        help="with --postgresql: replicas of each service, one PostgreSQL phase per count, in this order (default 1,2)",
    )
    parser.add_argument("--json", default=None, metavar="FILE", help="also write every figure to FILE")
    args = parser.parse_args(argv)

    concurrencies = [int(c) for c in parse_list(args.concurrency)]
    workloads = parse_list(args.workload)
    unknown = set(workloads) - {"attempt", "story"}
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}")
    if args.postgresql_only and (not args.postgresql or args.tasks_preload):
        parser.error("--postgresql-only needs --postgresql, and measures no preloaded databases")
    request_ids = not args.no_request_ids
    facts = machine_facts()
    if facts["protobuf_backend"] != "upb":
        log(f"WARNING: protobuf runs on its {facts['protobuf_backend']!r} backend, not the C (upb) one")
    report: dict = {
        "facts": facts,
        "config": {
            "seconds": args.seconds,
            "concurrency": concurrencies,
            "workloads": workloads,
            "request_ids": request_ids,
            "tasks_preload": args.tasks_preload,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join([os.path.relpath(PYTHON, ROOT) if PYTHON.startswith(str(ROOT)) else PYTHON, *sys.argv]),
        },
    }
    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="funnel-bench-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    log(f"data directory: {data_dir}")
    try:
        # One local CA, certificates and token key for every process of the run.
        pki = ensure_pki(data_dir)
        log("calibrating: message sizes and lifecycle calls per client call ...")
        main_dir = data_dir / "db"
        main_dir.mkdir(exist_ok=True)
        calibration = calibrate(main_dir, request_ids, pki)
        report["calibration"] = calibration
        phases: list[tuple[str, Path, dict | None]] = []
        if args.tasks_preload and args.compare_empty:
            copy_databases(main_dir, data_dir / "empty")
            phases.append(("empty", data_dir / "empty", None))
        if args.tasks_preload:
            from bench.preload import preload

            log(f"preloading {args.tasks_preload:,} tasks ...")
            report["preload"] = preload(str(main_dir), calibration["stories"][-1], args.tasks_preload)
            log(f"  done in {report['preload']['seconds']:.1f}s")
            phases.append(("preloaded", main_dir, report["preload"]["sample_clone"]))
        elif not args.postgresql_only:
            phases.append(("empty", main_dir, None))
        database_urls: dict[str, str] = {}
        if args.postgresql:
            if args.postgresql == "embedded":
                from bench.common import embedded_postgres

                database_urls["postgresql"] = embedded_postgres(data_dir / "pgdata")
            else:
                database_urls["postgresql"] = args.postgresql
            # In the order given: runs that alternate it (1,2 then 2,1) let a drift of
            # the machine favour neither count.
            for replicas in dict.fromkeys(int(r) for r in parse_list(args.replicas)):
                name = "postgresql" if replicas == 1 else f"postgresql-{replicas}"
                database_urls[name] = database_urls["postgresql"]
                phases.append((name, data_dir / name, None))

        baseline: dict = {}
        if not args.no_baseline:
            variants = baseline_variants(calibration, workloads)
            report["baseline_shapes"] = variants
            baseline, memory = run_baseline(variants, concurrencies, args.seconds, pki)
            report["baseline"] = baseline
            report["baseline_memory_mb"] = memory
        if args.boundary_pairs > 0:
            from bench.boundary import measure_boundary

            log(f"the boundary's CPU per unary call: {args.boundary_pairs} pairs ...")
            report["boundary"] = measure_boundary(args.boundary_pairs, 4.0, TARGET_CONCURRENCY, say=log)
        if not args.baseline_only:
            report["phases"] = {}
            prep_max_s = args.prep_max_seconds or max(30.0, 4 * args.seconds)
            for name, directory, verify in phases:
                try:
                    report["phases"][name] = run_funnel(
                        directory,
                        workloads,
                        concurrencies,
                        args.seconds,
                        request_ids,
                        baseline,
                        args.attempt_pool,
                        prep_max_s,
                        verify,
                        pki,
                        database_urls.get(name),
                        int(name.split("-")[1]) if name.startswith("postgresql-") else 1,
                    )
                except Interrupted as stop:
                    report["phases"][name] = stop.phase
                    report["interrupted"] = True
                    break
    finally:
        if not args.keep and not args.data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
        elif args.keep:
            log(f"kept {data_dir}")
    report["facts"]["load_average_at_end"] = load_average()
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
