"""Helpers shared by the benchmark scripts: process accounting from /proc, machine
facts, the local PKI and tokens, starting the two services as real processes (TLS,
client certificates toward the lifecycle service, bearer tokens: as in production),
small statistics."""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Annotations only: at run time this module imports the project's packages inside the functions that use them.
    from funnel.auth.tokens import SigningKey
    from funnel_cli.supervisor import ServiceProcess

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WORKSPACE = "bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Who the benchmark clients are: a host registers tasks, an agent claims and attempts
# them (an agent may claim only as itself: its token's subject is the agent_id).
HOST_SUBJECT = "bench-host"
AGENT_ID = "bench-agent@localhost"
# Long enough for the longest run (a 1,000,000-task preload and every point after it).
TOKEN_TTL_S = 48 * 3600.0

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
        import uvloop

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


# -- transport security and tokens ----------------------------------------------------


def ensure_pki(data_dir: Path):
    """The local CA, certificates and token signing key of `data_dir/tls` (created on
    first use), as `funnel up` makes them: funnel.auth.pki.LocalPki."""
    from funnel.auth.pki import ensure_local_pki

    data_dir.mkdir(parents=True, exist_ok=True)
    return ensure_local_pki(Path(data_dir) / "tls")


class Credentials:
    """What a benchmark client process needs to call the services as production
    callers do: the CA, the local client certificate (the lifecycle listener requires
    one) and bearer tokens signed with the local key. Built from the PKI directory, so
    it can be handed to child processes as a path."""

    def __init__(self, tls_dir: str | Path) -> None:
        from funnel.auth.pki import LocalPki

        self.pki = LocalPki(Path(tls_dir))
        self.ca = self.pki.ca.read_bytes()
        self.client_cert = self.pki.cert("client").read_bytes()
        self.client_key = self.pki.key("client").read_bytes()
        self._signing: SigningKey | None = None

    def token(self, subject: str, permissions: list[str], ttl: float = TOKEN_TTL_S) -> str:
        if self._signing is None:
            self._signing = self.pki.load_signing_key()
        return self._signing.issue(subject, permissions, ttl)

    def metadata(self, subject: str, permissions: list[str]) -> tuple[tuple[str, str], ...]:
        """Call metadata carrying a bearer token (passed per call: no interceptor)."""
        return (("authorization", f"Bearer {self.token(subject, permissions)}"),)

    def host_metadata(self, workspace: str = WORKSPACE) -> tuple[tuple[str, str], ...]:
        return self.metadata(HOST_SUBJECT, [f"{workspace}:host"])

    def agent_metadata(self, workspace: str = WORKSPACE) -> tuple[tuple[str, str], ...]:
        return self.metadata(AGENT_ID, [f"{workspace}:agent"])

    def lifecycle_channel(self, address: str, options=None):
        """TLS with the client certificate (the lifecycle listener requires one)."""
        import grpc

        credentials = grpc.ssl_channel_credentials(self.ca, self.client_key, self.client_cert)
        return grpc.aio.secure_channel(address, credentials, options=options)

    def completion_channel(self, address: str, options=None):
        """TLS, server verified with the CA; callers prove themselves with tokens."""
        import grpc

        return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(self.ca), options=options)

    def lifecycle_connection(self):
        from funnel.client.connection import Connection

        return Connection(None, self.ca, self.client_cert, self.client_key)

    def completion_connection(self):
        from funnel.client.connection import Connection

        return Connection(None, self.ca)


def lifecycle_arguments(pki) -> list[str]:
    """The lifecycle service's production security flags (TLS, client certificates
    required, tokens) plus no per-caller rate limit: the benchmark client is a single
    caller sending far more than the default 1000 requests/s."""
    from funnel_cli.supervisor import lifecycle_tls_arguments

    return [*lifecycle_tls_arguments(pki), "--rate-limit", "0"]


def completion_arguments(pki) -> list[str]:
    """The completion service's production security flags (TLS, tokens, its client
    certificate toward the lifecycle service) plus no per-caller rate limit."""
    from funnel_cli.supervisor import completion_tls_arguments

    return [*completion_tls_arguments(pki), "--rate-limit", "0"]


# -- the services -------------------------------------------------------------------


@dataclass
class Services:
    lifecycle: ServiceProcess
    completion: ServiceProcess
    lifecycle_startup_s: float
    completion_startup_s: float
    tls_dir: str = ""  # the local PKI the services trust (bench.common.Credentials)
    # Where each service's log stood when it was spawned: the log files are appended
    # to by every start in the data directory (the calibration's among them), so a
    # line of this start is one past its offset.
    log_offsets: dict[str, int] = field(default_factory=dict)

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


