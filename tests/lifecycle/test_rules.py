"""Table-driven tests of the pure lifecycle core: `decide(intent, situation, policy)`
for every intent in every state, fenced or not, with and without parent and children."""

from __future__ import annotations

import dataclasses

import pytest

from funnel.runtime.errors import Rejection, instant
from lifecycle_service.core import intents as i
from lifecycle_service.core.model import (
    Cause,
    ChildRef,
    GenerationState,
    IntentKind,
    LinkMode,
    Outcome,
    ParentLink,
    Policy,
    Propagation,
    Situation,
    WorkStatus,
)
from lifecycle_service.core.rules import AlreadySettled, Transition, decide
from lifecycle_service.errors import Reason
from tests.lifecycle.core_builders import (
    CREATED,
    NOW,
    OFFSET,
    POLICY,
    WORKSPACE,
    make_intent,
    record,
)

REGISTERED, ACTIVE, SUSPENDED, TERMINAL = (
    GenerationState.REGISTERED,
    GenerationState.ACTIVE,
    GenerationState.SUSPENDED,
    GenerationState.TERMINAL,
)
K = IntentKind
R = Reason
FENCE_AT = NOW - 60_000_000  # the fence was committed a minute before "now"
NON_TERMINAL = (REGISTERED, ACTIVE, SUSPENDED)
ALL_BUT_REGISTER = [kind for kind in IntentKind if kind is not K.REGISTER_TASK]


def situation(task, *, parent=None, children=()) -> Situation:
    return Situation(now=NOW, task=task, parent=parent, open_attached_children=tuple(children))


def expect_rejection(decision, reason: Reason, **metadata: str) -> Rejection:
    assert isinstance(decision, Rejection), decision
    assert decision.reason is reason, (decision.reason, decision.message)
    for key, value in metadata.items():
        assert decision.metadata.get(key) == value, (key, decision.metadata)
    return decision


def expect_transition(decision, old, intent, propagations=(), **changes) -> Transition:
    """The decision is exactly `old` with `changes`, revision + 1, updated now; its one
    event describes that record; and it owes exactly `propagations`."""
    assert isinstance(decision, Transition), decision
    expected = dataclasses.replace(old, revision=old.revision + 1, updated_at=NOW, **changes)
    assert decision.task == expected
    assert_event_describes(decision, intent, from_state=old.state)
    assert decision.propagations == tuple(propagations)
    return decision


def assert_event_describes(decision: Transition, intent, from_state) -> None:
    task, event = decision.task, decision.event
    assert event.workspace_id == task.workspace_id == intent.workspace_id
    assert event.task_id == task.task_id == intent.task_id
    assert (event.generation, event.revision) == (task.generation, task.revision)
    assert event.intent is intent.kind
    assert event.from_state is from_state
    assert event.to_state is task.state
    assert event.outcome is task.outcome
    assert event.cancellation_requested_at == task.cancellation_requested_at
    assert event.work_status is task.work_status
    assert event.completion_id == task.completion_id
    assert event.cause == intent.cause
    assert event.request_id == intent.request_id
    assert event.committed_at == NOW
    assert event.sequence == 0  # assigned by the store
    expected_at = intent.authoritative_at if isinstance(intent, i.SettleCompletion) else None
    assert event.authoritative_at == expected_at


# ---------------------------------------------------------------------------
# Every intent x every non-terminal state x fenced or not (no parent, no children).
# A value is either the Reason of the rejection or the changes the transition makes.

CANCELLED_RESULT = {"state": TERMINAL, "outcome": Outcome.CANCELLED, "work_status": WorkStatus.CANCELLED}
COMPLETED_RESULT = {
    "state": TERMINAL,
    "outcome": Outcome.COMPLETED,
    "work_status": WorkStatus.DONE,
    "completion_id": "cmp-1",
}
FAILED_RESULT = {"state": TERMINAL, "outcome": Outcome.FAILED, "work_status": WorkStatus.BLOCKED}
TIMED_OUT_RESULT = {"state": TERMINAL, "outcome": Outcome.TIMED_OUT, "work_status": WorkStatus.BLOCKED}


def _per_state(registered, active, suspended):
    return {REGISTERED: registered, ACTIVE: active, SUSPENDED: suspended}


def _all_states(value):
    return _per_state(value, value, value)


UNFENCED = {
    K.ACTIVATE_GENERATION: _per_state({"state": ACTIVE}, R.INVALID_TRANSITION, R.INVALID_TRANSITION),
    K.SUSPEND_GENERATION: _per_state(R.INVALID_TRANSITION, {"state": SUSPENDED}, R.INVALID_TRANSITION),
    K.RESUME_WITH_GENERATION: _per_state(R.INVALID_TRANSITION, R.INVALID_TRANSITION, {"state": ACTIVE}),
    K.REQUEST_CANCELLATION: _all_states({"cancellation_requested_at": NOW}),
    K.SETTLE_CANCELLATION: _all_states(R.CANCELLATION_NOT_REQUESTED),
    K.SETTLE_COMPLETION: _all_states(COMPLETED_RESULT),
    K.SETTLE_FAILURE: _all_states(FAILED_RESULT),
    K.SETTLE_TIMEOUT: _all_states(TIMED_OUT_RESULT),
    K.PROPAGATE_PARENT_TERMINATION: _all_states(R.NOT_ATTACHED_CHILD),
    K.SET_WORK_STATUS: _all_states({"work_status": WorkStatus.BLOCKED}),
    K.REGISTER_TASK: _all_states(R.TASK_ALREADY_EXISTS),
}

