"""Runs a container of the deploy files as a local process: its command,
arguments and environment as written, with only what differs outside a container
translated: mounted paths to the directories standing in for the volumes, ports
to free loopback ports, and the other containers' host names to 127.0.0.1."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

from funnel.runtime import healthcheck
from tests.reliability.harness import unused_port

BIN = Path(sys.executable).parent
_ADDRESS = re.compile(r"\b([A-Za-z0-9.-]+):(\d{2,5})\b")


@dataclass
class Localizer:
    mounts: dict[str, Path]
    hosts: set[str]
    ports: dict[int, int] = field(default_factory=dict)

    def port(self, port: int) -> int:
        if port not in self.ports:
            self.ports[port] = unused_port()
        return self.ports[port]

    def text(self, value: str) -> str:
        for inside in sorted(self.mounts, key=len, reverse=True):
            if inside in value:
                value = value.replace(inside, str(self.mounts[inside]))
                break
        return _ADDRESS.sub(self._address, value)

    def _address(self, match: re.Match) -> str:
        host, port = match.group(1), int(match.group(2))
        if host in self.hosts | {"0.0.0.0", "127.0.0.1", "localhost"}:
            return f"127.0.0.1:{self.port(port)}"
        return match.group(0)

    def argv(self, argv: list[str]) -> list[str]:
        """The executable from this environment (a console script, or python itself)."""
        program = sys.executable if argv[0] == "python" else shutil.which(argv[0], path=str(BIN))
        assert program, f"{argv[0]} is not a console script of this installation"
        return [program, *(self.text(arg) for arg in argv[1:])]

    def env(self, env: dict[str, str]) -> dict[str, str]:
        return {name: self.text(value) for name, value in env.items()}


class Process:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.popen = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> int:
        if self.popen.poll() is None:
            self.popen.terminate()
        try:
            return self.popen.wait(20)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait()

    def wait_ready(self, probe: list[str], env: dict[str, str], timeout: float = 30) -> None:
        """Until the readiness probe's own check passes (in this process: faster than a new interpreter)."""
        assert probe[:3] == ["python", "-m", "funnel.runtime.healthcheck"], probe
        with mock.patch.dict(os.environ, env):
            args = healthcheck.parse_args(probe[3:])
        deadline = time.monotonic() + timeout
        while not healthcheck.check(args)[0]:
            assert self.popen.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.1)
