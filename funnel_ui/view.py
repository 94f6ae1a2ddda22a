"""What a task shows, decided from facts only: pure functions, no I/O.

The seed's rule is built into the types: a task's badge is computed from a
`Lifecycle` (a lifecycle read or event) and `Settlement`s (completion facts).
Settlements can only ever produce "completion committed, settling" or a
terminalization error on a *non-terminal* lifecycle; the words "completed",
"cancelled", "failed" and "timed out" come from the lifecycle state alone."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from google.protobuf.timestamp_pb2 import Timestamp

from funnel.completion.v1 import enums_pb2 as completion_enums
from funnel.completion.v1 import transcript_messages_pb2 as transcript_messages
from funnel.completion.v1 import types_pb2 as completion_types
from funnel.lifecycle.v1 import enums_pb2 as lifecycle_enums
from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages
from funnel.lifecycle.v1 import types_pb2 as lifecycle_types

TERMINAL = "TERMINAL"


def enum_name(enum: object, value: int, prefix: str) -> str:
    """`GENERATION_STATE_ACTIVE` -> `ACTIVE`; an unknown number stays visible as such."""
    try:
        name: str = enum.Name(value)  # type: ignore[attr-defined]
    except ValueError:
        return str(value)
    return name.removeprefix(prefix)


@dataclass(frozen=True)
class Lifecycle:
    """A task's lifecycle truth as of one revision (from GetTask, ListTasks or an event)."""

    task_id: str
    generation: int
    revision: int
    state: str
    outcome: str = ""
    work_status: str = "READY"
    cancellation_requested: bool = False
    completion_id: str = ""
    # Unix seconds: registration, and the commit of the revision shown (0: unknown).
    created: float = 0.0
    changed: float = 0.0


def seconds(stamp: Timestamp) -> float:
    """A protobuf Timestamp as Unix seconds (0.0 when unset)."""
    return stamp.seconds + stamp.nanos / 1e9


def lifecycle_from_task(task: lifecycle_types.Task) -> Lifecycle:
    return Lifecycle(
        task_id=task.task_id,
        generation=task.generation,
        revision=task.revision,
        state=enum_name(lifecycle_enums.GenerationState, task.state, "GENERATION_STATE_"),
        outcome=_outcome(task.outcome),
        work_status=enum_name(lifecycle_enums.WorkStatus, task.work_status, "WORK_STATUS_"),
        cancellation_requested=task.cancellation == lifecycle_enums.CANCELLATION_STATE_REQUESTED,
        completion_id=task.completion_id,
        created=seconds(task.create_time),
        changed=seconds(task.update_time),
    )


def lifecycle_from_event(event: lifecycle_types.LifecycleEvent) -> Lifecycle:
    """Events carry the task's state after the transition, so they replace a read."""
    return Lifecycle(
        task_id=event.task_id,
        generation=event.generation,
        revision=event.revision,
        state=enum_name(lifecycle_enums.GenerationState, event.to_state, "GENERATION_STATE_"),
        outcome=_outcome(event.outcome),
        work_status=enum_name(lifecycle_enums.WorkStatus, event.work_status, "WORK_STATUS_"),
        cancellation_requested=event.cancellation == lifecycle_enums.CANCELLATION_STATE_REQUESTED,
        completion_id=event.completion_id,
        changed=seconds(event.commit_time),
    )


def _outcome(value: int) -> str:
    if value == lifecycle_enums.TERMINAL_OUTCOME_UNSPECIFIED:
        return ""
    return enum_name(lifecycle_enums.TerminalOutcome, value, "TERMINAL_OUTCOME_")


def newer(current: Lifecycle | None, candidate: Lifecycle) -> Lifecycle:
    """Revisions grow by one per committed transition, so the higher one is the
    truth whatever order a read and a replayed event arrive in. (An event does
    not carry the registration time: a read's is kept.)"""
    if current is None:
        return candidate
    if candidate.revision <= current.revision:
        return current
    return candidate if candidate.created or not current.created else replace(candidate, created=current.created)


@dataclass(frozen=True)
class Settlement:
    """The settlement status of one committed completion (a completion fact)."""

    completion_id: str
    generation: int
    status: str  # PENDING, SETTLED or REJECTED
    lifecycle_revision: int = 0
    error_reason: str = ""
    error_message: str = ""