FENCED = {
    K.ACTIVATE_GENERATION: _all_states(R.CANCELLATION_FENCED),
    K.SUSPEND_GENERATION: _all_states(R.CANCELLATION_FENCED),
    K.RESUME_WITH_GENERATION: _all_states(R.CANCELLATION_FENCED),
    K.REQUEST_CANCELLATION: _all_states(R.CANCELLATION_ALREADY_REQUESTED),
    K.SETTLE_CANCELLATION: _all_states(CANCELLED_RESULT),
    # The default completion's authoritative_at is "now": it cannot predate the fence.
    K.SETTLE_COMPLETION: _all_states(R.CANCELLATION_FENCED),
    K.SETTLE_FAILURE: _all_states(R.CANCELLATION_FENCED),
    K.SETTLE_TIMEOUT: _all_states(R.CANCELLATION_FENCED),
    K.PROPAGATE_PARENT_TERMINATION: _all_states(R.NOT_ATTACHED_CHILD),
    K.SET_WORK_STATUS: _all_states(R.CANCELLATION_FENCED),
    K.REGISTER_TASK: _all_states(R.TASK_ALREADY_EXISTS),
}

NON_TERMINAL_CASES = [
    pytest.param(
        kind, state, fenced, table[kind][state], id=f"{kind.name}-{state.name}-{'fenced' if fenced else 'open'}"
    )
    for fenced, table in ((False, UNFENCED), (True, FENCED))
    for kind in IntentKind
    for state in NON_TERMINAL
]


@pytest.mark.parametrize("kind, state, fenced, expected", NON_TERMINAL_CASES)
def test_every_intent_in_every_non_terminal_state(kind, state, fenced, expected):
    task = record(state, fenced_at=FENCE_AT if fenced else None)
    intent = make_intent(kind, request_id="req-1", cause=Cause("operator:alice", "because", (("run_id", "r1"),)))
    decision = decide(intent, situation(task), POLICY)
    if isinstance(expected, Reason):
        expect_rejection(decision, expected)
    else:
        expect_transition(decision, task, intent, **expected)


def test_fenced_rejection_names_the_fence():
    task = record(ACTIVE, fenced_at=FENCE_AT)
    decision = decide(make_intent(K.SET_WORK_STATUS), situation(task), POLICY)
    expect_rejection(
        decision, R.CANCELLATION_FENCED, cancellation_request_time=instant(FENCE_AT), fenced_task_id="task"
    )


def test_request_cancellation_keeps_state_and_work_status():
    task = record(SUSPENDED, work_status=WorkStatus.BLOCKED)
    decision = decide(make_intent(K.REQUEST_CANCELLATION), situation(task), POLICY)
    assert decision.task.state is SUSPENDED
    assert decision.task.work_status is WorkStatus.BLOCKED
    assert decision.task.fenced and decision.event.cancellation_requested_at == NOW


@pytest.mark.parametrize("status", [WorkStatus.DONE, WorkStatus.CANCELLED])
@pytest.mark.parametrize("state", NON_TERMINAL)
def test_set_work_status_refuses_the_settlement_statuses(state, status):
    decision = decide(make_intent(K.SET_WORK_STATUS, work_status=status), situation(record(state)), POLICY)
    expect_rejection(decision, R.WORK_STATUS_RESERVED, field="work_status")


@pytest.mark.parametrize("status", [WorkStatus.READY, WorkStatus.IN_PROGRESS, WorkStatus.BLOCKED])
def test_activation_may_set_a_work_status_in_the_same_transition(status):
    task = record(REGISTERED, work_status=WorkStatus.READY)
    intent = make_intent(K.ACTIVATE_GENERATION, work_status=status)
    expect_transition(decide(intent, situation(task), POLICY), task, intent, state=ACTIVE, work_status=status)


def test_activation_without_a_work_status_keeps_the_current_one():
    task = record(REGISTERED, work_status=WorkStatus.BLOCKED)
    intent = make_intent(K.ACTIVATE_GENERATION, work_status=None)
    expect_transition(decide(intent, situation(task), POLICY), task, intent, state=ACTIVE)


@pytest.mark.parametrize("status", [WorkStatus.DONE, WorkStatus.CANCELLED])
def test_activation_refuses_a_settlement_status(status):
    decision = decide(make_intent(K.ACTIVATE_GENERATION, work_status=status), situation(record(REGISTERED)), POLICY)
    expect_rejection(decision, R.WORK_STATUS_RESERVED)


# ---------------------------------------------------------------------------
# Terminal generations: immutable; only the same settlement repeated is answered.

TERMINAL_RECORDS = {
    "COMPLETED": dict(outcome=Outcome.COMPLETED, completion_id="cmp-1"),
    "COMPLETED-after-proven-fence": dict(outcome=Outcome.COMPLETED, completion_id="cmp-1", fenced_at=FENCE_AT),
    "CANCELLED": dict(outcome=Outcome.CANCELLED, fenced_at=FENCE_AT),
    "FAILED": dict(outcome=Outcome.FAILED),
    "TIMED_OUT": dict(outcome=Outcome.TIMED_OUT),
}

