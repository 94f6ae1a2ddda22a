"""The dashboard's decisions, table-driven: what badge a task shows from
lifecycle and completion facts (the seed's rule), which actions it offers, and
the cursors and pages its streams and lists move by."""

from __future__ import annotations

import itertools
import re

import jwt
import pytest

from funnel.auth.hosts import own_names
from funnel.auth.tokens import SigningKey
from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types
from funnel_ui import grants, render, view
from funnel_ui.app import same_origin
from funnel_ui.view import Cursor, Lifecycle, Settlement


def life(state: str, generation: int = 1, outcome: str = "", cancel: bool = False) -> Lifecycle:
    return Lifecycle("t1", generation, 3, state, outcome, cancellation_requested=cancel)


def settled(status: str, generation: int = 1, error: str = "") -> dict[str, Settlement]:
    return {"cmp_1": Settlement("cmp_1", generation, status, error_reason=error, error_message=error and "refused")}


# The actions a token may grant: all of them, or none.
EVERY = frozenset(view.ACTIONS)
NOTHING: frozenset[str] = frozenset()


BADGES = [
    # (case, lifecycle, settlements, label)
    ("registered task", life("REGISTERED"), {}, "registered"),
    ("gate denial: no completion, lifecycle unchanged", life("ACTIVE"), {}, "active"),
    ("committed, not settled", life("ACTIVE"), settled("PENDING"), "completion committed, settling"),
    (
        "settled fact before the lifecycle event arrives",
        life("ACTIVE"),
        settled("SETTLED"),
        "completion committed, settling",
    ),
    ("lifecycle terminal completed", life("TERMINAL", outcome="COMPLETED"), settled("SETTLED"), "completed"),
    ("lifecycle terminal completed, completion facts not read", life("TERMINAL", outcome="COMPLETED"), {}, "completed"),
    (
        "lifecycle rejected the completion",
        life("ACTIVE", cancel=True),
        settled("REJECTED", error="CANCELLATION_FENCED"),
        "completion rejected",
    ),
    (
        "cancelled while a completion was pending",
        life("TERMINAL", outcome="CANCELLED"),
        settled("PENDING"),
        "cancelled",
    ),
    ("failed", life("TERMINAL", outcome="FAILED"), {}, "failed"),
    ("timed out", life("TERMINAL", outcome="TIMED_OUT"), {}, "timed out"),
    (
        "an old generation's completion cannot touch generation 2",
        life("ACTIVE", generation=2),
        settled("SETTLED"),
        "active",
    ),
    (
        "an old generation's pending completion neither",
        life("REGISTERED", generation=2),
        settled("PENDING"),
        "registered",
    ),
    ("fenced", life("ACTIVE", cancel=True), {}, "active, cancellation requested"),
    ("suspended", life("SUSPENDED"), {}, "suspended"),
]


@pytest.mark.parametrize(("case", "lifecycle", "settlements", "label"), BADGES, ids=[b[0] for b in BADGES])
def test_badge(case, lifecycle, settlements, label):
    assert view.task_badge(lifecycle, settlements).label == label


def test_a_rejected_completion_shows_the_terminalization_error():
    badge = view.task_badge(life("ACTIVE"), settled("REJECTED", error="ACTIVE_ATTACHED_CHILD"))
    assert (badge.kind, badge.detail) == ("rejected", "terminalization error ACTIVE_ATTACHED_CHILD: refused")


TERMINAL_WORDS = re.compile(r"\b(completed|cancelled|failed|timed out|done)\b")


def test_no_completion_fact_makes_a_task_terminal():
    """Every combination of completion facts on every non-terminal lifecycle state,
    work status, fence and time: never a terminal word, neither in the badge nor
    anywhere in the list row or the task head that show them (times and ages
    included) nor on the buttons it offers."""
    for state, statuses, generation, work, cancel, times in itertools.product(
        ("REGISTERED", "ACTIVE", "SUSPENDED"),
        itertools.product(("PENDING", "SETTLED", "REJECTED"), repeat=2),
        (1, 2),
        ("READY", "IN_PROGRESS", "BLOCKED"),
        (False, True),
        ((0.0, 0.0), (1_700_000_000.0, 1_700_000_123.5)),
    ):
        facts = {f"c{i}": Settlement(f"c{i}", generation, s) for i, s in enumerate(statuses)}
        lifecycle = Lifecycle(
            "t1", 1, 3, state, work_status=work, cancellation_requested=cancel, created=times[0], changed=times[1]
        )
        badge = view.task_badge(lifecycle, facts)
        assert not TERMINAL_WORDS.search(badge.label)
        for html in (
            render.task_row("w", lifecycle, facts),
            render.task_head("w", lifecycle, facts, view.task_actions(lifecycle, None, EVERY), "csrf", "request"),
        ):
            shown = re.sub(r"<[^>]*>", " ", html)
            assert not TERMINAL_WORDS.search(shown), shown