_RANK = {"PENDING": 0, "SETTLED": 1, "REJECTED": 1}


def rank(settlement: Settlement) -> int:
    return _RANK.get(settlement.status, 0)


def settlement_from_completion(completion: completion_types.Completion) -> Settlement:
    return Settlement(
        completion_id=completion.completion_id,
        generation=completion.generation,
        status=enum_name(completion_enums.SettlementStatus, completion.settlement, "SETTLEMENT_STATUS_"),
        lifecycle_revision=completion.lifecycle_revision,
        error_reason=completion.terminalization_error_reason,
        error_message=completion.terminalization_error_message,
    )


def apply_completion_event(
    settlements: Mapping[str, Settlement], event: completion_types.CompletionEvent
) -> dict[str, Settlement]:
    """A settlement only moves forward (PENDING -> SETTLED or REJECTED): an event
    replayed from before a fresh read cannot take it back."""
    kind = event.kind
    if kind == completion_enums.COMPLETION_EVENT_KIND_COMPLETION_COMMITTED:
        candidate = Settlement(event.completion_id, event.generation, "PENDING")
    elif kind == completion_enums.COMPLETION_EVENT_KIND_COMPLETION_SETTLED:
        candidate = Settlement(event.completion_id, event.generation, "SETTLED", event.lifecycle_revision)
    elif kind == completion_enums.COMPLETION_EVENT_KIND_TERMINALIZATION_ERROR:
        candidate = Settlement(
            event.completion_id,
            event.generation,
            "REJECTED",
            error_reason=event.error_reason,
            error_message=event.error_message,
        )
    else:
        return dict(settlements)
    return merged(settlements, [candidate])


def merged(settlements: Mapping[str, Settlement], seen: Iterable[Settlement]) -> dict[str, Settlement]:
    """The known settlements with those seen (events or a read) taken in, each
    only if it is further along: neither a replayed event nor a read older than
    an event can take one back."""
    known = dict(settlements)
    for candidate in seen:
        held = known.get(candidate.completion_id)
        if held is None or rank(candidate) > rank(held):
            known[candidate.completion_id] = candidate
    return known


@dataclass(frozen=True)
class Badge:
    label: str
    kind: str  # a CSS class
    detail: str = ""


def task_badge(lifecycle: Lifecycle, settlements: Mapping[str, Settlement]) -> Badge:
    """The one place that decides a task's badge (the seed's rule, see the module doc)."""
    if lifecycle.state == TERMINAL:
        outcome = lifecycle.outcome.replace("_", " ").lower() or "terminal"
        return Badge(
            outcome,
            outcome.replace(" ", "-"),
            f"generation {lifecycle.generation} ended at revision {lifecycle.revision}",
        )
    current = [s for s in settlements.values() if s.generation == lifecycle.generation]
    rejected = [s for s in current if s.status == "REJECTED"]
    if rejected:
        error = rejected[-1]
        return Badge(
            "completion rejected", "rejected", f"terminalization error {error.error_reason}: {error.error_message}"
        )
    # SETTLED without the lifecycle event yet is still "settling": only the
    # lifecycle event may say "completed".
    if any(s.status in ("PENDING", "SETTLED") for s in current):
        return Badge(
            "completion committed, settling",
            "settling",
            f"generation {lifecycle.generation} is {lifecycle.state.lower()} until the lifecycle settles it",
        )
    state = lifecycle.state.lower()
    if lifecycle.cancellation_requested:
        return Badge(f"{state}, cancellation requested", "cancelling")
    return Badge(state, state)


def settlement_label(settlement: Settlement) -> str:
    if settlement.status == "PENDING":
        return "committed, settling"
    if settlement.status == "SETTLED":
        return f"settled at lifecycle revision {settlement.lifecycle_revision}"
    if settlement.status == "REJECTED":
        return f"terminalization error {settlement.error_reason}: {settlement.error_message}"
    return settlement.status.lower()


@dataclass(frozen=True)
class Action:
    name: str  # the POST endpoint: resume, new-chat, cancel
    label: str
    primary: bool


ACTIONS = {
    action.name: action
    for action in (
        Action("resume", "Resume task", True),
        Action("new-chat", "New chat", False),
        Action("cancel", "Request cancellation", False),
    )
}
_HOST_ACTIONS = {
    completion_enums.HOST_ACTION_RESUME_TASK: ACTIONS["resume"],
    completion_enums.HOST_ACTION_NEW_TASK: ACTIONS["new-chat"],
}