# Which intent repeats which outcome's settlement.
REPEATS = {
    K.SETTLE_CANCELLATION: Outcome.CANCELLED,
    K.PROPAGATE_PARENT_TERMINATION: Outcome.CANCELLED,
    K.SETTLE_COMPLETION: Outcome.COMPLETED,  # with the same completion id
    K.SETTLE_FAILURE: Outcome.FAILED,
    K.SETTLE_TIMEOUT: Outcome.TIMED_OUT,
}


@pytest.mark.parametrize("kind", list(IntentKind))
@pytest.mark.parametrize("name", list(TERMINAL_RECORDS))
def test_every_intent_on_a_terminal_generation(name, kind):
    task = record(TERMINAL, **TERMINAL_RECORDS[name])
    intent = make_intent(kind)
    decision = decide(intent, situation(task), POLICY)
    if kind is K.REGISTER_TASK:
        expect_rejection(decision, R.TASK_ALREADY_EXISTS, task_id="task")
    elif REPEATS.get(kind) is task.outcome:
        assert decision == AlreadySettled(task)
    else:
        expect_rejection(decision, R.GENERATION_TERMINAL, generation="1", outcome=task.outcome.name)


def test_a_different_completion_id_for_a_completed_generation_fails_closed():
    task = record(TERMINAL, outcome=Outcome.COMPLETED, completion_id="cmp-1")
    decision = decide(make_intent(K.SETTLE_COMPLETION, completion_id="cmp-2"), situation(task), POLICY)
    expect_rejection(decision, R.GENERATION_TERMINAL, outcome="COMPLETED")


def test_a_repeated_settlement_is_answered_even_with_an_outdated_expected_revision():
    task = record(TERMINAL, outcome=Outcome.FAILED, revision=9)
    assert decide(make_intent(K.SETTLE_FAILURE, expected_revision=3), situation(task), POLICY) == AlreadySettled(task)


def test_a_conflicting_intent_on_a_terminal_generation_is_terminal_not_a_revision_conflict():
    task = record(TERMINAL, outcome=Outcome.FAILED, revision=9)
    decision = decide(make_intent(K.SET_WORK_STATUS, expected_revision=3), situation(task), POLICY)
    expect_rejection(decision, R.GENERATION_TERMINAL)


@pytest.mark.parametrize("name", list(TERMINAL_RECORDS))
def test_resume_into_the_next_generation_clears_terminal_and_cancellation_state(name):
    task = record(TERMINAL, generation=2, revision=7, **TERMINAL_RECORDS[name])
    intent = make_intent(K.RESUME_WITH_GENERATION, generation=3)
    decision = decide(intent, situation(task), POLICY)
    assert isinstance(decision, Transition)
    assert decision.task == dataclasses.replace(
        task,
        generation=3,
        revision=8,
        state=ACTIVE,
        outcome=None,
        cancellation_requested_at=None,
        work_status=WorkStatus.READY,
        completion_id=None,
        updated_at=NOW,
    )
    assert_event_describes(decision, intent, from_state=TERMINAL)
    assert decision.event.generation == 3
    assert decision.propagations == ()


def test_resume_into_the_next_generation_checks_the_expected_revision():
    task = record(TERMINAL, outcome=Outcome.FAILED, revision=7)
    decision = decide(make_intent(K.RESUME_WITH_GENERATION, generation=2, expected_revision=6), situation(task), POLICY)
    expect_rejection(decision, R.REVISION_MISMATCH, expected_revision="6", actual_revision="7")
    decision = decide(make_intent(K.RESUME_WITH_GENERATION, generation=2, expected_revision=7), situation(task), POLICY)
    assert isinstance(decision, Transition)


@pytest.mark.parametrize("state", NON_TERMINAL)
def test_the_next_generation_does_not_exist_while_the_current_one_is_open(state):
    decision = decide(make_intent(K.RESUME_WITH_GENERATION, generation=2), situation(record(state)), POLICY)
    expect_rejection(decision, R.FUTURE_GENERATION, generation="2", current_generation="1")


# ---------------------------------------------------------------------------
# Generations, unknown tasks and expected revisions.


@pytest.mark.parametrize("kind", ALL_BUT_REGISTER)
@pytest.mark.parametrize("state", [*NON_TERMINAL, TERMINAL])
def test_an_intent_for_an_older_generation_is_stale(kind, state):
    outcome = Outcome.FAILED if state is TERMINAL else None
    task = record(state, generation=3, outcome=outcome)
    decision = decide(make_intent(kind, generation=2), situation(task), POLICY)
    expect_rejection(decision, R.STALE_GENERATION, generation="2", current_generation="3")


@pytest.mark.parametrize("kind", ALL_BUT_REGISTER)
def test_an_intent_for_a_later_generation_does_not_exist_yet(kind):
    task = record(ACTIVE, generation=3)
    decision = decide(make_intent(kind, generation=5), situation(task), POLICY)
    expect_rejection(decision, R.FUTURE_GENERATION, generation="5", current_generation="3")