def event(kind: int, completion_id: str = "cmp_1", **fields) -> completion_types.CompletionEvent:
    return completion_types.CompletionEvent(kind=kind, completion_id=completion_id, generation=1, **fields)


SETTLEMENT_STEPS = [
    ("committed", {}, event(completion_enums.COMPLETION_EVENT_KIND_COMPLETION_COMMITTED), "PENDING"),
    (
        "settled",
        settled("PENDING"),
        event(completion_enums.COMPLETION_EVENT_KIND_COMPLETION_SETTLED, lifecycle_revision=4),
        "SETTLED",
    ),
    (
        "rejected",
        settled("PENDING"),
        event(completion_enums.COMPLETION_EVENT_KIND_TERMINALIZATION_ERROR, error_reason="X"),
        "REJECTED",
    ),
    (
        "a replayed commit cannot take a settlement back",
        settled("SETTLED"),
        event(completion_enums.COMPLETION_EVENT_KIND_COMPLETION_COMMITTED),
        "SETTLED",
    ),
    (
        "nor un-reject one",
        settled("REJECTED"),
        event(completion_enums.COMPLETION_EVENT_KIND_COMPLETION_COMMITTED),
        "REJECTED",
    ),
]


@pytest.mark.parametrize(("case", "before", "fact", "status"), SETTLEMENT_STEPS, ids=[s[0] for s in SETTLEMENT_STEPS])
def test_settlement_moves_forward_only(case, before, fact, status):
    assert view.apply_completion_event(before, fact)["cmp_1"].status == status


def test_a_read_brings_settlements_no_event_told_and_takes_none_back():
    read = [Settlement("cmp_1", 1, "PENDING"), Settlement("cmp_2", 1, "REJECTED", error_reason="ACTIVE_ATTACHED_CHILD")]
    known = view.merged(settled("SETTLED"), read)
    assert {k: v.status for k, v in known.items()} == {"cmp_1": "SETTLED", "cmp_2": "REJECTED"}
    assert view.task_badge(life("ACTIVE"), view.merged({}, read[1:])).label == "completion rejected"


def test_a_blocked_decision_is_no_settlement():
    assert (
        view.apply_completion_event(
            {}, event(completion_enums.COMPLETION_EVENT_KIND_DECISION_BLOCKED, completion_id="")
        )
        == {}
    )


def test_the_higher_revision_wins_whatever_the_arrival_order():
    read = Lifecycle("t1", 1, 5, "TERMINAL", "COMPLETED")
    replayed = view.lifecycle_from_event(
        lifecycle_types.LifecycleEvent(
            task_id="t1", generation=1, revision=4, to_state=lifecycle_enums.GENERATION_STATE_ACTIVE
        )
    )
    assert view.newer(read, replayed) is read
    assert view.newer(None, replayed) is replayed
    assert view.newer(replayed, read) is read


def advice(
    ask: int, primary: int, secondary: int = 0, generation: int = 1
) -> transcript_messages.ResolveResumeResponse:
    return transcript_messages.ResolveResumeResponse(
        ask=ask, primary=primary, secondary=secondary, generation=generation
    )


COMPLETED_ADVICE = advice(
    completion_enums.RESUME_ASK_RESUME_COMPLETED_TASK,
    completion_enums.HOST_ACTION_RESUME_TASK,
    completion_enums.HOST_ACTION_NEW_TASK,
)
ACTIONS = [
    ("viewer: nothing", life("TERMINAL", outcome="COMPLETED"), COMPLETED_ADVICE, NOTHING, []),
    ("viewer on an open task: nothing", life("ACTIVE"), None, NOTHING, []),
    (
        "completed: Resume task first, New chat second",
        life("TERMINAL", outcome="COMPLETED"),
        COMPLETED_ADVICE,
        EVERY,
        [("resume", "Resume task", True), ("new-chat", "New chat", False)],
    ),
    (
        "advice for another generation is not followed",
        life("TERMINAL", generation=2, outcome="COMPLETED"),
        COMPLETED_ADVICE,
        EVERY,
        [],
    ),
    (
        "ended: a new chat only",
        life("TERMINAL", outcome="CANCELLED"),
        advice(completion_enums.RESUME_ASK_RESUME_ENDED_TASK, completion_enums.HOST_ACTION_NEW_TASK),
        EVERY,
        [("new-chat", "New chat", True)],
    ),
    ("open: request cancellation", life("ACTIVE"), None, EVERY, [("cancel", "Request cancellation", False)]),
    ("fenced already: nothing more", life("ACTIVE", cancel=True), None, EVERY, []),
    (
        "a token that may register but not resume: New chat only",
        life("TERMINAL", outcome="COMPLETED"),
        COMPLETED_ADVICE,
        frozenset({"new-chat"}),
        [("new-chat", "New chat", False)],
    ),
    ("a token that may not cancel: nothing on an open task", life("ACTIVE"), None, frozenset({"resume"}), []),
]