# What a terminal task may offer (as ResolveResume advises).
TERMINAL_ACTIONS = frozenset(action.name for action in _HOST_ACTIONS.values())


def task_actions(
    lifecycle: Lifecycle, advice: transcript_messages.ResolveResumeResponse | None, permitted: frozenset[str]
) -> list[Action]:
    """Buttons only for what the action token grants in the task's workspace
    (`permitted`, funnel_ui.grants); on a terminal task what ResolveResume offers
    for the generation shown (primary first), on an open one the cancellation
    request unless its fence is already committed."""
    if lifecycle.state != TERMINAL:
        offered = [] if lifecycle.cancellation_requested else [ACTIONS["cancel"]]
    elif advice is None or advice.generation != lifecycle.generation:
        offered = []
    else:
        offered = []
        for host_action, primary in ((advice.primary, True), (advice.secondary, False)):
            action = _HOST_ACTIONS.get(host_action)
            if action is not None:
                offered.append(replace(action, primary=primary))
    return [action for action in offered if action.name in permitted]


@dataclass(frozen=True)
class Cursor:
    """Where a page's event stream resumes: the last lifecycle and completion
    sequences delivered. It is the SSE event id, so a browser's Last-Event-ID
    brings it back after any disconnect."""

    lifecycle: int = 0
    completion: int = 0

    def event_id(self) -> str:
        return f"{self.lifecycle}.{self.completion}"


def parse_cursor(text: str | None) -> Cursor | None:
    if not text:
        return None
    left, dot, right = text.partition(".")
    if not dot or not left.isdigit() or not right.isdigit():
        return None
    return Cursor(int(left), int(right))


ORDERS = ("id", "changed")


@dataclass(frozen=True)
class Filter:
    """A list page's filters (the service applies them: ListTasks) and its order:
    `id` (by task id) or `changed` (most recent change first)."""

    state: str = ""
    outcome: str = ""
    work_status: str = ""
    prefix: str = ""
    order: str = "id"

    @property
    def query(self) -> dict[str, str]:
        """The filter as the list page's query parameters (only those set)."""
        fields = (
            ("state", self.state),
            ("outcome", self.outcome),
            ("work_status", self.work_status),
            ("q", self.prefix),
            ("sort", "" if self.order == "id" else self.order),
        )
        return {name: value for name, value in fields if value}

    def list_request(self, workspace: str, size: int, token: str) -> lifecycle_messages.ListTasksRequest:
        return lifecycle_messages.ListTasksRequest(
            workspace_id=workspace,
            page_size=size,
            page_token=token,
            state=f"GENERATION_STATE_{self.state}" if self.state else None,
            outcome=f"TERMINAL_OUTCOME_{self.outcome}" if self.outcome else None,
            work_status=f"WORK_STATUS_{self.work_status}" if self.work_status else None,
            task_id_prefix=self.prefix,
            order=lifecycle_enums.TASK_ORDER_LAST_CHANGE
            if self.order == "changed"
            else lifecycle_enums.TASK_ORDER_UNSPECIFIED,
        )


def matches(filter_: Filter, lifecycle: Lifecycle) -> bool:
    """What ListTasks would say of this task under `filter_` (for live rows)."""
    return (
        (not filter_.state or lifecycle.state == filter_.state)
        and (not filter_.outcome or lifecycle.outcome == filter_.outcome)
        and (not filter_.work_status or lifecycle.work_status == filter_.work_status)
        and lifecycle.task_id.startswith(filter_.prefix)
    )


@dataclass(frozen=True)
class ListedPage:
    """What one list page shows, for its live updates. In task-id order: the
    matching tasks from `first` to `last` ("" for an open end: the first page,
    the last page). In last-change order: the first page is where every change
    goes (to its top); a later page only follows its rows."""

    filter: Filter = Filter()
    first: str = ""
    last: str = ""
    first_page: bool = True

    def admits(self, lifecycle: Lifecycle) -> bool:
        if not matches(self.filter, lifecycle):
            return False
        if self.filter.order == "changed":
            return self.first_page
        task_id = lifecycle.task_id
        return (not self.first or task_id >= self.first) and (not self.last or task_id <= self.last)


