"""The static checks, each its own step, before the tests (scripts/test.sh runs
this after the install, so a lint failure reads as one and not as a failed test):

    .venv/bin/python scripts/check.py [--root DIR] [--only STEP ...]

Steps, in order: `ruff check`, `ruff format --check`, `mypy` (as pyproject.toml
configures it: --strict on every product package), `buf lint` and `buf breaking`
against the newest release image in contract/releases/ (buf from the npm
registry, installed by tests/node_tools.py as for the contract tests). Every
step runs even when an earlier one failed, so one run shows every finding; the
exit status is 1 when any failed, and the last line names those that did.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.node_tools, when run as a script

from tests.node_tools import ensure_packages  # noqa: E402 - after the path it needs

# Per step; each takes seconds (mypy about ten with a cold cache, buf about one).
STEP_TIMEOUT = 600


def python_tool(*args: str) -> Callable[[Path], list[str]]:
    return lambda root: [sys.executable, "-m", *args]


def buf(*args: str) -> Callable[[Path], list[str]]:
    # The buf of the checkout that holds this script: the one the lock file pins.
    return lambda root: [str(ensure_packages(ROOT) / ".bin" / "buf"), *args]


def newest_release(root: Path) -> str:
    images = sorted((root / "contract" / "releases").glob("*.binpb"), key=_version)
    if not images:
        raise SystemExit(f"no release image in {root / 'contract' / 'releases'}")
    return str(images[-1])


def _version(image: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in image.stem.lstrip("v").split("."))


STEPS: dict[str, Callable[[Path], list[str]]] = {
    "ruff check": python_tool("ruff", "check", "--no-fix", "."),
    "ruff format": python_tool("ruff", "format", "--check", "."),
    "mypy": python_tool("mypy"),
    "buf lint": buf("lint"),
    "buf breaking": lambda root: [*buf("breaking", "protos", "--against")(root), newest_release(root)],
}


def run_step(name: str, root: Path) -> bool:
    print(f"== {name}", flush=True)
    started = time.monotonic()
    result = subprocess.run(STEPS[name](root), cwd=root, timeout=STEP_TIMEOUT, check=False)
    print(
        f"   {name}: {'ok' if result.returncode == 0 else 'FAILED'} in {time.monotonic() - started:.1f} s", flush=True
    )
    return result.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree to check (default: this checkout)")
    parser.add_argument("--only", action="append", choices=list(STEPS), help="run only this step (repeatable)")
    args = parser.parse_args(argv)
    failed = [name for name in args.only or list(STEPS) if not run_step(name, args.root.resolve())]
    if failed:
        print(f"checks failed: {', '.join(failed)}", flush=True)
        return 1
    print("checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
