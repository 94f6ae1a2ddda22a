"""The crash-point matrix (issue 5 §2): for every fault point, seeded random runs
with both services as real processes over SQLite files. In each run the armed
point crashes its process (SIGKILL) or drops a reply; the workload keeps going
(a dead service is restarted, disarmed, on the same port; clients retry with the
same request id); then the outbox and the propagations drain and every invariant
is checked on the two databases (see workload.check).

One process pair per point serves all its seeds, each seed in its own workspace;
only a crashed process restarts. The fault plan is re-armed through the
processes' fault control files.

The matrix runs on SQLite and on PostgreSQL (both services on one throwaway
database, tests/postgres.py). CI runs FUNNEL_CRASH_SEEDS (default 20) seeds per
point on SQLite and FUNNEL_CRASH_SEEDS_POSTGRESQL (default 5) on PostgreSQL. The
long form:

    FUNNEL_CRASH_SEEDS=300 .venv/bin/python -m pytest tests/reliability/test_crash_matrix.py -n 2

prints the totals (runs, faults injected, crashes, drops, lost, duplicated);
FUNNEL_CRASH_SEED_BASE shifts the seeds, FUNNEL_CRASH_REPORT=FILE also writes
them as JSON. See docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time

import pytest

from funnel.runtime.faults import POINTS
from tests.postgres import fresh_database
from tests.reliability.harness import Pair
from tests.reliability.workload import Findings, Workload, check, check_watchers, drain, pending

SEEDS = {
    "sqlite": int(os.environ.get("FUNNEL_CRASH_SEEDS", "20")),
    "postgresql": int(os.environ.get("FUNNEL_CRASH_SEEDS_POSTGRESQL", "5")),
}
SEED_BASE = int(os.environ.get("FUNNEL_CRASH_SEED_BASE", "0"))
# A run that takes longer than this has hung: the test fails instead of CI.
RUN_TIMEOUT = 60.0
CRASH_SHARE = 0.6

# point -> (largest nth worth drawing, extra plan that makes the point reachable,
#           parent endings the workload may draw)
PLANS: dict[str, tuple[int, str, tuple[str, ...]]] = {
    "completion.after_commit_before_settle": (2, "", ()),
    "completion.after_settle_before_publish": (2, "", ()),
    # The settler only retries rows a first settle left PENDING: drop one first.
    "completion.outbox_retry": (1, "completion.after_commit_before_settle:drop:1", ()),
    "completion.transcript_repair": (1, "", ()),
    "lifecycle.before_commit": (20, "", ()),
    "lifecycle.after_commit_before_reply": (16, "", ()),
    # Only a parent that ends by cancellation, failure or timeout owes propagations.
    "lifecycle.between_parent_and_propagation": (2, "", ("cancel", "fail", "timeout")),
}
assert set(PLANS) == POINTS, "every fault point must be in the matrix"


def plan_for(point: str, seed: int) -> str:
    largest, extra, _ = PLANS[point]
    rng = random.Random(f"{point}/{seed}")
    action = "crash" if rng.random() < CRASH_SHARE else "drop"
    spec = f"{point}:{action}:{rng.randint(1, largest)}"
    return f"{spec},{extra}" if extra else spec


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(SEEDS))
@pytest.mark.parametrize("point", sorted(PLANS))
async def test_crash_point(point, backend, tmp_path, record_property):
    url = await asyncio.to_thread(fresh_database) if backend == "postgresql" else None
    pair = await Pair(tmp_path / "pair", database_url=url).start()
    target = pair.service(point)
    totals = {
        "point": f"{point} ({backend})",
        "runs": 0,
        "faults": 0,
        "crashes": 0,
        "drops": 0,
        "lost": 0,
        "duplicated": 0,
        "unknown_calls": 0,
        "seconds": 0.0,
    }
    violations: list[str] = []
    started = time.monotonic()
    try:
        for seed in range(SEED_BASE, SEED_BASE + SEEDS[backend]):
            workspace = f"ws-{seed}"
            fired_before = pair.lifecycle.faults_fired() + pair.completion.faults_fired()
            crashes_before = pair.crashes
            target.arm(plan_for(point, seed))
            workload = Workload(pair, seed, workspace, parent_endings=PLANS[point][2])
            try:
                ledger = await asyncio.wait_for(workload.run(), RUN_TIMEOUT)
            except TimeoutError:
                violations.append(f"{point} seed {seed}: the run did not finish within {RUN_TIMEOUT:.0f}s")
                for watcher in workload.watchers:
                    await watcher.stop()
                break
            target.disarm()
            await pair.ensure_alive()
            findings = Findings()
            if not await drain(pair, workspace):
                findings.fail("lost", f"the outbox or the propagations did not drain: {pending(pair, workspace)}")
            # After recovery, a fresh load finds every interrupted turn repaired, once.
            for task_id in ledger.interrupted:
                await workload.load(workload.tasks[task_id])
            checked = check(pair, ledger)
            await check_watchers(pair, workload.watchers, checked)
            findings.lost += checked.lost
            findings.duplicated += checked.duplicated
            findings.violations += checked.violations
            fired = pair.lifecycle.faults_fired() + pair.completion.faults_fired() - fired_before
            crashes = pair.crashes - crashes_before
            totals["runs"] += 1
            totals["faults"] += fired
            totals["crashes"] += crashes
            totals["drops"] += fired - crashes
            totals["lost"] += findings.lost
            totals["duplicated"] += findings.duplicated
            totals["unknown_calls"] += ledger.unknown
            violations += [f"{point} seed {seed} ({plan_for(point, seed)}): {v}" for v in findings.violations]
            if len(violations) > 20:
                break
    finally:
        totals["seconds"] = round(time.monotonic() - started, 1)
        record_property("crash_matrix", json.dumps(totals))
        await pair.stop()
    assert not violations, "\n".join(violations)
    # The matrix is only worth something if the faults actually fire.
    assert totals["faults"] >= totals["runs"] // 2, totals