@pytest.mark.parametrize("kind", ALL_BUT_REGISTER)
def test_an_intent_for_an_unknown_task_is_not_found(kind):
    decision = decide(make_intent(kind, task_id="ghost"), situation(None), POLICY)
    expect_rejection(decision, R.TASK_NOT_FOUND, task_id="ghost")


@pytest.mark.parametrize("kind", ALL_BUT_REGISTER)
def test_a_wrong_expected_revision_is_a_conflict(kind):
    # ACTIVE and fenced: a state in which some intents would pass and others be refused;
    # the revision conflict is reported first either way.
    task = record(ACTIVE, revision=5, fenced_at=FENCE_AT)
    decision = decide(make_intent(kind, expected_revision=4), situation(task), POLICY)
    expect_rejection(decision, R.REVISION_MISMATCH, expected_revision="4", actual_revision="5")


def test_a_matching_expected_revision_passes():
    task = record(ACTIVE, revision=5)
    intent = make_intent(K.SET_WORK_STATUS, expected_revision=5)
    expect_transition(decide(intent, situation(task), POLICY), task, intent, work_status=WorkStatus.BLOCKED)


# ---------------------------------------------------------------------------
# Registration.


def test_registration_creates_generation_one_at_revision_one():
    intent = make_intent(K.REGISTER_TASK, request_id="r-1", cause=Cause("host", "new task"))
    decision = decide(intent, situation(None), POLICY)
    assert isinstance(decision, Transition)
    assert decision.task == record(
        REGISTERED,
        generation=1,
        revision=1,
        work_status=WorkStatus.READY,
        created_at=NOW,
        updated_at=NOW,
    )
    assert_event_describes(decision, intent, from_state=None)
    assert decision.propagations == ()


@pytest.mark.parametrize("expected_revision", [None, 0])
def test_registration_with_no_or_zero_expected_revision(expected_revision):
    decision = decide(make_intent(K.REGISTER_TASK, expected_revision=expected_revision), situation(None), POLICY)
    assert isinstance(decision, Transition)


def test_registration_expecting_an_existing_revision_of_a_missing_task_conflicts():
    decision = decide(make_intent(K.REGISTER_TASK, expected_revision=3), situation(None), POLICY)
    expect_rejection(decision, R.REVISION_MISMATCH, expected_revision="3", actual_revision="0")


@pytest.mark.parametrize(
    "expected_revision, reason", [(None, R.TASK_ALREADY_EXISTS), (0, R.TASK_ALREADY_EXISTS), (7, R.REVISION_MISMATCH)]
)
def test_registration_of_an_existing_task(expected_revision, reason):
    task = record(ACTIVE, revision=5)
    decision = decide(make_intent(K.REGISTER_TASK, expected_revision=expected_revision), situation(task), POLICY)
    expect_rejection(decision, reason)


# ---------------------------------------------------------------------------
# Parents: registration, activation and resumption of attached and detached children.

PARENT_GENERATION = 2


def parent_record(state=ACTIVE, **kw):
    kw.setdefault("generation", PARENT_GENERATION)
    return record(state, task_id="parent", **kw)


PARENTS = {
    "active": (parent_record(ACTIVE), None),
    "registered": (parent_record(REGISTERED), R.PARENT_NOT_ACTIVE),
    "suspended": (parent_record(SUSPENDED), R.PARENT_NOT_ACTIVE),
    "active-fenced": (parent_record(ACTIVE, fenced_at=FENCE_AT), R.PARENT_CANCELLATION_FENCED),
    "registered-fenced": (parent_record(REGISTERED, fenced_at=FENCE_AT), R.PARENT_CANCELLATION_FENCED),
    "terminal": (parent_record(TERMINAL, outcome=Outcome.FAILED), R.PARENT_TERMINAL),
    "terminal-cancelled": (parent_record(TERMINAL, outcome=Outcome.CANCELLED, fenced_at=FENCE_AT), R.PARENT_TERMINAL),
    "later-generation": (parent_record(ACTIVE, generation=PARENT_GENERATION + 1), R.PARENT_GENERATION_MISMATCH),
    "missing": (None, R.PARENT_NOT_FOUND),
}


def attached(generation=PARENT_GENERATION):
    return ParentLink("parent", generation, LinkMode.ATTACHED)


def detached(generation=PARENT_GENERATION):
    return ParentLink("parent", generation, LinkMode.DETACHED)


@pytest.mark.parametrize("name", list(PARENTS))
def test_attached_child_registers_only_under_the_exact_active_unfenced_parent_generation(name):
    parent, reason = PARENTS[name]
    intent = make_intent(K.REGISTER_TASK, task_id="child", parent=attached())
    decision = decide(intent, situation(None, parent=parent), POLICY)
    if reason is None:
        assert isinstance(decision, Transition)
        assert decision.task.parent == attached()
        assert decision.task.state is REGISTERED
    else:
        expect_rejection(decision, reason)


