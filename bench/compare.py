"""Two revisions of the services measured in alternating pairs, on this machine.

    .venv/bin/python bench/compare.py OLD_REV [NEW_REV] [--pairs 5] [--seconds 6] [--concurrency 16]
                                      [--postgresql [--replicas N]] [--attempt-pool N]

A shared machine's speed drifts by a quarter within minutes (docs/performance.md):
one run of each revision cannot show a lever worth less than that. This script
checks OLD_REV (and NEW_REV; by default the working tree as it is) out into
temporary git worktrees, then runs bench/run.py's attempt point (no echo chain)
in pairs (old then new, then new then old, and so on, so that a drift of the
machine over the run favours neither) and prints each pair, the ratio new/old of throughput
and CPU per attempt, and in how many pairs the new revision was faster. Keep a
lever when (nearly) every pair agrees. With --postgresql both revisions run on a
throwaway PostgreSQL (one replica of each service, or --replicas N) instead of
SQLite files.

Each run imports the services of its own tree (it runs with that tree as its
working directory and first on PYTHONPATH, ahead of the editable install).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Run:
    ops_per_s: float
    p99_ms: float
    cpu_ms: float
    failures: int


def worktree(rev: str, parent: Path) -> Path:
    path = parent / rev.replace("/", "_")
    made = subprocess.run(
        ["git", "worktree", "add", "--detach", str(path), rev], cwd=ROOT, capture_output=True, text=True
    )
    if made.returncode != 0:
        raise SystemExit(f"cannot check out {rev!r}: {made.stderr.strip()}")
    return path


@contextlib.contextmanager
def revisions(old: str, new: str | None, parent: Path) -> Iterator[dict[str, Path]]:
    """{"old": tree, "new": tree}: each revision checked out into a worktree under
    `parent` (`new` None: the working tree itself), removed again on the way out, also
    when a checkout fails."""
    trees = {"new": ROOT}
    try:
        trees["old"] = worktree(old, parent)
        if new:
            trees["new"] = worktree(new, parent)
        yield trees
    finally:
        for tree in trees.values():
            if tree != ROOT:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False, capture_output=True
                )


def measure(tree: Path, seconds: float, concurrency: int, out: Path, replicas: int | None, pool: int | None) -> Run:
    """One attempt point of `tree`: on SQLite, or on PostgreSQL with `replicas` of each service."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    engine = ["--postgresql", "--postgresql-only", "--replicas", str(replicas)] if replicas else []
    sized = ["--attempt-pool", str(pool)] if pool else []
    subprocess.run(
        [
            sys.executable,
            str(tree / "bench" / "run.py"),
            "--seconds",
            str(seconds),
            "--concurrency",
            str(concurrency),
            "--workload",
            "attempt",
            "--no-baseline",
            "--boundary-pairs",
            "0",
            *engine,
            *sized,
            "--json",
            str(out),
        ],
        cwd=tree,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    phase = "empty" if not replicas else "postgresql" if replicas == 1 else f"postgresql-{replicas}"
    point = json.loads(out.read_text())["phases"][phase]["results"]["attempt"][str(concurrency)]
    return Run(point["ops_per_s"], point["p99_ms"], point["cpu_ms_per_op"]["total"], point["failures"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", help="the revision to compare against (a commit, tag or branch)")
    parser.add_argument("new", nargs="?", default=None, help="the revision to judge (default: the working tree)")
    parser.add_argument("--pairs", type=int, default=5, help="alternating old/new pairs (default 5)")
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each measured point (default 6)")
    parser.add_argument("--concurrency", type=int, default=16, help="attempts in flight (default 16)")
    parser.add_argument("--postgresql", action="store_true", help="on a throwaway PostgreSQL instead of SQLite")
    parser.add_argument(
        "--replicas", type=int, default=1, help="with --postgresql: replicas of each service (default 1)"
    )
    parser.add_argument(
        "--attempt-pool", type=int, default=None, help="pre-claimed tasks per run (default: run.py's estimate)"
    )
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    if args.replicas < 1 or (args.replicas != 1 and not args.postgresql):
        parser.error("--replicas takes a count of at least 1, with --postgresql")

    with tempfile.TemporaryDirectory(prefix="funnel-compare-") as scratch:
        parent = Path(scratch)
        with revisions(args.old, args.new, parent) as trees:
            print(
                f"old {args.old}, new {args.new or 'working tree'}: attempt at {args.concurrency} in flight, "
                f"{args.seconds:g} s per point, {args.pairs} pairs, "
                + (f"PostgreSQL, {args.replicas} replica(s) of each" if args.postgresql else "SQLite"),
                flush=True,
            )
            print(
                f"  {'pair':>4} {'old ops/s':>10} {'new ops/s':>10} {'ratio':>6} {'old cpu ms':>11} "
                f"{'new cpu ms':>11} {'old p99':>8} {'new p99':>8}",
                flush=True,
            )
            pairs: list[tuple[Run, Run]] = []
            for n in range(1, args.pairs + 1):
                # Old first in odd pairs, new first in even ones: a drift of the machine's
                # speed over the run then favours neither.
                order = ("old", "new") if n % 2 else ("new", "old")
                runs = {
                    name: measure(
                        trees[name],
                        args.seconds,
                        args.concurrency,
                        parent / f"{name}.json",
                        args.replicas if args.postgresql else None,
                        args.attempt_pool,
                    )
                    for name in order
                }
                old, new = runs["old"], runs["new"]
                pairs.append((old, new))
                failed = "  FAILURES" if old.failures or new.failures else ""
                print(
                    f"  {n:>4} {old.ops_per_s:>10.0f} {new.ops_per_s:>10.0f} {new.ops_per_s / old.ops_per_s:>6.2f} "
                    f"{old.cpu_ms:>11.2f} {new.cpu_ms:>11.2f} {old.p99_ms:>8.1f} {new.p99_ms:>8.1f}{failed}",
                    flush=True,
                )

    throughput = [new.ops_per_s / old.ops_per_s for old, new in pairs]
    cpu = [new.cpu_ms / old.cpu_ms for old, new in pairs]
    faster = sum(r > 1 for r in throughput)
    print(
        f"new/old throughput: median {statistics.median(throughput):.2f}, mean {statistics.fmean(throughput):.2f}; "
        f"CPU per attempt: median {statistics.median(cpu):.2f}; new faster in {faster} of {len(pairs)} pairs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