def start_services(
    data_dir: Path,
    extra_lifecycle: Sequence[str] = (),
    extra_completion: Sequence[str] = (),
    pki=None,
    database_url: str | None = None,
) -> Services:
    """Starts lifecycle_service and completion_service as processes on file SQLite
    in data_dir (or both on the PostgreSQL database `database_url`; ports chosen by
    the OS), secured as in production with the local PKI
    `pki` (default: data_dir/tls), and measures each one's time from spawn to SERVING
    on the standard health service (over TLS, with the client certificate where the
    listener requires one)."""
    from funnel_cli import supervisor
    from funnel_cli.supervisor import spawn, wait_serving

    # A service on a big preloaded database may take longer than the CLI's 20 s to
    # print its `serving on` line; the benchmark reports the time instead of failing.
    supervisor.READY_TIMEOUT = 600.0
    data_dir.mkdir(parents=True, exist_ok=True)
    if pki is None:
        pki = ensure_pki(data_dir)
    credentials = Credentials(pki.directory)
    policy = write_policy(data_dir)
    offsets = {name: _size(data_dir / f"{name}.log") for name in ("lifecycle", "completion")}
    t0 = time.monotonic()
    lifecycle = spawn(
        "lifecycle_service",
        "lifecycle_service",
        [
            "--listen",
            "127.0.0.1:0",
            "--database",
            database_url or str(data_dir / "lifecycle.sqlite3"),
            *lifecycle_arguments(pki),
            *extra_lifecycle,
        ],
        data_dir / "lifecycle.log",
    )
    try:
        asyncio.run(wait_serving(credentials.lifecycle_connection(), lifecycle.address, timeout=600))
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
                database_url or str(data_dir / "completion.sqlite3"),
                "--lifecycle-address",
                lifecycle.address,
                "--policy-file",
                str(policy),
                *completion_arguments(pki),
                *extra_completion,
            ],
            data_dir / "completion.log",
        )
        asyncio.run(wait_serving(credentials.completion_connection(), completion.address, timeout=600))
    except BaseException:
        lifecycle.stop()
        raise
    completion_startup = time.monotonic() - t1
    return Services(lifecycle, completion, lifecycle_startup, completion_startup, str(pki.directory), offsets)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def integrity_check_seconds(log_path: Path, since: int, timeout: float = 1800.0) -> float | None:
    """How long the service's integrity check after start took, from its log line
    (`"event": "integrity_check"`, JSON logs) written past byte `since` (the start's
    own lines: earlier starts in the data directory wrote theirs before), waiting for
    it up to `timeout`; None when it reported damage or no result in time. The check
    reads the whole file in the background: the measurement waits for it, so that
    points measure the steady state rather than a service sharing its CPU with a
    one-off read of the file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with log_path.open("rb") as file:
            file.seek(since)
            lines = file.read().decode(errors="replace").splitlines()
        for line in lines:
            if '"integrity_check"' not in line:
                continue
            entry = json.loads(line)
            if entry.get("result") != "postponed":  # a postponed check runs again later
                return float(entry["seconds"]) if entry.get("result") == "ok" else None
        time.sleep(0.5)
    return None


def embedded_postgres(directory: Path) -> str:
    """A PostgreSQL 16 for the benchmark from the pgserver wheel (the test extra),
    with its default durability (fsync, synchronous commit), like a production
    server: the test suite's throwaway server turns those off, so it is not used
    here. Stopped when the benchmark exits."""
    import os
    import tempfile

    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="funnel-bench-run-"))
    import pgserver
    import psycopg

    server = pgserver.get_server(directory, cleanup_mode="stop")
    url = str(server.get_uri())
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS bench")
        conn.execute("CREATE DATABASE bench")
        settings: dict[str, str] = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit')"
            ).fetchall()
        )
    assert settings == {"fsync": "on", "synchronous_commit": "on"}, settings
    return url.replace("/postgres?", "/bench?", 1)


class WaitSampler:
    """Samples, every SAMPLE_S on a thread of its own, what the transactions of one
    PostgreSQL database are doing (`pg_stat_activity`): of the client backends in
    a transaction, how many wait for a heavyweight lock (a row, a transaction, an
    advisory or a notification lock: `wait_event_type = 'Lock'`) and for what else
    they wait. Summed over the samples, the share of transaction time spent
    waiting on locks, and the top wait events by share of that time."""

    SAMPLE_S = 0.005

    def __init__(self, url: str) -> None:
        import threading

        self._url = url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wait-sampler", daemon=True)
        self._in_transaction = 0
        self._waiting: dict[str, int] = {}
        self._samples = 0

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self._url, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE datname = current_database() "
                    "AND backend_type = 'client backend' AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
                ).fetchall()
                self._samples += 1
                self._in_transaction += len(rows)
                for kind, event in rows:
                    if kind is not None:
                        key = f"{kind}:{event}"
                        self._waiting[key] = self._waiting.get(key, 0) + 1
                time.sleep(self.SAMPLE_S)

    def stop(self) -> dict:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(10)
        total = max(self._in_transaction, 1)
        locks = sum(count for key, count in self._waiting.items() if key.startswith("Lock:"))
        top = sorted(self._waiting.items(), key=lambda kv: -kv[1])
        return {
            "samples": self._samples,
            "transactions_sampled": self._in_transaction,
            "lock_share": locks / total,
            "top": [(key, count / total) for key, count in top],
        }
