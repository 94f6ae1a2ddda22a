"""`funnel-sim --jobs`: seeds run in worker processes give the same outcomes, in
seed order, as in one process; a failure found in a worker is reported and
shrunk as in one process; the time box ends an endless stream of seeds."""

from __future__ import annotations

import dataclasses
import itertools

from funnel_sim import cli
from funnel_sim.simulation import Config, Engine, Result, simulate

# Without the crew's finale: the runner, not the workload, is under test here.
SMALL = Config(steps=10, crew=0)
# The steps the planted failure needs (of the 18 planned: 8 set the tasks up, then SMALL's 10).
NEEDED = frozenset({3, 7})


def short(seed: int, keep: frozenset[int] | None = None, engine: Engine = "memory") -> Result:
    """A run of `seed` with a short workload (module-level: a worker imports it by name)."""
    return simulate(seed, SMALL, keep=keep, engine=engine)


def flawed(seed: int, keep: frozenset[int] | None = None, engine: Engine = "memory") -> Result:
    """A short run in which seed 1 fails while its workload keeps steps 3 and 7."""
    result = short(seed, keep, engine)
    if seed == 1 and (keep is None or keep >= NEEDED):
        return dataclasses.replace(result, violations=["planted: steps 3 and 7 together"])
    return result


def test_two_jobs_give_the_same_outcomes_in_seed_order_as_one():
    one = list(cli.outcomes(iter(range(6)), jobs=1, shrinking=False, run=short))
    two = list(cli.outcomes(iter(range(6)), jobs=2, shrinking=False, run=short))
    assert [(o.seed, o.digest, o.operations) for o in two] == [(o.seed, o.digest, o.operations) for o in one]
    assert [o.seed for o in two] == [0, 1, 2, 3, 4, 5]


def test_a_failure_in_a_worker_is_reported_shrunk_and_the_time_box_ends_the_sweep(capsys):
    # Endless seeds from 0, boxed to a second: the first four are handed out at once.
    assert cli.sweep(0, None, 1 / 60, 2, True, run=flawed) == 1
    out = capsys.readouterr().out
    assert (
        "seed 1 FAILED on memory (1 violations):\n  planted: steps 3 and 7 together\n  replay: funnel-sim --seed 1\n"
        in out
    )
    assert "  shrunk to 2 of 18 steps: funnel-sim --seed 1 --keep 3,7\n" in out
    assert "1 failed" in out


def test_one_job_stops_at_the_deadline():
    assert list(cli.outcomes(itertools.count(), jobs=1, shrinking=False, deadline=0.0)) == []
