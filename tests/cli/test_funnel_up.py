"""The README's first quick-start command, as a user runs it: `funnel up --demo`
starts both services as processes, walks the story the README shows, and stops
cleanly on Ctrl-C, on SQLite files and (`--database postgresql://…`, the README's
PostgreSQL quick start) on one PostgreSQL database."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.postgres import fresh_database

FUNNEL = Path(sys.executable).parent / "funnel"
README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def story(lines: list[str], *, sequences: bool = True) -> list[str]:
    """The demo's numbered story, from `1.` to the end of `8.`, with the ids and
    hashes that differ from run to run (and that the README shortens) masked, and
    with `sequences=False` the event's sequence too: the README shows SQLite's,
    and PostgreSQL numbers from its transaction ids (docs/architecture.md)."""
    first = next(i for i, line in enumerate(lines) if line.startswith("1. "))
    last = next(i for i, line in enumerate(lines) if line.startswith("8. "))
    masked = (
        re.sub(r"\b(run|evd|cmp)_[0-9a-f]+…?|sha256:[0-9a-f]+…?|demo-[0-9a-f]{8}", r"\1…", line)
        for line in lines[first : last + 1]
    )
    if not sequences:
        masked = (re.sub(r"event #\d+", "event #…", line) for line in masked)
    return [line.rstrip() for line in masked]


def readme_sample() -> list[str]:
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    sample = quick_start.split("\n```\n1. ", 1)[1].split("\n```\n", 1)[0]
    return ("1. " + sample).splitlines()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_funnel_up_demo_tells_the_whole_story_and_stops_cleanly_on_ctrl_c(tmp_path, backend):
    data = tmp_path / "data"
    database = ["--database", fresh_database()] if backend == "postgresql" else []
    process = subprocess.Popen(
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
    )
    lines = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip())
            if line.startswith("Demo finished"):
                break
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    output = "\n".join(lines) + "\n" + rest
    assert process.returncode == 0, output
    steps = [line.split()[0] for line in lines if line[:2] in {f"{n}." for n in range(1, 9)}]
    assert steps == ["1.", "2.", "3.", "4.", "5.", "6.", "7.", "8."], output
    dense = backend == "sqlite"
    assert story(lines, sequences=dense) == story(readme_sample(), sequences=dense), (
        "the README's sample is not what the demo prints"
    )
    assert "SOFT_BLOCK: next action RECORD_EVIDENCE" in output
    assert "ALLOW: completion cmp_" in output
    assert "settlement SETTLED" in output
    assert "transitioned to terminal COMPLETED" in output
    assert "final status DONE" in output
    assert "stopped (exit codes 0, 0)" in output
    files = (data / "lifecycle.sqlite3").exists(), (data / "completion.sqlite3").exists()
    if backend == "postgresql":
        assert files == (False, False)
        assert "(PostgreSQL " in output and "schema funnel_completion" in output
    else:
        assert files == (True, True)


def test_funnel_up_reports_a_busy_port_instead_of_hanging(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [str(FUNNEL), "up", "--data-dir", str(tmp_path), "--lifecycle-port", str(port), "--completion-port", "0"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ},
        )
    assert result.returncode == 1
    assert "lifecycle_service" in result.stderr and "cannot listen" in result.stderr