def test_parent_rejections_carry_their_metadata():
    def register(parent, link=None):
        link = attached() if link is None else link
        return decide(
            make_intent(K.REGISTER_TASK, task_id="child", parent=link), situation(None, parent=parent), POLICY
        )

    expect_rejection(register(None), R.PARENT_NOT_FOUND, parent_task_id="parent")
    expect_rejection(
        register(parent_record(ACTIVE), attached(1)),
        R.PARENT_GENERATION_MISMATCH,
        parent_task_id="parent",
        parent_generation="1",
        current_parent_generation="2",
    )
    expect_rejection(
        register(parent_record(SUSPENDED)), R.PARENT_NOT_ACTIVE, parent_task_id="parent", parent_state="SUSPENDED"
    )
    expect_rejection(
        register(parent_record(ACTIVE, fenced_at=FENCE_AT)), R.PARENT_CANCELLATION_FENCED, parent_task_id="parent"
    )
    expect_rejection(
        register(parent_record(TERMINAL, outcome=Outcome.TIMED_OUT)),
        R.PARENT_TERMINAL,
        parent_task_id="parent",
        parent_outcome="TIMED_OUT",
    )


@pytest.mark.parametrize("link_generation", [1, PARENT_GENERATION + 1])
def test_attached_child_names_exactly_the_current_parent_generation(link_generation):
    decision = decide(
        make_intent(K.REGISTER_TASK, task_id="child", parent=attached(link_generation)),
        situation(None, parent=parent_record(ACTIVE)),
        POLICY,
    )
    expect_rejection(decision, R.PARENT_GENERATION_MISMATCH)


@pytest.mark.parametrize(
    "parent, reason",
    [
        (parent_record(ACTIVE), None),
        (parent_record(REGISTERED), None),
        (parent_record(ACTIVE, fenced_at=FENCE_AT), None),
        (parent_record(TERMINAL, outcome=Outcome.FAILED), None),
        (parent_record(ACTIVE, generation=PARENT_GENERATION + 1), None),  # an older parent generation
        (parent_record(ACTIVE, generation=PARENT_GENERATION - 1), R.PARENT_GENERATION_MISMATCH),  # a future one
        (None, R.PARENT_NOT_FOUND),
    ],
)
def test_detached_child_registration_needs_only_an_existing_parent_generation(parent, reason):
    decision = decide(
        make_intent(K.REGISTER_TASK, task_id="child", parent=detached()), situation(None, parent=parent), POLICY
    )
    if reason is None:
        assert isinstance(decision, Transition)
        assert decision.task.parent == detached()
    else:
        expect_rejection(decision, reason)


def child_record(state=REGISTERED, link=None, **kw):
    return record(state, task_id="child", parent=link or attached(), **kw)


@pytest.mark.parametrize("name", list(PARENTS))
def test_attached_child_activates_only_under_an_active_unfenced_parent(name):
    parent, reason = PARENTS[name]
    task = child_record(REGISTERED)
    intent = make_intent(K.ACTIVATE_GENERATION, task_id="child")
    decision = decide(intent, situation(task, parent=parent), POLICY)
    if reason is None:
        expect_transition(decision, task, intent, state=ACTIVE)
    else:
        expect_rejection(decision, reason)


@pytest.mark.parametrize(
    "status, parent_fenced, reason",
    [
        (WorkStatus.IN_PROGRESS, True, Reason.PARENT_CANCELLATION_FENCED),
        (WorkStatus.READY, True, Reason.PARENT_CANCELLATION_FENCED),
        # Marking the child blocked is not new work: the parent's fence allows it.
        (WorkStatus.BLOCKED, True, None),
        (WorkStatus.IN_PROGRESS, False, None),
    ],
)
def test_an_attached_child_starts_no_new_work_under_its_parents_fence_before_it_propagates(
    status, parent_fenced, reason
):
    parent = parent_record(ACTIVE, fenced_at=FENCE_AT if parent_fenced else None)
    task = child_record(ACTIVE, work_status=WorkStatus.READY)
    intent = make_intent(K.SET_WORK_STATUS, task_id="child", work_status=status)
    decision = decide(intent, situation(task, parent=parent), POLICY)
    if reason is None:
        expect_transition(decision, task, intent, work_status=status)
    else:
        expect_rejection(decision, reason, parent_task_id="parent")


@pytest.mark.parametrize("name", list(PARENTS))
def test_attached_child_resumes_only_under_an_active_unfenced_parent(name):
    parent, reason = PARENTS[name]
    task = child_record(SUSPENDED)
    intent = make_intent(K.RESUME_WITH_GENERATION, task_id="child")
    decision = decide(intent, situation(task, parent=parent), POLICY)
    if reason is None:
        expect_transition(decision, task, intent, state=ACTIVE)
    else:
        expect_rejection(decision, reason)


@pytest.mark.parametrize("link", [attached(), detached()])
def test_the_events_that_open_a_child_and_only_those_name_its_parent(link):
    parent = parent_record()
    registered = decide(
        make_intent(K.REGISTER_TASK, task_id="child", parent=link), situation(None, parent=parent), POLICY
    )
    resumed = decide(
        make_intent(K.RESUME_WITH_GENERATION, task_id="child", generation=2),
        situation(child_record(TERMINAL, link=link, outcome=Outcome.FAILED), parent=parent),
        POLICY,
    )
    same_generation = decide(
        make_intent(K.RESUME_WITH_GENERATION, task_id="child"),
        situation(child_record(SUSPENDED, link=link), parent=parent),
        POLICY,
    )
    activated = decide(
        make_intent(K.ACTIVATE_GENERATION, task_id="child"), situation(child_record(link=link), parent=parent), POLICY
    )
    decisions = (registered, resumed, same_generation, activated)
    assert all(isinstance(d, Transition) for d in decisions)
    assert [d.event.parent for d in decisions] == [link, link, None, None]


