"""Node.js tooling for the tests that need it (buf, the MCP Inspector, the
TypeScript client): the npm packages of a folder's package-lock.json are
installed from the npm registry by the first test that needs them (`npm ci`,
once per checkout, under a file lock so that parallel test workers do not
race), never by hand.

These tests need Node.js 20+ with npm on PATH (CI machines have them); without
them they fail and say so."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INSTALL_TIMEOUT = 600


class NodeMissing(RuntimeError):
    pass


def require_node() -> tuple[str, str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        raise NodeMissing("these tests need Node.js 20+ and npm on PATH (.ci/run's machines have them)")
    major = int(
        subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()[1:].split(".")[0]
    )
    if major < 20:
        raise NodeMissing(f"these tests need Node.js 20+, found {major}")
    return node, npm


def ensure_packages(folder: Path) -> Path:
    """Installs the locked packages of `folder` (npm ci) unless the installed set
    matches the lock file already; returns `folder/node_modules`."""
    _, npm = require_node()
    lock = folder / "package-lock.json"
    stamp = folder / "node_modules" / ".funnel-lock-sha256"
    wanted = hashlib.sha256(lock.read_bytes()).hexdigest()
    with open(folder / ".npm-install.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if not (stamp.exists() and stamp.read_text() == wanted):
            result = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=folder,
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT,
            )
            if result.returncode != 0:
                raise RuntimeError(f"npm ci in {folder} failed:\n{result.stdout}\n{result.stderr}")
            stamp.write_text(wanted)
    return folder / "node_modules"
