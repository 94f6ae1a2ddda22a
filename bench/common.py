"""Helpers shared by the benchmark scripts: process accounting from /proc, machine
facts, starting the two services as real processes, small statistics."""

from __future__ import annotations

import asyncio
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WORKSPACE = "bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# A policy without required evidence: every well-formed COMPLETED attempt is allowed.
POLICY_TOML = """\
[defaults]
required_evidence = []
"""


# -- /proc ---------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (its own threads, not its children), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    # fields[0] is field 3 (state); utime is field 14, stime field 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    """VmRSS of a process in MiB (0.0 when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


def hwm_mb(pid: int) -> float:
    """VmHWM (peak resident set) of a process in MiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def machine_facts() -> dict:
    import google.protobuf
    import grpc
    from google.protobuf.internal import api_implementation

    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import uvloop  # noqa: F401

        uv = uvloop.__version__
    except ImportError:
        uv = "not installed"
    try:
        import aiosqlite

        aiosqlite_version = aiosqlite.__version__
    except (ImportError, AttributeError):
        aiosqlite_version = "?"
    import sqlite3

    return {
        "cores": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "python_impl": platform.python_implementation(),
        "grpcio": grpc.__version__,
        "protobuf": google.protobuf.__version__,
        "protobuf_backend": api_implementation.Type(),
        "sqlite": sqlite3.sqlite_version,
        "aiosqlite": aiosqlite_version,
        "uvloop": uv,
        "load_average_at_start": load_average(),
    }


def print_facts(facts: dict) -> None:
    print("machine")
    for key, value in facts.items():
        print(f"  {key:<22} {value}")


# -- statistics -------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = math.ceil(q / 100 * len(sorted_values))
    return sorted_values[max(0, min(len(sorted_values), rank) - 1)]


# -- the services -------------------------------------------------------------------


@dataclass
class Services:
    lifecycle: object  # funnel_cli.supervisor.ServiceProcess
    completion: object
    lifecycle_startup_s: float
    completion_startup_s: float

    @property
    def pids(self) -> dict[str, int]:
        return {"lifecycle": self.lifecycle.process.pid, "completion": self.completion.process.pid}

    def stop(self) -> None:
        for service in (self.completion, self.lifecycle):
            service.stop()


def write_policy(data_dir: Path) -> Path:
    path = data_dir / "bench_policy.toml"
    path.write_text(POLICY_TOML)
    return path


def start_services(data_dir: Path, extra_lifecycle: list[str] = (), extra_completion: list[str] = ()) -> Services:
    """Starts lifecycle_service and completion_service as processes on file SQLite
    in data_dir (ports chosen by the OS) and measures each one's time from spawn to
    SERVING on the standard health service."""
    from funnel_cli import supervisor
    from funnel_cli.supervisor import spawn, wait_serving

    # A service on a big preloaded database may take longer than the CLI's 20 s to
    # print its `serving on` line; the benchmark reports the time instead of failing.
    supervisor.READY_TIMEOUT = 600.0
    data_dir.mkdir(parents=True, exist_ok=True)
    policy = write_policy(data_dir)
    t0 = time.monotonic()
    lifecycle = spawn(
        "lifecycle_service",
        "lifecycle_service",
        ["--listen", "127.0.0.1:0", "--database", str(data_dir / "lifecycle.sqlite3"), *extra_lifecycle],
        data_dir / "lifecycle.log",
    )
    try:
        asyncio.run(wait_serving(lifecycle.address, timeout=600))
    except BaseException:
        lifecycle.stop()
        raise
    lifecycle_startup = time.monotonic() - t0
    t1 = time.monotonic()
    try:
        completion = spawn(
            "completion_service",
            "completion_service",
            [
                "--listen",
                "127.0.0.1:0",
                "--database",
                str(data_dir / "completion.sqlite3"),
                "--lifecycle-address",
                lifecycle.address,
                "--policy-file",
                str(policy),
                *extra_completion,
            ],
            data_dir / "completion.log",
        )
        asyncio.run(wait_serving(completion.address, timeout=600))
    except BaseException:
        lifecycle.stop()
        raise
    completion_startup = time.monotonic() - t1
    return Services(lifecycle, completion, lifecycle_startup, completion_startup)