@pytest.mark.parametrize(("case", "lifecycle", "resume", "permitted", "expected"), ACTIONS, ids=[a[0] for a in ACTIONS])
def test_actions(case, lifecycle, resume, permitted, expected):
    actions = view.task_actions(lifecycle, resume, permitted)
    assert [(a.name, a.label, a.primary) for a in actions] == expected


SIGNER = SigningKey.generate()
GRANTS = [
    # (case, permissions, workspace, actions offered)
    ("a host of demo, in demo", ["demo:host"], "demo", EVERY),
    ("a host of demo, elsewhere", ["demo:host"], "other", NOTHING),
    ("an operator of every workspace", ["*:operator"], "other", EVERY),
    ("a viewer", ["demo:viewer"], "demo", NOTHING),
    ("an agent: it may not act on tasks", ["demo:agent"], "demo", NOTHING),
    ("entries of other systems grant nothing", ["demo", "demo:admin", "read:all", 7], "demo", NOTHING),
    ("no permissions claim", None, "demo", NOTHING),
]


@pytest.mark.parametrize(("case", "permissions", "workspace", "offered"), GRANTS, ids=[g[0] for g in GRANTS])
def test_the_buttons_follow_the_action_tokens_grants_as_the_services_table_reads_them(
    case, permissions, workspace, offered
):
    token = SIGNER.issue("ui-action", permissions or [], 600)
    if permissions is None:  # a token without the claim at all
        token = jwt.encode({"sub": "ui-action", "exp": 2**31}, SIGNER.private_key, algorithm=SIGNER.algorithm)
    assert grants.permitted(token, workspace) == offered


def test_a_token_that_is_no_jwt_offers_nothing():
    assert grants.permitted("not-a-jwt", "demo") == NOTHING
    assert grants.permitted(None, "demo") == NOTHING


@pytest.mark.parametrize(
    ("text", "cursor"),
    [
        ("12.7", Cursor(12, 7)),
        ("0.0", Cursor(0, 0)),
        (None, None),
        ("", None),
        ("12", None),
        ("a.b", None),
        ("-1.2", None),
        ("1.2.3", None),
    ],
)
def test_event_ids(text, cursor):
    assert view.parse_cursor(text) == cursor
    if cursor is not None:
        assert view.parse_cursor(cursor.event_id()) == cursor


def test_a_filter_is_sent_to_the_service_and_judges_live_rows_as_the_service_would():
    blocked = view.Filter(state="ACTIVE", work_status="BLOCKED", prefix="t-", order="changed")
    request = blocked.list_request("ws", 50, "token")
    assert (request.state, request.outcome, request.work_status, request.task_id_prefix, request.order) == (
        lifecycle_enums.GENERATION_STATE_ACTIVE,
        0,
        lifecycle_enums.WORK_STATUS_BLOCKED,
        "t-",
        lifecycle_enums.TASK_ORDER_LAST_CHANGE,
    )
    assert (request.page_size, request.page_token) == (50, "token")
    assert blocked.query == {"state": "ACTIVE", "work_status": "BLOCKED", "q": "t-", "sort": "changed"}
    assert view.Filter().query == {} and view.Filter().list_request("ws", 50, "").order == 0
    task = Lifecycle("t-9", 1, 2, "ACTIVE", work_status="BLOCKED")
    assert view.matches(blocked, task)
    assert not view.matches(view.Filter(prefix="t-1"), task) and not view.matches(view.Filter(prefix="9"), task)
    assert not view.matches(view.Filter(outcome="FAILED"), task)


