"""Python calls per task in each service, for two revisions: a measure of the work an
attempt's path does that does not depend on this machine's speed.

    .venv/bin/python bench/calls.py OLD_REV [NEW_REV] [--pool 300] [--concurrency 16] [--top 15]

`bench/compare.py` times revisions against each other, and on a shared machine a
difference of a few percent needs many pairs to show. This script counts instead: a
profile hook (`sys.setprofile` and `threading.setprofile`, installed by a
`sitecustomize` on the services' path) counts every Python function and C function
called in every thread of both service processes while bench/run.py's attempt point
runs a fixed pool of tasks (each registered, activated, claimed, then attempted and
settled). Each revision runs twice, with a pool of N and of 2N tasks; the difference
of the two runs, divided by N, is what one more task costs, start-up and shutdown
cancelled out. It then prints calls per task per service and the functions whose
counts moved most. Under the hook the services run several times slower: the counts
are the figure here, never the times.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.compare import revisions

HOOK = """
import atexit, collections, os, sys, threading
_argv = open("/proc/self/cmdline", "rb").read().split(b"\\0")
_role = next((m.decode() for m in (b"completion_service", b"lifecycle_service") if m in _argv), None)
if _role is not None:
    _counts = collections.Counter()
    # The environment first: it may lie inside the tree (.venv), whose own files are named from it.
    _strip = (sys.prefix + "/", sys.base_prefix + "/", os.environ["FUNNEL_CALLS_TREE"] + "/")

    def _name(code):
        path = code.co_filename
        for prefix in _strip:
            path = path.removeprefix(prefix)
        return path + ":" + code.co_name

    def _hook(frame, event, arg):
        if event == "call":
            _counts[_name(frame.f_code)] += 1
        elif event == "c_call":
            _counts["C:" + getattr(arg, "__qualname__", type(arg).__name__)] += 1

    def _dump():
        sys.setprofile(None)
        while True:  # other threads may still count while this one copies
            try:
                counted = list(_counts.items())
                break
            except RuntimeError:
                pass
        out = os.path.join(os.environ["FUNNEL_CALLS_OUT"], f"{_role}.{os.getpid()}.tsv")
        with open(out, "w") as f:
            f.writelines(f"{v}\\t{k}\\n" for k, v in counted)

    atexit.register(_dump)
    sys.setprofile(_hook)
    threading.setprofile(_hook)
"""


def count(tree: Path, pool: int, concurrency: int, scratch: Path) -> dict[str, collections.Counter[str]]:
    """Calls per function in each service (summed over its processes: the calibration's too)."""
    out = Path(tempfile.mkdtemp(dir=scratch))
    (out / "sitecustomize.py").write_text(HOOK)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), str(out)]),
        "FUNNEL_CALLS_OUT": str(out),
        "FUNNEL_CALLS_TREE": str(tree),
    }
    command = [sys.executable, str(tree / "bench" / "run.py"), "--workload", "attempt", "--no-baseline"]
    command += ["--boundary-pairs", "0", "--seconds", "600", "--concurrency", str(concurrency)]
    command += ["--attempt-pool", str(pool), "--data-dir", str(out / "data")]
    subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    counts: dict[str, collections.Counter[str]] = {}
    for dump in out.glob("*.tsv"):
        role = dump.name.split(".")[0]
        mine = counts.setdefault(role, collections.Counter())
        for line in dump.read_text().splitlines():
            value, key = line.split("\t", 1)
            mine[key] += int(value)
    if set(counts) != {"completion_service", "lifecycle_service"}:
        raise SystemExit(f"the services' calls were not counted in {out} (found {sorted(counts)})")
    return counts


def per_task(tree: Path, pool: int, concurrency: int, scratch: Path) -> dict[str, dict[str, float]]:
    small = count(tree, pool, concurrency, scratch)
    large = count(tree, 2 * pool, concurrency, scratch)
    return {
        role: {key: (large[role][key] - small[role][key]) / pool for key in large[role].keys() | small[role].keys()}
        for role in large
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", help="the revision to compare against")
    parser.add_argument("new", nargs="?", default=None, help="the revision to judge (default: the working tree)")
    parser.add_argument("--pool", type=int, default=300, help="tasks in the smaller run (default 300)")
    parser.add_argument("--concurrency", type=int, default=16, help="attempts in flight (default 16)")
    parser.add_argument("--top", type=int, default=15, help="functions listed whose counts moved most (default 15)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="funnel-calls-") as scratch_dir:
        scratch = Path(scratch_dir)
        with revisions(args.old, args.new, scratch) as trees:
            measured = {side: per_task(tree, args.pool, args.concurrency, scratch) for side, tree in trees.items()}
    print(
        f"old {args.old}, new {args.new or 'working tree'}: Python and C calls per task (register, activate, claim,"
        f" attempt, settle; {args.pool} against {2 * args.pool} tasks, {args.concurrency} in flight)"
    )
    for role in ("completion_service", "lifecycle_service"):
        old, new = measured["old"][role], measured["new"][role]
        before, after = sum(old.values()), sum(new.values())
        print(f"  {role}: {before:,.0f} -> {after:,.0f} ({after / before - 1:+.1%})")
        moved = sorted(old.keys() | new.keys(), key=lambda k: abs(new.get(k, 0) - old.get(k, 0)), reverse=True)
        for key in moved[: args.top]:
            print(f"      {new.get(key, 0) - old.get(key, 0):+8.1f}  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