def next_in_order(task_id: str, shown: Iterable[str]) -> str | None:
    """In task-id order, the shown task a new row goes before (None: the end).
    ListTasks orders by code points, as both databases compare the ids' UTF-8 bytes."""
    after = [other for other in shown if other > task_id]
    return min(after) if after else None


# -- runs and their leases -------------------------------------------------------------


def lease_state(run: completion_types.Run, now: float) -> str:
    """`closed`, `live` (the lease had not lapsed at `now`, as last read) or
    `expired` (lapsed, the run not closed yet: the stall sweeper has not come)."""
    if run.HasField("finish_time"):
        return "closed"
    return "live" if seconds(run.lease_expire_time) > now else "expired"


def lease_deadline(runs: Iterable[completion_types.Run], now: float) -> float | None:
    """When the soonest live lease of these runs lapses unless renewed: the page
    reads the runs again then, and so shows a renewal (which commits no event)
    or the lapse."""
    expiries = [seconds(r.lease_expire_time) for r in runs if lease_state(r, now) == "live"]
    return min(expiries) if expiries else None


# -- what needs attention ---------------------------------------------------------------


@dataclass(frozen=True)
class Attention:
    """A workspace's attention page, from what the services listed: settlements
    pending (oldest first: what `funnel outbox` shows), leases lapsed while their
    run is open (the stall sweeper has not closed it), runs open longer than the
    stated bound, and completions the lifecycle service rejected whose task is
    still open at that generation (the latest completion of it was rejected)."""

    pending: tuple[completion_types.Completion, ...] = ()
    expired: tuple[completion_types.Run, ...] = ()
    long_open: tuple[completion_types.Run, ...] = ()
    rejected: tuple[completion_types.Completion, ...] = ()
    # Why the rejected ones could not be told (the lifecycle service away), or "".
    rejected_unknown: str = ""

    @property
    def count(self) -> int:
        return len(self.pending) + len(self.expired) + len(self.long_open) + len(self.rejected)


def open_runs_needing_attention(
    runs: Iterable[completion_types.Run], now: float, long_run_seconds: float
) -> tuple[tuple[completion_types.Run, ...], tuple[completion_types.Run, ...]]:
    """(runs whose lease lapsed, runs with a live lease open longer than the bound), oldest claim first."""
    oldest_first = sorted(runs, key=lambda r: (seconds(r.claim_time), r.run_id))
    expired = tuple(r for r in oldest_first if lease_state(r, now) == "expired")
    long_open = tuple(
        r for r in oldest_first if lease_state(r, now) == "live" and now - seconds(r.claim_time) > long_run_seconds
    )
    return expired, long_open


def latest_rejections(
    rejected: Iterable[completion_types.Completion], pending: Iterable[completion_types.Completion], limit: int
) -> list[completion_types.Completion]:
    """Of the rejected completions (oldest commit first, as listed), each task's
    latest, unless a completion of that task's generation committed after it is
    pending (its last completion is then that one, not the rejection); the
    `limit` latest of those, oldest first."""
    latest: dict[str, completion_types.Completion] = {}
    for completion in rejected:
        latest.pop(completion.task_id, None)  # re-inserted last: the dict stays in commit order
        latest[completion.task_id] = completion
    waiting = {(c.task_id, c.generation): seconds(c.commit_time) for c in pending}
    kept = [
        c for c in latest.values() if waiting.get((c.task_id, c.generation), float("-inf")) < seconds(c.commit_time)
    ]
    return kept[-limit:] if limit > 0 else []


def still_rejected(completion: completion_types.Completion, task: Lifecycle | None) -> bool:
    """A rejected completion still stands for its task: the task is at that
    generation and not terminal (else a resume, a cancellation or a later
    completion has moved it on)."""
    return task is not None and task.generation == completion.generation and task.state != TERMINAL


def attention_deadline(runs: Iterable[completion_types.Run], now: float, long_run_seconds: float) -> float | None:
    """The next moment the attention page changes by time alone: a live lease
    lapses, or an open run crosses the bound."""
    moments = []
    for run in runs:
        if lease_state(run, now) == "live":
            moments.append(seconds(run.lease_expire_time))
            crossing = seconds(run.claim_time) + long_run_seconds
            if crossing > now:
                moments.append(crossing)
    return min(moments) if moments else None
