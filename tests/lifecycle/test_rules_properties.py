"""Properties of the pure lifecycle core over random records, situations and intents."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import event as note_outcome
from hypothesis import strategies as st

from funnel.runtime.errors import Rejection, instant
from lifecycle_service.core import intents as i
from lifecycle_service.core.model import (
    ChildRef,
    GenerationState,
    IntentKind,
    LinkMode,
    Outcome,
    ParentLink,
    Policy,
    Situation,
    TaskRecord,
    WorkStatus,
)
from lifecycle_service.core.rules import AlreadySettled, Transition, decide
from lifecycle_service.errors import Reason
from tests.lifecycle.core_builders import NOW, SETTLED_WORK_STATUS, make_intent, record

TERMINAL = GenerationState.TERMINAL
NON_TERMINAL = [GenerationState.REGISTERED, GenerationState.ACTIVE, GenerationState.SUSPENDED]
PROPAGATING = {
    IntentKind.REQUEST_CANCELLATION: IntentKind.REQUEST_CANCELLATION,
    IntentKind.SETTLE_CANCELLATION: IntentKind.SETTLE_CANCELLATION,
    IntentKind.SETTLE_FAILURE: IntentKind.PROPAGATE_PARENT_TERMINATION,
    IntentKind.SETTLE_TIMEOUT: IntentKind.PROPAGATE_PARENT_TERMINATION,
    IntentKind.PROPAGATE_PARENT_TERMINATION: IntentKind.PROPAGATE_PARENT_TERMINATION,
}
FAST = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

times = st.integers(min_value=NOW - 100_000_000, max_value=NOW)
completion_ids = st.sampled_from(["cmp-a", "cmp-b"])


@st.composite
def records(draw, task_id="task", state=None, fenced=None, parent_link=True) -> TaskRecord:
    state = draw(st.sampled_from(list(GenerationState))) if state is None else state
    generation = draw(st.integers(min_value=1, max_value=4))
    outcome = draw(st.sampled_from(list(Outcome))) if state is TERMINAL else None
    fenced = draw(st.sampled_from([False, False, True])) if fenced is None else fenced
    if outcome is Outcome.CANCELLED and draw(st.booleans()):
        fenced = True  # settled cancellations are fenced; parent terminations need not be
    if state is TERMINAL:
        work_status = SETTLED_WORK_STATUS[outcome]
    else:
        work_status = draw(st.sampled_from([WorkStatus.READY, WorkStatus.IN_PROGRESS, WorkStatus.BLOCKED]))
    parent = None
    if parent_link and draw(st.booleans()):
        parent = ParentLink(
            "parent", draw(st.integers(min_value=1, max_value=4)), draw(st.sampled_from(list(LinkMode)))
        )
    return record(
        state,
        generation=generation,
        revision=draw(st.integers(min_value=generation, max_value=60)),
        outcome=outcome,
        fenced_at=draw(times) if fenced else None,
        work_status=work_status,
        parent=parent,
        completion_id=draw(completion_ids) if outcome is Outcome.COMPLETED else None,
        task_id=task_id,
    )


@st.composite
def intents_for(draw, task: TaskRecord | None, kinds=tuple(IntentKind), generations=None) -> i.Intent:
    kind = draw(st.sampled_from(list(kinds)))
    current = task.generation if task else 1
    # Mostly the current generation (where most intents can apply), often the next one.
    default = st.sampled_from([current, current, current, current + 1]) | st.integers(
        min_value=1, max_value=current + 1
    )
    generation = draw(generations if generations is not None else default)
    revision = task.revision if task else 0
    fields: dict = {
        "request_id": draw(st.none() | st.just("req-1")),
        "expected_revision": draw(
            st.sampled_from([None, None, revision])
            | st.integers(min_value=max(0, revision - 2), max_value=revision + 2)
        ),
    }
    if kind is IntentKind.SETTLE_COMPLETION:
        fields["completion_id"] = draw(completion_ids)
        fields["authoritative_at"] = draw(st.none() | times)
    elif kind is IntentKind.SET_WORK_STATUS:
        fields["work_status"] = draw(st.sampled_from(list(WorkStatus)))
    elif kind is IntentKind.ACTIVATE_GENERATION:
        fields["work_status"] = draw(st.none() | st.sampled_from(list(WorkStatus)))
    elif kind is IntentKind.REGISTER_TASK and draw(st.booleans()):
        fields["parent"] = ParentLink(
            "parent", draw(st.integers(min_value=1, max_value=4)), draw(st.sampled_from(list(LinkMode)))
        )
    return make_intent(kind, generation=generation, **fields)


children = st.just(()) | st.lists(
    st.builds(ChildRef, st.sampled_from(["c-1", "c-2", "c-3"]), st.integers(min_value=1, max_value=3)),
    max_size=3,
    unique_by=lambda c: c.task_id,
).map(tuple)
policies = st.builds(Policy, st.integers(min_value=0, max_value=2_000_000))


UPDATES = [kind for kind in IntentKind if kind is not IntentKind.REGISTER_TASK]


@st.composite
def cases(draw, task_strategy=None, **intent_options) -> tuple[i.Intent, Situation]:
    """A situation and an intent for it: registrations of new tasks, or any other intent
    on an existing one (the table tests cover the other combinations)."""
    task = draw(task_strategy if task_strategy is not None else st.one_of(records(), records(), st.none()))
    parent = draw(st.none() | records(task_id="parent", parent_link=False))
    situation = Situation(now=NOW, task=task, parent=parent, open_attached_children=draw(children))
    intent_options.setdefault("kinds", UPDATES if task is not None else [IntentKind.REGISTER_TASK])
    return draw(intents_for(task, **intent_options)), situation


def assert_consistent(task: TaskRecord) -> None:
    assert (task.state is TERMINAL) == (task.outcome is not None)
    assert (task.outcome is Outcome.COMPLETED) == (task.completion_id is not None)
    if task.work_status is WorkStatus.DONE:
        assert task.outcome is Outcome.COMPLETED
    if task.work_status is WorkStatus.CANCELLED:
        assert task.outcome is Outcome.CANCELLED


@FAST
@given(cases(), policies)
def test_an_accepted_intent_raises_the_revision_by_exactly_one(case, policy):
    intent, situation = case
    old = situation.task
    decision = decide(intent, situation, policy)
    note_outcome(type(decision).__name__)
    if not isinstance(decision, Transition):
        assert isinstance(decision, (Rejection, AlreadySettled))
        return
    new, event = decision.task, decision.event
    assert new.revision == (old.revision + 1 if old else 1)
    assert event.revision == new.revision
    assert event.generation == new.generation
    assert (
        (event.workspace_id, event.task_id) == (new.workspace_id, new.task_id) == (intent.workspace_id, intent.task_id)
    )
    assert event.intent is intent.kind
    assert event.to_state is new.state and event.outcome is new.outcome
    assert event.from_state is (old.state if old else None)
    assert event.committed_at == new.updated_at == NOW
    assert_consistent(new)
    if old is not None:
        assert new.created_at == old.created_at and new.parent == old.parent
        moved_on = isinstance(intent, i.ResumeWithGeneration) and old.terminal
        assert new.generation == old.generation + (1 if moved_on else 0)
    # Propagations go to the open attached children given, and only from propagating intents.
    if intent.kind in PROPAGATING:
        assert [p.child for p in decision.propagations] == list(situation.open_attached_children)
        assert {p.intent for p in decision.propagations} <= {PROPAGATING[intent.kind]}
    else:
        assert decision.propagations == ()


@FAST
@given(cases(task_strategy=records(state=TERMINAL)), policies)
def test_a_terminal_generation_never_changes(case, policy):
    intent, situation = case
    task = situation.task
    decision = decide(intent, situation, policy)
    note_outcome(type(decision).__name__)
    if isinstance(intent, i.ResumeWithGeneration) and intent.generation == task.generation + 1:
        # The only way on: a new generation, leaving the terminal one in its events.
        if isinstance(decision, Transition):
            assert decision.task.generation == task.generation + 1
            assert decision.task.state is GenerationState.ACTIVE
            assert decision.task.outcome is None and not decision.task.fenced
        else:
            assert isinstance(decision, Rejection)
        return
    assert not isinstance(decision, Transition), decision
    if isinstance(decision, AlreadySettled):
        assert decision.task == task
        assert intent.generation == task.generation


@FAST
@given(
    cases(
        task_strategy=records().filter(lambda t: t.generation >= 2),
        kinds=UPDATES,
        generations=st.integers(min_value=1, max_value=1),
    ),
    policies,
)
def test_an_intent_for_an_older_generation_is_always_stale(case, policy):
    intent, situation = case
    decision = decide(intent, situation, policy)
    note_outcome(type(decision).__name__)
    assert isinstance(decision, Rejection)
    assert decision.reason is Reason.STALE_GENERATION
    assert decision.metadata == {
        "generation": str(intent.generation),
        "current_generation": str(situation.task.generation),
    }


@st.composite
def completions_after_a_fence(draw):
    """A non-terminal task fenced by its own request or by its attached parent's, no
    open children, and a SettleCompletion for its current generation."""
    by_parent = draw(st.booleans())
    fence = draw(times)
    state = draw(st.sampled_from(NON_TERMINAL))
    task = draw(records(state=state, fenced=not by_parent, parent_link=False))
    parent = None
    if by_parent:
        link = ParentLink("parent", 1, LinkMode.ATTACHED)
        task = record(state, generation=task.generation, revision=task.revision, parent=link)
        parent = record(GenerationState.ACTIVE, task_id="parent", fenced_at=fence)
    else:
        fence = task.cancellation_requested_at
    authoritative_at = draw(st.none() | st.integers(min_value=fence - 3_000_000, max_value=fence + 1_000_000))
    intent = make_intent(
        IntentKind.SETTLE_COMPLETION,
        generation=task.generation,
        completion_id="cmp-a",
        authoritative_at=authoritative_at,
    )
    return intent, Situation(now=NOW, task=task, parent=parent), fence


@FAST
@given(completions_after_a_fence(), policies)
def test_a_completion_after_a_cancellation_request_wins_only_with_proof(case, policy):
    intent, situation, fence = case
    decision = decide(intent, situation, policy)
    note_outcome(type(decision).__name__)
    proven = intent.authoritative_at is not None and intent.authoritative_at + policy.max_clock_offset_micros < fence
    if proven:
        assert isinstance(decision, Transition)
        assert decision.task.outcome is Outcome.COMPLETED
        assert decision.event.authoritative_at == intent.authoritative_at
    else:
        assert isinstance(decision, Rejection)
        assert decision.reason is Reason.CANCELLATION_FENCED
        assert decision.metadata["cancellation_request_time"] == instant(fence)


@FAST
@given(
    cases(
        task_strategy=records(state=TERMINAL),
        kinds=[
            IntentKind.SETTLE_FAILURE,
            IntentKind.SETTLE_TIMEOUT,
            IntentKind.SETTLE_CANCELLATION,
            IntentKind.SETTLE_COMPLETION,
            IntentKind.PROPAGATE_PARENT_TERMINATION,
        ],
    ),
    policies,
)
def test_a_repeated_settlement_is_answered_only_when_it_matches(case, policy):
    intent, situation = case
    task = situation.task
    decision = decide(intent, situation, policy)
    note_outcome(type(decision).__name__)
    if intent.generation != task.generation:
        return
    matches = {
        IntentKind.SETTLE_FAILURE: task.outcome is Outcome.FAILED,
        IntentKind.SETTLE_TIMEOUT: task.outcome is Outcome.TIMED_OUT,
        IntentKind.SETTLE_CANCELLATION: task.outcome is Outcome.CANCELLED,
        IntentKind.PROPAGATE_PARENT_TERMINATION: task.outcome is Outcome.CANCELLED,
        IntentKind.SETTLE_COMPLETION: task.outcome is Outcome.COMPLETED
        and getattr(intent, "completion_id", None) == task.completion_id,
    }[intent.kind]
    if matches:
        assert decision == AlreadySettled(task)
    else:
        assert isinstance(decision, Rejection) and decision.reason is Reason.GENERATION_TERMINAL
