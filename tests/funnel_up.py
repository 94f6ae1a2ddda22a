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
    lifecycle: str
    completion: str


@contextlib.contextmanager
def funnel_up(cwd: Path, *arguments: str) -> Iterator[Up]:
    lifecycle, completion = unused_port(), unused_port()
    up = subprocess.Popen(
        [str(BIN / "funnel"), "up", "--lifecycle-port", str(lifecycle), "--completion-port", str(completion),
         "--lifecycle-metrics-port", "0", "--completion-metrics-port", "0", *arguments],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert up.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            line = up.stdout.readline()
            assert line, "funnel up exited before serving"
            if "both SERVING" in line:
                break
        yield Up(f"127.0.0.1:{lifecycle}", f"127.0.0.1:{completion}")
    finally:
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=30)