def test_a_live_page_admits_a_task_in_its_range_or_on_top_of_the_first_page_of_changes():
    task = Lifecycle("m", 1, 1, "REGISTERED")
    assert view.ListedPage(first="", last="z").admits(task) and view.ListedPage(first="a", last="").admits(task)
    assert not view.ListedPage(first="n", last="z").admits(task) and not view.ListedPage(last="l").admits(task)
    assert not view.ListedPage(view.Filter(state="ACTIVE")).admits(task)
    changes = view.Filter(order="changed")
    assert view.ListedPage(changes, last="a").admits(task)  # every change goes on top of the first page
    assert not view.ListedPage(changes, first_page=False).admits(task)
    assert view.next_in_order("m", ["a", "z", "n"]) == "n" and view.next_in_order("zz", ["a"]) is None


def test_service_text_is_escaped():
    hostile = "<script>alert(1)</script>\"'"
    row = render.lifecycle_row(
        lifecycle_types.LifecycleEvent(
            sequence=1,
            task_id="t1",
            cause=lifecycle_types.Cause(source=hostile, reason=hostile),
            caller=lifecycle_types.Caller(subject=hostile, role="host"),
        )
    )
    assert "<script>" not in row and "&lt;script&gt;" in row and "&quot;" in row
    completion = render.completion_event_row(
        completion_types.CompletionEvent(
            sequence=2,
            decision=completion_types.Decision(
                instruction=hostile, trace=[completion_types.GateResult(gate_id="g", reason=hostile)]
            ),
        )
    )
    assert "<script>" not in completion
    page = render.task_list(
        "w", view.Filter(prefix=hostile), [], {}, "", Cursor(), lifecycle_messages.CountTasksResponse()
    )
    assert "<script>alert" not in page


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({"host": "127.0.0.1:8470", "origin": "http://127.0.0.1:8470", "sec-fetch-site": "same-origin"}, True),
        ({"host": "127.0.0.1:8470"}, True),
        ({"host": "127.0.0.1:8470", "origin": "http://evil.example"}, False),
        ({"host": "127.0.0.1:8470", "sec-fetch-site": "cross-site"}, False),
        ({"host": "127.0.0.1:8470", "origin": "http://127.0.0.1:8470", "sec-fetch-site": "same-site"}, False),
    ],
)
def test_posts_from_other_origins_are_refused(headers, allowed):
    assert same_origin(headers) is allowed


@pytest.mark.parametrize(
    ("listen", "names"),
    [
        ("127.0.0.1", ["127.0.0.1", "localhost", "[::1]"]),
        ("127.0.0.2", ["127.0.0.2", "localhost", "127.0.0.1", "[::1]"]),
        ("::1", ["[::1]", "localhost", "127.0.0.1"]),
        ("localhost", ["localhost", "127.0.0.1", "[::1]"]),
        ("0.0.0.0", ["localhost", "127.0.0.1", "[::1]"]),  # every address: remote names are given
        ("::", ["localhost", "127.0.0.1", "[::1]"]),
        ("10.0.0.5", ["10.0.0.5"]),
        ("fd00::5", ["[fd00::5]"]),
        ("Dash.Example", ["dash.example"]),
    ],
)
def test_a_listener_answers_its_own_names_by_default(listen, names):
    assert own_names(listen) == names


# -- what needs attention ------------------------------------------------------------


def open_run(run_id: str, claimed: float, lease_until: float, closed: bool = False) -> completion_types.Run:
    run = completion_types.Run(run_id=run_id, task_id=f"task-{run_id}")
    run.claim_time.FromNanoseconds(int(claimed * 1e9))
    run.lease_expire_time.FromNanoseconds(int(lease_until * 1e9))
    if closed:
        run.finish_time.FromNanoseconds(int(lease_until * 1e9))
    return run


def test_open_runs_need_attention_when_their_lease_lapsed_or_they_are_open_past_the_bound():
    now, bound = 1000.0, 60.0
    runs = [
        open_run("young", claimed=990, lease_until=1010),  # live, open 10 s: nothing to say
        open_run("long", claimed=900, lease_until=1010),  # live, open 100 s > 60 s
        open_run("lapsed", claimed=995, lease_until=999),  # its lease lapsed, not closed
        open_run("old-lapsed", claimed=100, lease_until=200),  # lapsed and long: listed once, as lapsed
        open_run("closed", claimed=100, lease_until=200, closed=True),
    ]
    expired, long_open = view.open_runs_needing_attention(runs, now, bound)
    assert [r.run_id for r in expired] == ["old-lapsed", "lapsed"]  # oldest claim first
    assert [r.run_id for r in long_open] == ["long"]
    # Time alone changes the page next when "young" lapses (1010) or crosses the bound (1050): the first.
    assert view.attention_deadline(runs, now, bound) == 1010
    assert view.attention_deadline([open_run("a", claimed=990, lease_until=2000)], now, bound) == 1050
    assert view.attention_deadline(runs[2:], now, bound) is None  # nothing live: no change by time


