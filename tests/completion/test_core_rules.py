"""Pure rules of the completion core: the duplicate policy, seed 001's complete_task
rules (tokens, notes, final status), leases, the stall rule, settlement answers and
the decision's JSON form."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from completion_service.core.duplicates import CompletionKey, DuplicateVerdict, judge_duplicate, place_completion
from completion_service.core.model import (
    AgentAction,
    CompletionRecord,
    Decision,
    FinalStatus,
    GateStatus,
    GateTrace,
    Lease,
    RequestedOutcome,
    RunOutcome,
    SettlementStatus,
    Verdict,
    decision_from_json,
    decision_to_json,
)
from completion_service.core.runs import (
    NOTES_LIMIT,
    ClosePlan,
    CloseStep,
    FenceEnd,
    LeaseGranted,
    LeaseHeld,
    RenewalProblem,
    TaskEffect,
    cap_notes,
    close_effect,
    close_plan,
    fence_end,
    is_stalled,
    judge_claim,
    judge_renewal,
    tokens_total,
)
from completion_service.core.settlement import LIFECYCLE_DOMAIN, SettleAnswer, classify_failure, retry_delay_seconds

NOW = 1_700_000_000_000_000
MINUTE = 60_000_000

# --- duplicates (docs/specification.md §5.6) ---------------------------------------

STORED = CompletionKey("sha256:aaa", b'{"outcome":"COMPLETED"}', "COMPLETED")


@pytest.mark.parametrize(
    "stored, attempt, verdict",
    [
        (None, STORED, DuplicateVerdict.INSERT),
        (STORED, CompletionKey("sha256:aaa", b'{"outcome":"COMPLETED"}', "COMPLETED"), DuplicateVerdict.SAME),
        (STORED, CompletionKey("sha256:bbb", b'{"state_version":9}', "COMPLETED"), DuplicateVerdict.KEEP_EXISTING),
        (STORED, CompletionKey("sha256:ccc", b'{"outcome":"FAILED"}', "FAILED"), DuplicateVerdict.CONFLICT),
        (
            STORED,
            CompletionKey("sha256:aaa", b'{"outcome":"COMPLETED","x":1}', "COMPLETED"),
            DuplicateVerdict.CORRUPTED,
        ),
    ],
    ids=[
        "no row: insert",
        "same identity and payload",
        "other identity, same outcome",
        "other outcome",
        "same identity, other payload",
    ],
)
def test_duplicate_policy(stored, attempt, verdict):
    assert judge_duplicate(stored, attempt) is verdict


def test_same_identity_with_another_payload_is_corruption_even_with_another_outcome():
    # A digest match with different bytes can never be taken as idempotent.
    assert judge_duplicate(STORED, CompletionKey("sha256:aaa", b"other", "FAILED")) is DuplicateVerdict.CORRUPTED


@pytest.mark.parametrize(
    ("settlement", "reason", "attempt", "verdict"),
    [
        # Refused while a child was active (transient): any new attempt replaces it,
        # the same identity and another outcome included.
        (SettlementStatus.REJECTED, "ACTIVE_ATTACHED_CHILD", CompletionKey("i", b"p", "COMPLETED"), "REPLACE"),
        (SettlementStatus.REJECTED, "ACTIVE_ATTACHED_CHILD", CompletionKey("j", b"q", "FAILED"), "REPLACE"),
        # Refused for good: the row stays and the duplicate policy judges.
        (SettlementStatus.REJECTED, "GENERATION_TERMINAL", CompletionKey("i", b"p", "COMPLETED"), "SAME"),
        (SettlementStatus.REJECTED, "GENERATION_TERMINAL", CompletionKey("j", b"q", "FAILED"), "CONFLICT"),
        (SettlementStatus.PENDING, None, CompletionKey("j", b"q", "COMPLETED"), "KEEP_EXISTING"),
        (SettlementStatus.SETTLED, None, CompletionKey("i", b"other", "COMPLETED"), "CORRUPTED"),
    ],
)
def test_where_an_allowed_attempts_completion_goes(settlement, reason, attempt, verdict):
    assert place_completion(_completion(settlement, reason), attempt) is DuplicateVerdict[verdict]
    assert place_completion(None, attempt) is DuplicateVerdict.INSERT


# --- tokens (seed 001 "Token semantics", acceptance: inconsistency prefers tokensTotal) ---


@pytest.mark.parametrize(
    "tokens_input, tokens_output, reported, expected",
    [
        (1200, 800, 5000, 5000),  # inconsistent: the reported total wins, no error
        (1200, 800, 100, 100),  # even when smaller than the parts
        (1200, 800, 2000, 2000),
        (1200, 800, None, 2000),  # no total: input + output
        (None, None, 750, 750),
        (1200, 800, 0, 0),  # a reported zero is still a report
        (300, None, None, 300),
        (None, 40, None, 40),
        (None, None, None, 0),
    ],
)
def test_tokens_total(tokens_input, tokens_output, reported, expected):
    assert tokens_total(tokens_input, tokens_output, reported) == expected


# --- notes ----------------------------------------------------------------------------------


def test_notes_of_exactly_the_limit_are_kept_whole():
    notes = "n" * 2000
    assert NOTES_LIMIT == 2000
    assert cap_notes(notes) == (notes, False)


def test_notes_one_character_over_the_limit_are_cut_and_flagged():
    notes = "n" * 1999 + "xy"
    assert cap_notes(notes) == ("n" * 1999 + "x", True)


@pytest.mark.parametrize("notes", ["", "short summary", "é" * 2000])
def test_short_notes_are_untouched(notes):
    assert cap_notes(notes) == (notes, False)


def test_notes_are_counted_in_characters_not_bytes():
    notes = "\U0001f680" * 2001  # 4 UTF-8 bytes, 2 UTF-16 units each
    capped, truncated = cap_notes(notes)
    assert truncated and capped == "\U0001f680" * 2000


# --- close_plan: the final status of a closed run -----------------------------------------


@pytest.mark.parametrize(
    "outcome, final_status, plan",
    [
        (RunOutcome.SUCCEEDED, None, ClosePlan(CloseStep.ATTEMPT_COMPLETION, FinalStatus.DONE)),
        (RunOutcome.FAILED, None, ClosePlan(CloseStep.SET_STATUS, FinalStatus.BLOCKED)),
        (RunOutcome.CANCELLED, None, ClosePlan(CloseStep.CANCEL, FinalStatus.CANCELLED)),
        (RunOutcome.STALLED, None, ClosePlan(CloseStep.LEAVE)),
        # An explicit final status wins over the outcome.
        (RunOutcome.SUCCEEDED, FinalStatus.BLOCKED, ClosePlan(CloseStep.SET_STATUS, FinalStatus.BLOCKED)),
        (RunOutcome.SUCCEEDED, FinalStatus.READY, ClosePlan(CloseStep.SET_STATUS, FinalStatus.READY)),
        (RunOutcome.FAILED, FinalStatus.IN_PROGRESS, ClosePlan(CloseStep.SET_STATUS, FinalStatus.IN_PROGRESS)),
        (RunOutcome.FAILED, FinalStatus.CANCELLED, ClosePlan(CloseStep.CANCEL, FinalStatus.CANCELLED)),
        (RunOutcome.STALLED, FinalStatus.READY, ClosePlan(CloseStep.SET_STATUS, FinalStatus.READY)),
        (RunOutcome.CANCELLED, FinalStatus.BLOCKED, ClosePlan(CloseStep.SET_STATUS, FinalStatus.BLOCKED)),
        # DONE is reached only through the completion transaction, whatever the outcome.
        (RunOutcome.FAILED, FinalStatus.DONE, ClosePlan(CloseStep.ATTEMPT_COMPLETION, FinalStatus.DONE)),
        (RunOutcome.STALLED, FinalStatus.DONE, ClosePlan(CloseStep.ATTEMPT_COMPLETION, FinalStatus.DONE)),
    ],
)
def test_close_plan(outcome, final_status, plan):
    assert close_plan(outcome, final_status) == plan


@pytest.mark.parametrize("outcome", list(RunOutcome))
@pytest.mark.parametrize("final_status", [None, *FinalStatus])
def test_done_is_never_set_directly(outcome, final_status):
    plan = close_plan(outcome, final_status)
    assert (plan.status is FinalStatus.DONE) == (plan.step is CloseStep.ATTEMPT_COMPLETION)
    assert not (plan.step is CloseStep.SET_STATUS and plan.status in (FinalStatus.DONE, FinalStatus.CANCELLED))
    if final_status is not None:
        assert plan.status is final_status


# --- claims and renewals -----------------------------------------------------------------------


def lease(run_id="run-1", epoch=4, expires_at=NOW + MINUTE) -> Lease:
    return Lease("task-1", run_id, epoch, expires_at)


def test_first_claim_gets_epoch_one():
    assert judge_claim(None, holder_open=False, now=NOW, ttl_micros=MINUTE) == LeaseGranted(1, NOW + MINUTE)


def test_a_live_lease_of_an_open_run_is_held():
    current = lease()
    assert judge_claim(current, holder_open=True, now=NOW, ttl_micros=MINUTE) == LeaseHeld(current)


@pytest.mark.parametrize(
    "current, holder_open",
    [
        (lease(expires_at=NOW), True),  # expired exactly now
        (lease(expires_at=NOW - MINUTE), True),
        (lease(), False),  # live, but its run is closed
    ],
    ids=["expired now", "expired", "holder closed"],
)
def test_a_claim_takes_a_dead_lease_with_the_next_epoch(current, holder_open):
    assert judge_claim(current, holder_open, NOW, 2 * MINUTE) == LeaseGranted(5, NOW + 2 * MINUTE)


def test_the_epoch_grows_on_every_claim():
    current, epochs = None, []
    for step in range(5):
        now = NOW + step * 2 * MINUTE  # each previous lease has expired by then
        granted = judge_claim(current, holder_open=True, now=now, ttl_micros=MINUTE)
        assert isinstance(granted, LeaseGranted)
        epochs.append(granted.epoch)
        current = Lease("task-1", f"run-{step}", granted.epoch, granted.expires_at)
    assert epochs == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "run_open, run_id, epoch, current, problem",
    [
        (True, "run-1", 4, lease(), None),
        (True, "run-1", 4, lease(expires_at=NOW + 1), None),
        (False, "run-1", 4, lease(), RenewalProblem.RUN_CLOSED),
        (False, "run-1", 4, None, RenewalProblem.RUN_CLOSED),
        (True, "run-1", 4, None, RenewalProblem.NOT_CURRENT),
        (True, "run-1", 4, lease(run_id="run-2", epoch=5), RenewalProblem.NOT_CURRENT),
        (True, "run-1", 3, lease(), RenewalProblem.NOT_CURRENT),
        (True, "run-1", 4, lease(expires_at=NOW), RenewalProblem.EXPIRED),
        (True, "run-1", 3, lease(expires_at=NOW - 1), RenewalProblem.NOT_CURRENT),
    ],
    ids=[
        "live",
        "live by 1us",
        "run closed",
        "closed, no lease",
        "no lease",
        "other run",
        "older epoch",
        "expired",
        "stale and expired",
    ],
)
def test_judge_renewal(run_open, run_id, epoch, current, problem):
    assert judge_renewal(run_open, run_id, epoch, current, NOW) is problem


@pytest.mark.parametrize(
    "run_open, expires_at, stalled",
    [
        (True, NOW - 10 * MINUTE, True),  # expired exactly stall_after ago
        (True, NOW - 11 * MINUTE, True),
        (True, NOW - 10 * MINUTE + 1, False),
        (True, NOW + MINUTE, False),
        (False, NOW - 60 * MINUTE, False),  # closed runs never stall
    ],
)
def test_is_stalled(run_open, expires_at, stalled):
    assert is_stalled(run_open, expires_at, NOW, stall_after_micros=10 * MINUTE) is stalled


# --- settlement answers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, domain, answer",
    [
        ("FAILED_PRECONDITION", LIFECYCLE_DOMAIN, SettleAnswer.REJECTED),
        ("NOT_FOUND", LIFECYCLE_DOMAIN, SettleAnswer.REJECTED),
        ("INVALID_ARGUMENT", LIFECYCLE_DOMAIN, SettleAnswer.REJECTED),
        ("UNAVAILABLE", LIFECYCLE_DOMAIN, SettleAnswer.RETRY),
        ("DEADLINE_EXCEEDED", LIFECYCLE_DOMAIN, SettleAnswer.RETRY),
        ("UNKNOWN", LIFECYCLE_DOMAIN, SettleAnswer.RETRY),
        ("INTERNAL", LIFECYCLE_DOMAIN, SettleAnswer.RETRY),
        ("RESOURCE_EXHAUSTED", LIFECYCLE_DOMAIN, SettleAnswer.RETRY),
        ("UNAVAILABLE", None, SettleAnswer.RETRY),
        ("DEADLINE_EXCEEDED", None, SettleAnswer.RETRY),
        # A rejection-looking code from someone else (a proxy, another service) may
        # not be the lifecycle's verdict: retry.
        ("FAILED_PRECONDITION", None, SettleAnswer.RETRY),
        ("FAILED_PRECONDITION", "funnel.completion.v1", SettleAnswer.RETRY),
        ("NOT_FOUND", "envoy", SettleAnswer.RETRY),
        ("INVALID_ARGUMENT", "", SettleAnswer.RETRY),
    ],
)
def test_classify_failure(code, domain, answer):
    assert classify_failure(code, domain) is answer


def test_retry_delay_starts_at_the_base_and_doubles():
    assert [retry_delay_seconds(n) for n in range(4)] == [0.2, 0.4, 0.8, 1.6]


def test_retry_delay_is_monotonic_and_capped():
    delays = [retry_delay_seconds(n) for n in range(200)]
    assert delays == sorted(delays)
    assert max(delays) == 10.0
    assert retry_delay_seconds(10**9) == 10.0  # no overflow for absurd attempt counts
    assert all(d > 0 for d in delays)


def test_retry_delay_honours_base_and_cap():
    assert retry_delay_seconds(0, base=1.0, cap=5.0) == 1.0
    assert retry_delay_seconds(2, base=1.0, cap=5.0) == 4.0
    assert retry_delay_seconds(3, base=1.0, cap=5.0) == 5.0


# --- the decision's JSON form (stored with blocked events and completions) -------------------

TRACES = st.builds(
    GateTrace,
    gate_id=st.text(min_size=1, max_size=20),
    version=st.integers(1, 2**31),
    status=st.sampled_from(GateStatus),
    reason=st.text(max_size=40),
    decisive=st.booleans(),
)
DECISIONS = st.builds(
    Decision,
    verdict=st.sampled_from(Verdict),
    next_action=st.sampled_from(AgentAction),
    forbidden_actions=st.lists(st.sampled_from(AgentAction), max_size=4).map(tuple),
    instruction=st.text(max_size=80),
    trace=st.lists(TRACES, max_size=12).map(tuple),
    decision_schema=st.text(max_size=30),
    state_version=st.integers(0, 2**63 - 1),
    checkpoint=st.text(max_size=20),
)


@settings(max_examples=300, deadline=None)
@given(DECISIONS)
def test_decision_json_round_trips(decision):
    text = decision_to_json(decision)
    assert decision_from_json(text) == decision
    assert decision_to_json(decision_from_json(text)) == text


def test_decision_json_uses_enum_names():
    decision = Decision(
        Verdict.SOFT_BLOCK,
        AgentAction.RECORD_EVIDENCE,
        (AgentAction.REPORT_COMPLETE,),
        "Not complete: record évidence",
        (GateTrace("evidence.required", 1, GateStatus.FAILED, "no tests evidence", True),),
        "funnel.completion.decision/v1",
        12,
        "cp-7",
    )
    text = decision_to_json(decision)
    assert '"verdict": "SOFT_BLOCK"' in text
    assert '"next_action": "RECORD_EVIDENCE"' in text
    assert '"status": "FAILED"' in text
    assert "évidence" in text
    assert decision_from_json(text) == decision


# -- the end of a cancellation fence (issue 21) --------------------------------------

PENDING, SETTLED, REJECTED = SettlementStatus.PENDING, SettlementStatus.SETTLED, SettlementStatus.REJECTED


@pytest.mark.parametrize(
    ("fenced", "completion", "other_holder", "end"),
    [
        # No fence on the run's (current, open) generation: the close does what its outcome asks.
        (False, None, False, FenceEnd.NONE),
        (False, PENDING, True, FenceEnd.NONE),
        (False, REJECTED, False, FenceEnd.NONE),
        # A pending completion may predate the fence: its settlement decides, whoever holds the task.
        (True, PENDING, False, FenceEnd.AWAIT_SETTLEMENT),
        (True, PENDING, True, FenceEnd.AWAIT_SETTLEMENT),
        # It did: the generation is COMPLETED.
        (True, SETTLED, False, FenceEnd.COMPLETED_FIRST),
        (True, SETTLED, True, FenceEnd.COMPLETED_FIRST),
        # Nothing can settle any more, another run still holds the task: its close ends the fence.
        (True, None, True, FenceEnd.AWAIT_HOLDER),
        (True, REJECTED, True, FenceEnd.AWAIT_HOLDER),
        # Nothing can settle and no run holds the task: only the cancellation can end it, now.
        (True, None, False, FenceEnd.SETTLE_CANCELLATION),
        (True, REJECTED, False, FenceEnd.SETTLE_CANCELLATION),
    ],
)
def test_the_end_of_a_cancellation_fence(fenced, completion, other_holder, end):
    assert fence_end(fenced, completion, other_holder) is end


def _completion(settlement: SettlementStatus, reason: str | None = None) -> CompletionRecord:
    decision = Decision(
        verdict=Verdict.ALLOW,
        next_action=AgentAction.REPORT_COMPLETE,
        forbidden_actions=(),
        instruction="done",
        trace=(),
        decision_schema="v1",
        state_version=1,
        checkpoint="",
    )
    return CompletionRecord(
        workspace_id="ws",
        task_id="t",
        generation=1,
        completion_id="cmp-1",
        identity="i",
        payload=b"p",
        outcome=RequestedOutcome.COMPLETED,
        result="done",
        run_id="run-1",
        state_version=1,
        checkpoint="",
        decision=decision,
        committed_at=NOW,
        settlement=settlement,
        error_reason=reason,
    )


@pytest.mark.parametrize(
    ("fence", "completion", "effect", "says"),
    [
        (FenceEnd.SETTLE_CANCELLATION, None, TaskEffect.CANCELLED, "settled the cancellation"),
        (
            FenceEnd.SETTLE_CANCELLATION,
            _completion(REJECTED, "CANCELLATION_FENCED"),
            TaskEffect.CANCELLED,
            "refused completion cmp-1",
        ),
        (FenceEnd.AWAIT_SETTLEMENT, _completion(PENDING), TaskEffect.SETTLING, "settles the cancellation"),
        (FenceEnd.COMPLETED_FIRST, _completion(SETTLED), TaskEffect.DONE, "before the task's cancellation request"),
        (FenceEnd.AWAIT_HOLDER, None, TaskEffect.UNCHANGED, "run run-9 still holds its lease"),
    ],
)
@pytest.mark.parametrize("outcome", [RunOutcome.FAILED, RunOutcome.STALLED])
def test_what_a_close_says_about_the_fence_it_met(fence, completion, effect, says, outcome):
    got, reason = close_effect(close_plan(outcome, None), None, completion, fence, "run-9")
    assert got is effect and says in reason


def test_a_successful_close_that_waits_for_another_holder_reports_the_block():
    plan = close_plan(RunOutcome.SUCCEEDED, None)
    assert close_effect(plan, None, None, FenceEnd.AWAIT_HOLDER, "run-9")[0] is TaskEffect.BLOCKED
