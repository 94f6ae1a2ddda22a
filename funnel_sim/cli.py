"""`funnel-sim`: runs seeds of the deterministic simulation, and replays one.

    funnel-sim --seeds 500                  seeds 0..499, in one process per CPU
    funnel-sim --minutes 10 --jobs 2        as many seeds as fit in ten minutes, two processes
    funnel-sim --seed 17 --keep 0-5,9       one run, only those workload steps
    funnel-sim --seed 17 --history          ... and print its history
    funnel-sim --seeds 500 --engine sqlite  on the services' SQLite stores (default: memory;
                                            mixed: each seed's engine drawn from the seed)

Seeds run in `--jobs` worker processes and are reported in seed order, so the
output is the same whatever the number of jobs. A failing seed is printed with
its violations and a one-line replay command, then shrunk (in its worker) to a
minimal workload (unless --no-shrink) and printed again.

One operation is one unary call a simulated client or the completion service
made (whatever it answered), as the history records it: the unit of the
summary's operations/min."""

from __future__ import annotations

import argparse
import collections
import gc
import itertools
import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

from funnel_sim.shrink import shrink
from funnel_sim.simulation import ENGINES, Engine, Result, engine_of, simulate
from funnel_sim.workload import parse_ranges, ranges

# A run of one seed, or of the steps of its workload kept, on an engine (`simulate`'s shape).
Simulate = Callable[..., Result]


@dataclass(frozen=True)
class Outcome:
    """What a sweep needs of one seed's run: small, to cross from a worker process."""

    seed: int
    engine: Engine
    operations: int
    digest: str
    violations: list[str]
    steps: int
    # The failing workload shrunk (the step indexes that still fail), when shrinking.
    shrunk: frozenset[int] | None


def replay_command(seed: int, keep: frozenset[int] | None, engine: Engine = "memory") -> str:
    return (
        f"funnel-sim --seed {seed}"
        + (f" --engine {engine}" if engine != "memory" else "")
        + (f" --keep {ranges(keep)}" if keep is not None else "")
    )


def report(seed: int, engine: Engine, violations: list[str], keep: frozenset[int] | None) -> None:
    print(f"seed {seed} FAILED on {engine} ({len(violations)} violations):")
    for violation in violations:
        print(f"  {violation}")
    print(f"  replay: {replay_command(seed, keep, engine)}")


def minimal(result: Result, run: Simulate = simulate) -> frozenset[int]:
    """The failing seed's workload shrunk: the step indexes (of the generated workload) that still fail."""
    every = frozenset(range(len(result.workload.steps)))
    return shrink(every, lambda keep: bool(run(result.seed, keep=keep, engine=result.engine).violations))


def engine_for(seed: int, choice: str) -> Engine:
    return engine_of(seed) if choice == "mixed" else "sqlite" if choice == "sqlite" else "memory"


def run_seed(seed: int, engine: str, shrinking: bool, run: Simulate = simulate) -> Outcome:
    result = run(seed, engine=engine_for(seed, engine))
    shrunk = minimal(result, run) if result.violations and shrinking else None
    return Outcome(
        seed, result.engine, result.operations, result.digest, result.violations, len(result.workload.steps), shrunk
    )


def default_jobs() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _prepare() -> None:
    """Readies a process to run seeds: the services' logs of injected faults are expected
    noise; what exists already (modules, classes, functions: alive as long as the process)
    is moved out of the cyclic garbage collector's sight, which otherwise walks it at
    every full collection."""
    logging.disable(logging.CRITICAL)
    gc.freeze()


def outcomes(
    seeds: Iterator[int],
    jobs: int,
    shrinking: bool,
    deadline: float | None = None,
    run: Simulate = simulate,
    engine: str = "memory",
) -> Iterator[Outcome]:
    """Each seed's outcome, in seed order, until the seeds run out or, for a seed not
    yet started, `deadline` (time.monotonic) has passed. With more than one job the
    seeds run in that many processes, a few ahead of the one reported next."""

    def due() -> bool:
        return deadline is None or time.monotonic() < deadline

    if jobs <= 1:
        for seed in seeds:
            if not due():
                return
            yield run_seed(seed, engine, shrinking, run)
        return
    # Forked from a server process that imported the simulation once: a worker starts in
    # milliseconds instead of importing both services (a second of CPU each), and
    # inherits nothing of this process.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["funnel_sim.simulation"])
    pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=_prepare)
    try:
        ahead: collections.deque[Future[Outcome]] = collections.deque()
        while True:
            # Two per worker: one running, one queued, so that none waits for the parent.
            while len(ahead) < 2 * jobs and due() and (queued := next(seeds, None)) is not None:
                ahead.append(pool.submit(run_seed, queued, engine, shrinking, run))
            if not ahead:
                return
            yield ahead.popleft().result()
    finally:
        pool.shutdown(cancel_futures=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="funnel-sim", description="Deterministic simulation of both services.")
    parser.add_argument("--seeds", type=int, default=None, help="how many seeds to run (from --first)")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--minutes", type=float, default=None, help="run seeds for this long")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="worker processes (default: the CPUs)")
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
    _prepare()
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
            report(args.seed, result.engine, result.violations, keep)
            return 1
        return 0
    return sweep(args.first, args.seeds, args.minutes, args.jobs, not args.no_shrink, engine=args.engine)


def sweep(
    first: int,
    count: int | None,
    minutes: float | None,
    jobs: int,
    shrinking: bool,
    run: Simulate = simulate,
    engine: str = "memory",
) -> int:
    started = time.monotonic()
    deadline = started + minutes * 60 if minutes is not None else None
    if count is None and deadline is None:
        count = 100
    seeds = iter(range(first, first + count)) if count is not None else itertools.count(first)
    runs, operations, failed, last = 0, 0, 0, first - 1
    for outcome in outcomes(seeds, jobs, shrinking, deadline, run, engine):
        runs, operations, last = runs + 1, operations + outcome.operations, outcome.seed
        if outcome.violations:
            failed += 1
            report(outcome.seed, outcome.engine, outcome.violations, None)
            if outcome.shrunk is not None:
                print(
                    f"  shrunk to {len(outcome.shrunk)} of {outcome.steps} steps: "
                    f"{replay_command(outcome.seed, outcome.shrunk, outcome.engine)}"
                )
    minutes_taken = (time.monotonic() - started) / 60
    print(
        f"{runs} seeds ({first}..{last}) on {engine}, {failed} failed, {operations} operations in "
        f"{minutes_taken * 60:.1f} s with {jobs} jobs: {operations / minutes_taken:,.0f} operations/min, "
        f"{runs / minutes_taken:,.0f} seeds/min"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