@pytest.mark.parametrize("name", list(PARENTS))
def test_attached_child_starts_a_new_generation_only_under_an_active_unfenced_parent(name):
    parent, reason = PARENTS[name]
    task = child_record(TERMINAL, outcome=Outcome.FAILED)
    decision = decide(
        make_intent(K.RESUME_WITH_GENERATION, task_id="child", generation=2), situation(task, parent=parent), POLICY
    )
    if reason is None:
        assert isinstance(decision, Transition) and decision.task.generation == 2
    else:
        expect_rejection(decision, reason)


@pytest.mark.parametrize("kind", [K.ACTIVATE_GENERATION, K.RESUME_WITH_GENERATION])
@pytest.mark.parametrize("name", [name for name in PARENTS if name != "missing"])
def test_detached_child_governs_itself(name, kind):
    parent, _ = PARENTS[name]
    task = child_record(REGISTERED if kind is K.ACTIVATE_GENERATION else SUSPENDED, link=detached())
    intent = make_intent(kind, task_id="child")
    expect_transition(decide(intent, situation(task, parent=parent), POLICY), task, intent, state=ACTIVE)


# Settlements of an attached child under each parent condition.
CHILD_SETTLEMENTS = {
    # parent: (completion, failure/timeout)
    "active": (None, None),
    "suspended": (None, None),
    "active-fenced": (R.CANCELLATION_FENCED, R.CANCELLATION_FENCED),
    "terminal": (R.PARENT_TERMINAL, R.PARENT_TERMINAL),
    "terminal-cancelled": (R.PARENT_TERMINAL, R.CANCELLATION_FENCED),
    "later-generation": (R.PARENT_GENERATION_MISMATCH, None),
    "missing": (R.PARENT_NOT_FOUND, None),
}


@pytest.mark.parametrize("name", list(CHILD_SETTLEMENTS))
def test_attached_child_completion_under_each_parent_condition(name):
    parent = PARENTS[name][0] if name != "suspended" else parent_record(SUSPENDED)
    expected = CHILD_SETTLEMENTS[name][0]
    task = child_record(ACTIVE)
    intent = make_intent(K.SETTLE_COMPLETION, task_id="child")
    decision = decide(intent, situation(task, parent=parent), POLICY)
    if expected is None:
        expect_transition(decision, task, intent, **COMPLETED_RESULT)
    else:
        expect_rejection(decision, expected)


@pytest.mark.parametrize("kind, result", [(K.SETTLE_FAILURE, FAILED_RESULT), (K.SETTLE_TIMEOUT, TIMED_OUT_RESULT)])
@pytest.mark.parametrize("name", list(CHILD_SETTLEMENTS))
def test_attached_child_failure_under_each_parent_condition(name, kind, result):
    parent = PARENTS[name][0] if name != "suspended" else parent_record(SUSPENDED)
    expected = CHILD_SETTLEMENTS[name][1]
    task = child_record(ACTIVE)
    intent = make_intent(kind, task_id="child")
    decision = decide(intent, situation(task, parent=parent), POLICY)
    if expected is None:
        expect_transition(decision, task, intent, **result)
    elif expected is R.CANCELLATION_FENCED:
        expect_rejection(decision, expected, fenced_task_id="parent")
    else:
        expect_rejection(decision, expected, parent_task_id="parent")


@pytest.mark.parametrize("kind", [K.SETTLE_COMPLETION, K.SETTLE_FAILURE, K.SETTLE_TIMEOUT])
def test_detached_child_settles_despite_its_parents_fence(kind):
    task = child_record(ACTIVE, link=detached())
    decision = decide(
        make_intent(kind, task_id="child"), situation(task, parent=parent_record(ACTIVE, fenced_at=FENCE_AT)), POLICY
    )
    assert isinstance(decision, Transition) and decision.task.state is TERMINAL


# ---------------------------------------------------------------------------
# PropagateParentTermination.


@pytest.mark.parametrize(
    "parent, reason",
    [
        (parent_record(ACTIVE), R.PARENT_NOT_TERMINAL),
        (parent_record(ACTIVE, fenced_at=FENCE_AT), R.PARENT_NOT_TERMINAL),
        (parent_record(SUSPENDED), R.PARENT_NOT_TERMINAL),
        (parent_record(TERMINAL, outcome=Outcome.FAILED), None),
        (parent_record(TERMINAL, outcome=Outcome.TIMED_OUT), None),
        (parent_record(TERMINAL, outcome=Outcome.CANCELLED, fenced_at=FENCE_AT), None),
        (parent_record(ACTIVE, generation=PARENT_GENERATION + 1), None),  # the linked generation ended
        (None, R.PARENT_NOT_FOUND),
    ],
)
@pytest.mark.parametrize("child_state", [REGISTERED, ACTIVE, SUSPENDED])
@pytest.mark.parametrize("child_fenced", [False, True])
def test_parent_termination_cancels_an_attached_child_once_the_parent_generation_ended(
    parent, reason, child_state, child_fenced
):
    task = child_record(child_state, fenced_at=FENCE_AT if child_fenced else None)
    intent = make_intent(K.PROPAGATE_PARENT_TERMINATION, task_id="child")
    decision = decide(intent, situation(task, parent=parent), POLICY)
    if reason is None:
        expect_transition(decision, task, intent, **CANCELLED_RESULT)
    else:
        expect_rejection(decision, reason, parent_task_id="parent")


