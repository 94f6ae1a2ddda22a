"""Real lifecycle service processes for the security tests (funnel_cli.supervisor.spawn)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from funnel_cli.supervisor import ServiceProcess, spawn


@contextlib.contextmanager
def lifecycle_process(directory: Path, tls_args: list[str], *extra: str) -> Iterator[ServiceProcess]:
    """A lifecycle service process on 127.0.0.1:0 with its database and log under
    `directory`, stopped with SIGTERM at the end; a clean run must also exit
    cleanly. Each test makes a served call before it signals the process: the
    service prints that it serves a moment before it handles SIGTERM and SIGHUP
    (until then either signal kills it outright)."""
    process = spawn(
        "lifecycle_service",
        "lifecycle_service",
        ["--listen", "127.0.0.1:0", "--database", str(lifecycle_database(directory)), *tls_args, *extra],
        directory / "lifecycle.log",
    )
    try:
        yield process
    finally:
        code = process.stop(timeout=10)
        if process.process.stdout is not None:
            process.process.stdout.close()
    assert code == 0, f"lifecycle_service exited with {code}:\n{log_text(process)[-2000:]}"


def lifecycle_database(directory: Path) -> Path:
    return directory / "lifecycle.sqlite3"


def log_text(process: ServiceProcess) -> str:
    return process.log_path.read_text(errors="replace") if process.log_path else ""
