"""The simulation finds real defect classes: each mutation (mutations.py) plants
one, and the checkers must catch it within the stated seeds, at a seed the
unmutated product passes. Some need a narrow race and are first caught far from
seed 0: the fence mutation (a completion judged on a view read just before the
cancellation request, committed just after) at seed 44, the stale view (an
attempt of a resumed generation while the projection lags) at 15, a repair never
made at 24 (a seed that cuts a turn off), an append to an ended generation at 6,
a settle batch whose items are all settled as its first at 11 (the crew's finale
sends three items in one call), a batch item refused at the fence recorded
settled at 14 (the finale's host calls one member off as they complete).
CI replays those seeds; `funnel-sim`'s long form is the search. The SQLite
writer's mutation runs on the SQLite engine (the in-memory stores have no writer)."""

from __future__ import annotations

import pytest

from funnel_sim.simulation import Config, Result, simulate
from tests.sim.mutations import MUTATIONS
from tests.sim.test_simulation import BATCH_SEED, FENCED_BATCH_SEED

# Mutation: (engine, first seed, seeds searched, the checker that must name it, what
# its finding says). Measured, searching from 0: replay_executes caught at seed 1,
# late_commit_skipped 0, outbox_stopped 1, transcript_replay_appends 0; on SQLite,
# cancelled_writer_forgets at SQLITE_WRITER_SEED, by a write left queued when its
# node crashed at the hand-over (Config.crash_at_handover) and never answered.
SQLITE_WRITER_SEED = 2
# batch_settled_as_first at BATCH_SEED, whose finale settles three completions in one
# SettleCompletions call: two are marked SETTLED unapplied (searching from 0 it is first
# caught at seed 7, the first seed with a batch). batch_refusal_settled at
# FENCED_BATCH_SEED, one item refused at the fence beside one settled: the refused one is
# recorded SETTLED. Searching from 0, seed 9 has such a call first, but a fault drops that
# settlement before its answer is recorded (completion.after_settle_before_publish) and
# the outbox sends it again alone, refused.
WITHIN = {
    "replay_executes": ("memory", 0, 10, "request_ids", ""),
    "late_commit_skipped": ("memory", 0, 10, "watchers", ""),
    "outbox_stopped": ("memory", 0, 10, "settled", ""),
    "transcript_replay_appends": ("memory", 0, 10, "transcripts", "more than once"),
    "stale_view_served": ("memory", 15, 1, "blocks", ""),
    "fence_ignored": ("memory", 44, 1, "fence", ""),
    "repair_skipped": ("memory", 24, 1, "transcripts", "open after the last load"),
    "ended_generation_appended": ("memory", 6, 1, "transcripts", "appended to an ended generation"),
    "cancelled_writer_forgets": ("sqlite", SQLITE_WRITER_SEED, 1, "unwound", ""),
    "batch_settled_as_first": ("memory", BATCH_SEED, 1, "settled", "SETTLED without its terminal event"),
    "batch_refusal_settled": ("memory", FENCED_BATCH_SEED, 1, "settled", "SETTLED without its terminal event"),
}


@pytest.mark.parametrize("name", sorted(WITHIN))
def test_each_mutation_is_caught_within_its_seeds(name, monkeypatch):
    engine, first, seeds, checker, finding = WITHIN[name]
    MUTATIONS[name](monkeypatch)
    for seed in range(first, first + seeds):
        violations = simulate(seed, engine=engine).violations
        if violations:
            assert any(v.startswith(f"{checker}:") and finding in v for v in violations), violations
            monkeypatch.undo()
            assert simulate(seed, engine=engine).violations == [], f"seed {seed} fails without the mutation too"
            return
    pytest.fail(f"mutation {name} survived seeds {first}..{first + seeds - 1}")


def test_a_driver_fault_let_through_is_caught(monkeypatch):
    # Database faults ten times as often as in the sweep: the first one ends a call INTERNAL.
    config = Config(storage_error=0.03)
    MUTATIONS["driver_fault_untranslated"](monkeypatch)
    caught: Result = simulate(0, config)
    assert any(v.startswith("faults:") and "INTERNAL" in v for v in caught.violations), caught.violations
    monkeypatch.undo()
    assert simulate(0, config).violations == []


def test_a_projection_one_generation_behind_alone_costs_nothing(monkeypatch):
    # The attempt reads a view of another generation than its run's afresh: the
    # lag that stale_view_served lets through is harmless with that check in place.
    MUTATIONS["projection_behind"](monkeypatch)
    for seed in range(10):
        assert simulate(seed).violations == [], seed