@pytest.mark.parametrize(
    ("case", "task", "stands"),
    [
        ("the task still open at that generation", life("ACTIVE", cancel=True), True),
        ("the task moved on to a later generation", life("ACTIVE", generation=2), False),
        ("the task ended since (cancelled)", life("TERMINAL", outcome="CANCELLED"), False),
        ("the task not read (gone)", None, False),
    ],
)
def test_a_rejected_completion_stands_while_its_task_is_open_at_its_generation(case, task, stands):
    rejected = completion_types.Completion(
        completion_id="cmp_1", task_id="t1", generation=1, settlement=completion_enums.SETTLEMENT_STATUS_REJECTED
    )
    assert view.still_rejected(rejected, task) is stands


def test_the_attention_panel_links_each_entry_to_its_task_and_escapes_service_text():
    hostile = "<script>alert(1)</script>"
    pending = completion_types.Completion(
        completion_id="cmp_p", task_id="t-pending", generation=1, settlement=completion_enums.SETTLEMENT_STATUS_PENDING
    )
    rejected = completion_types.Completion(
        completion_id="cmp_r",
        task_id="t-rejected",
        generation=1,
        settlement=completion_enums.SETTLEMENT_STATUS_REJECTED,
        terminalization_error_reason="CANCELLATION_FENCED",
        terminalization_error_message=hostile,
    )
    lapsed = open_run("r1", claimed=10, lease_until=20)
    facts = view.Attention(pending=(pending,), expired=(lapsed,), rejected=(rejected,))
    html = render.attention("ws", facts, 3600, 100.0)
    for section, task_id in [("pending", "t-pending"), ("expired", "task-r1"), ("rejected", "t-rejected")]:
        part = html.split(f'id="attention-{section}"')[1].split("</section>")[0]
        assert f'href="/w/ws/t/{task_id}"' in part, section
    assert 'id="attention-long"' in html and "nothing" in html.split('id="attention-long"')[1].split("</section>")[0]
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<b>3</b> need attention" in html


def completion_at(completion_id: str, task_id: str, committed: float, status: int, generation: int = 1):
    completion = completion_types.Completion(
        completion_id=completion_id, task_id=task_id, generation=generation, settlement=status
    )
    completion.commit_time.FromNanoseconds(int(committed * 1e9))
    return completion


def test_of_the_rejections_each_tasks_latest_counts_unless_a_later_completion_is_pending():
    rejected_, pending_ = completion_enums.SETTLEMENT_STATUS_REJECTED, completion_enums.SETTLEMENT_STATUS_PENDING
    rejected = [
        completion_at("a-1", "a", 10, rejected_),
        completion_at("b-1", "b", 20, rejected_),
        completion_at("a-2", "a", 30, rejected_),  # a refused again: its latest
        completion_at("c-1", "c", 40, rejected_),
        completion_at("d-1", "d", 50, rejected_),
    ]
    pending = [
        completion_at("c-2", "c", 45, pending_),  # c tried again since: its last completion is pending
        completion_at("d-0", "d", 5, pending_, generation=2),  # another generation's: no bearing
    ]
    kept = view.latest_rejections(rejected, pending, limit=10)
    assert [c.completion_id for c in kept] == ["b-1", "a-2", "d-1"]  # commit order
    assert [c.completion_id for c in view.latest_rejections(rejected, pending, limit=2)] == ["a-2", "d-1"]


@pytest.mark.parametrize(
    ("permissions", "said"),
    [
        (["demo:host"], "actions in demo"),
        (["demo:host", "acme:operator", "zeta:viewer"], "actions in acme, demo"),
        (["*:operator"], "actions in every workspace"),
        (["demo:viewer"], "read only: the action token grants no action"),
    ],
)
def test_the_start_line_says_where_the_action_token_acts(permissions, said):
    assert grants.start_mode(SIGNER.issue("ui-action", permissions, 600)) == said
    assert grants.start_mode(None) == "read only"
    assert grants.start_mode("not-a-jwt") == "read only: the action token grants no action"
