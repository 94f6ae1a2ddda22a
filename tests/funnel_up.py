"""`funnel up` as the README's readers run it, for the tests that run README
sections as written: on free ports (the README's defaults may be taken), until
both services serve, stopped with Ctrl-C at the end."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.reliability.harness import unused_port

BIN = Path(sys.executable).parent
START_TIMEOUT = 60


@dataclass(frozen=True)
class Up:
    lifecycle_port: int
    completion_port: int
    # What funnel up printed until it was ready.
    lines: list[str]

    @property
    def lifecycle(self) -> str:
        return f"127.0.0.1:{self.lifecycle_port}"

    @property
    def completion(self) -> str:
        return f"127.0.0.1:{self.completion_port}"


@contextlib.contextmanager
def funnel_up(cwd: Path, *arguments: str, ready: str = "both SERVING", wait: float = START_TIMEOUT) -> Iterator[Up]:
    """Ready once a line holds `ready` (`Demo finished` for `--demo`'s story)."""
    lifecycle, completion = unused_port(), unused_port()
    up = subprocess.Popen(
        [
            str(BIN / "funnel"),
            "up",
            "--lifecycle-port",
            str(lifecycle),
            "--completion-port",
            str(completion),
            "--lifecycle-metrics-port",
            "0",
            "--completion-metrics-port",
            "0",
            *arguments,
        ],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert up.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            line = up.stdout.readline()
            assert line, "funnel up exited before it was ready:\n" + "".join(lines)
            lines.append(line)
            if ready in line:
                break
        yield Up(lifecycle, completion, lines)
    finally:
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=30)
