"""The linters CI runs: `ruff check` and `mypy`, as configured in pyproject.toml
(strict on the `core` packages, clean elsewhere), from the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Each takes a few seconds (mypy about ten with a cold .mypy_cache).
TIMEOUT_SECONDS = 300


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )


def test_ruff_finds_nothing():
    result = run_tool("ruff", "check", "--no-fix", ".")
    assert result.returncode == 0, f"ruff check failed:\n{result.stdout}{result.stderr}"


def test_mypy_finds_nothing():
    result = run_tool("mypy")
    assert result.returncode == 0, f"mypy failed:\n{result.stdout}{result.stderr}"