def test_parent_termination_does_not_apply_to_a_detached_child():
    task = child_record(ACTIVE, link=detached())
    decision = decide(
        make_intent(K.PROPAGATE_PARENT_TERMINATION, task_id="child"),
        situation(task, parent=parent_record(TERMINAL, outcome=Outcome.FAILED)),
        POLICY,
    )
    expect_rejection(decision, R.NOT_ATTACHED_CHILD)


# ---------------------------------------------------------------------------
# Children: what a parent's transition owes them, and what they block.

CHILDREN = (ChildRef("c-2", 1), ChildRef("c-1", 3))


def owed(kind):
    return tuple(Propagation(child, kind) for child in CHILDREN)


@pytest.mark.parametrize(
    "kind, fenced, expected_changes, propagated",
    [
        (K.REQUEST_CANCELLATION, False, {"cancellation_requested_at": NOW}, K.REQUEST_CANCELLATION),
        (K.SETTLE_CANCELLATION, True, CANCELLED_RESULT, K.SETTLE_CANCELLATION),
        (K.SETTLE_FAILURE, False, FAILED_RESULT, K.PROPAGATE_PARENT_TERMINATION),
        (K.SETTLE_TIMEOUT, False, TIMED_OUT_RESULT, K.PROPAGATE_PARENT_TERMINATION),
    ],
)
def test_parent_transitions_owe_their_open_attached_children(kind, fenced, expected_changes, propagated):
    task = record(ACTIVE, fenced_at=FENCE_AT if fenced else None)
    intent = make_intent(kind)
    decision = decide(intent, situation(task, children=CHILDREN), POLICY)
    expect_transition(decision, task, intent, propagations=owed(propagated), **expected_changes)


def test_parent_termination_propagates_further_down():
    task = child_record(ACTIVE)
    intent = make_intent(K.PROPAGATE_PARENT_TERMINATION, task_id="child")
    parent = parent_record(TERMINAL, outcome=Outcome.FAILED)
    decision = decide(intent, situation(task, parent=parent, children=CHILDREN), POLICY)
    expect_transition(decision, task, intent, propagations=owed(K.PROPAGATE_PARENT_TERMINATION), **CANCELLED_RESULT)


@pytest.mark.parametrize(
    "kind, state, changes",
    [
        (K.ACTIVATE_GENERATION, REGISTERED, {"state": ACTIVE}),
        (K.SUSPEND_GENERATION, ACTIVE, {"state": SUSPENDED}),
        (K.RESUME_WITH_GENERATION, SUSPENDED, {"state": ACTIVE}),
        (K.SET_WORK_STATUS, ACTIVE, {"work_status": WorkStatus.BLOCKED}),
    ],
)
def test_other_transitions_owe_children_nothing(kind, state, changes):
    task = record(state)
    intent = make_intent(kind)
    expect_transition(
        decide(intent, situation(task, children=CHILDREN), POLICY), task, intent, propagations=(), **changes
    )


def test_no_children_no_propagations():
    task = record(ACTIVE)
    decision = decide(make_intent(K.SETTLE_FAILURE), situation(task), POLICY)
    assert decision.propagations == ()


def test_parent_completion_is_blocked_by_an_open_attached_child():
    decision = decide(make_intent(K.SETTLE_COMPLETION), situation(record(ACTIVE), children=CHILDREN), POLICY)
    expect_rejection(decision, R.ACTIVE_ATTACHED_CHILD, child_task_ids="c-1,c-2")


def test_active_attached_child_names_at_most_ten_children_sorted():
    children = tuple(ChildRef(f"c-{n:02d}", 1) for n in range(12, 0, -1))
    decision = decide(make_intent(K.SETTLE_COMPLETION), situation(record(ACTIVE), children=children), POLICY)
    expect_rejection(decision, R.ACTIVE_ATTACHED_CHILD, child_task_ids=",".join(f"c-{n:02d}" for n in range(1, 11)))


def test_parent_generation_replacement_is_blocked_by_an_open_attached_child():
    task = record(TERMINAL, outcome=Outcome.FAILED)
    decision = decide(make_intent(K.RESUME_WITH_GENERATION, generation=2), situation(task, children=CHILDREN), POLICY)
    expect_rejection(decision, R.ACTIVE_ATTACHED_CHILD, child_task_ids="c-1,c-2")


# ---------------------------------------------------------------------------
# The cancellation proof (rule 4): authoritative_at + max_clock_offset < cancellation_requested_at.

PROOF_CASES = [
    pytest.param(FENCE_AT - OFFSET - 1, True, id="one-microsecond-inside-the-proof"),
    pytest.param(FENCE_AT - OFFSET - 3_600_000_000, True, id="an-hour-before"),
    pytest.param(FENCE_AT - OFFSET, False, id="exactly-the-offset-is-not-proof"),
    pytest.param(FENCE_AT - OFFSET + 1, False, id="within-the-offset"),
    pytest.param(FENCE_AT, False, id="at-the-fence"),
    pytest.param(FENCE_AT + 1_000_000, False, id="after-the-fence"),
    pytest.param(None, False, id="missing-proof"),
]


