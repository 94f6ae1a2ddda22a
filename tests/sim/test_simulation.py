"""The deterministic simulation's short form (issue 22): its checker of
linearizability on known histories, replay (same seed, same history, in this
process and another with other hash seeds), shrinking, fixed seeds and a
time-boxed sweep that fail with their replay command."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.runtime.sqlite import LOCKED_PAST_THE_DEADLINE
from funnel_sim import cli
from funnel_sim.checkers import step
from funnel_sim.linearizability import Operation, linearizable
from funnel_sim.network import UNAVAILABLE, Failed, Ok
from funnel_sim.nodes import STATEMENT_FAULTS
from funnel_sim.shrink import shrink
from funnel_sim.simulation import ENGINES, Config, Result, engine_of, simulate
from funnel_sim.workload import parse_ranges, ranges


def register(state: int, op: tuple[str, int]) -> int | None:
    kind, value = op
    if kind == "write":
        return value
    return state if value == state else None


def test_a_linearizable_register_history_is_accepted():
    # The read overlaps the write: it may see either value.
    history = [Operation(0, 2, ("write", 1)), Operation(1, 3, ("read", 0)), Operation(4, 5, ("read", 1))]
    assert linearizable(history, 0, register) is True


def test_a_stale_read_after_an_acknowledged_write_is_not_linearizable():
    history = [Operation(0, 1, ("write", 1)), Operation(2, 3, ("read", 0))]
    assert linearizable(history, 0, register) is False


def test_a_write_without_an_answer_may_or_may_not_have_happened():
    pending = Operation(0, None, ("write", 1))
    assert linearizable([pending, Operation(2, 3, ("read", 0))], 0, register) is True
    assert linearizable([pending, Operation(2, 3, ("read", 1))], 0, register) is True


def test_two_writes_answered_with_the_same_revision_are_not_linearizable():
    record = (1, 1, 2, 0, 1, 2, "")
    double = (2, 1, 2, 0, 1, 3, "")
    history = [
        Operation(0, 1, ("write", record)),
        Operation(2, 3, ("write", double)),
        Operation(4, 5, ("write", double[:5] + (1, ""))),
    ]
    assert linearizable(history, ("absent",), step) is False


def test_the_same_seed_gives_the_same_history_byte_for_byte():
    assert simulate(3).digest == simulate(3).digest


@pytest.mark.parametrize("engine", ENGINES)
def test_another_process_with_other_hash_seeds_replays_the_same_history(engine):
    # On SQLite the database threads run on real time, at another pace in each process:
    # the lockstep with virtual time (funnel_sim/threads.py) keeps the history the same.
    code = (
        "import logging; logging.disable(50); from funnel_sim.simulation import simulate; "
        f"print(simulate(3, engine={engine!r}).digest)"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert other.stdout.strip() == simulate(3, engine=engine).digest


def test_shrinking_finds_the_steps_a_failure_needs():
    needed = {3, 7}
    assert shrink(frozenset(range(20)), lambda keep: needed <= keep) == needed


def test_step_ranges_round_trip():
    steps = frozenset({0, 1, 2, 3, 7, 9, 10})
    assert ranges(steps) == "0-3,7,9-10"
    assert parse_ranges(ranges(steps)) == steps


def test_a_kept_workload_replays_from_its_command(capsys):
    assert cli.main(["--seed", "4", "--keep", "0-20"]) == 0
    assert "seed 4 on memory:" in capsys.readouterr().out


def test_mixed_runs_each_seed_on_the_engine_drawn_from_it(capsys):
    assert {engine_of(seed) for seed in range(10)} == set(ENGINES)
    seed = next(seed for seed in range(10) if engine_of(seed) == "sqlite")
    assert cli.main(["--seed", str(seed), "--engine", "mixed", "--keep", "0-10"]) == 0
    assert f"seed {seed} on sqlite:" in capsys.readouterr().out


@pytest.mark.parametrize("seed", range(6))
def test_fixed_seeds_keep_every_invariant(seed):
    result = simulate(seed)
    assert result.violations == [], cli.replay_command(seed, None)


def test_every_kind_of_database_fault_reaches_its_caller_as_storage_unavailable():
    # Faults ten times as often as in the sweep: each kind the driver raises at a
    # statement, and the write lock held past the caller's deadline, is answered
    # STORAGE_UNAVAILABLE (UNAVAILABLE: retry), never INTERNAL, every invariant kept.
    result = simulate(1, Config(storage_error=0.03, locked=0.03))
    assert result.violations == []
    answered = [
        call.answer.status
        for call in result.history.calls
        if isinstance(call.answer, Failed) and call.answer.reason == "STORAGE_UNAVAILABLE"
    ]
    assert {status.code for status in answered} == {UNAVAILABLE}
    for problem in [*(fault.message for fault in STATEMENT_FAULTS), LOCKED_PAST_THE_DEADLINE]:
        assert any(f"({problem})" in status.message for status in answered), problem


# Seeds whose runs hold every transcript intent (measured: 14 reopens and cuts a turn
# off, 24 repairs one, 40 has a turn interrupted by the user and a reopen).
TRANSCRIPT_SEEDS = (14, 24, 40)


def test_transcripts_are_appended_interrupted_repaired_and_reopen_completed_generations():
    seen: set[str] = set()
    for seed in TRANSCRIPT_SEEDS:
        result = simulate(seed)
        assert result.violations == [], cli.replay_command(seed, None)
        for call in result.history.calls:
            if not isinstance(call.answer, Ok):
                continue
            if call.method == "AppendTranscript":
                seen.add("appended")
                if call.answer.response.resumed:
                    seen.add("reopened")
                if any(e.turn_end.reason == completion_enums.TURN_END_REASON_INTERRUPTED for e in call.request.events):
                    seen.add("interrupted by the user")
                if not call.request.events[-1].HasField("turn_end"):
                    seen.add("cut off")
            if call.method == "LoadTranscript" and call.answer.response.repaired:
                seen.add("repaired")
    assert seen == {"appended", "reopened", "interrupted by the user", "cut off", "repaired"}


# A seed whose crew's finale (workload.py) settles several completions of one
# workspace in one SettleCompletions call (measured: three items, all settled; the
# first seed from 0 with such a call is 7, with two).
BATCH_SEED = 11


def settle_batches(result: Result) -> list[int]:
    """The items of each SettleCompletions call the completion service made."""
    return [len(call.request.items) for call in result.history.calls if call.method == "SettleCompletions"]


def test_the_crews_finale_settles_several_completions_in_one_call():
    result = simulate(BATCH_SEED)
    assert result.violations == [], cli.replay_command(BATCH_SEED, None)
    together = [
        call.answer.response.results
        for call in result.history.calls
        if call.method == "SettleCompletions" and len(call.request.items) >= 2 and isinstance(call.answer, Ok)
    ]
    assert together, settle_batches(result)
    # Every item judged and settled on its own (none refused at this seed).
    assert all(item.HasField("settled") for results in together for item in results)
    # Without the finale the same seed never batches: the random steps' completions are rare and spread out.
    assert settle_batches(simulate(BATCH_SEED, Config(crew=0))) == []


# A seed whose finale's host calls a member off as the crew completes: the member's
# settlement is refused at the cancellation fence in the same call as another's, settled.
FENCED_BATCH_SEED = 14


def test_a_settle_batch_judges_each_item_alone():
    result = simulate(FENCED_BATCH_SEED)
    assert result.violations == [], cli.replay_command(FENCED_BATCH_SEED, None)
    judged = [
        {("settled" if item.HasField("settled") else item.error.message) for item in call.answer.response.results}
        for call in result.history.calls
        if call.method == "SettleCompletions" and isinstance(call.answer, Ok)
    ]
    assert any("settled" in answers and len(answers) > 1 for answers in judged), judged
    assert any("refused after its cancellation request" in answer for answers in judged for answer in answers)


# Found by the sweep: two hosts' feedback for one completed task 70 ms apart. Both
# batches reopened it under one request id, `reopen:<task>:<generation>`, on behalf
# of different callers, so the lifecycle service refused the second as a reused
# request id and its host was told LIFECYCLE_REJECTED. Now each batch has its own
# resume, and the one that loses the race lands in the reopened generation.
RACING_REOPEN_SEED = 803


def test_two_batches_racing_to_reopen_a_completed_generation_both_land_in_the_next():
    result = simulate(RACING_REOPEN_SEED)
    assert result.violations == [], cli.replay_command(RACING_REOPEN_SEED, None)
    landed = [
        call.answer.response.resumed
        for call in result.history.calls
        if call.method == "AppendTranscript"
        and isinstance(call.answer, Ok)
        and call.request.task_id == "t3"
        and call.answer.response.generation == 2
    ]
    assert sorted(landed) == [False, True], landed


SQLITE_SEEDS = range(3)


@pytest.mark.parametrize("seed", SQLITE_SEEDS)
def test_fixed_seeds_keep_every_invariant_on_sqlite(seed):
    result = simulate(seed, engine="sqlite")
    assert result.violations == [], cli.replay_command(seed, None, "sqlite")


# Seeds beyond the fixed ones, as many as fit in the box, each on the engine drawn
# from it: new ground on every change of the code.
SWEEP_SECONDS = float(os.environ.get("FUNNEL_SIM_SWEEP_SECONDS", "10"))


def test_a_time_boxed_sweep_keeps_every_invariant():
    deadline = time.monotonic() + SWEEP_SECONDS
    seed = 1000
    while time.monotonic() < deadline:
        result = simulate(seed, engine=engine_of(seed))
        replay = cli.replay_command(seed, None, result.engine)
        assert result.violations == [], f"{result.violations}; replay: {replay}"
        seed += 1
    assert seed > 1000
