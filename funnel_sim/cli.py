"""`funnel-sim`: runs seeds of the deterministic simulation, and replays one.

    funnel-sim --seeds 500                  seeds 0..499
    funnel-sim --minutes 10                 as many seeds as fit in ten minutes
    funnel-sim --seed 17 --keep 0-5,9       one run, only those workload steps
    funnel-sim --seed 17 --history          ... and print its history
    funnel-sim --seeds 500 --engine sqlite  on the services' SQLite stores (default: memory;
                                            mixed: each seed's engine drawn from the seed)

A failing seed is printed with its violations and a one-line replay command,
then shrunk to a minimal workload (unless --no-shrink) and printed again."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from funnel_sim.shrink import shrink
from funnel_sim.simulation import ENGINES, Engine, Result, engine_of, simulate
from funnel_sim.workload import parse_ranges, ranges


def replay_command(seed: int, keep: frozenset[int] | None, engine: Engine = "memory") -> str:
    return (
        f"funnel-sim --seed {seed}"
        + (f" --engine {engine}" if engine != "memory" else "")
        + (f" --keep {ranges(keep)}" if keep is not None else "")
    )


def report(result: Result, keep: frozenset[int] | None) -> None:
    print(f"seed {result.seed} FAILED on {result.engine} ({len(result.violations)} violations):")
    for violation in result.violations:
        print(f"  {violation}")
    print(f"  replay: {replay_command(result.seed, keep, result.engine)}")


def minimal(result: Result) -> frozenset[int]:
    """The failing seed's workload shrunk: the step indexes (of the generated workload) that still fail."""
    every = frozenset(range(len(result.workload.steps)))
    return shrink(every, lambda keep: bool(simulate(result.seed, keep=keep, engine=result.engine).violations))


def engine_for(seed: int, choice: str) -> Engine:
    return engine_of(seed) if choice == "mixed" else "sqlite" if choice == "sqlite" else "memory"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="funnel-sim", description="Deterministic simulation of both services.")
    parser.add_argument("--seeds", type=int, default=None, help="how many seeds to run (from --first)")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--minutes", type=float, default=None, help="run seeds for this long")
    parser.add_argument("--seed", type=int, default=None, help="run this one seed")
    parser.add_argument("--keep", default=None, help="with --seed: the workload steps to keep, e.g. 0-5,9")
    parser.add_argument("--history", action="store_true", help="with --seed: print the run's history")
    parser.add_argument("--no-shrink", action="store_true", help="do not shrink a failing seed's workload")
    parser.add_argument(
        "--engine",
        choices=(*ENGINES, "mixed"),
        default="memory",
        help="the services' stores: in memory, SQLite files, or each seed's drawn from the seed",
    )
    args = parser.parse_args(argv)
    logging.disable(logging.CRITICAL)  # the services' logs of injected faults are expected noise
    if args.seed is not None:
        keep = parse_ranges(args.keep) if args.keep is not None else None
        result = simulate(args.seed, keep=keep, keep_lines=args.history, engine=engine_for(args.seed, args.engine))
        if args.history:
            print("\n".join(result.history.lines))
        print(
            f"seed {args.seed} on {result.engine}: {result.operations} calls, "
            f"{result.virtual_seconds:.0f} virtual seconds, history {result.digest}"
        )
        if result.violations:
            report(result, keep)
            return 1
        return 0
    started = time.monotonic()
    deadline = started + args.minutes * 60 if args.minutes is not None else None
    count = args.seeds if args.seeds is not None else (None if deadline is not None else 100)
    seed, runs, calls, failed = args.first, 0, 0, 0
    while (count is None or runs < count) and (deadline is None or time.monotonic() < deadline):
        result = simulate(seed, engine=engine_for(seed, args.engine))
        runs, calls = runs + 1, calls + result.operations
        if result.violations:
            failed += 1
            report(result, None)
            if not args.no_shrink:
                keep = minimal(result)
                shrunk = replay_command(seed, keep, result.engine)
                print(f"  shrunk to {len(keep)} of {len(result.workload.steps)} steps: {shrunk}")
        seed += 1
    elapsed = time.monotonic() - started
    print(
        f"{runs} seeds ({args.first}..{seed - 1}) on {args.engine}, {failed} failed, {calls} calls in {elapsed:.1f} s: "
        f"{calls / elapsed:.0f} calls/s, {runs / elapsed * 60:.0f} seeds/min"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