@pytest.mark.parametrize("authoritative_at, passes", PROOF_CASES)
@pytest.mark.parametrize("state", NON_TERMINAL)
def test_completion_after_the_tasks_own_fence_needs_proof(state, authoritative_at, passes):
    task = record(state, fenced_at=FENCE_AT)
    intent = make_intent(K.SETTLE_COMPLETION, authoritative_at=authoritative_at)
    decision = decide(intent, situation(task), POLICY)
    if passes:
        # The completion wins; the fence stays on record for the history.
        expect_transition(decision, task, intent, **COMPLETED_RESULT)
        assert decision.event.authoritative_at == authoritative_at
    else:
        expect_rejection(
            decision,
            R.CANCELLATION_FENCED,
            cancellation_request_time=instant(FENCE_AT),
            fenced_task_id="task",
            max_clock_offset_ms=str(OFFSET // 1000),
        )


@pytest.mark.parametrize("authoritative_at, passes", PROOF_CASES)
def test_completion_after_the_attached_parents_fence_needs_proof(authoritative_at, passes):
    task = child_record(ACTIVE)
    parent = parent_record(ACTIVE, fenced_at=FENCE_AT)
    intent = make_intent(K.SETTLE_COMPLETION, task_id="child", authoritative_at=authoritative_at)
    decision = decide(intent, situation(task, parent=parent), POLICY)
    if passes:
        expect_transition(decision, task, intent, **COMPLETED_RESULT)
    else:
        expect_rejection(
            decision,
            R.CANCELLATION_FENCED,
            cancellation_request_time=instant(FENCE_AT),
            fenced_task_id="parent",
            max_clock_offset_ms=str(OFFSET // 1000),
        )


def test_completion_must_predate_both_its_own_and_its_parents_fence():
    parent = parent_record(ACTIVE, fenced_at=FENCE_AT)
    task = child_record(ACTIVE, fenced_at=FENCE_AT + 10_000_000)
    before_parent = FENCE_AT - OFFSET - 1
    between = FENCE_AT + 1_000_000  # before the child's own fence, after the parent's
    assert isinstance(
        decide(
            make_intent(K.SETTLE_COMPLETION, task_id="child", authoritative_at=before_parent),
            situation(task, parent=parent),
            POLICY,
        ),
        Transition,
    )
    decision = decide(
        make_intent(K.SETTLE_COMPLETION, task_id="child", authoritative_at=between),
        situation(task, parent=parent),
        POLICY,
    )
    expect_rejection(decision, R.CANCELLATION_FENCED, fenced_task_id="parent")


def test_without_a_fence_no_proof_is_needed():
    task = record(ACTIVE)
    for authoritative_at in (None, NOW + 3_600_000_000):
        decision = decide(make_intent(K.SETTLE_COMPLETION, authoritative_at=authoritative_at), situation(task), POLICY)
        assert isinstance(decision, Transition)


@pytest.mark.parametrize("offset_micros", [0, 2_000_000])
def test_the_clock_offset_is_configurable(offset_micros):
    policy = Policy(max_clock_offset_micros=offset_micros)
    task = record(ACTIVE, fenced_at=FENCE_AT)
    inside = make_intent(K.SETTLE_COMPLETION, authoritative_at=FENCE_AT - offset_micros - 1)
    at_offset = make_intent(K.SETTLE_COMPLETION, authoritative_at=FENCE_AT - offset_micros)
    assert isinstance(decide(inside, situation(task), policy), Transition)
    expect_rejection(
        decide(at_offset, situation(task), policy),
        R.CANCELLATION_FENCED,
        max_clock_offset_ms=str(offset_micros // 1000),
    )


@pytest.mark.parametrize("kind", [K.SETTLE_FAILURE, K.SETTLE_TIMEOUT])
def test_failure_and_timeout_never_pass_a_fence(kind):
    # Failure and timeout facts carry no authoritative time: after a fence they fail closed.
    task = record(ACTIVE, fenced_at=FENCE_AT)
    expect_rejection(decide(make_intent(kind), situation(task), POLICY), R.CANCELLATION_FENCED)


def test_decide_is_pure():
    task = record(ACTIVE, fenced_at=FENCE_AT)
    s = situation(task, children=CHILDREN)
    intent = make_intent(K.SETTLE_CANCELLATION)
    assert decide(intent, s, POLICY) == decide(intent, s, POLICY)
    assert s.task == record(ACTIVE, fenced_at=FENCE_AT)


def test_the_builders_describe_what_the_tests_claim():
    # Guards the table against a builder that silently ignores an argument.
    assert record(ACTIVE, fenced_at=FENCE_AT).fenced
    assert not record(ACTIVE).fenced
    assert record(ACTIVE).workspace_id == WORKSPACE and record(ACTIVE).created_at == CREATED
    assert make_intent(K.SETTLE_COMPLETION, authoritative_at=None).authoritative_at is None
    assert make_intent(K.REGISTER_TASK, parent=attached()).parent == attached()
